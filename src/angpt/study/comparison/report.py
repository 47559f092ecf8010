"""Writing a plan's report (a comparison's, each size's of a ladder, each batch's; finished, or partial from the
store): collect, analyse, then report.json, report.md and the plots; and a plan as a unit of any study, with it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from angpt.study.comparison.analyse import analyse, correct_for_multiplicity, verdict, warnings
from angpt.study.comparison.collect import collect
from angpt.study.comparison.horizon import short_comparison
from angpt.study.comparison.lead import lead, power, tuning_screen
from angpt.study.comparison.plots import write_plots
from angpt.study.comparison.render import render_markdown
from angpt.study.comparison.samples import render_samples, sample_arms
from angpt.study.driver import Executed, Report, Unit
from angpt.study.machine import dataset_summary, machine_info
from angpt.study.plan import Plan
from angpt.study.slurm import recorded_options
from angpt.study.store import RunSpec, clean_json, write_json, write_text
from angpt.study.stored import Stored, read_store
from angpt.study.sweep import Runs, Sweeps, lr_check


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
    partial: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
    rewritten_by: str | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Analyse and write report.json, report.md and the plots. Returns (the report dict, the files written).

    `horizon` is :meth:`angpt.study.comparison.horizon.Horizons.to_dict` (a comparison short of it is a smoke test);
    `jobs_measurement` what ``--jobs auto`` measured, if it ran. With `sample` (a prompt), report.md ends with
    each arm's continuation of it (compare/samples.py). `partial` (see :func:`write_stored_report`) labels the
    report PARTIAL and lists every planned run; `machine` replaces this machine's description (the runs' own,
    kept from an earlier report), `rewritten_by` the command that rewrote the report from the store.
    """
    from angpt.data import load_meta

    runs = collect(plan, report_dir, sweeps, records)
    arms = analyse(plan, runs, sweeps)
    for label, entry in arms.items():  # before the warnings: a flagged LR check is one
        entry["lr_check"] = lr_check(plan, sweeps, label, lambda spec: records.get(spec.key()))
    family = correct_for_multiplicity(plan, arms)  # before the verdicts: "established" needs the adjusted p
    try:
        meta = load_meta(plan.data)
    except Exception:  # the dataset may have moved since the runs; the report stands without its summary
        meta = None
    report: dict[str, Any] = {
        "command": command,
        "rewritten_by": rewritten_by,
        "partial": partial,
        "machine": machine or machine_info(plan.dtype, plan.device),
        "jobs": jobs,
        "threads": threads,
        "slurm": recorded_options(report_dir),  # runs trained as Slurm jobs: what each asked (--jobs did not apply)
        "jobs_measurement": jobs_measurement,
        "plan": plan.to_dict(),
        "dataset": dataset_summary(meta) or _fingerprinted(plan),
        "horizon": horizon,
        "baseline": plan.baseline,
        "stat": plan.stat,
        "arms": arms,
        "multiple_comparisons": family,
        "tuning_screen": tuning_screen(plan, report_dir, sweeps),
        "lead": lead(plan, report_dir, sweeps, records),
        "power": power(plan, arms),
        "verdicts": [
            verdict(plan, lab, e, short_comparison(horizon, lab)) for lab, e in arms.items() if lab != plan.baseline
        ],
        "warnings": warnings(plan, arms, meta, horizon),
    }
    _runs_dtype(report, records)
    if sample is not None and partial is not None:
        report["warnings"].append("no --sample continuations in a partial report: they come from finished runs")
        sample = None
    if sample is not None:
        report["samples"] = {"prompt": sample, "text": sample_arms(plan, report_dir, sweeps, sample, sample_tokens)}
    plots, plot_warnings = write_plots(plan, runs, arms, report_dir, report)
    report["warnings"] += plot_warnings
    report["plots"] = {k: p.name for k, p in plots.items()}
    files = {"report.json": report_dir / "report.json", "report.md": report_dir / "report.md", **plots}
    write_json(report_dir / "report.json", clean_json(report))
    markdown = render_markdown(plan, report, plots)
    if sample is not None:
        markdown = markdown.rstrip("\n") + "\n\n" + render_samples(plan, sample, report["samples"]["text"])
    write_text(report_dir / "report.md", markdown)
    return report, files


