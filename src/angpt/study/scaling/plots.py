"""The scaling report's plots: the ladder's and the batch-size study's, where the report has data for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from angpt.study.batch.plots import batch_plot
from angpt.study.ladder.plan import Ladder
from angpt.study.ladder.plots import ladder_plots


def write_plots(out: Path, ladder: Ladder | None, report: dict[str, Any]) -> dict[str, Path] | None:
    """The PNGs this report has data for; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    files: dict[str, Path] = {}
    a = report.get("ladder")
    if ladder is not None and a and a["runs"]:
        files.update(ladder_plots(plt, out, ladder, a))
    if report.get("batch"):
        files["batch_size"] = batch_plot(plt, out, report["batch"])
    return files
