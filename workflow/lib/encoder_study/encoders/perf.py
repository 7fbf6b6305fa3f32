"""Timings read against the machine's own limit: its best float32 matrix-multiply rate, the model's
counted work, and medians over enough work that the noise is small.

The limit. A `Probe(threads)` first times several float32 products, each implementation at several shapes
(`GEMM_SHAPES`: ONNX Runtime's own MatMul kernel and `torch.mm`, which on a CPU may take different paths:
MKL's generic AVX2 kernels on AMD, ONNX Runtime's MLAS with AVX-512), briefly and in turn, and keeps the
fastest: the best rate this machine reaches at these threads. Then it takes turns with the timed work:
`measure(calls, ..., probe=probe)` runs one probe turn in every round, in the same rotation and blocks as
the implementations, so that each cell's `fraction_of_gemm` reads its rate against the probe measured
beside it, under the same load (`Limit`). A fraction above 1.0 is then not expected; where it occurs,
`Limit.note` says why (the probe slowed beside the cell: the load changed; or the cell outran the best
product). Beside the measured limit stands the theoretical peak (`machine.fp32_peak`: cores x FMA units
x lanes x 2 x clock, with its inputs). `Probe.turns` keeps every probe call of the process: the probe's
spread across a run.

The work. `encoder_flops(shape, lengths)` counts the matrix products of a transformer encoder's forward
pass over sequences of the given lengths (each run alone, no padding), a multiply-add counted as 2:

    per layer and sequence of S pieces, width d, feed-forward width f
        projections    2 S d (4 d)           queries, keys, values and the attention output
        attention      2 S S d  x 2          scores Q K^T and the weighted sum of V (every head)
        feed-forward   2 S d f  x 2          up and down; x 3 with a gated unit (ModernBERT's GeGLU,
                                             whose up projection is d -> 2f)

Layers with local attention are counted over the whole sequence, as the exported graph and both PyTorch
implementations compute (masked scores are computed and then discarded). Not counted: embeddings,
norms, softmax, activations, residuals and the tagging head; at the study's shapes they are a few
percent of the work, so `gflops` slightly understates the rate. Padding is not counted either: a row
that pads its batches shows the padding's cost as a lower rate. A training step counts 3x its forward
pass (the backward pass computes each product's input and weight gradients: twice the forward work).

The measure. `measure(calls, min_seconds)` runs the given callables in turn, one call each a round
(so that a change in a shared machine's load falls on all alike), until each has run at least
`min_seconds` in total and `min_repeats` times (one that has sits out the later rounds), and gives
each one's per-call seconds; `Spread` summarises them (median, quartiles, min, max). Runtimes with
thread pools of their own take turns in blocks (`block_seconds`). Before each block and each probe turn,
`wait_for_quiet` sleeps until this process's other threads are idle: ONNX Runtime's workers keep spinning
for about 40 ms after a run, PyTorch's OpenMP threads for about 10 ms (measured: CHANGELOG.md), and the
work timed next would share the cores with them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..core import machine
from . import families

BLOCK_SECONDS = 0.25  # turns of ONNX Runtime against PyTorch (see measure)
# A path whose calls take this long starts its block without an untimed call: it would double the cell's
# time for nothing.
PAUSE_AFTER_SECONDS = 0.1
# wait_for_quiet: idle means the process used under QUIET_SHARE of one core over QUIET_WINDOWS windows in a
# row (the kernel adds a running thread's time to the process's at its clock ticks, every 1-10 ms, so one
# short window can miss a spinning thread); it waits at most QUIET_MAX_SECONDS.
QUIET_WINDOW_SECONDS = 0.005
QUIET_WINDOWS = 2
QUIET_SHARE = 0.1
QUIET_MAX_SECONDS = 0.25
PROBE = "gemm probe"  # measure's key for the probe's per-call seconds
# (m, k, n) of the probe's candidate products: squares, and the tall product of a feed-forward layer.
# None above 2 GFLOP, so that a calibration stays short on a loaded machine too.
GEMM_SHAPES = ((512, 512, 512), (1024, 1024, 1024), (1024, 512, 2048))
GEMM_IMPLEMENTATIONS = ("onnxruntime MatMul", "torch.mm")
CALIBRATION_SECONDS = 0.1  # of each candidate, when a probe picks the fastest
PROBE_SECONDS = 0.02  # one probe sample: as many products as take this long, timed together (Probe)
DRIFT = 0.9  # a probe beside a cell below this share of its calibration rate: the load changed


@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs of an encoder."""

    layers: int
    width: int
    ffn: int
    gated: bool

    @classmethod
    def from_config(cls, config: Mapping) -> Shape:
        """From a Hugging Face style config (an export's model.config.json)."""
        return cls(layers=int(config["num_hidden_layers"]), width=int(config["hidden_size"]),
                   ffn=int(config["intermediate_size"]), gated=families.of_config(config).gated)


