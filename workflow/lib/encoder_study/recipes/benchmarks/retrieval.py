"""`benchmarks retrieval`: the three-head retrieval graph, float32 and its int8 variant, in texts and
tokens per second at each thread count, beside the machine's GEMM probe.

The texts are the parity texts (Tatoeba sentences and UDHR paragraphs), tokenised with the graph's
tokenizer.json (cut to the model's positions), in their order, batches of `batch` texts padded to the
longest; one pass runs every batch once and asks for all three outputs. The int8 graph is made again from
the float32 one with the settings `retrieval_quantisation` gated it with, and refused unless its SHA-256
is the one that job measured (`onnx.quantise.remake`): what is timed is what was gated, published or not.
The counted work is the encoder's (`perf.encoder_flops`, no padding); the heads' is left out.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ...core import files, tables
from ...encoders import perf
from ...onnx import quantise as quantiser
from ...onnx import runtime
from ...onnx.manifest import CONFIG_FILE, ONNX_FILE, TOKENIZER_FILE

COLUMNS = ["threads", "texts", "tokens", "batch", "batches", "repeats", "float32_texts_s", "float32_tok_s",
           "int8_texts_s", "int8_tok_s", "ratio", "float32_tok_s_min", "float32_tok_s_max", "int8_tok_s_min",
           "int8_tok_s_max", "float32_repeats", "int8_repeats", "gflop", "float32_gflops", "int8_gflops",
           "gemm_gflops", "float32_fraction_of_gemm", "int8_fraction_of_gemm", "gemm_gflops_min",
           "gemm_gflops_max", "gemm_probe", "peak_gflops", "float32_bytes", "int8_bytes", "published",
           "load_before", "load_after"]
MARKDOWN = (("threads", "threads", "n"), ("texts", "texts", "n"), ("tokens", "tokens", "n"),
            ("float32_texts_s", "float32 texts/s", ",.1f"), ("float32_tok_s", "float32 tok/s", ",.0f"),
            ("int8_texts_s", "int8 texts/s", ",.1f"), ("int8_tok_s", "int8 tok/s", ",.0f"),
            ("ratio", "int8 / float32", ".2f"), ("float32_fraction_of_gemm", "float32 of GEMM", ".2f"),
            ("int8_fraction_of_gemm", "int8 of GEMM", ".2f"), ("load_before", "load (1 min) before", ".2f"))


def batches(model_dir: Path, texts: list[str], batch: int) -> tuple[list[tuple], list[int], dict]:
    """(input_ids, attention_mask) batches of `batch` texts, every text's piece count, the model's config."""
    from tokenizers import Tokenizer

    from ...encoders.families import usable_positions

    config = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=usable_positions(config) or 512)
    rows = [tokenizer.encode(t).ids for t in texts]
    pad = config.get("pad_token_id") or 0
    return ([runtime.pad_batch(rows[i:i + batch], pad) for i in range(0, len(rows), batch)],
            [len(r) for r in rows], config)


def _load1() -> float | str:
    try:
        return os.getloadavg()[0]
    except OSError:
        return ""


def retrieval_rows(model_dir: str | os.PathLike, gated: dict, texts: list[str], batch: int,
                   thread_counts: list[int], min_seconds: float, warmup: int = 1, repeats: int = 3
                   ) -> list[dict]:
    """One row per thread count: both graphs' texts and tokens per second, timed in turns with the probe."""
    from ...core.machine import torch_threads

    model_dir = Path(model_dir)
    feeds, lengths, config = batches(model_dir, texts, batch)
    flops = perf.encoder_flops(perf.Shape.from_config(config), lengths)
    ops = ("MatMul", "Gather") if gated["embeddings"] == "True" else ("MatMul",)
    rows, probes = [], {}
    with tempfile.TemporaryDirectory(prefix="int8-benchmark-") as tmp:
        graph = Path(tmp) / ONNX_FILE
        record = quantiser.remake(model_dir / ONNX_FILE, graph, gated["per_channel"] == "True", ops,
                                  gated["int8_sha256"])
        for threads in thread_counts:
            sessions = {"float32": runtime.ort_session(model_dir / ONNX_FILE, threads, "all"),
                        "int8": runtime.ort_session(graph, threads, "all")}

            def one_pass(session):
                for ids, mask in feeds:
                    session.run(None, {"input_ids": ids, "attention_mask": mask})

            torch_threads(threads)  # the probe's torch.mm candidates run at the cell's threads
            probe = probes[threads] = perf.Probe.beside(threads, min_seconds)
            before = _load1()
            times = perf.measure({name: (lambda s=s: one_pass(s)) for name, s in sessions.items()},
                                 min_seconds, min_repeats=repeats, warmup=warmup,
                                 block_seconds=perf.BLOCK_SECONDS, probe=probe)
            limit = probe.limit(times)
            row = {"threads": threads, "texts": len(texts), "tokens": sum(lengths), "batch": batch,
                   "batches": len(feeds), "gflop": flops / 1e9, **limit.columns(),
                   "float32_bytes": quantiser.graph_bytes(model_dir / ONNX_FILE),
                   "int8_bytes": record["bytes"],
                   "published": gated["published"], "load_before": before, "load_after": _load1()}
            for name in sessions:
                spread = perf.Spread.of(times[name])
                rate = limit.rates(flops, spread.median)
                row.update({f"{name}_texts_s": len(texts) / spread.median,
                            f"{name}_tok_s": sum(lengths) / spread.median,
                            f"{name}_tok_s_min": sum(lengths) / spread.max,
                            f"{name}_tok_s_max": sum(lengths) / spread.min, f"{name}_repeats": spread.repeats,
                            f"{name}_gflops": rate["gflops"],
                            f"{name}_fraction_of_gemm": rate["fraction_of_gemm"]})
            row["repeats"] = min(row["float32_repeats"], row["int8_repeats"])
            row["ratio"] = row["int8_tok_s"] / row["float32_tok_s"]
            rows.append(row)
            sessions = None
    return rows


def write(rows: list[dict], out: str | os.PathLike) -> tuple[Path, Path, str]:
    markdown = tables.markdown(rows, MARKDOWN)
    files.write_text(out, tables.csv_text(rows, COLUMNS))
    files.write_text(Path(out).with_suffix(".md"), markdown)
    return Path(out), Path(out).with_suffix(".md"), markdown
