"""The report of `make demo`'s shape (two arms, one budget, one seed, --lr-grid 1, --tuning-seed none) says only
what happened: no sweep, no multiple-comparison correction of no tests, one smoke-test warning at the top, and
plots that name the split they draw."""

import dataclasses

import pytest

from angpt.data import prepare_dataset
from angpt.study import make_plan, run_comparison
from angpt.study.comparison.collect import ArmRuns
from angpt.study.comparison.plots import write_plots
from angpt.units import format_lr

from .test_compare import TINY
from .test_data import make_docs, write_source


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One demo-shaped comparison on data with a test split, as `make demo` prepares: (plan, report.md's text)."""
    root = tmp_path_factory.mktemp("demo")
    src = write_source("jsonl", root / "src", make_docs(120, words=200))
    prepare_dataset(src, "bytes", root / "data", val_fraction=0.2, progress=False)
    plan = make_plan(root / "data", **{**TINY, "budgets": [2048]}, arms=["gpt+", "angpt"], seeds=[0], lr_grid=[1])
    assert plan.report_split == "test"
    run_comparison(plan, root / "rep", jobs=1, threads=1, progress=False)
    return plan, (root / "rep" / "report.md").read_text()


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


@pytest.mark.parametrize("split", ["val", "test"])
def test_the_loss_curves_name_the_split_they_draw_and_the_one_the_tables_give(demo, split, tmp_path, monkeypatch):
    """The curves are validation losses (the test split is measured once, at the end); a report whose tables give
    the test loss says so on the plot, so the two are not read as one number."""
    figure = pytest.importorskip("matplotlib.figure")
    plan = dataclasses.replace(demo[0], report_split=split)
    drawn = []
    monkeypatch.setattr(figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig.axes[0]))
    runs = {"gpt+": ArmRuns("gpt+", 0.002, curves={0: [(1024, 5.0), (2048, 4.0)]})}
    write_plots(plan, runs, {"gpt+": {"tune": {}, "budgets": []}}, tmp_path)
    (ax,) = drawn
    assert ax.get_ylabel().startswith("validation loss") and ax.get_title().startswith("validation loss")
    assert ("the tables give the held-out test loss" in ax.get_title()) == (split == "test")


def test_the_report_says_its_curves_are_validation_and_its_tables_test(demo):
    _, md = demo
    assert "## Final test loss" in md and "![val_loss_vs_tokens](val_loss_vs_tokens.png)" in md
    assert "The loss curves are validation losses during training: the tables give the held-out test loss" in md
