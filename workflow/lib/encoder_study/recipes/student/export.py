"""The distilled student as an exported encoder: an ONNX graph, the teacher's tokenizer, a config, a manifest.

The graph has the shape of every other export (inputs `input_ids`, `attention_mask`: int64 [batch,
sequence], dynamic; output `last_hidden_state`; opset 17; TorchScript exporter; attention as
MatMul/Softmax; exact GELU as Erf), but its weights are named initializers, each linear weight stored
[in, out] (the layout MatMul reads), under these names (N = layer):

    model.embeddings.word_embeddings.weight              [vocab, embedding_width]
    model.embeddings.projection.{weight,bias}            [embedding_width, width], [width]
    model.embeddings.position_embeddings.weight          [max_positions, width], row 0 = first token
    model.embeddings.LayerNorm.{weight,bias}
    model.encoder.layer.N.attention.{query,key,value,output}.{weight,bias}   [width, width], [width]
    model.encoder.layer.N.attention.LayerNorm.{weight,bias}
    model.encoder.layer.N.intermediate.{weight,bias}      [width, intermediate], [intermediate]
    model.encoder.layer.N.output.{weight,bias}            [intermediate, width], [width]
    model.encoder.layer.N.output.LayerNorm.{weight,bias}

The export wrapper's parameters already are those [in, out] arrays and it computes `x @ W + b`, so
constant folding finds no Transpose to fold and every initializer keeps its module name (the plain
exporter would store anonymous `onnx::MatMul_N` tensors). The head count, which the weights cannot
tell, is `num_attention_heads` in model.config.json. The layout's names have one owner,
`trainable.postnorm` (`student_names`, `student_linear`, `is_student`): `trainable.load` reads the
layout back by them, `graph_names` below states them, and `writeback.module_weights_to_graph` writes
fine-tuned weights into it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ... import provenance
from ...core import files, machine
from ...encoders.families.student import MODEL_TYPE
from ...encoders.trainable.postnorm import PostNormEncoder, student_names
from ...onnx import checked_export, fusion, manifest
from . import StudentError
from .architecture import parameter_count

SOURCE = "student"
# The manifest's id of the graph module: stable across the package's rename (distill -> student), so
# that a student exported before and after it has the same manifest.
GRAPH_ID = "encoder_study.distill.export.StudentGraph"


# -- the export-only module -------------------------------------------------------------------------

def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().to(torch.float32).clone().contiguous(), requires_grad=False)


class _Linear(nn.Module):
    """`x @ weight + bias`, weight stored [in, out] so the MatMul reads the named parameter itself."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = _frozen(linear.weight.T)
        self.bias = _frozen(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + self.bias


class _Norm(nn.LayerNorm):
    def __init__(self, norm: nn.LayerNorm):
        super().__init__(norm.normalized_shape, eps=norm.eps)
        self.weight, self.bias = _frozen(norm.weight), _frozen(norm.bias)


class _Table(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = _frozen(weight)


class _Embeddings(nn.Module):
    def __init__(self, encoder: PostNormEncoder):
        super().__init__()
        self.word_embeddings = _Table(encoder.tokens.weight)
        self.projection = _Linear(encoder.projection)
        self.position_embeddings = _Table(encoder.positions)
        self.LayerNorm = _Norm(encoder.norm)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        tokens = self.projection(F.embedding(input_ids, self.word_embeddings.weight))
        positions = self.position_embeddings.weight[: input_ids.shape[1]]  # from row 0, as BERT
        return self.LayerNorm(tokens + positions)


class _Attention(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.heads, self.scale = layer.heads, layer.scale
        self.query, self.key, self.value = _Linear(layer.query), _Linear(layer.key), _Linear(layer.value)
        self.output = _Linear(layer.attn_out)
        self.LayerNorm = _Norm(layer.attn_norm)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, width = x.shape[0], x.shape[2]

        def split(t):  # [batch, seq, width] -> [batch, heads, seq, head_dim]
            return t.reshape(batch, -1, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        # Plain eager attention, as the TorchScript exporter needs; the trainable modules use SDPA's
        # kernel instead, so the two round differently within the export check's tolerance.
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        a = torch.matmul(scores.softmax(dim=-1), v).transpose(1, 2).reshape(batch, -1, width)
        return self.LayerNorm(x + self.output(a))


class _Output(_Linear):
    def __init__(self, linear: nn.Linear, norm: nn.LayerNorm):
        super().__init__(linear)
        self.LayerNorm = _Norm(norm)


class _Layer(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.attention = _Attention(layer)
        self.intermediate = _Linear(layer.ff_in)
        self.output = _Output(layer.ff_out, layer.ff_norm)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, allowed)
        h = self.output(F.gelu(self.intermediate(x)))  # exact GELU: Erf in the graph
        return self.output.LayerNorm(x + h)


class _Stack(nn.Module):
    def __init__(self, encoder: PostNormEncoder):
        super().__init__()
        self.layer = nn.ModuleList(_Layer(layer) for layer in encoder.layers)


class _Body(nn.Module):
    def __init__(self, encoder: PostNormEncoder):
        super().__init__()
        self.embeddings = _Embeddings(encoder)
        self.encoder = _Stack(encoder)


class StudentGraph(nn.Module):
    """`forward(input_ids, attention_mask) -> last_hidden_state` with the documented initializer names.

    Built from (a copy of) a student's weights; it computes what `PostNormEncoder.forward` computes.
    """

    def __init__(self, encoder: PostNormEncoder):
        super().__init__()
        check_student(encoder)
        self.model = _Body(encoder)
        self.eval()  # the exporter restores the module's mode; nothing here drops out, but keep it plain

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        allowed = attention_mask.bool()[:, None, None, :]
        x = self.model.embeddings(input_ids)
        for layer in self.model.encoder.layer:
            x = layer(x, allowed)
        return x


def check_student(encoder) -> None:
    """Refuse what the student layout cannot express (the graph would silently compute something else)."""
    s = getattr(encoder, "settings", None)
    if not isinstance(encoder, PostNormEncoder) or s is None or not s.embedding_width:
        raise StudentError("the student export takes a trainable.PostNormEncoder with a factorised token "
                           "table (settings.embedding_width); recipes.student.architecture.build "
                           "makes one")
    if s.position_offset != 0 or s.position_pad_id is not None:
        raise StudentError(f"the student's positions start at row 0 (got offset {s.position_offset}, pad id "
                           f"{s.position_pad_id}); the exported graph has no other position scheme")


# -- export ----------------------------------------------------------------------------------------

def model_config(encoder: PostNormEncoder, pad_token_id: int | None) -> dict:
    """model.config.json: Hugging Face-style keys the readers use (heads, width, positions, pad id)."""
    s = encoder.settings
    config = {
        "model_type": MODEL_TYPE, "hidden_size": s.width, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "intermediate_size": s.intermediate,
        "embedding_size": s.embedding_width, "max_position_embeddings": s.max_positions,
        "layer_norm_eps": s.eps, "vocab_size": s.vocab_size, "hidden_act": "gelu",
        "position_embedding_type": "absolute", "type_vocab_size": 0,
    }
    if pad_token_id is not None:
        config["pad_token_id"] = int(pad_token_id)
    return config


def _teacher(teacher_dir: Path) -> tuple[Path, dict, dict]:
    """(tokenizer path, teacher manifest or {}, teacher config or {}); an export directory is verified."""
    tokenizer = teacher_dir / manifest.TOKENIZER_FILE
    if not tokenizer.is_file():
        raise StudentError(f"{teacher_dir}: no {manifest.TOKENIZER_FILE}; give the teacher's export "
                           "directory")
    record = manifest.verified_model(teacher_dir) if (teacher_dir / manifest.MANIFEST).is_file() else {}
    config = {}
    for name in (manifest.CONFIG_FILE, "config.json"):
        if (teacher_dir / name).is_file():
            config = files.read_json(teacher_dir / name, "the teacher's model config (a JSON object)",
                                     "export the teacher again", kind=dict, error=StudentError)
            break
    return tokenizer, record, config


def _check_vocabulary(tokenizer_path: Path, encoder: PostNormEncoder) -> None:
    """The student's table must have a row for every piece of the teacher's tokenizer."""
    from tokenizers import Tokenizer

    pieces = Tokenizer.from_file(str(tokenizer_path)).get_vocab_size(with_added_tokens=True)
    rows = encoder.settings.vocab_size
    if pieces > rows:
        raise StudentError(f"{tokenizer_path}: {pieces} pieces, but the student's table has {rows} "
                           "rows; the student must have the teacher's whole vocabulary")


def _check_round_trip(encoder: PostNormEncoder, onnx_path: Path) -> None:
    """The graph must read back (by name, [in, out] transposed) as exactly the encoder's weights."""
    from ...encoders import trainable

    again = trainable.load(onnx_path, freeze_embeddings=False)
    theirs = dict(again.named_parameters())
    for name, param in encoder.named_parameters():
        if not torch.equal(param.detach().float(), theirs[name].detach()):
            raise StudentError(f"{onnx_path}: {name} does not read back from the graph as exported; "
                               "nothing was written")
    if again.settings_dict() != dict(encoder.settings_dict(), freeze_embeddings=False):
        raise StudentError(f"{onnx_path}: settings read back as {again.settings_dict()}, exported "
                           f"{encoder.settings_dict()}; nothing was written")


def export_student(encoder: PostNormEncoder, teacher_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                   name: str, distillation: dict, tolerance: float, threads: int, opset: int,
                   ort_optimization: str) -> dict:
    """Write out_dir/{model.onnx, tokenizer.json, model.config.json, export.json}; return the manifest.

    `teacher_dir`: the teacher's export (or model) directory; its tokenizer.json is copied unchanged,
    so the student's ids equal the teacher's for every text. `distillation`: what made the weights
    (e.g. the checkpoint's SHA-256, steps, data), recorded as given. The graph is checked by
    onnx.checker, by ONNX Runtime against `encoder` on a padded batch (max_abs / max(1, largest
    |value|) <= tolerance) and by reading its weights back; on any failure nothing reaches `out_dir`.
    """
    check_student(encoder)
    threads = machine.torch_threads(threads)
    tokenizer_path, teacher_record, teacher_config = _teacher(Path(teacher_dir))
    _check_vocabulary(tokenizer_path, encoder)
    pad = teacher_config.get("pad_token_id")
    batch = checked_export.check_batch(tokenizer_path, encoder.settings.max_positions,
                                       int(pad) if pad is not None else 0, error=StudentError)
    with files.staging_dir(out_dir) as stage:
        onnx_path = stage / manifest.ONNX_FILE
        checked_export.trace(StudentGraph(encoder), batch, onnx_path, opset)
        check = checked_export.check(
            onnx_path, batch, checked_export.pytorch_output(encoder, batch), threads=threads,
            optimization=ort_optimization, tolerance=tolerance, what=f"student '{name}'", error=StudentError)
        files.write_json(stage / manifest.CONFIG_FILE, model_config(encoder, pad))  # the round trip reads it
        _check_round_trip(encoder, onnx_path)
        shutil.copyfile(tokenizer_path, stage / manifest.TOKENIZER_FILE)
        teacher = {"model": teacher_record.get("model"), "files": teacher_record.get("files"),
                   "tokenizer_sha256": files.sha256_file(tokenizer_path)}
        record = _record(encoder, name, teacher, distillation, opset, {**check, "weights_read_back": "equal"})
        return checked_export.publish(stage, out_dir, record)


def _record(encoder: PostNormEncoder, name: str, teacher: dict, distillation: dict, opset: int,
            check: dict) -> dict:
    """The student's export.json, less its file list."""
    s, counts = encoder.settings, parameter_count(encoder)
    return {
        "model": name,
        "source": SOURCE,
        "teacher": teacher,
        "distillation": distillation,
        "libraries": provenance.library_versions(["torch", "tokenizers", "onnx", "onnxruntime"]),
        "exporter": checked_export.exporter_record(
            opset, checked_export.HIDDEN_SHAPES, module=GRAPH_ID,
            weights="named initializers, linear weights stored [in, out]"),
        "architecture": {
            "model_type": MODEL_TYPE, "width": s.width, "layers": s.layers, "heads": s.heads,
            "intermediate": s.intermediate, "embedding_width": s.embedding_width,
            "max_positions": s.max_positions, "eps": s.eps, "vocab_size": s.vocab_size,
            "parameters": counts["total"], "vocabulary_parameters": counts["vocabulary"],
        },
        "check": check,
        "graph": fusion.PUBLISHED,
    }


def graph_names(layers: int, prefix: str = "model.") -> dict[str, str]:
    """Our parameter name -> the exported initializer's name (the scheme above)."""
    return {ours: prefix + theirs for ours, theirs in student_names(layers).items()}


def export_stage(student: str | os.PathLike, teacher_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                 name: str, tolerance: float, threads: int, opset: int, ort_optimization: str
                 ) -> provenance.Done:
    """`student export`: the distilled student (a `distill` output) exported beside its teacher's files
    (`export_student`), and what the fragment records: the files and the export check."""
    from . import distill

    encoder, saved = distill.load_student(student)
    record = export_student(
        encoder, teacher_dir, out_dir, name=name, tolerance=tolerance, threads=threads, opset=opset,
        ort_optimization=ort_optimization,
        distillation={"student": Path(student).name, "sha256": files.sha256_file(student),
                      "teacher": saved.get("teacher"), "steps": saved.get("steps")})
    check = record["check"]
    return provenance.Done(
        inputs=[student, *(Path(teacher_dir) / n for n in manifest.EXPORT_FILES)],
        outputs=[Path(out_dir) / n for n in manifest.EXPORT_FILES],
        notes=[f"export check, ONNX Runtime against PyTorch on a padded batch of lengths {check['lengths']}: "
               f"max abs {check['max_abs']:.3g}, largest value {check['max_value']:.3g} "
               f"({check['criterion']}, tolerance {check['tolerance']})"])
