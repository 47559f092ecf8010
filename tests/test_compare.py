"""`angpt compare`: speedup and Welch arithmetic, a whole tiny comparison, resume, parallel jobs, bad input."""

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from angpt.errors import ConfigError, UserError
from angpt.stats import betainc, t_sf_two_sided
from angpt.study import (
    make_plan,
    parse_arm,
    parse_tokens,
    run_comparison,
    speedups,
    split_arms,
    tokens_to_reach,
    welch_ttest,
)
from angpt.study.comparison.cli import add_compare_parser
from angpt.study.store import read_rows
from angpt.study.sweep import main_specs, run_plan, run_sweeps

# Two budgets of 4 and 8 steps of 512 tokens (8 sequences of the tiny preset's 64 tokens).
TINY = dict(
    budgets=[2048, 4096],
    preset="tiny",
    batch_tokens=512,
    eval_batches=2,
    eval_points=2,
    dtype="fp32",  # forced: `auto` would pick bf16 on some machines and fp32 on others
    tuning_seed=None,  # the run mechanics below count runs as the first seed's sweep doubling as its main run
)


def tiny_plan(data_dir, **kw):
    args = {**TINY, "arms": ["gpt+", "angpt"], "seeds": [0, 1], "lr_grid": [1, 2], "max_extensions": 1, **kw}
    return make_plan(data_dir, **args)


@pytest.fixture(scope="module")
def compared(data_dir, tmp_path_factory):
    """One whole comparison, shared by the tests that inspect or re-run it."""
    out = tmp_path_factory.mktemp("report") / "rep"
    plan = tiny_plan(data_dir)
    report = run_comparison(plan, out, threads=1, progress=False, command="angpt compare (test)")
    return plan, out, report


def cli(*args: str) -> int:
    """`angpt compare ARGS` through angpt.cli.main."""
    from angpt import cli as angpt_cli

    return angpt_cli.main(["compare", *map(str, args)])


def snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------------ arithmetic
def test_speedup_is_two_when_the_arm_matches_the_baseline_at_twice_the_budget():
    budgets = [1000, 2000, 4000, 8000]
    base = [5.0 - 0.5 * math.log2(d / 1000) for d in budgets]  # linear in log tokens
    cand = [5.0 - 0.5 * math.log2(2 * d / 1000) for d in budgets]  # L_cand(D) = L_base(2D)
    rows = speedups(budgets, base, cand)
    assert [r.reach.status for r in rows] == ["below_range", "exact", "exact", "exact"]
    assert [r.speedup for r in rows[1:]] == pytest.approx([2.0, 2.0, 2.0])
    # Below range: the arm beats the baseline's smallest-budget loss at its own smallest budget, so the
    # speedup there is only known to be at least D_0 / D_0 -- reported as a bound, not a value.
    assert rows[0].reach.tokens == 1000 and rows[0].speedup == 1.0


def test_interpolation_is_linear_in_log_tokens():
    # Halfway in loss between 1000 and 4000 tokens is the geometric mean 2000, not the arithmetic 2500.
    reach = tokens_to_reach([1000, 4000], [4.0, 3.0], 3.5)
    assert reach.status == "exact" and reach.tokens == pytest.approx(2000.0)
    assert tokens_to_reach([1000, 4000], [4.0, 3.0], 3.0).tokens == pytest.approx(4000.0)
    # A noisy curve: the first crossing from above counts.
    assert tokens_to_reach([1, 2, 4, 8], [5.0, 3.9, 4.1, 3.0], 4.0).tokens == pytest.approx(2 ** (1 / 1.1))


def test_an_arm_that_never_reaches_the_baseline_is_not_extrapolated_silently():
    budgets = [1000, 2000, 4000]
    base = [4.0, 3.5, 3.0]
    worse = [4.5, 4.2, 3.9]
    rows = speedups(budgets, base, worse)
    assert rows[0].reach.status == "exact"  # 4.0 lies between 4.2 and 3.9
    assert [r.reach.status for r in rows[1:]] == ["not_reached", "not_reached"]
    assert all(r.reach.tokens == 4000 for r in rows[1:])  # a bound: more than the largest budget
    assert rows[2].speedup == pytest.approx(1.0)  # "< 1.0x"
    # Only on request, flagged as such: log-linear from the last segment (slope -0.3 per doubling).
    ext = tokens_to_reach(budgets, worse, 3.0, extrapolate=True)
    assert ext.status == "extrapolated" and ext.tokens == pytest.approx(4000 * 2**3)
    # A diverged run (infinite loss) never reaches anything.
    assert tokens_to_reach(budgets, [math.inf] * 3, 3.0).status == "not_reached"


def test_report_speedup_is_the_mean_over_budgets_then_over_seeds(data_dir):
    """docs/protocol.md's speedup on synthetic final losses at 3 budgets x 3 seeds, through the report's analysis.

    Budgets 2048, 4096, 8192 are 0, 1, 2 doublings; where a candidate reaches target L on the segment from (j, c_j)
    to (j + 1, c_j+1) (log2 tokens, loss), it needs x = j + (c_j - L) / (c_j - c_j+1) doublings, and speedup_i =
    D_i / D'_i = 2^(i - x). Each seed averages its exact speedups over i; the report gives the mean and the
    sample std of those three means. Bounds (below range, not reached) stay out of every mean.
    """
    from angpt.study.comparison.analyse import analyse, verdict
    from angpt.study.comparison.collect import ArmRuns
    from angpt.study.comparison.render import render_markdown
    from angpt.study.sweep import SweepResult

    plan = make_plan(data_dir, **{**TINY, "budgets": [2048, 4096, 8192]}, arms=["gpt+", "angpt"], seeds=[0, 1, 2])
    base_losses = {0: [3.5, 2.75, 2.5], 1: [3.3, 2.3, 2.45], 2: [3.7, 2.75, 1.65]}  # seed means 3.5, 2.6, 2.2
    cand_losses = {0: [4.0, 3.0, 2.0], 1: [4.5, 3.0, 2.4], 2: [3.5, 3.0, 1.6]}  # seed means 4, 3, 2
    runs = {}
    for label, losses in (("gpt+", base_losses), ("angpt", cand_losses)):
        final = {b: {s: losses[s][i] for s in plan.seeds} for i, b in enumerate(plan.budgets)}
        runs[label] = ArmRuns(label, lr=1e-3, final=final, bpb={b: {} for b in plan.budgets})
    b0 = plan.sweep_budget
    sw = {a: SweepResult(a, b0, [1e-3], {(1e-3, ()): 3.0}, (1e-3, ()), 0, False, True) for a in ("gpt+", "angpt")}
    sweeps = {a: {b0: s} for a, s in sw.items()}
    arms = analyse(plan, runs, sweeps)
    sp = arms["angpt"]["speedup"]

    expected = {
        # x = 0.5, 1.25, 1.5
        "0": [("exact", 2**-0.5), ("exact", 2**-0.25), ("exact", 2**0.5)],
        # x = 1.2 / 1.5 = 0.8; 2.3 is below the candidate's best loss 2.4 (a bound: speedup < 4096 / 8192);
        # the noisy baseline's 2.45 is reached at x = 1 + 0.55 / 0.6 = 23 / 12
        "1": [("exact", 2**-0.8), ("not_reached", 0.5), ("exact", 2 ** (1 / 12))],
        # 3.5 <= 3.7 at the smallest budget (a bound: speedup >= 2048 / 2048); x = 1 + 0.25 / 1.4 = 1 + 5 / 28;
        # x = 1 + 1.35 / 1.4 = 1 + 27 / 28
        "2": [("below_range", 1.0), ("exact", 2 ** (-5 / 28)), ("exact", 2 ** (1 / 28))],
    }
    seed_means = []
    for seed, rows in expected.items():
        got = sp["per_seed"][seed]["per_budget"]
        assert [r["status"] for r in got] == [status for status, _ in rows], seed
        assert [r["speedup"] for r in got] == pytest.approx([v for _, v in rows], rel=1e-12), seed
        exact = [v for status, v in rows if status == "exact"]
        seed_means.append(sum(exact) / len(exact))
        assert sp["per_seed"][seed]["mean"] == pytest.approx(seed_means[-1], rel=1e-12)
        assert sp["per_seed"][seed]["n_used"] == len(exact)
    assert seed_means == pytest.approx([0.987406, 0.816906, 0.954321], abs=1e-6)  # worked out by hand
    m = sum(seed_means) / 3
    assert sp["mean"] == pytest.approx(m, rel=1e-12) and sp["mean"] == pytest.approx(0.919544, abs=1e-6)
    assert sp["std"] == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in seed_means) / 2), rel=1e-12)
    assert sp["std"] == pytest.approx(0.090413, abs=1e-6)
    assert (sp["n_seeds"], sp["n_comparisons"], sp["n_exact"]) == (3, 9, 7)
    assert (sp["n_below_range"], sp["lower_bound"], sp["n_not_reached"], sp["upper_bound"]) == (1, 1.0, 1, 0.5)
    # The same measure on the seed-mean curves: the candidate is 4, 3, 2 (one loss unit per doubling), so
    # L = 3.5, 2.6, 2.2 is reached at x = 4 - L and speedup_i = 2^(i + L - 4).
    om = sp["of_seed_means"]
    assert [r["status"] for r in om["per_budget"]] == ["exact"] * 3
    assert [r["speedup"] for r in om["per_budget"]] == pytest.approx([2**-0.5, 2**-0.4, 2**0.2], rel=1e-9)
    assert om["mean"] == pytest.approx((2**-0.5 + 2**-0.4 + 2**0.2) / 3, rel=1e-9)

    line = verdict(plan, "angpt", arms["angpt"])
    # It leads with the paired difference at 8Ki: per-seed differences -0.5, -0.05, -0.05 (mean -0.2, sd
    # sqrt(0.0675), se 0.15, t = -4/3 on 2 df: p = 1 - |t| / sqrt(2 + t^2) = 0.314; 95% CI -0.2 +- 4.302653 x 0.15).
    assert line.startswith(
        "angpt vs gpt+ at 8Ki tokens: final loss 0.2000 lower (9.09%), 95% CI [-0.8454, +0.4454], paired p=0.31"
    )
    # A point the arm never reaches (seed 1 at 4Ki) would inflate the mean if left out: no speedup is claimed.
    assert sp["established"] is False and "tokens" not in line.split("; ", 1)[1]
    assert "no speedup can be claimed: 1 of 9 points never reach gpt+'s loss (speedup < 0.50x there)" in line
    report = {
        "arms": arms,
        "machine": machine_stub(),
        "dataset": {},
        "command": "test",
        "jobs": 1,
        "threads": 1,
        "verdicts": [line],
        "warnings": [],
    }
    md = render_markdown(plan, report, {})
    # with the t interval of the three seed means: 0.919544 +- 4.302653 x 0.090413 / sqrt(3) = [0.69, 1.14]
    assert sp["ci95"] == pytest.approx([0.694945, 1.144143], abs=1e-5)
    assert "measured points alone: 0.92 ± 0.09x, 95% CI [0.69, 1.14] | 7/9 |" in md and "| 0.87x |" in md


