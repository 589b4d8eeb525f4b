"""Bytes-per-step accounting against docs/PERF.md's speed-of-light figures (CPU)."""

import pytest

from mkcode.backend.bench.accounting import (
    expected_distinct_uniform,
    kv_tokens_read,
    speed_of_light,
    step_bytes,
)
from mkcode.backend.model.config import north_mini_code_config

CFG = north_mini_code_config()


def test_bs1_8k_matches_design():
    sb = step_bytes(CFG, [8192], distinct_experts=8)
    assert sb.attention == pytest.approx(1.849e9, rel=1e-3)
    assert sb.dense_mlp == 3 * 3072 * 2048 * 2
    assert sb.router == 48 * 128 * 2048 * 2
    assert sb.experts == 48 * 8 * 3 * 2048 * 768 * 2
    assert sb.lm_head == 262144 * 2048 * 2
    assert sb.weights == pytest.approx(6.61e9, rel=2e-3)
    assert sb.kv == pytest.approx(0.52e9, rel=0.02)
    assert sb.total == pytest.approx(7.13e9, rel=3e-3)
    ms, tps = speed_of_light(sb.total, 4.27e12, 1)
    assert tps == pytest.approx(600, rel=0.01)
    assert ms == pytest.approx(1.67, rel=0.01)


def test_kv_sliding_cap_and_full_growth():
    # sliding layers read at most the window (4096 keys, the new token included)
    assert kv_tokens_read(CFG, 1, 10) == 11
    assert kv_tokens_read(CFG, 1, 100_000) == 4096
    assert kv_tokens_read(CFG, 0, 100_000) == 100_001
    short = step_bytes(CFG, [1000], 8).kv
    assert short == 49 * 1001 * 2048
    long = step_bytes(CFG, [262144], 8).kv
    assert long == (13 * 262145 + 36 * 4096) * 2048
    assert step_bytes(CFG, [1000, 262144], 8).kv == short + long


def test_distinct_experts_uniform_and_measured():
    assert expected_distinct_uniform(128, 8, 1) == pytest.approx(8)
    assert expected_distinct_uniform(128, 8, 8) == pytest.approx(51.6, abs=0.1)
    per_layer = [0] + [20] * 48
    sb = step_bytes(CFG, [8192] * 8, per_layer)
    assert sb.experts == 48 * 20 * 3 * 2048 * 768 * 2
    assert step_bytes(CFG, [8192] * 8).experts == pytest.approx(48 * 51.6 * 9437184, rel=2e-3)
    with pytest.raises(ValueError):
        step_bytes(CFG, [1], [1, 2])
