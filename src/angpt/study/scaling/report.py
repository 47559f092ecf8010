"""Writing the scaling report of OUT: collect the store, analyse, then report.json, report.md and the plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.study.batch.analyse import analyse_batch, batch_warnings
from angpt.study.store import BATCH_FILE, LADDER_FILE, clean_json


def build_report(out: str | Path, *, command: str | None = None, bootstrap: int = 200, seed: int = 0) -> dict[str, Any]:
    """The report of whatever OUT holds (a ladder, a batch-size study or both), as plain data."""
    from angpt.study.ladder.analyse import analyse_ladder
    from angpt.study.ladder.collect import collect_ladder
    from angpt.study.machine import dataset_summary, machine_info

    out = Path(out)
    has_ladder, has_batch = (out / LADDER_FILE).is_file(), (out / BATCH_FILE).is_file()
    if not (has_ladder or has_batch):
        raise UserError(f"{out} holds neither a scaling ladder ({LADDER_FILE}) nor a batch-size study ({BATCH_FILE})")
    if command is None:
        try:
            command = json.loads((out / "report.json").read_text()).get("command")
        except (OSError, json.JSONDecodeError):
            command = None
    report: dict[str, Any] = {"command": command or "-", "warnings": []}
    data_path, dtype, device = None, "auto", "auto"
    if has_ladder:
        data = collect_ladder(out)
        report["ladder"] = analyse_ladder(data, bootstrap=bootstrap, seed=seed)
        report["warnings"] += report["ladder"]["warnings"]
        data_path, dtype, device = data.ladder.data, data.ladder.compare["dtype"], data.ladder.device
    if has_batch:
        batch = analyse_batch(out)
        report["batch"] = batch
        report["warnings"] += batch_warnings(batch) if batch else []
        if data_path is None:
            study = json.loads((out / BATCH_FILE).read_text())
            data_path, dtype, device = study["data"], study["compare"]["dtype"], study["device"]
    report["machine"] = machine_info(dtype, device)
    try:
        from angpt.data import load_meta

        report["dataset"] = dataset_summary(load_meta(data_path))
    except Exception:  # the dataset may have moved since the runs; the report stands without its summary
        report["dataset"] = {}
    return report


def write_scaling_report(
    out: str | Path, *, command: str | None = None, bootstrap: int = 200, seed: int = 0
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Write OUT/report.json, OUT/report.md and the plots; returns (the report, the files written)."""
    from angpt.study.ladder.collect import load_ladder
    from angpt.study.scaling.plots import write_plots
    from angpt.study.scaling.render import render_markdown

    out = Path(out)
    report = build_report(out, command=command, bootstrap=bootstrap, seed=seed)
    ladder = load_ladder(out) if (out / LADDER_FILE).is_file() else None
    plots = write_plots(out, ladder, report)
    if plots is None:
        report["plots_missing"] = "matplotlib is not installed (pip install 'angpt[plot]'): no plots"
        print(f"warning: {report['plots_missing']}", file=sys.stderr)
        plots = {}
    report["plots"] = {k: p.name for k, p in plots.items()}
    files = {"report.json": out / "report.json", "report.md": out / "report.md", **plots}
    (out / "report.json").write_text(json.dumps(clean_json(report), indent=2))
    (out / "report.md").write_text(render_markdown(report, ladder, report["plots"]))
    return report, files
