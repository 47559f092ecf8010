"""WSD budget ladders: the shorter budgets of a size branch off the longest run's stable phase.

Under a warm-up-stable-decay schedule (train/optim.py's Schedule) the LR up to a run's decay start does not depend
on its length, so the run of budget S_i equals the longest run S_n up to step s_i = S_i - decay_fraction * S_i,
followed by its own decay (Hägele et al. 2024, arXiv 2405.18392; Hu et al. 2024, MiniCPM, arXiv 2404.06395). Before
a size's main runs start, :func:`seed_branches` advances the longest run of each (arm, seed) to every s_i in turn
(``train.stop_at``: it saves a checkpoint there and stops) and copies that checkpoint, with the metrics so far, into
the shorter run's directory. compare's runner then resumes each branch as an ordinary run: the trainer recomputes
the schedule for the branch's own max_steps, so it trains only its decay. n budgets cost the longest run plus the
n - 1 decays.

A branch that cannot be seeded (the longest run is already past s_i, or s_i is step 0) is trained from scratch:
the same run, at full cost. The stable phases are trained in this process, one (arm, seed) after another with all
the runner's threads; only the decays and the rest of the longest runs use `--jobs` workers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from angpt.study.plan import Plan
from angpt.study.store import RESULT_FILE, RunSpec, read_rows
from angpt.units import format_tokens

if TYPE_CHECKING:
    from angpt.study.execute import Runner


def decay_start(plan: Plan, spec: RunSpec) -> int:
    """The step at which `spec`'s WSD decay begins (its branch point off the longest run)."""
    from angpt.train.config import load_run_config
    from angpt.train.optim import Schedule

    arm = plan.arm(spec.arm)
    cfg = load_run_config(None, plan.run_overrides(arm, spec.budget, spec.seed, spec.lr, "unused"))
    tc = cfg.train
    return Schedule(tc.max_steps, kind=tc.schedule, decay_fraction=tc.decay_fraction).decay_start


def seed_branches(runner: Runner, specs: list[RunSpec]) -> list[RunSpec]:
    """Give every shorter-budget run in `specs` the longest run's checkpoint at its decay start; returns the seeded.

    Called by compare.run_comparison at each budget, after that budget's sweeps (its `before_main` hook), with the
    budget's main runs (any subset works: the trunk is the plan's largest budget). Runs already finished or already
    holding a checkpoint are left as they are, so re-running resumes.
    """
    from angpt import checkpoint as ckpt

    plan, report_dir = runner.plan, runner.report_dir
    longest = plan.budgets[-1]  # the trunk: `specs` may be any subset of the size's runs (one budget's, say)
    seeded = []
    for spec in sorted(specs, key=lambda s: s.budget):  # a trunk advances only forwards: shortest branch first
        if spec.budget == longest:
            continue
        branch_dir = plan.run_dir(report_dir, plan.arm(spec.arm), spec.budget, spec.seed, spec.lr)
        if runner.known(spec) is not None or ckpt.list_checkpoints(branch_dir):
            continue
        step = decay_start(plan, spec)
        trunk = RunSpec(spec.arm, longest, spec.seed, spec.lr)
        point = _advance(runner, trunk, step) if step > 0 else None
        if point is None:
            continue  # trained from scratch by the runner: the same run
        _copy_branch(point, plan.run_dir(report_dir, plan.arm(spec.arm), longest, spec.seed, spec.lr), branch_dir, step)
        seeded.append(spec)
    return seeded


def _advance(runner: Runner, longest: RunSpec, step: int) -> Path | None:
    """The longest run's checkpoint at `step`, training it there first if it is not yet; None if it is past it."""
    import torch

    from angpt import checkpoint as ckpt
    from angpt.train.config import load_run_config
    from angpt.train.loop import TrainingError, train

    plan = runner.plan
    out = plan.run_dir(runner.report_dir, plan.arm(longest.arm), longest.budget, longest.seed, longest.lr)
    if (out / RESULT_FILE).is_file():
        return None
    found = ckpt.list_checkpoints(out)
    latest = int(found[-1].name.split("_")[1]) if found else 0
    if latest > step:
        return None
    if latest == step:
        return found[-1]
    if out.exists() and not found:
        shutil.rmtree(out)  # ours, stopped before its first checkpoint: start it afresh (as compare's runner does)
    cfg = load_run_config(
        None, plan.run_overrides(plan.arm(longest.arm), longest.budget, longest.seed, longest.lr, out)
    )
    cfg.train.stop_at = step
    print(
        f"wsd: training {longest.name()} to step {step}, where the {format_tokens(longest.budget)}-token run's "
        "shorter budget branches off",
        file=sys.stderr,
    )
    old = torch.get_num_threads()
    torch.set_num_threads(runner.threads * runner.jobs)  # nothing else runs now: the stable phases go one at a time
    try:
        result = train(cfg)
    except TrainingError:
        return None  # the runner trains (and records) the longest run itself; the branch starts from scratch
    finally:
        torch.set_num_threads(old)
    if result.signal is not None:
        raise KeyboardInterrupt(f"{longest.name()} interrupted")
    if result.step != step or result.checkpoint is None:
        return None
    return Path(result.checkpoint)


def _copy_branch(checkpoint: Path, trunk_dir: Path, branch_dir: Path, step: int) -> None:
    """The branch's directory: the trunk's metrics up to `step`, then the checkpoint (renamed into place last, so an
    interrupted copy leaves no checkpoint and is redone)."""
    from angpt import checkpoint as ckpt

    root = ckpt.checkpoint_dir(branch_dir)
    root.mkdir(parents=True, exist_ok=True)
    rows = [r for r in read_rows(trunk_dir) if r["step"] <= step]
    (branch_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp = root / f".seed_{checkpoint.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(checkpoint, tmp)
    os.replace(tmp, root / checkpoint.name)
