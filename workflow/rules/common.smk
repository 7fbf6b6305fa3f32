# Helpers shared by the stage files: package code as inputs, provenance paths, recipe bookkeeping.
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# The dependency walker and these constants use the standard library only: they import in any environment.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "lib"))
from encoder_study.cli import COMMANDS
from encoder_study.data import SPLITS as TREEBANK_SPLITS
from encoder_study.provenance.deps import code_files, code_stamp
from encoder_study.core.files import local_path
from encoder_study.core.machine import cores as machine_cores
from encoder_study.core.captions import composed
from encoder_study.core.results import LANDING, RESULTS
from encoder_study.core.settings import flags
from encoder_study.recipes.tagging.settings import Bootstrap

LIB_ROOT = Path("workflow/lib")
# The dependency walk's parsed files, by content (encoder_study.provenance.deps): it saves every command ~0.5 s.
DEPS_CACHE = Path(".snakemake/encoder-study/deps.json")
# One code stamp per package file (encoder_study.provenance.deps.code_stamp): rewritten only when its code changes.
CODE_STAMPS = Path(".snakemake/encoder-study/code")

# Jobs find `encoder-study` beside the Python that runs Snakemake, so `.venv/bin/snakemake` works
# without activating the environment (with --sdm conda the job's own environment comes first).
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
CONDA_ENV = "../../envs/workflow.yaml"
MACHINE_CORES = machine_cores()


def _workflow_cores():
    try:
        return int(workflow.cores)
    except (WorkflowError, TypeError):  # no --cores given (e.g. --lint)
        return MACHINE_CORES


CORES = _workflow_cores()
# Locally, --cores may exceed the machine's cores (the README's `--cores 8` on a 2-core machine):
# jobs would then run more threads at once than the machine has, and oversubscribed PyTorch runs
# several times slower. So locally the scheduler's core budget is the machine's; Snakemake then also
# caps each job's {threads} to it. Neither is a rerun trigger, so a finished run stays finished on a
# machine with other cores (the threads a job *asks* for, from the config, are what it records).
# A cluster run (--jobs, which a local run turns into --cores) keeps its budget: the jobs run elsewhere.
if workflow.local_exec and workflow.nodes is None and CORES > MACHINE_CORES:
    workflow.global_resources["_cores"] = MACHINE_CORES

# The intervals' bootstrap (tagging.bootstrap) as the options every scoring command takes.
BOOTSTRAP = flags(Bootstrap, config["tagging"]["bootstrap"], "bootstrap")

# recipe -> fragments in the order the workflow makes them; each rule file appends its own.
RECIPES = {}


def lib_code(command, subcommand=None):
    """The code stamps of the package files `encoder-study <command> <subcommand>` runs: a change to the
    code of any (not to its comments, layout or docstrings) reruns the rule, and the reason names it."""
    function = subcommand.replace("-", "_") if subcommand else None
    stamps = []
    for source in code_files(LIB_ROOT, COMMANDS[command], function, cache=DEPS_CACHE):
        stamp, changed = code_stamp(source, CODE_STAMPS, LIB_ROOT, DEPS_CACHE)
        if changed:  # said once, when the edit is first seen (the stamp keeps the list)
            print(f"code changed: {source}: {', '.join(changed)} (stamp {stamp})", file=sys.stderr)
        stamps.append(stamp)
    return stamps


CAPTIONS = Path(".snakemake/encoder-study/captions")


def caption(source, recipe):
    """A caption for Snakemake's report: workflow/report/<source> with its shared block composed
    (encoder_study.core.captions), written under .snakemake/encoder-study/captions/."""
    return str(composed(Path(workflow.basedir) / "workflow" / "report" / source, recipe,
                        CAPTIONS / source).resolve())


def result(name):
    """An output the report shows, as the results registry (encoder_study.core.results) spells it: its
    path, caption and place in the report."""
    entry = RESULTS[name]
    return report(entry.path, caption=caption(entry.caption, entry.category), category=entry.category,
                  subcategory=entry.subcategory)


def prov(recipe, rule, wildcards=""):
    """Where a job writes its fragment: provenance/<recipe>/<rule>[-<wildcards>].md."""
    stem = f"{rule}-{wildcards}" if wildcards else rule
    return f"provenance/{recipe}/{stem}.md"


