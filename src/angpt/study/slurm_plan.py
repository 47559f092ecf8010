"""What `--executor slurm --dry-run` prints: each run's batch script, as it would be submitted, and the GPU-hours.

The runs are those the study's plans have left (sweeps, main runs, LR checks; a finished one is not submitted
again). A run whose rate the sweep chooses has no script yet: it is listed, and its script will be the printed ones'
with that rate. Each run's hours are its steps times the step `angpt train --dry-run` plans for its arm on
`--slurm.gpus-per-run` GPUs of `--slurm.gpu-type` (H100 where none is named) at an assumed 40% MFU; on a CPU job,
the step measured on this machine, counted as core-hours. A sweep's grid extensions are not counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from angpt.study.plan import Plan
from angpt.study.store import RunSpec
from angpt.units import format_tokens

ASSUMED_GPU = "H100"


def describe(planned: list[tuple[Plan, Path]], options: Any) -> str:
    """The scripts and the hours of the runs `planned` (each plan with its folder) has left, as text."""
    from angpt.study.execute import job_script
    from angpt.study.slurm import time_limit_seconds

    scripts, later, hours = [], [], 0.0
    count = 0
    for plan, folder in planned:
        step_s = _step_seconds(plan, options)
        for spec, known, role in _runs_left(plan, folder):
            count += 1
            hours += plan.steps(spec.budget) * step_s[spec.arm] * (options.gpus_per_run or options.cpus_per_run) / 3600
            if known:
                where = f" ({folder})" if len(planned) > 1 else ""
                scripts.append(f"# --- run {spec.name()}{where}\n" + job_script(plan, folder, spec, options))
            else:
                later.append(f"  {spec.arm} {format_tokens(spec.budget)} tokens seed {spec.seed}: {role}")

    def hours_text(x: float) -> str:
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    lines = [f"Slurm: {count} run(s) left, one job each; the script of each whose settings are known now:", ""]
    lines += scripts or ["(none: every run left waits for a sweep)"]
    if later:
        lines += [f"{len(later)} run(s) submitted once their sweep has chosen (a script as above, with that rate):"]
        lines += later
    unit = "GPU-hours" if options.gpus_per_run else "core-hours"
    if options.gpus_per_run:
        what = (f"each arm's step planned on {options.gpus_per_run} x {options.gpu_type or ASSUMED_GPU}"
                f"{'' if options.gpu_type else ' (no --slurm.gpu-type given)'} at 40% MFU")  # fmt: skip
    else:
        what = (f"each arm's step as angpt train --dry-run plans it on this machine's CPU, x {options.cpus_per_run} "
                "CPU(s) per run")  # fmt: skip
    lines += ["", f"estimate: ~{hours_text(hours)} {unit} ({what}; training steps only, no start-up or evaluation)"]
    if options.time:
        bound = count * time_limit_seconds(options.time) * (options.gpus_per_run or options.cpus_per_run) / 3600
        lines.append(f"at most {hours_text(bound)} {unit} at the --slurm.time limit {options.time} per job")
    return "\n".join(lines)


def check(planned: list[tuple[Plan, Path]], options: Any) -> None:
    """A one-line UserError, before anything is submitted, where a run of several ranks cannot split its batch: each
    optimizer step's tokens must be a multiple of seq_len x micro-batch x ranks."""
    from angpt.errors import UserError

    ranks = options.ranks_per_run
    for plan, _ in planned:
        one = plan.seq_len * plan.micro_batch * ranks
        if ranks > 1 and plan.batch_tokens % one:
            raise UserError(
                f"--slurm.ranks-per-run {ranks}: a step of {plan.batch_tokens} tokens does not split into "
                f"{ranks} ranks x micro-batch {plan.micro_batch} x seq_len {plan.seq_len} = {one} tokens; give a "
                f"--batch-tokens that is a multiple of {one}, or a smaller --micro-batch"
            )


def _runs_left(plan: Plan, folder: Path) -> list[tuple[RunSpec, bool, str]]:
    """(run, whether its script is known now, what waits) of every run the plan has left, in submission order."""
    from angpt.study.estimate import describe_dry_run

    dr = describe_dry_run(plan, folder, jobs=1, threads=1, measure=False)
    out = [(spec, True, "") for spec, done in dr.sweep if not done]
    for label, budget, seed in dr.main:
        grid = plan.initial_grid(plan.arm(label))
        fixed = len(grid) == 1 and not plan.arm(label).tune
        out.append(
            (RunSpec(label, budget, seed, grid[0] if fixed else float("nan")), fixed, "at the rate its sweep chooses")
        )
    for arm in plan.arms:
        if plan.checks_lr(arm):
            check = RunSpec(arm.label, plan.budgets[-1], plan.sweep_seed, float("nan"))
            for at in ("at the chosen rate", "one grid step below it", "one grid step above it"):
                out.append((check, False, f"the LR check {at}"))
    return out


def _step_seconds(plan: Plan, options: Any) -> dict[str, float]:
    """Each arm's planned seconds per optimizer step in one of the study's jobs."""
    from angpt.study.estimate import planned_steps

    gpu = (options.gpu_type or ASSUMED_GPU).upper() if options.gpus_per_run else "cpu"
    reports = planned_steps(plan, gpus=options.gpus_per_run or 1, gpu=gpu)
    return {label: r.step_time for label, r in reports.items()}
