"""The study engine's run store and its estimate (study/store.py, study/estimate.py): the pieces a mutation pass of
issue 38 found unguarded. Each test fails with its property broken (checked: the last-row val_loss check removed,
NaN kept by clean_json, the evaluation passes left out of the estimate)."""

import json
import math

import pytest

from angpt.study.estimate import estimate_run_seconds
from angpt.study.store import RESULT_FILE, clean_json, load_record, write_json

from .test_compare import tiny_plan


def _run(tmp_path, rows, status="finished", steps=4):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / RESULT_FILE).write_text(json.dumps({"steps": steps, "status": status, "val_loss": 2.0}))
    return run


def test_a_finished_record_counts_only_with_the_final_validation_logged(tmp_path):
    """A run whose result says finished but whose last metrics row has no validation loss (killed between the last
    step and its evaluation, then a stray result written) is not done: a re-run must finish it."""
    rows = [{"step": s, "loss": 3.0} for s in range(1, 5)]
    assert load_record(_run(tmp_path, rows), steps=4) is None
    rows[-1]["val_loss"] = 2.0
    (tmp_path / "run").rename(tmp_path / "old")
    assert load_record(_run(tmp_path, rows), steps=4)["status"] == "finished"


def test_a_report_is_strict_json_without_nan(tmp_path):
    """A diverged run's NaN loss is written as null (clean_json, which every report passes through before
    write_json): a strict JSON reader (jq, JavaScript) rejects NaN."""
    path = tmp_path / "report.json"
    write_json(path, clean_json({"loss": float("nan"), "runs": [{"inf": float("inf")}], 3: 1.5}))  # as reports do

    def refuse(name):
        raise ValueError(name)

    assert json.loads(path.read_text(), parse_constant=refuse) == {"loss": None, "runs": [{"inf": None}], "3": 1.5}
    assert clean_json((1.0, math.nan)) == [1.0, None]


def test_the_run_estimate_counts_its_validation_passes(data_dir):
    """steps x step time, plus the validation passes: eval_batches forwards each, a forward a third of a
    micro-batch's forward and backward, spread over the accumulation steps."""
    plan = tiny_plan(data_dir, eval_batches=8, eval_points=4)
    budget = plan.budgets[-1]
    steps, accum = plan.steps(budget), plan.batch_tokens // (plan.seq_len * plan.micro_batch)
    evals = math.ceil(steps / plan.eval_every(budget))
    assert evals >= 2
    expected = 5.0 + steps * 1.0 + evals * 8 * 1.0 / (3 * accum)
    assert estimate_run_seconds(plan, 1.0, budget, setup=5.0) == pytest.approx(expected)
    fewer = tiny_plan(data_dir, eval_batches=1, eval_points=4)
    assert estimate_run_seconds(fewer, 1.0, budget) < estimate_run_seconds(plan, 1.0, budget)