def encoder_flops(shape: Shape, lengths: Sequence[int]) -> float:
    """Counted floating-point operations of one forward pass over sequences of these lengths."""
    d, f = shape.width, shape.ffn
    ffn_products = 3 if shape.gated else 2
    per_layer = sum(2 * s * d * 4 * d + 2 * 2 * s * s * d + ffn_products * 2 * s * d * f for s in lengths)
    return float(shape.layers * per_layer)


def step_flops(shape: Shape, lengths: Sequence[int]) -> float:
    """A training step: forward, and a backward pass at twice the forward's work."""
    return 3.0 * encoder_flops(shape, lengths)


@dataclass(frozen=True)
class Spread:
    """Per-call seconds of one implementation: the median and its spread."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    repeats: int
    seconds: float  # the timed total

    @classmethod
    def of(cls, times: Sequence[float]) -> Spread:
        ordered = sorted(times)
        if len(ordered) >= 2:
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        else:
            q1 = q3 = ordered[0]
        return cls(median=statistics.median(ordered), q1=q1, q3=q3, min=ordered[0], max=ordered[-1],
                   repeats=len(ordered), seconds=sum(ordered))


def measure(calls: Mapping[str, Callable[[], object]], min_seconds: float, min_repeats: int = 5,
            warmup: int = 1, block_seconds: float = 0.0,
            probe: Probe | None = None) -> dict[str, list[float]]:
    """Per-call seconds of each callable, interleaved; see the module's docstring.

    `probe`: one probe turn opens every timed round (`Probe.turn`), its seconds under the key PROBE.

    `block_seconds` > 0: each turn is a block of calls of at least that many seconds (at most
    `min_seconds`: a cell asked for less is not stretched; 0 asks for one call a turn), after
    `wait_for_quiet` and one untimed call. For runtimes with thread pools of their own (ONNX Runtime's
    spin after a run, PyTorch's OpenMP threads): a call right after the other runtime's shares the cores
    with its still-spinning threads and can take several times as long (measured: CHANGELOG.md), which
    says nothing about either. A path whose last call took PAUSE_AFTER_SECONDS or more makes no untimed
    call.
    """
    if min_seconds < 0 or min_repeats < 1 or warmup < 0 or block_seconds < 0:
        raise ValueError("min_seconds, warmup and block_seconds must be 0 or more, min_repeats at least 1")
    last = dict.fromkeys(calls, 0.0)  # each path's latest call, warm-up included: whether it pauses to switch
    for _ in range(warmup):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            last[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in calls}
    totals = dict.fromkeys(calls, 0.0)
    if probe is not None:
        times[PROBE] = []
    fill = min(block_seconds, min_seconds)  # a block's length
    while pending := [n for n in calls if totals[n] < min_seconds or len(times[n]) < min_repeats]:
        if probe is not None:
            times[PROBE] += probe.turn()
        for name in pending:  # a path that has its share sits out, so fast paths don't stretch slow ones
            call = calls[name]
            if block_seconds:  # the switch: the other runtime's threads wind down first
                wait_for_quiet()
                if last[name] < PAUSE_AFTER_SECONDS:
                    call()
            block = 0.0
            while True:
                start = time.perf_counter()
                call()
                elapsed = last[name] = time.perf_counter() - start
                times[name].append(elapsed)
                totals[name] += elapsed
                block += elapsed
                if block >= fill:
                    break
    return times


def wait_for_quiet(window: float = QUIET_WINDOW_SECONDS, limit: float = QUIET_MAX_SECONDS) -> float:
    """Sleep in windows of `window` seconds until QUIET_WINDOWS in a row in which this process's threads
    (all of them: the CPU time of the process) used less than QUIET_SHARE of a core, or until `limit`;
    the seconds waited."""
    start, quiet = time.perf_counter(), 0
    while True:
        cpu, began = time.process_time(), time.perf_counter()
        time.sleep(window)
        now = time.perf_counter()
        quiet = quiet + 1 if time.process_time() - cpu < QUIET_SHARE * (now - began) else 0
        if quiet >= QUIET_WINDOWS or now - start >= limit:
            return now - start


@dataclass(frozen=True)
class Gemm:
    """One candidate product of the probe: float32 [m, k] x [k, n] by one implementation."""

    implementation: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    @property
    def name(self) -> str:
        return f"{self.implementation} float32 {self.m} x {self.k} x {self.n}"

    def call(self, threads: int) -> Callable[[], object]:
        """A callable that computes the product once, on seeded operands made here."""
        if self.implementation == "torch.mm":
            return _torch_product(self.m, self.k, self.n, threads)
        if self.implementation == "onnxruntime MatMul":
            return _ort_product(self.m, self.k, self.n, threads)
        raise ValueError(f"unknown GEMM implementation {self.implementation!r}; expected one of "
                         f"{list(GEMM_IMPLEMENTATIONS)}")


def gemm_candidates() -> list[Gemm]:
    return [Gemm(impl, *shape) for impl in GEMM_IMPLEMENTATIONS for shape in GEMM_SHAPES]


def _torch_product(m: int, k: int, n: int, threads: int) -> Callable[[], object]:
    import torch

    machine.torch_threads(threads)
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    out = torch.empty(m, n)
    return lambda: torch.mm(a, b, out=out)


def _ort_product(m: int, k: int, n: int, threads: int) -> Callable[[], object]:
    """ONNX Runtime's MatMul kernel alone, operands and result bound once (no copies per call). Its
    threads do not spin after a run, so that they take nothing from the work timed after a probe turn."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from ..onnx.runtime import session_options

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = session_options(machine.usable_threads(threads))
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    operands = (rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32),
                np.empty((m, n), np.float32))
    binding = session.io_binding()
    binding.bind_cpu_input("a", operands[0])
    binding.bind_cpu_input("b", operands[1])
    binding.bind_output("c", "cpu", 0, np.float32, [m, n], operands[2].ctypes.data)

    def call(operands=operands):  # the binding holds raw pointers: the arrays must live as long
        session.run_with_iobinding(binding)
        return operands[2]
    return call


