"""The workflow as a user meets it: dry run, lint, config validation, and a small real run in a copy."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, snakemake, snakemake_each
from encoder_study import cli
from encoder_study.provenance import deps

BAD_CONFIGS = {
    "models:\n  - {name: x, source: tiny, architecture: a.json, seed: zero}\n":
        "config: models[0].seed is 'zero' (a string); give an integer",
    "exprot: {}\n": "config: unknown key 'exprot' (did you mean 'export'?)",
    "models:\n  - {name: x, source: hf, repo: a/b, revison: abc}\n":
        "config: unknown key 'models[0].revison' (did you mean 'models[0].revision'?)",
    "export: {opset: \"17\"}\n": "config: export.opset is '17' (a string); give an integer",
}


def _local_ewt(folder: Path) -> Path:
    """A config over config/ewt-minilm.yaml naming local treebank files (and the texts) with their SHA-256."""
    import hashlib

    override = {"texts": {"tatoeba": str(ROOT / "config/texts/tatoeba_sample.tsv"),
                          "udhr": str(ROOT / "config/texts/udhr_sample")}, "treebank": {}}
    for split in ("train", "dev", "test"):
        path = folder / f"en_ewt-ud-{split}.conllu"
        path.write_text("# text = Hi.\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\tSpaceAfter=No\n"
                        "2\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_\n\n")
        override["treebank"][split] = f"file://{path}"
        override["treebank"][f"{split}_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    # The out-of-domain test set (UD English-PUD), a local stand-in too.
    override["treebank"]["extra_tests"] = {"pud": {"url": str(path), "sha256": hashlib.sha256(
        path.read_bytes()).hexdigest()}}
    (folder / "local.yaml").write_text(json.dumps(override))
    return folder / "local.yaml"


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict:
    """The dry runs (and the lint) of the tests below, in the repository, in one Python process
    (conftest.snakemake_each): name -> what Snakemake returned and printed."""
    folder = tmp_path_factory.mktemp("dry-runs")
    argvs = {"all": ["-n", "--cores", "8", "all"], "lint": ["--lint"],
             "paper": ["-n", "export", "--configfile", "config/paper.yaml"],
             "recipes": ["-n", "--cores", "2", *RECIPES],
             "ewt": ["-n", "--cores", "2", "tagging", "writeback", "--configfile", "config/ewt-minilm.yaml",
                     str(_local_ewt(folder))]}
    for index, bad in enumerate(BAD_CONFIGS):
        (folder / f"bad-{index}.yaml").write_text(bad)
        argvs[bad] = ["-n", "--configfile", str(folder / f"bad-{index}.yaml")]
    return {"folder": folder, **dict(zip(argvs, snakemake_each(*argvs.values()), strict=True))}


def test_dry_run_of_all(dry_runs):
    result = dry_runs["all"]
    assert result.returncode == 0, result.stderr


def test_lint_is_clean(dry_runs):
    result = dry_runs["lint"]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Lints for" not in result.stdout + result.stderr


@pytest.mark.parametrize("bad", list(BAD_CONFIGS))
def test_schema_rejects_a_bad_config_naming_the_key(dry_runs, bad):
    result = dry_runs[bad]
    assert result.returncode != 0
    assert BAD_CONFIGS[bad] in result.stdout + result.stderr


def test_paper_config_replaces_the_default_models(dry_runs):
    result = dry_runs["paper"]
    assert result.returncode == 0, result.stderr
    assert "mmbert-base" in result.stdout and "bert-tiny" not in result.stdout


def _package(root: Path, sources: dict[str, str]) -> Path:
    """A package `encoder_study` under `root` with the given files (and empty __init__/cli)."""
    package = root / "encoder_study"
    for name, text in {"__init__.py": "", "cli.py": "", **sources}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def _code(root: Path, module: str, function: str | None = None) -> set[str]:
    return {Path(p).relative_to(root / "encoder_study").as_posix()
            for p in deps.code_files(root, module, function)}


def test_lib_code_resolves_single_files_of_subpackages(tmp_path):
    _package(tmp_path, {"a.py": "from .sub import x\nimport encoder_study.c\n", "b.py": "",
                        "c.py": "import os\n", "sub/__init__.py": "", "sub/x.py": "from .. import b\n",
                        "sub/y.py": "from .. import c\n"})
    assert _code(tmp_path, "encoder_study.a") == {
        "__init__.py", "cli.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/x.py"}  # not sub/y.py


def test_lib_code_of_a_subcommand_is_what_its_function_reaches(tmp_path):
    _package(tmp_path, {
        "commands/__init__.py": "",
        "commands/tagging.py": ("import argparse\nfrom .. import tables\n\n"
                                "def parser():\n    return argparse.ArgumentParser()\n\n"
                                "def _shared():\n    from .. import files\n\n"
                                "def train(args):\n    from ..tagging import runs\n    _shared()\n\n"
                                "def step_time(args):\n    from .. import reference\n"),
        "tables.py": "", "files.py": "", "reference.py": "from . import tiny\n", "tiny.py": "",
        "tagging/__init__.py": "", "tagging/runs.py": "from . import train\n", "tagging/train.py": ""})
    common = {"__init__.py", "cli.py", "commands/__init__.py", "commands/tagging.py", "tables.py"}
    assert _code(tmp_path, "encoder_study.commands.tagging", "train") == common | {
        "files.py", "tagging/__init__.py", "tagging/runs.py", "tagging/train.py"}
    step_time = _code(tmp_path, "encoder_study.commands.tagging", "step_time")
    assert step_time == common | {"reference.py", "tiny.py"}
    with pytest.raises(KeyError, match="gather"):
        deps.code_files(tmp_path, "encoder_study.commands.tagging", "gather")


# Code that has nothing to do with training a tagger: editing any of it must not retrain one.
NOT_TAGGING = ("recipes/parity/parity.py", "recipes/parity/parity_tables.py", "recipes/export/export.py",
               "recipes/export/acquire.py", "encoders/tiny.py", "onnx/patch.py",
               "recipes/writeback/__init__.py", "encoders/compare.py", "recipes/retrieval/export.py",
               "recipes/student/distill.py", "data/synthetic.py", "recipes/tagging/steptime.py",
               "recipes/parity/command.py")


@pytest.mark.parametrize("subcommand", ["train", "baseline", "tables"])
def test_a_tagger_does_not_depend_on_unrelated_code(subcommand):
    files = {Path(p).relative_to(ROOT / "workflow/lib/encoder_study").as_posix()
             for p in deps.code_files(ROOT / "workflow/lib", cli.COMMANDS["tagging"], subcommand)}
    assert "recipes/tagging/command.py" in files
    assert not files & set(NOT_TAGGING), files & set(NOT_TAGGING)


def _recipes_in_readme() -> list[str]:
    """The first column of the README's recipe table."""
    text = (ROOT / "README.md").read_text()
    table = text.split("| recipe |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [line.split("|")[1].strip().strip("`") for line in table]


RECIPES = _recipes_in_readme()


def test_readme_recipes_are_rule_files_commands_and_targets(dry_runs):
    from encoder_study import cli

    recipes = RECIPES
    assert recipes == ["export", "parity", "student", "tagging", "writeback", "retrieval"]
    for recipe in recipes:
        assert (ROOT / f"workflow/rules/{recipe}.smk").is_file(), recipe
        assert cli.COMMANDS[recipe] == f"encoder_study.recipes.{recipe}.command"
        assert (ROOT / f"workflow/lib/encoder_study/recipes/{recipe}/command.py").is_file(), recipe
        rules = (ROOT / f"workflow/rules/{recipe}.smk").read_text()
        assert f"\nrule {recipe}:\n" in rules, f"{recipe}.smk has no target rule named {recipe}"
        names = [line.split()[1].rstrip(":") for line in rules.splitlines()
                 if line.strip().startswith("rule ")]
        assert all(n == recipe or n.startswith(f"{recipe}_") for n in names), names
    result = dry_runs["recipes"]  # a dry run of every recipe together
    assert result.returncode == 0, result.stderr


def test_the_real_data_config_resolves_with_local_copies(dry_runs):
    """config/ewt-minilm.yaml as an offline user runs it: local treebank files with their SHA-256."""
    result, tmp_path = dry_runs["ewt"], dry_runs["folder"]
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for split in ("train", "dev", "test"):
        assert f"file://{tmp_path}/en_ewt-ud-{split}.conllu" in out
    assert "rule parity_fetch:" not in out  # local text sources are read in place
    for run in ("minilm-frozen-mean", "minilm-frozen-first", "minilm-finetuned"):
        assert f"results/tagging/{run}/scores.csv" in out
    assert "--lr 5e-05" in out and "--epochs 1" in out  # the study's fine-tuning settings
    assert "results/treebank/pud.conllu" in out and "results/tagging/minilm-finetuned/pud.pred.conllu" in out


def test_all_exports_with_manifest_and_provenance(small_workflow):
    for name in ("model.onnx", "tokenizer.json", "model.config.json", "export.json"):
        assert (small_workflow / "results/models/mmbert-base" / name).is_file()
    joined = (small_workflow / "provenance/export/PROVENANCE.md").read_text()
    assert joined.index("export_acquire (mmbert-base)") < joined.index("export_model (mmbert-base)")
    assert "results/models/mmbert-base/model.onnx" in joined
    for table in ("inference", "trainable", "latency"):
        assert (small_workflow / f"results/parity/{table}.csv").read_text().count("\nmmbert-base,") >= 1
    assert len((small_workflow / "results/texts/parity_texts.jsonl").read_text().splitlines()) == 16
    scores = (small_workflow / "results/tagging/scores.csv").read_text()
    # dev, test and the study's out-of-domain set `pud` (treebank.extra_tests; the rehearsal's stand-in)
    assert scores.count("\nmmbert-frozen-mean,") == 3 and scores.count("\nbaseline,") == 3
    assert ",pud," in scores
    assert (small_workflow / "results/tagging/mmbert-frozen-mean/pud.pred.conllu").is_file()
    comparisons = (small_workflow / "results/tagging/comparisons.csv").read_text()
    assert comparisons.count("mmbert-frozen-mean,baseline") == 3
    assert (small_workflow / "results/tagging/step_time.csv").is_file()


def test_all_ends_with_a_run_crate_that_passes_the_provenance_run_crate_profile(small_workflow, tmp_path):
    from crate_validation import fill_cache, required_issues

    assert required_issues(small_workflow, fill_cache(tmp_path / "contexts")) == []


def test_all_distils_the_student_and_writes_its_fine_tuned_graph_back(small_workflow):
    training = (small_workflow / "results/student/training.csv").read_text().splitlines()
    assert training[0].startswith("step,loss,") and len(training) == 3  # steps 1 and 2, in two chunks
    assert not (small_workflow / "results/checkpoints/student/distill.pt").exists()  # removed once done
    parity = (small_workflow / "results/student/parity.csv").read_text()
    assert "trainable vs transformers" in parity and "graph runtime vs transformers" in parity
    scores = (small_workflow / "results/tagging/scores.csv").read_text()
    assert scores.count("\nstudent-finetuned,") == 3
    assert (small_workflow / "results/writeback/student-finetuned/pipeline.encoder0.onnx").is_file()
    header, row = (small_workflow / "results/writeback/agreement.csv").read_text().splitlines()[:2]
    assert dict(zip(header.split(","), row.split(","), strict=True))["differing_tokens"] == "0"
    for recipe in ("student", "writeback"):
        assert (small_workflow / f"provenance/{recipe}/PROVENANCE.md").is_file()


def test_fragments_name_the_weights_read_without_dot_dot_and_one_environment(small_workflow):
    from encoder_study.core import files
    from encoder_study.provenance.records import record_name, records_under

    found = records_under(small_workflow / "provenance")
    records = {record_name(r): r for _, r in found}
    paths = [e["path"] for r in records.values() for e in r["files"]]
    assert paths and not [p for p in paths if ".." in Path(p).parts]
    weights = "results/sources/mmbert-base/model/model.safetensors"
    for job in ("export/export_model-mmbert-base", "parity/parity_compare-mmbert-base"):
        inputs = {e["path"]: e["sha256"] for e in records[job]["files"] if e["role"] == "input"}
        assert inputs[weights] == files.sha256_file(small_workflow / weights), job
    pipeline = records["writeback/writeback_pipeline-student-finetuned"]
    assert "results/models/student/model.onnx" in [e["path"] for e in pipeline["files"]]
    environments = {(r["environment"]["path"], r["environment"]["sha256"]) for r in records.values()}
    assert len(environments) == 1  # one environment file for the whole run
    path, digest = environments.pop()
    assert path == f"provenance/environments/{digest}.json" and (small_workflow / path).is_file()


def test_second_run_does_nothing(small_workflow):
    result = snakemake("-n", "--cores", "2", "all", cwd=small_workflow)
    assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr


_REPORTS: dict[tuple, tuple] = {}  # one report per workflow, name and arguments, made once


def _report(workflow: Path, name: str, *args: str) -> tuple[set[str], dict, str, str]:
    """`snakemake --report <name>` in `workflow`: the archive's names, the results as Snakemake embeds them
    in its page (path -> name, caption, data_uri, ...), its landing page (the workflow's description) and
    the HTML scores page."""
    if (workflow, name, args) not in _REPORTS:
        _REPORTS[workflow, name, args] = _make_report(workflow, name, *args)
    return _REPORTS[workflow, name, args]


def _make_report(workflow: Path, name: str, *args: str) -> tuple[set[str], dict, str, str]:
    import zipfile

    result = snakemake("--report", name, *args, cwd=workflow)
    assert result.returncode == 0, result.stdout + result.stderr
    root = Path(name).stem  # the archive's folder: Snakemake names it after the file
    with zipfile.ZipFile(workflow / name) as archive:
        names = set(archive.namelist())
        page = archive.read(f"{root}/report.html").decode()
        at = page.index("var results = ", page.index('<script id="results">')) + len("var results = ")
        results, _ = json.JSONDecoder().raw_decode(page, at)
        at = page.index("var workflow_desc = ") + len("var workflow_desc = ")
        landing, _ = json.JSONDecoder().raw_decode(page, at)
        scores = archive.read(f"{root}/{results['results/report/tagging/scores.html']['data_uri']}").decode()
    return names, results, landing, scores


def test_report_holds_every_table_and_plot_with_a_caption(small_workflow):
    names, results, landing, scores = _report(small_workflow, "report.zip")
    results_dir = small_workflow / "results"
    # Every table and plot but the sources' and the latency job's rows of each model, which
    # results/parity/latency.csv joins (one job times every model and writes them for the join).
    expected = {p.relative_to(small_workflow).as_posix() for p in results_dir.rglob("*")
                if p.suffix in (".csv", ".png", ".html") and not p.is_relative_to(results_dir / "sources")
                and not p.is_relative_to(results_dir / "parity" / "latency")}
    assert {"results/tagging/scores.csv", "results/report/tagging/scores.html",
            "results/student/training.png", "results/parity/inference.png",
            "results/tagging/dev_upos.png", "results/tagging/scores.png", "results/tagging/comparisons.png",
            "results/tagging/per_tag.png", "results/tagging/per_tag.csv",
            "results/report/tagging/per_tag.html", "results/parity/latency.png",
            "results/writeback/speed.png"} <= expected
    assert expected == set(results), expected ^ set(results)
    for path, entry in results.items():
        assert f"report/{entry['data_uri']}" in names, path
        # How it was computed, and the run's own settings (report_facts), every one recorded.
        caption = entry["caption"]
        assert "Method:" in caption and "<strong>Recorded</strong> (from the run" in caption, path
        assert "not recorded in this run" not in caption, path
    assert "synthetic treebank" in results["results/tagging/scores.csv"]["caption"]
    # The student's corpus in words: the rehearsal's stand-ins of paper.yaml's streamed corpora.
    corpora = ("on streamed corpora: HuggingFaceFW/fineweb-2 (fra_Latn, rus_Cyrl, local stand-ins), "
               "wikimedia/wikipedia (20231101.en, local stand-ins)")
    assert corpora in results["results/student/training.png"]["caption"]
    assert not [path for path, entry in results.items() if "None and None" in entry["caption"]]
    assert "project's own multilingual sample" in results["results/parity/inference.csv"]["caption"]
    # The scores as a table, each accuracy with its interval in one cell.
    assert "<table>" in scores and "UPOS [95% CI]" in scores
    # The landing page: the study, the headline tables, the run's digest and its config file.
    digest = (small_workflow / "ro-crate-metadata.sha256").read_text().split()[0]
    assert "The encoder study: this run" in landing and "mmbert-frozen-mean - baseline" in landing
    assert digest in landing and "config/config.yaml" in landing


def test_report_captions_are_the_runs_whatever_the_config(small_workflow, tmp_path):
    """The captions and the landing page say what ran, not what the config `--report` is given says."""
    other = tmp_path / "other.yaml"
    other.write_text("tagging: {bootstrap: {resamples: 500, seed: 7}}\nexport: {tolerance: 0.5}\n"
                     "texts: {seed: 3}\n")
    _, ran, ran_landing, _ = _report(small_workflow, "report.zip")  # the previous test's
    _, told, told_landing, _ = _report(small_workflow, "told.zip", "--configfile", str(other))
    assert {p: e["caption"] for p, e in told.items()} == {p: e["caption"] for p, e in ran.items()}
    assert told_landing == ran_landing
    assert "1,000 sentence resamples" in ran["results/tagging/scores.csv"]["caption"]


@pytest.mark.parametrize("cores, cpus", [("1", None), ("5", "0"), (None, None)])
def test_a_finished_run_stays_finished_whatever_the_cores(small_workflow, cores, cpus):
    """Host facts (--cores, the cores the machine offers) decide no rerun."""
    args = ["-n", "all"] + (["--cores", cores] if cores else [])
    if cpus is None:
        result = snakemake(*args, cwd=small_workflow)
    else:  # the machine as a 1-core one: taskset narrows the CPU affinity Snakemake reads
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
        result = subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "snakemake", *args],
                                cwd=small_workflow, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout


def test_verify_passes_then_catches_a_changed_output(small_workflow):
    ok = snakemake("--cores", "1", "verify", cwd=small_workflow)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    table = small_workflow / "results/models/mmbert-base/model.config.json"
    original = table.read_bytes()
    table.write_bytes(original + b"\n")
    try:
        bad = snakemake("--cores", "1", "verify", cwd=small_workflow)
        assert bad.returncode != 0
        assert "model.config.json changed" in (small_workflow / "logs/provenance/verify.log").read_text()
    finally:
        table.write_bytes(original)


# Runs after verify: it reruns the export recipe alone, which leaves the run crate (built by `all`)
# describing the export jobs' earlier fragments, as verify would then say.
def test_changing_a_package_module_reruns_its_users(small_workflow):
    # A code input is the module's code stamp (docs/reruns.md): a comment reruns nothing, code does.
    module = small_workflow / "workflow/lib/encoder_study/onnx/manifest.py"
    module.write_text(module.read_text() + "\n_EDITED = True  # an edit\n")
    result = snakemake("-n", "--cores", "2", "all", cwd=small_workflow)
    out = result.stdout
    assert result.returncode == 0
    assert "rule export_model:" in out and "rule export_acquire:" not in out  # acquire does not import it
    assert "rule parity_select:" not in out  # the text selection does not import manifest
    result = snakemake("--cores", "2", "export", cwd=small_workflow)
    assert result.returncode == 0, result.stderr
