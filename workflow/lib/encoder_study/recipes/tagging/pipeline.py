"""The saved pipeline: a tagger's settings and weights in one safetensors file, the encoder referenced.

    save(tagger, "results/tagging/run/pipeline.safetensors", training={...})   # weights inline
    tagger = load("results/tagging/run/pipeline.safetensors")                    # the recorded model dir
    tagger = load("pipeline.safetensors", model_dir="results/models/minilm")     # or one given here
    tagger = load("results/writeback/run/pipeline.safetensors")                  # + pipeline.encoder0.onnx

What a file holds, by kind and format:

| kind | format | encoder on load | weights in the file |
|---|---|---|---|
| `transformer` | /1 | `FrozenEncoder` on the export's model.onnx | the head only |
| `transformer` | /2 | `FrozenEncoder` on `<stem>.encoder0.onnx` beside the file | the head only |
| `transformer` | /3 | `graph.GraphTagger`: the whole tagger is `<stem>.encoder0.onnx` | none |
| `transformer-trainable` | /1 | `TrainableEncoder` (trains on) | the head, the layers (no frozen table) |

`save` keeps a fine-tuned encoder's weights inside the file (format /1), which loads as a trainable
encoder again. The writeback recipe (`encoder_study.recipes.writeback.save_with_graph`) writes them instead
into a copy of the graph they were read from, `<stem>.encoder0.onnx` beside the pipeline file (stem:
the file name without its suffix), through `save_pair`, with the word pooling, the head's weights and
the tags appended to it (`tagging.graph`); the pipeline file (format /3) refers to it by that plain
file name and its SHA-256. It loads as one ONNX Runtime session from piece ids to tags, with the
pooling and max length the run used, several times faster than the trainable modules, and no longer
trains. Format /2 (the encoder alone in the graph, the head in the file, run as a frozen encoder) is
what the recipe wrote before; such files still load. The two files travel together: a missing or
changed graph is refused, naming both files, and `save` of a tagger loaded from a /2 or /3 file
copies its graph. Files without a written graph stay format /1, so code that predates /2 still reads
them and refuses the files it could not run correctly.

Every file references the exported model's files (model.onnx, tokenizer.json, model.config.json) by
plain file name and SHA-256. The directory they are read from is the one given to `load`, else the one
recorded at save time as a path relative to the pipeline file's own directory (so a results tree
moved as a whole still loads). Loading hashes each referenced file and refuses a mismatch, naming the
file and both SHA-256. The trainable kind reads the token table from model.onnx again, which is why
the graph must still be the one it was trained on.

Why safetensors (pinned 0.8.0) and not torch.save: loading it runs no code (a pickle can), and its
bytes are a function of the content alone: a JSON header listing the tensors in sorted order, then
their raw little-endian data. torch.save writes a zip of pickles whose bytes depend on how Python
pickles and on storage bookkeeping, so equal weights need not give equal files. The settings are one
JSON string (sorted keys) under the single metadata key `encoder_study.pipeline`; one key, because
the header's metadata is a map whose order the library does not promise. The written graph is a
function of the weights too (the patcher copies every other byte), so equal weights give equal bytes
in both files.

The file checks itself: the settings carry, under `artefacts.KEY`, the SHA-256 of the file's content
(the settings without it, as a reader parses them, and every tensor by name), and `read` refuses a
file whose content does not match it, naming the file and the command that rebuilds it. A file
written before pipeline files carried one is read unchecked, if its settings hold only the keys that
writer wrote (so a damaged key name does not pass for an old file).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core import files
from ...core.errors import UserError
from ...data.tasks import DEFAULT as DEFAULT_TASK
from ...encoders.frozen import FrozenEncoder
from ...encoders.trainable.words import TrainableEncoder
from ...onnx import manifest
from ...provenance import artefacts
from .graph import GraphTagger
from .tagger import KINDS, Tagger

FORMAT = "encoder_study.tagging.pipeline/1"  # weights inline, or the export's own graph
GRAPH_FORMAT = "encoder_study.tagging.pipeline/2"  # the encoder is a written graph beside the file
TAGGER_FORMAT = "encoder_study.tagging.pipeline/3"  # the whole tagger is a written graph beside the file
FORMATS = (FORMAT, GRAPH_FORMAT, TAGGER_FORMAT)
WRITTEN = (GRAPH_FORMAT, TAGGER_FORMAT)  # the formats with a graph beside the file
GRAPH_SUFFIX = ".encoder0.onnx"  # one encoder per tagger: always number 0
GRAPH_WINDOW_BATCH = 8  # windows per ONNX Runtime call for a written graph (the frozen runs' default)
METADATA_KEY = "encoder_study.pipeline"
FILE_NAME = "pipeline.safetensors"
HEAD = "head."
ENCODER = "encoder/"  # prefix of the fine-tuned layers' tensors
# The settings of a file written before files carried their SHA-256.
UNSEALED_KEYS = {"format", "kind", "tags", "width", "pooling", "encoder", "training"}


class PipelineError(UserError):
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


def graph_name(path: str | os.PathLike) -> str:
    """The written graph's name for a pipeline file: `pipeline.safetensors` -> `pipeline.encoder0.onnx`."""
    return Path(path).stem + GRAPH_SUFFIX


