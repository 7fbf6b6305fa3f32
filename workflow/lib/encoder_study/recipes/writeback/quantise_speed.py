"""The rule writeback_quantisation_speed: the float32 written graph and its int8 variant tagging the same
batches, at each thread count, in one job beside the machine's GEMM probe (as `speed` times the modules
against the graph).

The int8 graph timed is made again from the float32 one with the settings the gating job used
(`onnx.quantise.remake`), and refused unless its SHA-256 is the one that job measured: what is timed is
what was gated, published or not.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ... import provenance
from ...core import tables
from ...encoders import perf
from ...onnx import quantise as quantiser
from ..tagging import pipeline
from .checks import _encoder_name, write_table
from .quantise import OPS, graph_tagger
from .speed import _tag_all, speed_batches

SPEED_COLUMNS = ["run", "encoder", "threads", "sentences", "tokens", "pieces", "padded_pieces",
                 "batch_pieces", "batches", "calls", "repeats", "float32_tok_s", "int8_tok_s", "ratio",
                 "float32_tok_s_min", "float32_tok_s_max", "int8_tok_s_min", "int8_tok_s_max",
                 "float32_repeats", "int8_repeats", "float32_seconds", "int8_seconds", "gflop",
                 "float32_gflops", "int8_gflops", "gemm_gflops", "float32_fraction_of_gemm",
                 "int8_fraction_of_gemm", "float32_scaling", "int8_scaling", "gemm_gflops_min",
                 "gemm_gflops_max", "gemm_probe", "peak_gflops", "float32_bytes", "int8_bytes",
                 "published", "load_before", "load_after", "limit_note"]
SPEED_MARKDOWN = (("run", "run", ""), ("threads", "threads", "n"), ("tokens", "tokens", "n"),
                  ("float32_tok_s", "float32 graph (tok/s)", ",.0f"),
                  ("int8_tok_s", "int8 graph (tok/s)", ",.0f"),
                  ("ratio", "int8 / float32", ".2f"), ("float32_fraction_of_gemm", "float32 of GEMM", ".2f"),
                  ("int8_fraction_of_gemm", "int8 of GEMM", ".2f"),
                  ("int8_scaling", "int8 vs 1 thread", ".2f"),
                  ("float32_bytes", "float32 bytes", "n"), ("int8_bytes", "int8 bytes", "n"),
                  ("published", "published", "yes"), ("load_before", "load (1 min) before", ".2f"))


def measured(table: str | os.PathLike) -> dict[str, dict]:
    """Per run, what the gating job recorded of its variant (its first row: the columns repeat)."""
    found: dict[str, dict] = {}
    for row in tables.read_csv(table):
        found.setdefault(row["run"], row)
    return found


def speed_rows(run: str, written: str | os.PathLike, gated: dict, sentences, batch_pieces: int,
               thread_counts: list[int], warmup: int, repeats: int, min_seconds: float,
               probes: dict) -> list[dict]:
    """Tokens per second of the float32 written graph and the int8 variant at each thread count, on the
    same batches (`speed.speed_batches`), timed in turns beside the probe (`perf.measure`)."""
    from ...core.machine import torch_threads

    docs = [s.doc() for s in sentences]
    tokens = sum(len(d.words) for d in docs)
    rows = []
    with tempfile.TemporaryDirectory(prefix=".int8-speed-", dir=Path(written).parent) as tmp:
        graph = Path(tmp) / pipeline.graph_name(written)
        record = quantiser.remake(pipeline.graph_path(written, pipeline.read(written)[0]), graph,
                                  gated["per_channel"] == "True", OPS, gated["int8_sha256"])
        for threads in thread_counts:
            float32 = pipeline.load(written, threads=threads)
            int8 = graph_tagger(written, graph, threads)
            planned = speed_batches(float32, docs, batch_pieces)
            for tagger in (float32, int8):
                tagger.encoder.batch_pieces = planned["budget"]
            flops = perf.encoder_flops(perf.Shape.from_config(float32.encoder.config), planned["lengths"])
            torch_threads(threads)  # the probe's torch.mm candidates run at the cell's threads
            if threads not in probes:
                probes[threads] = perf.Probe.beside(threads, min_seconds)
            probe = probes[threads]
            before = _load1()
            calls = planned["calls"]
            times = perf.measure({"float32": lambda t=float32, c=calls: _tag_all(t, c),
                                  "int8": lambda t=int8, c=calls: _tag_all(t, c)},
                                 min_seconds, min_repeats=repeats, warmup=warmup,
                                 block_seconds=perf.BLOCK_SECONDS, probe=probe)
            rows.append({"run": run, "encoder": _encoder_name(float32), "threads": threads,
                         "sentences": len(docs), "tokens": tokens, "pieces": sum(planned["lengths"]),
                         "padded_pieces": sum(planned["padded"]), "batch_pieces": batch_pieces,
                         "batches": len(planned["batches"]), "calls": len(planned["calls"]),
                         "gflop": flops / 1e9, "float32_bytes": float32.graph.stat().st_size,
                         "int8_bytes": record["bytes"], "published": gated["published"],
                         "load_before": before, "load_after": _load1(),
                         **_cells(times, tokens, flops, probe.limit(times))})
            float32 = int8 = None  # one pair of sessions at a time
    single = next((r for r in rows if r["threads"] == 1), None)
    for r in rows:
        for impl in ("float32", "int8"):
            r[f"{impl}_scaling"] = r[f"{impl}_tok_s"] / single[f"{impl}_tok_s"] if single else ""
    return rows


def _load1() -> float | str:
    """The 1-minute load average beside each cell: a shared machine's timings are read with it."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return ""


