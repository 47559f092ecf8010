"""How often the trainer's onset warning (angpt.train.watch) fires, in runs that spike and in runs that do not.

    python benchmarks/watch_calibration.py --data data/stdlib-bytes --out benchmarks/watch-calibration-cpu \\
        --shapes controls,depth12,d256 --lrs 2e-3,4e-3,8e-3,1.6e-2,3.2e-2,6.4e-2,1.28e-1 --seeds 0,1,2 --steps 100

Every (shape, lr, seed) trains anGPT with its recipe for --steps optimizer steps (angpt.bench.firststeps: the
trainer's step, not stopped at a loss rise, only at a NaN) and records every layer's ||h|| on a held-out batch
before the first step and after every step. The GPU and CPU sweeps at gpt2-small stored under benchmarks/ (their
results.json) are read too (their step-0 norm is taken as 1: anGPT's embeddings and first block keep it there at
init). Each run is labelled as the issue-22 criteria read the first steps: a *spike* when, from step 2 on, the loss
is not finite, exceeds 1.3x its running minimum, or a pre-clip gradient norm exceeds 100x the run's median;
*calm* otherwise. Then each detector is replayed on the measurements the trainer would take (every step of the
first ResidualWatch.EARLY, every 10th after): how many calm runs it warns (false alarms), and how many spiking runs
it warns before their first spike. The default was chosen on the `controls` and `depth12` runs (TUNING) and checked
on the others. OUT/runs.jsonl holds the runs (re-running skips those done), OUT/report.md the
table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from angpt.bench.firststeps import first_steps
from angpt.data import TokenLoader, load_meta
from angpt.models import build_model, inspect_norms, registry
from angpt.train.step import autocast
from angpt.train.watch import ResidualWatch

HERE = Path(__file__).resolve().parent
# Shapes: model overrides of the demo preset and sequences per step (x 128 tokens).
SHAPES = {
    "controls": ({"d_model": 48, "n_layers": 3, "n_heads": 3}, 16),  # benchmarks/evidence-cpu-controls
    "depth12": ({"d_model": 32, "n_layers": 12, "n_heads": 2}, 16),  # benchmarks/nu-att-depth12-v2-cpu
    "demo": ({"d_model": 128, "n_layers": 4, "n_heads": 2}, 8),  # make demo's comparison
    "d256": ({"d_model": 256, "n_layers": 6, "n_heads": 4}, 16),
}
SEQ, LOG_EVERY = 128, 10
DETECTORS = {  # name: ResidualWatch's (jump, window); jump None: the bound alone (the watch before 2026-11-26)
    "bound alone": (None, 1),
    "x2 the previous (default)": (ResidualWatch.JUMP, ResidualWatch.WINDOW),
    "x3 the previous": (3.0, 1),
    "x4 the previous": (4.0, 1),
    "x2 the least of the last 2": (2.0, 2),
    "x4 the least of the last 2": (4.0, 2),
    "x2 the least of the last 5": (2.0, 5),
    "x3 the least of the last 5": (3.0, 5),
}
# The default was chosen on the tuning shapes alone (the fewest false alarms among the detectors that warn every
# spiking run in time; a tie goes to the shorter window); the other groups check it.
TUNING = ("controls", "depth12")


def init_norms(shape: str, seed: int, probe: torch.Tensor, vocab: int, dtype: str) -> list[float]:
    """Each layer's ||h|| before the first step: the model first_steps builds (same seed), measured as after."""
    torch.manual_seed(seed)
    net = build_model("angpt", "demo", **SHAPES[shape][0], vocab_size=vocab, context_length=SEQ).eval()
    with torch.no_grad(), autocast(probe.device, dtype):
        norms = inspect_norms(net, probe)
    return [float(norms[f"layer{i}.h"]) for i in range(len(net.blocks))]


def train(a: argparse.Namespace, shape: str, lr: float, seed: int, vocab: int) -> dict:
    overrides, batch = SHAPES[shape]
    loader = TokenLoader(a.data, "train", batch, SEQ, seed=seed)
    probe, _ = TokenLoader(a.data, "val", 4, SEQ, seed=0).next_batch()
    run = first_steps(
        "angpt", "demo", lr, a.steps, loader.next_batch, probe, batch_tokens=batch * SEQ, dtype=a.dtype,
        seed=seed, stop_factor=math.inf, vocab_size=vocab, context_length=SEQ, **overrides,
    )  # fmt: skip
    records = [{k: r.get(k) for k in ("step", "loss", "grad_norm", "residual_norms")} for r in run.records]
    start = init_norms(shape, seed, probe, vocab, a.dtype)
    command = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    return {"source": "trained here", "command": command, "shape": shape, "lr": lr, "seed": seed, "init": start,
            "records": records}  # fmt: skip


