"""The saved pipeline: a tagger's settings and weights in one safetensors file, the encoder referenced.

    save(tagger, "results/tagging/run/pipeline.safetensors", training={...})
    tagger = load("results/tagging/run/pipeline.safetensors")                    # the recorded model dir
    tagger = load("pipeline.safetensors", model_dir="results/models/minilm")     # or one given here

Kinds (as in the seed's table):

| kind | encoder | weights in the file |
|---|---|---|
| `transformer` | `FrozenEncoder` (ONNX Runtime, frozen) | the head only |
| `transformer-trainable` | `TrainableEncoder` (fine-tuned) | the head and the layers, not the frozen table |

Both reference the exported model's files (model.onnx, tokenizer.json, model.config.json) by plain
file name and SHA-256. The directory they are read from is the one given to `load`, else the one
recorded at save time as a path relative to the pipeline file's own directory (so a results tree
moved as a whole still loads). Loading hashes each referenced file and refuses a mismatch, naming the
file and both SHA-256. The trainable kind reads the token table from model.onnx again, which is why
the graph must still be the one it was trained on.

Why safetensors (pinned 0.8.0) and not torch.save: loading it runs no code (a pickle can), and its
bytes are a function of the content alone: a JSON header listing the tensors in sorted order, then
their raw little-endian data. torch.save writes a zip of pickles whose bytes depend on how Python
pickles and on storage bookkeeping, so equal weights need not give equal files. The settings are one
JSON string (sorted keys) under the single metadata key `encoder_study.pipeline`; one key, because
the header's metadata is a map whose order the library does not promise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .. import files
from ..frozen import FrozenEncoder
from ..trainable.words import TrainableEncoder
from .tagger import KINDS, MODEL_FILES, Tagger

FORMAT = "encoder_study.tagging.pipeline/1"
METADATA_KEY = "encoder_study.pipeline"
FILE_NAME = "pipeline.safetensors"
HEAD = "head."
ENCODER = "encoder/"  # prefix of the fine-tuned layers' tensors


class PipelineError(RuntimeError):
    """A pipeline file cannot be read or used; the message names the file and what to do."""


def _split_tensors(value, path: str, tensors: dict):
    """`value` with each tensor replaced by {"tensor": name}; the tensors go to `tensors` by name.

    Lets any JSON-ready checkpoint with tensors in it (the trainable encoder's) live in a safetensors
    file, whatever its nesting, without knowing its layout.
    """
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().contiguous().clone()
        return {"tensor": path}
    if isinstance(value, dict):
        return {str(k): _split_tensors(v, f"{path}/{k}", tensors) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_split_tensors(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    return value


def _join_tensors(value, tensors: dict):
    if isinstance(value, dict):
        if set(value) == {"tensor"} and isinstance(value["tensor"], str):
            return tensors[value["tensor"]]
        return {k: _join_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_join_tensors(v, tensors) for v in value]
    return value


def describe(tagger: Tagger, model_dir_relative: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(settings, tensors) of a pipeline file for `tagger`."""
    encoder = tagger.encoder
    tensors = {HEAD + name: t.detach().contiguous().clone() for name, t in tagger.head.state_dict().items()}
    reference = {"model": encoder.manifest.get("model"), "files": tagger.encoder_files(),
                 "model_dir": model_dir_relative}
    if tagger.trainable_encoder:
        checkpoint = _split_tensors(encoder.checkpoint(), ENCODER.rstrip("/"), tensors)
        settings = {"checkpoint": checkpoint, "max_batch_pieces": encoder.max_batch_pieces}
    else:
        settings = {"pooling": encoder.pooling, "max_length": encoder.max_length_requested,
                    "batch_size": encoder.batch_size, "optimization": encoder.optimization}
    return {"format": FORMAT, "kind": tagger.kind, "tags": list(tagger.tags), "width": encoder.width,
            "pooling": encoder.pooling, "encoder": {**reference, "settings": settings}}, tensors


def save(tagger: Tagger, path: str | os.PathLike, training: dict | None = None) -> Path:
    """Write the pipeline atomically; `training` (JSON-ready) is kept in the settings for provenance.

    Equal weights and settings give equal bytes.
    """
    from safetensors.torch import save as to_bytes

    path = Path(path)
    relative = Path(os.path.relpath(Path(tagger.encoder.model_dir).resolve(), path.resolve().parent))
    settings, tensors = describe(tagger, relative.as_posix())
    if training is not None:
        settings["training"] = training
    text = json.dumps(settings, sort_keys=True, ensure_ascii=False)
    data = to_bytes(tensors, metadata={METADATA_KEY: text})
    with files.atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def read(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(settings, tensors) of a pipeline file, without loading an encoder."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 -- not a dict
    except (OSError, SafetensorError) as err:
        raise PipelineError(f"{path}: cannot read the pipeline file ({err}); it is missing or not a "
                            "safetensors file written by encoder_study.tagging.pipeline") from err
    try:
        settings = json.loads(metadata[METADATA_KEY])
    except (KeyError, json.JSONDecodeError) as err:
        raise PipelineError(f"{path}: a safetensors file without pipeline settings (metadata key "
                            f"{METADATA_KEY!r}); not written by encoder_study.tagging.pipeline") from err
    if settings.get("format") != FORMAT or settings.get("kind") not in KINDS:
        raise PipelineError(f"{path}: format {settings.get('format')!r}, kind {settings.get('kind')!r}; this "
                            f"code reads {FORMAT!r} with kinds {list(KINDS)}")
    return settings, tensors


def check_files(path: Path, model_dir: Path, expected: dict[str, str]) -> None:
    """Hash each referenced file; files.IntegrityError names a changed one and both SHA-256."""
    for name in MODEL_FILES:
        if name not in expected:
            raise PipelineError(f"{path}: does not reference {name}; it was written by other code")
        files.check_file(model_dir / name, expected[name], what=f"encoder file (referenced by {path})")


def load(path: str | os.PathLike, model_dir: str | os.PathLike | None = None, threads: int = 1) -> Tagger:
    """The tagger a pipeline file holds, over the encoder files it references (checked by SHA-256)."""
    path = Path(path)
    settings, tensors = read(path)
    reference = settings["encoder"]
    model_dir = Path(model_dir) if model_dir is not None else path.parent / reference["model_dir"]
    if not model_dir.is_dir():
        raise PipelineError(f"{path}: the model directory {model_dir} does not exist; give the exported "
                            f"model {reference['model']!r} it references with model_dir=")
    check_files(path, model_dir, reference["files"])
    encoder_settings = reference["settings"]
    if settings["kind"] == "transformer":
        encoder = FrozenEncoder(model_dir, pooling=encoder_settings["pooling"],
                                max_length=encoder_settings["max_length"],
                                batch_size=encoder_settings["batch_size"], threads=threads,
                                optimization=encoder_settings["optimization"])
    else:
        checkpoint = _join_tensors(encoder_settings["checkpoint"], tensors)
        encoder = TrainableEncoder.restore(model_dir, checkpoint, threads=threads)
    tagger = Tagger(encoder, tags=settings["tags"])
    head = {name[len(HEAD):]: t for name, t in tensors.items() if name.startswith(HEAD)}
    tagger.head.load_state_dict(head, strict=True)
    return tagger.eval()


def training_summary(path: str | os.PathLike) -> dict | None:
    """The `training` record saved with the pipeline, if any."""
    return read(path)[0].get("training")
