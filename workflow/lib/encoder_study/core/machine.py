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


# -- the theoretical float32 peak -----------------------------------------------------------------------

def cpuinfo_fields(text: str | None = None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (or of `text`); {} where there is none."""
    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block ends
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _max_mhz() -> tuple[float, str] | None:
    """The cores' highest clock where the system says it: cpufreq, then lscpu (which reads the same
    sysfs, or the CPU's own table); None inside most virtual machines, which expose neither."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", encoding="ascii") as handle:
            return int(handle.read()) / 1000, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    import shutil
    import subprocess

    if shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                                 env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "")}).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "CPU max MHz":
                try:
                    return float(value), "lscpu CPU max MHz"
                except ValueError:
                    break
    return None


def simd_units(flags: set[str], vendor: str, family: int, model: int) -> tuple[int, int, str]:
    """(FMA units per core, float32 lanes per unit, how they were decided) from the CPU's flags.

    Lanes: 16 with avx512f, 8 with avx, 4 otherwise (SSE). Units: 2 with fma (Intel since Haswell, AMD
    since Zen issue two FMAs a cycle), else 1 (a multiply and an add pipe: one multiply-add a cycle).
    AMD's data paths are narrower than the widest instruction on some generations: Zen and Zen+ (family
    0x17, models below 0x30) split 256-bit work into 128-bit halves, Zen 2 to Zen 4 (0x17, 0x19) run
    AVX-512 on 256-bit units; Zen 5 (0x1A) and later are taken at 512 bits. Some Intel parts with
    AVX-512 have one 512-bit FMA unit, not two: there the result is twice their peak."""
    bits = 512 if "avx512f" in flags else 256 if "avx" in flags else 128
    units = 2 if "fma" in flags else 1
    rule = f"{'avx512f' if bits == 512 else 'avx' if bits == 256 else 'sse'}: {bits}-bit vectors; " \
           f"{'fma: 2 FMA units' if units == 2 else 'no fma: 1 multiply-add a cycle'}"
    if vendor == "AuthenticAMD" and family in (0x17, 0x19):
        path = 128 if family == 0x17 and model < 0x30 else 256
        if path < bits:
            bits, rule = path, rule + f"; AMD family {family:#x} model {model:#x}: {path}-bit data paths"
    return units, bits // 32, rule


def fp32_peak(threads: int, cpuinfo: str | None = None) -> dict:
    """The theoretical float32 peak at `threads` threads, with its inputs:
    cores x FMA units x lanes x 2 (a multiply-add) x clock. The clock is the highest the system states
    (cpufreq, lscpu), else /proc/cpuinfo's `cpu MHz`: the current or, in a virtual machine, the host's
    nominal clock, which boost clocks exceed (a measured rate above this peak says so)."""
    fields = cpuinfo_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())

    def number(key: str) -> int:
        try:
            return int(fields.get(key, ""))
        except ValueError:
            return -1

    units, lanes, rule = simd_units(flags, fields.get("vendor_id", ""), number("cpu family"), number("model"))
    stated = _max_mhz() if cpuinfo is None else None
    if stated is None:
        try:
            stated = float(fields["cpu MHz"]), "/proc/cpuinfo cpu MHz"
        except (KeyError, ValueError):
            stated = 0.0, "unknown"
    mhz, source = stated
    cores_used = usable_threads(threads)
    return {"gflops": cores_used * units * lanes * 2 * mhz / 1000, "cores": cores_used, "fma_units": units,
            "lanes": lanes, "ghz": mhz / 1000, "clock_source": source, "rule": rule,
            "cpu": fields.get("model name", "unknown")}


def peak_text(peak: dict) -> str:
    """One line: the peak and its inputs."""
    cores = f"{peak['cores']} core{'' if peak['cores'] == 1 else 's'}"
    return (f"{peak['gflops']:.1f} GFLOP/s = {cores} x {peak['fma_units']} FMA units x "
            f"{peak['lanes']} float32 lanes x 2 x {peak['ghz']:.3f} GHz ({peak['clock_source']}); "
            f"{peak['cpu']}; {peak['rule']}")
