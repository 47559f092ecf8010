"""keep_freed_memory: glibc keeps freed blocks for reuse (CPU training); training turns it on, the env turns it off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A 64 MiB tensor, freed: how far the process's resident memory falls (MiB), with the setting on or off.
PROBE = """
import os, sys, torch
from angpt.train.hardware import keep_freed_memory
def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20
print(keep_freed_memory())
x = torch.ones(16 << 20)
before = rss(); del x; print(before - rss())
"""


def probe(env: dict[str, str]) -> tuple[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env={**env, "OMP_NUM_THREADS": "1"}
    ).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_freed_memory_is_kept_for_reuse():
    # glibc's own malloc with its defaults: no preloaded allocator, no MALLOC_* tunables from the caller
    env = {k: v for k, v in os.environ.items() if k not in ("ANGPT_KEEP_FREED_MEMORY", "LD_PRELOAD", "GLIBC_TUNABLES")}
    env = {k: v for k, v in env.items() if not k.startswith("MALLOC_")}
    on, kept_drop = probe(env)
    off, plain_drop = probe({**env, "ANGPT_KEEP_FREED_MEMORY": "0"})
    assert (on, off) == ("True", "False")
    assert plain_drop > 48  # glibc's default returns a freed 64 MiB block to the kernel at once ...
    assert kept_drop < 8  # ... and keeps it for the next step's allocations with the setting on


def test_training_on_cpu_keeps_freed_memory(data_dir, tmp_path, monkeypatch):
    """The trainer turns the setting on for a CPU run (the compare worker and scaling train through it)."""
    from angpt.train import loop
    from angpt.train.config import load_run_config, parse_overrides

    from .test_train import TINY

    calls = []
    monkeypatch.setattr(loop, "keep_freed_memory", lambda: calls.append(1) or True)
    args = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", tmp_path / "run", "--train.max_steps", "1"]
    loop.train(load_run_config(None, parse_overrides([str(a) for a in args])))
    assert calls == [1]


def test_busy_cores_reads_the_other_processes_cpu_time(monkeypatch):
    """/proc/stat's first line twice, 0.25 s apart: non-idle time over all time, in cores; iowait counts as idle."""
    import angpt.train.hardware as hardware

    class Stat:  # cpu user nice system idle iowait irq softirq steal: 300 of 400 jiffies busy on 2 cores -> 1.5
        reads = iter(["cpu 100 0 0 100 0 0 0 0\n", "cpu 350 0 50 150 50 0 0 0\n"])

        def read_text(self):
            return next(self.reads)

    monkeypatch.undo()  # conftest's quiet machine: the real reading here
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 2)
    assert hardware.busy_cores(0.0, Stat()) == 1.5
    assert hardware.busy_cores(0.0, hardware.Path("/nonexistent/stat")) == 0.0


def test_a_busy_machine_is_said_and_a_quiet_one_is_not(monkeypatch):
    """The note the start-up summary and the dry run print: nothing below half a core of other work; the run keeps
    its threads either way (fewer did not help: benchmarks/RESULTS.md)."""
    import torch

    import angpt.train.hardware as hardware

    n = torch.get_num_threads()
    for busy, said in ((0.3, False), (1.9, True)):
        monkeypatch.setattr(hardware, "busy_cores", lambda *a, b=busy, **k: b)
        share = hardware.cpu_share()
        assert share.threads == n == torch.get_num_threads() and bool(share.note()) == said
    assert share.note().startswith("the machine is busy: other processes keep 1.9 of its ")