def _runs_dtype(report: dict[str, Any], records: dict[tuple, dict]) -> None:
    """The dtype the runs computed in, as the report's machine's; a warning where they computed in several."""
    dtypes = sorted({r["dtype"] for r in records.values() if r.get("dtype")})
    if len(dtypes) == 1:
        report["machine"] = {**report["machine"], "dtype": dtypes[0]}
    elif dtypes:
        report["warnings"].append(
            f"the runs computed in different dtypes ({', '.join(dtypes)}): their losses and step times are not "
            "comparable; re-run with --dtype fp32 or --dtype bf16"
        )


def write_stored_report(
    report_dir: Path, plan: Plan | None = None, **kw: Any
) -> tuple[dict[str, Any], dict[str, Path], Stored]:
    """The report of whatever the store in `report_dir` holds for `plan` (default: its plan.json), training
    nothing: :func:`write_report` over the sweeps settled so far and the finished main runs (stored.read_store).

    A store with runs still to do gives a PARTIAL report: report["partial"] holds the counts (`finished` of
    `planned` runs known so far: a sweep still waiting may extend its grid) and every planned run with its state,
    and statistics cover only the budgets where every seed of both arms finished. `kw` goes to write_report.
    """
    stored = read_store(report_dir, plan)
    partial = None
    if not stored.complete:
        partial = {
            "finished": stored.finished,
            "planned": len(stored.runs),
            "unsettled": {label: budgets for label, budgets in stored.unsettled.items()},
            "runs": stored.runs,
        }
    report, files = write_report(stored.plan, report_dir, stored.sweeps, stored.records, partial=partial, **kw)
    return report, files, stored


def _fingerprinted(plan: Plan) -> dict[str, Any]:
    """What the plan's data fingerprint says of its dataset, where the dataset is not here (runs made elsewhere)."""
    fp = plan.data_fingerprint or {}
    tokens = fp.get("tokens") or {k: v.get("tokens") for k, v in (fp.get("splits") or {}).items()}
    docs = fp.get("documents") or {k: v.get("documents") for k, v in (fp.get("splits") or {}).items()}
    if not tokens:
        return {}
    out = {"tokenizer": fp.get("tokenizer"), "vocab_size": fp.get("vocab_size"), "source": fp.get("source")}
    for split in ("train", "val", "test"):
        out |= {f"{split}_tokens": tokens.get(split), f"{split}_documents": docs.get(split)}
    return out


def plan_unit(
    plan: Plan,
    folder: Path,
    *,
    command: str,
    jobs: int,
    threads: int,
    horizon: dict[str, Any] | None = None,
    measured: dict[str, Any] | None = None,
    sample: str | None = None,
    sample_tokens: int = 80,
    before_main: Callable[[Runs, list[RunSpec]], None] | None = None,
    locked: bool = False,
    done: Callable[[Report], None] | None = None,
) -> Unit:
    """A plan as a unit of any study, with the report of its runs (:func:`write_report`): report.md, report.json and
    plots in `folder` once its runs are done, a PARTIAL one when interrupted. `done` receives the Report."""
    from angpt.study.comparison.horizon import horizon as plan_horizon

    kw: dict[str, Any] = {"command": command, "jobs": jobs, "threads": threads, "jobs_measurement": measured}
    kw |= {"horizon": horizon or plan_horizon(plan).to_dict(), "sample": sample, "sample_tokens": sample_tokens}

    def report(executed: Executed) -> Report:
        data, files = write_report(plan, folder, executed.sweeps, executed.records, **kw)
        result = Report(folder, plan, False, executed.sweeps, data, files, executed.trained, None,
                        kw["horizon"], measured)  # fmt: skip
        if done is not None:
            done(result)
        return result

    return Unit(plan, folder, command, report, lambda: write_partial(plan, folder, **kw), before_main, locked)


def write_partial(plan: Plan, report_dir: Path, **kw: Any) -> None:
    """The report of an interrupted comparison, from what its store holds (PARTIAL unless every run finished).

    It only reads the runs and writes the report's own files; a failure costs one warning line and leaves the
    interruption (its exit code) to stand.
    """
    try:
        _, files, stored = write_stored_report(report_dir, plan, **kw)
    except Exception as e:  # noqa: BLE001 - the interruption, not its report, decides how the command ends
        print(f"warning: no partial report written ({type(e).__name__}: {e})", file=sys.stderr)
        return
    what = "report" if stored.complete else "partial report"
    print(
        f"{what} ({stored.finished} of {len(stored.runs)} planned runs finished): {files['report.md']}", file=sys.stderr
    )
