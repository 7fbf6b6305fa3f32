"""The benchmarks recipe on bert-tiny: every part's rows against the GEMM probe (timings not asserted)."""

import pytest

from encoder_study import benchmarks, tables
from encoder_study.commands.benchmarks import parser


def test_every_part_and_its_rates(tiny_exports, models_dir, tmp_path):
    source = models_dir / "sources" / "bert-tiny" / "source.json"
    rows = benchmarks.encoders(tiny_exports["bert-tiny"], source, threads=1, batch=2, seq_len=16, rows=3,
                               length=16, docs=4, seed=0, min_seconds=0.0)
    assert [(r["part"], r["path"]) for r in rows] == [
        ("gemm", "torch.mm float32 2048 x 2048"),
        ("shape", "onnxruntime (exported graph)"), ("shape", "encoder_study modules, forward"),
        ("shape", "transformers (eager), forward"),
        ("frozen", "bare session.run, same batches"), ("frozen", "FrozenEncoder"),
        ("frozen", "FrozenEncoder own work (outputs replayed)"),
        ("step", "encoder_study, forward + backward"), ("step", "transformers, forward + backward"),
        ("words", "modules on the recorded batches"), ("words", "TrainableEncoder")]
    gemm = rows[0]
    assert gemm["fraction_of_gemm"] == pytest.approx(1.0) and gemm["ratio"] == 1.0
    for row in rows:
        assert row["min_s"] <= row["q1_s"] <= row["median_s"] <= row["q3_s"] <= row["max_s"]
        assert row["repeats"] >= 5 and row["gemm_gflops"] == gemm["gflops"]
        if "gflop" in row:
            assert row["fraction_of_gemm"] == pytest.approx(row["gflops"] / gemm["gflops"])
    by_path = {r["path"]: r for r in rows}
    # the same counted work for both paths a part compares; the step is three forward passes
    assert by_path["FrozenEncoder"]["gflop"] == by_path["bare session.run, same batches"]["gflop"]
    assert by_path["encoder_study, forward + backward"]["gflop"] == pytest.approx(
        3 * by_path["onnxruntime (exported graph)"]["gflop"] * (3 * 16) / (2 * 16))
    assert all(by_path[f"{kind}, forward + backward"]["peak_rss_rise_mb"] > 0
               for kind in ("encoder_study", "transformers"))
    # the Markdown renders rows that leave columns out (the GEMM row has no peak memory)
    text = benchmarks.markdown(rows)
    assert text.count("\n") == len(rows) + 2 and "| gemm |" in text


def test_the_command_writes_the_table_and_its_fragment(tiny_exports, models_dir, tmp_path):
    out = tmp_path / "encoders.csv"
    args = parser().parse_args([
        "encoders", "--model-dir", str(tiny_exports["bert-tiny"]), "--source",
        str(models_dir / "sources" / "bert-tiny" / "source.json"), "--threads", "1", "--batch", "1",
        "--seq-len", "8", "--rows", "2", "--length", "8", "--docs", "2", "--seed", "0", "--min-seconds", "0",
        "--out", str(out), "--provenance", str(tmp_path / "prov" / "benchmarks_encoders.md")])
    assert args.run(args) == 0
    assert list(tables.read_csv(out)[0]) == benchmarks.COLUMNS
    assert out.with_suffix(".md").is_file() and (tmp_path / "prov" / "benchmarks_encoders.md").is_file()
