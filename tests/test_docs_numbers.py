"""Numbers the docs state that the code can check: the rehearsal's job count (a dry run) and the
trainable parity's batch tolerance. A change that moves them fails here until the docs follow."""

import re

from conftest import ROOT, snakemake
from encoder_study.recipes.parity import parity


def test_the_rehearsals_job_count_is_a_dry_runs():
    text = (ROOT / "docs" / "full-study.md").read_text(encoding="utf-8")
    stated = int(re.search(r"\((\d+) jobs in a dry run now", text).group(1))
    # --forceall: every job, also in a checkout whose run has finished
    dry = snakemake("-n", "--forceall", "all", "--configfile", "config/paper.yaml", "config/rehearsal.yaml")
    assert dry.returncode == 0, dry.stderr
    planned = int(re.search(r"^total\s+(\d+)$", dry.stdout + dry.stderr, re.M).group(1))
    assert stated == planned, f"docs/full-study.md says {stated} jobs; a dry run plans {planned}"


def test_the_batch_tolerance_the_docs_give_is_the_codes():
    text = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    stated = float(re.search(r"`BATCH_TOLERANCE` = ([0-9.e-]+)", text).group(1))
    assert stated == parity.BATCH_TOLERANCE
    assert "bit for bit" not in text.split("`trainable.csv`", 1)[1].split(")", 1)[0]


def test_the_rehearsal_table_gives_paper_yamls_requests_each_over_its_peak():
    """docs/full-study.md's per-rule table: its `paper.yaml mem_mb` column is what paper.yaml asks (its
    rule's entry, else the default), and each request holds the peak beside it with the 1.5 margin."""
    import yaml

    text = (ROOT / "docs" / "full-study.md").read_text(encoding="utf-8")
    resources = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text(encoding="utf-8"))["resources"]
    header = "| rule | jobs | peak MB | longest job (s) | paper.yaml mem_mb | peak grows with |"
    rows = text.split(header, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
    assert len(rows) >= 10
    for row in rows:
        rule, _, peak, _, asked, _ = (cell.strip() for cell in row.strip("|").split("|"))
        wanted = resources.get(rule, resources["default"]).get("mem_mb", resources["default"]["mem_mb"])
        assert int(asked.replace(",", "")) == wanted, f"{rule}: the docs say {asked}, paper.yaml {wanted}"
        assert wanted >= 1.5 * int(peak.replace(",", "")), f"{rule}: {wanted} MB < 1.5 x peak {peak}"
