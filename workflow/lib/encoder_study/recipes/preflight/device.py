"""The device check: the first minutes of a GPU booking. One fine-tuning step of each fine-tuned
tagging run's model and one distillation step, at the study's batch sizes and lengths, through the
training code itself (`tagging.runs.build_tagger` and `tagging.train.train`, `student.distill.distill`:
the harness's device choice and deterministic settings, not copies), on the device the config names;
each with its time and device-memory peak; with several processes (torchrun) one all-reduce over the
process group (NCCL on CUDA, gloo on the CPU). On a CPU machine the same steps run on the CPU, and the
table says so.

Not checked: the student's own fine-tune (`model: student` runs), whose model exists only after the
distillation; its step is the smaller student's. The batches come from the treebank's train split (the
fine-tunes' words per batch are the run's; how many pieces they make is the treebank's), the
distillation's documents from the same sentences (its windows are the config's lengths, whatever the
text).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ...core import files, machine
from ...core.tables import markdown_table
from ...data.conllu import read_conllu
from ...encoders.trainable import harness
from ..student import StudentError, distill
from ..student.data import Document
from ..tagging import runs as tagging_runs
from ..tagging.train import TrainSettings, settled, train

COLUMNS = ("rule", "step", "device", "seconds", "device_peak_mb", "host_peak_mb", "detail")
DEV_SENTENCES = 8  # the fine-tune scores dev once after its step: a few sentences suffice


def _reset(device: torch.device) -> None:
    machine.reset_peak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peaks(device: torch.device) -> tuple[str, int]:
    """(the device's memory peak in MB, or "n/a (CPU)"; the host's resident peak in MB) since `_reset`."""
    host = round(machine.peak_resident_kib() * 1024 / 1e6)
    if device.type != "cuda":
        return "n/a (CPU)", host
    torch.cuda.synchronize(device)
    return str(round(torch.cuda.max_memory_allocated(device) / 1e6)), host


def _row(rule: str, step: str, device: torch.device, started: float, detail: str) -> dict:
    device_peak, host_peak = _peaks(device)
    return {"rule": rule, "step": step, "device": harness.describe_device(device),
            "seconds": round(time.perf_counter() - started, 2), "device_peak_mb": device_peak,
            "host_peak_mb": host_peak, "detail": detail}


def distillation_step(teacher_dir: str | os.PathLike, texts: Sequence[str], student: Mapping,
                      training: Mapping, device: str, precision: str, scratch: Path) -> tuple[dict, dict]:
    """One distillation step at the config's batch and lengths (statistics over one batch only); the
    settings it ran with, and its log row."""
    one = {**training, "steps": 1, "chunk_steps": 0, "log_every": 1, "warmup": 0,
           "stats_windows": min(int(training.get("stats_windows", 64)),
                                int(training.get("batch_windows", 16)))}
    rows = distill.distill(teacher_dir, [Document("eng", t) for t in texts], student, one,
                           scratch / "distill.pt", scratch / "student.pt", amounts=None, device=device,
                           progress=False, precision=precision)
    return one, rows[-1]


def tagging_step(run: Mapping, sentences, seed: int, threads: int, device: torch.device) -> dict:
    """One fine-tuning step of a run at its own settings (batch words, length, precision)."""
    settings = TrainSettings(
        mode="finetuned", optimizer=run["optimizer"], seed=seed, lr=float(run["lr"]),
        weight_decay=float(run["weight_decay"]), epochs=0, max_steps=1, warmup=0,
        batch_words=int(run["batch_words"]), eval_every=1, eval_batch_words=int(run["eval_batch_words"]),
        clip=float(run["clip"]), patience=0, threads=threads, device=device.type, precision=run["precision"])
    options = tagging_runs.EncoderOptions(max_length=int(run["max_length"]),
                                          window_batch=int(run["window_batch"]),
                                          max_batch_pieces=int(run["max_batch_pieces"]),
                                          freeze_embeddings=not run.get("train_embeddings", False))
    with settled(settings):
        tagger = tagging_runs.build_tagger(run["model_dir"], "finetuned", run["pooling"], seed, options,
                                           threads)
        result = train(tagger, sentences, sentences[:DEV_SENTENCES], settings, desc=run["name"])
    return {"loss": result.history[-1]["train_loss"] if result.history else float("nan"),
            "batch_words": settings.batch_words, "max_length": options.max_length,
            "max_batch_pieces": options.max_batch_pieces, "precision": settings.precision}


def all_reduce(device: torch.device) -> str:
    """One all-reduce (SUM) of each rank's rank + 1 over the process group; what it found."""
    import torch.distributed as dist

    world = dist.get_world_size()
    value = torch.tensor([dist.get_rank() + 1.0], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    if value.item() != expected:
        raise StudentError(f"all-reduce over {world} processes ({dist.get_backend()}) gave "
                                   f"{value.item()}, expected {expected}")
    return f"{world} processes, backend {dist.get_backend()}: sum {value.item():g} as expected"


def device_check(runs: Sequence[Mapping], teacher_dir: str | os.PathLike, treebank: str | os.PathLike,
                 student: Mapping, training: Mapping, *, device: str, precision: str, seed: int,
                 threads: int) -> dict | None:
    """The steps, in order: the distillation (every rank of a torchrun launch takes part), the all-reduce
    (several processes), then rank 0 alone the fine-tunes. The table's rows; None on other ranks."""
    chosen = harness.resolve_device(device, distill.local_rank())  # before anything starts CUDA
    sentences = read_conllu(treebank)
    training = {**training, "threads": threads}  # as `student distill` runs it
    texts = [s.text for s in sentences]
    rows = []
    with tempfile.TemporaryDirectory(prefix="preflight-device-") as scratch:
        _reset(chosen)
        started = time.perf_counter()
        one, logged = distillation_step(teacher_dir, texts, student, training, device, precision,
                                        Path(scratch))
        rows.append(_row("student_distill", "one distillation step", chosen, started,
                         f"{one['batch_windows']} windows of {max(one['window_lengths'])} pieces at most, "
                         f"{precision}, loss {logged['loss']:.4g}"))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _reset(chosen)
        started = time.perf_counter()
        rows.append(_row("student_distill", "one all-reduce", chosen, started, all_reduce(chosen)))
        if dist.get_rank() != 0:
            return None
    for run in runs:
        _reset(chosen)
        started = time.perf_counter()
        done = tagging_step(run, sentences, seed, threads, chosen)
        rows.append(_row("tagging_train", f"one fine-tuning step of {run['name']} ({run['model']})", chosen,
                         started, f"{done['batch_words']} words a batch, windows of {done['max_length']}, at "
                         f"most {done['max_batch_pieces']} pieces a forward batch, {done['precision']}, "
                         f"loss {done['loss']:.4g}"))
    return {"device": harness.describe_device(chosen), "cpu_only": chosen.type != "cuda", "rows": rows,
            "deterministic": "harness.deterministic: fixed threads, deterministic algorithms"
                             + (" (strict), no TF32, cuDNN deterministic" if chosen.type == "cuda" else "")}


def write(result: Mapping, json_path: str | os.PathLike, markdown_path: str | os.PathLike) -> str:
    """The table as JSON and Markdown; the Markdown's text."""
    said = (f"On {result['device']}" + (": a CPU machine, so every step ran on the CPU (no GPU memory to "
                                         "measure; the host's resident peak instead)" if result["cpu_only"]
                                         else "") + f". {result['deterministic']}.")
    text = "# Device check\n\n" + said + "\n\n" + markdown_table(
        list(COLUMNS), [[row[c] for c in COLUMNS] for row in result["rows"]], "lllrrrl")
    files.write_json(json_path, dict(result))
    files.write_text(markdown_path, text)
    return text
