"""One run of a comparison in its own process: ``python -m angpt.compare._worker REPORT SPEC THREADS < plan.json``.

Exit status 0: the run is done and its result.json written; 130: interrupted by a signal (checkpoint saved).
Any other status is a failure, with its traceback in the log the parent captured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch

    from angpt.compare.plan import Plan
    from angpt.compare.runner import INTERRUPTED_EXIT, execute_run
    from angpt.compare.store import RunSpec

    report_dir, spec_json, threads = argv
    torch.set_num_threads(int(threads))
    plan = Plan.from_dict(json.loads(sys.stdin.read()))
    arm, budget, seed, lr = json.loads(spec_json)
    rec = execute_run(plan, Path(report_dir), RunSpec(arm, int(budget), int(seed), float(lr)))
    return INTERRUPTED_EXIT if rec.get("status") == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
