"""A training step on a busy CPU (issue 48): the demo config's step time beside 0, 1 and 2 busy processes, under
each thread setting, and what the dry run, the start-up line and the step-3 line said of the same run.

    python benchmarks/busy_cpu.py --data data/stdlib-bpe4096 --out benchmarks/busy-cpu/before.json \
        --variants 'default=,passive=OMP_WAIT_POLICY=PASSIVE,one-thread=OMP_NUM_THREADS=1'

A busy process is a Python loop that never sleeps (`while True: pass`), one core's worth of other work. Each
variant runs `angpt train --config configs/demo-angpt.yaml` for `--steps` steps (no evaluation, no checkpoints) in
turns with the others, `--rounds` times; its step time is the median of its steps after the first two. The fair
share of a step beside k busy processes on c cores is its quiet time x (k + threads) / c where that exceeds 1:
what the machine can give it. Nothing here is a test: numbers go to benchmarks/RESULTS.md with the machine."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANGPT = [sys.executable, "-m", "angpt"]


def spinners(k: int) -> list[subprocess.Popen]:
    """k processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def parse_variants(text: str) -> dict[str, dict[str, str]]:
    """'name=KEY=V;KEY2=V2,other=' -> {name: {KEY: V, ...}, other: {}}."""
    out: dict[str, dict[str, str]] = {}
    for item in text.split(","):
        name, _, env = item.partition("=")
        out[name] = dict(kv.split("=", 1) for kv in env.split(";") if kv)
    return out


def run_once(data: str, steps: int, env: dict[str, str], config: str) -> dict:
    """One short training run: its step times, its start-up and step-3 lines, and the dry run's estimate."""
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")} | env
    common = ["train", "--config", config, "--data", data, "--train.max_steps", str(steps)]
    with tempfile.TemporaryDirectory() as tmp:
        dry = subprocess.run(
            [*ANGPT, *common, "--out", f"{tmp}/dry", "--dry-run"], capture_output=True, text=True, env=full
        )
        t0 = time.perf_counter()
        res = subprocess.run(
            [*ANGPT, *common, "--out", f"{tmp}/run", "--train.eval_every", "0", "--train.save_every", "0",
             "--train.log_every", "1", "--train.progress", "true"],
            capture_output=True, text=True, env=full,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"busy_cpu: training failed: {res.stderr.strip().splitlines()[-1:]}")
        rows = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [r["step_time"] for r in rows if "step_time" in r]
    text = res.stdout + res.stderr
    dry_step = re.search(r"time .*?: ([\d.e+]+) s/step", dry.stdout)
    return {
        "step_times": times,
        "median_after_2": statistics.median(times[2:]) if len(times) > 2 else None,
        "wall_s": round(wall, 2),
        "startup_line": next((x.strip() for x in text.splitlines() if x.strip().startswith("time ")), None),
        "step3_line": next((x.strip() for x in text.splitlines() if x.strip().startswith("after step")), None),
        "dry_run_s_per_step": float(dry_step.group(1)) if dry_step else None,
        "dry_run_line": next((x.strip() for x in dry.stdout.splitlines() if x.strip().startswith("time ")), None),
        "mfu_max": max((r.get("mfu", 0) for r in rows), default=None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="a JSON file of every run (refused if it exists)")
    p.add_argument("--config", default=str(ROOT / "configs" / "demo-angpt.yaml"))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--loads", default="0,1,2", help="busy processes beside the run (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="angpt=", help="name=ENV=V;ENV2=V2,... (default: %(default)s)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        print(f"busy_cpu: {out} exists; give another --out", file=sys.stderr)
        return 2
    variants = parse_variants(args.variants)
    results: dict = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cores": os.cpu_count(),
        "runs": [],
    }
    for load in (int(x) for x in args.loads.split(",")):
        busy = spinners(load)
        try:
            time.sleep(1.0)
            for rnd in range(args.rounds):
                for name, env in variants.items():
                    r = run_once(args.data, args.steps, env, args.config)
                    results["runs"].append({"load": load, "variant": name, "round": rnd, **r})
                    print(f"load {load} {name:12s} round {rnd}: {r['median_after_2']:.3f} s/step "
                          f"(dry run {r['dry_run_s_per_step']}, {r['step3_line']})", flush=True)  # fmt: skip
        finally:
            for s in busy:
                s.kill()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
