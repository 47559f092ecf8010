"""The command-line flags every kind of study shares, read once: lists and numbers, per-arm rates, the
:class:`~angpt.study.plan.PlanOptions` that every plan of a study shares (`angpt compare`, `angpt scaling`), and
where the runs train (`--jobs` here, `--executor inprocess` with its `--deadline`, or `--executor slurm` with its
options from flags or a YAML file)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.study.arms import split_arms
from angpt.study.plan import PlanOptions


def csv(text: str | None) -> list[str]:
    """The items of a comma-separated flag, stripped (none for None)."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def numbers(text: str | None, what: str, kind=float) -> list:
    """A comma-separated flag's numbers (`kind`: float or int); a one-line UserError naming the flag."""
    try:
        return [kind(t) for t in csv(text)]
    except ValueError:
        raise UserError(f"{what} {text!r} must be comma-separated {'integers' if kind is int else 'numbers'}") from None


def _per_arm(text: str, what: str) -> dict[str, str]:
    """``ARM=VALUE,ARM=VALUE`` where ARM may itself hold ``[k=v,...]``: split on top-level commas, last '='."""
    out = {}
    for item in split_arms(text):
        label, sep, value = item.rpartition("=")
        if not sep or not label or not value or (label.count("[") != label.count("]")):
            raise UserError(f"{what} item {item!r} must look like ARM=VALUE")
        out[label.strip()] = value.strip()
    return out


def lr_table(text: str | None) -> dict[str, float]:
    """`--lr ARM=LR,...`: each arm's rate."""
    out = {}
    for label, value in _per_arm(text or "", "--lr").items():
        try:
            out[label] = float(value)
        except ValueError:
            raise UserError(f"--lr {label}={value!r}: the learning rate must be a number") from None
    return out


def lr_values(text: str | None) -> dict[str, list[float]]:
    """`--lr-values ARM=LR:LR,...`: each arm's own grid of rates."""
    out = {}
    for label, value in _per_arm(text or "", "--lr-values").items():
        try:
            out[label] = [float(v) for v in value.split(":") if v.strip()]
        except ValueError:
            raise UserError(f"--lr-values {label}={value!r}: use numbers separated by ':'") from None
    return out


def add_verb(subparsers: Any, name: str, help: str | None, description: str) -> argparse.ArgumentParser:
    """A study's verb on the `angpt` command's subparsers: its one-line `help` (angpt.cli.VERBS), its `description`
    printed as written, and no abbreviated flags (`--budget` must not silently mean `--budgets`)."""
    formatter = argparse.RawDescriptionHelpFormatter
    return subparsers.add_parser(name, help=help, description=description, formatter_class=formatter,
                                 allow_abbrev=False)  # fmt: skip


def add_plan_flags(s: argparse.ArgumentParser, *, lr_default: str) -> None:
    """The flags of the PlanOptions every plan of a study shares (read back by :func:`plan_options`), but the preset
    and the batch, which each kind words its own way; `lr_default` says where a centre rate comes from."""
    from angpt.study.plan import DEFAULT_LR_GRID, DEFAULT_MAX_EXTENSIONS

    s.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the preset's context)")
    s.add_argument("--micro-batch", type=int, default=None, help="sequences per forward (default: <= 16)")
    s.add_argument(
        "--lr-grid",
        default=",".join(f"{m:g}" for m in DEFAULT_LR_GRID),
        help="LR multipliers around each arm's centre LR (default: %(default)s; '1' = no sweep)",
    )
    s.add_argument("--lr", default=None, metavar="ARM=LR,...", help=f"centre LR per arm (default: {lr_default})")
    s.add_argument("--lr-values", default=None, metavar="ARM=LR:LR:...,...", help="an explicit LR grid for some arms")
    s.add_argument(
        "--max-extensions",
        type=int,
        default=DEFAULT_MAX_EXTENSIONS,
        help="the most grid steps added beyond an edge while the best LR sits there (default %(default)s; "
        "docs/protocol.md#learning-rate-grids)",
    )
    s.add_argument(
        "--set",
        nargs="+",
        action="extend",
        metavar="KEY=VALUE",
        help="overrides for every arm: model.KEY=V (or KEY=V) and train.KEY=V (weight_decay, warmup_steps, ...)",
    )
    s.add_argument("--eval-batches", type=int, default=20, help="validation batches per evaluation")
    s.add_argument("--eval-points", type=int, default=10, help="validations per run (the last at the end)")
    s.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="compute dtype (params fp32)")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")


def plan_options(args: argparse.Namespace, **fixed) -> PlanOptions:
    """The options every plan of a study shares, from its flags, with `fixed` over them (a comparison's batch; a
    ladder and a batch-size study set theirs per plan). A device this machine lacks fails here, not in every run."""
    if args.device != "auto" and getattr(args, "executor", "local") == "local":  # a Slurm job's node is not this one
        from angpt.train.dist import pick_device

        pick_device(args.device)
    flags = dict(
        preset=args.preset,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        lr_grid=numbers(args.lr_grid, "--lr-grid"),
        lr=lr_table(args.lr),
        lr_values=lr_values(args.lr_values),
        max_extensions=args.max_extensions,
        settings=list(args.set or []),
        eval_batches=args.eval_batches,
        eval_points=args.eval_points,
        dtype=args.dtype,
        device=args.device,
    )
    return PlanOptions(**{**flags, **fixed})


