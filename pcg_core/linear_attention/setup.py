"""The engine's linear-attention state pool, made from the model's config (None for models without linear layers)."""

from __future__ import annotations

from typing import cast

from pcg_core.capture import CaptureBackend, get_capture_backend
from pcg_core.errors import ConfigError
from pcg_core.linear_attention.op import WHY_NOT_CAPTURABLE
from pcg_core.linear_attention.state import LinearStatePool, linear_layer_shape, linear_layers


def make_linear_state(model_config, config, tp: int = 1) -> LinearStatePool | None:
    """A pool of `config.linear_state_slots` slots for the model's linear layers (a tensor-parallel rank's: its 1/tp
    of the heads); a capture backend that records the split ops in its graph (`full`) is refused with the reason,
    since the op is not capturable."""
    layers = linear_layers(model_config.get_text_config())
    if not layers:
        return None
    backend = cast(type[CaptureBackend], get_capture_backend(config.capture.backend))  # the registry returns a `type`
    if backend.requires_capturable_attention:
        raise ConfigError(f"capture backend {config.capture.backend!r} records every op in one graph, and this model's "
                          f"linear-attention layers cannot be: {WHY_NOT_CAPTURABLE}", field="backend")
    return LinearStatePool(layers, linear_layer_shape(model_config.get_text_config(), tp), config.linear_state_slots,
                           config.torch_dtype, config.torch_device)
