"""Selection apart from measurement (issue 25; docs/protocol.md): three document-level splits, evaluation windows
spread over a whole split, learning rates chosen on a tuning seed by validation loss, and reported numbers from the
other seeds on the test split."""

import json

import numpy as np
import pytest

from angpt.data import eval_windows, prepare_dataset
from angpt.errors import UserError
from angpt.study import make_plan, run_comparison

from .test_compare import TINY
from .test_data import decode_docs, make_docs, write_source


@pytest.fixture(scope="module")
def three_splits(tmp_path_factory):
    """A byte dataset with train, validation and test documents (20% each held out)."""
    root = tmp_path_factory.mktemp("three")
    src = write_source("jsonl", root / "src", make_docs(120, words=200))
    prepare_dataset(src, "bytes", root / "data", val_fraction=0.2, progress=False)
    return root / "data"


def test_evaluation_windows_spread_over_the_whole_split():
    assert np.array_equal(eval_windows(10, 4, None), np.arange(10))  # no limit: everything, in order
    assert np.array_equal(eval_windows(10, 4, 5), np.arange(10))  # a limit above the split: everything
    picked = eval_windows(1000, 8, 2)  # 16 of 1000
    assert picked.size == 16 and picked[0] == 0 and picked[-1] == 999  # from the first window to the last
    gaps = np.diff(picked)
    assert gaps.min() >= 66 and gaps.max() <= 67  # evenly spaced, not the first 16


def test_the_trainer_reports_the_test_loss_once_at_the_end(three_splits, tmp_path):
    from .test_train import TINY as TRAIN
    from .test_train import metrics, run_cli

    out = tmp_path / "run"
    assert run_cli("--arch", "gpt+", "--data", three_splits, *TRAIN, "--out", out, "--train.max_steps", "3",
                   "--train.eval_every", "1") == 0  # fmt: skip
    rows = metrics(out)
    assert [r["step"] for r in rows if "val_loss" in r] == [1, 2, 3]
    assert [r["step"] for r in rows if "test_loss" in r] == [3]  # measured once, after every choice is made
    assert rows[-1]["test_loss"] != rows[-1]["val_loss"]


def test_a_comparison_selects_on_the_tuning_seed_and_reports_the_test_split(three_splits, tmp_path):
    plan = make_plan(
        three_splits,
        **{**TINY, "tuning_seed": 1000, "budgets": [2048]},
        arms=["gpt+", "angpt"],
        seeds=[0, 1],
        lr_grid=[1, 2],
        max_extensions=0,
    )
    assert plan.report_split == "test" and plan.sweep_seed == 1000
    report = run_comparison(plan, tmp_path / "cmp", jobs=1, threads=1, progress=False)
    trained = {(s.arm, s.seed) for s in report.trained}
    sweep = [s for s in report.trained if s.seed == 1000]
    assert len(sweep) == 4 and {s.seed for s in report.trained} == {0, 1, 1000}  # 2 arms x 2 LRs, then the seeds
    assert {(a, s) for a in ("gpt+", "angpt") for s in (0, 1)} <= trained
    data = json.loads((tmp_path / "cmp" / "report.json").read_text())
    for arm in ("gpt+", "angpt"):
        row = data["arms"][arm]["budgets"][0]
        assert set(row["test_loss"]) == {"0", "1"} and "val_loss" not in row  # the reported split's key; not tuning
        for seed in (0, 1):
            (run,) = (tmp_path / "cmp" / "runs" / plan.arm(arm).slug / "2048" / f"seed{seed}").iterdir()
            rec = json.loads((run / "result.json").read_text())
            assert row["test_loss"][str(seed)] == rec["test_loss"] != rec["val_loss"]  # reported: the test split
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "chosen on tuning seed 1000 (not reported) by validation loss" in md
    assert "reported losses: seeds 0, 1 on the test split" in md and "## Final test loss" in md


def test_the_tuning_seed_cannot_be_a_reported_one(three_splits):
    with pytest.raises(UserError, match="tuning seed 1 is among the reported seeds"):
        make_plan(three_splits, **{**TINY, "tuning_seed": 1}, arms=["gpt+"], seeds=[0, 1])


def test_an_older_dataset_without_a_test_split_reports_on_validation_and_says_so(data_dir, tmp_path):
    plan = make_plan(data_dir, **{**TINY, "tuning_seed": 1000}, arms=["gpt+"], seeds=[0])
    assert plan.report_split in ("val", "test")
    if plan.report_split == "val":  # the shared fixture predates test splits
        from angpt.study.comparison.render import _selection_line

        assert "validation split (this dataset has no test split)" in _selection_line(plan, {})