def _cells(times: dict, tokens: int, flops: float, limit: perf.Limit) -> dict:
    """A row's timed columns. The int8 graph's rate is the same counted work over its time, read against
    the float32 probe: a fraction above 1 is what int8 products can do, not a miscount."""
    f32, q8 = perf.Spread.of(times["float32"]), perf.Spread.of(times["int8"])
    row = {"repeats": min(f32.repeats, q8.repeats), "float32_tok_s": tokens / f32.median,
           "int8_tok_s": tokens / q8.median, "ratio": f32.median / q8.median,
           "float32_tok_s_min": tokens / f32.max, "float32_tok_s_max": tokens / f32.min,
           "int8_tok_s_min": tokens / q8.max, "int8_tok_s_max": tokens / q8.min,
           "float32_repeats": f32.repeats, "int8_repeats": q8.repeats, "float32_seconds": f32.seconds,
           "int8_seconds": q8.seconds, **limit.columns()}
    f32_rate, q8_rate = limit.rates(flops, f32.median), limit.rates(flops, q8.median)
    row.update(float32_gflops=f32_rate["gflops"], float32_fraction_of_gemm=f32_rate["fraction_of_gemm"],
               int8_gflops=q8_rate["gflops"], int8_fraction_of_gemm=q8_rate["fraction_of_gemm"])
    row["limit_note"] = f"float32: {f32_rate['limit_note']}" if f32_rate["limit_note"] else ""
    return row


def quantisation_speed(runs: list[tuple[str, str]], table: str | os.PathLike, sentences, batch_pieces: int,
                       thread_counts: list[int], warmup: int, repeats: int, min_seconds: float,
                       out: str | os.PathLike) -> provenance.Done:
    """Every run's rows (`speed_rows`) and the table `out` (.md beside)."""
    from ...core.machine import load_average

    gated = measured(table)
    done, rows, probes = provenance.Done(inputs=[Path(table)]), [], {}
    before = load_average()
    for run, written in sorted(runs):
        if run not in gated:
            raise quantiser.QuantisationError(f"{table}: no row of run {run}; rerun writeback_quantisation")
        done.inputs += [Path(written), pipeline.graph_path(written, pipeline.read(written)[0])]
        rows += speed_rows(run, written, gated[run], sentences, batch_pieces, thread_counts, warmup, repeats,
                           min_seconds, probes)
    markdown = tables.markdown(rows, SPEED_MARKDOWN)
    done.outputs += write_table(out, rows, SPEED_COLUMNS, markdown)
    done.table("Int8 variants: tagging speed against the float32 written graphs", markdown)
    for probe in probes.values():
        done.notes += probe.notes()
    done.note(f"tagging the first {len(sentences)} test sentences (gold tokens) as `writeback speed` does "
              f"(batches of at most {batch_pieces} padded pieces, the same for both graphs, tokenisation "
              f"included), median of at least {repeats} passes and {min_seconds:g} s of passes per graph, "
              f"the two taking turns in blocks beside the GEMM probe, after {warmup} warm-up pass(es); "
              f"threads {', '.join(map(str, thread_counts))}; the int8 graph made again and checked "
              f"against the SHA-256 the gating job measured; load average (1, 5, 15 min) before: {before}; "
              f"after: {load_average()}. Indicative timings, not a gated result; excluded from byte "
              "identity.")
    return done
