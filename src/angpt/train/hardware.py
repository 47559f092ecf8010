"""Accelerators: dense bf16 peak FLOP/s and memory (one table for MFU and dry runs), a measured CPU peak, and
whether bf16 pays on this CPU."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s (no 2:4 sparsity)
    memory: float  # bytes (1 GB = 1e9 bytes) a training process can plan with
    source: str


# Vendor datasheets quote bf16 "with sparsity"; dense is half of that. GB here is 1e9 bytes: the datasheets'
# "80GB" parts expose ~85e9 bytes, so planning with 80e9 leaves room for the CUDA context and allocator slack.
ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        # NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity); 80GB HBM2e (also sold as 40GB).
        Accelerator("A100", 312e12, 80e9, "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 80 GB"),
        # NVIDIA H100 datasheet, SXM5: BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989.5 dense; 80GB HBM3.
        Accelerator("H100", 989.5e12, 80e9, "NVIDIA H100 datasheet (SXM): 1979/2 TFLOPS bf16 dense, 80 GB"),
        # NVIDIA H200 datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989.5 dense; 141GB HBM3e.
        Accelerator("H200", 989.5e12, 141e9, "NVIDIA H200 datasheet (SXM): 1979/2 TFLOPS bf16 dense, 141 GB"),
        # NVIDIA HGX/DGX B200 datasheets: FP16/BF16 Tensor Core 4.5 PFLOPS per GPU with sparsity -> 2.25 dense;
        # 1,440 GB per 8 GPUs = 180 GB each (the package carries 192 GB of HBM3e; ~180 GB is usable).
        Accelerator("B200", 2250e12, 180e9, "NVIDIA HGX/DGX B200 datasheets: 4.5/2 PFLOPS bf16 dense, 180 GB"),
    )
}
# Other devices the training loop recognises for MFU. H100 PCIe: the H100 datasheet's 1,513 TFLOPS with sparsity,
# halved. The rest are carried over from the previous table and not re-checked (V100 has no bf16: its fp16 peak).
_MFU_ONLY = {"H100 PCIe": 756e12, "L40S": 362e12, "A10G": 125e12, "RTX 4090": 165e12, "V100": 125e12}


def accelerator(name: str) -> Accelerator:
    """The table's entry for a name as `--dry-run-gpu` takes it (case-insensitive); KeyError if unknown."""
    for key, acc in ACCELERATORS.items():
        if key.lower() == name.lower():
            return acc
    raise KeyError(name)


def peak_for_device_name(device_name: str) -> float | None:
    """Dense bf16 peak of a CUDA device by its reported name ("NVIDIA H100 80GB HBM3"), None if not in the table."""
    table = {**{k: a.peak_flops for k, a in ACCELERATORS.items()}, **_MFU_ONLY}
    for key in sorted(table, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key.lower() in device_name.lower():
            return table[key]
    return None


CPU_PEAK_SECONDS = 0.3  # how long the CPU peak is measured for: ~50 bf16 / ~25 fp32 matmuls on 2 cores
# ... and where one matmul outlasts this, that one is the figure: bf16 emulated on a CPU without bf16 instructions
# takes 1.7 s a matmul on a 2-core EPYC (AVX2), and the six of the rule above made a paper recipe's dry run 18 s
CPU_PEAK_MAX_SECONDS = 1.0


def measured_cpu_peak(dtype: str = "fp32") -> float:
    """FLOP/s of this machine's CPU on 1024 x 1024 matmuls in `dtype` ("fp32" | "bf16") at torch's current thread
    count: the best over at least 0.3 s of them, measured once per process and thread count. A measured peak rather
    than a datasheet one: CPUs differ by vector units, threads and load. Not the best of a handful: on a 2-core VM
    the first dozen matmuls of a process can run at half speed (the second core busy elsewhere for a moment), which
    read 197 GFLOP/s where 380 was there, and the progress bar showed 85-100% MFU (benchmarks/RESULTS.md). A matmul
    slower than CPU_PEAK_MAX_SECONDS is timed once: a moment's hiccup does not halve a second-long matmul."""
    return _cpu_peak(dtype, torch.get_num_threads())


@functools.lru_cache(maxsize=8)
def _cpu_peak(dtype: str, threads: int) -> float:
    return matmul_peak(
        dtype, torch.device("cpu"), n=1024, reps=5, min_time=CPU_PEAK_SECONDS, max_time=CPU_PEAK_MAX_SECONDS
    )


# bf16 autocast is worth its rounding on a CPU only where bf16 matmuls are clearly faster than fp32 ones: 2x on
# AVX512-BF16 EPYCs, more with AMX, but 0.5-0.65x on a Xeon whose hypervisor hides AMX (benchmarks/RESULTS.md).
BF16_MIN_SPEEDUP = 1.5
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "flags", ...); empty where the OS has none."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The fields of the first processor block of a /proc/cpuinfo text."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the end of the first processor's block
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def cpu_flags() -> frozenset[str]:
    """The feature flags of this machine's CPU (empty where the OS does not say)."""
    return frozenset(cpu_info().get("flags", "").split())


