"""CaptureConfig / EngineConfig: the bucket ladder, bucket lookup, and validation of bad values."""

from __future__ import annotations

import pytest
import torch

from pcg_core import CaptureConfig, ConfigError, EngineConfig, default_bucket_ladder

FULL_LADDER = (
    [4, 8, 12, 16, 20, 24, 28, 32]
    + [48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256]
    + [288, 320, 352, 384, 416, 448, 480, 512]
    + [576, 640, 704, 768, 832, 896, 960, 1024]
    + [1280, 1536, 1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096]
)


def test_default_ladder_is_exactly_the_documented_one():
    # Written out by hand (not with range()), so a wrong step or bound in the code cannot hide here.
    assert default_bucket_ladder() == FULL_LADDER
    assert CaptureConfig(backend="piecewise").ladder == FULL_LADDER
    assert len(FULL_LADDER) == 8 + 14 + 8 + 8 + 12


@pytest.mark.parametrize(
    "max_tokens, expected",
    [
        (64, [4, 8, 12, 16, 20, 24, 28, 32, 48, 64]),  # the max is itself a ladder step
        (50, [4, 8, 12, 16, 20, 24, 28, 32, 48, 50]),  # the max is added as the last bucket
        (4, [4]),
        (3, [3]),  # below the first step: the max alone
        (33, [4, 8, 12, 16, 20, 24, 28, 32, 33]),
        (5000, FULL_LADDER + [5000]),  # above the ladder's top: ladder, then the max
    ],
)
def test_max_tokens_cuts_the_ladder_and_is_a_bucket(max_tokens, expected):
    assert default_bucket_ladder(max_tokens) == expected
    cfg = CaptureConfig(backend="piecewise", max_tokens=max_tokens)
    assert cfg.ladder == expected
    assert cfg.ladder[-1] == max_tokens
    assert cfg.bucket_for(max_tokens) == max_tokens  # "≤ max" never falls back


def test_explicit_buckets_are_sorted_deduplicated_and_set_max_tokens():
    cfg = CaptureConfig(backend="full", max_tokens=4096, buckets=[64, 8, 8, 32])
    assert cfg.ladder == [8, 32, 64]
    assert cfg.max_tokens == 64
    assert cfg.bucket_for(1) == 8
    assert cfg.bucket_for(9) == 32
    assert cfg.bucket_for(33) == 64
    assert cfg.bucket_for(65) is None
    # The ladder is a copy: mutating it does not change the config.
    cfg.ladder.append(128)
    assert cfg.ladder == [8, 32, 64]


@pytest.mark.parametrize(
    "num_tokens, bucket",
    [
        (1, 4),
        (4, 4),  # exact bucket
        (5, 8),  # bucket + 1
        (16, 16),
        (17, 20),
        (32, 32),
        (33, 48),  # across the change of step
        (48, 48),
        (49, 64),
        (64, 64),  # the max
        (65, None),  # above the max → no bucket (eager fallback)
        (10_000, None),
    ],
)
def test_bucket_for_edges(num_tokens, bucket):
    assert CaptureConfig(backend="piecewise", max_tokens=64).bucket_for(num_tokens) == bucket


@pytest.mark.parametrize("b", [4, 32, 48, 256, 288, 512, 576, 1024, 1280, 4096])
def test_bucket_for_edges_default_ladder(b):
    cfg = CaptureConfig(backend="piecewise")
    assert cfg.bucket_for(b) == b
    nxt = cfg.bucket_for(b + 1)
    if b == 4096:
        assert nxt is None
    else:
        assert nxt == FULL_LADDER[FULL_LADDER.index(b) + 1]


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"backend": "cudagraph"}, "backend", ["'cudagraph'", "piecewise", "breakable", "full", "disabled"]),
        ({"backend": "piecewize"}, "backend", ["'piecewize'", "disabled, piecewise, breakable, full"]),
        ({"backend": "piecewise", "compiler": "tvm"}, "compiler", ["'tvm'", "eager", "inductor"]),
        ({"backend": "piecewise", "max_tokens": 0}, "max_tokens", ["max_tokens", "0"]),
        ({"backend": "piecewise", "max_tokens": -8}, "max_tokens", ["max_tokens", "-8"]),
        ({"backend": "piecewise", "buckets": []}, "buckets", ["buckets", "non-empty"]),
        ({"backend": "piecewise", "buckets": [4, 0, 8]}, "buckets", ["buckets", "positive"]),
        ({"backend": "piecewise", "buckets": [4, -8]}, "buckets", ["buckets", "positive"]),
        ({"backend": "piecewise", "buckets": [4, 8.5]}, "buckets", ["buckets", "integers"]),
        ({"backend": "piecewise", "buckets": ["16"]}, "buckets", ["buckets", "integers"]),
    ],
)
def test_bad_capture_config_raises_config_error_naming_the_field(kwargs, field, words):
    with pytest.raises(ConfigError) as e:
        CaptureConfig(**kwargs)
    msg = str(e.value)
    assert e.value.field == field
    for w in words:
        assert w in msg, f"{w!r} missing from error message {msg!r}"


@pytest.mark.parametrize("max_tokens", [64.5, "64"])
def test_non_integer_max_tokens_raises_config_error(max_tokens):
    # A YAML/CLI value that is not an int must fail here, naming the field, not later inside the engine
    # (64.5 would otherwise become a bucket and break torch.zeros in the input buffers).
    with pytest.raises(ConfigError, match="max_tokens"):
        CaptureConfig(backend="piecewise", max_tokens=max_tokens)


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"dtype": "fp8"}, "dtype", ["'fp8'", "float32", "bfloat16", "float16"]),
        ({"device": "tpu"}, "device", ["'tpu'", "cpu", "cuda"]),
        ({"kv_slots": 0}, "kv_slots", ["kv_slots", "0"]),
        ({"kv_slots": -1}, "kv_slots", ["kv_slots", "-1"]),
    ],
)
def test_bad_engine_config_raises_config_error_naming_the_field(kwargs, field, words):
    with pytest.raises(ConfigError) as e:
        EngineConfig(**kwargs)
    assert e.value.field == field
    for w in words:
        assert w in str(e.value), f"{w!r} missing from error message {str(e.value)!r}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when no GPU is present")
def test_cuda_without_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="no CUDA GPU") as e:
        EngineConfig(device="cuda")
    assert e.value.field == "device" and "use device 'cpu'" in str(e.value) and "--" not in str(e.value)


def test_config_error_is_a_value_error_and_defaults_are_sane():
    assert issubclass(ConfigError, ValueError)
    cfg = EngineConfig()
    assert cfg.torch_dtype == torch.float32 and cfg.torch_device == torch.device("cpu")
    assert EngineConfig(dtype="bfloat16").torch_dtype == torch.bfloat16
    assert cfg.capture.backend == "disabled" and cfg.capture.max_tokens == 4096
