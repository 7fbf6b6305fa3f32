"""profiles/slurm on a real Slurm: a single-node cluster (tests/slurm/cluster.py) runs some targets of
the shared run's config (conftest.shared_config: the scaled-down rehearsal of config/paper.yaml) with
RESOURCES in place of paper.yaml's, whose results must equal those of the local run of that config the
end-to-end tests share (conftest.small_workflow) byte for byte, timing tables aside.

Runs where slurm-wlm, slurmdbd, mariadb-server and munge are installed and the test runs as root;
skipped elsewhere, and skipped too when the daemons do not come up. A few minutes on 2 cores.
"""

import filecmp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, shared_config, small_copy

sys.path.insert(0, str(Path(__file__).parent / "slurm"))
import cluster  # noqa: E402

pytestmark = pytest.mark.slurm

TARGETS = ("export", "results/parity/latency/mmbert-base.csv", "results/tagging/baseline/scores.csv")
# The export recipe, the timed latency rule (a node of its own) and the tagging baseline, whose treebank
# and baseline rules once took no resources from the config; not the rest of the parity recipe, whose
# comparison is a one-thread job like export_model and whose tables are local rules (CPU for nothing
# more to check). paper.yaml's own resources ask for GPUs and more memory than a test node has:
# RESOURCES are distinctive, one rule has its own, and the parity latency rule, which takes the whole
# node (--exclusive), asks for 1 thread: on a node of 2 or more CPUs, the node's other CPUs in the job
# say --exclusive worked.
RESOURCES = {"default": {"mem_mb": 1234, "runtime": 56}, "tagging_treebank": {"mem_mb": 1300, "runtime": 57}}
# The jobs that go through sbatch (every other one is a local rule) and what each asks for.
SUBMITTED = {"export_model": ("1234M", "00:56:00"), "parity_latency": ("1234M", "00:56:00"),
             "tagging_treebank": ("1300M", "00:57:00"), "tagging_baseline": ("1234M", "00:56:00")}
# Timing tables (and Snakemake's benchmark files) differ from run to run; everything else may not.
TIMING = ("results/parity/latency", "results/benchmarks/")


@pytest.fixture(scope="session")
def cluster_run(tmp_path_factory):
    """The single-node cluster, and the slurm profile's run of TARGETS in a copy of the small config, started
    in the background: it waits on Slurm's status checks while the local run it is compared with
    (conftest.small_workflow) is made. (cluster environment, the copy, the started run, when it started)"""
    why = cluster.unavailable()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    try:
        env = cluster.start(root)
    except cluster.ClusterError as error:
        pytest.skip(f"the single-node cluster did not start: {error}")
    parity = {**shared_config()["parity"], "latency_threads": 1}  # timing only: its table is not compared
    remote = small_copy(tmp_path_factory.mktemp("remote"), resources=RESOURCES, parity=parity)
    # The cluster's config and srun (tests/slurm/cluster.py), and this environment's commands.
    run_env = dict(os.environ, SLURM_CONF=env["SLURM_CONF"],
                   PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]))
    # Status checks from 5 s after a submission (the plugin's default, 40 s, only slows the test).
    started = time.monotonic()
    output = root / "snakemake.out"  # a file, not a pipe: nobody reads the run's output until it ends
    with output.open("w") as out:
        run = subprocess.Popen([sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *TARGETS,
                                "--slurm-init-seconds-before-status-checks", "5"], cwd=remote, env=run_env,
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        yield env, remote, (run, output), started
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        cluster.stop(root)


def _results(copy: Path) -> set[str]:
    return {p.relative_to(copy).as_posix() for p in (copy / "results").rglob("*") if p.is_file()}


def _jobs(env: dict) -> list[dict]:
    """Every job the cluster ran (it is new: all of them are this run's), as sacct gives them."""
    fields = ["JobID", "Comment", "Partition", "ReqMem", "Timelimit", "AllocCPUS", "State"]
    out = subprocess.run(["sacct", "-X", "--parsable2", "--noheader", "--allusers", "--format",
                          ",".join(fields)], capture_output=True, text=True, env=env, check=True).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines()]


def test_the_slurm_profile_gives_a_local_runs_results(cluster_run, small_workflow):
    slurm, remote, (run, output), started = cluster_run
    local = small_workflow
    assert run.wait(timeout=1200) == 0, output.read_text()
    took = time.monotonic() - started

    jobs = _jobs(slurm)
    rules = [job["Comment"].removeprefix("rule_").split("_wildcards_")[0] for job in jobs]
    assert sorted(rules) == sorted(SUBMITTED), rules
    node_cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True,
                                   env=slurm, check=True).stdout.split()[0])
    for job, rule in zip(jobs, rules, strict=True):
        assert job["State"] == "COMPLETED" and job["Partition"] == "cpu", job
        assert (job["ReqMem"], job["Timelimit"]) == SUBMITTED[rule], job
        assert int(job["AllocCPUS"]) == (node_cpus if rule == "parity_latency" else 1), job

    # The local run built every target of `all`: the cluster's files are among its files, and equal.
    compared = sorted(f for f in _results(remote) if not f.startswith(TIMING))
    assert _results(remote) <= _results(local), _results(remote) - _results(local)
    assert len(compared) > 10 and "results/models/mmbert-base/model.onnx" in compared
    different = [f for f in compared if not filecmp.cmp(local / f, remote / f, shallow=False)]
    assert different == [], different
    print(f"slurm run {took:.0f} s; {len(jobs)} jobs through sbatch ({', '.join(rules)}); {len(compared)} "
          f"files byte-equal, {len(_results(remote)) - len(compared)} timing files not compared")


def test_a_job_no_node_can_hold_is_refused_before_anything_is_submitted(cluster_run, tmp_path):
    """The default's timed rules at their configured threads (config/config.yaml) on a node with fewer
    CPUs: Slurm would accept them and leave them pending for ever; the run stops at once instead, one line
    per rule naming the config key, and submits nothing."""
    slurm, *_ = cluster_run
    default = yaml.safe_load((ROOT / "config/config.yaml").read_text(encoding="utf-8"))
    threads = {"parity_latency": default["parity"]["latency_threads"],
               "writeback_speed": default["writeback"]["threads"]}
    node_cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True,
                                   env=slurm, check=True).stdout.split()[0])
    if min(threads.values()) <= node_cpus:
        pytest.skip(f"the test node has {node_cpus} CPUs: enough for the default's timed rules")
    config = shared_config()
    copy = small_copy(tmp_path / "too-big", resources=RESOURCES,
                      parity={**config["parity"], "latency_threads": threads["parity_latency"]},
                      writeback={**config["writeback"], "threads": threads["writeback_speed"]})
    before = len(_jobs(slurm))
    env = dict(os.environ, SLURM_CONF=slurm["SLURM_CONF"],
               PATH=os.pathsep.join([str(Path(sys.executable).parent), slurm["PATH"]]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/slurm",
                           "results/parity/latency/mmbert-base.csv", "results/writeback/speed.csv"],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    lines = [line for line in out.splitlines() if "no node can start it" in line]
    assert len(lines) == 2, out
    assert lines[0].startswith(f"parity_latency asks for {threads['parity_latency']} CPUs "
                               f"(parity.latency_threads), the largest node has {node_cpus}")
    assert lines[1].startswith(f"writeback_speed asks for {threads['writeback_speed']} CPUs "
                               f"(writeback.threads), the largest node has {node_cpus}")
    assert len(_jobs(slurm)) == before  # nothing submitted
    assert took < 120, took