def cpu_bf16_instructions() -> list[str]:
    """The bf16 matmul instructions this CPU has (AMX, AVX512-BF16); without them torch emulates bf16."""
    return [f for f in CPU_BF16_FLAGS if f in cpu_flags()]


@functools.lru_cache(maxsize=1)
def cpu_bf16_speedup() -> float:
    """bf16 over fp32 matmul throughput on this CPU; 0.0, unmeasured, on a CPU without bf16 instructions.

    The flags alone do not say it: a Xeon whose hypervisor hides AMX still reports AVX512-BF16, and its bf16
    matmuls run at 0.5-0.65x fp32's. Measured once per machine (CPU model and flags, torch version, threads) and
    kept in `cache_dir()/cpu_bf16.json`, so that `train.dtype: auto` gives one machine one answer: a single
    short measurement moved between 2.4x and 17x from run to run on one EPYC (issue 24).
    """
    if not cpu_bf16_instructions():
        return 0.0
    key = _machine_key()
    path = cache_dir() / "cpu_bf16.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), (int, float)):
        return float(known[key])
    speedup = measure_bf16_speedup()
    known = known if isinstance(known, dict) else {}
    known[key] = round(speedup, 3)
    try:  # a read-only home still trains; it just measures again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
    return speedup


def measure_bf16_speedup(time_matmul=None, trials: int = 7) -> float:
    """t(fp32) / t(bf16), each the fastest of `trials` timings taken in turns (`time_matmul(dtype)`: seconds for a
    fixed amount of matmul work; default three 1024 x 1024 products, ~50 ms, after a warm-up of both). Other work
    on the machine only ever slows a timing down, so the fastest of several is the machine's own speed."""
    time_matmul = time_matmul or _time_matmul()
    best = {"fp32": math.inf, "bf16": math.inf}
    for _ in range(trials):
        for dtype in best:
            best[dtype] = min(best[dtype], time_matmul(dtype))
    return best["fp32"] / max(best["bf16"], 1e-12)


def _time_matmul(n: int = 1024, reps: int = 3):
    mats = {d: (torch.randn(n, n).to(t), torch.randn(n, n).to(t)) for d, t in (("fp32", torch.float32),
            ("bf16", torch.bfloat16))}  # fmt: skip

    def timed(dtype: str) -> float:
        a, b = mats[dtype]
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        return time.perf_counter() - t0

    timed("fp32"), timed("bf16")  # warm-up: thread pool, kernel selection, packing
    return timed


