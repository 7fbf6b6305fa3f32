"""Numbers the docs state that the code can check: the rehearsal's job count (a dry run) and the
trainable parity's batch tolerance. A change that moves them fails here until the docs follow."""

import re

from conftest import ROOT, snakemake
from encoder_study.recipes.parity import parity


def test_the_rehearsals_job_count_is_a_dry_runs():
    text = (ROOT / "docs" / "full-study.md").read_text(encoding="utf-8")
    stated = int(re.search(r"\((\d+) jobs in a dry run now", text).group(1))
    dry = snakemake("-n", "all", "--configfile", "config/paper.yaml", "config/rehearsal.yaml")
    assert dry.returncode == 0, dry.stderr
    planned = int(re.search(r"^total\s+(\d+)$", dry.stdout + dry.stderr, re.M).group(1))
    assert stated == planned, f"docs/full-study.md says {stated} jobs; a dry run plans {planned}"


def test_the_batch_tolerance_the_docs_give_is_the_codes():
    text = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    stated = float(re.search(r"`BATCH_TOLERANCE` = ([0-9.e-]+)", text).group(1))
    assert stated == parity.BATCH_TOLERANCE
    assert "bit for bit" not in text.split("`trainable.csv`", 1)[1].split(")", 1)[0]
