"""Inference parity and latency: the exported graph in ONNX Runtime against the PyTorch model.

Parity runs one text per call and compares every token's hidden state; a padded batch of 8 is
also compared with the same texts run alone. Latency times both runtimes on the same inputs.
The `*_rows` functions write each model's rows (results/parity/<table>/<model>.csv; latency times
every model in one job); parity_tables gathers them into the tables.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ... import provenance
from ...core import files, machine
from ...encoders import compare, perf
from ...onnx import manifest
from ...onnx.runtime import OUTPUT, ort_session, pad_batch
from .parity_tables import TABLES, markdown, write_rows


@dataclass
class InferenceRow:
    model: str
    tokens: int
    texts: int
    truncated: int
    max_abs: float
    mean_abs: float
    min_cos: float
    mean_cos: float
    max_value: float
    batch_max_abs: float


def inference_parity(pair: compare.Pair, texts: list[str], threads: int, batch: int = 8,
                     alone: compare.Alone | None = None, session=None) -> tuple[InferenceRow, np.ndarray]:
    """One text per run in both runtimes, every token compared; and padded batches against singles.
    `alone` and `session`: the texts' `compare.run_alone` and the graph's session at the same threads,
    when the caller has them (made here otherwise)."""
    if session is None:
        session = ort_session(pair.onnx_path, threads)
    if alone is None:
        alone = compare.run_alone(pair, texts, session)
    rows, pad_id = alone.rows, pair.pieces.pad_id
    per_token, cosines, abs_sums = [], [], 0.0
    max_value, elements = 0.0, 0
    for ref, got in zip(alone.reference, alone.graph, strict=True):
        diff, cos = compare.token_differences(ref, got)
        per_token.append(diff)
        cosines.append(cos)
        abs_sums += float(np.abs(ref.astype(np.float64) - got).sum())
        elements += ref.size
        max_value = max(max_value, float(np.abs(ref).max()))
    singles = alone.graph
    batch_max = 0.0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids, mask = pad_batch(chunk, pad_id)
        out = session.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]
        for i, row in enumerate(chunk):
            batch_max = max(batch_max, float(np.abs(out[i, : len(row)] - singles[start + i]).max()))
    diffs, cos = np.concatenate(per_token), np.concatenate(cosines)
    result = InferenceRow(
        model=pair.name, tokens=int(diffs.size), texts=len(rows), truncated=alone.truncated,
        max_abs=float(diffs.max()), mean_abs=abs_sums / elements, min_cos=float(cos.min()),
        mean_cos=float(cos.mean()), max_value=max_value, batch_max_abs=batch_max)
    return result, diffs


def latency(pair: compare.Pair, threads: int, batches: tuple[int, ...], seq_len: int, warmup: int,
            runs: int, min_seconds: float, seed: int = 0, probe: perf.Probe | None = None) -> list[dict]:
    """Milliseconds per call of each runtime on the same random inputs: median, quartiles, min and max
    over at least `runs` calls and `min_seconds` of calls each, the runtimes taking turns; the rate
    against the machine's matrix-multiply rate at the same threads, the GEMM probe taking turns with them
    (`perf.Probe`: each cell against the probe measured beside it). `probe`: one made here if None."""
    threads = machine.torch_threads(threads)
    probe = probe or perf.Probe.beside(threads, min_seconds)
    session = ort_session(pair.onnx_path, threads)
    vocab = int(pair.torch_model.config.vocab_size)
    seq_len = min(seq_len, pair.pieces.max_pieces)
    shape = perf.Shape.from_config(pair.torch_model.config.to_dict())
    rng = np.random.default_rng(seed)
    rows = []
    for batch in batches:
        ids = rng.integers(5, vocab, size=(batch, seq_len), dtype=np.int64)
        mask = np.ones_like(ids)
        feeds = {"input_ids": ids, "attention_mask": mask}
        calls = {
            "onnxruntime": lambda feeds=feeds: session.run([OUTPUT], feeds),
            "pytorch": lambda ids=ids, mask=mask: compare.torch_states(pair.torch_model, ids, mask),
        }
        flops = perf.encoder_flops(shape, [seq_len] * batch)
        times = perf.measure(calls, min_seconds, min_repeats=runs, warmup=warmup,
                             block_seconds=perf.BLOCK_SECONDS, probe=probe)
        limit = probe.limit(times)
        for runtime in calls:
            t = perf.Spread.of(times[runtime])
            rows.append({"model": pair.name, "runtime": runtime, "threads": threads, "batch": batch,
                         "seq_len": seq_len, "median_ms": t.median * 1e3, "min_ms": t.min * 1e3,
                         "max_ms": t.max * 1e3, "runs": t.repeats, "q1_ms": t.q1 * 1e3, "q3_ms": t.q3 * 1e3,
                         "seconds": t.seconds, "gflop": flops / 1e9, **limit.rates(flops, t.median),
                         **limit.columns()})
    return rows


def model_inputs(model_dir: str | os.PathLike, source_json: str | os.PathLike) -> list[str | os.PathLike]:
    """The files a comparison of the export in `model_dir` with its source reads."""
    names = (manifest.ONNX_FILE, manifest.TOKENIZER_FILE, manifest.MANIFEST)
    return [source_json, *(Path(model_dir) / name for name in names)]


# How far padded batches of the trainable modules may differ from the texts run alone, relative to the
# largest value: float32 reassociation only. Attention's probabilities times values reduce over the
# padded length, and the matrix library may block a longer reduction otherwise (a random XLM-R base at
# full size: 3.1e-6 on one text of 151 pieces in a batch padded to 214); a padding bug (a position or a
# mask read wrongly) moves the values by their own size.
BATCH_TOLERANCE = 1e-5


def compare_rows(model_dir: str | os.PathLike, source_json: str | os.PathLike, texts: str | os.PathLike,
                 threads: int, inference_out: str | os.PathLike, diffs: str | os.PathLike,
                 trainable_out: str | os.PathLike) -> provenance.Done:
    """The model's row of the inference table to `inference_out` (CSV) with its per-token differences to
    `diffs` (.npy), and its rows of the trainable table to `trainable_out` (CSV): the reference and the
    graph run each text once, and both tables read those states.

    Once the rows are written, ParityError when padded batches of the trainable modules differ from the
    texts run alone by more than float32 reassociation (BATCH_TOLERANCE); a smaller difference is a note
    (batch_equal False)."""
    threads = machine.torch_threads(threads)
    report = provenance.Done(inputs=[*model_inputs(model_dir, source_json), texts])
    pair = compare.Pair.load(model_dir, source_json)
    chosen = [r["text"] for r in compare.read_texts(texts)]
    session = ort_session(pair.onnx_path, threads)
    alone = compare.run_alone(pair, chosen, session)
    row, per_token = inference_parity(pair, chosen, threads, alone=alone, session=session)
    with files.atomic_path(diffs) as tmp, open(tmp, "wb") as handle:
        np.save(handle, per_token)
    report.table(TABLES["inference"].title, write_rows("inference", [asdict(row)], inference_out))
    if row.truncated:
        report.notes.append(f"{row.truncated} texts were cut to the model's {pair.pieces.max_pieces} "
                            "positions")
    rows = compare.trainable_parity(pair, chosen, threads, alone=alone)
    batch_max_abs = max(r.pop("batch_max_abs") for r in rows)  # the fragment's, not the table's
    report.table(TABLES["trainable"].title, write_rows("trainable", rows, trainable_out))
    report.outputs += [inference_out, diffs, trainable_out]
    _check_batches(pair.name, rows, batch_max_abs, report)
    return report


def _check_batches(name: str, rows: list[dict], batch_max_abs: float, report: provenance.Done) -> None:
    """ParityError, or a note, when the trainable modules' padded batches differ from texts run alone."""
    if rows[0]["batch_equal"]:
        return
    relative = batch_max_abs / max(1.0, max(r["max_value"] for r in rows))
    if not relative <= BATCH_TOLERANCE:
        raise compare.ParityError(f"{name}: padded batches of the trainable modules differ from the "
                                  f"texts run alone by {batch_max_abs:.3g} (relative {relative:.3g} > "
                                  f"{BATCH_TOLERANCE}): more than float32 reassociation")
    report.notes.append(f"padded batches differ from the texts run alone by up to {batch_max_abs:.3g} "
                        f"(relative {relative:.3g} <= {BATCH_TOLERANCE}): float32 reassociation in the "
                        "matrix library, not a padding error")


