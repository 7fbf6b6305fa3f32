"""The README's commands are the ones CI runs, and the code stays lint-clean."""

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def _bash_blocks(text: str) -> list[str]:
    return [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]


def test_ci_runs_the_readme_test_command():
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    test_command = next(b for b in blocks if b.endswith(".venv/bin/pytest"))
    assert test_command in (ROOT / ".ci/run").read_text().splitlines()
    assert any(b.endswith("snakemake --cores 8 all") and b.startswith("python3.11 -m venv") for b in blocks)


def test_ruff_is_clean():
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "workflow/lib", "tests"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
