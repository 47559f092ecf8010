"""The scaling report as markdown: provenance, then the ladder's sections and the batch-size study's, warnings and
plots."""

from __future__ import annotations

from typing import Any

from angpt.study.batch.render import render_batch
from angpt.study.ladder.plan import Ladder
from angpt.study.ladder.render import render_ladder
from angpt.units import si as _si


def render_provenance(report: dict[str, Any]) -> list[str]:
    m = report.get("machine", {})
    ds = report.get("dataset", {})
    return [
        f"Command: `{report.get('command', '')}`",
        "",
        f"{m.get('date', '-')}; angpt {m.get('angpt_version', '-')} (git {m.get('git_revision', '-')}), torch "
        f"{m.get('torch_version', '-')}, python {m.get('python_version', '-')}; {m.get('hostname', '-')}: "
        f"{m.get('cpu', '-')} ({m.get('cpu_cores', '-')} cores), GPU {m.get('gpu') or 'none'}; "
        f"dtype {m.get('dtype', '-')}",
        f"Dataset: {ds.get('source', '-')}, tokenizer {ds.get('tokenizer', '-')} "
        f"(vocabulary {ds.get('vocab_size', '-')}), "
        f"{_si(ds['train_tokens']) if ds.get('train_tokens') else '-'} training tokens",
        "",
    ]


def render_markdown(report: dict[str, Any], ladder: Ladder | None, plots: dict[str, str]) -> str:
    """The whole report.md: the ladder (if any), the batch-size study (if any), warnings, plots."""
    arms = ", ".join(a.label for a in ladder.arms) if ladder else ", ".join(report.get("batch", {}).get("arms", {}))
    lines = [f"# Scaling: {arms}", "", *render_provenance(report)]
    if ladder is not None and report.get("ladder"):
        lines += render_ladder(ladder, report["ladder"])
    if report.get("batch"):
        lines += ["", *render_batch(report["batch"])]
    warnings = report.get("warnings", [])
    if warnings:
        lines += ["", "## Warnings", "", *(f"- {w}" for w in warnings)]
    if plots:
        lines += ["", "## Plots", "", *(f"![{k}]({v})" for k, v in plots.items())]
    elif report.get("plots_missing"):
        lines += ["", f"Plots: {report['plots_missing']}"]
    return "\n".join(lines) + "\n"