def _written_graph(tagger) -> Path | None:
    """The written graph a loaded /2 or /3 file runs (for /2: a frozen encoder's graph when it is not its
    export's own model.onnx)."""
    if isinstance(tagger, GraphTagger):
        return tagger.graph
    encoder = tagger.encoder
    if isinstance(encoder, FrozenEncoder) and encoder.graph != encoder.model_dir / manifest.ONNX_FILE:
        return encoder.graph
    return None


def describe_tagger_graph(tagger, model_dir_relative: str, graph: dict
                          ) -> tuple[dict, dict[str, torch.Tensor]]:
    """(settings, no tensors) of a /3 file whose graph ({file, sha256, bytes}) holds the whole tagger:
    for a fine-tuned `Tagger` being written, or a loaded `GraphTagger` being copied."""
    encoder = tagger.encoder
    copied = isinstance(tagger, GraphTagger)
    # What the graph needs to give the words the run gave: the same pooling (also in the graph), the
    # same windows; then how it is run.
    settings = {"pooling": encoder.pooling, "max_length": encoder.max_length_requested,
                "batch_size": encoder.batch_size if copied else GRAPH_WINDOW_BATCH,
                "optimization": tagger.optimization if copied else "all"}
    reference = {"model": encoder.manifest.get("model"), "files": tagger.encoder_files(),
                 "model_dir": model_dir_relative, "graph": graph}
    return {"format": TAGGER_FORMAT, "kind": "transformer", **_task(tagger), "tags": list(tagger.tags),
            "width": encoder.width, "pooling": encoder.pooling,
            "encoder": {**reference, "settings": settings}}, {}


def describe(tagger: Tagger, model_dir_relative: str, graph: dict | None = None
             ) -> tuple[dict, dict[str, torch.Tensor]]:
    """(settings, tensors) of a pipeline file for `tagger`; with `graph` ({file, sha256, bytes} of a
    written graph) the encoder is that graph, whatever kind it was."""
    encoder = tagger.encoder
    tensors = {HEAD + name: t.detach().contiguous().clone() for name, t in tagger.head.state_dict().items()}
    reference = {"model": encoder.manifest.get("model"), "files": tagger.encoder_files(),
                 "model_dir": model_dir_relative}
    kind, form = tagger.kind, FORMAT
    if graph is not None:
        # The settings a frozen encoder needs to give the words the run gave: same pooling, same windows.
        kind, form, reference["graph"] = "transformer", GRAPH_FORMAT, graph
        frozen = isinstance(encoder, FrozenEncoder)
        settings = {"pooling": encoder.pooling, "max_length": encoder.max_length_requested,
                    "batch_size": encoder.batch_size if frozen else GRAPH_WINDOW_BATCH,
                    "optimization": encoder.optimization if frozen else "all"}
    elif tagger.trainable_encoder:
        checkpoint = _split_tensors(encoder.checkpoint(), ENCODER.rstrip("/"), tensors)
        settings = {"checkpoint": checkpoint, "max_batch_pieces": encoder.max_batch_pieces}
    else:
        settings = {"pooling": encoder.pooling, "max_length": encoder.max_length_requested,
                    "batch_size": encoder.batch_size, "optimization": encoder.optimization}
    return {"format": form, "kind": kind, **_task(tagger), "tags": list(tagger.tags), "width": encoder.width,
            "pooling": encoder.pooling, "encoder": {**reference, "settings": settings}}, tensors


def _task(tagger) -> dict:
    """The pipeline's `task` when it is not `upos` (a file without one is a UPOS tagger's, as every file
    written before tasks was)."""
    return {} if tagger.task == DEFAULT_TASK else {"task": tagger.task}


@dataclass
class Saved:
    """What `save_pair` wrote: the pipeline file, and the graph beside it with what wrote it."""

    path: Path
    graph: Path | None = None
    report: object | None = None  # what `write_graph` returned (the patcher's report for written weights)


