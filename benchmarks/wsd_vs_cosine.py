"""WSD budget ladder vs separate cosine runs: final validation losses and training steps at three budgets.

The cosine side is what `angpt compare` and a cosine `angpt scaling` ladder run: each budget its own run with its own
cosine schedule (warm-up from the arm's recipe). The WSD side is `angpt scaling --schedule wsd`: one warm-up and
stable phase per seed, the shorter budgets branching off the longest run at their decay start (angpt.study.ladder.wsd),
so the three budgets cost the longest run plus two decays. Same data order, seed, peak LR and batch. Usage:

    python benchmarks/wsd_vs_cosine.py --data data/stdlib-bpe4096 [--arms gpt+,angpt] [--steps 100,200,400]
        [--preset tiny] [--batch-tokens 1024] [--decay-fraction 0.2] [--decay-shape 1-sqrt] [--min-lr-ratio 0.1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from angpt.models import registry
from angpt.study import make_plan, run_comparison
from angpt.study.arms import parse_arm
from angpt.study.ladder.wsd import seed_branches
from angpt.train.step import TrainStep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--arms", default="gpt+,angpt")
    p.add_argument("--steps", default="100,200,400", help="the three budgets, in optimizer steps")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--decay-fraction", type=float, default=0.2)
    p.add_argument("--decay-shape", default="1-sqrt", choices=["linear", "1-sqrt"])
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the LR floor of both schedules")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: --seed alone)")
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--set", nargs="*", default=[], help="model.KEY=VALUE / train.KEY=VALUE for every arm")
    p.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    steps = sorted(int(s) for s in args.steps.split(","))
    budgets = [s * args.batch_tokens for s in steps]
    common = dict(
        budgets=budgets,
        seeds=seeds,
        preset=args.preset,
        batch_tokens=args.batch_tokens,
        lr_grid=[1],  # each arm at its recipe's LR: the schedules are compared, not tuned
        eval_batches=args.eval_batches,
        eval_points=1,
        dtype="fp32",
    )
    floor = {"train.min_lr_ratio": args.min_lr_ratio}
    for item in args.set:
        key, _, value = item.partition("=")
        floor[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    if args.seq_len:
        common["seq_len"] = args.seq_len
    if args.micro_batch:
        common["micro_batch"] = args.micro_batch
    # WSD: one warm-up for every budget (the recipe's warm-up of the smallest budget), as angpt scaling sets it.
    wsd_arms = []
    for text in args.arms.split(","):
        arm = parse_arm(text)
        arm.train.setdefault("warmup_steps", registry.get(arm.arch).recipe.warmup_steps(steps[0]))
        wsd_arms.append(arm)
    wsd = {"train.schedule": "wsd", "train.decay_fraction": args.decay_fraction, "train.decay_shape": args.decay_shape}
    plans = {
        "cosine": make_plan(args.data, arms=args.arms.split(","), settings=floor, **common),
        "wsd": make_plan(args.data, arms=wsd_arms, settings={**floor, **wsd}, **common),
    }
    counted: dict[str, int] = {}
    losses: dict[tuple[str, str, int, int], float] = {}
    seconds: dict[str, float] = {}
    real = TrainStep.accumulate
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        for name, plan in plans.items():
            n = [0]

            def counting(self, next_batch, n=n):
                n[0] += 1
                return real(self, next_batch)

            TrainStep.accumulate = counting
            t0 = time.perf_counter()
            try:
                report = run_comparison(
                    plan,
                    root / name,
                    threads=args.threads,
                    jobs=args.jobs,
                    progress=False,
                    before_main=seed_branches if name == "wsd" else None,
                    command="benchmarks/wsd_vs_cosine.py",
                )
            finally:
                TrainStep.accumulate = real
            seconds[name], counted[name] = time.perf_counter() - t0, n[0]
            for arm in plan.arms:
                lr = next(iter(report.sweeps[arm.label].values())).best_lr  # the one rate of the grid
                for b in budgets:
                    for sd in seeds:
                        rec = json.loads((plan.run_dir(root / name, arm, b, sd, lr) / "result.json").read_text())
                        losses[(name, arm.label, b, sd)] = rec["val_loss"]

    print(
        f"# {args.preset}, batch {args.batch_tokens} tokens, seeds {seeds}, LR floor {args.min_lr_ratio} x peak; "
        f"WSD decay: last {args.decay_fraction:g} of each run, {args.decay_shape}; torch {torch.__version__}, "
        f"{args.threads} thread(s)"
    )
    print("| arm | steps | seed | cosine final val loss | WSD final val loss | WSD - cosine |")
    print("|---|---|---|---|---|---|")
    for arm in plans["cosine"].arms:
        for s, b in zip(steps, budgets):
            for sd in seeds:
                lc, lw = losses[("cosine", arm.label, b, sd)], losses[("wsd", arm.label, b, sd)]
                print(f"| {arm.label} | {s} | {sd} | {lc:.4f} | {lw:.4f} | {lw - lc:+.4f} ({(lw - lc) / lc:+.2%}) |")
    labels = [a.label for a in plans["cosine"].arms]
    if len(labels) == 2:  # issue 45: does WSD rank the two arms as cosine does, budget by budget and seed by seed?
        first, second = labels
        print(f"\n| steps | seed | cosine: {second} - {first} | WSD: {second} - {first} | same order |")
        print("|---|---|---|---|---|")
        agree = 0
        for s, b in zip(steps, budgets):
            for sd in seeds:
                dc = losses[("cosine", second, b, sd)] - losses[("cosine", first, b, sd)]
                dw = losses[("wsd", second, b, sd)] - losses[("wsd", first, b, sd)]
                same = (dc < 0) == (dw < 0)
                agree += same
                print(f"| {s} | {sd} | {dc:+.4f} | {dw:+.4f} | {'yes' if same else 'no'} |")
        print(f"same order in {agree} of {len(steps) * len(seeds)}")
    for name in plans:
        print(f"{name}: {counted[name]} optimizer steps trained, {seconds[name]:.0f} s")


if __name__ == "__main__":
    main()
