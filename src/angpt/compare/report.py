"""Writing a finished comparison's report: collect, analyse, then report.json, report.md and the plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from angpt.compare.analyse import analyse, verdict, warnings
from angpt.compare.collect import collect
from angpt.compare.machine import dataset_summary, machine_info
from angpt.compare.plan import Plan
from angpt.compare.plots import write_plots
from angpt.compare.render import clean_json, render_markdown
from angpt.compare.samples import render_samples, sample_arms
from angpt.compare.sweep import Sweeps


def write_report(
    plan: Plan,
    report_dir: Path,
    sweeps: Sweeps,
    records: dict[tuple, dict],
    *,
    command: str,
    jobs: int,
    threads: int,
    horizon: dict[str, Any] | None = None,
    jobs_measurement: dict[str, Any] | None = None,
    sample: str | None = None,
    sample_tokens: int = 80,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Analyse and write report.json, report.md and the plots. Returns (the report dict, the files written).

    `horizon` is :meth:`angpt.compare.horizon.Horizon.to_dict` (a short one labels the report a smoke test);
    `jobs_measurement` what ``--jobs auto`` measured, if it ran. With `sample` (a prompt), report.md ends with
    each arm's continuation of it (compare/samples.py).
    """
    from angpt.data import load_meta

    runs = collect(plan, report_dir, sweeps, records)
    arms = analyse(plan, runs, sweeps)
    try:
        meta = load_meta(plan.data)
    except Exception:  # the dataset may have moved since the runs; the report stands without its summary
        meta = None
    smoke = bool(horizon and horizon.get("short"))
    report: dict[str, Any] = {
        "command": command,
        "machine": machine_info(plan.dtype, plan.device),
        "jobs": jobs,
        "threads": threads,
        "jobs_measurement": jobs_measurement,
        "plan": plan.to_dict(),
        "dataset": dataset_summary(meta),
        "horizon": horizon,
        "baseline": plan.baseline,
        "stat": plan.stat,
        "arms": arms,
        "verdicts": [verdict(plan, lab, e, smoke) for lab, e in arms.items() if lab != plan.baseline],
        "warnings": warnings(plan, arms, meta, horizon),
    }
    if sample is not None:
        report["samples"] = {"prompt": sample, "text": sample_arms(plan, report_dir, sweeps, sample, sample_tokens)}
    plots, plot_warnings = write_plots(plan, runs, arms, report_dir)
    report["warnings"] += plot_warnings
    report["plots"] = {k: p.name for k, p in plots.items()}
    files = {"report.json": report_dir / "report.json", "report.md": report_dir / "report.md", **plots}
    (report_dir / "report.json").write_text(json.dumps(clean_json(report), indent=2))
    markdown = render_markdown(plan, report, plots)
    if sample is not None:
        markdown = markdown.rstrip("\n") + "\n\n" + render_samples(plan, sample, report["samples"]["text"])
    (report_dir / "report.md").write_text(markdown)
    return report, files
