"""Small helpers every path that runs an exported graph shares; light imports only (no torch)."""

from __future__ import annotations

import os

INPUTS = ("input_ids", "attention_mask")  # int64 [batch, sequence]
OUTPUT = "last_hidden_state"  # float32 [batch, sequence, width]
OPTIMIZATIONS = ("disable", "basic", "extended", "all")


def usable_positions(config: dict) -> int | None:
    """How many ids one sequence may hold; RoBERTa-style models lose padding_idx + 1 positions."""
    n = config.get("max_position_embeddings")
    if n is None:
        return None
    if config.get("model_type") in ("xlm-roberta", "roberta", "camembert"):
        n -= int(config.get("pad_token_id") or 0) + 1
    return int(n)


def ort_session(path: str | os.PathLike, threads: int, optimization: str = "all"):
    """A CPU session with fixed thread counts, so that results and timings do not depend on the host."""
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
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