def test_prepare_holds_out_as_many_test_documents_as_validation_ones(tmp_path):
    docs = make_docs(300)
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, "bytes", tmp_path / "d", val_fraction=0.1, progress=False)
    val, test = decode_docs(tmp_path / "d", "val"), decode_docs(tmp_path / "d", "test")
    assert 0.5 < len(test) / len(val) < 2 and not set(val) & set(test)
    assert meta["test_fraction"] == 0.1
    none = prepare_dataset(src, "bytes", tmp_path / "e", val_fraction=0.1, test_fraction=0, progress=False)
    assert "test" not in none["splits"]


def _sweep(grid, best):
    from angpt.study.sweep import SweepResult

    return SweepResult("a", 2048, grid, {(lr, ()): 1.0 for lr in grid}, (best, ()), 0, False, False)


def test_the_lr_check_confirms_flags_or_waits(three_splits):
    from angpt.study.store import RunSpec
    from angpt.study.sweep import check_specs, lr_check

    plan = make_plan(
        three_splits, **{**TINY, "tuning_seed": 1000, "budgets": [2048, 8192]}, arms=["gpt+"], seeds=[0],
        lr_grid=[0.5, 1, 2],
    )  # fmt: skip
    grid = plan.initial_grid(plan.arms[0])
    sweeps = {"gpt+": {2048: _sweep(grid, grid[1])}}
    specs = check_specs(plan, sweeps)
    assert [(s.budget, s.seed, s.lr) for s in specs] == [(8192, 1000, lr) for lr in grid]  # chosen and neighbours

    def known(losses):
        return lambda spec: (
            {"status": "finished", "val_loss": losses[spec.lr]} if spec.lr in losses and spec.budget == 8192 else None
        )

    ok = lr_check(plan, sweeps, "gpt+", known({grid[0]: 2.1, grid[1]: 2.0, grid[2]: 2.05}))
    assert ok["status"] == "confirmed" and ok["best_lr"] == grid[1] and ok["gap"] is None
    bad = lr_check(plan, sweeps, "gpt+", known({grid[0]: 2.1, grid[1]: 2.0, grid[2]: 1.9}))
    assert bad["status"] == "flagged" and bad["best_lr"] == grid[2] and bad["gap"] == pytest.approx(0.1)
    assert lr_check(plan, sweeps, "gpt+", known({grid[0]: 2.1, grid[1]: 2.0}))["status"] == "pending"
    # A chosen LR at the grid's edge is checked against the next grid step beyond it.
    edge = check_specs(plan, {"gpt+": {2048: _sweep(grid, grid[-1])}})
    assert [s.lr for s in edge] == [grid[1], grid[2], pytest.approx(grid[2] * 2)]
    low = check_specs(plan, {"gpt+": {2048: _sweep(grid, grid[0])}})
    assert [s.lr for s in low] == [pytest.approx(grid[0] / 2), grid[0], grid[1]]
    # Plans without a tuning seed (the older design, scaling ladders) and one-budget plans check nothing.
    legacy = make_plan(three_splits, **{**TINY, "tuning_seed": None, "budgets": [2048, 8192]}, arms=["gpt+"], seeds=[0])
    one = make_plan(three_splits, **{**TINY, "tuning_seed": 1000, "budgets": [2048]}, arms=["gpt+"], seeds=[0])
    for p in (legacy, one):
        assert check_specs(p, {"gpt+": {2048: _sweep(grid, grid[1])}}) == []
    assert RunSpec("gpt+", 8192, 1000, grid[1]) in specs


def test_a_comparison_checks_the_chosen_lr_at_its_largest_budget(three_splits, tmp_path):
    from angpt.study import rewrite_report

    plan = make_plan(
        three_splits, **{**TINY, "tuning_seed": 1000, "budgets": [2048, 4096]}, arms=["gpt+"], seeds=[0],
        lr_grid=[1, 2], max_extensions=0,
    )  # fmt: skip
    report = run_comparison(plan, tmp_path / "cmp", jobs=1, threads=1, progress=False)
    chk = report.data["arms"]["gpt+"]["lr_check"]
    checked = sorted(s.lr for s in report.trained if s.budget == 4096 and s.seed == 1000)
    assert checked == sorted(r["lr"] for r in chk["rows"]) and len(checked) == 3
    assert chk["status"] in ("confirmed", "flagged") and all(r["val_loss"] is not None for r in chk["rows"])
    losses = {r["lr"]: r["val_loss"] for r in chk["rows"]}
    assert (chk["status"] == "confirmed") == (min(losses, key=losses.get) == chk["chosen_lr"])
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "## LR check at 4Ki (seed 1000)" in md
    again = rewrite_report(tmp_path / "cmp")  # from the store alone, as --report-only and partial reports do
    assert again.data["arms"]["gpt+"]["lr_check"] == chk and again.data["partial"] is None


