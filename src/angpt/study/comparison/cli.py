"""The `angpt compare` verb: flags -> :func:`angpt.study.make_plan` -> :func:`angpt.study.run_comparison`."""

from __future__ import annotations

import argparse

from angpt.errors import UserError
from angpt.invocation import command_line

DESCRIPTION = """\
Train every arm at every token budget and seed (each budget a full run with its own cosine schedule), after a
per-arm learning-rate sweep at the smallest budget, and write report.md, report.json and plots into --out.
Re-running the same command skips finished runs and resumes interrupted ones (refused, in one line, where a model
default changed since the runs); an interrupted comparison leaves a PARTIAL report, and `angpt compare --out DIR
--report-only` rewrites the report from DIR's runs. See docs/compare.md.

arms: gpt (GPT+ without QK-norm), gpt+, ngpt, angpt, tokenformer, dyt, ln_scaling, ngpt_bounded; any arm takes
  overrides, e.g. 'angpt[nu_att=sqrt_pos]' or 'sqrtpos=angpt[nu_att=sqrt_pos,alpha_init=0.01]' (quote them in the
  shell), and tuned settings swept with the LR at every budget: 'r=gpt+[tune.weight_decay=0:0.1,tune.warmup=0:0.05]'.
token counts: 4096, 512K, 1M, 2G (powers of 1000) or 64Ki, 1Mi (powers of 1024).
"""


SEEDS_HELP = (
    "comma-separated seeds (init and data order); default 5 seeds, what evidence needs (docs/protocol.md); --seeds 0 "
    "for a quick look"
)
DRY_RUN_HELP = (
    "print the planned runs and a measured time estimate (with --executor slurm: each job's sbatch script and the "
    "GPU-hours)"
)


def _int(text: str | None, what: str) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{what} {text!r} must be an integer") from None


def plan_from_args(args: argparse.Namespace, data=None):
    """The comparison plan the flags describe (`data` overrides --data); every problem is a one-line error."""
    from angpt.study.arms import split_arms
    from angpt.study.flags import csv, plan_options
    from angpt.study.plan import make_plan

    if args.budgets is None or not csv(args.budgets):
        raise UserError("no token budgets: give --budgets, e.g. --budgets 1Mi,2Mi,4Mi")
    seeds = [_int(s, "--seeds entry") for s in csv(args.seeds)]
    return make_plan(
        data if data is not None else args.data,
        arms=split_arms(args.arms),
        baseline=args.baseline,
        budgets=csv(args.budgets),
        seeds=seeds,  # type: ignore[arg-type]
        options=plan_options(args, batch_tokens=args.batch_tokens),
        extrapolate=args.extrapolate,
        retune=split_arms(args.retune or ""),
        stat=args.stat,
        tuning_seed=args.tuning_seed,
        tune_budget=args.tune_budget,
    )


def cmd_compare(args: argparse.Namespace) -> int:
    """Build the plan from the flags, run (or dry-run) it, print the verdicts and where the report is."""
    from angpt.study.comparison.run import run_comparison
    from angpt.study.execute import StudyInterrupted
    from angpt.study.flags import executor_options, jobs_flag

    if args.sample_tokens < 1:
        raise UserError(f"--sample-tokens {args.sample_tokens} must be a positive integer")
    command = command_line()
    if args.report_only:
        return _report_only(args, command)
    if args.data is None:
        raise UserError("--data is required: a dataset folder written by `angpt prepare`")
    plan = plan_from_args(args)
    try:
        report = run_comparison(
            plan,
            args.out,
            jobs=jobs_flag(args.jobs),
            threads=args.threads,
            dry_run=args.dry_run,
            progress=not args.quiet,
            command=command,
            strict=args.strict,
            sample=args.sample,
            sample_tokens=args.sample_tokens,
            executor=executor_options(args),
        )
    except StudyInterrupted as e:
        return 128 + e.signum  # as the shell reports a process a signal stopped (130 SIGINT, 143 SIGTERM)
    if report.dry_run:
        print(report.estimate.text if report.estimate else "")
        return 0
    for line in report.verdicts:
        print(line)
    for w in report.data.get("warnings", []):
        print(f"warning: {w}")
    print(f"trained {len(report.trained)} run(s); report: {report.files['report.md']}")
    return 0


