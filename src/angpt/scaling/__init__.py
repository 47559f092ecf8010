"""`angpt scaling`: scaling laws and critical batch sizes per architecture (SPEC section 8).

>>> from angpt.scaling import make_ladder, run_ladder
>>> ladder = make_ladder("data/", arms=["gpt+", "angpt"], depths=[2, 3, 4, 5, 6], tokens_per_param=[5, 10, 20])
>>> result = run_ladder(ladder, "reports/scaling")
>>> print("\\n".join(result.report["ladder"]["verdicts"]))

Each size of a ladder is an `angpt compare` plan and run store (angpt.compare); the fit of
L(N, D) = E + A / N^alpha + B / D^beta is angpt.scaling.fit (scipy, from the `scaling` extra, imported lazily).
See docs/scaling.md.
"""

from __future__ import annotations

from angpt.scaling.batch import BatchStudy, critical_batch, make_batch_study, run_batch_study
from angpt.scaling.dial import Shape, dial_shapes
from angpt.scaling.fit import Bootstrap, Fit, Law, bootstrap_fit, compute_multiplier, fit_law
from angpt.scaling.plan import Ladder, Size, make_ladder, transfer_check
from angpt.scaling.report import write_scaling_report
from angpt.scaling.runner import LadderRun, run_ladder

__all__ = [
    "BatchStudy",
    "Bootstrap",
    "Fit",
    "Ladder",
    "LadderRun",
    "Law",
    "Shape",
    "Size",
    "bootstrap_fit",
    "compute_multiplier",
    "critical_batch",
    "dial_shapes",
    "fit_law",
    "make_batch_study",
    "make_ladder",
    "run_batch_study",
    "run_ladder",
    "transfer_check",
    "write_scaling_report",
]
