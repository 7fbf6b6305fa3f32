"""Small helpers every path that runs an exported graph shares; light imports only (no torch)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .. import provenance
from ..core.errors import UserError

INPUTS = ("input_ids", "attention_mask")  # int64 [batch, sequence]
OUTPUT = "last_hidden_state"  # float32 [batch, sequence, width]
# The exporters' dynamic axes for INPUTS and OUTPUT: any batch, any length.
DYNAMIC_AXES = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "last_hidden_state": {0: "batch", 1: "sequence"},
}
# Text for an export's check batch: several scripts, so that unknown pieces and long words occur too.
CHECK_TEXT = (
    "The quick brown fox jumps over the lazy dog while the bank of the river floods. "
    "Příliš žluťoučký kůň úpěl ďábelské ódy. Съешь же ещё этих мягких французских булок. "
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. שלום עולם. مرحبا بالعالم. नमस्ते दुनिया. "
    "สวัสดีชาวโลก 日本語のテキスト 한국어 문장. "
)
OPTIMIZATIONS = ("disable", "basic", "extended", "all")


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int, width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded `input_ids` and `attention_mask` (int64) for rows of piece ids (lists or arrays),
    as wide as the longest row or `width`, whichever is more. The one padding of every batch."""
    width = max(width, *(len(r) for r in rows))
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def session_options(threads: int, optimization: str = "all"):
    """ONNX Runtime options with fixed thread counts: results and timings do not depend on the host."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    return options


# `provider` names: the CPU (the default: what every parity table is measured with) or CUDA.
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


class ProviderError(UserError):
    """An execution provider was asked for that this ONNX Runtime cannot give."""


def providers_for(provider: str, available: list[str] | None = None) -> list[str]:
    """ONNX Runtime's provider list for `provider` ("cpu" or "cuda"); for CUDA, the CPU provider follows
    (ONNX Runtime runs there the few nodes CUDA has no kernel for). Refuses CUDA where this ONNX Runtime
    has no CUDA provider (the `onnxruntime` package is CPU only; `onnxruntime-gpu` has it)."""
    if provider not in PROVIDERS:
        raise ProviderError(f"execution provider {provider!r}: expected one of {sorted(PROVIDERS)}")
    if provider == "cpu":
        return [PROVIDERS["cpu"]]
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    if PROVIDERS["cuda"] not in available:
        raise ProviderError(
            f"ONNX Runtime's CUDA execution provider was asked for, but this ONNX Runtime offers only "
            f"{', '.join(available)}; install onnxruntime-gpu in place of onnxruntime (see "
            "envs/torch-cuda.txt) on a machine with an NVIDIA GPU, or ask for provider 'cpu'")
    return [PROVIDERS["cuda"], PROVIDERS["cpu"]]


def ort_session(path: str | os.PathLike, threads: int, optimization: str = "all", provider: str = "cpu"):
    """A session on `path` with `session_options`, on the CPU unless `provider` is "cuda".

    The providers the session really uses are recorded for the job's provenance fragment.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), session_options(threads, optimization),
                                   providers=providers_for(provider))
    if provider == "cuda" and session.get_providers()[0] != PROVIDERS["cuda"]:
        # ONNX Runtime falls back to the CPU, with a warning only, when CUDA cannot start.
        raise ProviderError(f"{path}: ONNX Runtime could not start its CUDA execution provider "
                            f"(session providers: {session.get_providers()}); see its log above")
    provenance.used("onnxruntime providers used", ", ".join(session.get_providers()))
    return session
