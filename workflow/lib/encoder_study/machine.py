"""Facts about the machine a command runs on, and the thread count it may use. Standard library
only: the Snakefile imports it too.

One owner for the clamp: a command asked for more threads than the machine has would only
oversubscribe its cores, so every library function that sets thread counts goes through here.
"""

from __future__ import annotations

import os


def cores() -> int:
    """The cores this process may run on: its CPU affinity (a Slurm allocation, `taskset`, a
    container's cpuset), which can be fewer than the machine has (`os.cpu_count()`)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def usable_threads(wanted: int) -> int:
    """`wanted`, at least 1 and at most the cores this process may run on."""
    return max(1, min(int(wanted), cores()))


def torch_threads(wanted: int) -> int:
    """Set PyTorch's intra-op thread count to `usable_threads(wanted)` and return it."""
    import torch

    threads = usable_threads(wanted)
    torch.set_num_threads(threads)
    return threads


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for timing fragments."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unavailable"
