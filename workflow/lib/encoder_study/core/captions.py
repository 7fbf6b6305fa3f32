"""The report's captions: each source under workflow/report/ says what its table or plot is and how it
was made, and ends with one line naming the recorded facts it cites:

    Recorded: splits |splits|; |bootstrap|.
    Recorded (see provenance/rehearsal/rehearsal_resources.md): models: |models|.

`compose` turns that line into the block every caption shares: the run's settings page's facts when the
report has it, else where each job's settings are (`provenance/<recipe>/PROVENANCE.md`, or the path in
parentheses). The block is spelled here once; `result()` in workflow/rules/common.smk writes each
composed caption under .snakemake/encoder-study/captions/ for Snakemake's report. Standard library only:
the Snakefile imports it.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UserError
from .files import write_text

SETTINGS_PAGE = "results/report/run_settings.html"
_LINE = re.compile(r"^Recorded(?: \(see (?P<where>[^)\s]+)\))?: (?P<facts>.+)$", re.M)
BLOCK = """{{% for page in files if page.path|string == "{page}" %}}
.. include:: results/report/settings.rst

**Recorded** (from the run's provenance fragments, not from the config this report was built with): {facts}
{{% else %}}
**Recorded:** not shown: this report was built without the run's settings page (``{page}``, made by \
``all``); each job's settings are in ``{where}``.
{{% endfor %}}
"""


def compose(text: str, recipe: str, source: str = "a caption") -> str:
    """The caption with its `Recorded:` line made the shared block (see the module docstring)."""
    found = list(_LINE.finditer(text))
    if len(found) != 1:
        raise UserError(f"{source}: {len(found)} 'Recorded: ...' lines; a caption ends with exactly one, "
                        "naming the recorded facts it cites")
    line = found[0]
    where = line["where"] or f"provenance/{recipe}/PROVENANCE.md"
    block = BLOCK.format(page=SETTINGS_PAGE, facts=line["facts"], where=where)
    return text[: line.start()] + block + text[line.end():].lstrip("\n")


def composed(source: Path, recipe: str, target: Path) -> Path:
    """Write the composed caption of `source` to `target` when it differs from what is there."""
    text = compose(source.read_text(encoding="utf-8"), recipe, str(source))
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        write_text(target, text)
    return target
