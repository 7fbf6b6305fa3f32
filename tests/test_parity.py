"""Parity computations on hand-made arrays, and the parity commands on the tiny exports."""

import json

import numpy as np
import pytest

from conftest import TINY
from encoder_study import parity


def test_token_differences_on_a_hand_made_pair():
    ref = np.array([[[1.0, 0.0, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]]], dtype=np.float32)[0]
    other = np.array([[1.0, 0.5, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    max_abs, cos = parity.token_differences(ref, other)
    assert max_abs.tolist() == [0.5, 0.0, 0.0]
    assert cos[0] == pytest.approx(1.0 / np.sqrt(1.25)) and cos[1] == 1.0
    assert cos[2] == 1.0  # two zero vectors agree


def test_csv_floats_round_trip_exactly():
    rows = [{"model": "m", "tokens": 3, "texts": 1, "truncated": 0, "max_abs": 0.1 + 0.2,
             "mean_abs": 1e-300, "min_cos": 0.99999999, "mean_cos": 1.0, "max_value": 40.7,
             "batch_max_abs": 0.0}]
    text = parity.csv_text(rows, parity.INFERENCE_COLUMNS)
    assert text.splitlines()[0] == ",".join(parity.INFERENCE_COLUMNS)
    assert float(text.splitlines()[1].split(",")[4]) == 0.1 + 0.2


def test_malformed_texts_name_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": 1, "source": "tatoeba", "lang": "eng", "text": "a"}\n{"id": 2}\n')
    with pytest.raises(parity.ParityError, match=r"t.jsonl:2"):
        parity.read_texts(path)
    path.write_text("")
    with pytest.raises(parity.ParityError, match="empty"):
        parity.read_texts(path)


TEXTS = ["The bank can run fast.", "Příliš žluťoučký kůň.", "日本語のテキスト", "שלום עולם",
         "Ещё одно предложение.", "x", "A much longer sentence " * 12, "Ελληνικά γράμματα.", "🙂 ok"]


@pytest.mark.parametrize("name", TINY)
def test_inference_parity_on_tiny_models(tiny_exports, models_dir, name):
    model = parity.Model.load(tiny_exports[name], models_dir / "sources" / name / "source.json")
    row, diffs = parity.inference_parity(model, TEXTS, threads=1)
    assert row.texts == len(TEXTS) and row.tokens == diffs.size > len(TEXTS)
    assert row.max_abs < 1e-5 and row.min_cos > 0.99999 and row.max_value > 0.1
    assert row.batch_max_abs < 1e-5
    assert row.max_abs == diffs.max()


def test_latency_rows(tiny_exports, models_dir):
    model = parity.Model.load(tiny_exports["bert-tiny"], models_dir / "sources" / "bert-tiny" / "source.json")
    rows = parity.latency(model, threads=1, batches=(1, 2), seq_len=16, warmup=1, runs=3)
    assert [(r["runtime"], r["batch"]) for r in rows] == [
        ("onnxruntime", 1), ("pytorch", 1), ("onnxruntime", 2), ("pytorch", 2)]
    assert all(r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["seq_len"] == 16 for r in rows)


def test_commands_write_rows_table_plot_and_fragments(tiny_exports, models_dir, tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"id": i, "source": "tatoeba", "lang": "eng", "text": t}) + "\n"
                             for i, t in enumerate(TEXTS)))
    parts = []
    for name in ("bert-tiny", "xlmr-tiny"):
        part = tmp_path / "inference" / f"{name}.csv"
        assert parity.main(["inference", "--model-dir", str(tiny_exports[name]), "--source",
                            str(models_dir / "sources" / name / "source.json"), "--texts", str(texts),
                            "--out", str(part), "--diffs", str(part.with_suffix(".npy")),
                            "--provenance", str(tmp_path / f"prov/parity/parity_inference-{name}.md")]) == 0
        parts.append(str(part))
    table = tmp_path / "inference.csv"
    assert parity.main(["gather", "--kind", "inference", "--out", str(table), "--markdown",
                        str(tmp_path / "inference.md"), "--plot", str(tmp_path / "inference.png"),
                        "--provenance", str(tmp_path / "prov/parity/parity_table.md"), *reversed(parts)]) == 0
    rows = parity.read_csv(table)
    assert [r["model"] for r in rows] == ["bert-tiny", "xlmr-tiny"]
    assert (tmp_path / "inference.png").read_bytes().startswith(b"\x89PNG")
    assert "Inference parity" in (tmp_path / "prov/parity/parity_table.md").read_text()


@pytest.mark.parametrize("name", TINY)
def test_trainable_parity_on_tiny_models(tiny_exports, models_dir, name):
    model = parity.Model.load(tiny_exports[name], models_dir / "sources" / name / "source.json")
    rows = parity.trainable_parity(model, TEXTS, threads=1)
    assert [r["comparison"] for r in rows] == list(parity.COMPARISONS)
    family = "modernbert" if name.startswith("modernbert") else "postnorm"
    for row in rows:
        assert row["family"] == family and row["batch_equal"] is True
        assert row["max_abs"] < 2e-5 and row["min_cos"] > 0.99999 and row["tokens"] > len(TEXTS)


def test_trainable_table_command(tiny_exports, models_dir, tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"id": i, "source": "udhr", "lang": "eng", "text": t}) + "\n"
                             for i, t in enumerate(TEXTS[:4])))
    part = tmp_path / "trainable" / "modernbert-tiny.csv"
    source = models_dir / "sources" / "modernbert-tiny" / "source.json"
    assert parity.main(["trainable", "--model-dir", str(tiny_exports["modernbert-tiny"]), "--source",
                        str(source), "--texts", str(texts),
                        "--out", str(part), "--provenance",
                        str(tmp_path / "prov/parity/parity_trainable-modernbert-tiny.md")]) == 0
    table = tmp_path / "trainable.csv"
    assert parity.main(["gather", "--kind", "trainable", "--out", str(table), "--markdown",
                        str(tmp_path / "trainable.md"), "--provenance", str(tmp_path / "prov/parity/t.md"),
                        str(part)]) == 0
    assert [r["comparison"] for r in parity.read_csv(table)] == list(parity.COMPARISONS)
    assert "batches of 8 = alone" in (tmp_path / "trainable.md").read_text()
