"""One fine-tuning step, timed in parts: our trainable modules against Hugging Face's own model.

Both implementations get the same weights (ours are read from the exported graph, which was exported
from the Hugging Face model in the source directory), the same batch (24 sequences of 32 random
pieces by default, no padding), the same tagging head (a seeded linear layer to 17 tags with random
gold tags) and the same AdamW settings, with the token table frozen in both. A step is timed as

    forward    encoder + head + cross-entropy
    backward   loss.backward()
    clip       clip_grad_norm_(max norm 1.0)
    optimizer  AdamW step

and each part's median over `steps` steps after `warmup` untimed ones is reported (total: the median
of the steps' totals). The two implementations take turns step by step, so that a change in the load
of a shared machine falls on both alike. Hugging Face's model runs in eval mode, so that dropout is
off and both compute the same function (ours has no dropout); gradients do not depend on the mode.
`max_abs` is the largest difference of the two forward passes' hidden states on the batch: it shows
that both ran the same computation. Timings are indicative: they depend on the machine and its load.

On `device="cuda"` both models, the head, the batch and AdamW's state are on the GPU, and each part
is timed between `torch.cuda.synchronize()` calls, so that it counts the GPU's work and not only the
launches.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ... import provenance
from ...core import tables
from ...core.errors import UserError
from ...data.conllu import UPOS
from ...encoders import perf, reference, trainable
from ...onnx import manifest

COLUMNS = ["model", "implementation", "forward_s", "backward_s", "clip_s", "optimizer_s", "total_s",
           "parameters", "batch", "length", "steps", "threads", "max_abs", "device", "total_s_min",
           "total_s_max", "total_s_q1", "total_s_q3", "seconds", "gflop", "gflops", "gemm_gflops",
           "fraction_of_gemm", "forward_fraction_of_gemm", "gemm_gflops_min", "gemm_gflops_max", "gemm_probe",
           "peak_gflops", "limit_note"]
PARTS = ("forward_s", "backward_s", "clip_s", "optimizer_s")
IMPLEMENTATIONS = ("encoder_study", "transformers")


class StepTimeError(UserError):
    pass


def _batch(vocab: int, pad_id: int, batch: int, length: int, seed: int):
    """Random piece ids (never the pad id, which RoBERTa-style positions treat specially), a full mask,
    and random gold tags."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, length), dtype=np.int64)
    ids[ids == pad_id] = (pad_id + 1) % vocab
    gold = rng.integers(0, len(UPOS), size=(batch * length,), dtype=np.int64)
    return torch.from_numpy(ids), torch.ones(batch, length, dtype=torch.int64), torch.from_numpy(gold)


