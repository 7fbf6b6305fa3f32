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


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def resident_kib() -> int:
    """This process's resident set now (VmRSS, KiB); 0 where /proc is not there."""
    return _status_kib("VmRSS") or 0


def peak_resident_kib() -> int:
    """This process's peak resident set (VmHWM, KiB) since it started or since `reset_peak`;
    ru_maxrss (not resettable) where /proc is not there. Counts what PyTorch and ONNX Runtime
    allocate, which tracemalloc does not see."""
    peak = _status_kib("VmHWM")
    if peak is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak


# The largest peak that reset_peak has cleared in this process: the kernel's own high-water marks
# (VmHWM and ru_maxrss alike) forget it.
_CLEARED_PEAK_KIB = 0


def lifetime_peak_kib() -> int:
    """This process's peak resident set (KiB) since it started, including what reset_peak cleared.

    Not ru_maxrss where VmHWM exists: Linux carries ru_maxrss over from the parent at fork and keeps it
    across exec, so a command started by a large process (pytest, Snakemake) would report its parent's
    peak; VmHWM belongs to the process's own address space, new at exec."""
    return max(_CLEARED_PEAK_KIB, peak_resident_kib())


def reset_peak() -> bool:
    """Reset the peak resident set to the current one (Linux: `5` to /proc/self/clear_refs), so that
    `peak_resident_kib` afterwards is the peak of what follows; False where it cannot be reset.
    `lifetime_peak_kib` keeps the peak it clears.

    Freed heap is first given back to the system (glibc's malloc_trim): otherwise pages freed before
    stay resident, what follows reuses them, and its cost would not show in the peak."""
    global _CLEARED_PEAK_KIB
    _CLEARED_PEAK_KIB = lifetime_peak_kib()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the peak may understate what follows
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False
