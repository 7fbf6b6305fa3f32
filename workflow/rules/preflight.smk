# Recipe `preflight` (not part of `all`): before the cluster, everything the study meets first, checked in
# seconds to minutes without downloading weights: each Hub model at its revision and each file
# acquisition reads, each streamed dataset's configurations, each URL (reachable, size, pinned), the
# disk, the installed torch against the config's devices, and with the Slurm profile every job's request
# against the cluster's nodes. `snakemake preflight` fails naming each failure in one line; the table is
# results/preflight/preflight.{md,json}. `snakemake preflight_device` (its own target, a GPU job: it
# needs the exports) runs one training step of each kind on the study's device. Rule file
# workflow/rules/preflight.smk; command `encoder-study preflight check|verdict|device`
# (encoder_study.recipes.preflight.command); library encoder_study.recipes.preflight (plan, remote, device).
import datetime

# The world changes under a finished check (a moved URL, a new node): each invocation gives the checks
# a new `checked_at`, so that Snakemake's params trigger reruns them; no other rule reads it.
PREFLIGHT_CHECKED_AT = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


localrules:
    preflight,
    preflight_check,


def preflight_cluster():
    """`slurm` when this run submits to Slurm (--profile profiles/slurm), else `none`."""
    return "slurm" if on_cluster() and getattr(workflow.executor_plugin, "name", "") == "slurm" else "none"


def cluster_requests():
    """rule -> what one of its jobs asks of a cluster node (CPUs, memory, runtime, GPUs, the threads'
    config key), for every rule that runs as a cluster job, whether or not this run makes one. Local rules
    (Snakefile's `localrules`, `_localrules` in Snakemake) run on the submitting host."""
    found = {}
    for rule in workflow.rules:
        name = rule.name
        if name in workflow._localrules or rule.norun or name not in CONFIGURED["resources"]:
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
            "student": {k: student[k] for k in ("device", "processes", "corpus")},
            "rehearsal": {"enabled": config["rehearsal"]["enabled"]}}


rule preflight_check:
    input:
        code=lib_code("preflight", "check"),
    output:
        table=result("preflight"),
        markdown="results/preflight/preflight.md",
        prov=prov("preflight", "preflight_check"),
    params:
        checked_at=PREFLIGHT_CHECKED_AT,
        config=lambda wc: json.dumps(preflight_config(), sort_keys=True),
        # Every cluster job's request: only a Slurm run has nodes to hold them against.
        requests=lambda wc: json.dumps(cluster_requests() if preflight_cluster() == "slurm" else {},
                                       sort_keys=True),
        gpu_rules=lambda wc: ",".join(sorted(n for n, r in cluster_requests().items() if r["gpus"])),
        partitions=lambda wc: getattr(workflow.executor_settings, "partition_config", None) or "",
        cluster=lambda wc: preflight_cluster(),
    log:
        "logs/preflight/preflight_check.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study preflight check --config {params.config:q} --requests {params.requests:q}"
        " --gpu-rules={params.gpu_rules:q} --partitions={params.partitions:q} --cluster {params.cluster}"
        " --results-dir results --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


# The verdict apart from the table, so that a failing preflight keeps its table (Snakemake deletes a failed
# job's outputs). No output: as a target it runs every time.
rule preflight:
    input:
        table=rules.preflight_check.output.table,
        code=lib_code("preflight", "verdict"),
    log:
        "logs/preflight/preflight.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study preflight verdict --table {input.table:q} 2>&1 | tee {log:q}"


# The device check: the fine-tuned runs whose model exists before any training (the student's exists only
# after the distillation: recipes/preflight/device.py says why it is left out).
DEVICE_RUNS = [r for r in RUNS.values() if r["mode"] == "finetuned" and r["model"] != STUDENT]
THREADS_KEY["preflight_device"] = THREADS_KEY.get("student_distill", "threads.default")


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


rule preflight_device:
    input:
        models=sorted({f for r in DEVICE_RUNS for f in model_files(r["model"])}),
        teacher=model_files(STUDENT_CFG["teacher"]),
        treebank=TREEBANK["train"],
        code=lib_code("preflight", "device"),
    output:
        table=result("preflight_device"),
        markdown="results/preflight/device.md",
        prov=prov("preflight", "preflight_device"),
    params:
        checked_at=PREFLIGHT_CHECKED_AT,
        launcher=student_launcher(),
        runs=device_runs,
        teacher_dir=lambda wc, input: os.path.dirname(input.teacher[0]),
        student=json.dumps(STUDENT_CFG["architecture"], sort_keys=True),
        training=json.dumps(STUDENT_CFG["training"], sort_keys=True),
        device=STUDENT_CFG["device"],
        precision=STUDENT_CFG["precision"],
        seed=config["tagging"]["seed"],
        threads=student_threads,
    threads: max(threads_for("tagging_train"), threads_for("student_distill"))
    log:
        "logs/preflight/preflight_device.log",
    resources: **device_resources()
    conda:
        CONDA_ENV
    shell:
        "{params.launcher} preflight device --runs {params.runs:q} --teacher-dir {params.teacher_dir:q}"
        " --treebank {input.treebank:q} --student {params.student:q} --training {params.training:q}"
        " --device {params.device} --precision {params.precision} --seed {params.seed}"
        " --threads {params.threads} --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"
