"""A job no node of its partitions can hold is named before submission (encoder_study.core.cluster):
sinfo's node lines read, the slurm executor's partition choice, one line per rule with the config key.
Without Slurm; tests/test_slurm.py runs the same check on a real single-node cluster."""

import math

import pytest

from encoder_study.core import cluster

SINFO = ("cpu*|2|24000|(null)|infinite\n"
         "gpu|16|128000|gpu:h200:1(S:0)|2-00:00:00\n"
         "gpu|32|256000|gpu:8|2-00:00:00\n")
PARTITIONS = {"cpu": {}, "gpu": {"max_gpu": 8}}


def request(rule="parity_latency", threads=1, mem_mb=1000, minutes=30, gpus=0,
            key="parity.latency_threads"):
    return cluster.Request(rule, threads, mem_mb, minutes, gpus, key)


def test_sinfo_node_lines_are_read():
    nodes = cluster.parse_sinfo(SINFO)
    assert [(n.partition, n.cpus, n.mem_mb, n.gpus) for n in nodes] == [
        ("cpu", 2, 24000, 0), ("gpu", 16, 128000, 1), ("gpu", 32, 256000, 8)]
    assert math.isinf(nodes[0].minutes) and nodes[1].minutes == 2 * 1440


@pytest.mark.parametrize(("limit", "minutes"), [("60", 60), ("1:30:00", 90), ("45:00", 45),
                                                 ("1-02:00:00", 1560), ("UNLIMITED", math.inf)])
def test_time_limits(limit, minutes):
    assert cluster._minutes(limit) == minutes


def test_jobs_that_fit_somewhere_pass():
    nodes = cluster.parse_sinfo(SINFO)
    fits = [request(threads=2), request(rule="student_distill", threads=32, mem_mb=200000, gpus=8,
                                        minutes=2000, key="threads.student_distill")]
    assert cluster.problems(fits, nodes, PARTITIONS) == []


def test_each_job_no_node_can_start_is_one_line_naming_its_key():
    """A job without GPUs may go to any partition (a GPU one when no other fits, as the slurm executor
    chooses), so 8 threads fit on a GPU node here; 40 fit nowhere."""
    nodes = cluster.parse_sinfo(SINFO)
    tail = "no node can start it; lower the request in the config or give a partition that holds it"
    found = cluster.problems([request(threads=8),
                              request(rule="writeback_speed", threads=40, key="writeback.threads"),
                              request(rule="student_distill", gpus=2, threads=64,
                                      key="threads.student_distill"),
                              request(rule="tagging_train", gpus=1, minutes=5000, key="threads.default")],
                             nodes, PARTITIONS)
    assert found == [
        f"student_distill asks for 64 CPUs (threads.student_distill), the largest node has 32 in "
        f"partition(s) gpu: {tail}",
        f"tagging_train asks for 5000 min (resources.tagging_train.runtime), the limit is 2880 in "
        f"partition(s) gpu: {tail}",
        f"writeback_speed asks for 40 CPUs (writeback.threads), the largest node has 32 in partition(s) cpu, "
        f"gpu: {tail}",
    ]


def test_requests_that_each_fit_but_not_together_are_named():
    nodes = cluster.parse_sinfo("cpu*|32|1000|(null)|infinite\ncpu*|2|64000|(null)|infinite\n")
    found = cluster.problems([request(threads=16, mem_mb=32000)], nodes, {"cpu": {}})
    assert len(found) == 1 and "16 CPUs, 32000 MB, 0 GPUs and 30 min together" in found[0]


def test_a_gpu_job_goes_only_where_gpus_are():
    nodes = cluster.parse_sinfo("cpu*|64|512000|(null)|infinite\n")
    found = cluster.problems([request(rule="student_distill", gpus=1, key="threads.student_distill")], nodes,
                             {"cpu": {}})
    assert found == ["student_distill: no node in partition(s) (none) (profiles/slurm/partitions.yaml "
                     "names cpu; sinfo shows cpu)"]
