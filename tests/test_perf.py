"""The timing conventions (perf.py): counted work, the interleaved measure, the spread, the GEMM probe."""

import itertools
import json

import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.utils.flop_counter import FlopCounterMode

from encoder_study import manifest, perf, trainable
from encoder_study.trainable import common


@pytest.mark.parametrize("name", ["bert-tiny", "xlmr-tiny", "modernbert-tiny"])
def test_the_count_equals_torch_s_own_count_of_the_trainable_forward(tiny_exports, name, monkeypatch):
    """Every matrix product of our modules is counted, and nothing else: torch's FlopCounterMode counts
    the same (it ignores embeddings, norms and activations, as the formula does). It has no formula for
    the CPU flash-attention kernel, so attention runs on SDPA's math backend here: the same products,
    as matmuls it counts."""
    monkeypatch.setattr(common, "ATTENTION_BACKENDS", [SDPBackend.MATH])
    model = trainable.load(tiny_exports[name]).eval()
    config = json.loads((tiny_exports[name] / manifest.CONFIG_FILE).read_text())
    shape = perf.Shape.from_config(config)
    lengths = [16, 16, 16]  # at least trainable.common.MIN_LENGTH, which the modules pad shorter rows to
    ids = torch.full((len(lengths), lengths[0]), 5, dtype=torch.int64)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids, torch.ones_like(ids))
    assert perf.encoder_flops(shape, lengths) == counter.get_total_flops()


def test_gated_feed_forward_and_step_counts():
    plain, gated = perf.Shape(2, 16, 32, False), perf.Shape(2, 16, 32, True)
    # per piece and layer: 2*16*64 + 2*2*8*16 + 2*2*16*32 = 4,608; gated: one more 2*16*32 product
    assert perf.encoder_flops(plain, [8]) == 2 * 8 * 4608
    assert perf.encoder_flops(gated, [8]) == 2 * 8 * (4608 + 1024)
    assert perf.step_flops(plain, [8, 8]) == 3 * perf.encoder_flops(plain, [8, 8])
    # sequences are counted alone: attention grows with each sequence's own length
    assert perf.encoder_flops(plain, [4, 12]) != perf.encoder_flops(plain, [8, 8])


def test_measure_interleaves_and_runs_enough():
    order = []
    clock = itertools.count()
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = perf.measure(calls, min_seconds=0.0, min_repeats=4, warmup=2)
    assert order == ["a", "b"] * 6  # two warm-up rounds, then four timed ones, always in turn
    assert [len(t) for t in times.values()] == [4, 4]
    slow = perf.measure({"x": lambda: sum(range(20000)), "tick": lambda: next(clock)}, min_seconds=0.02,
                        min_repeats=1, warmup=0)
    assert sum(slow["x"]) >= 0.02 and sum(slow["tick"]) >= 0.02
    with pytest.raises(ValueError):
        perf.measure(calls, min_seconds=1.0, min_repeats=0)


def test_spread():
    s = perf.Spread.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.min, s.q1, s.median, s.q3, s.max, s.repeats, s.seconds) == (1.0, 2.0, 3.0, 4.0, 5.0, 5, 15.0)
    one = perf.Spread.of([0.5])
    assert one.q1 == one.median == one.q3 == 0.5


def test_gemm_rate_is_a_rate():
    rate = perf.gemm_rate(1, min_seconds=0.0, size=256)
    assert 0.1 < rate < 1e5  # GFLOP/s: a real CPU, not a unit slip by 1e9
    assert perf.rates(2e9, 0.5, 8.0) == {"gflops": 4.0, "fraction_of_gemm": 0.5}


def test_blocks_take_turns_after_an_untimed_switch():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = perf.measure(calls, min_seconds=0.0, min_repeats=2, warmup=0, block_seconds=1e-9)
    # each turn: one untimed call, then timed calls until the block is full (here: one)
    assert order == ["a", "a", "b", "b", "a", "a", "b", "b"]
    assert [len(t) for t in times.values()] == [2, 2]