def _report_only(args: argparse.Namespace, command: str) -> int:
    """`--report-only`: rewrite the report of --out from its store (the flags of the run, if given, must match)."""
    from angpt.study.comparison.run import rewrite_report
    from angpt.study.stored import load_plan

    if args.dry_run:
        raise UserError("--report-only trains nothing already: drop --dry-run")
    plan = None
    if args.budgets is not None:  # the run's flags: they must describe the stored plan (its data by default)
        plan = plan_from_args(args, data=args.data or load_plan(args.out).data)
    report = rewrite_report(args.out, plan=plan, command=command, sample=args.sample, sample_tokens=args.sample_tokens)
    for line in report.verdicts:
        print(line)
    for w in report.data.get("warnings", []):
        print(f"warning: {w}")
    partial = report.data.get("partial")
    if partial:
        print(f"PARTIAL: {partial['finished']} of {partial['planned']} planned runs finished")
    print(f"report rewritten from the store, nothing trained: {report.files['report.md']}")
    return 0


def add_compare_parser(subparsers, help: str | None = None) -> argparse.ArgumentParser:
    """Register the `compare` verb on the `angpt` command's subparsers (its one-line `help`: angpt.cli.VERBS');
    returns its parser."""
    from angpt.study.flags import add_executor_flags, add_plan_flags, add_verb

    s = add_verb(subparsers, "compare", help, DESCRIPTION)
    s.add_argument("--data", default=None, help="a dataset folder written by `angpt prepare` (required to run)")
    s.add_argument("--out", required=True, help="report directory (created; re-use it to resume)")
    s.add_argument("--arms", default="gpt,gpt+,ngpt,angpt", help="comma-separated arms (default: %(default)s)")
    s.add_argument("--baseline", default=None, help="the arm the others are measured against (default: gpt+)")
    s.add_argument("--budgets", default=None, help="comma-separated token budgets, e.g. 1Mi,2Mi,4Mi (required)")
    s.add_argument("--seeds", default="0,1,2,3,4", help=SEEDS_HELP)
    s.add_argument(
        "--tuning-seed",
        type=_tuning_seed,
        default=1000,
        help="the seed the LR sweeps run on, not among --seeds: selection apart from measurement (default 1000; "
        "'none': the first seed, whose sweep run is also reported, as plans before 2026-11-25 did); with it, each "
        "chosen LR is also checked at the largest budget against its two grid neighbours (the report's LR check)",
    )
    s.add_argument(
        "--tune-budget",
        default=None,
        metavar="TOKENS",
        help="the budget the LR sweeps run at: one of --budgets, or 'largest' (default: the smallest, with each "
        "chosen LR checked at the largest)",
    )
    s.add_argument("--preset", default="demo", help="model shape preset (default: %(default)s)")
    s.add_argument("--batch-tokens", default="16384", help="tokens per optimizer step, every arm (default 16384)")
    add_plan_flags(s, lr_default="the arch default at --preset")
    s.add_argument(
        "--retune",
        default=None,
        metavar="ARM,...",
        help="add ARM_retuned: ARM swept over LR x weight decay {0, 0.1} x warm-up {0, 1%%, 5%%} at every budget",
    )
    add_executor_flags(s)
    s.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)
    s.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite --out's report from its finished runs (PARTIAL while some are missing); trains nothing, "
        "needs no other flag",
    )
    s.add_argument(
        "--strict",
        action="store_true",
        help="refuse a plan whose largest budget is a smoke test (< 1000 steps or < 10 tokens/parameter)",
    )
    s.add_argument("--stat", default="paired", help="the test leading the verdicts: paired (default) or welch")
    s.add_argument("--extrapolate", action="store_true", help="extrapolate speedups beyond the budget range")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--sample", default=None, metavar="PROMPT", help="end the report with each arm's continuation")
    s.add_argument("--sample-tokens", type=int, default=80, help="tokens per --sample continuation (default 80)")
    s.set_defaults(func=cmd_compare)
    return s


def _tuning_seed(text: str) -> int | None:
    """--tuning-seed: an integer, or "none" for the older design (sweeps on the first reported seed)."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed; give an integer or none") from None
