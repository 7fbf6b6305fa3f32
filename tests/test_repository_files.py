"""The files that let others cite and reuse the workflow: licence, citation, changelog, pre-commit."""

import re

import yaml

import encoder_study
from conftest import ROOT


def test_citation_is_cff_1_2_0_with_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    # The keys CFF 1.2.0 requires, and the shapes its schema gives them.
    assert cff["cff-version"] == "1.2.0"
    assert isinstance(cff["message"], str) and cff["message"]
    assert isinstance(cff["title"], str) and cff["title"]
    assert cff["authors"] and all(a.get("name") or a.get("family-names") for a in cff["authors"])
    assert cff["type"] in ("software", "dataset")
    assert str(cff["version"]) == encoder_study.__version__
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert cff["license"] == "MIT" and license_text.startswith("MIT License")
    allowed = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi",
               "identifiers", "keywords", "license", "license-url", "message", "preferred-citation",
               "references", "repository", "repository-artifact", "repository-code", "title", "type", "url",
               "version"}
    assert set(cff) <= allowed, set(cff) - allowed


def test_licenses_name_every_source_the_configs_use():
    text = (ROOT / "LICENSES.md").read_text(encoding="utf-8")
    for name, licence in (("UD English-EWT", "CC BY-SA 4.0"), ("Tatoeba", "CC BY 2.0 FR"), ("UDHR", "OHCHR"),
                          ("all-MiniLM-L6-v2", "Apache-2.0"), ("xlm-roberta-base", "MIT"),
                          ("mmBERT-base", "MIT"), ("bge-m3", "MIT")):
        row = next((line for line in text.splitlines() if name in line and line.startswith("|")), "")
        assert licence in row, (name, licence)
    assert ".pred.conllu" in text
    paper = (ROOT / "config" / "paper.yaml").read_text(encoding="utf-8")
    for repo in re.findall(r"repo: (\S+)", paper):
        assert repo.split("/")[1].lower() in text.lower(), repo


def test_changelog_lists_every_version_newest_first_from_this_one():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, re.MULTILINE)
    numbers = [tuple(int(part) for part in v.split(".")) for v in versions]
    assert versions[0] == encoder_study.__version__ and versions[-1] == "0.1.0"
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)  # newest first


def test_pre_commit_runs_ruff_at_the_tested_version_snakemake_lint_and_a_yaml_check():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    repos = {r["repo"]: r for r in config["repos"]}
    pinned = re.search(r"^ruff==(\S+)$", (ROOT / "envs" / "test.txt").read_text(), re.MULTILINE)[1]
    assert repos["https://github.com/astral-sh/ruff-pre-commit"]["rev"] == f"v{pinned}"
    for repo in config["repos"]:
        assert repo["repo"] == "local" or re.fullmatch(r"v\d+\.\d+\.\d+", repo["rev"]), repo
    hooks = {h["id"]: h for r in config["repos"] for h in r["hooks"]}
    assert {"ruff", "check-yaml", "snakemake-lint"} <= set(hooks)
    lint = hooks["snakemake-lint"]
    assert lint["entry"] == "snakemake --lint" and lint["pass_filenames"] is False
