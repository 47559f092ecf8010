"""The `angpt scaling` verb: a ladder (default), `report OUT`, `fit OUT` and `batch`; thin layers over
the scaling kinds' library functions."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from angpt.errors import UserError
from angpt.invocation import command_line
from angpt.study.flags import (
    add_executor_flags,
    add_plan_flags,
    add_verb,
    csv,
    executor_options,
    jobs_flag,
    numbers,
    plan_options,
)

DESCRIPTION = """\
Scaling laws per architecture: train every arm at several model sizes (one --depths dial: width = depth x
--aspect, heads = width / --head-dim) and token budgets (--tokens-per-param multiples of N, or --budgets), with
LRs tuned per size (or --lr-transfer), then fit L(N, D) = E + A/N^alpha + B/D^beta per arm with bootstrap
intervals and write report.md, report.json and plots into --out. Each size is an `angpt compare` run store in
OUT/sizes/<size>; re-running the same command resumes, and with more sizes extends the ladder (finished runs
reused). See docs/scaling.md.

  angpt scaling --data D --out O --arms gpt+,angpt --depths 2,3,4,5,6 --tokens-per-param 5,10,20 [--dry-run]
  angpt scaling batch --data D --out O --arms gpt+,angpt --batch-sizes 4Ki,8Ki,16Ki,32Ki --tokens 4Mi
  angpt scaling report O        rewrite the report from the store
  angpt scaling fit O           print the fit table of a finished store
"""


def _need(args: argparse.Namespace, *names: str) -> None:
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) in (None, "")]
    if missing:
        raise UserError(f"give {' and '.join(missing)}")


def _common(args: argparse.Namespace) -> dict:
    """What a ladder and a batch-size study share, as make_ladder / make_batch_study keywords: the arms, the dial's
    shape, the seeds, and the options every plan shares (one PlanOptions)."""
    from angpt.study.arms import split_arms

    options = plan_options(args)
    return dict(
        arms=split_arms(args.arms),
        baseline=args.baseline,
        aspect=args.aspect,
        head_dim=args.head_dim,
        ffn_mult=args.ffn_mult,
        seeds=numbers(args.seeds, "--seeds", int),
        options=options,
    )


def ladder_from_args(args: argparse.Namespace):
    """The ladder the flags describe; every problem is a one-line error."""
    from angpt.study.ladder.plan import make_ladder

    _need(args, "data", "out")
    if args.depths is None and args.widths is None:
        raise UserError("give the sizes: --depths 2,3,4,5,6 (or --widths)")
    return make_ladder(
        args.data,
        depths=numbers(args.depths, "--depths", int) if args.depths is not None else None,
        widths=numbers(args.widths, "--widths", int) if args.widths is not None else None,
        tokens_per_param=numbers(args.tokens_per_param, "--tokens-per-param") if args.tokens_per_param else None,
        budgets=csv(args.budgets) if args.budgets else None,
        param_count=args.count_params,
        schedule=args.schedule,
        decay_fraction=args.decay_fraction,
        decay_shape=args.decay_shape,
        lr_transfer=args.lr_transfer,
        batch_tokens=args.batch_tokens,  # the ladder's own batch, over the shared options
        **_common(args),
    )


def _print_summary(report: dict, files: dict) -> None:
    for line in report.get("ladder", {}).get("verdicts", []):
        print(line)
    for w in report.get("warnings", []):
        print(f"warning: {w}")
    print(f"report: {files['report.md']}")


def cmd_scaling(args: argparse.Namespace) -> int:
    verb = getattr(args, "scaling_verb", None)
    if verb == "report":
        return cmd_report(args)
    if verb == "fit":
        return cmd_fit(args)
    if verb == "batch":
        return cmd_batch(args)
    from angpt.study.ladder.run import LadderStudy

    study = LadderStudy(ladder_from_args(args), command=command_line())
    result = _run(study, args, bootstrap=args.bootstrap, fit_seed=args.fit_seed)
    if result.dry_run:
        return 0
    print(f"trained {result.trained} run(s)")
    _print_summary(result.report, result.files)
    return 0


def _run(study, args: argparse.Namespace, **kw: Any):
    """Run a ladder or a batch-size study (scaling/run.py) in --out as the flags say; print a dry run's text."""
    from angpt.study.scaling.run import run_scaling

    result = run_scaling(study, args.out, jobs=jobs_flag(args.jobs, auto=False), executor=executor_options(args),
                         threads=args.threads, dry_run=args.dry_run, progress=not args.quiet, **kw)  # fmt: skip
    if result.dry_run:
        print(result.text)
    return result


def cmd_report(args: argparse.Namespace) -> int:
    from angpt.study.scaling.report import write_scaling_report

    report, files = write_scaling_report(args.dir, bootstrap=args.bootstrap, seed=args.fit_seed)
    _print_summary(report, files)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    """Print the fit table of a finished ladder; exit status 1 when an arm's fit failed (the table says why)."""
    from angpt.study.ladder.analyse import analyse_ladder
    from angpt.study.ladder.collect import collect_ladder
    from angpt.study.ladder.render import render_fit_table

    data = collect_ladder(args.dir)
    labels = [a.label for a in data.ladder.arms]
    wanted = csv(args.arms) or labels
    unknown = [w for w in wanted if w not in labels]
    if unknown:
        raise UserError(f"arm {unknown[0]!r} is not in the ladder in {args.dir} (arms: {', '.join(labels)})")
    data.ladder.arms = [a for a in data.ladder.arms if a.label in wanted]
    data.points = [p for p in data.points if p.arm in wanted]
    if data.ladder.baseline not in wanted:
        data.ladder.baseline = wanted[0]
    a = analyse_ladder(data, bootstrap=args.bootstrap, seed=args.fit_seed)
    print("\n".join(render_fit_table(data.ladder, a)))
    for line in a["verdicts"]:
        print(line)
    failed = [label for label in wanted if not a["arms"][label].get("ok")]
    for label in failed:
        print(f"angpt scaling fit: {label}: {a['arms'][label]['message']}", file=sys.stderr)
    return 1 if failed else 0


