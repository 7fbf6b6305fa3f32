"""Parity computations on hand-made arrays, and the parity commands on the tiny exports."""

import json

import numpy as np
import pytest

from conftest import TINY, runner
from encoder_study.core import tables
from encoder_study.core.errors import UserError
from encoder_study.encoders import compare
from encoder_study.recipes.parity import parity, parity_tables

run = runner("parity")


def test_token_differences_on_a_hand_made_pair():
    ref = np.array([[[1.0, 0.0, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]]], dtype=np.float32)[0]
    other = np.array([[1.0, 0.5, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    max_abs, cos = compare.token_differences(ref, other)
    assert max_abs.tolist() == [0.5, 0.0, 0.0]
    assert cos[0] == pytest.approx(1.0 / np.sqrt(1.25)) and cos[1] == 1.0
    assert cos[2] == 1.0  # two zero vectors agree


def test_csv_floats_round_trip_exactly():
    rows = [{"model": "m", "tokens": 3, "texts": 1, "truncated": 0, "max_abs": 0.1 + 0.2,
             "mean_abs": 1e-300, "min_cos": 0.99999999, "mean_cos": 1.0, "max_value": 40.7,
             "batch_max_abs": 0.0}]
    text = tables.csv_text(rows, parity_tables.INFERENCE_COLUMNS)
    assert text.splitlines()[0] == ",".join(parity_tables.INFERENCE_COLUMNS)
    assert float(text.splitlines()[1].split(",")[4]) == 0.1 + 0.2


def test_malformed_texts_name_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": 1, "source": "tatoeba", "lang": "eng", "text": "a"}\n{"id": 2}\n')
    with pytest.raises(compare.ParityError, match=r"t.jsonl:2"):
        compare.read_texts(path)
    path.write_text("")
    with pytest.raises(compare.ParityError, match="empty"):
        compare.read_texts(path)


TEXTS = ["The bank can run fast.", "Příliš žluťoučký kůň.", "日本語のテキスト", "שלום עולם",
         "Ещё одно предложение.", "x", "A much longer sentence " * 12, "Ελληνικά γράμματα.", "🙂 ok"]


@pytest.mark.parametrize("name", TINY)
def test_inference_parity_on_tiny_models(tiny_exports, models_dir, name):
    model = compare.Pair.load(tiny_exports[name], models_dir / "sources" / name / "source.json")
    row, diffs = parity.inference_parity(model, TEXTS, threads=1)
    assert row.texts == len(TEXTS) and row.tokens == diffs.size > len(TEXTS)
    assert row.max_abs < 1e-5 and row.min_cos > 0.99999 and row.max_value > 0.1
    assert row.batch_max_abs < 1e-5
    assert row.max_abs == diffs.max()


def test_latency_rows(tiny_exports, models_dir):
    model = compare.Pair.load(tiny_exports["bert-tiny"], models_dir / "sources" / "bert-tiny" / "source.json")
    rows = parity.latency(model, threads=1, batches=(1, 2), seq_len=16, warmup=1, runs=3, min_seconds=0.05)
    assert [(r["runtime"], r["batch"]) for r in rows] == [
        ("onnxruntime", 1), ("pytorch", 1), ("onnxruntime", 2), ("pytorch", 2)]
    for r in rows:
        assert r["min_ms"] <= r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] <= r["max_ms"] and r["seq_len"] == 16
        assert r["runs"] >= 3 and r["seconds"] >= 0.05 and r["gemm_gflops"] > 0
        assert r["gflops"] == pytest.approx(r["gflop"] / (r["median_ms"] / 1e3))
        assert r["fraction_of_gemm"] == pytest.approx(r["gflops"] / r["gemm_gflops"])
    assert rows[2]["gflop"] == pytest.approx(2 * rows[0]["gflop"])  # twice the sequences


def test_the_latency_command_times_each_model_to_its_own_csv(tiny_exports, models_dir, tmp_path):
    args, outs = [], {}
    for name in ("xlmr-tiny", "bert-tiny"):  # the rows follow the order of --model, not the names'
        outs[name] = tmp_path / "latency" / f"{name}.csv"
        args += ["--model", str(tiny_exports[name]), str(models_dir / "sources" / name / "source.json"),
                 "--out", str(outs[name])]
    common = ["--threads", "1", "--batches", "1,2", "--seq-len", "8", "--warmup", "0", "--runs", "2",
              "--min-seconds", "0", "--provenance", str(tmp_path / "prov/parity/parity_latency.md")]
    assert run("latency", *args, *common) == 0
    for name, out in outs.items():
        rows = tables.read_csv(out)
        assert [(r["model"], r["runtime"], r["batch"]) for r in rows] == [
            (name, runtime, batch) for batch in "12" for runtime in ("onnxruntime", "pytorch")]
        assert all(float(r["gemm_gflops"]) > 0 and r["load_before"] for r in rows)
    fragment = (tmp_path / "prov/parity/parity_latency.md").read_text()
    assert fragment.index("xlmr-tiny") < fragment.index("bert-tiny") and "GEMM probe at 1 thread" in fragment
    # one --out per --model
    with pytest.raises(UserError, match="one --out per --model"):
        run("latency", *args[:-2], *common)


def test_compare_writes_both_tables_rows_and_one_fragment(tiny_exports, models_dir, tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"id": i, "source": "tatoeba", "lang": "eng", "text": t}) + "\n"
                             for i, t in enumerate(TEXTS)))
    parts = {"inference": [], "trainable": []}
    for name in ("bert-tiny", "xlmr-tiny"):
        inference, trainable = (tmp_path / kind / f"{name}.csv" for kind in parts)
        fragment = tmp_path / f"prov/parity/parity_compare-{name}.md"
        assert run("compare", "--model-dir", str(tiny_exports[name]), "--source",
                   str(models_dir / "sources" / name / "source.json"), "--texts", str(texts),
                   "--threads", "1", "--inference-out", str(inference), "--diffs",
                   str(inference.with_suffix(".npy")), "--trainable-out", str(trainable),
                   "--provenance", str(fragment)) == 0
        text = fragment.read_text()
        assert text.index("## Inference parity") < text.index("## Trainable parity")
        parts["inference"].append(str(inference))
        parts["trainable"].append(str(trainable))
        # One pass of the reference and the graph serves both tables: the rows are those of each alone.
        pair = compare.Pair.load(tiny_exports[name], models_dir / "sources" / name / "source.json")
        alone = compare.trainable_parity(pair, TEXTS, threads=1)
        assert [float(r["max_abs"]) for r in tables.read_csv(trainable)] == [r["max_abs"] for r in alone]
        row, diffs = parity.inference_parity(pair, TEXTS, threads=1)
        assert float(tables.read_csv(inference)[0]["mean_abs"]) == row.mean_abs
        assert np.array_equal(np.load(inference.with_suffix(".npy")), diffs)
    table = tmp_path / "inference.csv"
    assert run("table", "--kind", "inference", "--out", str(table), "--markdown",
               str(tmp_path / "inference.md"), "--plot", str(tmp_path / "inference.png"),
               "--provenance", str(tmp_path / "prov/parity/parity_table_inference.md"),
               *reversed(parts["inference"])) == 0
    rows = tables.read_csv(table)
    assert [r["model"] for r in rows] == ["bert-tiny", "xlmr-tiny"]
    assert (tmp_path / "inference.png").read_bytes().startswith(b"\x89PNG")
    assert "Inference parity" in (tmp_path / "prov/parity/parity_table_inference.md").read_text()
    table = tmp_path / "trainable.csv"
    assert run("table", "--kind", "trainable", "--out", str(table), "--markdown",
               str(tmp_path / "trainable.md"), "--provenance", str(tmp_path / "prov/parity/t.md"),
               *parts["trainable"]) == 0
    assert [(r["model"], r["comparison"]) for r in tables.read_csv(table)] == [
        (name, comparison) for name in ("bert-tiny", "xlmr-tiny") for comparison in compare.COMPARISONS]
    assert "batches of 8 = alone" in (tmp_path / "trainable.md").read_text()


