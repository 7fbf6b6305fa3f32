"""The student's parity (`results/student/parity.csv`): the trainable modules read back from the graph,
and ONNX Runtime on the graph, each against transformers' BertModel holding the student's weights
(`student.reference`), an implementation written apart from both."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ... import provenance
from ...core import machine, tables
from ...onnx import manifest

PARITY_COLUMNS = ["model", "comparison", "tokens", "max_abs", "mean_abs", "max_value", "min_cos",
                  "batch_equal"]
# compare.trainable_parity's comparison -> this table's: its "pytorch" side is the reference given.
PARITY_COMPARISONS = {"trainable vs pytorch": "trainable vs transformers",
                      "graph runtime vs pytorch": "graph runtime vs transformers"}
# results/student/parity.md: the shared parity columns between the comparison and the batch check.
PARITY_MARKDOWN = (("model", "model", ""), ("comparison", "comparison", ""), *tables.PARITY_COLUMNS,
                   ("batch_equal", "batches = alone", "yes"))


def parity(reference: nn.Module, export_dir: str | os.PathLike, texts: list[str], threads: int,
           batch: int = 8) -> list[dict]:
    """Rows of results/student/parity.csv (`PARITY_COLUMNS`).

    The trainable modules read back from the graph (`trainable.load`), and ONNX Runtime on the graph,
    each against `reference` (`student.reference.load` of the exported student's weights), one text
    per run over every token; `batch_equal`: padded batches of `batch` give the read-back modules
    exactly (bitwise) the rows of the texts run alone.
    """
    from ...encoders import compare, tokens

    export_dir = Path(export_dir)
    record = manifest.verified_model(export_dir)
    config = manifest.read_config(export_dir)
    pad = config.get("pad_token_id")
    pad_id = 0 if pad is None else int(pad)
    pieces = tokens.TextPieces(export_dir / manifest.TOKENIZER_FILE, int(config["max_position_embeddings"]),
                               pad_id)
    model = compare.Pair(record["model"], export_dir / manifest.ONNX_FILE, reference, pieces)
    was = reference.training
    try:
        reference.eval()
        rows = compare.trainable_parity(model, texts, machine.usable_threads(threads), batch,
                                        comparisons=tuple(PARITY_COMPARISONS))
    finally:
        reference.train(was)
    # The family is known (postnorm); the comparison takes this table's name.
    return [{**{k: row[k] for k in PARITY_COLUMNS}, "comparison": PARITY_COMPARISONS[row["comparison"]]}
            for row in rows]


def parity_markdown(rows: list[dict]) -> str:
    return tables.markdown(rows, PARITY_MARKDOWN)


def table(student: str | os.PathLike, export_dir: str | os.PathLike, texts_path: str | os.PathLike,
          out: str | os.PathLike, threads: int) -> provenance.Done:
    """`student parity`: the exported student against transformers' BertModel fed the same weights
    (`reference`), one text per run, written to `out` (CSV) and its Markdown beside it."""
    from ...core import files
    from ...data import texts
    from . import distill, reference

    encoder, _ = distill.load_student(student)
    bert = reference.load(encoder.state_dict(), encoder.settings_dict())
    records = texts.read_jsonl(texts_path)
    rows = parity(bert, export_dir, [r["text"] for r in records], threads=threads)
    markdown_path = Path(out).with_suffix(".md")
    files.write_text(out, tables.csv_text(rows, PARITY_COLUMNS))
    files.write_text(markdown_path, parity_markdown(rows))
    read = [student, texts_path, *(Path(export_dir) / n for n in manifest.EXPORT_FILES)]
    done = provenance.Done(inputs=read, outputs=[out, markdown_path])
    done.table("Student parity against transformers' BertModel (one text per run, every token)",
               parity_markdown(rows))
    return done