@dataclass(frozen=True)
class Limit:
    """The limit beside one cell: the probe's rate in the rounds of that cell, with its inputs."""

    gemm: str  # the probe's product
    gflops: float  # its median rate beside the cell
    gflops_min: float
    gflops_max: float
    calibration_gflops: float  # its rate when the probe picked it
    peak_gflops: float  # the theoretical peak (machine.fp32_peak)

    def columns(self) -> dict:
        """The columns every timing table carries about its limit."""
        return {"gemm_gflops": self.gflops, "gemm_gflops_min": self.gflops_min,
                "gemm_gflops_max": self.gflops_max, "gemm_probe": self.gemm, "peak_gflops": self.peak_gflops}

    def rates(self, flops: float, seconds: float) -> dict:
        """`gflops`, `fraction_of_gemm` and `limit_note` of `flops` done in `seconds`."""
        out = rates(flops, seconds, self.gflops)
        return {**out, "limit_note": self.note(out["fraction_of_gemm"])}

    def note(self, fraction: float) -> str:
        """Empty for a fraction up to 1.0; above it, why the cell outran its limit."""
        if not fraction > 1.0:
            return ""
        if self.gflops < DRIFT * self.calibration_gflops:
            share = self.gflops / self.calibration_gflops
            return (f"above 1: the probe ran at {share:.2f} of its calibration rate beside this cell: the "
                    "load changed during the cell")
        return ("above 1: faster than the best product measured beside it: the cell computes less than "
                "is counted, or its products suit the caches better than the probe's")