def stored_runs() -> list[dict]:
    """The gpt2-small sweeps of the GPU kit and its CPU stand-in stored under benchmarks/ (anGPT arms only)."""
    runs = []
    for path in sorted(HERE.glob("**/results.json")):
        try:
            sweep = json.loads(path.read_text()).get("sweep")
        except (ValueError, AttributeError):
            continue
        for r in sweep if isinstance(sweep, list) else []:
            recs = r.get("records") or []
            if not r.get("arm", "").startswith("angpt") or not recs or "residual_norms" not in recs[0]:
                continue
            n = len(recs[0]["residual_norms"])
            runs.append(
                {"source": str(path.parent.relative_to(HERE)), "shape": f"gpt2-small ({r['arm']})", "lr": r["lr"],
                 "seed": 0, "init": [1.0] * n, "records": recs}
            )  # fmt: skip
    return runs


def first_spike(records: list[dict]) -> int | None:
    """The first step (from 2 on) with a non-finite loss, a loss above 1.3x its running minimum, or a pre-clip
    gradient norm above 100x the run's median; None for a calm run."""
    grads = [r["grad_norm"] for r in records if r["grad_norm"] is not None and math.isfinite(r["grad_norm"])]
    median = statistics.median(grads) if grads else math.inf
    low = math.inf
    for r in records:
        loss, grad = r["loss"], r["grad_norm"]
        bad_grad = grad is None or not math.isfinite(grad) or grad > 100 * median
        if r["step"] >= 2 and (not math.isfinite(loss) or loss > 1.3 * low or bad_grad):
            return r["step"]
        low = min(low, loss)
    return None


def warned_at(run: dict, jump: float | None, window: int = 1) -> int | None:
    """The step the trainer's watch (with `jump`, `window`) would warn at, replayed on the run's measurements."""
    watch = ResidualWatch(registry.get("angpt").residual_bound, None, "fp32", "", jump=jump, window=window)
    watch.recent.append(max(run["init"]))
    for r in run["records"]:
        norms = r.get("residual_norms")
        if norms is None or not watch.due(r["step"], LOG_EVERY):
            continue
        if watch.observe(r["step"], [x if math.isfinite(x) else math.inf for x in norms]):
            return r["step"]
    return None


def render(runs: list[dict]) -> str:
    commands = dict.fromkeys(r["command"] for r in runs if r["source"] == "trained here")
    lines = [
        "# The onset warning against the runs that spike",
        "",
        *(f"`{c}`  " for c in commands),
        f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"{time.strftime('%Y-%m-%d')}. anGPT's defaults, bound {registry.get('angpt').residual_bound:g}; a spike as "
        "the module docstring says. Warned in time: the warning came at a step before the first spike.",
        "",
        "| runs | detector | calm runs | warned (false alarm) | spiking runs | warned in time | warned late | "
        "not warned |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[str, list[dict]] = {}
    for r in runs:
        group = r["shape"] if r["source"] == "trained here" else "gpt2-small (stored sweeps)"
        groups.setdefault(group + (" (tuning)" if group in TUNING else " (check)"), []).append(r)
    for group, members in groups.items():
        for name, (jump, window) in DETECTORS.items():
            calm = [r for r in members if first_spike(r["records"]) is None]
            spiky = [r for r in members if first_spike(r["records"]) is not None]
            alarms = sum(warned_at(r, jump, window) is not None for r in calm)
            at = [(warned_at(r, jump, window), first_spike(r["records"])) for r in spiky]
            in_time = sum(w is not None and w < s for w, s in at)
            late = sum(w is not None and w >= s for w, s in at)
            lines.append(
                f"| {group} | {name} | {len(calm)} | {alarms} | {len(spiky)} | {in_time} | {late} | "
                f"{len(spiky) - in_time - late} |"
            )
    lines += ["", "Per run: the first spike, the step each watch warns at, the largest ||h|| of the run.", ""]
    lines += ["| shape | lr | seed | first spike | warned at | bound alone at | max norm |", "|---" * 7 + "|"]
    for r in runs:
        top = max((max(x["residual_norms"]) for x in r["records"] if x.get("residual_norms")), default=math.nan)
        default = warned_at(r, ResidualWatch.JUMP, ResidualWatch.WINDOW)
        lines.append(
            f"| {r['shape']} | {r['lr']:g} | {r['seed']} | {first_spike(r['records']) or '-'} | {default or '-'} | "
            f"{warned_at(r, None) or '-'} | {top:.3g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="controls,depth12,d256")
    p.add_argument("--lrs", default="2e-3,4e-3,8e-3,1.6e-2,3.2e-2,6.4e-2,1.28e-1")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args()
    unknown = [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown:
        print(f"watch_calibration: error: unknown shape {unknown[0]!r} (one of {', '.join(SHAPES)})", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "runs.jsonl"
    done = [json.loads(line) for line in store.read_text().splitlines()] if store.exists() else []
    key = {(r["shape"], r["lr"], r["seed"]) for r in done}
    vocab = load_meta(a.data)["vocab_size"]
    if not a.report_only:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        for shape in a.shapes.split(","):
            for lr in map(float, a.lrs.split(",")):
                for seed in map(int, a.seeds.split(",")):
                    if (shape, lr, seed) in key:
                        continue
                    run = train(a, shape, lr, seed, vocab)
                    with store.open("a") as f:
                        f.write(json.dumps(run) + "\n")
                    done.append(run)
                    print(f"{shape} lr {lr:g} seed {seed}: first spike {first_spike(run['records'])}", flush=True)
    (out / "report.md").write_text(render(done + stored_runs()))
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