def machine_stub():
    keys = ("date", "angpt_version", "git_revision", "torch_version", "python_version", "hostname", "platform")
    return {**dict.fromkeys(keys, "-"), "cpu": "-", "cpu_cores": 1, "gpu": None}


def test_welch_t_test_matches_known_values():
    # Wikipedia, "Welch's t-test", example 1: t = -2.46, df = 25.0, p = 0.021 (scipy: -2.45536, 24.9885, 0.021378).
    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    w = welch_ttest(a, b)
    assert w.t == pytest.approx(-2.455356398286006, rel=1e-9)
    assert w.df == pytest.approx(24.988529290231416, rel=1e-9)
    assert w.p == pytest.approx(0.021378001462866992, rel=1e-7)
    # Unequal sizes and variances (scipy.stats.ttest_ind(equal_var=False)).
    w = welch_ttest([3.10, 3.12, 3.09], [3.05, 3.04, 3.07, 3.06])
    assert (w.t, w.df, w.p) == pytest.approx((4.42245853964552, 3.9593147751605673, 0.011756015260927118), rel=1e-7)
    # Closed forms: df=1 is Cauchy, df=2 gives p = 1 - t / sqrt(2 + t^2); I_x(1/2, 1/2) = 2/pi asin(sqrt x).
    assert t_sf_two_sided(1.0, 1) == pytest.approx(0.5, rel=1e-12)
    assert t_sf_two_sided(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), rel=1e-12)
    assert betainc(0.5, 0.5, 0.2) == pytest.approx(2 / math.pi * math.asin(math.sqrt(0.2)), rel=1e-12)
    assert betainc(10, 3, 0.8) == pytest.approx(0.5583457484800002, rel=1e-10)
    assert t_sf_two_sided(1.3, 1e5) == pytest.approx(0.19360396554318013, rel=1e-7)
    # Undefined: one value per sample, or no variance at all.
    assert welch_ttest([1.0], [2.0, 3.0]) is None
    assert welch_ttest([1.0, 1.0], [2.0, 2.0]) is None


def test_arm_and_token_syntax():
    assert parse_tokens("4096") == 4096 and parse_tokens("1M") == 10**6 and parse_tokens("1Mi") == 2**20
    assert parse_tokens("1.5k") == 1500 and parse_tokens("64Ki") == 65536
    assert split_arms("gpt+,angpt[nu_att=sqrt_pos,alpha_init=0.01],x=ngpt") == [
        "gpt+",
        "angpt[nu_att=sqrt_pos,alpha_init=0.01]",
        "x=ngpt",
    ]
    arm = parse_arm("sqrtpos=angpt[nu_att=sqrt_pos,alpha_init=0.01,train.grad_clip=0.5]")
    assert (arm.label, arm.arch, arm.model, arm.train) == (
        "sqrtpos",
        "angpt",
        {"nu_att": "sqrt_pos", "alpha_init": 0.01},
        {"grad_clip": 0.5},
    )
    assert parse_arm("ngpt_bounded").model == {"weight_constraint": "bounded"}
    assert parse_arm("dyt").arch == "gpt+" and parse_arm("dyt").model == {"norm": "dyt"}
    assert parse_arm("angpt[nu_att=sqrt_pos]").slug == "angpt__nu_att-sqrt_pos"
    for bad in ("foo", "angpt[bogus=1]", "angpt[train.batch_tokens=1024]", "angpt[nu_att]", "1M"):
        with pytest.raises(UserError):
            parse_arm(bad)
    for bad in ("", "1.5", "-3", "2X", "0"):
        with pytest.raises(UserError):
            parse_tokens(bad)


def test_sweep_extends_an_edge_optimum_and_records_it(data_dir):
    class FakeRunner:  # losses from a formula instead of training: a parabola in log2(lr), minimum at 4e-3
        def __init__(self, loss):
            self.loss, self.ran = loss, []

        def run(self, specs):
            self.ran += [s for s in specs if s not in self.ran]

        def known(self, spec):
            loss = self.loss(spec.lr)
            return {"status": "finished" if math.isfinite(loss) else "diverged", "val_loss": loss}

    parabola = lambda lr: 3.0 + math.log2(lr / 4e-3) ** 2  # noqa: E731
    plan = make_plan(data_dir, **TINY, arms=["angpt"], lr={"angpt": 1e-3}, lr_grid=[1, 2], max_extensions=3)
    sw = run_sweeps(plan, FakeRunner(parabola))["angpt"]
    assert sw.grid == [1e-3, 2e-3, 4e-3, 8e-3] and sw.best_lr == 4e-3 and sw.extensions == 2 and not sw.at_edge
    plan = make_plan(data_dir, **TINY, arms=["angpt"], lr={"angpt": 1e-3}, lr_grid=[1, 2], max_extensions=1)
    sw = run_sweeps(plan, FakeRunner(parabola))["angpt"]
    assert sw.grid == [1e-3, 2e-3, 4e-3] and sw.best_lr == 4e-3 and sw.at_edge  # unfinished: reported as such
    # Every LR diverging moves the grid down; the best is the highest LR that trains.
    plan = make_plan(data_dir, **TINY, arms=["angpt"], lr={"angpt": 1e-2}, lr_grid=[1, 2], max_extensions=3)
    runner = FakeRunner(lambda lr: math.inf if lr > 3e-3 else 3.0 - lr)
    sw = run_sweeps(plan, runner)["angpt"]
    assert sw.grid == [1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2] and sw.extensions == 3
    assert sw.best_lr == 2.5e-3 and sw.losses[(1e-2, ())] is None and not sw.at_edge
    assert main_specs(plan, {"angpt": {plan.sweep_budget: sw}})[0].lr == 2.5e-3