class Probe:
    """The machine's float32 limit at `threads` threads (see the module's docstring).

    A probe sample is as many products as take PROBE_SECONDS, timed together: on a shared machine a
    single short product often runs within one time slice of the scheduler and so misses the load that
    the longer timed calls beside it meet."""

    def __init__(self, threads: int, calibration_seconds: float = CALIBRATION_SECONDS,
                 candidates: Sequence[Gemm] | None = None, sample_seconds: float = PROBE_SECONDS):
        self.threads = machine.usable_threads(threads)
        candidates = list(candidates or gemm_candidates())
        products = {g: g.call(self.threads) for g in candidates}
        self.repeats = {g: _repeats(products[g], sample_seconds) for g in candidates}  # products per sample
        samples = {g.name: _sample(products[g], self.repeats[g]) for g in candidates}
        # each turn one untimed sample: the implementations have thread pools of their own
        times = measure(samples, calibration_seconds, min_repeats=2, warmup=0, block_seconds=1e-9)
        self.calibration = {g: Spread.of(times[g.name]) for g in candidates}
        self.gemm = max(candidates, key=lambda g: self.sample_flops(g) / self.calibration[g].median)
        self.calibration_gflops = self.sample_flops() / self.calibration[self.gemm].median / 1e9
        self._sample = samples[self.gemm.name]
        self.peak = machine.fp32_peak(self.threads)
        self.turns: list[float] = []  # every timed sample since: the probe's spread across the run
        self.waits: list[float] = []  # each turn's wait_for_quiet

    @classmethod
    def beside(cls, threads: int, min_seconds: float) -> Probe:
        """A probe for cells of at least `min_seconds` each: its calibration and samples no longer than
        those cells (a test's cells of 0 s get single products)."""
        return cls(threads, min(CALIBRATION_SECONDS, min_seconds),
                   sample_seconds=min(PROBE_SECONDS, min_seconds))

    def sample_flops(self, gemm: Gemm | None = None) -> float:
        """The floating-point operations of one sample of `gemm` (the probe's product if None)."""
        gemm = gemm or self.gemm
        return gemm.flops * self.repeats[gemm]

    def turn(self) -> list[float]:
        """`wait_for_quiet`, one untimed sample, then one timed sample. The threads of the work timed
        before keep spinning after it (ONNX Runtime's for about 40 ms) and, on a machine with as many
        cores as threads, would share the cores with the probe: beside ONNX Runtime's blocks it read
        0.6-0.75 of its calibration rate (measured: CHANGELOG.md). `waits` keeps each turn's wait."""
        self.waits.append(wait_for_quiet())
        self._sample()
        start = time.perf_counter()
        self._sample()
        self.turns.append(time.perf_counter() - start)
        return self.turns[-1:]

    def limit(self, times: Mapping[str, Sequence[float]] | Sequence[float]) -> Limit:
        """The limit from a `measure(..., probe=self)` result (or the probe's seconds themselves)."""
        seconds = times[PROBE] if isinstance(times, Mapping) else times
        if not seconds:
            raise ValueError("no probe calls: pass probe= to measure")
        spread = Spread.of(seconds)
        rate = self.sample_flops() / 1e9
        return Limit(self.gemm.name, rate / spread.median, rate / spread.max, rate / spread.min,
                     self.calibration_gflops, self.peak["gflops"])

    def run_limit(self) -> Limit:
        """The limit over every probe sample so far: its spread across the run."""
        return self.limit(self.turns)

    def notes(self) -> list[str]:
        """The probe, its calibration and the peak, for a fragment."""
        best = self.calibration_gflops
        tried = "; ".join(f"{g.name} {self.sample_flops(g) / s.median / 1e9:.1f}"
                          for g, s in self.calibration.items())
        out = [f"GEMM probe at {self.threads} thread(s): {self.gemm.name}, the fastest of {tried} GFLOP/s "
               "(calibration medians)",
               f"theoretical float32 peak: {machine.peak_text(self.peak)}"]
        if self.turns:
            run, waited = self.run_limit(), Spread.of(self.waits)
            out.append(f"the probe across the job: median {run.gflops:.1f} GFLOP/s, range "
                       f"{run.gflops_min:.1f}-{run.gflops_max:.1f} over {len(self.turns)} samples of "
                       f"{self.repeats[self.gemm]} products beside the timed work, each after waiting "
                       f"for this process's threads to idle (median {waited.median * 1e3:.0f} ms, at most "
                       f"{waited.max * 1e3:.0f} ms)")
        if best > self.peak["gflops"]:
            out.append(f"the measured best ({best:.1f} GFLOP/s) is above the theoretical peak: the clock "
                       f"read ({self.peak['clock_source']}, {self.peak['ghz']:.3f} GHz) is below the clock "
                       "the cores ran at (boost), or the rule's units or lanes undercount this CPU")
        return out


REPEATS_TIMED = 3  # calls _repeats times, after a warm-up call


def _repeats(product: Callable[[], object], seconds: float) -> int:
    """How many calls of `product` take about `seconds`, at least one: by the fastest of REPEATS_TIMED
    calls after a warm-up call. One timed call was too few: a slow one (threads waking, the scheduler) made
    the probe's samples a few products long, where a time slice decides a sample's rate (session 9:
    samples of 2 and 4 products where about 16 take PROBE_SECONDS)."""
    product()
    fastest = math.inf
    for _ in range(REPEATS_TIMED):
        start = time.perf_counter()
        product()
        fastest = min(fastest, time.perf_counter() - start)
    return max(1, math.ceil(seconds / max(fastest, 1e-9)))


def _sample(product: Callable[[], object], repeats: int) -> Callable[[], None]:
    def sample() -> None:
        for _ in range(repeats):
            product()
    return sample


def rates(flops: float, seconds: float, gemm_gflops: float) -> dict:
    """`gflops` and `fraction_of_gemm` of `flops` done in `seconds`."""
    gflops = flops / seconds / 1e9
    return {"gflops": gflops, "fraction_of_gemm": gflops / gemm_gflops}
