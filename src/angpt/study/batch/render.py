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
        "loss (`>=`: the largest batch tried, so a lower bound). A batch where a seed diverged counts as diverged "
        "(never averaged over the seeds that trained, never the critical batch); one with seeds not finished yet "
        "says how many its mean covers.",
        "",
    ]
    header = ["arm", *(format_tokens(x) for x in b["batch_sizes"]), "critical batch"]
    rows = []
    for label, e in b["arms"].items():
        cells = [_cell(e, x, len(b["seeds"])) for x in b["batch_sizes"]]
        c = e["critical"]
        crit = "-" if c["critical"] is None else (">= " if c["at_largest"] else "") + format_tokens(c["critical"])
        rows.append([label, *cells, crit])
    lines += _table(header, rows)
    for u in b.get("unfinished", []):
        lines.append(f"- not finished: {u}")
    return lines


def _cell(e: dict[str, Any], x: int, n_seeds: int) -> str:
    """One arm's batch x: its mean loss and LR. A batch where a seed diverged names those seeds instead of a number;
    one with seeds not finished yet says how many seeds its mean covers."""
    loss, lr = e["loss"].get(x), e["lr"].get(x)
    if loss is None:
        return "-"
    if x in e.get("sweep_diverged", []):
        return "diverged at every LR of its sweep"
    done = len(e.get("per_seed", {}).get(x, {}))
    diverged = e.get("diverged", {}).get(x)
    notes = [f"{len(diverged)} of {n_seeds} seeds diverged"] if diverged else []
    notes += [f"{done} of {n_seeds} seeds finished"] if done < n_seeds else []
    notes += [f"lr {format_lr(lr)}"] if lr else []
    head = f"diverged: seed {', '.join(map(str, diverged))}" if diverged else f"{loss:.4g}"
    return head + (f" ({'; '.join(notes)})" if notes else "")
