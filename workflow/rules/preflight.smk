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
# job's outputs). No output: as a target it runs every time. Its lines are printed once: by `cat` when
# they pass, by the profile's show-failed-logs when they fail (a `tee` printed them twice).
rule preflight:
    input:
        table=rules.preflight_check.output.table,
        code=lib_code("preflight", "verdict"),
    log:
        "logs/preflight/preflight.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study preflight verdict --table {input.table:q} > {log:q} 2>&1 && cat {log:q}"


THREADS_KEY["preflight_device"] = THREADS_KEY.get("student_distill", "threads.default")


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
