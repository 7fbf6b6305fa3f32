"""Served variants of a written pipeline: where they lie and how one is asked for.

    results/writeback/<run>/pipeline.safetensors            the float32 written pipeline (format /3)
    results/writeback/<run>/int8/pipeline.safetensors       its int8 variant, when published
    results/writeback/<run>/int8/pipeline.encoder0.onnx     (the variant's graph, named by SHA-256)
    results/writeback/<run>/int8/variant.json               its manifest: how it was made, what was measured

A variant is an ordinary /3 pipeline file in a folder named after the variant beside the pipeline it was
made from, so `pipeline.load` reads it as any other (its graph checked by SHA-256) and
`encoder-study tagging predict --pipeline .../int8/pipeline.safetensors` tags with it; `resolve`
gives that path for `--variant int8`. The writeback recipe (`writeback quantisation`) publishes the
folder's files only when the variant's measured drop is within the config's thresholds; the folder is
empty otherwise, and `resolve` says so in one line. `Quantisation` is that gate's group of settings
(config `writeback.quantisation`). Standard library only: the Snakefile imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

FLOAT32 = "float32"  # the pipeline file itself
VARIANTS = (FLOAT32, "int8")
MANIFEST = "variant.json"


@dataclass(frozen=True)
class Quantisation:
    """How the int8 variant of a written tagger is made and when it is published (config
    `writeback.quantisation`; see core.settings)."""

    per_channel: bool
    max_upos_drop: float
    max_differing_percent: float

    OPTIONS: ClassVar[dict] = {
        "per_channel": "one int8 scale per output column of each weight (else one per matrix)",
        "max_upos_drop": "publish only if float32 UPOS minus int8 UPOS is at most this, in points, on every "
                         "split",
        "max_differing_percent": "publish only if at most this percent of tags differ from float32's, on "
                                 "every split",
    }


def folder(pipeline_path: str | os.PathLike, variant: str) -> Path:
    """The folder of `variant` beside the pipeline file `pipeline_path`."""
    return Path(pipeline_path).parent / variant


def resolve(pipeline_path: str | os.PathLike, variant: str | None) -> Path:
    """The pipeline file to load for `variant` of `pipeline_path` (None or float32: the file itself)."""
    from .pipeline import PipelineError

    if variant in (None, FLOAT32):
        return Path(pipeline_path)
    if variant not in VARIANTS:
        raise PipelineError(f"variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    path = folder(pipeline_path, variant) / Path(pipeline_path).name
    if not path.is_file():
        raise PipelineError(f"{pipeline_path}: no {variant} variant is published beside it ({path} is "
                            "missing): its measured drop was over the config's thresholds or it was never "
                            "made; see results/writeback/quantisation.md")
    return path
