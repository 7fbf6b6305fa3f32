"""The encoders against the machine's limit and against their references (recipe `benchmarks`).

One table, results/benchmarks/encoders.csv, one row per timed path, in these parts:

    peak      the theoretical float32 peak at the job's threads, its inputs in the path (machine.fp32_peak);
              ratio: the measured best (the probe's calibration) over it
    gemm      the GEMM probe's candidates (perf.Probe: ONNX Runtime's MatMul and torch.mm at several
              shapes), as timed when the probe picked the fastest, each against that fastest (seconds per
              sample: as many products as take perf.PROBE_SECONDS); last, the probe across the whole job
              (every probe sample beside every part): its spread over the run
    shape     one batch of `batch` x `seq_len` random pieces, no padding: ONNX Runtime on the exported
              graph, our trainable modules' forward pass and Hugging Face's (eager attention), both
              without autograd. fraction_of_gemm is the question "how close to the machine's matmul rate
              does each path run"; ratio is against the ONNX Runtime row.
    graphs    ONNX Runtime at the same shape on each graph variant (onnx.fusion: the exported graph, ONNX
              Runtime's transformer optimizer with its default fusions, and with attention and GELU fusions
              only), side by side; max_abs: each variant against Hugging Face's model on the same ids with
              padded rows (real tokens only), max_value the largest value there
    frozen    FrozenEncoder on `docs` synthetic sentences (fresh cache each time: tokenize, windows,
              batches, run, pool) against a bare session.run loop over exactly the batches the encoder
              sent (recorded once), on the same session; and the encoder's own work with the model's
              outputs replayed. ratio - 1 is the encoder's overhead over the bare session.
    step      one forward and backward pass (loss mean(hidden^2)) on `rows` x `length` pieces, token
              table frozen, eval mode (no dropout): our modules against Hugging Face's. Peak memory:
              in a fresh subprocess per implementation, after a warm-up step, gc and malloc_trim, the
              kernel's high-water mark reset (/proc/self/clear_refs), the rise of VmHWM over VmRSS
              during one step (median of 3; counts everything the step touches, gradients included).
    words     TrainableEncoder forward and backward on the documents against its modules on the exact
              batches it ran: the cost of tokenization, windows and the pooling gather.

Every cell is the median of at least `min_seconds` of calls with its quartiles and range, the paths of a
part taking turns with each other and with the GEMM probe (perf.measure): each row's fraction_of_gemm
reads its rate against the probe measured beside it (gemm_gflops, with its range), and limit_note says
why where a fraction is above 1. Work is counted by perf.encoder_flops on each sequence's own length
(padding is not work; a step is 3 forwards). Inputs are seeded; the timings are the machine's.
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from ...core import machine, tables
from ...encoders import families, perf, reference, trainable
from ...encoders.frozen import FrozenEncoder
from ...encoders.tokens import Doc, PieceTokenizer
from ...encoders.trainable.words import TrainableEncoder
from ...onnx import fusion, manifest
from ...onnx.runtime import OUTPUT, ort_session

COLUMNS = ["part", "path", "threads", "batch", "seq_len", "median_s", "q1_s", "q3_s", "min_s", "max_s",
           "repeats", "seconds", "gflop", "gflops", "gemm_gflops", "fraction_of_gemm", "ratio",
           "peak_rss_rise_mb", "gemm_gflops_min", "gemm_gflops_max", "gemm_probe", "peak_gflops",
           "limit_note", "graph", "max_abs", "max_value"]
MARKDOWN = (("part", "part", ""), ("path", "path", ""), ("batch", "batch", ""), ("seq_len", "pieces", ""),
            ("median_s", "median s", ".4g"), ("min_s", "min s", ".4g"), ("max_s", "max s", ".4g"),
            ("repeats", "calls", "n"), ("gflops", "GFLOP/s", ".3g"), ("gemm_gflops", "GEMM GFLOP/s", ".3g"),
            ("fraction_of_gemm", "of GEMM", ".2f"), ("ratio", "ratio", ".3f"),
            ("peak_rss_rise_mb", "peak RSS rise MB", ".1f"), ("max_abs", "max abs vs transformers", ".2g"),
            ("graph", "fused", ""), ("limit_note", "note", ""))
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
         "have an they you were her she there been one all we their has would when if so no will can more "
         "river bank water record time arrow fruit flies market price city council report school student "
         "teacher morning evening garden window letter station journey question answer reason history "
         "village mountain forest summer winter quickly slowly carefully quietly bright heavy ancient "
         "modern simple difficult important beautiful strange ordinary remember believe consider explain "
         "develop discover produce receive suggest understand unbelievably internationalization").split()


def synthetic_docs(n: int, seed: int) -> list[Doc]:
    """`n` English-like sentences of 10 to 30 words and a final period, the same for every run."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 30) - 1)]
        docs.append(Doc.from_words([words[0].capitalize(), *words[1:], "."]))
    return docs


