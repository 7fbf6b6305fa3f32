"""A recipe's PROVENANCE.md: its fragments joined in the order the workflow runs them."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..core import files


def join(recipe: str, fragments: list[str | os.PathLike], target: str | os.PathLike) -> None:
    """Write a recipe's PROVENANCE.md: a contents list, then every fragment in the order given."""
    fragments = [Path(f) for f in fragments]
    parts = [
        f"# Provenance of the `{recipe}` recipe\n\n",
        "Fragments in the order the workflow runs them; `snakemake --cores 1 verify` (or `encoder-study "
        "provenance verify --root provenance --base .`) re-hashes every file they name.\n\n",
        "".join(f"- [{f.stem}](#{f.stem.lower()})\n" for f in fragments),
    ]
    for f in fragments:
        body = f.read_text(encoding="utf-8")
        # Demote headings one level so the recipe's title stays the only top-level heading.
        body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE)
        parts += ["\n", f'<a id="{f.stem.lower()}"></a>\n\n', body]
    files.write_text(target, "".join(parts))

