"""Each config guard of the Snakefile and the rule files refuses the config that trips it, with its own
message: one dry run per guard, over the embedded default with a small `--configfile` on top (offline;
the guard stops Snakemake while it reads the rule files, before any job is planned)."""

from __future__ import annotations

import pytest
import yaml

from conftest import ROOT, snakemake

DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
MODELS = ", ".join(sorted(m["name"] for m in DEFAULT["models"]))
FINETUNED = ", ".join(sorted(r["name"] for r in DEFAULT["tagging"]["runs"] if r["mode"] == "finetuned"))
TINY_MODEL = DEFAULT["models"][0]
RUN = {"name": "probe", "model": "minilm", "mode": "frozen", "pooling": "mean"}

GUARDS = {
    "model named twice": (
        {"models": [TINY_MODEL, TINY_MODEL]},
        f"config: models lists '{TINY_MODEL['name']}' twice; names must be unique"),
    "student named like a model": (
        {"student": {"name": "minilm"}},
        "config: student.name 'minilm' is also in `models`; give the student another name"),
    "teacher not a model": (
        {"student": {"teacher": "nope"}},
        f"config: student.teacher 'nope' is not in `models` (it has: {MODELS})"),
    "run named twice": (
        {"tagging": {"runs": [RUN, RUN]}},
        "config: tagging.runs lists 'probe' twice; names must be unique"),
    "run of no model": (
        {"tagging": {"runs": [{**RUN, "model": "nope"}]}},
        f"config: tagging run 'probe' names model 'nope', which is neither in `models` ({MODELS}) nor the "
        f"student ('{DEFAULT['student']['name']}')"),
    "comparison of no run": (
        {"tagging": {"comparisons": [["nope", "baseline"]]}},
        "config: tagging.comparisons names 'nope', which is not a run"),
    "write-back of a frozen run": (
        {"writeback": {"runs": ["minilm-frozen-mean"]}},
        f"config: writeback.runs names 'minilm-frozen-mean', which is not a fine-tuned tagging run "
        f"(fine-tuned runs: {FINETUNED})"),
    "retrieval model not listed": (
        {"retrieval": {"model": "nope"}},
        f"config: retrieval.model is 'nope', which `models` does not list; name one of {MODELS} or give a "
        "model entry of its own"),
    "resources of no rule": (
        {"resources": {"tagging_trian": {"mem_mb": 1000}}},
        "config: resources.tagging_trian names no rule of the workflow; rules are named <recipe>_<step> "
        "(see the README's recipe table)"),
    "threads of a rule that takes none": (
        {"threads": {"export_table": 2}},
        "config: threads.export_table: rule export_table takes no threads from the config; those that do: "),
}


def refusal(tmp_path, config: dict) -> str:
    """What a dry run over the default config with `config` on top prints; it must fail."""
    path = tmp_path / "guard.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = snakemake("-n", "--configfile", str(path))
    assert result.returncode != 0, result.stdout
    return result.stdout + result.stderr


def test_the_default_config_passes_every_guard():
    # The configs below differ from it only in what trips their guard.
    result = snakemake("-n", "--cores", "2", "export")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("guard", list(GUARDS))
def test_each_guard_refuses_its_config_with_its_message(tmp_path, guard):
    config, message = GUARDS[guard]
    printed = refusal(tmp_path, config)
    assert "WorkflowError" in printed and message in printed
    if guard == "threads of a rule that takes none":  # then the rules that do, sorted
        listed = printed.split(message, 1)[1].splitlines()[0].split(", ")
        assert listed == sorted(listed) and "tagging_train" in listed and "export_table" not in listed