def load_module(kind: str, model_dir: Path, source_dir: Path) -> torch.nn.Module:
    """(input_ids, attention_mask) -> hidden states, token table frozen, eval mode."""
    if kind == "encoder_study":
        return trainable.load(model_dir).eval()  # the token table is frozen by default
    model = reference.load_pytorch(source_dir)
    model.get_input_embeddings().weight.requires_grad_(False)  # as in step time
    return reference.HiddenStates(model).eval()


def _row(part: str, path: str, threads: int, batch, seq_len, spread: perf.Spread, flops: float | None,
         limit: perf.Limit, reference_median: float) -> dict:
    row = {"part": part, "path": path, "threads": threads, "batch": batch, "seq_len": seq_len,
           "median_s": spread.median, "q1_s": spread.q1, "q3_s": spread.q3, "min_s": spread.min,
           "max_s": spread.max, "repeats": spread.repeats, "seconds": spread.seconds, **limit.columns(),
           "ratio": spread.median / reference_median}
    if flops:
        row.update(gflop=flops / 1e9, **limit.rates(flops, spread.median))
    return row


def _part(part: str, calls: dict, threads: int, batch, seq_len, flops: dict, probe: perf.Probe,
          min_seconds: float, block_seconds: float = 0.0) -> list[dict]:
    """Rows of one part: its paths timed in turn with the probe, each against the part's first path."""
    times = perf.measure(calls, min_seconds, warmup=2, block_seconds=block_seconds, probe=probe)
    limit = probe.limit(times)
    spreads = {name: perf.Spread.of(times[name]) for name in calls}
    first = next(iter(spreads.values())).median
    return [_row(part, name, threads, batch, seq_len, s, flops.get(name), limit, first)
            for name, s in spreads.items()]


def peak_and_gemm_rows(probe: perf.Probe) -> list[dict]:
    """The theoretical peak, and each candidate of the probe as timed when it picked the fastest."""
    peak = probe.peak
    best = probe.calibration_gflops
    rows = [{"part": "peak", "path": f"theoretical: {machine.peak_text(peak)}", "threads": probe.threads,
             "gflops": peak["gflops"], "peak_gflops": peak["gflops"], "gemm_gflops": best,
             "ratio": best / peak["gflops"] if peak["gflops"] else None}]
    limit = perf.Limit(probe.gemm.name, best, best, best, best, peak["gflops"])
    for gemm, spread in probe.calibration.items():  # seconds per sample of probe.repeats[gemm] products
        chosen = " (the probe)" if gemm == probe.gemm else ""
        rows.append(_row("gemm", gemm.name + chosen, probe.threads, None, None, spread,
                         probe.sample_flops(gemm), limit, probe.calibration[probe.gemm].median))
    return rows


def probe_run_row(probe: perf.Probe) -> dict:
    """The probe over every turn it took beside the parts: its spread across the run."""
    run = probe.run_limit()
    spread = perf.Spread.of(probe.turns)
    return {**_row("gemm", f"{probe.gemm.name}: the probe across the run", probe.threads, None, None, spread,
                   probe.sample_flops(), run, spread.median), "limit_note": ""}


def shape_part(model_dir: Path, source_dir: Path, shape: perf.Shape, threads: int, batch: int, seq_len: int,
               probe: perf.Probe, min_seconds: float, seed: int) -> list[dict]:
    session = ort_session(model_dir / manifest.ONNX_FILE, threads)
    ids = shape_ids(model_dir, batch, seq_len, seed)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    tensors = torch.from_numpy(ids), torch.ones(batch, seq_len, dtype=torch.int64)
    ours, theirs = (load_module(kind, model_dir, source_dir) for kind in ("encoder_study", "transformers"))

    def forward(module):
        def call():
            with torch.no_grad():
                module(*tensors)
        return call

    calls = {"onnxruntime (exported graph)": lambda: session.run([OUTPUT], feeds),
             "encoder_study modules, forward": forward(ours),
             "transformers (eager), forward": forward(theirs)}
    flops = perf.encoder_flops(shape, [seq_len] * batch)
    return _part("shape", calls, threads, batch, seq_len, dict.fromkeys(calls, flops), probe, min_seconds,
                 perf.BLOCK_SECONDS)  # ONNX Runtime against PyTorch: in blocks


