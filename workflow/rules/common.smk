# Helpers shared by every rule file: package code as inputs, provenance paths, recipe bookkeeping.
import ast
import json
import re
import sys
import os
from pathlib import Path

LIB = Path("workflow/lib/encoder_study")

# Jobs find `encoder-study` beside the Python that runs Snakemake, so `.venv/bin/snakemake` works
# without activating the environment (with --sdm conda the job's own environment comes first).
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
CONDA_ENV = "../../envs/workflow.yaml"
CORES = workflow.cores if isinstance(workflow.cores, int) else (os.cpu_count() or 1)

# recipe -> fragments in the order the workflow makes them; each rule file appends its own.
RECIPES = {}


def _imports(module):
    """Package modules that `module` imports (relative or absolute), read with ast."""
    tree = ast.parse((LIB / f"{module}.py").read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or node.module == "encoder_study":
                names = [node.module] if node.level == 1 and node.module else [a.name for a in node.names]
            elif (node.module or "").startswith("encoder_study."):
                names = [node.module.split(".")[1]]
            else:
                continue
            found.update(n for n in names if (LIB / f"{n}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names
                         if a.name.startswith("encoder_study.") and (LIB / f"{a.name.split('.')[1]}.py").exists())
    return found


def lib_code(module):
    """The package files a command runs: the module, everything it imports, the dispatcher.

    Snakemake does not rerun a rule when an imported module changes; listing these files as
    inputs makes an edit to any of them a rerun trigger (by modification time).
    """
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_imports(name))
    return sorted(str(LIB / f"{n}.py") for n in seen | {"__init__", "cli"})


def prov(recipe, rule, wildcards=""):
    """The fragment path of one rule run: provenance/<recipe>/<rule>[-<wildcards>].md."""
    return f"provenance/{recipe}/{rule}{'-' + wildcards if wildcards else ''}.md"


def register(recipe, fragments):
    RECIPES.setdefault(recipe, []).extend(fragments)


def recipe_target(recipe):
    return f"provenance/{recipe}/PROVENANCE.md"


def threads_for(rule):
    """Threads from the config, capped by the cores the workflow was given."""
    return min(int(config["threads"].get(rule, config["threads"]["default"])), CORES)


def resources_for(rule, key):
    table = config["resources"]
    return table.get(rule, {}).get(key, table["default"][key])


MODELS = sorted(config["models"])


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS),