def _head(width: int, seed: int) -> torch.nn.Linear:
    head = torch.nn.Linear(width, len(UPOS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, 0.02, generator=generator)
        head.bias.zero_()
    return head


class Stepper:
    """One implementation's encoder, head and AdamW; `step()` takes one timed step."""

    def __init__(self, encoder: torch.nn.Module, head: torch.nn.Linear, lr: float, weight_decay: float,
                 clip: float, device: str = "cpu"):
        self.encoder, self.head, self.clip = encoder.to(device), head.to(device), clip
        # CUDA runs asynchronously: wait for the GPU before reading each clock.
        self.sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
        self.params = [p for p in [*encoder.parameters(), *head.parameters()] if p.requires_grad]
        # Ours clip and step as fine-tuning does (trainable's clip_gradients and fused AdamW); Hugging
        # Face's model with torch's defaults, as its users would.
        ours = isinstance(encoder, trainable.Encoder)
        self.clip_gradients = trainable.clip_gradients if ours else torch.nn.utils.clip_grad_norm_
        self.optimizer = (trainable.adamw(self.params, lr, weight_decay) if ours
                          else torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay))

    def step(self, ids, mask, gold) -> tuple[float, float, float, float]:
        """Seconds of (forward, backward, clip, optimizer)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.sync()
        t0 = time.perf_counter()
        hidden = self.encoder(ids, mask)
        loss = F.cross_entropy(self.head(hidden).reshape(-1, len(UPOS)), gold)
        self.sync()
        t1 = time.perf_counter()
        loss.backward()
        self.sync()
        t2 = time.perf_counter()
        self.clip_gradients(self.params, self.clip)
        self.sync()
        t3 = time.perf_counter()
        self.optimizer.step()
        self.sync()
        t4 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3

    def parameters_trained(self) -> int:
        """Values that got a gradient (after a step)."""
        return sum(p.numel() for p in self.params if p.grad is not None)


def time_steps(steppers: list[Stepper], ids, mask, gold, warmup: int, steps: int,
               min_seconds: float, probe: perf.Probe | None = None) -> tuple[list[dict], perf.Limit | None]:
    """Each part's median seconds per stepper, over at least `steps` steps and `min_seconds` of steps
    each after `warmup` untimed ones, the steppers taking turns; the total's spread beside it. With a
    `probe`, it takes its turn in every round, and the limit beside the steps comes back too."""
    parts: list[list[tuple[float, ...]]] = [[] for _ in steppers]

    def call(k: int):
        return lambda: parts[k].append(steppers[k].step(ids, mask, gold))

    times = perf.measure({str(k): call(k) for k in range(len(steppers))}, min_seconds, min_repeats=steps,
                         warmup=warmup, probe=probe)
    rows = []
    for per, stepper in zip(parts, steppers, strict=True):
        per = per[warmup:]
        total = perf.Spread.of([sum(p) for p in per])
        rows.append({**{name: statistics.median(p[j] for p in per) for j, name in enumerate(PARTS)},
                     "total_s": total.median, "total_s_min": total.min, "total_s_max": total.max,
                     "total_s_q1": total.q1, "total_s_q3": total.q3, "steps": total.repeats,
                     "seconds": total.seconds, "parameters": stepper.parameters_trained()})
    return rows, probe.limit(times) if probe else None


def step_time(model_dir: str | os.PathLike, source_json: str | os.PathLike, batch: int, length: int,
              warmup: int, steps: int, lr: float, seed: int, min_seconds: float,
              weight_decay: float = 0.01, clip: float = 1.0, device: str = "cpu",
              probe: perf.Probe | None = None) -> list[dict]:
    """Rows (COLUMNS) for both implementations of one exported model; torch's thread count as set.

    `device`: "cpu" or "cuda" (resolved; `trainable.harness.resolve_device` resolves "auto"). `probe`: the
    GEMM probe at torch's threads (`perf.Probe`), made here if None (CPU only)."""
    if steps < 1 or warmup < 0 or batch < 1 or length < 1:
        raise StepTimeError("steps, batch and length must be positive and warmup 0 or more")
    model_dir = Path(model_dir)
    record = manifest.verified_model(model_dir)
    source_dir, source = reference.source_dir(source_json)
    if source.get("tree_sha256") != record.get("source_tree_sha256"):
        raise StepTimeError(f"{source_json} describes another source than {model_dir / manifest.MANIFEST} "
                            "was exported from; give the source of this export, or re-export the model")
    ours = trainable.load(model_dir)  # token table frozen, as in fine-tuning
    theirs = reference.HiddenStates(reference.load_pytorch(source_dir)).eval()  # no dropout
    theirs.model.get_input_embeddings().weight.requires_grad_(False)
    pad = theirs.model.config.pad_token_id
    ids, mask, gold = _batch(ours.tokens.weight.shape[0], 0 if pad is None else int(pad), batch, length, seed)
    ours, theirs = ours.to(device), theirs.to(device)
    ids, mask, gold = ids.to(device), mask.to(device), gold.to(device)
    with torch.no_grad():
        max_abs = float((ours(ids, mask) - theirs(ids, mask)).abs().max())
    width = ours.tokens.weight.shape[1]
    steppers = [Stepper(encoder, _head(width, seed), lr, weight_decay, clip, device)
                for encoder in (ours, theirs)]
    # The limit: the CPU's matrix-multiply rate at torch's threads, the probe taking turns with the steps
    # (on CUDA there is no CPU limit to read a GPU step against: fraction_of_gemm is then left empty).
    if device == "cpu":
        probe = probe or perf.Probe.beside(torch.get_num_threads(), min_seconds)
    else:
        probe = None
    shape = perf.Shape.from_config(theirs.model.config.to_dict())
    flops = perf.step_flops(shape, [length] * batch)
    forward_flops = perf.encoder_flops(shape, [length] * batch)
    timings, limit = time_steps(steppers, ids, mask, gold, warmup, steps, min_seconds, probe)
    rows = []
    for name, timing in zip(IMPLEMENTATIONS, timings, strict=True):
        row = {"model": record.get("model", model_dir.name), "implementation": name, **timing, "batch": batch,
               "length": length, "threads": torch.get_num_threads(), "max_abs": max_abs, "device": device,
               "gflop": flops / 1e9, "gflops": flops / timing["total_s"] / 1e9, "gemm_gflops": None,
               "fraction_of_gemm": None, "forward_fraction_of_gemm": None}
        if limit:
            forward = perf.rates(forward_flops, timing["forward_s"], limit.gflops)
            row.update(**limit.rates(flops, timing["total_s"]), **limit.columns(),
                       forward_fraction_of_gemm=forward["fraction_of_gemm"])
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    def fraction(value) -> str:
        return "" if value in (None, "") else f"{float(value):.2f}"

    return tables.markdown_table(
        ["model", "implementation", "forward", "backward", "clip", "optimizer", "total", "total min-max",
         "steps", "parameters", "GFLOP/s", "of GEMM", "forward of GEMM"],
        [(r["model"], r["implementation"], *(f"{float(r[k]):.4f} s" for k in COLUMNS[2:7]),
          f"{float(r['total_s_min']):.4f}-{float(r['total_s_max']):.4f} s", int(r["steps"]),
          f"{int(r['parameters']):,}", f"{float(r['gflops']):.3g}", fraction(r["fraction_of_gemm"]),
          fraction(r["forward_fraction_of_gemm"])) for r in rows], "llrrrrrrrrrrr")


