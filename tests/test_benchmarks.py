"""The benchmarks recipe on bert-tiny: every part's rows against the GEMM probe (timings not asserted)."""

import pytest

from encoder_study.core import tables
from encoder_study.encoders import perf
from encoder_study.onnx import fusion
from encoder_study.recipes.benchmarks import benchmarks
from encoder_study.recipes.benchmarks.command import parser


@pytest.fixture(scope="module")
def command(tiny_exports, models_dir, tmp_path_factory) -> dict:
    """One run of the command on bert-tiny, shared by the tests: the rows benchmarks.encoders gave it, the
    table it wrote and its fragment."""
    out = tmp_path_factory.mktemp("benchmarks") / "encoders.csv"
    fragment = out.parent / "prov" / "benchmarks_encoders.md"
    real, returned = benchmarks.encoders, []

    def encoders(*args, **kwargs):
        returned.append(real(*args, **kwargs))
        return returned[-1]

    args = parser().parse_args([
        "encoders", "--model-dir", str(tiny_exports["bert-tiny"]), "--source",
        str(models_dir / "sources" / "bert-tiny" / "source.json"), "--threads", "1", "--batch", "2",
        "--seq-len", "16", "--rows", "3", "--length", "16", "--docs", "4", "--seed", "0",
        "--min-seconds", "0", "--out", str(out), "--provenance", str(fragment)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(benchmarks, "encoders", encoders)
        status = args.run(args)
    (rows,) = returned
    return {"status": status, "rows": rows, "out": out, "fragment": fragment}


def test_every_part_and_its_rates(command):
    rows = command["rows"]  # at 1 thread, batch 2 x 16, the step 3 x 16, 4 documents
    peak, *rest = rows
    gemm = [r for r in rest if r["part"] == "gemm"]
    assert peak["part"] == "peak" and peak["path"].startswith("theoretical: ") and " x 2 x " in peak["path"]
    assert [r["path"] for r in gemm[:-1]] == [
        g.name + (" (the probe)" if g.name == gemm[-1]["gemm_probe"] else "") for g in perf.gemm_candidates()]
    assert gemm[-1]["path"].endswith("the probe across the run") and rows[-1] is gemm[-1]
    timed = rows[len(gemm):-1]  # after the peak and the candidates, before the run's probe
    assert [(r["part"], r["path"]) for r in timed] == [
        ("shape", "onnxruntime (exported graph)"), ("shape", "encoder_study modules, forward"),
        ("shape", "transformers (eager), forward"),
        *(("graphs", f"onnxruntime ({variant})") for variant in fusion.VARIANTS),
        ("frozen", "bare session.run, same batches"), ("frozen", "FrozenEncoder"),
        ("frozen", "FrozenEncoder own work (outputs replayed)"),
        ("step", "encoder_study, forward + backward"), ("step", "transformers, forward + backward"),
        ("words", "modules on the recorded batches"), ("words", "TrainableEncoder")]
    chosen = next(r for r in gemm if r["path"].endswith("(the probe)"))
    assert chosen["fraction_of_gemm"] == pytest.approx(1.0) and chosen["gflops"] == peak["gemm_gflops"]
    assert all(r["fraction_of_gemm"] <= 1.0 + 1e-12 for r in gemm[:-1])  # the probe is the fastest candidate
    assert peak["ratio"] == pytest.approx(chosen["gflops"] / peak["gflops"])
    for row in [*gemm, *timed]:
        assert row["min_s"] <= row["q1_s"] <= row["median_s"] <= row["q3_s"] <= row["max_s"]
        assert row["gemm_gflops_min"] <= row["gemm_gflops"] <= row["gemm_gflops_max"]
        assert row["peak_gflops"] == peak["gflops"]
        if "gflop" in row:
            assert row["fraction_of_gemm"] == pytest.approx(row["gflops"] / row["gemm_gflops"])
            assert (row["limit_note"] != "") == (row["fraction_of_gemm"] > 1.0)
    for row in timed:
        assert row["repeats"] >= 5
    # the probe measured beside each part: one limit per part, the run's spread over all of them
    per_part = {r["part"]: r["gemm_gflops"] for r in timed}
    assert len(per_part) == 5 and all(r["gemm_gflops"] == per_part[r["part"]] for r in timed)
    run = rows[-1]
    assert run["gemm_gflops_min"] <= min(per_part.values())
    assert max(per_part.values()) <= run["gemm_gflops_max"]
    by_path = {r["path"]: r for r in rows}
    # every graph variant computes the model: within float32 noise of Hugging Face's on padded rows
    graphs = [r for r in rows if r["part"] == "graphs"]
    assert graphs[0]["graph"] == "none" and "Attention 2" in graphs[1]["graph"]
    assert "SkipLayerNormalization" not in graphs[2]["graph"] and "Attention 2" in graphs[2]["graph"]
    assert all(r["max_abs"] < 1e-4 * max(1.0, r["max_value"]) for r in graphs)
    assert len({r["gflop"] for r in graphs}) == 1 and graphs[0]["ratio"] == 1.0
    # the same counted work for both paths a part compares; the step is three forward passes
    assert by_path["FrozenEncoder"]["gflop"] == by_path["bare session.run, same batches"]["gflop"]
    assert by_path["encoder_study, forward + backward"]["gflop"] == pytest.approx(
        3 * by_path["onnxruntime (exported graph)"]["gflop"] * (3 * 16) / (2 * 16))
    assert all(by_path[f"{kind}, forward + backward"]["peak_rss_rise_mb"] > 0
               for kind in ("encoder_study", "transformers"))
    # the summary a closing note reads: the frozen overhead, each graph variant, the peak, the probe's spread
    lines = benchmarks.summary(rows)
    overhead = f"{by_path['FrozenEncoder']['ratio'] - 1:+.1%}"
    assert lines[0].startswith(f"frozen encoder: {overhead} over a bare session")
    assert [line.split(":")[0] for line in lines[1:1 + len(fusion.VARIANTS)]] == [
        f"onnxruntime at 2 x 16, ({variant})" for variant in fusion.VARIANTS]
    assert any("of the theoretical peak" in line for line in lines)
    assert any(line.startswith(f"the probe ({run['gemm_probe']}) across the run") for line in lines)
    # the Markdown renders rows that leave columns out (the GEMM row has no peak memory)
    text = benchmarks.markdown(rows)
    assert text.count("\n") == len(rows) + 2 and "| gemm |" in text and "| peak |" in text


def test_the_command_writes_the_table_and_its_fragment(command):
    out = command["out"]
    assert command["status"] == 0
    table = tables.read_csv(out)
    assert list(table[0]) == benchmarks.COLUMNS and len(table) == len(command["rows"])
    assert "\n## Summary\n\n- frozen encoder: " in out.with_suffix(".md").read_text()
    assert command["fragment"].is_file()