def register(recipe, fragments):
    RECIPES.setdefault(recipe, []).extend(fragments)


def recipe_target(recipe):
    return f"provenance/{recipe}/PROVENANCE.md"


def crate_fragments(wildcards):
    """Every fragment `all` makes: those of each recipe whose PROVENANCE.md `all` builds, and the
    exports table's, which no PROVENANCE.md lists (export.smk says why). A function, called once every
    rule file is read, so that it sees every recipe and the report pages (they write none); recipes
    outside `all` (benchmarks) stay out, or the crate would run them."""
    built = set(rules.all.input)
    return sorted({f for recipe, fragments in RECIPES.items() if recipe_target(recipe) in built
                   for f in fragments} | {rules.export_table.output.prov})


# The workflow's code and configs, which the run crate hashes (so `verify` checks them): its rules,
# package, schema and report captions, config/ and envs/. The Snakefile, README, citation and licence
# are named on their own. Listed when the workflow is read; hidden files and caches stay out.
CODE_FOLDERS = ("workflow/rules", "workflow/schemas", "workflow/report", "config", "envs")


def workflow_sources():
    root = Path(workflow.basedir)
    found = [p for folder in CODE_FOLDERS for p in (root / folder).rglob("*") if p.is_file()]
    package = root / "workflow" / "lib"
    found += [*(package / "encoder_study").rglob("*.py"), package / "pyproject.toml"]
    return sorted(os.path.relpath(p) for p in found
                  if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))


def crate_documents(wildcards):
    """What `all` makes from the fragments and results besides the crate: each recipe's joined
    PROVENANCE.md and the report's pages (report.smk's REPORT_PAGES; read when the jobs are made)."""
    built = set(rules.all.input)
    joined = [recipe_target(r) for r in sorted(RECIPES) if recipe_target(r) in built]
    return joined + sorted(p for p in REPORT_PAGES if p in built)


# section -> the rules whose `threads:` (threads_for, timed_threads) or `resources:` (resources_of) the
# config sets: the Snakefile refuses a `threads.<rule>` or `resources.<rule>` naming any other rule,
# which would be ignored without a word.
CONFIGURED = {"threads": set(), "resources": set()}
# rule -> the config key its threads come from (named when no cluster node has that many CPUs).
THREADS_KEY = {}
# rule -> the threads a job of it asks of a cluster node (the preflight checks every rule's against sinfo).
THREADS_ASKED = {}


def threads_for(rule):
    """Threads a job of `rule` asks for (`threads:`): the config's `threads.<rule>` or `threads.default`.

    Host facts stay out of it: Snakemake caps it by the cores it may use when the job runs.
    """
    CONFIGURED["threads"].add(rule)
    THREADS_KEY[rule] = f"threads.{rule}" if rule in config["threads"] else "threads.default"
    THREADS_ASKED[rule] = int(config["threads"].get(rule, config["threads"]["default"]))
    return THREADS_ASKED[rule]


def on_cluster():
    """Whether jobs run on a cluster. This file is read before Snakemake picks its executor, so ask when
    jobs are made: the executor says, except in a dry run (whose executor is always local), where
    --jobs does (a cluster run needs it; a local run turns it into --cores)."""
    settings = workflow.executor_plugin.common_settings if workflow.executor_plugin else None
    if settings is not None and not settings.dryrun_exec:
        return not settings.local_exec
    return workflow.nodes is not None


def timed_threads(rule, key):
    """`threads:` of a rule that times something at up to the threads config key `key` gives (dotted,
    e.g. `parity.latency_threads`).

    Locally it takes every core the workflow has, so that no other job runs beside it. On a cluster the
    submitting host's cores say nothing about a node's: the job asks for `threads.<rule>` or else
    `key`'s value, and the cluster profile gives it a node of its own (slurm_extra --exclusive).
    """
    CONFIGURED["threads"].add(rule)
    key = f"threads.{rule}" if rule in config["threads"] else key
    THREADS_KEY[rule] = key
    value = config
    for part in key.split("."):
        value = value[part]
    asked = THREADS_ASKED[rule] = int(value)
    return lambda wildcards: asked if on_cluster() else CORES


def resources_for(rule, key):
    table = config["resources"]
    return table.get(rule, {}).get(key, table["default"].get(key, 0))