def table(models: list[tuple[str, str]], out: str | os.PathLike, *, batch: int, length: int, warmup: int,
          steps: int, lr: float, seed: int, min_seconds: float, threads: int, device: str) -> provenance.Done:
    """`step_time` for each (model directory, source JSON) in turn, one GEMM probe beside them all (on
    the CPU), written to `out` (CSV, floats as repr, fixed columns) and its Markdown beside it."""
    from ...core import files, machine

    out = Path(out)
    done = provenance.Done(outputs=[out, out.with_suffix(".md")])
    rows, before = [], machine.load_average()
    # One GEMM probe for every model's steps (the same threads): one calibration. None on a GPU.
    probe = perf.Probe.beside(threads, min_seconds) if device == "cpu" else None
    for model_dir, source in models:
        done.inputs += [source, *(Path(model_dir) / n for n in (manifest.ONNX_FILE, manifest.MANIFEST))]
        rows += step_time(model_dir, source, batch=batch, length=length, warmup=warmup, steps=steps, lr=lr,
                          seed=seed, min_seconds=min_seconds, device=device, probe=probe)
    files.write_text(out, tables.csv_text(rows, COLUMNS))
    files.write_text(out.with_suffix(".md"), markdown(rows))
    done.table("Fine-tuning step", markdown(rows))
    done.note(f"medians of at least {steps} steps and {min_seconds:g} s of steps per implementation (the "
              f"two taking turns) after {warmup} warm-up step(s); batch {batch} x {length} pieces; AdamW lr "
              f"{lr}; token table frozen in both; load average before: {before}, after: "
              f"{machine.load_average()}; indicative timings")
    done.notes += probe.notes() if probe else []
    return done
