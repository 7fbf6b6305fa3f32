"""The cluster profile (profiles/slurm) and what each job asks a cluster for: memory and runtime from the
config's `resources` for every rule that runs as a job, the timed rules' threads from the config (never
the submitting host's cores) and a node of their own, and a partition chosen by whether the job asks
for a GPU. Dry runs and the rules as Snakemake reads them; tests/test_slurm.py runs the profile on a
real Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import ROOT, snakemake_each

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
PAPER = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
PROFILE = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
# The rules that time something: all of the workflow's cores locally; on a cluster, a node of their own.
TIMED = {"parity_latency", "tagging_step_time", "writeback_speed", "benchmarks_encoders",
         "writeback_quantisation_speed", "benchmarks_retrieval"}

# Each rule as Snakemake reads it (through its API; the executor is not known there): whether it runs on
# the submitting host (Workflow.is_local: a localrule, or a rule that runs nothing) and its resources. One
# workflow per list of config files (argv[1], JSON), in one process.
RULES = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, ResourceSettings

asked = ("mem_mb", "runtime", "gpu")
read = []
for paths in json.loads(sys.argv[1]):
    with SnakemakeApi() as api:
        configs = ConfigSettings(configfiles=[Path(p) for p in paths])
        workflow = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=configs,
                                snakefile=Path("Snakefile"))._workflow
        read.append({rule.name: {"local": rule.name in workflow._localrules or rule.norun,
                                 **{k: v.value for k, v in rule.resources.items() if k in asked}}
                     for rule in workflow.rules})
print(json.dumps(read))
"""
# The resources the first test gives on top of the embedded default.
GIVEN = {"default": {"mem_mb": 1234, "runtime": 56}, "student_export": {"mem_mb": 4321, "runtime": 87}}
# The timed rules' threads the third test gives.
THREADS = {"threads": {"tagging_step_time": 5}, "parity": {"latency_threads": 3}, "writeback": {"threads": 6},
           "benchmarks": {"threads": 7}}


