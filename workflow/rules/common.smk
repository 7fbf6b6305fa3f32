# Helpers shared by the stage files: package code as inputs, provenance paths, recipe bookkeeping.
import json
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# The package's dependency walker uses the standard library only, so it imports in any environment.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "lib"))
from encoder_study.deps import code_files

LIB = Path("workflow/lib/encoder_study")

# Jobs find `encoder-study` beside the Python that runs Snakemake, so `.venv/bin/snakemake` works
# without activating the environment (with --sdm conda the job's own environment comes first).
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
CONDA_ENV = "../../envs/workflow.yaml"
CORES = workflow.cores if isinstance(workflow.cores, int) else (os.cpu_count() or 1)

# recipe -> fragments in the order the workflow makes them; each rule file appends its own.
RECIPES = {}


def lib_code(module):
    """The package files a command runs (the module and its imports): a change to any reruns the rule."""
    return code_files(LIB, module)


def prov(recipe, rule, wildcards=""):
    """Where a job writes its fragment: provenance/<recipe>/<rule>[-<wildcards>].md."""
    stem = f"{rule}-{wildcards}" if wildcards else rule
    return f"provenance/{recipe}/{stem}.md"


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


def _model_specs(entries):
    specs = {}
    for entry in entries:
        if entry["name"] in specs:
            raise WorkflowError(f"config: models lists '{entry['name']}' twice; names must be unique")
        specs[entry["name"]] = entry
    return specs


MODEL_SPECS = _model_specs(config["models"])
MODELS = sorted(MODEL_SPECS)


def acquire_inputs(wildcards):
    """A tiny model's architecture file is an input: editing it rebuilds the model."""
    spec = MODEL_SPECS[wildcards.model]
    arch = [spec["architecture"]] if spec["source"] == "tiny" else []
    return {"code": lib_code("acquire"), "architecture": arch}
