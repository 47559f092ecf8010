"""anGPT's first hundreds of steps at GPT-2 small: an LR sweep per arm, with the stability criteria of issue 22.

    python benchmarks/stability_sweep.py --data data/stdlib-bpe8192 --out benchmarks/stability-gpt2small-cpu \\
        --arms angpt,gpt+,"angpt[input_norm=none]" --lrs 2.5e-4,5e-4,1e-3,2e-3,4e-3 --steps 300 --jobs 2

Every (arm, lr) is one `angpt train` run (the trainer a user runs, its recipe: no warm-up for anGPT, 5% for GPT+)
logging every step, in OUT/runs/<arm>/lr<lr>, resumed with `--resume auto` when the sweep is run again (run it under
nohup; re-run to continue). A finished run's checkpoints are deleted unless `--keep-checkpoints` (one is kept
while it runs, for the resume). Then OUT/report.json and OUT/report.md: per run the final validation loss, the mean
training loss of the last 10 steps, and whether it trained without a spike (after step 5 the loss never exceeds 1.3x
its running minimum; no pre-clip gradient norm exceeds 100x the run's median: angpt.bench.firststeps.stability);
per arm the best rate and whether it and half of it are stable. `--report-only` rewrites the report from the runs
(keeping the command it replaces records).

The report covers the arms and rates of this invocation and those of the report it replaces, so a sweep extended by
another invocation (a new arm, a new rate) keeps its earlier rows. A stored run whose arm now makes another model
(a default changed since: angpt.train.resume.model_drift) is never resumed or counted as today's arm: a sweep stops
with a one-line error before training anything, and `--report-only` names what the row was trained with.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from angpt.bench.firststeps import stability
from angpt.data import load_meta
from angpt.study.arms import parse_arm, split_arms
from angpt.train.metrics import read_metrics
from angpt.train.resume import model_drift

# The stability criteria read the training loss as its mean over 10 steps: at 1K-token batches a batch's content
# alone moves the loss by 20-40% (every arm at once, at the same step); the raw per-step verdict is reported beside.
SMOOTH = 10


def run_dir(out: Path, arm: str, lr: float) -> Path:
    return out / "runs" / parse_arm(arm).slug / f"lr{lr:g}"


def train_one(a: argparse.Namespace, arm: str, lr: float) -> tuple[str, float, int]:
    parsed = parse_arm(arm)
    cmd = [sys.executable, "-m", "angpt", "train", "--arch", parsed.arch, "--preset", a.preset, "--data", a.data]
    cmd += ["--out", str(run_dir(Path(a.out), arm, lr)), "--resume", "auto"]
    sets = {f"model.{k}": v for k, v in parsed.model.items()} | {f"train.{k}": v for k, v in parsed.train.items()}
    sets |= {
        "train.lr": lr,
        "train.max_steps": a.steps,
        "train.batch_tokens": a.batch * a.seq * a.accum,
        "train.micro_batch": a.batch,
        "train.seq_len": a.seq,
        "train.log_every": 1,
        "train.eval_every": a.eval_every,
        "train.eval_batches": a.eval_batches,
        "train.save_every": a.save_every,
        "train.keep_last": 1,  # a resume needs the newest only: at gpt2-small each is 1.5 GB
        "train.keep_best": a.keep_checkpoints,
        "train.dtype": a.dtype,
        "train.seed": a.seed,
        "train.progress": False,
        "train.tensorboard": False,
    }
    for k, v in sets.items():
        cmd += [f"--{k}", "null" if v is None else str(v)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    log = run_dir(Path(a.out), arm, lr).parent / f"lr{lr:g}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    rows = read_metrics(run_dir(Path(a.out), arm, lr))
    steps = max((r["step"] for r in rows if "loss" in r), default=0)
    finished = steps >= a.steps and not any("error" in r for r in rows)
    if rc == 0 and finished and not a.keep_checkpoints:
        shutil.rmtree(run_dir(Path(a.out), arm, lr) / "checkpoints", ignore_errors=True)  # the sweep reads metrics
    return arm, lr, rc


def summarise(out: Path, arm: str, lr: float, steps: int, meta: dict) -> dict:
    d = run_dir(out, arm, lr)
    rows = read_metrics(d) if (d / "metrics.jsonl").exists() else []
    train = [r for r in rows if "loss" in r and "grad_norm" in r]
    evals = [r for r in rows if "val_loss" in r]
    failed = [r for r in rows if "error" in r]
    done = max((r["step"] for r in train), default=0)
    status = "diverged" if failed else ("finished" if done >= steps else ("not started" if not rows else "running"))
    last = [r["loss"] for r in train[-10:]]
    records = [{"step": r["step"], "loss": r["loss"], "grad_norm": r["grad_norm"]} for r in train]
    records += [{"step": r["step"], "loss": r["loss"], "grad_norm": r.get("grad_norm", math.nan)} for r in failed]
    residual = [
        max(v for k, v in r.items() if k.startswith("health/residual_norm/"))
        for r in evals
        if any(k.startswith("health/residual_norm/") for k in r)
    ]
    return {
        "arm": arm,
        "lr": lr,
        "status": status,
        "steps": done,
        "val_loss": evals[-1]["val_loss"] if evals and status == "finished" else None,
        "train_loss_last10": sum(last) / len(last) if last and status == "finished" else None,
        "stability": stability(records, smooth=SMOOTH),
        "stability_raw": stability(records),
        "max_residual_norm_at_evals": max(residual) if residual else None,
        "error": failed[0]["error"] if failed else None,
        "step_time": sorted(r["step_time"] for r in train)[len(train) // 2] if train else None,
        "trained_with": model_drift(d, meta),  # None: the model this arm makes today
        "provenance": run_provenance(d),
    }


def run_provenance(d: Path) -> dict | None:
    """What the run recorded about its making (provenance.json): the commit, torch and the compute dtype."""
    try:
        p = json.loads((d / "provenance.json").read_text())
    except (OSError, ValueError):
        return None
    return {k: p.get(k) for k in ("git_revision", "torch_version", "dtype", "hostname", "data_fingerprint")}


def data_provenance(data: str | Path, meta: dict) -> dict:
    """The dataset folder as the report reads it: its content fingerprint, split sizes and how it was prepared. Each
    run records the fingerprint it trained on (provenance.json), so a folder re-prepared since shows in the report."""
    from angpt.data import data_identity

    identity = data_identity(data)
    options = meta.get("options", {})
    return {
        "fingerprint": identity.get("data_fingerprint"),
        "tokens": identity.get("tokens"),
        "prepare": {k: options.get(k) for k in ("source", "tokenizer", "val_fraction", "test_fraction", "max_tokens")},
    }


def grid(a: argparse.Namespace, previous: dict) -> list[tuple[str, float]]:
    """(arm, lr) pairs of this invocation, then those of the report it replaces that it does not repeat."""
    pairs = [(arm, float(lr)) for arm in split_arms(a.arms) for lr in a.lrs.split(",")]
    for r in previous.get("runs", []):
        if not any(arm == r["arm"] and math.isclose(lr, r["lr"]) for arm, lr in pairs):
            pairs.append((r["arm"], float(r["lr"])))
    return pairs


def report(a: argparse.Namespace, pairs: list[tuple[str, float]], meta: dict, previous: dict, seconds: float) -> dict:
    out = Path(a.out)
    runs = [summarise(out, arm, lr, a.steps, meta) for arm, lr in pairs]
    verdict = {}
    for arm in dict.fromkeys(arm for arm, _ in pairs):
        done = [r for r in runs if r["arm"] == arm and r["val_loss"] is not None]
        if not done:
            verdict[arm] = {"best_lr": None}
            continue
        stale = sorted({r["trained_with"] for r in runs if r["arm"] == arm and r["trained_with"]})
        current = [r for r in done if not r["trained_with"]]
        best = min(current or done, key=lambda r: r["val_loss"])  # never across two models of one name
        half = next(
            (
                r
                for r in runs
                if r["arm"] == arm
                and r["trained_with"] == best["trained_with"]
                and math.isclose(r["lr"], best["lr"] / 2)
            ),
            None,
        )
        verdict[arm] = {
            "best_lr": best["lr"],
            "best_val_loss": best["val_loss"],
            "best_stable": best["stability"]["stable"],
            "half_lr_stable": half["stability"]["stable"] if half and half["status"] == "finished" else None,
            "trained_with": stale,  # the verdict reads today's rows where there are any
        }
    command = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    rewritten_by = None
    if a.report_only and previous.get("command"):  # the command that trained the runs, not the one that re-read them
        rewritten_by, command, seconds = command, previous["command"], previous.get("seconds", seconds)
    data = {
        "command": command,
        "rewritten_by": rewritten_by,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "settings": {k: v for k, v in vars(a).items() if k != "report_only"},
        "data": data_provenance(a.data, meta),
        "seconds": seconds,
        "runs": runs,
        "verdict": verdict,
    }
    (out / "report.json").write_text(json.dumps(data, indent=1))
    (out / "report.md").write_text(render(data))
    return data


def tokens_per_step(s: dict) -> str:
    accum = s.get("accum", 1)  # reports written before --accum existed
    return f"{s['batch']} x {s['seq']}" + (f" x {accum} micro-batches" if accum > 1 else "")


def _provenance_lines(d: dict) -> list[str]:
    """The data and code the runs came from, as list items (reports written before these were recorded: none)."""
    lines, made_by = [], [r.get("provenance") or {} for r in d["runs"]]
    if data := d.get("data"):
        made = ", ".join(f"{k} {v}" for k, v in data["prepare"].items() if v is not None)
        train = (data.get("tokens") or {}).get("train")
        size = f"; {train:,} training tokens" if isinstance(train, int) else ""
        lines.append(f"- data: fingerprint {str(data.get('fingerprint'))[:16]} ({made}{size})")
        other = [
            f"{r['arm']} @ {r['lr']:g}"
            for r, p in zip(d["runs"], made_by)
            if p.get("data_fingerprint") not in (None, data["fingerprint"])
        ]
        if other:
            lines.append(f"- **trained on other data** (the folder was re-prepared since): {', '.join(other)}")
    if revisions := sorted({p["git_revision"] or "unknown" for p in made_by if "git_revision" in p}):
        shown = [r[:12] + ("+dirty" if r.endswith("+dirty") else "") for r in revisions]
        lines.append(f"- runs made at revision {', '.join(shown)}")
    return ["", *lines] if lines else []


def render(d: dict) -> str:
    s = d["settings"]
    lines = [
        f"# First {s['steps']} steps at {s['preset']} ({tokens_per_step(s)} tokens per step, {s['dtype']})",
        "",
        f"`{d['command']}`  ",
        f"{d['machine']}; {d['date']}; seed {s['seed']}; one run per (arm, lr), no repeats: a smoke test of "
        "stability, not evidence of a ranking.",
        *_provenance_lines(d),
        "",
        f"Stable: after step 5 the training loss, averaged over the last {SMOOTH} steps, never exceeds 1.3x its "
        "running minimum, and no pre-clip gradient norm exceeds 100x the run's median (raw: the same on each "
        "step's own loss, which at these batch sizes moves 20-40% with the batch's content, every arm at the same "
        f"steps). Val loss: the final evaluation ({s['eval_batches']} batches of the validation split).",
        "",
        "| arm | lr | status | steps | val loss | train loss (last 10) | stable | worst loss / min | worst grad / "
        "median | first spike | stable (raw) | worst raw loss / min | max residual norm (evals) | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x, fmt=".4g"):
        return "-" if x is None else (("yes" if x else "no") if isinstance(x, bool) else format(x, fmt))

    missing = [f"{r['arm']} @ {r['lr']:g}" for r in d["runs"] if r["status"] == "not started"]
    for r in d["runs"]:
        if r["status"] == "not started":
            continue
        st = r["stability"]
        lines.append(
            f"| {r['arm']} | {r['lr']:g} | {r['status']} | {r['steps']} | {f(r['val_loss'])} | "
            f"{f(r['train_loss_last10'])} | {f(st['stable'])} | {f(st['loss_ratio'], '.3g')} | "
            f"{f(st['grad_ratio'], '.3g')} | {f(st['first_spike'])} | {f(r['stability_raw']['stable'])} | "
            f"{f(r['stability_raw']['loss_ratio'], '.3g')} | {f(r['max_residual_norm_at_evals'], '.3g')} | "
            f"{f(r['step_time'], '.3g')} |"
        )
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    stale: dict[str, list[str]] = {}
    for r in d["runs"]:
        if r.get("trained_with"):
            stale.setdefault(r["trained_with"], []).append(f"{r['arm']} @ {r['lr']:g}")
    for drift, rows in stale.items():
        lines += [
            "",
            f"Trained with {drift}, a model these arms no longer make: {', '.join(rows)}. Those rows are that model's.",
        ]
    lines += [
        "",
        "| arm | best lr (val loss) | its val loss | best lr stable | half of it stable |",
        "|---|---|---|---|---|",
    ]
    for arm, v in d["verdict"].items():
        lines.append(
            f"| {arm} | {f(v.get('best_lr'), 'g')} | {f(v.get('best_val_loss'))} | {f(v.get('best_stable'))} | "
            f"{f(v.get('half_lr_stable'))} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--arms", default="angpt,gpt+", help="comma-separated arms, as angpt compare writes them")
    p.add_argument("--lrs", default="2.5e-4,5e-4,1e-3,2e-3,4e-3")
    p.add_argument("--preset", default="gpt2-small")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--accum", type=int, default=1, help="micro-batches of --batch sequences per optimizer step")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep a finished run's last and best checkpoints (by default deleted once it finishes: 1.5 GB each at "
        "gpt2-small, and a sweep reads only metrics)",
    )
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args()
    out = Path(a.out)
    previous = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    pairs, meta = grid(a, previous), load_meta(a.data)
    t0 = time.time()
    if not a.report_only:
        arms = split_arms(a.arms)
        # This invocation's arms at every stored rate too: a new rate must not train beside runs of another model.
        stored = {(arm, lr): summarise(out, arm, lr, a.steps, meta) for arm, lr in pairs if arm in arms}
        for (arm, lr), r in stored.items():
            if r["trained_with"]:
                print(
                    f"stability_sweep: error: {run_dir(out, arm, lr)} was trained with {r['trained_with']}: {arm} "
                    "makes another model today; use another --out (or name the arm with those settings)",
                    file=sys.stderr,
                )
                return 2
        mine = [(arm, float(lr)) for lr in a.lrs.split(",") for arm in arms]
        todo = [pair for pair in mine if stored[pair]["status"] != "finished"]
        with cf.ThreadPoolExecutor(a.jobs) as pool:
            for arm, lr, rc in pool.map(lambda job: train_one(a, *job), todo):
                print(f"{arm} @ {lr:g}: exit {rc}", flush=True)
    data = report(a, pairs, meta, previous, time.time() - t0)
    print((Path(a.out) / "report.md").read_text())
    return 0 if data["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