def _configfile(tmp_path, config: dict | None) -> list[str]:
    if config is None:
        return []
    path = tmp_path / f"extra-{len(list(tmp_path.glob('extra-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return [str(path)]


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """The rules as read with the embedded default and GIVEN ("given") and with config/paper.yaml
    ("paper"): name -> {"local", "mem_mb", "runtime", "gpu"}."""
    read = {"given": _configfile(tmp_path_factory.mktemp("rules"), {"resources": GIVEN}),
            "paper": ["config/paper.yaml"]}
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    result = subprocess.run([sys.executable, "-c", RULES, json.dumps(list(read.values()))], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return dict(zip(read, json.loads(result.stdout.splitlines()[-1]), strict=True))


def _dry_run_argv(tmp_path, extra: dict | None, *args: str, targets=("all", "benchmarks")) -> list[str]:
    """The command line of a forced dry run of `targets`."""
    configs = [a for a in args if a.endswith(".yaml")] + _configfile(tmp_path, extra)
    options = [a for a in args if not a.endswith(".yaml")]
    return ["-n", "--forceall", *targets, *options, *(["--configfile", *configs] if configs else [])]


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every dry run of the tests below, in one Snakemake process (conftest.snakemake_each)."""
    folder = tmp_path_factory.mktemp("dry-runs")
    asking = {name for name, entry in PAPER["resources"].items() if entry.get("gpu")}
    argvs = {
        "refused": ["-n", "--configfile",
                    *_configfile(folder, {"resources": {"tagging_tables": {"mem_mb": 100}}})],
        # 64 cores given: on a cluster they are not what a timed job asks for.
        "cluster": _dry_run_argv(folder, THREADS, "--profile", "profiles/slurm", "--cores", "64"),
        "local": _dry_run_argv(folder, THREADS, "--cores", "2"),
        "gpu paper": _dry_run_argv(folder, None, "--profile", "profiles/slurm", "config/paper.yaml",
                                   targets=("all",)),
        "gpu none": _dry_run_argv(folder, {"resources": {name: {"gpu": 0} for name in asking}}, "--profile",
                                  "profiles/slurm", "config/paper.yaml", targets=("all",)),
        # The student's distillation with 1 and 2 processes; "2" as a string, as --config passes it.
        **{f"processes {n}": ["-n", "-p", "--forcerun", "student_distill", "results/student/student.pt",
                              "--profile", "profiles/slurm", "--cores", "64", "--configfile",
                              "config/paper.yaml", *_configfile(folder, {"student": {"processes": n}})]
           for n in (1, "2")},
    }
    return dict(zip(argvs, snakemake_each(*argvs.values()), strict=True))


def _jobs(result: subprocess.CompletedProcess) -> list[tuple[str, int, dict]]:
    """(rule, threads, resources) of every job a dry run plans."""
    assert result.returncode == 0, result.stderr
    jobs = []
    for block in result.stdout.split("\n\n"):
        lines = [line.strip() for line in block.splitlines()]
        head = next((line for line in lines if line.startswith("rule ")), None)
        if head:
            field = {k: v for k, _, v in (line.partition(": ") for line in lines[1:])}
            resources = dict(item.split("=", 1) for item in field.get("resources", "").split(", ") if item)
            jobs.append((head[5:].rstrip(":"), int(field.get("threads", 1)), resources))
    assert jobs, result.stdout
    return jobs


def test_every_rule_that_runs_as_a_job_takes_memory_and_runtime_from_the_config(rules):
    given, rules = GIVEN, rules["given"]
    jobs = {name for name, rule in rules.items() if not rule["local"]}
    # Among them the five that once declared none (Slurm's 1000 MB and no time limit).
    assert {"tagging_treebank", "tagging_ood", "tagging_baseline", "student_export", "student_parity"} <= jobs
    assert {"tagging_train", "student_distill", "export_model", "parity_latency"} <= jobs
    base = DEFAULT.get("resources", {})
    for name in jobs:
        expected = {**given["default"], **base.get(name, {}), **given.get(name, {})}
        assert (rules[name].get("mem_mb"), rules[name].get("runtime")) == (
            expected["mem_mb"], expected["runtime"]), name
    assert not [name for name, rule in rules.items() if "gpu" in rule]  # the embedded default asks none


def test_a_resources_entry_for_a_rule_that_reads_none_is_refused(dry_runs):
    result = dry_runs["refused"]
    assert result.returncode != 0
    assert ("config: resources.tagging_tables: rule tagging_tables takes no resources from the config"
            in result.stdout + result.stderr)


def test_timed_rules_take_the_workflow_cores_locally_and_their_config_threads_on_a_cluster(dry_runs):
    on_cluster = {"parity_latency": 3, "tagging_step_time": 5, "writeback_speed": 6, "benchmarks_encoders": 7,
                  "writeback_quantisation_speed": 6, "benchmarks_retrieval": 7}
    jobs = _jobs(dry_runs["cluster"])  # with THREADS and 64 cores
    assert TIMED <= {name for name, _, _ in jobs}
    for name, threads, resources in jobs:
        assert threads == on_cluster.get(name, 1), (name, threads)
        assert (resources.get("slurm_extra") == "--exclusive") == (name in TIMED), (name, resources)
    cores = min(2, len(os.sched_getaffinity(0)))  # --cores beyond the machine's are capped (common.smk)
    for name, threads, _ in _jobs(dry_runs["local"]):  # with THREADS and 2 cores
        assert threads == (cores if name in TIMED else 1), (name, threads)


@pytest.mark.parametrize("gpus", ["paper", "none"])
def test_a_job_goes_to_a_gpu_partition_exactly_when_it_asks_for_a_gpu(dry_runs, gpus):
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    asking = {name for name, entry in PAPER["resources"].items() if entry.get("gpu")}
    assert asking >= {"tagging_train", "student_distill"}
    jobs = _jobs(dry_runs[f"gpu {gpus}"])  # none: each of them given gpu 0
    partitions = read_partition_file(ROOT / "profiles/slurm" / PROFILE["slurm-partition-config"])
    quiet = SimpleNamespace(info=lambda *_: None, debug=lambda *_: None, warning=lambda *_: None)
    chosen = {}
    for name, threads, resources in jobs:
        values = {k: int(v) if v.isdigit() else v for k, v in resources.items()}
        job = SimpleNamespace(name=name, threads=threads, resources=values)
        # As the executor does: a partition the job names, else the best fit.
        partition = values.get("slurm_partition") or get_best_partition(partitions, job, quiet)
        chosen.setdefault(name, set()).add(partition)
    expected_gpu = asking if gpus == "paper" else set()
    assert {name for name, found in chosen.items() if "gpu" in found} == expected_gpu
    assert all(found == {"cpu"} for name, found in chosen.items() if name not in expected_gpu), chosen


def test_the_cluster_profile_names_partitions_and_slurm_options_only(rules):
    # The workflow profile (read too, and winning) sets none of the keys the cluster profile sets.
    local = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert not set(local) & set(PROFILE), set(local) & set(PROFILE)
    assert PROFILE["executor"] == "slurm" and PROFILE["latency-wait"] == 60
    assert "default-resources" not in PROFILE  # memory and runtime: the config; partition: per job
    assert (ROOT / "profiles/slurm" / PROFILE["slurm-partition-config"]).is_file()
    assert PROFILE["set-resources"] == {name: {"slurm_extra": "'--exclusive'"} for name in TIMED}
    # Downloads, joins, tables and checks run on the submitting host; models run as jobs.
    rules = rules["paper"]
    # The student's corpus is streamed from the Hub by a local rule; the GPU job reads the staged file.
    for name in ("export_acquire", "parity_fetch", "tagging_fetch", "tagging_tables", "provenance_join",
                 "parity_table_latency", "retrieval_verify", "verify", "student_stage"):
        assert rules[name]["local"], name
    for name in ("tagging_train", "student_distill", "export_model", "parity_latency", "retrieval_export"):
        assert not rules[name]["local"], name


@pytest.mark.parametrize("processes", [1, 2])
def test_the_students_job_asks_for_what_its_processes_need(dry_runs, processes):
    """student.processes: the job asks for mem_mb and gpu per process times the processes, and each
    process runs the job's threads divided among them (a cluster dry run, 64 cores given)."""
    result = dry_runs[f"processes {1 if processes == 1 else '2'}"]
    jobs = [job for job in _jobs(result) if job[0] == "student_distill"]
    assert len(jobs) == 1, result.stdout
    _, threads, resources = jobs[0]
    per_process = PAPER["resources"]["student_distill"]
    assert int(resources["mem_mb"]) == per_process["mem_mb"] * processes
    assert int(resources["gpu"]) == per_process.get("gpu", 0) * processes
    command = next(line for line in result.stdout.splitlines() if "student distill" in line)
    assert f"--threads {threads // processes} " in command
    assert ("torchrun" in command and f"--nproc-per-node {processes}" in command) == (processes > 1)
