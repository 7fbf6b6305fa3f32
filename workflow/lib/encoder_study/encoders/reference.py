"""The PyTorch reference: a source directory's Hugging Face model, as the exporter and the checks see it.

Export, parity, step time, distillation and retrieval all compare against this one model, so how it
is loaded (float32, eval mode, eager attention) and wrapped has one owner.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..core import files


class HiddenStates(torch.nn.Module):
    """`forward(input_ids, attention_mask) -> last_hidden_state`.

    Exporting a Hugging Face model directly fails in transformers 5 (keyword arguments such as
    `use_cache` collide with the positional inputs), so the exporter sees this wrapper instead.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def load_pytorch(model_dir: str | os.PathLike) -> torch.nn.Module:
    """The encoder in float32, eval mode, eager attention."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def source_dir(source_json: str | os.PathLike) -> tuple[Path, dict]:
    """The model directory a source.json describes, with every file checked against its hash."""
    source_json = Path(source_json)
    record = files.read_json(source_json, "a model's source record", "acquire the model again (snakemake "
                             "export)", kind=dict)
    directory = Path(record["model_dir"])
    if not directory.is_absolute():
        directory = source_json.parent / directory
    for entry in record["files"]:
        files.check_file(directory / entry["path"], entry["sha256"], what=f"model '{record['model']}' file",
                         fix=files.rebuild(source_json) if directory.is_relative_to(source_json.parent)
                         else None)
    return directory, record
