"""The command-line flags every kind of study shares, read once: lists and numbers, per-arm rates, and the
:class:`~angpt.study.plan.PlanOptions` that every plan of a study shares (`angpt compare`, `angpt scaling`)."""

from __future__ import annotations

import argparse

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


def plan_options(args: argparse.Namespace, **fixed) -> PlanOptions:
    """The options every plan of a study shares, from its flags, with `fixed` over them (a comparison's batch; a
    ladder and a batch-size study set theirs per plan). A device this machine lacks fails here, not in every run."""
    if args.device != "auto":
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