def batch_from_args(args: argparse.Namespace):
    """The batch-size study the flags of `angpt scaling batch` describe; every problem is a one-line error."""
    from angpt.study.batch.plan import make_batch_study

    _need(args, "data", "out", "tokens", "batch_sizes")
    return make_batch_study(
        args.data,
        tokens=args.tokens,
        batch_sizes=csv(args.batch_sizes),
        depth=args.depth,
        tolerance=args.tolerance,
        **_common(args),
    )


def cmd_batch(args: argparse.Namespace) -> int:
    from angpt.study.batch.run import BatchSizeStudy

    result = _run(BatchSizeStudy(batch_from_args(args), command=command_line()), args)
    if result.dry_run:
        return 0
    for label, e in result.report["batch"]["arms"].items():
        c = e["critical"]
        if c["critical"] is not None:
            bound = ">= " if c["at_largest"] else ""
            print(f"{label}: critical batch {bound}{c['critical']} tokens (best loss {c['best_loss']:.4g})")
    _print_summary(result.report, result.files)
    return 0


def _add_study_options(s: argparse.ArgumentParser) -> None:
    """Options shared by the ladder and the batch-size study (the compare options, the dial's shape)."""
    s.add_argument("--data", default=None, help="a dataset folder written by `angpt prepare`")
    s.add_argument("--out", default=None, help="the study's directory (created; re-use it to resume)")
    s.add_argument("--arms", default="gpt+,angpt", help="comma-separated arms, compare's syntax (default: %(default)s)")
    s.add_argument("--baseline", default=None, help="the arm the others are measured against (default: gpt+)")
    s.add_argument("--aspect", type=int, default=64, help="width per layer of the depth dial (default 64)")
    s.add_argument("--head-dim", type=int, default=64, help="head dimension; heads = width / head dim (default 64)")
    s.add_argument("--ffn-mult", type=float, default=None, help="d_ff = mult x width (default: the model's 4x)")
    s.add_argument("--seeds", default="0", help="comma-separated seeds (init and data order)")
    s.add_argument("--preset", default="demo", help="vocabulary and context come from this preset (default demo)")
    add_plan_flags(s, lr_default="the arch default of the small presets")
    add_executor_flags(s, auto=False)
    s.add_argument("--dry-run", action="store_true", help="print the plan and a measured time estimate, write nothing")
    s.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_fit_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the intervals (0: none)")
    s.add_argument("--fit-seed", type=int, default=0, help="seed of the bootstrap resampling")


def add_scaling_parser(subparsers, help: str | None = None) -> argparse.ArgumentParser:
    """Register the `scaling` verb (and its report / fit / batch sub-verbs; its one-line `help`: angpt.cli.VERBS');
    returns its parser."""
    s = add_verb(subparsers, "scaling", help, DESCRIPTION)
    _add_study_options(s)
    s.add_argument("--depths", default=None, help="comma-separated depths: the size dial (width = depth x aspect)")
    s.add_argument("--widths", default=None, help="comma-separated widths instead (depth = width / aspect)")
    s.add_argument("--tokens-per-param", default=None, help="budgets as multiples of N (default 5,10,20)")
    s.add_argument("--budgets", default=None, help="budgets as token counts, the same at every size (e.g. 1Mi,2Mi,4Mi)")
    s.add_argument("--count-params", default="non_embedding", choices=["non_embedding", "total"], help="what N counts")
    s.add_argument("--batch-tokens", default="16384", help="tokens per optimizer step (default 16384)")
    s.add_argument("--schedule", default="cosine", choices=["cosine", "wsd"], help="cosine runs, or a WSD ladder")
    s.add_argument("--decay-fraction", type=float, default=0.2, help="wsd: the decaying fraction of each run")
    s.add_argument("--decay-shape", default="1-sqrt", choices=["linear", "1-sqrt"], help="wsd: the decay's shape")
    s.add_argument("--lr-transfer", action="store_true", help="tune LRs on the smallest size only and reuse them")
    _add_fit_options(s)
    s.set_defaults(func=cmd_scaling)

    verbs = s.add_subparsers(dest="scaling_verb", required=False, metavar="{report,fit,batch}")
    r = verbs.add_parser("report", help="rewrite OUT's report from its store", allow_abbrev=False)
    r.add_argument("dir", metavar="OUT")
    _add_fit_options(r)
    f = verbs.add_parser("fit", help="print the fit table of a finished ladder", allow_abbrev=False)
    f.add_argument("dir", metavar="OUT")
    f.add_argument("--arms", default=None, help="only these arms (default: all)")
    _add_fit_options(f)
    b = verbs.add_parser(
        "batch", help="loss at fixed tokens over batch sizes two apart; critical batch per arm", allow_abbrev=False
    )
    _add_study_options(b)
    b.add_argument("--batch-sizes", default=None, help="tokens per step, each twice the previous, e.g. 4Ki,8Ki,16Ki")
    b.add_argument("--tokens", default=None, help="the fixed token count of every run, e.g. 4Mi")
    b.add_argument("--depth", type=int, default=None, help="the model at this depth of the dial (default: the preset)")
    b.add_argument("--tolerance", type=float, default=0.01, help="critical batch: within this fraction of the best")
    return s
