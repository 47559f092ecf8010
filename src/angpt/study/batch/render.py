"""The batch-size study's section of the scaling report."""

from __future__ import annotations

from typing import Any

from angpt.units import format_lr, format_tokens


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def render_batch(b: dict[str, Any]) -> list[str]:
    """The batch-size section of report.md."""
    shape = f"depth {b['shape']['depth']}, width {b['shape']['width']}" if b.get("shape") else f"preset {b['preset']}"
    lines = [
        "## Batch size",
        "",
        f"Final validation loss at {format_tokens(b['tokens'])} tokens ({shape}; mean over seeds {b['seeds']}), each "
        f"batch with its own LR sweep. Critical batch: the largest batch within {b['tolerance']:.0%} of the arm's best "
        "loss (`>=`: the largest batch tried, so a lower bound).",
        "",
    ]
    header = ["arm", *(format_tokens(x) for x in b["batch_sizes"]), "critical batch"]
    rows = []
    for label, e in b["arms"].items():
        cells = []
        for x in b["batch_sizes"]:
            loss = e["loss"].get(x)
            lr = e["lr"].get(x)
            cells.append("-" if loss is None else (f"{loss:.4g} (lr {format_lr(lr)})" if lr else f"{loss:.4g}"))
        c = e["critical"]
        crit = "-" if c["critical"] is None else (">= " if c["at_largest"] else "") + format_tokens(c["critical"])
        rows.append([label, *cells, crit])
    lines += _table(header, rows)
    for u in b.get("unfinished", []):
        lines.append(f"- not finished: {u}")
    return lines
