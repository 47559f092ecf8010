"""Studies: fair comparisons, scaling ladders and batch-size studies of architectures, on one engine.

The engine (this folder): arms and plans (arms.py, plan.py: which runs exist and what each computes), the run
store (store.py: folders, records, locks), execution (execute.py, worker.py, jobs.py, progress.py), sweeps and
selection (sweep.py), reading a store without training (stored.py), estimates
(estimate.py), provenance (machine.py), the model-size dial (dial.py), the flags every study shares (flags.py) and
the one driver (driver.py: a study's plans in turn, each a unit with its report). The kinds of study, each its plan,
run, analysis and rendering over that engine: comparison/ (`angpt compare`), ladder/ and batch/ (`angpt scaling`;
scaling/ joins them in one folder, one report and one command line).

Importing this package is light: the names below load their module when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_FACE = {
    "angpt.study.arms": ("Arm", "parse_arm", "parse_settings", "split_arms"),
    "angpt.units": ("format_tokens", "parse_tokens"),
    "angpt.study.plan": ("DEFAULT_LR_GRID", "Plan", "PlanOptions", "make_plan"),
    "angpt.study.execute": ("StudyInterrupted",),
    "angpt.stats": ("paired_ttest", "speedups", "tokens_to_reach", "welch_ttest"),
    "angpt.study.driver": ("Report",),
    "angpt.study.comparison.run": ("rewrite_report", "run_comparison"),
    "angpt.study.ladder.plan": ("Ladder", "Size", "make_ladder"),
    "angpt.study.batch.plan": ("BatchStudy", "make_batch_study"),
    "angpt.study.scaling.run": ("ScalingRun", "run_batch_study", "run_ladder"),
    "angpt.study.scaling.report": ("write_scaling_report",),
}
_WHERE = {name: module for module, names in _FACE.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'angpt.study' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