# ---------------------------------------------------------------------------------- whole comparisons
def test_whole_comparison_writes_every_output(compared):
    plan, out, report = compared
    for name in (
        "plan.json",
        "report.md",
        "report.json",
        "val_loss_vs_tokens.png",
        "final_loss_vs_budget.png",
        "speedup.png",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 100, name
    # the report draws every run's curve; a run of the study draws none of its own (0.3 s a run on a CPU)
    assert list(out.glob("runs/*/*/*/*/metrics.jsonl")) and not list(out.glob("runs/**/loss_curve.png"))
    data = json.loads((out / "report.json").read_text())
    sweep = {a: data["arms"][a]["sweep"] for a in ("gpt+", "angpt")}
    for arm, sw in sweep.items():
        # A two-point grid always has its best at an edge: one extension (max_extensions=1) was run.
        assert len(sw["rows"]) == 3 and sw["extensions"] == 1, arm
        assert sw["best_lr"] in [r["lr"] for r in sw["rows"]]
    angpt = data["arms"]["angpt"]
    assert [r["budget"] for r in angpt["budgets"]] == [2048, 4096]
    # the keys name the split the losses are on (this dataset has no test split: validation)
    split = data["plan"]["report_split"]
    assert all(r["n"] == 2 and r[f"{split}_loss_mean"] > 0 and r[f"{split}_bpb_mean"] > 0 for r in angpt["budgets"])
    other = {"val": "test", "test": "val"}[split]
    assert not any(f"{other}_loss_mean" in r or f"{other}_loss" in r for r in angpt["budgets"])
    assert all("rel_improvement_pct" in r and r["welch"] is not None for r in angpt["budgets"])
    sp = angpt["speedup"]
    assert sp["n_comparisons"] == 4 and set(sp["per_seed"]) == {"0", "1"}
    assert angpt["step_time_ratio"] > 0 and data["arms"]["gpt+"]["step_time_ratio"] == pytest.approx(1.0)
    # Every arm x budget x seed ran at the arm's best LR; the sweep's own run serves the first budget and seed.
    for arm in plan.arms:
        lr = sweep[arm.label]["best_lr"]
        for b in plan.budgets:
            for s in plan.seeds:
                rows = read_rows(plan.run_dir(out, arm, b, s, lr))
                assert [r["step"] for r in rows] == list(range(1, b // 512 + 1))
                assert "val_loss" in rows[-1]
    # Same tokens in the same order for every arm: dataset, batch, sequence, seed and evaluation are shared.
    shared = ("batch_tokens", "seq_len", "micro_batch", "seed", "max_steps", "eval_batches", "eval_every", "dtype")
    for b in plan.budgets:
        for s in plan.seeds:
            cfgs = [
                json.loads((plan.run_dir(out, a, b, s, sweep[a.label]["best_lr"]) / "config.json").read_text())["run"]
                for a in plan.arms
            ]
            assert len({(c["data"], *(c["train"][k] for k in shared), c["train"]["stop_at"]) for c in cfgs}) == 1
    md = (out / "report.md").read_text()
    assert "angpt compare (test)" in md and "## Verdict" in md and "p=" in md and "Welch" in md
    assert report.verdicts and report.verdicts[0].startswith("smoke test: angpt vs gpt+ at 4Ki tokens: final loss")
    assert len(report.trained) == 2 * 3 + 2 * 3  # 3 sweep runs + 3 more main runs per arm


def test_rerun_skips_finished_runs_and_finishes_unrecorded_ones(compared, monkeypatch, tmp_path):
    """On a copy of the shared comparison: the tests that read it see it as it was made, in any order (issue 55)."""
    import shutil

    plan, shared, _ = compared
    out = shutil.copytree(shared, tmp_path / "rep")
    from angpt.train import loop

    calls, real = [], loop.train

    def counting_train(cfg, **kw):
        calls.append(cfg.out)
        return real(cfg, **kw)

    # The runner looks train up in angpt.train.loop at call time, so this counts every run it trains.
    monkeypatch.setattr(loop, "train", counting_train)
    metrics_before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")}
    report = run_comparison(plan, out, threads=1, progress=False)
    assert calls == [] and report.trained == []
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")} == metrics_before

    # A run that trained to the end but whose result was never recorded (a crash at the last moment) is
    # finished by resuming its final checkpoint: train() is called once, and no step is trained again.
    victim = plan.run_dir(out, plan.arms[0], 2048, 0, 0.002) / "result.json"
    before = json.loads(victim.read_text())
    rows_before = (victim.parent / "metrics.jsonl").read_text()
    victim.unlink()
    report = run_comparison(plan, out, threads=1, progress=False)
    assert len(calls) == 1 and len(report.trained) == 1
    assert (victim.parent / "metrics.jsonl").read_text() == rows_before
    assert json.loads(victim.read_text())["val_loss"] == before["val_loss"]


def test_interrupted_run_is_resumed(data_dir, tmp_path, monkeypatch, compared):
    from angpt.train import loop

    plan = make_plan(data_dir, **{**TINY, "budgets": [2048]}, arms=["gpt+"], seeds=[0], lr_grid=[1])
    real = loop.train

    def interrupted_once(cfg, **kw):
        cfg.train.stop_at = 2  # as if a signal arrived after step 2: a checkpoint is saved, status interrupted
        return real(cfg, **kw)

    monkeypatch.setattr(loop, "train", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        run_comparison(plan, tmp_path / "r", threads=1, progress=False)
    run_dir = plan.run_dir(tmp_path / "r", plan.arms[0], 2048, 0, 0.002)
    assert not (run_dir / "result.json").exists() and (run_dir / "checkpoints" / "step_000002").is_dir()
    monkeypatch.setattr(loop, "train", real)
    report = run_comparison(plan, tmp_path / "r", threads=1, progress=False)
    assert [r["step"] for r in read_rows(run_dir)] == [1, 2, 3, 4]
    # The resumed run ends where an uninterrupted one does (the shared comparison ran the same config).
    big_plan, big_out, _ = compared
    same = json.loads((big_plan.run_dir(big_out, big_plan.arms[0], 2048, 0, 0.002) / "result.json").read_text())
    split = plan.report_split
    assert report.arms["gpt+"]["budgets"][0][f"{split}_loss"]["0"] == pytest.approx(same[f"{split}_loss"], rel=1e-5)


def test_parallel_jobs_give_the_same_runs(data_dir, tmp_path, compared):
    plan = make_plan(data_dir, **{**TINY, "budgets": [2048]}, arms=["gpt+"], seeds=[0, 1], lr_grid=[1])
    report = run_comparison(plan, tmp_path / "par", jobs=2, threads=1, progress=False)
    assert len(report.trained) == 2 and (tmp_path / "par" / "report.md").is_file()
    big_plan, big_out, _ = compared
    same = json.loads((big_plan.run_dir(big_out, big_plan.arms[0], 2048, 0, 0.002) / "result.json").read_text())
    split = plan.report_split
    assert report.arms["gpt+"]["budgets"][0][f"{split}_loss"]["0"] == pytest.approx(same[f"{split}_loss"], rel=1e-5)


def test_dry_run_plans_and_estimates_without_writing(data_dir, tmp_path, capsys):
    out = tmp_path / "dry"
    common = ["--data", data_dir, "--out", out, "--seeds", "0,1", "--preset", "tiny", "--batch-tokens", "512"]
    common += ["--lr-grid", "1,2", "--eval-batches", "2", "--threads", "1", "--dry-run"]
    rc = cli(*common, "--arms", "gpt+,angpt[nu_att=sqrt_pos]", "--budgets", "2048,4096")
    text = capsys.readouterr().out
    assert rc == 0 and not out.exists()
    assert "angpt[nu_att=sqrt_pos]" in text and "estimated time" in text and "s/step" in text
    assert "4 steps" in text and "8 steps" in text
    # Sweeps on the tuning seed (1000): no reported seed reuses a sweep run. In the older design (--tuning-seed
    # none) the first seed's run at the chosen LR is the sweep's best run.
    seeds_lines = [line.split(maxsplit=1)[1] for line in text.splitlines() if "seed(s) at its chosen LR" in line]
    assert seeds_lines == ["2 seed(s) at its chosen LR"] * 4, seeds_lines
    assert "sweep lr" in text and "(seed 1000)" in text
    rc = cli(*common, "--arms", "gpt+", "--budgets", "2048", "--tuning-seed", "none")
    text = capsys.readouterr().out
    assert rc == 0 and "(seed 0)" in text and "2 seed(s) at its chosen LR (one is the sweep's best run)" in text


def test_a_comparison_run_from_main_records_mains_argv(data_dir, tmp_path, monkeypatch):
    """angpt.cli.main(["compare", ...]) from Python: the report's command and each run's provenance.json say
    `angpt compare ...` as given, not the calling process's sys.argv."""
    from angpt import cli as angpt_cli
    from angpt.study.comparison import report

    monkeypatch.setattr(report, "write_plots", lambda *a, **k: ({}, []))
    monkeypatch.setattr(sys, "argv", ["/somewhere/else.py", "--not-these"])
    out = tmp_path / "cmp"
    argv = ["compare", "--data", str(data_dir), "--out", str(out), "--arms", "gpt+", "--budgets", "512"]
    argv += ["--preset", "tiny", "--batch-tokens", "512", "--lr-grid", "1", "--eval-batches", "1", "--threads", "1"]
    argv += ["--seeds", "0", "--quiet"]
    assert angpt_cli.main(argv) == 0
    assert json.loads((out / "report.json").read_text())["command"] == shlex.join(["angpt", *argv])
    provs = list(out.glob("runs/**/provenance.json"))
    assert len(provs) == 2  # the sweep's run on the tuning seed, and seed 0's
    assert all(json.loads(prov.read_text())["command"] == ["angpt", *argv] for prov in provs)


# -------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_and_writes_nothing(data_dir, tmp_path, capsys, compared):
    common = ["--data", data_dir, "--preset", "tiny", "--batch-tokens", "512", "--threads", "1"]
    cases = [
        (["--arms", "gpt+,bogus", "--budgets", "2048"], "unknown architecture or variant 'bogus'"),
        (["--arms", "gpt+,angpt", "--budgets", ""], "no token budgets"),
        (["--arms", "gpt+,angpt", "--budgets", "1000"], "not a whole number of steps"),
        (["--arms", "gpt+,angpt", "--budgets", "2048", "--baseline", "ngpt"], "baseline 'ngpt'"),
        # The trainer pads the vocabulary to the dataset's (257 byte ids) unless it is set: set too small, refused.
        (["--arms", "gpt+,angpt", "--budgets", "2048", "--set", "model.vocab_size=100"], "vocab_size=100"),
        (["--arms", "gpt+", "--budgets", "2048", "--set", "train.seed=3"], "--seeds"),
        (["--arms", "gpt+,angpt", "--budgets", "2048", "--stat", "bayes"], "unknown statistic 'bayes'"),
        (["--arms", "gpt+", "--budgets", "2048", "--jobs", "0"], "--jobs '0' must be a positive integer or 'auto'"),
        (["--arms", "gpt+", "--budgets", "2048", "--jobs", "auto", "--threads", "2"], "--jobs auto chooses"),
        (["--arms", "gpt+", "--budgets", "2048", "--retune", "angpt"], "--retune 'angpt' is not one of the arms"),
        (["--arms", "gpt+[tune.lr=1:2]", "--budgets", "2048"], "tune.lr cannot be tuned"),
        (["--arms", "gpt+[tune.warmup=0:1.5]", "--budgets", "2048"], "fractions of the run's steps"),
        (["--arms", "gpt+[tune.weight_decay=0:x]", "--budgets", "2048"], "numbers separated by ':'"),
        (["--arms", "gpt+[train.weight_decay=0,tune.weight_decay=0:0.1]", "--budgets", "2048"], "both set"),
    ]
    for i, (args, needle) in enumerate(cases):
        out = tmp_path / f"bad{i}"
        assert cli(*common, "--out", out, *args) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (args, err)
        assert not out.exists()
    with pytest.raises(ConfigError):
        tiny_plan(data_dir, settings={"model.vocab_size": 100})
    with pytest.raises(UserError, match="no arms"):
        tiny_plan(data_dir, arms=[])

    # A report directory holding another plan: refused, untouched.
    plan, out, _ = compared
    before = snapshot(out)
    for other in (tiny_plan(data_dir, eval_batches=3), tiny_plan(data_dir, arms=["gpt+", "angpt=angpt[nu_att=none]"])):
        with pytest.raises(UserError, match="holds a different comparison"):
            run_comparison(other, out, threads=1, progress=False)
    args = ["--arms", "gpt+,angpt", "--budgets", "2048", "--seeds", "0", "--dtype", "fp32", "--eval-batches", "3"]
    assert cli(*common, "--out", out, *args) == 2  # budgets and seeds may change; the evaluation may not
    assert "eval_batches: 2 there, 3 here" in capsys.readouterr().err
    assert snapshot(out) == before
    # A comparison still running in the same report directory (its pid in .lock) is not disturbed.
    (out / ".lock").write_text(str(os.getppid()))
    with pytest.raises(UserError, match="another angpt compare"):
        run_comparison(plan, out, threads=1, progress=False)
    (out / ".lock").unlink()
    assert snapshot(out) == before
    stranger = tmp_path / "not_a_report"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not an angpt compare report"):
        run_comparison(plan, stranger, threads=1, progress=False)
    assert os.listdir(stranger) == ["notes.txt"]


def test_report_records_the_dtype_used_not_auto(monkeypatch):
    from angpt.study.machine import machine_info
    from angpt.train import hardware

    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 2.0)
    assert machine_info("auto", "cpu")["dtype"] == "bf16"
    assert machine_info("auto", "cpu")["cpu_bf16_matmul_speedup"] == 2.0  # the measurement behind the choice
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.6)
    assert machine_info("auto", "cpu")["dtype"] == "fp32"
    assert machine_info("bf16", "cpu")["dtype"] == "bf16"


# ------------------------------------------------------------------------------- order, signals, extension
def test_runs_go_budget_by_budget(data_dir):
    """All arms (with their sweeps) at budget 1, then budget 2, ...: a comparison cut short holds every arm at
    each budget it finished. A tuned arm is swept at every budget, the others at the smallest only."""

    class Recorder:  # losses from a formula instead of training; remembers the order runs were asked for
        def __init__(self):
            self.order = []

        def run(self, specs):
            self.order += [s for s in specs if s not in self.order]

        def known(self, spec):
            return {"status": "finished", "val_loss": 3.0 + abs(spec.lr - 4e-3) + sum(v for _, v in spec.setting)}

    arms = ["gpt+", "angpt", "r=gpt+[tune.weight_decay=0:0.1]"]
    kw = {**TINY, "budgets": [2048, 4096, 8192], "lr_grid": [1, 2], "max_extensions": 0}
    plan = make_plan(data_dir, **kw, arms=arms, seeds=[0, 1, 2])
    rec = Recorder()
    sweeps = run_plan(plan, rec)
    assert [s.budget for s in rec.order] == sorted(s.budget for s in rec.order)
    main = main_specs(plan, sweeps)
    assert len(main) == 3 * 3 * 3 and set(main) <= set(rec.order)
    for b in plan.budgets:  # every main run of budget b is asked for before any run of a larger budget
        last = max(i for i, s in enumerate(rec.order) if s.budget == b)
        assert {s for s in main if s.budget == b} <= set(rec.order[: last + 1])
    assert list(sweeps["gpt+"]) == [2048] and list(sweeps["r"]) == [2048, 4096, 8192]
    # The tuned arm's choice at a budget is the argmin of its own sweep there: weight decay 0, LR 4e-3.
    best = (4e-3, (("weight_decay", 0.0),))
    assert {b: sweeps["r"][b].best for b in plan.budgets} == dict.fromkeys(plan.budgets, best)
    assert len([s for s in rec.order if s.arm == "r" and s.seed == 0]) == 3 * 2 * 2  # 2 LRs x 2 settings x 3


@pytest.fixture(scope="module")
def cut(data_dir, tmp_path_factory):
    """A comparison stopped by Ctrl-C at its first run of seed 1 at the second budget (8 steps): every run of the
    first budget and seed 0's of the second finished, seed 1's of the second did not. (plan, out, stderr)."""
    import contextlib
    import io

    from angpt.train import loop

    real = loop.train

    def stop_at_seed_1_of_the_second_budget(cfg, **kw):
        if cfg.train.max_steps == 8 and cfg.train.seed == 1:  # as if Ctrl-C arrived
            raise KeyboardInterrupt
        return real(cfg, **kw)

    plan = tiny_plan(data_dir, lr_grid=[1])
    out = tmp_path_factory.mktemp("cut") / "cut"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(loop, "train", stop_at_seed_1_of_the_second_budget)
        with pytest.raises(KeyboardInterrupt):
            run_comparison(plan, out, threads=1, progress=False, command="angpt compare (cut)")
    return plan, out, err.getvalue()


def test_an_interrupted_comparison_holds_every_arm_at_the_budgets_it_finished(cut):
    plan, out, _ = cut
    done = {p.relative_to(out / "runs").parts[:3] for p in out.rglob("result.json")}
    assert done == {(a.slug, "2048", f"seed{s}") for a in plan.arms for s in plan.seeds} | {
        (a.slug, "4096", "seed0") for a in plan.arms
    }


def test_an_interrupted_comparison_leaves_a_partial_report(cut):
    """report.md says PARTIAL at the top, lists every finished run with the final loss its result.json records and
    the others as missing; means, tests and verdicts only where every seed of both arms finished (2Ki here)."""
    from angpt.units import format_lr

    plan, out, err = cut
    assert "partial report (6 of 8 planned runs finished)" in err
    md = (out / "report.md").read_text()
    head = md.splitlines()
    assert head[0].endswith("— PARTIAL")
    assert head[2].startswith("**PARTIAL report: 6 of 8 planned runs finished; re-run the same command to resume.**")
    data = json.loads((out / "report.json").read_text())
    assert (data["partial"]["finished"], data["partial"]["planned"]) == (6, 8)
    rows = {(r["arm"], r["budget"], r["seed"]): r for r in data["partial"]["runs"]}
    assert len(rows) == len(data["partial"]["runs"]) == 8
    loss = {}
    for arm in plan.arms:
        lr = plan.initial_grid(arm)[0]
        for b, s in [(2048, 0), (2048, 1), (4096, 0)]:
            rec = json.loads((plan.run_dir(out, arm, b, s, lr) / "result.json").read_text())
            loss[arm.label, b, s] = rec[f"{plan.report_split}_loss"]
            row = rows[arm.label, b, s]
            assert (row["status"], row["val_loss"]) == ("finished", rec["val_loss"])  # the runs listed: validation
            # without a tuning seed the first seed's sweep run at the smallest budget is also its main run
            assert row["role"] == ("sweep, main" if (b, s) == (2048, 0) else "main"), (b, s, row["role"])
            assert (
                f"| {arm.label} | {b // 1024}Ki | {s} | {format_lr(lr)} | – | {row['role']} | {row['val_loss']:.4f} |"
                in md
            )
            split = plan.report_split
            assert data["arms"][arm.label]["budgets"][b // 2048 - 1][f"{split}_loss"][str(s)] == rec[f"{split}_loss"]
        assert (rows[arm.label, 4096, 1]["status"], rows[arm.label, 4096, 1]["val_loss"]) == ("missing", None)
        assert f"| {arm.label} | 4Ki | 1 | {format_lr(lr)} | – | main | missing |" in md
        first, second = data["arms"][arm.label]["budgets"]
        assert first["missing"] == [] and first[f"{plan.report_split}_loss_mean"] == pytest.approx(
            (loss[arm.label, 2048, 0] + loss[arm.label, 2048, 1]) / 2, rel=1e-12
        )
        # Seed 0 finished at 4Ki: listed, but no mean of one seed passes for the arm's loss there.
        mean_key = f"{plan.report_split}_loss_mean"
        assert second["missing"] == [1] and second[mean_key] is None and second["n"] == 0
        assert f"| {arm.label} | {format_lr(lr)} | {first[mean_key]:.4f} ± " in md
        assert "| missing (1 of 2 seeds) |" in md
    angpt = data["arms"]["angpt"]
    diff = [loss["angpt", 2048, s] - loss["gpt+", 2048, s] for s in (0, 1)]
    assert angpt["budgets"][0]["compared"] and angpt["budgets"][0]["difference"]["n_pairs"] == 2
    assert angpt["budgets"][0]["difference"]["mean_diff"] == pytest.approx(sum(diff) / 2, rel=1e-12)
    assert not angpt["budgets"][1]["compared"] and angpt["budgets"][1]["difference"]["mean_diff"] is None
    assert angpt.get("speedup") is None and "| angpt | – (runs missing) |" in md
    (line,) = data["verdicts"]
    assert line.startswith("smoke test: partial: angpt vs gpt+ at 2Ki tokens: final loss")
    assert "runs missing at 4Ki: no speedup yet" in line and f"{abs(sum(diff) / 2):.4f}" in line


def test_report_only_rewrites_a_partial_store_and_reads_past_half_written_records(cut, tmp_path, monkeypatch, capsys):
    from angpt.train import loop

    plan, cut_out, _ = cut
    out = tmp_path / "copy"
    shutil.copytree(cut_out, out)
    monkeypatch.setattr(loop, "train", lambda cfg, **kw: pytest.fail("--report-only trained"))
    before = json.loads((out / "report.json").read_text())
    assert cli("--out", out, "--report-only") == 0
    assert "PARTIAL: 6 of 8 planned runs finished" in capsys.readouterr().out
    after = json.loads((out / "report.json").read_text())
    assert after["arms"] == before["arms"] and after["partial"] == before["partial"]
    assert after["command"] == "angpt compare (cut)" and after["rewritten_by"].startswith("angpt ")  # sys.argv here
    # A run killed while writing: a torn result.json (gpt+) and a torn last metrics line (angpt), both seed 1 at 2Ki.
    torn = [plan.run_dir(out, a, 2048, 1, plan.initial_grid(a)[0]) for a in plan.arms]
    text = (torn[0] / "result.json").read_text()
    (torn[0] / "result.json").write_text(text[: len(text) // 2])
    with open(torn[1] / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "lo')
    runs = snapshot(out / "runs")
    assert cli("--out", out, "--report-only") == 0
    data = json.loads((out / "report.json").read_text())
    rows = {(r["arm"], r["budget"], r["seed"]): r["status"] for r in data["partial"]["runs"]}
    assert rows["gpt+", 2048, 1] == rows["angpt", 2048, 1] == "missing" and data["partial"]["finished"] == 4
    assert data["verdicts"] == ["smoke test: angpt vs gpt+: no budget has every seed of both arms finished yet; "
                                "no verdict (partial)."]  # fmt: skip
    assert snapshot(out / "runs") == runs  # the report never writes into a run


def test_a_failed_partial_report_is_one_warning_and_the_exit_code_stands(data_dir, tmp_path, monkeypatch, capsys):
    from angpt.study import StudyInterrupted
    from angpt.study.comparison import report as report_module
    from angpt.train import loop

    def sigterm(cfg, **kw):
        raise StudyInterrupted(signal.SIGTERM)

    monkeypatch.setattr(loop, "train", sigterm)
    args = ["--data", data_dir, "--arms", "gpt+,angpt", "--budgets", "2048", "--seeds", "0", "--preset", "tiny"]
    args += ["--batch-tokens", "512", "--lr-grid", "1", "--eval-batches", "2", "--dtype", "fp32", "--quiet"]
    args += ["--tuning-seed", "none"]
    assert cli(*args, "--out", tmp_path / "a") == 143
    assert "partial report (0 of 2 planned runs finished)" in capsys.readouterr().err
    assert "**PARTIAL report: 0 of 2 planned runs finished;" in (tmp_path / "a" / "report.md").read_text()

    def broken(*a, **kw):
        raise RuntimeError("disk full\nsecond line")

    monkeypatch.setattr(report_module, "write_stored_report", broken)
    assert cli(*args, "--out", tmp_path / "b") == 143
    err = capsys.readouterr().err.splitlines()
    assert [e for e in err if "partial report" in e] == ["warning: no partial report written (RuntimeError: disk full"]
    assert not (tmp_path / "b" / "report.md").exists() and (tmp_path / "b" / "plan.json").is_file()


def test_report_only_on_a_finished_store_reproduces_its_report(compared, data_dir, tmp_path, monkeypatch, capsys):
    from angpt.train import loop

    plan, finished, _ = compared
    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    (out / "report.md").unlink()
    monkeypatch.setattr(loop, "train", lambda cfg, **kw: pytest.fail("--report-only trained"))
    runs = snapshot(out / "runs")
    assert cli("--out", out, "--report-only") == 0
    full, again = (json.loads((d / "report.json").read_text()) for d in (finished, out))
    assert again["arms"] == full["arms"] and again["verdicts"] == full["verdicts"]
    assert again["partial"] is None and again["command"] == full["command"]  # the run's command, kept
    md = (out / "report.md").read_text()
    assert "PARTIAL" not in md and "rewritten from the run store by `angpt " in md
    # The run's own flags may come along; they must describe the stored plan.
    flags = ["--data", data_dir, "--arms", "gpt+,angpt", "--budgets", "2048,4096", "--seeds", "0,1", "--preset"]
    flags += ["tiny", "--batch-tokens", "512", "--lr-grid", "1,2", "--max-extensions", "1", "--eval-batches", "2"]
    flags += ["--eval-points", "2", "--dtype", "fp32", "--tuning-seed", "none"]
    assert cli(*flags, "--out", out, "--report-only") == 0
    capsys.readouterr()
    assert cli(*flags[:7], "0,1,2", *flags[8:], "--out", out, "--report-only") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds this comparison with other seeds [0, 1] -> [0, 1, 2]" in err
    assert snapshot(out / "runs") == runs


def test_report_names_the_dtype_the_runs_computed_in_and_flags_a_mix(compared, tmp_path):
    """Each run records the dtype `auto` resolved to; the report states it, and runs that computed in different
    dtypes (a store resumed on another machine) are flagged as not comparable."""
    from angpt.study.comparison.report import write_stored_report

    _, finished, _ = compared
    results = sorted((finished / "runs").rglob("result.json"))
    assert results and {json.loads(p.read_text())["dtype"] for p in results} == {"fp32"}
    assert {json.loads(p.read_text())["compiled"] for p in results} == {False}  # train.compile auto, on a CPU
    assert json.loads((finished / "report.json").read_text())["machine"]["dtype"] == "fp32"
    assert not any("dtypes" in w for w in json.loads((finished / "report.json").read_text())["warnings"])

    out = tmp_path / "mixed"
    shutil.copytree(finished, out)
    for victim in (out / "runs").rglob("result.json"):  # one arm's runs were resumed on a machine picking bf16
        if json.loads(victim.read_text())["arm"] == "angpt":
            victim.write_text(json.dumps({**json.loads(victim.read_text()), "dtype": "bf16"}))
    report, _, _ = write_stored_report(out, command="angpt compare (test)", jobs=1, threads=1)
    assert any("different dtypes (bf16, fp32)" in w for w in report["warnings"])
    assert "different dtypes (bf16, fp32)" in (out / "report.md").read_text()


def test_report_only_without_a_store_is_one_line_and_writes_nothing(tmp_path, capsys):
    assert cli("--out", tmp_path / "none", "--report-only") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no angpt compare report (no plan.json)" in err
    assert not (tmp_path / "none").exists()
    for i, text in enumerate(["{not json", '{"arms": []}']):
        bad = tmp_path / f"bad{i}"
        bad.mkdir()
        (bad / "plan.json").write_text(text)
        assert cli("--out", bad, "--report-only") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "plan.json is unreadable" in err
        assert os.listdir(bad) == ["plan.json"]
    assert cli("--out", tmp_path / "run", "--budgets", "2048") == 2  # a run still needs its dataset
    assert "--data is required" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_store_is_read_without_guessing_a_sweep_that_has_not_settled(data_dir, tmp_path):
    """A hand-written store: gpt+ done at both budgets; a re-tuned arm's sweep at 4Ki has one of its two settings
    finished. Its 4Ki main runs are missing with no LR (not the 2Ki choice), and 8 of 10 planned runs count."""
    from angpt.study.store import PLAN_FILE, RunSpec, write_json
    from angpt.study.stored import read_store

    plan = make_plan(data_dir, **TINY, arms=["gpt+", "r=gpt+[tune.weight_decay=0:0.1]"], seeds=[0, 1], lr_grid=[1])
    out = tmp_path / "hand"
    out.mkdir()
    write_json(out / PLAN_FILE, plan.to_dict())
    lr = 0.002
    wd0, wd1 = (("weight_decay", 0.0),), (("weight_decay", 0.1),)

    def finish(arm, budget, seed, setting, loss):
        run = plan.run_dir(out, plan.arm(arm), budget, seed, lr, setting)
        run.mkdir(parents=True)
        steps = plan.steps(budget)
        (run / "metrics.jsonl").write_text(json.dumps({"step": steps, "tokens": budget, "val_loss": loss}) + "\n")
        write_json(run / "result.json", {"status": "finished", "steps": steps, "val_loss": loss, "seed": seed})

    for b, base in ((2048, 4.0), (4096, 3.0)):
        finish("gpt+", b, 0, (), base)
        finish("gpt+", b, 1, (), base + 0.1)
    finish("r", 2048, 0, wd0, 4.2)
    finish("r", 2048, 0, wd1, 3.9)  # the best setting at 2Ki
    finish("r", 2048, 1, wd1, 3.95)
    finish("r", 4096, 0, wd1, 2.8)  # the 2Ki choice, at 4Ki: one point of the sweep there, not yet a main run
    stored = read_store(out)
    assert stored.sweeps["r"][2048].best == (lr, wd1) and 4096 not in stored.sweeps["r"]
    assert stored.unsettled == {"r": [4096]}
    assert {k[:3] for k in stored.records if k[0] == "r"} == {("r", 2048, 0), ("r", 2048, 1)}
    assert (stored.finished, len(stored.runs)) == (8, 10) and not stored.complete
    r4 = [(x["seed"], x["lr"], x["role"], x["status"]) for x in stored.runs if (x["arm"], x["budget"]) == ("r", 4096)]
    assert sorted(r4, key=str) == sorted(
        [(0, lr, "sweep", "finished"), (0, lr, "sweep", "missing"), (1, None, "main", "missing")], key=str
    )
    assert RunSpec("r", 2048, 0, lr, wd1).key() in stored.records


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from /proc")
def test_sigterm_reaches_the_workers_and_a_rerun_resumes(data_dir, tmp_path):
    """`angpt compare --jobs 2` killed with SIGTERM mid-run: both workers save a checkpoint and exit, compare exits
    143, and the same command resumes both runs from their checkpoints."""
    out = tmp_path / "sig"
    args = ["--data", data_dir, "--out", out, "--arms", "gpt+,angpt", "--budgets", "32768", "--seeds", "0"]
    args += ["--preset", "tiny", "--batch-tokens", "512", "--lr-grid", "1", "--eval-batches", "2", "--eval-points", "2"]
    args += ["--dtype", "fp32", "--threads", "1", "--quiet", "--tuning-seed", "none"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "angpt", "compare", *map(str, args), "--jobs", "2"], env=env)
    deadline = time.time() + 120
    while time.time() < deadline:  # both workers training: each has logged a step
        metrics = list((out / "runs").rglob("metrics.jsonl")) if (out / "runs").is_dir() else []
        if len(metrics) == 2 and all(m.stat().st_size for m in metrics):
            break
        time.sleep(0.05)
    workers = _children(proc.pid)
    try:
        assert len(workers) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)  # exited (and reaped by compare)
    finally:  # a failure here must not leave our processes behind (only ours: checked by their command line)
        if proc.poll() is None:
            proc.kill()
        for pid in workers:
            try:
                if str(out) in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        proc.wait()
    plan = make_plan(data_dir, **{**TINY, "budgets": [32768]}, arms=["gpt+", "angpt"], seeds=[0], lr_grid=[1])
    run_dirs = [plan.run_dir(out, a, 32768, 0, plan.initial_grid(a)[0]) for a in plan.arms]
    for run_dir in run_dirs:
        assert not (run_dir / "result.json").exists() and list((run_dir / "checkpoints").glob("step_*"))
    saved = {d: int(sorted((d / "checkpoints").glob("step_*"))[-1].name.split("_")[1]) for d in run_dirs}
    assert all(0 < k < 64 for k in saved.values()), saved
    report = run_comparison(plan, out, threads=1, progress=False)
    assert len(report.trained) == 2
    for run_dir in run_dirs:
        assert [r["step"] for r in read_rows(run_dir)] == list(range(1, 65))
        assert json.loads((run_dir / "result.json").read_text())["status"] == "finished"


def test_a_comparison_extends_with_seeds_and_arms_reusing_finished_runs(compared, data_dir, tmp_path, capsys):
    plan, finished, _ = compared
    out = tmp_path / "ext"
    shutil.copytree(finished, out)
    report = run_comparison(tiny_plan(data_dir, seeds=[0, 1, 2]), out, threads=1, progress=False)
    # Only seed 2 trains; the sweeps (smallest budget, first seed) and seeds 0 and 1 are reused.
    assert sorted((s.arm, s.budget, s.seed) for s in report.trained) == [
        (a, b, 2) for a in ("angpt", "gpt+") for b in (2048, 4096)
    ]
    assert all(r["n"] == 3 for r in report.arms["angpt"]["budgets"])
    assert "extending" in capsys.readouterr().err
    # A new arm (its LR given), with the seeds narrowed back to one: only the new arm's runs train.
    more = tiny_plan(data_dir, arms=["gpt+", "angpt", "gpt"], seeds=[0], lr_values={"gpt": [0.002]})
    report = run_comparison(more, out, threads=1, progress=False)
    assert sorted((s.arm, s.budget, s.seed) for s in report.trained) == [("gpt", 2048, 0), ("gpt", 4096, 0)]
    assert json.loads((out / "plan.json").read_text())["seeds"] == [0] and set(report.arms) == {"gpt+", "angpt", "gpt"}
    # Runs of seed 2 stay on disk for a later extension; the report covers the plan it was asked for.
    assert all(r["n"] == 1 for r in report.arms["angpt"]["budgets"])


def test_a_store_made_under_other_defaults_is_refused_not_reported_as_todays(
    compared, data_dir, tmp_path, monkeypatch, capsys
):
    """A default that changed since the runs (here anGPT's alpha speed) makes the same arm another model: re-running
    or extending the comparison must not report the stored runs, or add new ones beside them, as today's arm."""
    from angpt.models import registry

    plan, finished, _ = compared
    out = tmp_path / "old"
    shutil.copytree(finished, out)
    before = snapshot(out)
    monkeypatch.setitem(registry.get("angpt").config, "alpha_speed", 2.0)
    for p, dry in ((plan, False), (tiny_plan(data_dir, seeds=[0, 1, 2]), False), (plan, True)):
        with pytest.raises(UserError, match=r"runs/angpt/.* was trained with model\.alpha_speed=5\.0 \(now 2\.0\)"):
            run_comparison(p, out, threads=1, progress=False, dry_run=dry)
    assert snapshot(out) == before
    # A new directory under the changed default is an ordinary comparison; so is this one without the arm.
    assert run_comparison(plan, tmp_path / "new", threads=1, progress=False, dry_run=True).dry_run
    assert run_comparison(tiny_plan(data_dir, arms=["gpt+"]), out, threads=1, progress=False, dry_run=True).dry_run
    # Re-reading the runs is allowed, and says whose models the report describes.
    from angpt.study import rewrite_report

    rewrite_report(out, command="angpt compare --report-only (test)")
    err = capsys.readouterr().err
    n = len(list((out / "runs" / "angpt").rglob("config.json")))
    assert f"warning: {n} runs in" in err and "were trained with model.alpha_speed=5.0 (now 2.0)" in err


def test_a_run_written_before_a_field_existed_has_that_fields_old_value(compared, tmp_path):
    """A config.json without a field added since (alpha_speed) was trained with the field's dataclass default: no
    drift where today's arm has that default too (GPT+), a drift where the arm's default moved (anGPT: 1 -> 5)."""
    from angpt.data import load_meta
    from angpt.train.resume import model_drift

    plan, finished, _ = compared
    meta = load_meta(plan.data)
    for arm, expected in (("gpt+", None), ("angpt", "model.alpha_speed=1.0 (now 5.0)")):
        run = next((finished / "runs" / arm).rglob("config.json"))
        assert model_drift(run.parent, meta) is None
        stored = json.loads(run.read_text())
        del stored["run"]["model"]["alpha_speed"]
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "config.json").write_text(json.dumps(stored))
        assert model_drift(tmp_path / arm, meta) == expected
        stored["run"]["init_from"] = "elsewhere"  # a run started from weights has the checkpoint's model
        (tmp_path / arm / "config.json").write_text(json.dumps(stored))
        assert model_drift(tmp_path / arm, meta) is None
    assert model_drift(tmp_path / "none", meta) is None


def test_raising_max_extensions_goes_on_with_an_unfinished_sweep(compared, data_dir, tmp_path, capsys):
    """A sweep that stopped at its grid's edge (max_extensions reached) is finished by a re-run with a larger
    max_extensions: its runs are reused, only LRs beyond the old grid (and the main runs of a new best) train."""
    plan, finished, _ = compared
    out = tmp_path / "more"
    shutil.copytree(finished, out)
    old = json.loads((finished / "report.json").read_text())["arms"]
    report = run_comparison(tiny_plan(data_dir, max_extensions=2), out, threads=1, progress=False)
    assert "max_extensions 1 -> 2" in capsys.readouterr().err
    assert json.loads((out / "plan.json").read_text())["max_extensions"] == 2
    for arm in ("gpt+", "angpt"):
        old_lrs = {r["lr"] for r in old[arm]["sweep"]["rows"]}
        new_sweep = report.arms[arm]["sweep"]
        assert {r["lr"] for r in new_sweep["rows"]} > old_lrs and new_sweep["extensions"] == 2, arm
        for s in report.trained:  # no stored sweep run trained again
            assert not (s.arm == arm and s.budget == plan.budgets[0] and s.seed == 0 and s.lr in old_lrs), s


def test_a_retuned_arm_uses_each_budgets_best_setting(data_dir, tmp_path, monkeypatch, capsys):
    """An arm tuned over weight decay x warm-up (x LR) at every budget: each budget's runs use the argmin of that
    budget's grid by validation loss (read here from every grid run's result.json), and the report names it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plots: the report must say so
    arms = ["gpt+", "r=gpt+[tune.weight_decay=0:0.1,tune.warmup=0:0.25]"]
    plan = make_plan(data_dir, **TINY, arms=arms, seeds=[0], lr_grid=[1])
    out = tmp_path / "retune"
    report = run_comparison(plan, out, threads=1, progress=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [e for e in err if e.startswith("warning: smoke test, not evidence")] and len(err) == 1
    named = []
    for i, b in enumerate(plan.budgets):
        grid = [json.loads(p.read_text()) for p in (out / "runs" / "r" / str(b) / "seed0").glob("*/result.json")]
        assert len(grid) == 4
        best = min(grid, key=lambda r: r["val_loss"])
        row = report.arms["r"]["budgets"][i]
        assert (row["lr"], row["setting"]) == (best["lr"], best["setting"])
        assert row["val_loss"]["0"] == best["val_loss"]
        wd, wu = best["setting"]["weight_decay"], best["setting"]["warmup"]
        named.append(f"{b // 1024}Ki: lr 0.002, warmup={wu * 100:g}%, weight_decay={wd:g}")
        # The setting reached the trainer: warm-up 25% of this budget's steps, the weight decay as given.
        cfg = json.loads((plan.run_dir(out, plan.arm("r"), b, 0, 0.002, (("warmup", 0.25), ("weight_decay", 0.1)))
                          / "config.json").read_text())["run"]["train"]  # fmt: skip
        assert (cfg["warmup_steps"], cfg["weight_decay"]) == (b // 512 // 4, 0.1)
    md = (out / "report.md").read_text()
    assert f"- r: {'; '.join(named)}" in md
    assert "matplotlib is not installed: no plots were drawn" in md and not list(out.glob("*.png"))
    assert "smoke test, not evidence" in md.splitlines()[0]


def test_strict_refuses_a_smoke_test_before_anything_runs(data_dir, tmp_path, capsys):
    common = ["--data", data_dir, "--preset", "tiny", "--arms", "gpt+", "--seeds", "0", "--lr-grid", "1"]
    common += ["--dtype", "fp32", "--threads", "1"]
    out = tmp_path / "strict"
    assert cli(*common, "--out", out, "--batch-tokens", "512", "--budgets", "2048", "--strict") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--strict: smoke test, not evidence" in err and "4 optimizer steps" in err
    assert not out.exists()
    # 1,000 steps of 2,048 tokens: about 12 tokens per parameter of the tiny GPT+ (~170K): evidence, allowed.
    rc = cli(*common, "--out", out, "--batch-tokens", "2048", "--budgets", "2048000", "--strict", "--dry-run")
    text = capsys.readouterr().out
    assert rc == 0 and text.startswith("horizon: the largest budget (2048K tokens) is 1,000 optimizer steps")
    assert not out.exists()


def test_jobs_auto_picks_the_faster_split_and_records_it(data_dir, tmp_path, monkeypatch):
    from angpt.study import execute as runner
    from angpt.study import jobs

    assert jobs.candidates(2, 10) == [(1, 2), (2, 1)] and jobs.candidates(16, 3) == [(1, 16), (2, 8)]
    assert jobs.candidates(1, 5) == [(1, 1)] and jobs.candidates(8, 1) == [(1, 8)]
    speeds = {(1, 2): 1500.0, (2, 1): 1000.0, (1, 1): 700.0}
    monkeypatch.setattr(jobs, "measure", lambda plan, j, t, steps: speeds[(j, t)])
    plan = make_plan(data_dir, **{**TINY, "budgets": [2048]}, arms=["gpt+"], seeds=[0, 1], lr_grid=[1])
    rec = jobs.choose_jobs(plan, 2)
    assert (rec["jobs"], rec["threads"]) == (1, 2)
    assert [(c["jobs"], c["threads"], c["tokens_per_s"]) for c in rec["candidates"]] == [(1, 2, 1500.0), (2, 1, 1000.0)]
    speeds[(2, 1)] = 2000.0
    assert (jobs.choose_jobs(plan, 2)["jobs"], jobs.choose_jobs(plan, 2)["threads"]) == (2, 1)
    # run_comparison(jobs="auto") measures, runs with the choice, and keeps the measurement in the report dir.
    monkeypatch.setattr(runner, "cpu_cores", lambda: 1)  # one candidate: the runs stay in this process
    report = run_comparison(plan, tmp_path / "auto", jobs="auto", progress=False)
    rec = json.loads((tmp_path / "auto" / "jobs.json").read_text())
    assert (rec["jobs"], rec["threads"], report.data["jobs"], report.data["threads"]) == (1, 1, 1, 1)
    assert rec["candidates"] == [{"jobs": 1, "threads": 1, "tokens_per_s": 700.0}]
    md = (tmp_path / "auto" / "report.md").read_text()
    assert "--jobs auto: measured jobs x threads on gpt+ (3 steps each): 1x1: 700 tok/s; chose 1x1" in md


@pytest.mark.slow
def test_jobs_auto_measures_for_real(data_dir, tmp_path, capsys):
    from angpt.study import jobs

    plan = make_plan(data_dir, **{**TINY, "budgets": [2048]}, arms=["gpt+"], seeds=[0, 1], lr_grid=[1])
    rec = jobs.choose_jobs(plan, 2, steps=2)
    assert [(c["jobs"], c["threads"]) for c in rec["candidates"]] == [(1, 2), (2, 1)]
    assert all(c["tokens_per_s"] > 0 for c in rec["candidates"])


def test_a_result_file_that_is_json_but_not_a_record_counts_as_not_finished(tmp_path):
    from angpt.study.store import RESULT_FILE, load_record

    (tmp_path / RESULT_FILE).write_text(json.dumps({"steps": 4, "status": "diverged", "val_loss": None}))
    assert load_record(tmp_path, 4)["status"] == "diverged"  # a diverged run is done without metrics rows
    assert load_record(tmp_path, 5) is None  # another plan's length
    for stray in ("[1, 2]", "null", '"finished"', "3"):
        (tmp_path / RESULT_FILE).write_text(stray)
        assert load_record(tmp_path, 4) is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_killed_by_a_signal_is_interrupted_not_failed(data_dir, tmp_path, monkeypatch, signum):
    """A worker the signal reaches before the trainer handles it dies of it (status -signum): the comparison
    stops as interrupted by that signal (a re-run resumes), not with "run failed"."""
    from angpt.study import StudyInterrupted
    from angpt.study import execute as runner

    suicide = f"import os, signal; os.kill(os.getpid(), {int(signum)})"
    monkeypatch.setattr(runner, "worker_command", lambda *a: [sys.executable, "-c", suicide])
    plan = make_plan(data_dir, **{**TINY, "budgets": [32768]}, arms=["gpt+", "angpt"], seeds=[0], lr_grid=[1])
    with pytest.raises(StudyInterrupted) as e:
        run_comparison(plan, tmp_path / "killed", jobs=2, threads=1, progress=False)
    assert e.value.signum == signum


def test_the_estimates_training_step_is_set_up_as_the_trainers(data_dir, monkeypatch):
    """The dry run's step times and `--jobs auto` time the trainer's step: the fused loss on (train.fused_loss's
    default) and, on a CPU, freed memory kept, as angpt.train.loop sets them up."""
    from angpt.study import estimate
    from angpt.train.config import TrainConfig

    calls = []
    monkeypatch.setattr("angpt.train.hardware.keep_freed_memory", lambda: calls.append(1) or True)
    plan = make_plan(data_dir, **{**TINY, "budgets": [32768]}, arms=["angpt"], seeds=[0], lr_grid=[1])
    step, _ = estimate.train_step_for(plan, plan.arms[0], torch.device("cpu"))
    assert step.model.fused_loss is TrainConfig().fused_loss is True
    assert calls == [1]


def test_the_estimate_compiles_where_the_runs_compile_and_counts_the_compiling_as_set_up(data_dir, monkeypatch):
    """A run with train.compile on compiles its forward (afresh: each run resets Dynamo) and pays the compiling in
    its first step; the dry run times the compiled step and adds that first step to the run's set-up time, so a GPU
    study (compiled by `auto`) is neither estimated at eager speed nor missing its compiling. The compiler is a
    stand-in whose first call takes 0.5 s."""
    import time as _time

    import angpt.train.setup as train_setup
    from angpt.study import estimate

    made = []

    def fake_compile(model, opt, *, fresh=False, **kw):
        made.append(fresh)
        calls = []

        def forward(*a, **k):
            if not calls:
                _time.sleep(0.5)  # the compiling
            calls.append(1)
            return model(*a, **k)

        return forward

    monkeypatch.setattr(train_setup, "compile_for_training", fake_compile)
    base = dict(**{**TINY, "budgets": [32768]}, arms=["gpt+"], seeds=[0], lr_grid=[1])
    eager = make_plan(data_dir, **base)
    compiled = make_plan(data_dir, **base, settings={"train.compile": True})
    step, _ = estimate.train_step_for(compiled, compiled.arms[0], torch.device("cpu"))
    assert step.forward is not step.model and made == [True]
    times, setup = estimate.measure_step_times(compiled, threads=1, steps=1)
    assert setup["gpt+"] >= 0.5 and times["gpt+"] < 0.5  # the compiling is set-up, not a step
    made.clear()
    times, setup = estimate.measure_step_times(eager, threads=1, steps=1)  # auto on a CPU: eager
    assert made == [] and setup["gpt+"] < 0.5


def test_the_flags_every_study_shares_are_read_once_the_same_way(data_dir):
    """`angpt compare` and `angpt scaling` read their shared flags through one function (study/flags.py): the same
    flags give the same PlanOptions (less the batch, which a ladder and a batch study set per plan); the per-arm
    rates and grids are parsed, bad ones refused in one line. The arms' checks are one function too: gpt+ is the
    baseline where it is an arm, else the first; a label given twice and a baseline not among the arms are refused."""
    from angpt.study.arms import check_arms, parse_arms
    from angpt.study.flags import plan_options
    from angpt.study.scaling.cli import add_scaling_parser

    shared = ["--preset", "tiny", "--lr-grid", "0.5,1,2", "--lr", "angpt=3e-3", "--lr-values", "gpt+=1e-3:2e-3",
              "--set", "model.d_model=32", "--eval-batches", "3", "--dtype", "fp32"]  # fmt: skip
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_compare_parser(sub)
    add_scaling_parser(sub)
    compare = parser.parse_args(["compare", "--data", str(data_dir), "--out", "x", *shared])
    scaling = parser.parse_args(["scaling", "--data", str(data_dir), "--out", "x", *shared])
    mine, theirs = plan_options(compare), plan_options(scaling)
    assert mine == theirs
    assert mine.lr == {"angpt": 3e-3} and mine.lr_values == {"gpt+": [1e-3, 2e-3]} and mine.lr_grid == [0.5, 1.0, 2.0]
    assert mine.settings == ["model.d_model=32"] and mine.eval_batches == 3
    bad = parser.parse_args(["compare", "--data", str(data_dir), "--out", "x", "--lr-values", "gpt+=1e-3:x"])
    with pytest.raises(UserError, match="numbers separated by ':'"):
        plan_options(bad)
    assert check_arms(parse_arms(["angpt", "gpt+"], []), None) == "gpt+"
    assert check_arms(parse_arms(["angpt", "ngpt"], []), None) == "angpt"
    with pytest.raises(UserError, match="'angpt' is given twice"):
        check_arms(parse_arms(["angpt", "angpt"], []), None)
    with pytest.raises(UserError, match="baseline 'gpt' is not one of the ladder's arms"):
        check_arms(parse_arms(["angpt"], []), "gpt", "the ladder's arms")


def test_a_plan_longer_than_an_hour_here_says_so_before_it_starts(data_dir, tmp_path, monkeypatch, capsys):
    """The README's compare line planned 10 h 39 min on 2 cores and said nothing (issue 48). A plan whose runs the
    dry run of `angpt train` puts above an hour on this machine prints its runs, time and checkpoints' size before
    anything trains; a short one is not even measured. The hour is made small here, the plan stays tiny."""
    from angpt.study import estimate, make_plan

    plan = make_plan(data_dir, **{**TINY, "budgets": [2048, 4096]}, arms=["gpt+", "angpt"], seeds=[0, 1])
    seconds, disk, n = estimate.plan_cost(plan, tmp_path / "c", mfu=0.5)
    dry = estimate.describe_dry_run(plan, tmp_path / "c", jobs=1, threads=1, measure=False)
    checks = 3 * sum(plan.checks_lr(a) for a in plan.arms)
    assert n == len(dry.sweep) + len(dry.main) + checks and seconds > 0 and disk > 0
    assert estimate.long_plan_warning(plan, tmp_path / "c") is None  # seconds, not an hour
    monkeypatch.setattr(estimate, "LONG_PLAN_S", 1e-4)
    line = estimate.long_plan_warning(plan, tmp_path / "c")
    assert line.startswith(f"this plan is {n} run(s): ~") and "GB of checkpoints in" in line
    from angpt.study.comparison.run import Comparison

    Comparison(plan, command="test", strict=False, sample=None, sample_tokens=8).begin(tmp_path / "c")
    assert f"warning: this plan is {n} run(s)" in capsys.readouterr().err


def test_a_failed_worker_stops_the_study_and_its_report_shows_the_logs_tail(data_dir, tmp_path, monkeypatch):
    """A worker that fails (exit 1, a traceback in its log): the study stops with the log's last line, the PARTIAL
    report lists the run as failed with its exit status and the log's tail, and re-running trains it; the
    failure leaves the store and the report with it."""
    from angpt.study import execute as runner
    from angpt.study.execute import RunFailed
    from angpt.study.store import FAILED_FILE

    real = runner.worker_command
    crash = "import sys; print('step 3 of 8'); print('Traceback (most recent call last):'); " + (
        "print('RuntimeError: out of memory on the way'); sys.exit(1)"
    )
    monkeypatch.setattr(runner, "worker_command", lambda *a: [sys.executable, "-c", crash])
    plan = make_plan(data_dir, **{**TINY, "budgets": [2048]}, arms=["gpt+"], seeds=[0], lr_grid=[1])
    out = tmp_path / "study"
    with pytest.raises(RunFailed, match=r"failed \(exit 1\): RuntimeError: out of memory on the way \(log: "):
        run_comparison(plan, out, jobs=2, threads=1, progress=False)
    report = (out / "report.md").read_text()
    assert "PARTIAL" in report and "## Failed runs" in report and "FAILED (below)" in report
    assert "Exit status 1;" in report and "step 3 of 8\nTraceback (most recent call last):\nRuntimeError" in report
    (failed,) = out.glob(f"runs/**/{FAILED_FILE}")
    monkeypatch.setattr(runner, "worker_command", real)
    run_comparison(plan, out, jobs=2, threads=1, progress=False)
    assert not failed.exists() and "Failed runs" not in (out / "report.md").read_text()