def cache_dir() -> Path:
    """Where measurements of this machine are kept: $ANGPT_CACHE_DIR, or $XDG_CACHE_HOME/angpt, ~/.cache/angpt."""
    if os.environ.get("ANGPT_CACHE_DIR"):
        return Path(os.environ["ANGPT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "angpt"


def _machine_key() -> str:
    info = cpu_info()
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return f"{info.get('model name', 'unknown cpu')} | flags {flags} | torch {torch.__version__} | " + (
        f"threads {torch.get_num_threads()}"
    )


def cpu_prefers_bf16() -> bool:
    """Whether bf16 autocast pays on this CPU: bf16 instructions and bf16 matmuls >= BF16_MIN_SPEEDUP x fp32's."""
    return cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


def cpu_bf16_summary() -> dict[str, object]:
    """What decides bf16 on this CPU, for provenance: its bf16 instructions and the measured matmul speedup."""
    speedup = cpu_bf16_speedup()
    return {
        "cpu_bf16_instructions": cpu_bf16_instructions(),
        "cpu_bf16_matmul_speedup": round(speedup, 2) if speedup else None,
        "cpu_auto_dtype": "bf16" if cpu_prefers_bf16() else "fp32",
    }


def cpu_memory() -> float:
    """This machine's physical memory in bytes (0 when the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def process_resident() -> float:
    """This process's resident memory in bytes now (0 where /proc does not say): on Linux, /proc/self/statm."""
    try:
        return float(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
KEEP_FREED_MEMORY_ENV = "ANGPT_KEEP_FREED_MEMORY"


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse, for CPU training; True when it now does.

    By default glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh mmap and returns
    it to the kernel on free, and trims the heap's free top; a training step frees and re-allocates the same
    activation-sized blocks every step, so each step page-faults them in again and the kernel zeroes every page.
    With mmap off (M_MMAP_MAX = 0) and a 1 GiB trim threshold the blocks stay in the heap and are reused: the same
    results, 6-7% (fp32) and 12-20% (bf16) shorter training steps at the demo preset on a 2-core EPYC VM, peak
    RSS +1% (benchmarks/RESULTS.md, "Keeping freed memory"). Process-wide and one-way; set
    ANGPT_KEEP_FREED_MEMORY=0 to leave malloc as it is. A no-op (False) off Linux/glibc.
    """
    if os.environ.get(KEEP_FREED_MEMORY_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def matmul_peak(
    dtype: str,
    device: torch.device,
    n: int | None = None,
    reps: int = 5,
    min_time: float = 0.0,
    batch: int | None = None,
    max_time: float = math.inf,
) -> float:
    """FLOP/s of a square n x n matmul in `dtype` on `device`: the best of at least `reps` timings after a warm-up,
    and more until `min_time` seconds have passed (at most 500). A timing that outlasts `max_time` ends it, and the
    timings so far are the figure (the warm-up's too: its start-up costs milliseconds, not seconds).

    Each timing covers `batch` matmuls between two synchronisations: one on a CPU (n = 2048), ten on a GPU
    (n = 8192). A GPU finishes a 2048-size bf16 matmul in ~20 us, about what a synchronisation costs, so timing it
    alone halves the figure (the H200 loan of 2026-11-27 read 404 TFLOP/s this way where its 8192-size matmuls ran
    at 781)."""
    n_default, batch_default = peak_shape(device)
    n, batch = n or n_default, batch or batch_default
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    best, start, i = math.inf, time.perf_counter(), 0
    while i <= reps or (time.perf_counter() - start < min_time and i <= 500):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(batch):
            a @ b
        _sync(device)
        took = time.perf_counter() - t0
        if i or took >= max_time:
            best = min(best, took / batch)
        i += 1
        if took >= max_time:
            break
    return 2 * n**3 / best


def peak_shape(device: torch.device) -> tuple[int, int]:
    """(matrix size, matmuls per timing) of `matmul_peak` on `device`: (8192, 10) on a GPU, (2048, 1) on a CPU."""
    return (8192, 10) if device.type == "cuda" else (2048, 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------- a busy machine
# A CPU step's threads wait for each other at every parallel region. Beside other work, threads that spin while they
# wait (OpenMP's default) burn the cores the other processes need: the demo step took 12.7 s beside two busy
# processes on 2 cores where it takes ~3.5 s quiet, 7-9 s with passive waiting (benchmarks/RESULTS.md, "A training
# step on a busy CPU"). So the command line asks OpenMP to wait passively (cli.py sets OMP_WAIT_POLICY before torch
# loads; the user's, where set, wins). Fewer threads did not help further here (one thread: 8.4-8.7 s beside two busy
# processes, 5.3-5.9 s beside one, against two threads' 6.9-7.2 and 5.4-7.1): the run keeps torch's thread count,
# and says that the machine is busy, since its steps will take longer than quiet ones.


@dataclass(frozen=True)
class CpuShare:
    threads: int  # what the run uses
    busy: float  # cores other processes kept busy when it started
    cores: int  # cores this process may run on

    def note(self) -> str:
        """'' on a quiet machine, else what the start-up summary and the dry run say of it."""
        if self.busy < 0.5:
            return ""
        return (
            f"the machine is busy: other processes keep {self.busy:.1f} of its {self.cores} cores busy, so steps "
            f"take longer than on a quiet machine ({self.threads} thread(s), waiting passively)"
        )


def busy_cores(seconds: float = 0.25, stat: Path = Path("/proc/stat")) -> float:
    """The cores other processes keep busy now: the machine's non-idle CPU time over `seconds` (this process sleeps
    meanwhile), in cores; 0.0 where the OS has no /proc/stat."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]
        return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0)  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    if total1 <= total0:
        return 0.0
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def cpu_share() -> CpuShare:
    """How busy this machine is as a CPU run starts, and the threads it runs with."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CpuShare(torch.get_num_threads(), busy_cores(), cores)
