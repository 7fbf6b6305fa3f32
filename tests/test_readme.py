"""The README's commands are the ones CI runs, the links of the README and docs/ resolve, and the code
stays lint-clean."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def _bash_blocks(text: str) -> list[str]:
    return [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]


def test_ci_runs_the_readme_test_command():
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    test_command = next(b for b in blocks if ".venv/bin/pytest" in b)
    assert test_command in (ROOT / ".ci/run").read_text().splitlines()
    assert any(b.endswith("snakemake --cores 8 all") and b.startswith("python3.11 -m venv") for b in blocks)


def test_ruff_is_clean():
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "workflow/lib", "tests"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def _anchor(heading: str) -> str:
    """GitHub's id for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def test_links_between_readme_and_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.is_file() or (anchor and anchor not in _anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name})" not in readme]
    assert not unlinked, unlinked


@pytest.mark.parametrize("heading, anchor", [
    (" Two commands (a fresh machine with Python 3.11)", "two-commands-a-fresh-machine-with-python-311"),
    ("Before the cluster: rehearse the full study", "before-the-cluster-rehearse-the-full-study"),
    ("The `benchmarks` recipe", "the-benchmarks-recipe"),
])
def test_anchor_matches_githubs_ids(heading, anchor):
    assert _anchor(heading) == anchor


def test_the_recipe_table_names_the_steps_its_rule_file_runs():
    """Each row's `encoder-study <recipe> a|b|c` is what its rule file's rules run, no more and no fewer."""
    rows = re.findall(r"^\| `(\w+)` \| `(workflow/rules/\w+\.smk)` \| `encoder-study (\w+) ([^`]+)` \|",
                      (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    assert len(rows) >= 6
    for recipe, rule_file, command, listed in rows:
        run = set(re.findall(rf"encoder-study {command} ([a-z-]+)", (ROOT / rule_file).read_text()))
        assert recipe == command and sorted(listed.replace("\\|", "|").split("|")) == sorted(run), recipe
