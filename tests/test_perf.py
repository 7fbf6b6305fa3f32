"""The timing conventions (perf.py): counted work, the interleaved measure, the spread, the GEMM probe and
the theoretical peak (machine.py)."""

import itertools
import json
import statistics

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.utils.flop_counter import FlopCounterMode

from encoder_study.core import machine
from encoder_study.encoders import perf, trainable
from encoder_study.encoders.trainable import common
from encoder_study.onnx import manifest


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


def test_the_probe_keeps_the_fastest_candidate_and_takes_turns():
    candidates = [perf.Gemm("torch.mm", 64, 64, 64), perf.Gemm("onnxruntime MatMul", 96, 64, 32)]
    probe = perf.Probe(1, calibration_seconds=0.0, candidates=candidates)
    # a sample: as many products as take about PROBE_SECONDS, timed together
    assert all(r >= 1 for r in probe.repeats.values()) and max(probe.repeats.values()) > 1
    assert probe.sample_flops(candidates[1]) == 2 * 96 * 64 * 32 * probe.repeats[candidates[1]]
    rates = {g: probe.sample_flops(g) / s.median / 1e9 for g, s in probe.calibration.items()}
    assert set(rates) == set(candidates) and probe.gemm == max(rates, key=rates.get)
    assert all(0.01 < r < 1e5 for r in rates.values())  # GFLOP/s: a real CPU, not a unit slip by 1e9
    times = perf.measure({"x": lambda: None}, min_seconds=0.0, min_repeats=3, warmup=0, probe=probe)
    assert len(times[perf.PROBE]) == 3 == len(probe.turns) == len(probe.waits)  # one sample a round,
    assert all(0 < w <= perf.QUIET_MAX_SECONDS + 0.1 for w in probe.waits)  # each after a quiet wait
    limit = probe.limit(times)
    assert limit.gflops_min <= limit.gflops <= limit.gflops_max and limit.gemm == probe.gemm.name
    assert limit.gflops == pytest.approx(probe.sample_flops() / 1e9 / statistics.median(times[perf.PROBE]))
    assert probe.run_limit().gflops == limit.gflops
    assert any("theoretical float32 peak" in note for note in probe.notes())
    assert any("each after waiting for this process's threads to idle" in note for note in probe.notes())
    assert perf.rates(2e9, 0.5, 8.0) == {"gflops": 4.0, "fraction_of_gemm": 0.5}
    quick = perf.Probe.beside(1, min_seconds=0.0)  # cells of 0 s: single products, no calibration time
    assert set(quick.repeats.values()) == {1} and quick.threads == 1


def test_the_gemm_candidates_compute_the_product():
    """Each candidate computes the product of its seeded operands (drawn again here, multiplied by numpy),
    so that the probe's rate counts a real product of the stated shape."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 4), dtype=np.float32), rng.standard_normal((4, 6), dtype=np.float32)
    got = perf.Gemm("onnxruntime MatMul", 8, 4, 6).call(1)()
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 4, generator=generator).numpy(), torch.randn(4, 6, generator=generator).numpy()
    np.testing.assert_allclose(perf.Gemm("torch.mm", 8, 4, 6).call(1)().numpy(), a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown GEMM implementation"):
        perf.Gemm("numpy", 2, 2, 2).call(1)


def test_a_probe_turn_opens_every_round():
    order = []

    class Fake:
        def turn(self):
            order.append("probe")
            return [1.0]

    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    perf.measure(calls, min_seconds=0.0, min_repeats=2, warmup=1, probe=Fake())
    assert order == ["a", "b", "probe", "a", "b", "probe", "a", "b"]  # not in the warm-up round
    order.clear()
    perf.measure(calls, min_seconds=0.0, min_repeats=1, warmup=0, block_seconds=1e-9, probe=Fake())
    assert order == ["probe", "a", "a", "b", "b"]


def test_a_fraction_above_one_names_its_cause():
    steady = perf.Limit("p", gflops=100.0, gflops_min=90.0, gflops_max=110.0, calibration_gflops=100.0,
                        peak_gflops=300.0)
    assert steady.rates(50e9, 1.0) == {"gflops": 50.0, "fraction_of_gemm": 0.5, "limit_note": ""}
    assert steady.rates(100e9, 1.0)["limit_note"] == ""
    assert "products" in steady.rates(120e9, 1.0)["limit_note"]
    slowed = perf.Limit("p", gflops=60.0, gflops_min=50.0, gflops_max=70.0, calibration_gflops=100.0,
                        peak_gflops=300.0)
    assert "0.60 of its calibration rate" in slowed.note(1.2)
    assert slowed.columns() == {"gemm_gflops": 60.0, "gemm_gflops_min": 50.0, "gemm_gflops_max": 70.0,
                                "gemm_probe": "p", "peak_gflops": 300.0}


CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
cpu family\t: {family}
model\t\t: {model}
model name\t: Test CPU
cpu MHz\t\t: 2500.000
flags\t\t: fpu sse sse2 {flags}

processor\t: 1
cpu MHz\t\t: 1000.000
"""