@pytest.mark.parametrize("name", TINY)
def test_trainable_parity_on_tiny_models(tiny_exports, models_dir, name):
    model = compare.Pair.load(tiny_exports[name], models_dir / "sources" / name / "source.json")
    rows = compare.trainable_parity(model, TEXTS, threads=1)
    assert [r["comparison"] for r in rows] == list(compare.COMPARISONS)
    family = "modernbert" if name.startswith("modernbert") else "postnorm"
    for row in rows:
        assert row["family"] == family and row["batch_equal"] is True
        assert row["max_abs"] < 2e-5 and row["min_cos"] > 0.99999 and row["tokens"] > len(TEXTS)


# The Markdown the tables render (inference and trainable: the bytes they had before tables.markdown).
MARKDOWN_ROWS = {
    "inference": [{"model": "a|b", "tokens": "12345", "texts": "3", "truncated": "0", "max_abs": "1.2345e-07",
                   "mean_abs": "3.3e-09", "min_cos": "0.9999999876", "mean_cos": "1.0", "max_value": "40.71",
                   "batch_max_abs": "0.0"},
                  {"model": "m", "tokens": 7, "texts": 1, "truncated": 1, "max_abs": 0.1 + 0.2,
                   "mean_abs": 1e-300, "min_cos": 0.99999999, "mean_cos": 1.0, "max_value": 1234.5678,
                   "batch_max_abs": 2.5e-6}],
    "trainable": [{"model": "m", "family": "postnorm", "comparison": "trainable vs pytorch",
                   "tokens": 1234567, "max_abs": 1e-6, "mean_abs": 2e-8, "min_cos": 0.999999999,
                   "max_value": 12.5, "batch_equal": True},
                  {"model": "m", "family": "postnorm", "comparison": "graph runtime vs pytorch",
                   "tokens": "99", "max_abs": "0.0", "mean_abs": "0.0", "min_cos": "1.0", "max_value": "0.5",
                   "batch_equal": "False"}],
    "latency": [{"model": "m", "runtime": "onnxruntime", "threads": 2, "batch": 8, "seq_len": 64,
                 "median_ms": 1.23456, "min_ms": 0.9, "max_ms": 12345.6, "runs": 20, "gflops": 12.345,
                 "fraction_of_gemm": 0.8765},
                {"model": "m", "runtime": "pytorch", "threads": "8", "batch": "1", "seq_len": "512",
                 "median_ms": "0.000123", "min_ms": "0.0001", "max_ms": "1.0", "runs": "3", "gflops": "0.5",
                 "fraction_of_gemm": "0.004"}],
}
MARKDOWN = {
    "inference": (
        "| model | tokens | max abs | mean abs | min cosine | mean cosine | largest value "
        "| batch of 8 vs alone |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| a\\|b | 12,345 | 1.2e-07 | 3.3e-09 | 0.99999999 | 1.00000000 | 40.7 | 0 |\n"
        "| m | 7 | 0.3 | 1e-300 | 0.99999999 | 1.00000000 | 1.23e+03 | 2.5e-06 |\n"),
    "trainable": (
        "| model | family | comparison | tokens | max abs | mean abs | min cosine | largest value "
        "| batches of 8 = alone |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n"
        "| m | postnorm | trainable vs pytorch | 1,234,567 | 1e-06 | 2e-08 | 1.00000000 | 12.5 | yes |\n"
        "| m | postnorm | graph runtime vs pytorch | 99 | 0 | 0 | 1.00000000 | 0.5 | NO |\n"),
    "latency": (
        "| model | runtime | threads | batch | seq len | median ms | min ms | max ms | calls | GFLOP/s "
        "| of GEMM |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| m | onnxruntime | 2 | 8 | 64 | 1.23 | 0.9 | 1.23e+04 | 20 | 12.3 | 0.88 |\n"
        "| m | pytorch | 8 | 1 | 512 | 0.000123 | 0.0001 | 1 | 3 | 0.5 | 0.00 |\n"),
}


@pytest.mark.parametrize("kind", sorted(MARKDOWN))
def test_markdown_keeps_its_bytes(kind):
    assert parity_tables.markdown(kind, MARKDOWN_ROWS[kind]) == MARKDOWN[kind]