def test_a_flagged_or_pending_lr_check_is_a_warning(three_splits):
    from angpt.study.comparison.analyse import warnings

    plan = make_plan(
        three_splits, **{**TINY, "tuning_seed": 1000, "budgets": [2048, 8192]}, arms=["gpt+"], seeds=[0, 1, 2]
    )
    chk = {"budget": 8192, "seed": 1000, "chosen_lr": 0.004, "best_lr": 0.002, "gap": 0.154, "status": "flagged"}
    entry = {"tune": {}, "sweeps": [], "budgets": [], "stability": {"unstable": False}, "lr_check": chk}
    (line,) = warnings(plan, {"gpt+": entry}, None)
    assert line.startswith("gpt+: its LR 0.004, chosen at 2Ki, is not the best") and "(best: 0.002, 0.1540 nats" in line
    entry["lr_check"] = {**chk, "status": "pending", "best_lr": None, "gap": None}
    assert warnings(plan, {"gpt+": entry}, None) == ["gpt+: the LR check at 8Ki has not finished."]
    entry["lr_check"] = {**chk, "status": "confirmed", "gap": None}
    assert warnings(plan, {"gpt+": entry}, None) == []


def test_a_report_with_nothing_tuned_says_nothing_was_selected(three_splits):
    """`make demo` trains each arm once at its recipe's rate (--lr-grid 1 --tuning-seed none): its report must not say
    that a learning rate was chosen on a seed; with a grid, it says how."""
    from angpt.study.comparison.render import _selection_line

    fixed = make_plan(three_splits, **{**TINY, "tuning_seed": None, "lr_grid": [1]}, arms=["gpt+", "angpt"], seeds=[0])
    assert _selection_line(fixed, {}).startswith("- selection: none (one learning rate per arm")
    swept = make_plan(three_splits, **{**TINY, "tuning_seed": None, "lr_grid": [0.5, 1]}, arms=["gpt+"], seeds=[0])
    assert "learning rates chosen on seed 0" in _selection_line(swept, {})
    tuned = make_plan(
        three_splits, **{**TINY, "tuning_seed": None, "lr_grid": [1]}, arms=["gpt+[tune.weight_decay=0:0.1]"]
    )
    assert "chosen on seed" in _selection_line(tuned, {})


class _Records:
    """A stand-in for the run store: every run is finished, with the losses `losses(spec)` gives."""

    def __init__(self, losses):
        self.losses = losses

    def run(self, specs):
        pass

    def known(self, spec):
        val, test = self.losses(spec)
        return {"status": "finished", "val_loss": val, "test_loss": test}


def test_the_sweep_selects_by_validation_loss_never_the_test_loss(three_splits):
    """Selection on the data that measures would come back silently if the sweep read the test loss: here the two
    disagree on every point, and the chosen LR and the rows must follow validation."""
    from angpt.study.sweep import run_sweeps

    plan = make_plan(three_splits, **{**TINY, "tuning_seed": 1000}, arms=["gpt+"], seeds=[0], lr_grid=[0.5, 1, 2])
    grid = plan.initial_grid(plan.arm("gpt+"))
    val = dict(zip(grid, (3.0, 2.9, 3.1)))  # validation prefers the middle LR
    test = dict(zip(grid, (2.5, 3.3, 3.4)))  # test would prefer the lowest
    sw = run_sweeps(plan, _Records(lambda s: (val[s.lr], test[s.lr])), plan.sweep_budget)["gpt+"]
    assert sw.best_lr == grid[1] and not sw.at_edge
    assert {lr: loss for (lr, _), loss in sw.losses.items()} == val
    assert [r["val_loss"] for r in sw.to_dict()["rows"]] == [3.0, 2.9, 3.1]


def test_the_horizon_is_the_largest_budgets_not_the_sweeps(three_splits):
    """docs/protocol.md#horizon judges the largest budget; the sweep runs at the smallest."""
    from angpt.study.comparison.horizon import MIN_STEPS, horizon

    plan = make_plan(three_splits, **{**TINY, "budgets": [512, 1024 * 512]}, arms=["gpt+"], seeds=[0])
    hz = horizon(plan).arms["gpt+"]
    assert plan.sweep_budget == 512 and hz.steps == 1024 == plan.steps(plan.budgets[-1]) and hz.tokens == 1024 * 512
    assert hz.steps >= MIN_STEPS  # the largest budget's 1,024 steps meet the rule; the sweep's 1 step would not
    assert "optimizer steps (<" not in hz.shortfall() and "tokens per non-embedding parameter" in hz.shortfall()
