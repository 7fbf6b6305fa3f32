"""Each config guard of the Snakefile and the rule files refuses the config that trips it, with its own
message: one dry run per guard, over the embedded default with a small `--configfile` on top (offline;
the guard stops Snakemake while it reads the rule files, before any job is planned), all of them in one
Python process."""

from __future__ import annotations

import pytest
import yaml

from conftest import ROOT, snakemake_each

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
    "latency of no model": (
        {"parity": {"latency_skip": [m["name"] for m in DEFAULT["models"]]}},
        "config: parity.latency_skip skips every model ("),
    "retrieval model not listed": (
        {"retrieval": {"model": "nope"}},
        f"config: retrieval.model is 'nope', which `models` does not list; name one of {MODELS} or give a "
        "model entry of its own"),
    "resources of no rule": (
        {"resources": {"tagging_trian": {"mem_mb": 1000}}},
        "config: resources.tagging_trian names no rule of the workflow; rules are named <recipe>_<step> "
        "(see the README's recipe table)"),
    "unknown top-level key": (
        {"taging": {"runs": []}, "zzz": 1},
        "config: unknown key 'taging' (did you mean 'tagging'?); the keys of the config are benchmarks, "
        "export, models, parity, "),
    "unknown nested key": (
        {"tagging": {"bootstrap": {"resampels": 3}}},
        "config: unknown key 'tagging.bootstrap.resampels' (did you mean 'tagging.bootstrap.resamples'?); "
        "the keys of tagging.bootstrap are confidence, method, resamples, seed"),
    "a key that moved": (
        {"tagging": {"resamples": 500}},
        "config: 'tagging.resamples' moved to 'tagging.bootstrap.resamples'; rename it there"),
    "unknown key in a list's entry": (
        {"models": [{"name": "x", "source": "hf", "repo": "a/b", "revison": "abc"}]},
        "config: unknown key 'models[0].revison' (did you mean 'models[0].revision'?)"),
    "wrong type": (
        {"export": {"opset": "17"}},
        "config: export.opset is '17' (a string); give an integer"),
    "out of range": (
        {"tagging": {"bootstrap": {"resamples": -1}}},
        "config: tagging.bootstrap.resamples is -1; give a value with minimum "),
    "run compared with itself": (
        {"tagging": {"comparisons": [["minilm-frozen-mean", "baseline"], ["minilm-frozen-mean"] * 2]}},
        "config: tagging.comparisons compares 'minilm-frozen-mean' with itself (a difference of 0 by "
        "construction); name two different runs"),
    "run with no end": (
        {"tagging": {"runs": [{**RUN, "epochs": 0, "max_steps": 0}], "comparisons": []}},
        "config: tagging run 'probe' has no end: epochs 0 and max_steps 0 (its entry's, else "
        "tagging.defaults.frozen's); set epochs or max_steps"),
    "runs with no end by their mode's defaults": (
        {"tagging": {"defaults": {"frozen": {"epochs": 0}}}},
        "config: tagging run 'minilm-frozen-mean' has no end: epochs 0 and max_steps 0"),
    "missing local treebank files": (
        {"treebank": {"source": "ewt", "train": "/nonexistent/train.conllu",
                      "dev": "file:///nonexistent/dev.conllu"}},
        "config: no such file or directory: treebank.train: /nonexistent/train.conllu; treebank.dev: "
        "file:///nonexistent/dev.conllu (a path or file:// URL is read in place, a relative path from "),
    "missing local extra test set": (
        {"treebank": {"extra_tests": {"pud": {"url": "data/pud.conllu", "sha256": ""}}}},
        "config: no such file or directory: treebank.extra_tests.pud.url: data/pud.conllu (a path"),
    "missing local text source": (
        {"texts": {"udhr": "config/texts/nope"}},
        "config: no such file or directory: texts.udhr: config/texts/nope (a path"),
    "missing architecture file": (
        {"models": [{**TINY_MODEL, "architecture": "config/models/nope.json"}, *DEFAULT["models"][1:]]},
        f"config: no such file or directory: models '{TINY_MODEL['name']}' architecture: "
        "config/models/nope.json (a path"),
    "threads of a rule that takes none": (
        {"threads": {"export_table": 2}},
        "config: threads.export_table: rule export_table takes no threads from the config; those that do: "),
}


# The config of test_an_unknown_top_level_key_is_one_line_not_the_schema.
ONE_LINE = {"taging": {}, "tagging": {"bootstrap": {"resampels": 3}}}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict:
    """A dry run of the default config's `export` (name None), and one over the default config with each
    guard's config on top (and ONE_LINE's): name -> what Snakemake returned and printed. All in one
    Python process (conftest.snakemake_each)."""
    folder = tmp_path_factory.mktemp("guards")
    configs = {name: config for name, (config, _) in GUARDS.items()} | {"one line": ONE_LINE}
    argvs = {}
    for index, (name, config) in enumerate(configs.items()):
        path = folder / f"guard-{index}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        argvs[name] = ["-n", "--configfile", str(path)]
    argvs[None] = ["-n", "--cores", "2", "export"]  # last: what the refusals leave behind cannot help it
    return dict(zip(argvs, snakemake_each(*argvs.values()), strict=True))


def refusal(dry_runs, name: str) -> str:
    """What the dry run of guard `name` printed; it must fail."""
    result = dry_runs[name]
    assert result.returncode != 0, result.stdout
    return result.stdout + result.stderr


def test_the_default_config_passes_every_guard(dry_runs):
    # The configs below differ from it only in what trips their guard.
    assert dry_runs[None].returncode == 0, dry_runs[None].stdout + dry_runs[None].stderr


@pytest.mark.parametrize("guard", list(GUARDS))
def test_each_guard_refuses_its_config_with_its_message(dry_runs, guard):
    _, message = GUARDS[guard]
    printed = refusal(dry_runs, guard)
    assert message in printed
    # the message ends the output: no "WorkflowError in file" header, no traceback frame after it
    assert dry_runs[guard].returncode == 1
    assert "WorkflowError" not in printed and ", line " not in printed, printed
    assert printed.rstrip().splitlines()[-1].startswith("config: ")
    if guard == "threads of a rule that takes none":  # then the rules that do, sorted
        listed = printed.split(message, 1)[1].splitlines()[0].split(", ")
        assert listed == sorted(listed) and "tagging_train" in listed and "export_table" not in listed


def test_an_unknown_key_at_any_depth_is_one_line_not_the_schema(dry_runs):
    printed = refusal(dry_runs, "one line")
    line = next(x for x in printed.splitlines() if "config: unknown key 'taging'" in x)
    assert line.endswith(", texts, threads, timing, treebank, writeback")
    nested = next(x for x in printed.splitlines() if "config: unknown key 'tagging.bootstrap.resampels'" in x)
    assert "did you mean 'tagging.bootstrap.resamples'?" in nested
    assert len(printed.splitlines()) < 20 and "additionalProperties" not in printed