def resources_of(rule):
    """A rule's `resources:` (memory, runtime and GPUs): the config's `resources`, the one place they
    are set; the cluster profile picks a partition by whether the job asks for a GPU. `gpu` only where
    the config gives it. Each rule that runs as a cluster job takes its `resources` from here."""
    CONFIGURED["resources"].add(rule)
    found = {key: resources_for(rule, key) for key in ("mem_mb", "runtime")}
    gpus = resources_for(rule, "gpu")
    return {**found, "gpu": gpus} if gpus else found


def resources_per_process(rule, processes):
    """resources_of where one job runs `processes` processes (torchrun). The config's mem_mb and gpu
    are per process, so the job asks for that many times each; the runtime is the job's."""
    found = resources_of(rule)
    return {**found, **{key: found[key] * processes for key in ("mem_mb", "gpu") if key in found}}


def _model_specs(entries):
    specs = {}
    for entry in entries:
        if entry["name"] in specs:
            refuse_config(f"config: models lists '{entry['name']}' twice; names must be unique")
        specs[entry["name"]] = entry
    return specs


MODEL_SPECS = _model_specs(config["models"])
MODELS = sorted(MODEL_SPECS)
# The distilled student is a model too (tagging runs may name it), built by the student recipe.
STUDENT = config["student"]["name"]
if STUDENT in MODEL_SPECS:
    refuse_config(f"config: student.name '{STUDENT}' is also in `models`; give the student another name")
if config["student"]["teacher"] not in MODEL_SPECS:
    refuse_config(f"config: student.teacher '{config['student']['teacher']}' is not in `models` "
                        f"(it has: {', '.join(MODELS)})")


def _local_sources():
    """(config key, location) of each source the config names: jobs read a path or file:// URL in place."""
    fields = {"tiny": "architecture", "local": "path", "wheel": "find_links"}
    retrieval = config["retrieval"]["model"]
    if config["rehearsal"]["enabled"] and config["rehearsal"].get("retrieval_model"):
        retrieval = config["rehearsal"]["retrieval_model"]  # rehearsal.smk puts it in retrieval.model
    entries = [(f"models '{m['name']}'", m) for m in config["models"]]
    entries += [("retrieval.model", retrieval)] if isinstance(retrieval, dict) else []
    named = [(f"{key} {fields[m['source']]}", m.get(fields[m["source"]])) for key, m in entries
             if m["source"] in fields]
    named += [(f"texts.{name}", config["texts"][name]) for name in ("tatoeba", "udhr")]
    if config["treebank"]["source"] != "synthetic":
        named += [(f"treebank.{split}", config["treebank"][split]) for split in TREEBANK_SPLITS]
    named += [(f"treebank.extra_tests.{name}.url", entry["url"])
              for name, entry in config["treebank"]["extra_tests"].items() if "url" in entry]
    return [(key, location) for key, location in named if location and local_path(location) is not None]


_MISSING = [f"{key}: {location}" for key, location in _local_sources() if not local_path(location).exists()]
if _MISSING:
    refuse_config(f"config: no such file or directory: {'; '.join(_MISSING)} (a path or file:// URL "
                        f"is read in place, a relative path from {os.getcwd()}): fix the path, or give an "
                        "http(s) URL")


# -- the export and parity recipes ----------------------------------------------------------------

# Paths that rule files included after the rule that writes them read; spelled once, here. The writing
# rules (export_acquire, parity_select) name these as their outputs.
SOURCE_JSON = "results/sources/{model}/source.json"
PARITY_TEXTS = "results/texts/parity_texts.jsonl"


def is_download(name):
    return re.match(r"^https?://", config["texts"][name]) is not None


def text_source(name):
    """The local file (or directory) a text source is read from: fetched by rule parity_fetch if a URL."""
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
    """The files of an export (graph, tokenizer, config, manifest) and the source it came from.

    Rule export_model's outputs name them; the student's export (student.smk) writes the same four
    files under results/models/<student>, and has no source.json.
    """
    export = rules.export_model.output
    files = expand([export.onnx, export.tokenizer, export.config, export.manifest], model=model)
    return files if model == STUDENT else files + expand(rules.export_acquire.output.source, model=model)


def acquire_inputs(wildcards):
    """A tiny model's architecture file is an input: editing it rebuilds the model."""
    spec = MODEL_SPECS[wildcards.model]
    arch = [spec["architecture"]] if spec["source"] == "tiny" else []
    return {"code": lib_code("export", "acquire"), "architecture": arch}