def jobs_flag(text: str, *, auto: bool = True) -> int | str:
    """`--jobs N` (or `auto`, where the kind measures it); a one-line UserError otherwise."""
    if auto and text == "auto":
        return "auto"
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise UserError(f"--jobs {text!r} must be a positive integer" + (" or 'auto'" if auto else ""))
    return jobs


def add_executor_flags(s: argparse.ArgumentParser, *, auto: bool = True) -> None:
    """Where the runs train: --jobs and --threads here, --executor inprocess and its --deadline, or --executor slurm
    and its --slurm.* flags (one per SlurmOptions field, study/slurm.py) and --slurm.config FILE."""
    from angpt.study.slurm import option_fields

    more = ", or 'auto' (measure jobs x threads)" if auto else ""
    s.add_argument("--jobs", default="1", help=f"runs in parallel processes here (default 1){more}")
    s.add_argument("--threads", type=int, default=None, help="torch threads per job (default: cores // jobs)")
    s.add_argument(
        "--executor",
        default="local",
        choices=["local", "inprocess", "slurm"],
        help="where runs train: worker processes here (--jobs); every run in this process, each arm's model built "
        "and compiled once (inprocess: one device, --deadline); or one Slurm job each (docs/compare.md)",
    )
    s.add_argument(
        "--deadline",
        default=None,
        metavar="SECONDS",
        help="--executor inprocess: start no run (nor a seed's pair of runs) that would end later than this from "
        "now (570, 9.5m, 2h); the study then stops PARTIAL and the same command goes on",
    )
    s.add_argument(
        "--slurm.config",
        dest="slurm_config",
        default=None,
        metavar="FILE",
        help="a YAML file of --slurm.* options (keys as the flags' names: partition, gpus-per-run, ...); flags win",
    )
    for name, kind, text in option_fields():
        dest, flag = f"slurm_{name}", f"--slurm.{name.replace('_', '-')}"
        if kind is bool:
            s.add_argument(flag, dest=dest, action="store_true", default=None, help=text)
        elif kind is list:
            s.add_argument(flag, dest=dest, action="append", default=None, metavar="OPTION", help=text)
        else:
            s.add_argument(flag, dest=dest, type=kind, default=None, metavar=name.split("_")[0].upper(), help=text)


def executor_options(args: argparse.Namespace) -> Any:
    """Where the runs go, from the flags: None (--jobs worker processes here), study/inprocess.py's InProcess
    (--executor inprocess, with --deadline) or study/slurm.py's SlurmOptions (slurm_options). A flag of another
    executor is a one-line UserError."""
    if args.executor != "inprocess":
        if args.deadline is not None:
            raise UserError("--deadline needs --executor inprocess")
        return slurm_options(args)
    import time

    from angpt.study.inprocess import InProcess, parse_deadline

    slurm_options(args)  # a --slurm.* flag here is refused in one line
    if str(args.jobs) != "1":
        raise UserError(f"--jobs {args.jobs}: --executor inprocess trains one run at a time in this process")
    return InProcess(deadline=None if args.deadline is None else time.time() + parse_deadline(args.deadline))


def slurm_options(args: argparse.Namespace) -> Any:
    """The SlurmOptions of `--executor slurm` (None for local): the --slurm.config file's keys, the flags over
    them. A --slurm.* flag without --executor slurm, an unknown key or a bad value is a one-line UserError."""
    from angpt.study.slurm import SlurmOptions

    given = {k.removeprefix("slurm_"): v for k, v in vars(args).items() if k.startswith("slurm_") and v is not None}
    if args.executor != "slurm":
        if given:
            raise UserError(f"--slurm.{next(iter(given)).replace('_', '-')} needs --executor slurm")
        return None
    values = _slurm_file(Path(given.pop("config"))) if "config" in given else {}
    return SlurmOptions(**{**values, **given})


def _slurm_file(path: Path) -> dict[str, Any]:
    """The options of a --slurm.config YAML file, each checked against its flag's type."""
    import yaml

    from angpt.study.slurm import option_fields

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise UserError(f"--slurm.config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise UserError(f"--slurm.config {path}: not YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"--slurm.config {path}: a mapping of option: value, e.g. partition: gpu")
    kinds = {name: kind for name, kind, _ in option_fields()}
    out = {}
    for key, value in data.items():
        name = str(key).removeprefix("slurm.").replace("-", "_")
        if name not in kinds:
            raise UserError(f"--slurm.config {path}: unknown option {key!r} (known: "
                            f"{', '.join(n.replace('_', '-') for n in kinds)})")  # fmt: skip
        kind = kinds[name]
        if kind is list:
            value = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        elif kind is bool:
            if not isinstance(value, bool):
                raise UserError(f"--slurm.config {path}: {key}: {value!r} must be true or false")
        elif kind is str:
            value = str(value)
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or (kind is int and value != int(value)):
            what = "an integer" if kind is int else "a number"
            raise UserError(f"--slurm.config {path}: {key}: {value!r} must be {what}")
        else:
            value = kind(value)
        out[name] = value
    return out
