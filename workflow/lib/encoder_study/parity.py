"""Inference parity and latency: the exported graph in ONNX Runtime against the PyTorch model.

Parity runs one text per call and compares every token's hidden state; a padded batch of 8 is
also compared with the same texts run alone. Latency times both runtimes on the same inputs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from . import compare, files, machine, manifest, provenance, tables
from .runtime import OUTPUT, ort_session, pad_batch

INFERENCE_COLUMNS = ["model", "tokens", "texts", "truncated", "max_abs", "mean_abs", "min_cos", "mean_cos",
                     "max_value", "batch_max_abs"]
TRAINABLE_COLUMNS = ["model", "family", "comparison", "tokens", "max_abs", "mean_abs", "min_cos", "max_value",
                     "batch_equal"]
LATENCY_COLUMNS = ["model", "runtime", "threads", "batch", "seq_len", "median_ms", "min_ms", "max_ms", "runs"]


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


def inference_parity(model: compare.Model, texts: list[str], threads: int, batch: int = 8
                     ) -> tuple[InferenceRow, np.ndarray]:
    """One text per run in both runtimes, every token compared; and padded batches against singles."""
    session = ort_session(model.onnx_path, threads)
    rows, truncated = model.encode(texts)
    per_token, cosines, abs_sums, singles = [], [], 0.0, []
    max_value, elements = 0.0, 0
    for row in rows:
        ids, mask = pad_batch([row], model.pad_id)
        ref = compare.torch_states(model.torch_model, ids, mask)[0]
        got = session.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0][0]
        diff, cos = compare.token_differences(ref, got)
        per_token.append(diff)
        cosines.append(cos)
        abs_sums += float(np.abs(ref.astype(np.float64) - got).sum())
        elements += ref.size
        max_value = max(max_value, float(np.abs(ref).max()))
        singles.append(got)
    batch_max = 0.0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids, mask = pad_batch(chunk, model.pad_id)
        out = session.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]
        for i, row in enumerate(chunk):
            batch_max = max(batch_max, float(np.abs(out[i, : len(row)] - singles[start + i]).max()))
    diffs, cos = np.concatenate(per_token), np.concatenate(cosines)
    result = InferenceRow(
        model=model.name, tokens=int(diffs.size), texts=len(rows), truncated=truncated,
        max_abs=float(diffs.max()), mean_abs=abs_sums / elements, min_cos=float(cos.min()),
        mean_cos=float(cos.mean()), max_value=max_value, batch_max_abs=batch_max)
    return result, diffs


def time_call(fn, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def latency(model: compare.Model, threads: int, batches: tuple[int, ...] = (1, 8), seq_len: int = 64,
            warmup: int = 3, runs: int = 20, seed: int = 0) -> list[dict]:
    """Median, min and max milliseconds per call of each runtime on the same random inputs."""
    torch.set_num_threads(threads)
    session = ort_session(model.onnx_path, threads)
    vocab = int(model.torch_model.config.vocab_size)
    seq_len = min(seq_len, model.max_pieces)
    rng = np.random.default_rng(seed)
    rows = []
    for batch in batches:
        ids = rng.integers(5, vocab, size=(batch, seq_len), dtype=np.int64)
        mask = np.ones_like(ids)
        feeds = {"input_ids": ids, "attention_mask": mask}
        calls = {
            "onnxruntime": lambda feeds=feeds: session.run([OUTPUT], feeds),
            "pytorch": lambda ids=ids, mask=mask: compare.torch_states(model.torch_model, ids, mask),
        }
        for runtime, fn in calls.items():
            times = time_call(fn, warmup, runs)
            rows.append({"model": model.name, "runtime": runtime, "threads": threads, "batch": batch,
                         "seq_len": seq_len, "median_ms": statistics.median(times), "min_ms": min(times),
                         "max_ms": max(times), "runs": runs})
    return rows


csv_text = tables.csv_text  # floats (numpy's too) as the shortest round-trip repr: equal numbers, equal bytes
read_csv = tables.read_csv


def inference_markdown(rows: list[dict]) -> str:
    return provenance.markdown_table(
        ["model", "tokens", "max abs", "mean abs", "min cosine", "mean cosine", "largest value",
         "batch of 8 vs alone"],
        [(r["model"], f"{int(r['tokens']):,}", f"{float(r['max_abs']):.2g}", f"{float(r['mean_abs']):.2g}",
          f"{float(r['min_cos']):.8f}", f"{float(r['mean_cos']):.8f}", f"{float(r['max_value']):.3g}",
          f"{float(r['batch_max_abs']):.2g}") for r in rows], "lrrrrrrr")


def trainable_markdown(rows: list[dict]) -> str:
    return provenance.markdown_table(
        ["model", "family", "comparison", "tokens", "max abs", "mean abs", "min cosine", "largest value",
         "batches of 8 = alone"],
        [(r["model"], r["family"], r["comparison"], f"{int(r['tokens']):,}", f"{float(r['max_abs']):.2g}",
          f"{float(r['mean_abs']):.2g}", f"{float(r['min_cos']):.8f}", f"{float(r['max_value']):.3g}",
          "yes" if str(r["batch_equal"]) == "True" else "NO") for r in rows], "lllrrrrrl")


def latency_markdown(rows: list[dict]) -> str:
    return provenance.markdown_table(
        ["model", "runtime", "threads", "batch", "seq len", "median ms", "min ms", "max ms"],
        [(r["model"], r["runtime"], r["threads"], r["batch"], r["seq_len"], f"{float(r['median_ms']):.3g}",
          f"{float(r['min_ms']):.3g}", f"{float(r['max_ms']):.3g}") for r in rows], "llrrrrrr")


def plot_differences(per_model: dict[str, np.ndarray], target: str | os.PathLike) -> None:
    """Histogram of per-token max abs differences (log scale), one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    bins = np.logspace(-10, 0, 61)
    for name in sorted(per_model):
        values = np.clip(per_model[name], 1e-10, None)
        ax.hist(values, bins=bins, histtype="step", label=f"{name} ({values.size:,} tokens)")
    ax.set_xscale("log")
    ax.set_xlabel("largest |ONNX Runtime - PyTorch| over a token's hidden state")
    ax.set_ylabel("tokens")
    ax.set_title("Inference parity, one text per run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with files.atomic_path(target) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`encoder-study parity inference|latency|gather ...`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="encoder-study parity", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    for action in ("inference", "trainable", "latency"):
        p = sub.add_parser(action)
        provenance.add_arguments(p)
        p.add_argument("--model-dir", required=True, help="results/models/<model>")
        p.add_argument("--source", required=True, help="results/sources/<model>/source.json")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--out", required=True, help="the model's CSV row(s)")
        if action in ("inference", "trainable"):
            p.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
        if action == "inference":
            p.add_argument("--diffs", required=True, help=".npy of per-token max abs differences")
        if action == "latency":
            p.add_argument("--batches", default="1,8")
            p.add_argument("--seq-len", type=int, default=64)
            p.add_argument("--warmup", type=int, default=3)
            p.add_argument("--runs", type=int, default=20)
    p = sub.add_parser("gather")
    provenance.add_arguments(p)
    p.add_argument("--kind", choices=["inference", "trainable", "latency"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--plot", help="PNG of the per-token differences (inference)")
    p.add_argument("parts", nargs="+", help="per-model CSVs (and, for inference, their .npy beside them)")
    args = parser.parse_args(argv)
    threads = max(1, min(getattr(args, "threads", 1), os.cpu_count() or 1))
    try:
        with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
            if args.action == "gather":
                _gather(args, frag)
                return 0
            torch.set_num_threads(threads)
            frag.inputs += [args.source, *(Path(args.model_dir) / n for n in (
                manifest.ONNX_FILE, manifest.TOKENIZER_FILE, manifest.MANIFEST))]
            model = compare.Model.load(args.model_dir, args.source)
            if args.action == "inference":
                frag.inputs.append(args.texts)
                texts = [r["text"] for r in compare.read_texts(args.texts)]
                row, diffs = inference_parity(model, texts, threads)
                with files.atomic_path(args.diffs) as tmp, open(tmp, "wb") as handle:
                    np.save(handle, diffs)
                rows = [asdict(row)]
                files.write_text(args.out, csv_text(rows, INFERENCE_COLUMNS))
                frag.outputs += [args.out, args.diffs]
                frag.table("Inference parity", inference_markdown(rows))
                if row.truncated:
                    frag.note(f"{row.truncated} texts were cut to the model's {model.max_pieces} positions")
            elif args.action == "trainable":
                frag.inputs.append(args.texts)
                rows = compare.trainable_parity(model, [r["text"] for r in compare.read_texts(args.texts)], threads)
                files.write_text(args.out, csv_text(rows, TRAINABLE_COLUMNS))
                frag.outputs.append(args.out)
                frag.table("Trainable parity", trainable_markdown(rows))
                if not rows[0]["batch_equal"]:
                    raise compare.ParityError(f"{model.name}: padded batches of the trainable modules differ from "
                                      "the texts run alone; the design promises exact equality")
            else:
                before = machine.load_average()
                rows = latency(model, threads, tuple(int(b) for b in args.batches.split(",")), args.seq_len,
                               args.warmup, args.runs)
                frag.note(f"load average (1, 5, 15 min) before: {before}; after: {machine.load_average()}. "
                          "Indicative timings on a possibly shared machine, not a gated result.")
                files.write_text(args.out, csv_text(rows, LATENCY_COLUMNS))
                frag.outputs.append(args.out)
                frag.table("Latency", latency_markdown(rows))
    except (compare.ParityError, manifest.ManifestError, files.IntegrityError) as err:
        print(f"encoder-study parity: error: {err}", file=sys.stderr)
        return 2
    return 0


def _gather(args, frag: provenance.Fragment) -> None:
    """Concatenate per-model CSVs (sorted by model) into the table, its Markdown and the plot."""
    columns, render, title = {
        "inference": (INFERENCE_COLUMNS, inference_markdown, "Inference parity"),
        "trainable": (TRAINABLE_COLUMNS, trainable_markdown, "Trainable parity"),
        "latency": (LATENCY_COLUMNS, latency_markdown, "Latency"),
    }[args.kind]
    rows = []
    for part in sorted(args.parts):
        rows += read_csv(part)  # within a part, rows keep the order the command wrote them in
        frag.inputs.append(part)
    rows.sort(key=lambda r: r["model"])  # stable: runtimes, batches and comparisons keep their order
    files.write_text(args.out, csv_text(rows, columns))
    markdown = render(rows)
    files.write_text(args.markdown, markdown)
    frag.outputs += [args.out, args.markdown]
    if args.plot:
        per_model = {}
        for part in sorted(args.parts):
            diffs = Path(part).with_suffix(".npy")
            per_model[read_csv(part)[0]["model"]] = np.load(diffs)
            frag.inputs.append(diffs)
        plot_differences(per_model, args.plot)
        frag.outputs.append(args.plot)
    frag.table(title, markdown)
