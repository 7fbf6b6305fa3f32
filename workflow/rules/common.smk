# Helpers shared by the stage files: package code as inputs, provenance paths, recipe bookkeeping.
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# The package's dependency walker uses the standard library only, so it imports in any environment.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "lib"))
from encoder_study.deps import code_files

LIB_ROOT = Path("workflow/lib")

# Jobs find `encoder-study` beside the Python that runs Snakemake, so `.venv/bin/snakemake` works
# without activating the environment (with --sdm conda the job's own environment comes first).
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
CONDA_ENV = "../../envs/workflow.yaml"
MACHINE_CORES = os.cpu_count() or 1


def _workflow_cores():
    try:
        return int(workflow.cores)
    except (WorkflowError, TypeError):  # no --cores given (e.g. --lint)
        return MACHINE_CORES


CORES = _workflow_cores()
# Locally, --cores may exceed the machine's cores (the README's `--cores 8` on a 2-core machine). Each
# thread a job runs then claims several of Snakemake's slots, so that jobs never run more threads at
# once than the machine has: oversubscribed PyTorch runs several times slower.
SLOTS_PER_THREAD = max(1, -(-CORES // MACHINE_CORES)) if workflow.local_exec else 1

# recipe -> fragments in the order the workflow makes them; each rule file appends its own.
RECIPES = {}


def lib_code(command, subcommand=None):
    """The package files `encoder-study <command> <subcommand>` runs: a change to any reruns the rule."""
    dotted = f"encoder_study.commands.{command}"
    if not (LIB_ROOT / "encoder_study" / "commands" / f"{command}.py").exists():
        dotted = f"encoder_study.{command}"  # TRANSITIONAL: modules not yet moved under commands/
    return code_files(LIB_ROOT, dotted, subcommand.replace("-", "_") if subcommand else None)


def prov(recipe, rule, wildcards=""):
    """Where a job writes its fragment: provenance/<recipe>/<rule>[-<wildcards>].md."""
    stem = f"{rule}-{wildcards}" if wildcards else rule
    return f"provenance/{recipe}/{stem}.md"


def register(recipe, fragments):
    RECIPES.setdefault(recipe, []).extend(fragments)


def recipe_target(recipe):
    return f"provenance/{recipe}/PROVENANCE.md"


def threads_for(rule):
    """Threads a job of `rule` runs: the config's, capped by --cores and, locally, the machine."""
    wanted = int(config["threads"].get(rule, config["threads"]["default"]))
    return max(1, min(wanted, CORES, MACHINE_CORES if workflow.local_exec else CORES))


def slots_for(rule, threads=None):
    """Snakemake's `threads:` for a job that runs `threads` (default: threads_for(rule)) threads."""
    return min(CORES, (threads or threads_for(rule)) * SLOTS_PER_THREAD)


def resources_for(rule, key):
    table = config["resources"]
    return table.get(rule, {}).get(key, table["default"].get(key, 0))


def _model_specs(entries):
    specs = {}
    for entry in entries:
        if entry["name"] in specs:
            raise WorkflowError(f"config: models lists '{entry['name']}' twice; names must be unique")
        specs[entry["name"]] = entry
    return specs


MODEL_SPECS = _model_specs(config["models"])
MODELS = sorted(MODEL_SPECS)
# The distilled student is a model too (tagging runs may name it), built by the student recipe.
STUDENT = config["student"]["name"]
if STUDENT in MODEL_SPECS:
    raise WorkflowError(f"config: student.name '{STUDENT}' is also in `models`; give the student another name")
if config["student"]["teacher"] not in MODEL_SPECS:
    raise WorkflowError(f"config: student.teacher '{config['student']['teacher']}' is not in `models` "
                        f"(it has: {', '.join(MODELS)})")


def is_download(name):
    return re.match(r"^https?://", config["texts"][name]) is not None


def text_source(name):
    """The local file (or directory) a text source is read from: fetched by rule fetch_texts if a URL."""
    location = config["texts"][name]
    if is_download(name):
        return f"results/texts/sources/{name}{url_suffix(location)}"
    return location[len("file://"):] if location.startswith("file://") else location


def text_source_files(name):
    """Inputs of a text source: every file of a directory, so that editing one reruns the selection."""
    path = Path(text_source(name))
    if not is_download(name) and path.is_dir():
        return sorted(str(p) for p in path.rglob("*") if p.is_file())
    return [str(path)]


def url_suffix(url):
    name = url.rsplit("/", 1)[-1]
    for suffix in (".tar.bz2", ".tar.gz", ".zip", ".csv", ".tsv"):
        if name.endswith(suffix):
            return suffix
    return Path(name).suffix


def model_files(model):
    """The files of an export (graph, tokenizer, config, manifest) and the source it came from."""
    files = [f"results/models/{model}/{name}"
             for name in ("model.onnx", "tokenizer.json", "model.config.json", "export.json")]
    return files if model == STUDENT else files + [f"results/sources/{model}/source.json"]


def _runs(entries):
    runs = {}
    for entry in entries:
        if entry["name"] in runs:
            raise WorkflowError(f"config: tagging.runs lists '{entry['name']}' twice; names must be unique")
        if entry["model"] not in MODEL_SPECS and entry["model"] != STUDENT:
            raise WorkflowError(f"config: tagging run '{entry['name']}' names model '{entry['model']}', "
                                f"which is neither in `models` ({', '.join(MODELS)}) nor the student ('{STUDENT}')")
        runs[entry["name"]] = entry
    return runs


def run_options(run):
    """A run's training settings as `encoder-study tag train` options (absent ones take its defaults)."""
    flags = [f"--mode {run['mode']}", f"--pooling {run['pooling']}"]
    for key in ("lr", "epochs", "max_steps", "warmup", "batch_words", "eval_every", "chunk_steps",
                "max_length"):
        if key in run:
            flags.append(f"--{key.replace('_', '-')} {run[key]}")
    if run.get("train_embeddings"):
        flags.append("--train-embeddings")
    return " ".join(flags)


def acquire_inputs(wildcards):
    """A tiny model's architecture file is an input: editing it rebuilds the model."""
    spec = MODEL_SPECS[wildcards.model]
    arch = [spec["architecture"]] if spec["source"] == "tiny" else []
    return {"code": lib_code("acquire"), "architecture": arch}


RUNS = _runs(config["tagging"]["runs"])
RUN_NAMES = sorted(RUNS)
for _a, _b in config["tagging"]["comparisons"]:
    for _name in (_a, _b):
        if _name != "baseline" and _name not in RUNS:
            raise WorkflowError(f"config: tagging.comparisons names '{_name}', which is not a run")


# -- the student recipe ---------------------------------------------------------------------------

STUDENT_CFG = config["student"]
STUDENT_DIR = f"results/models/{STUDENT}"
STUDENT_WEIGHTS = "results/student/student.pt"


def student_corpus_inputs(wildcards):
    """The embedded corpus's files (the texts section's sources); streamed datasets have none."""
    if STUDENT_CFG["corpus"]["source"] != "texts":
        return []
    return text_source_files("tatoeba") + text_source_files("udhr")


def student_corpus_options():
    corpus = STUDENT_CFG["corpus"]
    if corpus["source"] == "texts":
        return f"--tatoeba {shlex.quote(text_source('tatoeba'))} --udhr {shlex.quote(text_source('udhr'))}"
    options = f"--streams {shlex.quote(json.dumps(corpus['streams'], sort_keys=True))}"
    if corpus.get("amounts"):
        options += f" --amounts {shlex.quote(json.dumps(corpus['amounts'], sort_keys=True))}"
    return options


def student_launcher():
    """One process runs the command itself; several run it under torchrun (data parallel)."""
    processes = int(STUDENT_CFG["processes"])
    if processes == 1:
        return "encoder-study"
    return f"PYTHONHASHSEED=0 torchrun --standalone --nproc-per-node {processes} -m encoder_study.cli"
