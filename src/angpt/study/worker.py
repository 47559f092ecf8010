"""One run of a study's plan in its own process: ``python -m angpt.study.worker REPORT SPEC THREADS < plan.json``,
or with ``--plan FILE`` (a Slurm job's: study/slurm.py). A run of several ranks is the same command in each rank's
process, under torchrun or, with ``--ranks-from-slurm``, under srun (each rank's place read from Slurm's environment).

Exit status 0: the run is done and its result.json written; 130: interrupted by a signal (checkpoint saved, or
stopped before training began). Any other status is a failure, with its traceback in the log the parent captured.

``python -m angpt.study.worker measure THREADS STEPS < plan.json`` times training steps for ``--jobs auto``
(angpt.study.jobs).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

INTERRUPTED_EXIT = 130  # execute.INTERRUPTED_EXIT, defined here too so that it holds before any import


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    # SIGTERM outside training acts as SIGINT does (KeyboardInterrupt); inside, train() saves and stops.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if argv and argv[0] == "measure":
            from angpt.study.jobs import measure_worker

            return measure_worker(int(argv[1]), int(argv[2]))
        return _run(argv)
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT


def _run(argv: list[str]) -> int:
    report_dir, spec_json, threads, *rest = argv
    if "--ranks-from-slurm" in rest:
        from angpt.study.slurm import rank_env

        os.environ.update(rank_env(dict(os.environ)))
    import torch

    from angpt.study.execute import execute_run
    from angpt.study.plan import Plan
    from angpt.study.store import RunSpec
    from angpt.train.dist import finish_distributed

    torch.set_num_threads(int(threads))
    text = Path(rest[rest.index("--plan") + 1]).read_text() if "--plan" in rest else sys.stdin.read()
    plan = Plan.from_dict(json.loads(text))
    arm, budget, seed, lr, setting = json.loads(spec_json)
    spec = RunSpec(arm, int(budget), int(seed), float(lr), tuple((str(k), float(v)) for k, v in setting))
    rec = execute_run(plan, Path(report_dir), spec)
    finish_distributed()  # the ranks of a run of several leave together (a no-op for one)
    return INTERRUPTED_EXIT if rec.get("status") == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