@pytest.mark.parametrize(("vendor", "family", "model", "flags", "units", "lanes"), [
    ("GenuineIntel", 6, 85, "avx avx2 fma avx512f", 2, 16),  # Skylake-SP
    ("GenuineIntel", 6, 60, "avx avx2 fma", 2, 8),  # Haswell
    ("GenuineIntel", 6, 42, "avx", 1, 8),  # Sandy Bridge: no FMA
    ("AuthenticAMD", 23, 1, "avx avx2 fma", 2, 4),  # Zen: 128-bit data paths
    ("AuthenticAMD", 23, 49, "avx avx2 fma", 2, 8),  # Zen 2
    ("AuthenticAMD", 25, 17, "avx avx2 fma avx512f", 2, 8),  # Zen 4: AVX-512 on 256-bit units
    ("AuthenticAMD", 26, 2, "avx avx2 fma avx512f", 2, 16),  # Zen 5
    ("", -1, -1, "", 1, 4),
])
def test_the_theoretical_peak_from_the_cpu_s_flags(vendor, family, model, flags, units, lanes):
    text = CPUINFO.format(vendor=vendor, family=family, model=model, flags=flags)
    peak = machine.fp32_peak(1, cpuinfo=text)
    assert (peak["fma_units"], peak["lanes"], peak["cores"]) == (units, lanes, 1)
    assert peak["ghz"] == 2.5 and peak["clock_source"] == "/proc/cpuinfo cpu MHz"  # the first processor's
    assert peak["gflops"] == pytest.approx(units * lanes * 2 * 2.5)
    assert machine.peak_text(peak).startswith(f"{peak['gflops']:.1f} GFLOP/s = 1 core x {units} FMA units")


def test_blocks_take_turns_after_an_untimed_switch():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = perf.measure(calls, min_seconds=0.0, min_repeats=2, warmup=0, block_seconds=1e-9)
    # each turn: one untimed call, then timed calls until the block is full (here: one)
    assert order == ["a", "a", "b", "b", "a", "a", "b", "b"]
    assert [len(t) for t in times.values()] == [2, 2]


def test_a_block_is_no_longer_than_the_cells_seconds(monkeypatch):
    """Blocks of 1 s of 0.1 s calls: a cell of 0 s times one call a turn, a cell of 0.25 s one block
    of 3 calls (the untimed switch call before each block is not counted)."""
    clock = {"now": 0.0}

    def call():
        clock["now"] += 0.1

    monkeypatch.setattr(perf.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(perf, "wait_for_quiet", lambda: 0.0)
    for min_seconds, timed in ((0.0, 2), (0.25, 3)):
        times = perf.measure({"a": call}, min_seconds=min_seconds, min_repeats=2, warmup=0, block_seconds=1.0)
        assert len(times["a"]) == timed, (min_seconds, times)


class FakeTime:
    """perf's clock. Each sleep is a window in which the process's other threads use a whole core where
    `busy` says so (in order; idle after its end); `events` records the calls and each sleep."""

    def __init__(self, busy=()):
        self.now, self.cpu, self.busy, self.events = 0.0, 0.0, list(busy), []

    def perf_counter(self):
        return self.now

    def process_time(self):
        return self.cpu

    def sleep(self, seconds):
        self.events.append(("sleep", seconds))
        self.now += seconds
        if self.busy and self.busy.pop(0):
            self.cpu += seconds

    def call(self, name, seconds):
        def run():
            self.events.append(name)
            self.now += seconds
            self.cpu += seconds
        return run


def test_wait_for_quiet_sleeps_until_the_process_idles_or_the_limit(monkeypatch):
    window, quiet = perf.QUIET_WINDOW_SECONDS, perf.QUIET_WINDOWS
    # idle at once; busy 3 windows; busy, idle once (too short), busy again: the count starts over
    for busy, windows in (((), quiet), ((1, 1, 1), 3 + quiet), ((1, 0, 1), 3 + quiet)):
        clock = FakeTime(busy)
        monkeypatch.setattr(perf, "time", clock)
        assert perf.wait_for_quiet() == pytest.approx(windows * window), busy
        assert clock.events == [("sleep", window)] * windows
    clock = FakeTime(busy=[1] * 1000)  # a thread that never idles: waited for until the limit only
    monkeypatch.setattr(perf, "time", clock)
    assert perf.wait_for_quiet(limit=0.1) == pytest.approx(0.1)


def test_every_block_starts_after_a_quiet_wait_and_a_slow_path_without_an_untimed_call(monkeypatch):
    """A path whose calls take PAUSE_AFTER_SECONDS or more starts its block at once after the wait (its
    warm-up told how long it takes); a fast one makes an untimed call first."""
    clock = FakeTime()
    monkeypatch.setattr(perf, "time", clock)
    slow, fast = perf.PAUSE_AFTER_SECONDS, perf.PAUSE_AFTER_SECONDS / 10
    times = perf.measure({"slow": clock.call("slow", slow), "fast": clock.call("fast", fast)},
                         min_seconds=0.0, min_repeats=2, warmup=1, block_seconds=1e-9)
    wait = [("sleep", perf.QUIET_WINDOW_SECONDS)] * perf.QUIET_WINDOWS
    assert clock.events == ["slow", "fast", *wait, "slow", *wait, "fast", "fast",
                            *wait, "slow", *wait, "fast", "fast"]
    assert times["slow"] == pytest.approx([slow, slow]) and times["fast"] == pytest.approx([fast, fast])


def test_a_samples_length_comes_from_the_fastest_of_several_calls(monkeypatch):
    """One slow call (threads waking, the scheduler) must not make the probe's samples a few products long."""
    clock = FakeTime()
    monkeypatch.setattr(perf, "time", clock)
    seconds = iter([0.5, 0.25, 0.0625, 0.125])  # the warm-up, then a slow call among the timed ones
    assert perf._repeats(lambda: setattr(clock, "now", clock.now + next(seconds)), 0.5) == 8