def save(tagger: Tagger, path: str | os.PathLike, training: dict | None = None) -> Path:
    """Write the pipeline atomically; `training` (JSON-ready) is kept in the settings for provenance.

    A fine-tuned encoder's weights stay in the file (format /1); a tagger loaded from a /2 or /3 file
    is saved with a copy of its graph, in its format (see the module docstring). Equal weights and
    settings give equal bytes.
    """
    from safetensors.torch import save as to_bytes

    path = Path(path)
    source = _written_graph(tagger)  # a written graph can only be copied: there are no modules
    if source is not None:
        form = TAGGER_FORMAT if isinstance(tagger, GraphTagger) else GRAPH_FORMAT
        return save_pair(tagger, path, lambda tmp: shutil.copyfile(source, tmp), training, form).path
    settings, tensors = describe(tagger, _relative_model_dir(tagger, path))
    if training is not None:
        settings["training"] = training
    data = to_bytes(tensors, metadata={METADATA_KEY: _sealed_text(settings, tensors)})
    with files.atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def _relative_model_dir(tagger: Tagger, path: Path) -> str:
    """The encoder's model directory relative to the pipeline file's directory (see the docstring)."""
    return Path(os.path.relpath(Path(tagger.encoder.model_dir).resolve(), path.resolve().parent)).as_posix()


def save_pair(tagger: Tagger | GraphTagger, path: str | os.PathLike, write_graph,
              training: dict | None = None, form: str = GRAPH_FORMAT) -> Saved:
    """Write the pipeline file (format `form`: /2, the graph is the encoder; /3, it is the whole tagger)
    and, beside it, its graph: `write_graph(tmp)` writes the graph to the temporary path it is given and
    returns what to report.

    Both files stay under temporary names until both are complete. The contexts close in reverse: the
    graph is renamed first, so a pipeline file never exists without its graph, and a failure before
    the renames (the graph refused, the pipeline not serialisable) leaves neither file behind.
    """
    from safetensors.torch import save as to_bytes

    path = Path(path)
    target = path.with_name(graph_name(path))
    with files.atomic_path(path) as pipeline_tmp, files.atomic_path(target) as graph_tmp:
        report = write_graph(graph_tmp)
        graph = {"file": target.name, "sha256": files.sha256_file(graph_tmp),
                 "bytes": graph_tmp.stat().st_size}
        describe_form = describe_tagger_graph if form == TAGGER_FORMAT else describe
        settings, tensors = describe_form(tagger, _relative_model_dir(tagger, path), graph)
        if training is not None:
            settings["training"] = training
        pipeline_tmp.write_bytes(to_bytes(tensors, metadata={METADATA_KEY: _sealed_text(settings, tensors)}))
    return Saved(path, target, report)


