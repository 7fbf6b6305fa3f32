"""Recipe `preflight` (outside `all`): before the first cluster job, everything the study will meet first,
checked on the submitting host in seconds to minutes, without downloading any weights.

A check is one row: what was checked, where, what was found, and a status: `ok`, `warning` (runs,
but says something the user should act on, e.g. a download without a SHA-256 pin), `fail` (the study
would stop there), or `skipped` (not checked, and why: a host that already failed once is not asked
again, so an offline run ends in seconds with one line per host). The table goes to
`results/preflight/preflight.{md,json}`; `verdict` names each failure in one line and fails.

Modules: `remote` (the few HTTP calls: the Hub's API and file HEADs, any URL's HEAD, PyPI's JSON),
`plan` (which checks a config asks for: models, streams, URLs, disk, software, cluster), `device`
(the device check: one training step of each kind at the study's sizes, on the device the config names).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from ...core import files
from ...core.errors import UserError
from ...core.tables import markdown_table

STATUSES = ("ok", "warning", "fail", "skipped")
TABLE_FORMAT = "encoder-study preflight 1"


class PreflightError(UserError):
    """The preflight found what would stop the study; the message names each failure in one line."""


@dataclass(frozen=True)
class Check:
    what: str    # the kind and the name: "hub model xlm-roberta-base", "url treebank.train"
    where: str   # the repository at its revision, the URL, the path
    found: str   # what the check saw (a size, a commit, the reason it failed)
    status: str  # one of STATUSES
    host: str = ""  # the network host the check asked ("" when none): one failure line per host

    def line(self) -> str:
        return f"{self.status.upper()}: {self.what} ({self.where}): {self.found}"


def write(checks: list[Check], json_path: str | os.PathLike, markdown_path: str | os.PathLike,
          about: str) -> str:
    """The table as JSON and Markdown (each written whole or not at all); the Markdown's text."""
    rows = [(c.what, c.where, c.found, c.status) for c in checks]
    text = f"# Preflight\n\n{about}\n\n" + markdown_table(["what", "where", "found", "ok"], rows)
    files.write_json(json_path, {"format": TABLE_FORMAT, "about": about,
                                 "checks": [asdict(c) for c in checks]})
    files.write_text(markdown_path, text)
    return text


def read(json_path: str | os.PathLike) -> list[Check]:
    data = files.read_json(json_path, "preflight table", files.rebuild(json_path), kind=dict,
                           error=PreflightError)
    if data.get("format") != TABLE_FORMAT:
        raise PreflightError(f"{json_path}: not a preflight table (format {data.get('format')!r}); "
                             f"{files.rebuild(json_path)}")
    return [Check(**row) for row in data["checks"]]


def failures(checks: list[Check]) -> list[str]:
    """One line per failure: per unreachable host once (its other checks were skipped), then the rest."""
    lines, hosts = [], set()
    for check in checks:
        if check.status != "fail":
            continue
        if check.host and check.found.startswith("host unreachable"):
            if check.host in hosts:
                continue
            hosts.add(check.host)
            skipped = sum(1 for c in checks if c.host == check.host and c.status == "skipped")
            lines.append(f"{check.host}: {check.found.removeprefix('host unreachable: ')} (first asked for "
                         f"{check.what}, {check.where}; {skipped} more check(s) of this host skipped)")
            continue
        lines.append(f"{check.what} ({check.where}): {check.found}")
    return lines


def summary(checks: list[Check]) -> str:
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no checks"

