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

from conftest import ROOT, snakemake

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
PAPER = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
PROFILE = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
# The rules that time something: all of the workflow's cores locally; on a cluster, a node of their own.
TIMED = {"parity_latency", "tagging_step_time", "writeback_speed", "benchmarks_encoders"}

# Each rule as Snakemake reads it (through its API; the executor is not known there): whether it runs on
# the submitting host (Workflow.is_local: a localrule, or a rule that runs nothing) and its resources.
RULES = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, ResourceSettings

with SnakemakeApi() as api:
    configs = ConfigSettings(configfiles=[Path(p) for p in sys.argv[1:]])
    workflow = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=configs,
                            snakefile=Path("Snakefile"))._workflow
    asked = ("mem_mb", "runtime", "gpu")
    print(json.dumps({rule.name: {"local": rule.name in workflow._localrules or rule.norun,
                                  **{k: v.value for k, v in rule.resources.items() if k in asked}}
                      for rule in workflow.rules}))
"""


def _configfile(tmp_path, config: dict | None) -> list[str]:
    if config is None:
        return []
    path = tmp_path / f"extra-{len(list(tmp_path.glob('extra-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return [str(path)]


def _rules(tmp_path, *configs: str, extra: dict | None = None) -> dict[str, dict]:
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    result = subprocess.run([sys.executable, "-c", RULES, *configs, *_configfile(tmp_path, extra)], cwd=ROOT,
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _dry_run(tmp_path, extra: dict | None, *args: str,
             targets=("all", "benchmarks")) -> list[tuple[str, int, dict]]:
    """(rule, threads, resources) of every job a forced dry run of `targets` plans."""
    configs = [a for a in args if a.endswith(".yaml")] + _configfile(tmp_path, extra)
    options = [a for a in args if not a.endswith(".yaml")]
    result = snakemake("-n", "--forceall", *targets, *options,
                       *(["--configfile", *configs] if configs else []))
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


def test_every_rule_that_runs_as_a_job_takes_memory_and_runtime_from_the_config(tmp_path):
    given = {"default": {"mem_mb": 1234, "runtime": 56}, "student_export": {"mem_mb": 4321, "runtime": 87}}
    rules = _rules(tmp_path, extra={"resources": given})
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


def test_a_resources_entry_for_a_rule_that_reads_none_is_refused(tmp_path):
    (path,) = _configfile(tmp_path, {"resources": {"tagging_tables": {"mem_mb": 100}}})
    result = snakemake("-n", "--configfile", path)
    assert result.returncode != 0
    assert ("config: resources.tagging_tables: rule tagging_tables takes no resources from the config"
            in result.stdout + result.stderr)


def test_timed_rules_take_the_workflow_cores_locally_and_their_config_threads_on_a_cluster(tmp_path):
    config = {"threads": {"tagging_step_time": 5}, "parity": {"latency_threads": 3},
              "writeback": {"threads": 6}, "benchmarks": {"threads": 7}}
    on_cluster = {"parity_latency": 3, "tagging_step_time": 5, "writeback_speed": 6, "benchmarks_encoders": 7}
    # 64 cores given: on a cluster they are not what a timed job asks for.
    jobs = _dry_run(tmp_path, config, "--profile", "profiles/slurm", "--cores", "64")
    assert TIMED <= {name for name, _, _ in jobs}
    for name, threads, resources in jobs:
        assert threads == on_cluster.get(name, 1), (name, threads)
        assert (resources.get("slurm_extra") == "--exclusive") == (name in TIMED), (name, resources)
    cores = min(2, len(os.sched_getaffinity(0)))  # --cores beyond the machine's are capped (common.smk)
    for name, threads, _ in _dry_run(tmp_path, config, "--cores", "2"):
        assert threads == (cores if name in TIMED else 1), (name, threads)


@pytest.mark.parametrize("gpus", ["paper", "none"])
def test_a_job_goes_to_a_gpu_partition_exactly_when_it_asks_for_a_gpu(tmp_path, gpus):
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    asking = {name for name, entry in PAPER["resources"].items() if entry.get("gpu")}
    assert asking >= {"tagging_train", "student_distill"}
    extra = None if gpus == "paper" else {"resources": {name: {"gpu": 0} for name in asking}}
    jobs = _dry_run(tmp_path, extra, "--profile", "profiles/slurm", "config/paper.yaml", targets=("all",))
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


def test_the_cluster_profile_names_partitions_and_slurm_options_only(tmp_path):
    # The workflow profile (read too, and winning) sets none of the keys the cluster profile sets.
    local = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert not set(local) & set(PROFILE), set(local) & set(PROFILE)
    assert PROFILE["executor"] == "slurm" and PROFILE["latency-wait"] == 60
    assert "default-resources" not in PROFILE  # memory and runtime: the config; partition: per job
    assert (ROOT / "profiles/slurm" / PROFILE["slurm-partition-config"]).is_file()
    assert PROFILE["set-resources"] == {name: {"slurm_extra": "'--exclusive'"} for name in TIMED}
    # Downloads, joins, tables and checks run on the submitting host; models run as jobs.
    rules = _rules(tmp_path, "config/paper.yaml")
    for name in ("export_acquire", "parity_fetch", "tagging_fetch", "tagging_tables", "provenance_join",
                 "parity_table_latency", "retrieval_verify", "verify"):
        assert rules[name]["local"], name
    for name in ("tagging_train", "student_distill", "export_model", "parity_latency", "retrieval_export"):
        assert not rules[name]["local"], name