# -- the student recipe ---------------------------------------------------------------------------

# Where the student recipe publishes the student's export; the tagging and write-back recipes read it
# as a model (model_files(STUDENT)).
STUDENT_DIR = f"results/models/{STUDENT}"

STUDENT_CFG = config["student"]

# The distillation heads the longest chain of jobs (distill, then the student's export, tagging and
# write-back): it and its teacher's export start before other ready jobs, or on few cores the chain can
# start last and finish after everything else (measured: CHANGELOG.md). Fine-tuning runs come next.
CHAIN_PRIORITY = 2
TRAIN_PRIORITY = 1

# A training job's log across Snakemake's retries. Snakemake deletes a job's log before each attempt, so
# the command's lines also go to a journal beside its checkpoint (params.journal, outside the outputs
# Snakemake deletes), which each attempt copies into its log first, after a line marking where the
# earlier attempt stopped. The journal goes once the command succeeds, as the checkpoint does.
ATTEMPT_MARK = "--- the attempt above ended without finishing (killed or failed); the next attempt follows ---"


def keeping_attempts(command):
    """`command` as a rule's shell line whose {log} keeps the lines of earlier attempts (params.journal)."""
    mark = shlex.quote(ATTEMPT_MARK)
    return (f'mkdir -p "$(dirname {{params.journal:q}})"; if [ -s {{params.journal:q}} ]; then echo {mark}'
            f" >> {{params.journal:q}}; cp {{params.journal:q}} {{log:q}}; fi; {command} 2>&1"
            " | tee -a {params.journal:q} >> {log:q}; rm -f {params.journal:q}")


def teacher_first(wildcards):
    """`priority:` of a model's acquisition and export: the student's teacher's go first."""
    return CHAIN_PRIORITY if wildcards.model == STUDENT_CFG["teacher"] else 0


def student_corpus_inputs(wildcards):
    """The embedded corpus's files (the texts section's sources); streamed datasets have none, but
    their local stand-ins do (a stream's `local` directory: config/rehearsal.yaml, rehearsal.smk)."""
    if STUDENT_CFG["corpus"]["source"] != "texts":
        return sorted(f"{s['local']}/{c}.jsonl" for s in STUDENT_CFG["corpus"]["streams"] if s.get("local")
                      for c in s["configs"].values())
    return text_source_files("tatoeba") + text_source_files("udhr")


def student_corpus_options():
    """`student stage` options: the embedded sample's files, or the streams (and their amounts)."""
    corpus = STUDENT_CFG["corpus"]
    if corpus["source"] == "texts":
        return f"--tatoeba {shlex.quote(text_source('tatoeba'))} --udhr {shlex.quote(text_source('udhr'))}"
    return f"--streams {shlex.quote(json.dumps(corpus['streams'], sort_keys=True))} {student_amounts_option()}"


def student_amounts_option():
    """The streams' text per language, for the language weights (`--amounts JSON`); none for the
    embedded sample, whose weights come from its own characters."""
    corpus = STUDENT_CFG["corpus"]
    if corpus["source"] == "texts" or not corpus.get("amounts"):
        return ""
    return f"--amounts {shlex.quote(json.dumps(corpus['amounts'], sort_keys=True))}"


def _processes(value):
    """student.processes as a number: `--config 'student={processes: 2}'` gives Snakemake's string '2'."""
    try:
        processes = int(value)
    except (TypeError, ValueError):
        processes = 0
    if processes < 1 or str(processes) != str(value).strip():
        refuse_config(f"config: student.processes is {value!r}; give a whole number of at least 1")
    return processes


STUDENT_PROCESSES = _processes(STUDENT_CFG["processes"])


