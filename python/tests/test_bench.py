"""The Python-overhead measurement (python -m attn.bench --vs cpp) reads the C++ call's own time from
attn._C.last_forward_seconds: it must be that call's, not a stale or a whole-call figure."""
import time

import pytest
import torch

import attn
from attn import _C
from attn.bench import per_call_overhead


def test_last_forward_seconds_is_the_last_calls_own_time():
    small = [torch.randn(1, 4, 2, 16) for _ in range(3)]
    big = [torch.randn(1, 512, 4, 64) for _ in range(3)]
    attn.flash_attn_func(*big)
    after_big = _C.last_forward_seconds()
    t0 = time.perf_counter()
    attn.flash_attn_func(*small)
    wall = time.perf_counter() - t0
    inner = _C.last_forward_seconds()
    assert 0 < inner <= wall
    assert inner != after_big  # updated by the small call, not left from the big one


def test_per_call_overhead_splits_each_call():
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    alone, inner, wall, over, p90 = per_call_overhead(q, k, v, False, 1, lambda: attn.flash_attn_func(q, k, v),
                                                      min_total=0.01, block=5)
    assert 0 < inner <= wall and 0 < alone
    assert 0 < over <= p90


def test_per_call_overhead_runs_before_untimed():
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    seen = []
    per_call_overhead(q, k, v, False, 1, lambda: attn.flash_attn_func(q, k, v), min_total=0.01, block=5,
                      before=lambda: seen.append(1))
    assert len(seen) >= 25  # once per timed call: five blocks of five at least


def test_model_bench_times_attn_beside_the_baseline():
    pytest.importorskip("transformers")
    from attn import bench
    best = bench.main(["--model", "llama", "--prompt", "32", "--new-tokens", "3", "--layers", "1", "--hidden", "64",
                       "--heads", "4", "--kv-heads", "2", "--reps", "1", "--threads", "1"])
    assert set(best) == {"sdpa", "attn"}
    assert all(prefill > 0 for prefill, _ in best.values())
