"""The report of `make demo`'s shape (two arms, one budget, one seed, --lr-grid 1, --tuning-seed none) says only
what happened: no sweep, no multiple-comparison correction of no tests, one smoke-test warning at the top, and
plots that name the split they draw."""

import pytest

from angpt.study import make_plan, run_comparison
from angpt.study.units import format_lr

from .test_compare import TINY


@pytest.fixture(scope="module")
def demo(data_dir, tmp_path_factory):
    """One demo-shaped comparison: (plan, report.md's text)."""
    out = tmp_path_factory.mktemp("demo") / "rep"
    plan = make_plan(data_dir, **{**TINY, "budgets": [2048]}, arms=["gpt+", "angpt"], seeds=[0], lr_grid=[1])
    run_comparison(plan, out, jobs=1, threads=1, progress=False)
    return plan, (out / "report.md").read_text()


def test_a_one_point_grid_shows_no_sweep_and_names_each_rates_source(demo):
    plan, md = demo
    assert "## Learning-rate sweeps" not in md and "| best |" not in md
    assert "from its own sweep" not in md and "was given" not in md and "chosen LR" not in md
    for arm in plan.arms:
        lr = format_lr(plan.initial_grid(arm)[0])
        assert f"{arm.label} at {lr} (its recipe's default at preset tiny)" in md


def test_one_seed_has_no_test_and_no_holm(demo):
    _, md = demo
    assert "Holm" not in md and "0 tests" not in md
    assert "No interval or test: one seed." in md


def test_a_smoke_test_says_not_evidence_once_at_the_top_with_its_reasons(demo):
    _, md = demo
    lines = md.splitlines()
    assert md.count("not evidence") == 1 and "smoke test, not evidence" in lines[0]
    assert "optimizer steps (< 1,000)" in lines[2] and "0.5B parameters" in lines[2]  # why, right under the title
    assert "## Verdict\n" in md