def _content(settings: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """What a pipeline file's SHA-256 covers: its settings and its tensors in name order."""
    return {"settings": settings, "tensors": sorted(tensors.items())}


def _sealed_text(settings: dict, tensors: dict[str, torch.Tensor]) -> str:
    """The settings as the file's header holds them: sorted JSON, with the content's SHA-256 in it."""
    parsed = json.loads(json.dumps(settings, sort_keys=True, ensure_ascii=False))  # what `read` will see
    parsed[artefacts.KEY] = artefacts.seal(_content(parsed, tensors))[artefacts.KEY]
    return json.dumps(parsed, sort_keys=True, ensure_ascii=False)


def _checked(path: Path, settings: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """The settings without their SHA-256, once the file's content matches it (see the module)."""
    fix = artefacts.rebuild(path)
    content = _content({k: v for k, v in settings.items() if k != artefacts.KEY}, tensors)
    if artefacts.KEY not in settings:
        unknown = sorted(set(settings) - UNSEALED_KEYS)
        if unknown:
            raise PipelineError(f"{path}: no SHA-256 of its content, and settings {unknown} no writer wrote "
                                f"without one: the file is damaged or was written by other code; {fix}")
        return content["settings"]
    record = {**content, artefacts.KEY: settings[artefacts.KEY]}
    return artefacts.opened(record, path, "pipeline file", fix, PipelineError)["settings"]


def read(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(settings, tensors) of a pipeline file, without loading an encoder."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no such pipeline file; give a pipeline.safetensors that `tagging "
                            "train` or `writeback pipeline` wrote")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 -- not a dict
    except (OSError, SafetensorError) as err:
        raise PipelineError(f"{path}: the pipeline file is damaged or not a safetensors file ({err}); "
                            f"{artefacts.rebuild(path)}") from err
    try:
        settings = json.loads(metadata[METADATA_KEY])
    except (KeyError, json.JSONDecodeError) as err:
        raise PipelineError(f"{path}: a safetensors file without pipeline settings (metadata key "
                            f"{METADATA_KEY!r}); not written by recipes.tagging.pipeline") from err
    settings = _checked(path, settings, tensors)
    if settings.get("format") not in FORMATS or settings.get("kind") not in KINDS:
        raise PipelineError(f"{path}: format {settings.get('format')!r}, kind {settings.get('kind')!r}; this "
                            f"code reads {list(FORMATS)} with kinds {list(KINDS)}")
    if settings["format"] in WRITTEN:
        encoder = settings.get("encoder")
        graph = encoder.get("graph") if isinstance(encoder, dict) else None
        name = graph.get("file") if isinstance(graph, dict) else None
        # A plain file name only: a pipeline file must not make `load` open a path of its choosing.
        if (settings["kind"] != "transformer" or not isinstance(name, str) or Path(name).name != name
                or name in ("", ".", "..") or not isinstance(graph.get("sha256"), str)):
            raise PipelineError(f"{path}: format {settings['format']!r} without a valid written graph (kind "
                                f"'transformer', encoder.graph with a plain file name and its sha256)")
    return settings, tensors


def graph_path(path: str | os.PathLike, settings: dict) -> Path | None:
    """Where a pipeline file's written graph is (None for files without one): beside the file."""
    graph = settings["encoder"].get("graph") if settings["format"] in WRITTEN else None
    return None if graph is None else Path(path).parent / graph["file"]


def check_graph(path: Path, settings: dict) -> Path:
    """The written graph beside a /2 pipeline file, checked by SHA-256; refusals name both files."""
    graph = graph_path(path, settings)
    expected = settings["encoder"]["graph"]["sha256"]
    fix = (f"the pipeline file and its graph travel together: put the {graph.name} that was saved with "
           f"{path.name} beside it in {path.parent}, or save the tagger again to write both (in the "
           f"workflow: snakemake --cores all -f {path})")
    if not graph.is_file():
        raise PipelineError(f"{path}: its encoder graph {graph} is missing; {fix}")
    actual = files.sha256_file(graph)
    if actual != expected:
        raise PipelineError(f"{path}: its encoder graph {graph} is not the one it was saved with (SHA-256 "
                            f"{actual}, recorded {expected}); {fix}")
    return graph


def check_files(path: Path, model_dir: Path, expected: dict[str, str]) -> None:
    """Hash each referenced file; files.IntegrityError names a changed one and both SHA-256."""
    for name in manifest.MODEL_FILES:
        if name not in expected:
            raise PipelineError(f"{path}: does not reference {name}; it was written by other code")
        files.check_file(model_dir / name, expected[name], what=f"encoder file (referenced by {path})")


def load(path: str | os.PathLike, model_dir: str | os.PathLike | None = None, threads: int = 1
         ) -> Tagger | GraphTagger:
    """The tagger a pipeline file holds, over the encoder files it references (checked by SHA-256): a
    `GraphTagger` for a /3 file, else a `Tagger`."""
    path = Path(path)
    settings, tensors = read(path)
    reference = settings["encoder"]
    model_dir = Path(model_dir) if model_dir is not None else path.parent / reference["model_dir"]
    if not model_dir.is_dir():
        raise PipelineError(f"{path}: the model directory {model_dir} does not exist; give the exported "
                            f"model {reference['model']!r} it references with model_dir=")
    check_files(path, model_dir, reference["files"])
    graph = check_graph(path, settings) if settings["format"] in WRITTEN else None
    encoder_settings = reference["settings"]
    if settings["format"] == TAGGER_FORMAT:
        return GraphTagger(model_dir, graph, pooling=encoder_settings["pooling"],
                           max_length=encoder_settings["max_length"],
                           batch_size=encoder_settings["batch_size"], threads=threads,
                           optimization=encoder_settings["optimization"], tags=settings["tags"],
                           task=settings.get("task", DEFAULT_TASK))
    if settings["kind"] == "transformer":
        encoder = FrozenEncoder(model_dir, pooling=encoder_settings["pooling"],
                                max_length=encoder_settings["max_length"],
                                batch_size=encoder_settings["batch_size"], threads=threads,
                                optimization=encoder_settings["optimization"], graph=graph)
    else:
        checkpoint = _join_tensors(encoder_settings["checkpoint"], tensors)
        encoder = TrainableEncoder.restore(model_dir, checkpoint, threads=threads)
    tagger = Tagger(encoder, tags=settings["tags"], task=settings.get("task", DEFAULT_TASK))
    head = {name[len(HEAD):]: t for name, t in tensors.items() if name.startswith(HEAD)}
    tagger.head.load_state_dict(head, strict=True)
    return tagger.eval()


def training_summary(path: str | os.PathLike) -> dict | None:
    """The `training` record saved with the pipeline, if any."""
    return read(path)[0].get("training")