def latency_rows(models: Sequence[tuple[str | os.PathLike, str | os.PathLike, str | os.PathLike]],
                 threads: int, batches: tuple[int, ...], seq_len: int, warmup: int, runs: int,
                 min_seconds: float) -> provenance.Done:
    """Each model's rows of the latency table to its CSV: `models` holds (model dir, source.json, out)
    triples, timed one after another in one process, beside one GEMM probe calibrated once for all (the
    cells share the threads); each model's rows carry the machine's load around its own cells."""
    threads = machine.torch_threads(threads)
    report = provenance.Done()
    probe = perf.Probe.beside(threads, min_seconds)
    everything = []
    for model_dir, source_json, out in models:
        report.inputs += model_inputs(model_dir, source_json)
        rows, load = _model_latency(model_dir, source_json, threads, batches, seq_len, warmup, runs,
                                    min_seconds, probe)
        write_rows("latency", rows, out)
        report.outputs.append(out)
        report.notes.append(f"{rows[0]['model']}: load average (1, 5, 15 min) before: {load[0]}; after: "
                            f"{load[1]}")
        everything += rows
    report.notes.append(f"Each cell: at least {runs} calls and {min_seconds:g} s of calls per runtime, "
                        "taking turns. Indicative timings on a possibly shared machine, not a gated result.")
    report.notes += probe.notes()
    report.notes += [f"{r['model']}, {r['runtime']}, batch {r['batch']}: {r['fraction_of_gemm']:.2f} of "
                     f"GEMM, {r['limit_note']}" for r in everything if r["limit_note"]]
    report.table("Latency", markdown("latency", everything))
    return report


def _model_latency(model_dir, source_json, threads, batches, seq_len, warmup, runs, min_seconds,
                   probe) -> tuple[list[dict], tuple[str, str]]:
    """One model's latency rows and the load average before and after its cells. Its models are
    released on return, so that a job timing several holds one at a time."""
    pair = compare.Pair.load(model_dir, source_json)
    before = machine.load_average()
    rows = latency(pair, threads, batches, seq_len, warmup, runs, min_seconds, probe=probe)
    after = machine.load_average()
    for row in rows:
        row.update(load_before=before.split()[0], load_after=after.split()[0])
    return rows, (before, after)
