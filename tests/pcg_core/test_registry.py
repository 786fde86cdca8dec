"""Capture and attention backends: registered the same way, looked up the same way, needs declared on the class."""

from __future__ import annotations

import pickle

import pytest

from pcg_core.attention import AttentionBackend, attention_backend_names, get_attention_backend
from pcg_core.attention.sdpa import SdpaBackend
from pcg_core.capabilities import capabilities
from pcg_core.capture import CaptureBackend, DisabledBackend, FullBackend, capture_backend_names, get_capture_backend
from pcg_core.capture.base import GraphBackend
from pcg_core.errors import ConfigError, UnsupportedModel
from pcg_core.registry import CAPTURE_BACKENDS, Registry


def test_both_registries_return_classes_in_the_same_order_convention():
    assert capture_backend_names()[:4] == ["disabled", "piecewise", "breakable", "full"]
    assert get_capture_backend("full") is FullBackend and get_capture_backend("disabled") is DisabledBackend
    assert "sdpa" in attention_backend_names() and get_attention_backend("sdpa") is SdpaBackend
    assert issubclass(get_attention_backend("sdpa"), AttentionBackend)


@pytest.mark.parametrize("get, field", [(get_capture_backend, "backend"), (get_attention_backend, "attention")])
def test_an_unknown_name_is_a_config_error_naming_the_field_and_the_choices(get, field):
    with pytest.raises(ConfigError, match="'nope' is unknown; choose one of") as e:
        get("nope")
    assert e.value.field == field


def test_the_decorator_reads_the_class_name_and_keeps_registration_order():
    reg = Registry("widget", field="widget", built_in=("b",))

    @reg.register
    class A:
        name = "a"

    @reg.register
    class B:
        name = "b"

    assert reg.names() == ["b", "a"] and reg.get("a") is A and list(reg.items()) == [("b", B), ("a", A)]
    with pytest.raises(TypeError, match="name"):
        reg.register(type("Nameless", (), {}))


def test_capture_base_classes_are_abstract_and_disabled_is_its_own_backend():
    with pytest.raises(TypeError):
        CaptureBackend(None, None, None, None)  # type: ignore[abstract]
    with pytest.raises(TypeError):
        GraphBackend(None, None, None, None)  # type: ignore[abstract]
    assert DisabledBackend.name == "disabled" and not DisabledBackend.pads
    assert not hasattr(DisabledBackend, "eager")


def test_capabilities_export_each_capture_backends_declared_needs():
    caps = capabilities()["capture_backends"]
    assert list(caps) == capture_backend_names()
    assert "full" in caps and caps["full"] == {"requires_capturable_attention": True}
    needy = {name for name, cls in CAPTURE_BACKENDS.items() if cls.requires_capturable_attention}
    assert needy == {n for n, need in caps.items() if need["requires_capturable_attention"]} and "full" in needy
    assert not caps["piecewise"]["requires_capturable_attention"]


def test_config_errors_keep_their_field_across_processes():
    e = pickle.loads(pickle.dumps(UnsupportedModel("no", field="spec")))
    assert type(e) is UnsupportedModel and str(e) == "no" and e.field == "spec"
    assert ConfigError("plain").field is None
