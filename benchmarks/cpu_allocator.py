"""Training-step time with glibc's default malloc against `keep_freed_memory` (angpt.train.hardware), in turns.

The setting is process-wide and one-way, so each measurement is its own `angpt bench step` process, run with
ANGPT_KEEP_FREED_MEMORY=0 (glibc's default) and =1 (kept, what training uses on CPU) alternately for `--rounds`
rounds; prints each process's per-arch median ms and, per arch, the median over rounds of the kept/default ratio
taken pair by pair, and each process's peak RSS (getrusage). Usage:

    OMP_NUM_THREADS=1 python benchmarks/cpu_allocator.py --arch gpt+,ngpt,angpt --dtype bf16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

# `angpt bench step ...`, then this process's peak resident memory
CHILD = (
    "import resource, sys; from angpt.cli import main; rc = main(sys.argv[1:]); "
    "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
)


def bench(setting: str, args: argparse.Namespace) -> tuple[dict[str, float], float]:
    cmd = [sys.executable, "-c", CHILD, "bench", "step", "--arch", args.arch, "--preset", args.preset]
    cmd += ["--dtype", args.dtype, "--reps", str(args.reps), "--warmup", str(args.warmup)]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, "ANGPT_KEEP_FREED_MEMORY": setting}
    ).stdout
    rows = re.findall(r"^\| (\S+) \| [\d.]+M \| ([\d.]+) \|", out, flags=re.M)
    peak = float(re.search(r"^maxrss_kib (\d+)", out, flags=re.M).group(1)) / 1024
    return {arch: float(ms) for arch, ms in rows}, peak


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="gpt+,ngpt,angpt")
    p.add_argument("--preset", default="demo")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        default, rss_default = bench("0", args)
        kept, rss_kept = bench("1", args)
        print(f"round {r}: default {default} ms, peak RSS {rss_default:.0f} MiB", flush=True)
        print(f"round {r}: kept    {kept} ms, peak RSS {rss_kept:.0f} MiB", flush=True)
        for arch in default:
            ratios.setdefault(arch, []).append(kept[arch] / default[arch])
    for arch, rs in ratios.items():
        print(f"{arch}: kept / default = {statistics.median(rs):.3f} (rounds: {', '.join(f'{x:.3f}' for x in rs)})")


if __name__ == "__main__":
    main()