def shape_ids(model_dir: Path, batch: int, seq_len: int, seed: int) -> np.ndarray:
    """The fixed-shape parts' random piece ids (no special or low ids), seeded."""
    tokenizer = PieceTokenizer(model_dir / manifest.TOKENIZER_FILE)
    vocab = int(manifest.read_config(model_dir)["vocab_size"])
    rng = np.random.default_rng(seed)
    return rng.integers(tokenizer.n_specials + 100, vocab, size=(batch, seq_len), dtype=np.int64)


def graphs_part(model_dir: Path, source_dir: Path, shape: perf.Shape, threads: int, batch: int, seq_len: int,
                probe: perf.Probe, min_seconds: float, seed: int, work_dir: Path) -> list[dict]:
    """ONNX Runtime at `batch` x `seq_len` on each graph variant (onnx.fusion), in turn in blocks; and
    each variant's largest difference from Hugging Face's model on the same ids with padded rows
    (`max_abs`, over real tokens; `max_value` the largest value there)."""
    config = manifest.read_config(model_dir)
    graphs = fusion.variants(model_dir / manifest.ONNX_FILE, config, work_dir,
                             families.of_config(config).ort_model_type)
    sessions = {variant: ort_session(path, threads) for variant, (path, _) in graphs.items()}
    ids = shape_ids(model_dir, batch, seq_len, seed)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    padded = np.ones_like(ids)
    for i in range(1, batch):  # rows of decreasing length, down to half the sequence
        padded[i, seq_len - i * seq_len // (2 * batch):] = 0
    with torch.no_grad():
        reference = load_module("transformers", model_dir, source_dir)(
            torch.from_numpy(ids), torch.from_numpy(padded)).numpy()[padded == 1]
    calls = {f"onnxruntime ({variant})": (lambda s=s: s.run([OUTPUT], feeds))
             for variant, s in sessions.items()}
    flops = perf.encoder_flops(shape, [seq_len] * batch)
    rows = _part("graphs", calls, threads, batch, seq_len, dict.fromkeys(calls, flops), probe, min_seconds,
                 perf.BLOCK_SECONDS)  # each session has its own threads: in blocks
    for row, (variant, session) in zip(rows, sessions.items(), strict=True):
        out = session.run([OUTPUT], {"input_ids": ids, "attention_mask": padded})[0][padded == 1]
        row.update(graph=fusion.fused_text(graphs[variant][1]), max_abs=float(np.abs(out - reference).max()),
                   max_value=float(np.abs(reference).max()))
    return rows


class _Recorder:
    """Stands in for FrozenEncoder's session and keeps the feeds of every batch."""

    def __init__(self, session):
        self.session, self.feeds = session, []

    def run(self, names, feeds):
        self.feeds.append({k: v.copy() for k, v in feeds.items()})
        return self.session.run(names, feeds)


class _Replay:
    """Stands in for FrozenEncoder's session and answers each batch with the next recorded output."""

    def __init__(self, outputs):
        self.outputs, self.calls = outputs, 0

    def run(self, names, feeds):
        out = self.outputs[self.calls % len(self.outputs)]
        self.calls += 1
        return out


def frozen_part(model_dir: Path, shape: perf.Shape, docs: list[Doc], threads: int, probe: perf.Probe,
                min_seconds: float) -> list[dict]:
    encoder = FrozenEncoder(model_dir, threads=threads)
    session = encoder.session
    encoder.session = _Recorder(session)
    encoder(docs)
    feeds, encoder.session = encoder.session.feeds, session
    replay = _Replay([session.run([OUTPUT], feed) for feed in feeds])

    def frozen():
        encoder.clear_cache()
        encoder(docs)

    def bare():
        for feed in feeds:
            session.run([OUTPUT], feed)

    def own():  # the encoder with the model's outputs replayed: its own work alone
        encoder.clear_cache()
        encoder.session = replay
        try:
            encoder(docs)
        finally:
            encoder.session = session

    lengths = [int(n) for feed in feeds for n in feed["attention_mask"].sum(axis=1)]
    flops = perf.encoder_flops(shape, lengths)
    rows = _part("frozen", {"bare session.run, same batches": bare, "FrozenEncoder": frozen,
                            "FrozenEncoder own work (outputs replayed)": own},
                 threads, len(docs), sum(lengths), {"bare session.run, same batches": flops,
                                                    "FrozenEncoder": flops}, probe, min_seconds)
    return rows


def step_batch(model_dir: Path, docs: list[Doc], rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` full sequences of `length` ids: the documents' pieces in order, specials around each row."""
    tokenizer = PieceTokenizer(model_dir / manifest.TOKENIZER_FILE)
    ids = np.concatenate([tokenizer.encode(doc.text)[0] for doc in docs])
    inner = length - tokenizer.n_specials
    if len(ids) < rows * inner:
        ids = np.tile(ids, rows * inner // len(ids) + 1)
    batch = np.stack([tokenizer.wrap(ids[i * inner:(i + 1) * inner]) for i in range(rows)])
    return torch.from_numpy(batch), torch.ones(rows, length, dtype=torch.long)


def _forward_backward(module, ids, mask) -> None:
    module.zero_grad(set_to_none=True)
    module(ids, mask).pow(2).mean().backward()


def memory_child(kind: str, model_dir: str, source_dir: str, threads: int, rows: int, length: int,
                 docs: int, seed: int) -> float:
    """In this (fresh) process: the median peak RSS rise (MiB) of one step, after a warm-up step."""
    torch.set_num_threads(threads)
    module = load_module(kind, Path(model_dir), Path(source_dir))
    ids, mask = step_batch(Path(model_dir), synthetic_docs(docs, seed), rows, length)
    _forward_backward(module, ids, mask)  # one-time initialisation is not a step's memory
    rises = []
    for _ in range(3):
        module.zero_grad(set_to_none=True)
        gc.collect()
        machine.reset_peak()  # freed heap handed back, VmHWM reset to the current VmRSS
        before = machine.resident_kib()
        _forward_backward(module, ids, mask)
        rises.append(machine.peak_resident_kib() - before)
    return statistics.median(rises) / 1024


def _peak_in_fresh_process(*args) -> float | None:
    """memory_child in a fresh interpreter, so that nothing loaded before counts; None off Linux."""
    if not Path("/proc/self/clear_refs").exists():
        return None
    code = ("import json, sys; from encoder_study.recipes.benchmarks.benchmarks import memory_child; "
            "print(json.dumps(memory_child(*json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps([str(a) if isinstance(a, Path) else a
                                                                    for a in args])],
                          check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def step_part(model_dir: Path, source_dir: Path, shape: perf.Shape, threads: int, rows: int, length: int,
              docs: int, seed: int, probe: perf.Probe, min_seconds: float) -> list[dict]:
    ids, mask = step_batch(model_dir, synthetic_docs(docs, seed), rows, length)
    modules = {kind: load_module(kind, model_dir, source_dir)
               for kind in ("encoder_study", "transformers")}
    calls = {f"{kind}, forward + backward": (lambda m=m: _forward_backward(m, ids, mask))
             for kind, m in modules.items()}
    flops = perf.step_flops(shape, [length] * rows)
    out = _part("step", calls, threads, rows, length, dict.fromkeys(calls, flops), probe, min_seconds)
    for row, kind in zip(out, modules, strict=True):
        row["peak_rss_rise_mb"] = _peak_in_fresh_process(kind, model_dir, source_dir, threads, rows, length,
                                                         docs, seed)
    return out


def words_part(model_dir: Path, docs: list[Doc], threads: int, probe: perf.Probe,
               min_seconds: float) -> list[dict]:
    encoder = TrainableEncoder(model_dir, threads=threads)
    batches = []
    handle = encoder.encoder.register_forward_pre_hook(lambda m, args: batches.append(args))
    encoder(docs)
    handle.remove()
    module = encoder.encoder

    def words():
        module.zero_grad(set_to_none=True)
        torch.cat(encoder(docs)).pow(2).mean().backward()

    def modules():
        module.zero_grad(set_to_none=True)
        sum(module(ids, mask).pow(2).mean() for ids, mask in batches).backward()

    return _part("words", {"modules on the recorded batches": modules, "TrainableEncoder": words},
                 threads, len(docs), sum(int(m.sum()) for _, m in batches), {}, probe, min_seconds)


def encoders(model_dir: str | os.PathLike, source_json: str | os.PathLike, threads: int, batch: int,
             seq_len: int, rows: int, length: int, docs: int, seed: int, min_seconds: float) -> list[dict]:
    """Every row of the table (COLUMNS): the peak and the GEMM probe first, the probe across the run last."""
    model_dir = Path(model_dir)
    manifest.verified_model(model_dir)
    source_dir, _ = reference.source_dir(source_json)
    torch.manual_seed(seed)
    shape = perf.Shape.from_config(manifest.read_config(model_dir))
    sentences = synthetic_docs(docs, seed)
    probe = perf.Probe.beside(threads, min_seconds)
    out = peak_and_gemm_rows(probe)
    out += shape_part(model_dir, source_dir, shape, threads, batch, seq_len, probe, min_seconds, seed)
    with tempfile.TemporaryDirectory(prefix="graph-variants-") as work_dir:
        out += graphs_part(model_dir, source_dir, shape, threads, batch, seq_len, probe, min_seconds, seed,
                           Path(work_dir))
    out += frozen_part(model_dir, shape, sentences, threads, probe, min_seconds)
    out += step_part(model_dir, source_dir, shape, threads, rows, length, docs, seed, probe, min_seconds)
    out += words_part(model_dir, sentences, threads, probe, min_seconds)
    return [*out, probe_run_row(probe)]


def summary(rows: list[dict]) -> list[str]:
    """What a closing note reads off the table, one line each: the frozen encoder's overhead, ONNX Runtime
    per graph variant, the measured best against the theoretical peak, the probe's spread across the
    run, and every fraction above 1 with its cause."""
    peak, run = rows[0], rows[-1]
    by_path = {(r["part"], r["path"]): r for r in rows}
    frozen, bare = (by_path[("frozen", p)] for p in ("FrozenEncoder", "bare session.run, same batches"))
    own = by_path[("frozen", "FrozenEncoder own work (outputs replayed)")]
    out = [f"frozen encoder: {frozen['ratio'] - 1:+.1%} over a bare session on the same batches "
           f"({frozen['median_s'] * 1e3:.1f} ms against {bare['median_s'] * 1e3:.1f} ms; its own work with "
           f"the outputs replayed {own['median_s'] * 1e3:.1f} ms)"]
    out += [f"onnxruntime at {r['batch']} x {r['seq_len']}, {r['path'].removeprefix('onnxruntime ')}: "
            f"{r['median_s'] * 1e3:.1f} ms, {r['gflops']:.1f} GFLOP/s, {r['fraction_of_gemm']:.2f} of GEMM, "
            f"{r['ratio']:.3f} of the exported graph's time; max_abs {r['max_abs']:.2g} against "
            f"transformers; fused: {r['graph']}" for r in rows if r["part"] == "graphs"]
    out.append(f"measured best {peak['gemm_gflops']:.1f} GFLOP/s (the probe's calibration) = "
               f"{peak['ratio']:.2f} of the theoretical peak {peak['path'].removeprefix('theoretical: ')}")
    if peak["ratio"] and peak["ratio"] > 1:
        out.append("the measured best is above the theoretical peak: the clock read is below the clock the "
                   "cores ran at (boost), or the rule's units or lanes undercount this CPU")
    parts = {r["part"]: r["gemm_gflops"] for r in rows[1:-1] if r["part"] not in ("gemm", "peak")}
    out.append(f"the probe ({run['gemm_probe']}) across the run: median {run['gemm_gflops']:.1f} GFLOP/s, "
               f"range {run['gemm_gflops_min']:.1f}-{run['gemm_gflops_max']:.1f} over {run['repeats']} "
               "calls; median beside each part: "
               + ", ".join(f"{part} {rate:.1f}" for part, rate in parts.items()))
    out += [f"{r['part']}, {r['path']}: {r['fraction_of_gemm']:.2f} of GEMM, {r['limit_note']}"
            for r in rows if r.get("limit_note")]
    return out


def markdown(rows: list[dict]) -> str:
    return tables.markdown([{column: row.get(column) for column in COLUMNS} for row in rows], MARKDOWN)
