"""Timings read against the machine's own limit: its matrix-multiply rate, the model's counted work, and
medians over enough work that the noise is small.

The limit. `gemm_rate(threads)` multiplies two float32 matrices of 2048 x 2048 with PyTorch at the
job's thread count, as often as it takes to fill `min_seconds`, and returns the median GFLOP/s
(2 n^3 floating-point operations a product). Every timing job measures it itself, just before it times,
so a row's `fraction_of_gemm` compares its model with the same machine, threads and moment.

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
thread pools of their own take turns in blocks (`block_seconds`), each after an untimed call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

GEMM_SIZE = 2048
BLOCK_SECONDS = 0.25  # turns of ONNX Runtime against PyTorch (see measure)


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
                   ffn=int(config["intermediate_size"]), gated=config.get("model_type") == "modernbert")


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
            warmup: int = 1, block_seconds: float = 0.0) -> dict[str, list[float]]:
    """Per-call seconds of each callable, interleaved; see the module's docstring.

    `block_seconds` > 0: each turn is a block of calls of at least that many seconds, after one untimed
    call. For runtimes with thread pools of their own (ONNX Runtime's spin after a run, PyTorch's OpenMP
    threads): a call right after the other runtime's shares the cores with its still-spinning threads
    and can take several times as long (measured: CHANGELOG.md), which says nothing about either.
    """
    if min_seconds < 0 or min_repeats < 1 or warmup < 0 or block_seconds < 0:
        raise ValueError("min_seconds, warmup and block_seconds must be 0 or more, min_repeats at least 1")
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    totals = dict.fromkeys(calls, 0.0)
    while pending := [n for n in calls if totals[n] < min_seconds or len(times[n]) < min_repeats]:
        for name in pending:  # a path that has its share sits out, so fast paths don't stretch slow ones
            call = calls[name]
            if block_seconds:
                call()  # the switch: the other runtime's threads wind down during this call
            block = 0.0
            while True:
                start = time.perf_counter()
                call()
                elapsed = time.perf_counter() - start
                times[name].append(elapsed)
                totals[name] += elapsed
                block += elapsed
                if block >= block_seconds:
                    break
    return times


def gemm_spread(threads: int, min_seconds: float, size: int = GEMM_SIZE) -> Spread:
    """Seconds per float32 `size` x `size` product at `threads` PyTorch threads (set here)."""
    import torch

    from . import machine

    machine.torch_threads(threads)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    out = torch.empty(size, size)
    return Spread.of(measure({"gemm": lambda: torch.mm(a, b, out=out)}, min_seconds, min_repeats=5,
                             warmup=2)["gemm"])


def gemm_rate(threads: int, min_seconds: float, size: int = GEMM_SIZE) -> float:
    """The machine's float32 matrix-multiply rate in GFLOP/s at `threads` PyTorch threads (set here)."""
    return 2.0 * size ** 3 / gemm_spread(threads, min_seconds, size).median / 1e9


def rates(flops: float, seconds: float, gemm_gflops: float) -> dict:
    """`gflops` and `fraction_of_gemm` of `flops` done in `seconds`."""
    gflops = flops / seconds / 1e9
    return {"gflops": gflops, "fraction_of_gemm": gflops / gemm_gflops}