def student_threads(wildcards, threads):
    """Each of the student's processes runs the job's threads divided among them (at least one), so that
    together they fit the allocation."""
    return max(1, threads // STUDENT_PROCESSES)


def student_launcher():
    """One process runs the command itself; several run it under torchrun (data parallel)."""
    processes = STUDENT_PROCESSES
    if processes == 1:
        return "encoder-study"
    return f"PYTHONHASHSEED=0 torchrun --standalone --nproc-per-node {processes} -m encoder_study.cli"


# -- the tagging recipe (also read by writeback) ------------------------------------------------

# Said under the score tables: what the numbers are on. The synthetic treebank is solved by a frozen
# MiniLM almost perfectly, so its differences (e.g. fine-tuned minus frozen) make no claim about English.
TREEBANK_CAPTION = (
    f"Treebank: the embedded synthetic treebank (seed {config['treebank']['seed']}), generated by the "
    "workflow. Its differences make no claim about English; config/ewt-minilm.yaml gives real numbers."
    if config["treebank"]["source"] == "synthetic" else
    f"Treebank: UD English-EWT ({config['treebank']['test']}; the fetch fragments hold each file's SHA-256)."
)
# A run's settings: these keys come from its entry, else from its mode's defaults (tagging.defaults).
TRAIN_KEYS = ("optimizer", "lr", "epochs", "max_steps", "patience", "warmup", "batch_words", "eval_every",
              "eval_batch_words", "clip", "weight_decay", "precision", "max_length", "window_batch",
              "max_batch_pieces", "chunk_steps")


def _runs(entries):
    runs = {}
    for entry in entries:
        if entry["name"] in runs:
            refuse_config(f"config: tagging.runs lists '{entry['name']}' twice; names must be unique")
        if entry["mode"] != "spacy" and entry["model"] not in MODEL_SPECS and entry["model"] != STUDENT:
            refuse_config(f"config: tagging run '{entry['name']}' names model '{entry['model']}', "
                                f"which is neither in `models` ({', '.join(MODELS)}) nor the student ('{STUDENT}')")
        runs[entry["name"]] = entry
    return runs


# RUNS: the runs tagging_train trains (frozen, finetuned); SPACY_RUNS: those rule tagging_spacy makes.
_ALL_RUNS = _runs(config["tagging"]["runs"])
RUNS = {name: run for name, run in _ALL_RUNS.items() if run["mode"] != "spacy"}
SPACY_RUNS = {name: run for name, run in _ALL_RUNS.items() if run["mode"] == "spacy"}
RUN_NAMES = sorted(RUNS)
# The tasks the runs tag (data.tasks): upos runs join results/tagging/'s tables (with the baseline and
# the spaCy runs), each other task's runs results/tagging/<task>/'s.
TASK_RUNS = {}
for _name, _run in sorted(_ALL_RUNS.items()):
    TASK_RUNS.setdefault(_run["task"], []).append(_name)
    if _run["mode"] == "spacy" and _run["task"] != "upos":
        refuse_config(f"config: tagging run '{_name}' is a spacy run of task {_run['task']}; spaCy runs tag "
                            "upos only (leave out `task`)")
OTHER_TASKS = sorted(set(TASK_RUNS) - {"upos"})
for _name in set(_ALL_RUNS) & {"upos", "xpos"}:
    refuse_config(f"config: tagging run '{_name}' is named as a task; results/tagging/{_name}/ holds that "
                        "task's tables: rename the run")


def run_task(name):
    return "upos" if name == "baseline" else _ALL_RUNS[name]["task"]


for _a, _b in config["tagging"]["comparisons"]:
    for _name in (_a, _b):
        if _name != "baseline" and _name not in _ALL_RUNS:
            refuse_config(f"config: tagging.comparisons names '{_name}', which is not a run")
    if _a == _b:
        refuse_config(f"config: tagging.comparisons compares '{_a}' with itself (a difference of 0 by "
                            "construction); name two different runs")
    if run_task(_a) != run_task(_b):
        refuse_config(f"config: tagging.comparisons compares '{_a}' ({run_task(_a)}) with '{_b}' "
                            f"({run_task(_b)}); compare runs of one task (the baseline is upos)")


def task_comparisons(task):
    """The config's comparisons between runs of `task`."""
    return [(a, b) for a, b in config["tagging"]["comparisons"] if run_task(a) == task]


def run_settings(run):
    """A run's training settings: its entry's values over its mode's defaults (tagging.defaults.<mode>).

    A run that gives max_steps without epochs trains by steps alone: its epoch limit is lifted (0).
    """
    settings = {**config["tagging"]["defaults"][run["mode"]], **{k: run[k] for k in TRAIN_KEYS if k in run}}
    if run.get("max_steps") and "epochs" not in run:
        settings["epochs"] = 0
    return settings


for _run in RUNS.values():
    if not run_settings(_run)["epochs"] and not run_settings(_run)["max_steps"]:
        refuse_config(f"config: tagging run '{_run['name']}' has no end: epochs 0 and max_steps 0 (its "
                            f"entry's, else tagging.defaults.{_run['mode']}'s); set epochs or max_steps")


def run_options(run):
    """A run's settings as `encoder-study tagging train` options: every one of them, explicitly."""
    flags = [f"--mode {run['mode']}", f"--pooling {run['pooling']}", f"--task {run['task']}"]
    flags += [f"--{key.replace('_', '-')} {value}" for key, value in sorted(run_settings(run).items())]
    if run["train_embeddings"]:
        flags.append("--train-embeddings")
    return " ".join(flags)


def spacy_inputs(wildcards):
    """What a spaCy run reads besides dev, test and the extra test sets: train and its spaCy config, or
    the wheel."""
    run = SPACY_RUNS[wildcards.run]
    if run["source"] == "train":
        return {"train": TREEBANK["train"], "config": run["config"]}
    return {"wheel": expand(rules.tagging_spacy_fetch.output.wheel, run=wildcards.run)[0]}


def spacy_options(wildcards, input):
    """`encoder-study tagging spacy` options of a run's source."""
    run = SPACY_RUNS[wildcards.run]
    if run["source"] == "train":
        # A run's max_steps and eval_every replace its spaCy config's training.max_steps, eval_frequency.
        given = "".join(f" --{key.replace('_', '-')} {run[key]}" for key in ("max_steps", "eval_every")
                        if key in run)
        return (f"--source train --config {shlex.quote(input.config)} --seed {config['tagging']['seed']}"
                f" --train {shlex.quote(input.train)}{given}")
    return (f"--source package --wheel {shlex.quote(input.wheel)} --package {run['package']}"
            f" --version {run['version']}")


def model_option(model):
    """`--model <export dir> <source.json>` of a model, from the files model_files() names."""
    files = model_files(model)
    return f"--model {shlex.quote(str(Path(files[0]).parent))} {shlex.quote(files[-1])}"


# -- the preflight recipe (preflight.smk) ---------------------------------------------------------------

def preflight_cluster():
    """`slurm` when this run submits to Slurm (--profile profiles/slurm), else `none`."""
    return "slurm" if on_cluster() and getattr(workflow.executor_plugin, "name", "") == "slurm" else "none"


def cluster_requests():
    """rule -> what one of its jobs asks of a cluster node (CPUs, memory, runtime, GPUs, the threads'
    config key), for every rule that runs as a cluster job, whether or not this run makes one. Local rules
    (Snakefile's `localrules`, `_localrules` in Snakemake) run on the submitting host."""
    found = {}
    for each in workflow.rules:
        name = each.name
        if name in workflow._localrules or each.norun or name not in CONFIGURED["resources"]:
            continue
        processes = STUDENT_PROCESSES if name == "student_distill" else 1
        found[name] = {"threads": THREADS_ASKED.get(name, 1),
                       "mem_mb": int(resources_for(name, "mem_mb")) * processes,
                       "runtime": int(resources_for(name, "runtime")),
                       "gpus": int(resources_for(name, "gpu")) * processes,
                       "threads_key": THREADS_KEY.get(name, "threads.default")}
    return found


def preflight_config():
    """The config's parts the checks read (after rehearsal.smk's swaps): sources, devices, processes."""
    texts, treebank, student = config["texts"], config["treebank"], config["student"]
    return {"models": config["models"], "retrieval": {"model": config["retrieval"]["model"]},
            "texts": {k: texts.get(k, "") for k in ("tatoeba", "tatoeba_sha256", "udhr", "udhr_sha256")},
            "treebank": {k: treebank.get(k, "") for k in ("source", "extra_tests", *TREEBANK_SPLITS,
                                                         *(f"{s}_sha256" for s in TREEBANK_SPLITS))},
            "tagging": {"device": config["tagging"]["device"],
                        "runs": [r for r in config["tagging"]["runs"] if r["mode"] == "spacy"]},
            "student": {**{k: student[k] for k in ("device", "processes")},
                        "corpus": {k: student["corpus"].get(k) for k in ("source", "streams")}},
            "rehearsal": {"enabled": config["rehearsal"]["enabled"]}}


# The device check: the fine-tuned runs whose model exists before any training (the student's exists only
# after the distillation: recipes/preflight/device.py says why it is left out).
DEVICE_RUNS = [r for r in RUNS.values() if r["mode"] == "finetuned" and r["model"] != STUDENT]


def device_runs(wildcards):
    """Each checked run's name, model, export directory, pooling and training settings, as JSON."""
    return json.dumps([{"name": r["name"], "model": r["model"], "pooling": r["pooling"],
                        "train_embeddings": r["train_embeddings"], **run_settings(r),
                        "model_dir": str(Path(model_files(r["model"])[0]).parent)} for r in DEVICE_RUNS],
                      sort_keys=True)


def device_resources():
    """What the training rules ask (the larger of tagging_train's and student_distill's memory and GPUs),
    so that the check runs where the training will; its runtime is its own (resources.preflight_device)."""
    own = resources_of("preflight_device")
    training = [resources_of("tagging_train"), resources_per_process("student_distill", STUDENT_PROCESSES)]
    gpus = max(r.get("gpu", 0) for r in training)
    mem = max(own["mem_mb"], *(r["mem_mb"] for r in training))
    return {**own, "mem_mb": mem, **({"gpu": gpus} if gpus else {})}



# -- before any job runs ---------------------------------------------------------------------------


def check_recorded_inputs():
    """Refuse the run, before Snakemake deletes any output, when a file its jobs will read is not the
    one its rule wrote (encoder_study.provenance.recorded); the message names each file and the command that
    rebuilds it."""
    from encoder_study import provenance
    from encoder_study.provenance.verify import FAST_CACHE, HashCache
    from encoder_study.provenance import recorded

    if workflow.touch:  # --touch runs nothing and deletes nothing
        return
    dag = workflow.dag
    jobs = list(dag.needrun_jobs())
    produced = {os.path.normpath(f) for job in jobs for f in job.output}
    declared = {os.path.normpath(f) for job in dag.jobs for f in job.output}
    inputs = {os.path.normpath(f) for job in jobs for f in job.input}
    cache = HashCache(FAST_CACHE)
    problems = recorded.damaged(inputs, produced, declared, "provenance", cache)
    cache.save()
    if problems:
        raise WorkflowError("files the run would read differ from what their rules wrote:\n"
                            + "\n".join(problems))


def check_cluster_fits():
    """On Slurm, refuse the run before anything is submitted when a job asks for more than any node of
    its partitions has (CPUs, memory, runtime, GPUs): Slurm would keep it PENDING for ever and Snakemake
    wait without a word (encoder_study.core.cluster). One line per rule, naming the config key."""
    import yaml
    from encoder_study.core import cluster

    if not on_cluster() or getattr(workflow.executor_plugin, "name", "") != "slurm":
        return
    nodes = cluster.read_nodes()
    if isinstance(nodes, str):
        print(f"cluster check skipped: {nodes}", file=sys.stderr)
        return
    path = getattr(workflow.executor_settings, "partition_config", None)
    if path:
        partitions = (yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}).get("partitions") or {}
    else:
        partitions = {n.partition: {} for n in nodes}
    requests = {}
    for job in workflow.dag.needrun_jobs():
        if job.is_local:
            continue
        resources = job.resources
        request = cluster.Request(job.rule.name, int(job.threads), int(resources.get("mem_mb", 0) or 0),
                                  int(resources.get("runtime", 0) or 0), int(resources.get("gpu", 0) or 0),
                                  THREADS_KEY.get(job.rule.name, "threads.default"))
        requests[request.rule] = max(requests.get(request.rule, request), request,
                                     key=lambda r: (r.threads, r.mem_mb, r.gpus, r.minutes))
    problems = cluster.problems(requests.values(), nodes, partitions)
    if problems:
        raise WorkflowError("no node of the cluster can start these jobs (Slurm would leave them pending):\n"
                            + "\n".join(problems))


def refuse_to_start():
    """The checks before any job runs; a refusal ends with its own message, not Snakemake's traceback
    frames of this file (exit status 1, nothing run, submitted or deleted)."""
    try:
        check_cluster_fits()
        check_recorded_inputs()
    except WorkflowError as refusal:
        print(f"Refused before any job ran: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


onstart:
    refuse_to_start()
