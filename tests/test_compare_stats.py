"""`angpt compare`'s statistics and report words: the t quantile, the paired test with its interval, Welch's interval,
loss spikes, the horizon rule, verdicts that lead with the largest budget's paired difference and never claim a
speedup an arm did not earn, stability flags, and the plots' small rules. No training: every test here is fast."""

import json
import math
from pathlib import Path

import pytest

from angpt.stats import loss_spikes, t_quantile
from angpt.study import make_plan, paired_ttest, welch_ttest
from angpt.study.comparison.analyse import analyse, verdict, warnings
from angpt.study.comparison.collect import ArmRuns
from angpt.study.comparison.horizon import (
    MIN_STEPS,
    MIN_TOKENS_PER_PARAM,
    Horizon,
    Horizons,
    count_params,
    short_comparison,
)
from angpt.study.comparison.lead import words
from angpt.study.comparison.plots import NO_MATPLOTLIB, spread_note, wants_log_y, write_plots
from angpt.study.comparison.render import render_markdown
from angpt.study.store import run_health
from angpt.study.sweep import SweepResult

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(preset="tiny", batch_tokens=512, eval_batches=2, eval_points=2, dtype="fp32")


# ------------------------------------------------------------------------------------------- t quantile
def test_t_quantile_matches_closed_forms_and_tables():
    for q in (0.6, 0.9, 0.975, 0.995):
        # df = 1 is the Cauchy distribution: t_q = tan(pi (q - 1/2)); df = 2: t_q = (2q - 1) / sqrt(2 q (1 - q)).
        assert t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=1e-10)
        assert t_quantile(q, 2) == pytest.approx((2 * q - 1) / math.sqrt(2 * q * (1 - q)), rel=1e-10)
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)  # scipy.stats.t.ppf(0.975, 4)
    assert t_quantile(0.975, 30) == pytest.approx(2.0422724563012378, rel=1e-9)
    assert t_quantile(0.995, 3.5) == pytest.approx(5.085702223091256, rel=1e-9)  # fractional df (Welch)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959966356814107, rel=1e-7)  # -> the normal's 1.96
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764451051977943, rel=1e-9) and t_quantile(0.5, 3) == 0.0
    for bad in ((0.0, 3), (1.0, 3), (0.9, 0)):
        with pytest.raises(ValueError):
            t_quantile(*bad)


def test_t_quantile_agrees_with_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 1.5, 2, 3, 5, 9, 24.99, 100):
        for q in (0.55, 0.8, 0.95, 0.975, 0.999):
            assert t_quantile(q, df) == pytest.approx(float(stats.t.ppf(q, df)), rel=1e-8), (q, df)


# ------------------------------------------------------------------------------------------------ tests
def test_paired_t_test_worked_by_hand():
    """Candidate 3.00, 3.10, 2.95 against baseline 3.05, 3.12, 3.02 at three shared seeds.

    Differences -0.05, -0.02, -0.07: mean -0.14/3, deviations -1/300, 8/300, -7/300, so the sample variance is
    (1 + 64 + 49) / 90000 / 2 = 114/180000 and se = sqrt(variance / 3). t = mean / se on 2 df, where the two-sided
    p is 1 - |t| / sqrt(2 + t^2) and the 97.5% quantile 0.95 / sqrt(2 x 0.975 x 0.025) = 4.302653.
    (scipy.stats.ttest_rel: t = -3.21182, p = 0.0847914, CI [-0.109183, 0.0158494].)
    """
    r = paired_ttest([3.00, 3.10, 2.95], [3.05, 3.12, 3.02])
    mean = -0.14 / 3
    se = math.sqrt(114 / 180000 / 3)
    t = mean / se
    q = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert (r.kind, r.n, r.df) == ("paired", 3, 2)
    assert r.mean_diff == pytest.approx(mean, rel=1e-12) and r.se == pytest.approx(se, rel=1e-12)
    assert r.t == pytest.approx(t, rel=1e-12) and r.t == pytest.approx(-3.2118202741878696, rel=1e-9)
    assert r.p == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), rel=1e-10)
    assert r.p == pytest.approx(0.08479136935514096, rel=1e-8)
    assert (r.ci_low, r.ci_high) == pytest.approx((mean - q * se, mean + q * se), rel=1e-10)
    assert (r.ci_low, r.ci_high) == pytest.approx((-0.10918276146042405, 0.01584942812709094), rel=1e-8)
    # Pairing matters: the same numbers as independent samples (Welch) are far from significant.
    assert welch_ttest([3.00, 3.10, 2.95], [3.05, 3.12, 3.02]).p > 0.4
    # The sign is candidate minus baseline; order is the pairing.
    assert paired_ttest([3.05, 3.12, 3.02], [3.00, 3.10, 2.95]).mean_diff == pytest.approx(-mean)
    # Five pairs on 4 df (scipy.stats.ttest_rel: t = -0.975900, p = 0.384373, CI [-0.0769002, 0.0369002]).
    r = paired_ttest([3.00, 3.10, 2.95, 3.2, 3.05], [3.05, 3.12, 3.02, 3.21, 3.0])
    assert (r.t, r.p) == pytest.approx((-0.9759000729485322, 0.384372736447951), rel=1e-8)
    assert (r.ci_low, r.ci_high) == pytest.approx((-0.07690019259470239, 0.036900192594702536), rel=1e-8)
    # Undefined: one pair, a diverged run, differences that do not vary.
    assert paired_ttest([3.0], [3.1]) is None
    assert paired_ttest([3.0, math.inf], [3.1, 3.2]) is None
    assert paired_ttest([1.0, 2.0], [0.5, 1.5]) is None
    with pytest.raises(ValueError):
        paired_ttest([1.0, 2.0], [1.0])


def test_welch_interval_matches_scipy():
    # Wikipedia's "Welch's t-test" example 1; scipy.stats.ttest_ind(equal_var=False).confidence_interval(0.95).
    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    w = welch_ttest(a, b)
    assert (w.t, w.df, w.p) == pytest.approx((-2.455356398286006, 24.988529290231416, 0.021378001462866992), rel=1e-7)
    assert (w.ci_low, w.ci_high) == pytest.approx((-3.984096267140929, -0.3492370661924069), rel=1e-7)


def test_loss_spikes_follow_the_trainers_spike_rule():
    from angpt.train.loop import SpikeDetector

    losses = [5.0, 4.8, 4.6, 4.5, 4.4, 4.3, 4.2, 4.1, 4.0, 3.9, 3.8, 9.0, 3.7, 3.6, 6.5, 3.5, 3.4]
    got = loss_spikes(losses, 1.5)
    detector = SpikeDetector(1.5)
    assert got == [i for i, x in enumerate(losses) if detector.check(x)] == [11, 14]
    # Not before the running mean has ten losses, and a spike does not raise the mean it is measured against.
    assert loss_spikes([5.0, 50.0, 4.0], 1.5) == []
    assert loss_spikes([4.0] * 10 + [7.0, 7.0, 7.0], 1.5) == [10, 11, 12]
    rows = [{"step": i + 1, "loss": x, "grad_norm": 1.0 + (i == 3) * 99} for i, x in enumerate(losses)]
    h = run_health(rows)
    assert (h["max_grad_norm"], h["max_grad_norm_step"], h["median_grad_norm"]) == (100.0, 4, 1.0)
    assert (h["loss_spikes"], h["loss_spike_steps"]) == (2, [12, 15])  # steps, not indices


# ---------------------------------------------------------------------------------------------- horizon
def test_horizon_rule_and_parameter_count(data_dir):
    """Each arm's own tokens per non-embedding parameter (docs/protocol.md#horizon): an arm short of the rule makes
    its own comparison a smoke test (and every one, as the baseline), never another arm's (issue 53: nGPT's 9.999
    tokens per parameter at the GPU race's shape turned anGPT's verdict into a smoke test)."""
    params = 100_000
    tokens = int(MIN_TOKENS_PER_PARAM * params)
    ok = Horizon("gpt+", steps=MIN_STEPS, tokens=tokens, params=130_000, params_non_embedding=params)
    assert not ok.short and ok.tokens_per_param == MIN_TOKENS_PER_PARAM  # the embedding table is not counted
    few_steps = Horizon("a", MIN_STEPS - 1, 10**7, 130_000, params)
    few_tokens = Horizon("ngpt", 5000, tokens, 130_000, params + 10)
    assert few_steps.short and few_steps.shortfall() == "999 optimizer steps (< 1,000)"
    assert (
        few_tokens.short
        and "9.999 tokens per non-embedding parameter (< 10; 100,010 of ngpt)" in few_tokens.shortfall()
    )
    race = Horizons("gpt+", {"gpt+": ok, "angpt": Horizon("angpt", 5000, tokens, 130_000, params), "ngpt": few_tokens})
    assert race.short("ngpt") and not race.short("angpt") and race.any_short and not race.all_short
    assert "smoke test, not evidence: ngpt against gpt+: 9.999 tokens" in race.message and "\n" not in race.message
    assert race.to_dict()["short_comparisons"] == ["ngpt"] and not race.to_dict()["short"]
    assert short_comparison(race.to_dict(), "ngpt") and not short_comparison(race.to_dict(), "angpt")
    baseline_short = Horizons("ngpt", race.arms)  # the baseline short: every comparison is
    assert baseline_short.all_short and "every comparison" in baseline_short.message
    assert short_comparison({"short": True, "tokens_per_param": 3.0}, "angpt")  # a report from before: as recorded
    # Parameters are counted as a CPU build counts them (the embedding table apart).
    from angpt.data import load_meta
    from angpt.models import model_from_config
    from angpt.train.config import load_run_config, resolve_model_config

    plan = make_plan(data_dir, **TINY, budgets=[2048], arms=["gpt+", "angpt"])
    counted = count_params(plan)
    for arm in plan.arms:
        cfg = load_run_config(None, plan.run_overrides(arm, 2048, 0, 1e-3, "unused"))
        model = model_from_config(resolve_model_config(cfg, load_meta(data_dir)))
        assert counted[arm.label] == (model.num_params(), model.num_params(embeddings=False))
        assert model.num_params() > model.num_params(embeddings=False)


# ------------------------------------------------------------------------------------------ the verdicts
def _analysed(data_dir, base_losses, cand_losses, budgets, *, stat="paired", health=None):
    seeds = list(range(len(next(iter(base_losses.values())))))
    plan = make_plan(data_dir, **TINY, budgets=budgets, arms=["gpt+", "angpt"], seeds=seeds, stat=stat)
    runs = {}
    for label, losses in (("gpt+", base_losses), ("angpt", cand_losses)):
        final = {b: dict(enumerate(losses[b])) for b in plan.budgets}
        choice = {b: (1e-3, ()) for b in plan.budgets}
        runs[label] = ArmRuns(label, 1e-3, final=final, bpb={b: {} for b in plan.budgets}, choice=choice)
        runs[label].health = (health or {}).get(label, {})
    b0 = plan.sweep_budget
    sweeps = {a: {b0: SweepResult(a, b0, [1e-3], {(1e-3, ()): 3.0}, (1e-3, ()), 0, False, True)} for a in runs}
    return plan, analyse(plan, runs, sweeps)


def _report(plan, arms, warnings_=()):
    keys = ("date", "angpt_version", "git_revision", "torch_version", "python_version", "hostname", "platform")
    machine = {**dict.fromkeys(keys, "-"), "cpu": "-", "cpu_cores": 1, "gpu": None}
    return {
        "arms": arms,
        "machine": machine,
        "dataset": {},
        "command": "test",
        "jobs": 1,
        "threads": 1,
        "verdicts": [verdict(plan, lab, e) for lab, e in arms.items() if lab != plan.baseline],
        "warnings": list(warnings_),
    }


def test_recorded_comparison_no_longer_claims_a_speedup_for_an_arm_that_ends_worse(data_dir):
    """benchmarks/compare-cpu-mini: its report read "ngpt reaches gpt+'s loss with 1.59x fewer tokens" while ngpt
    ended 6.9% worse than GPT+ at the largest budget (the mean kept only points inside the trained range). From
    the same per-seed losses, the verdict must lead with that loss and claim no speedup; anGPT, better at every
    budget, keeps its speedup (its left-out points are lower bounds, which only understate it)."""
    recorded = json.loads((ROOT / "benchmarks/compare-cpu-mini/report.json").read_text())["arms"]

    def losses(label):
        return {r["budget"]: [r["val_loss"][s] for s in ("0", "1", "2")] for r in recorded[label]["budgets"]}

    budgets = [r["budget"] for r in recorded["gpt+"]["budgets"]]
    for label, worse in (("ngpt", True), ("angpt_a01", True), ("angpt", False)):
        plan, arms = _analysed(data_dir, losses("gpt+"), losses(label), budgets)
        line = verdict(plan, "angpt", arms["angpt"])
        diffs = [c - b for c, b in zip(losses(label)[budgets[-1]], losses("gpt+")[budgets[-1]])]
        lead = f"angpt vs gpt+ at 512Ki tokens: final loss {abs(sum(diffs) / 3):.4f} {'higher' if worse else 'lower'}"
        assert line.startswith(lead), (label, line)
        assert "95% CI [" in line and "paired p=" in line and "(Welch p=" in line
        assert ("fewer tokens" in line) is (not worse), (label, line)
        assert arms["angpt"]["speedup"]["established"] is (not worse)
        if worse:
            assert "no speedup can be claimed" in line and "not established" in render_markdown(
                plan, _report(plan, arms), {}
            )
    assert "4 below range (speedup >= 1.00x there; left out, so the mean understates)" in line  # anGPT's bounds
    assert "reaches gpt+'s loss with 1.48x fewer tokens (±0.06 over 3 seeds, 95% CI [1.34, 1.62]; 5 of 9 points" in line


def test_no_speedup_is_claimed_for_an_arm_worse_at_the_largest_budget(data_dir):
    """A noisy candidate that crosses every baseline loss inside the range (every point exact, none a bound) but
    ends above the baseline at the largest budget: its mean speedup (> 1) must not be claimed."""
    budgets = [2048, 4096, 8192]
    base = {2048: [4.0, 4.1], 4096: [3.5, 3.6], 8192: [3.0, 3.1]}
    cand = {2048: [4.2, 4.3], 4096: [3.0, 3.1], 8192: [3.1, 3.2]}
    plan, arms = _analysed(data_dir, base, cand, budgets)
    sp = arms["angpt"]["speedup"]
    assert (sp["n_exact"], sp["n_not_reached"], sp["n_below_range"]) == (6, 0, 0) and sp["mean"] > 1
    assert not sp["established"]
    line = verdict(plan, "angpt", arms["angpt"])
    assert line.startswith("angpt vs gpt+ at 8Ki tokens: final loss 0.1000 higher")
    assert "no speedup can be claimed: its loss at 8Ki tokens is higher than gpt+'s" in line and "fewer" not in line


def test_one_seed_says_na_and_the_report_prints_paired_intervals(data_dir):
    budgets = [2048, 4096]
    plan, arms = _analysed(data_dir, {2048: [3.0], 4096: [2.8]}, {2048: [2.9], 4096: [2.75]}, budgets)
    line = verdict(plan, "angpt", arms["angpt"])
    assert "final loss 0.0500 lower (1.79%); interval and p-value n/a (one seed)" in line
    assert "p=" not in line and "CI" not in line
    md = render_markdown(plan, _report(plan, arms), {})
    assert "| angpt | -0.1000, n/a (one seed) | -0.0500, n/a (one seed) |" in md
    assert "one seed" in md and "mean ± std" not in md  # no spread claimed over one seed
    assert "only 1 seed: no spread, interval or p-value" in " ".join(warnings(plan, arms, None))

    # Three seeds: the final-loss table gives each budget's paired mean difference, 95% CI and p (the hand
    # example of test_paired_t_test_worked_by_hand at 4Ki), and Welch's p beside it.
    base = {2048: [3.2, 3.3, 3.1], 4096: [3.05, 3.12, 3.02]}
    cand = {2048: [3.1, 3.25, 3.0], 4096: [3.00, 3.10, 2.95]}
    plan, arms = _analysed(data_dir, base, cand, budgets)
    md = render_markdown(plan, _report(plan, arms), {})
    welch = welch_ttest(cand[4096], base[4096]).p
    assert f"-0.0467 [-0.1092, +0.0158], p=0.085 (Welch p={welch:.2g})" in md
    row = arms["angpt"]["budgets"][1]["difference"]
    assert row["paired"]["ci95"] == pytest.approx([-0.10918276146042405, 0.01584942812709094], rel=1e-8)
    line = verdict(plan, "angpt", arms["angpt"])
    assert "95% CI [-0.1092, +0.0158], paired p=0.085 over 3 seeds (Welch p=" in line
    # --stat welch: Welch's interval and p lead, the paired p beside it.
    plan, arms = _analysed(data_dir, base, cand, budgets, stat="welch")
    assert f"Welch p={welch:.2g} over 3 seeds (paired p=0.085)" in verdict(plan, "angpt", arms["angpt"])


def test_unstable_learning_rates_are_flagged(data_dir):
    def health(ratio, spikes):
        return {"max_grad_norm": ratio, "median_grad_norm": 1.0, "max_grad_norm_step": 3, "loss_spikes": spikes,
                "loss_spike_steps": [7] * spikes}  # fmt: skip

    losses = {2048: [3.0, 3.1], 4096: [2.8, 2.9]}
    cases = {
        "calm": (50.0, 0, None),
        "blow-up": (150.0, 0, "largest pre-clip gradient norm 150 is 150x its run's median (4Ki seed 1 step 3)"),
        "spike": (2.0, 1, "1 loss spike(s) (first: 4Ki seed 1 step 7)"),
    }
    for name, (ratio, spikes, why) in cases.items():
        flagged = why is not None
        hl = {"angpt": {4096: {1: health(ratio, spikes)}}, "gpt+": {4096: {1: health(2.0, 0)}}}
        plan, arms = _analysed(data_dir, losses, losses, [2048, 4096], health=hl)
        st = arms["angpt"]["stability"]
        assert st["unstable"] is flagged and st["ratio"] == ratio and st["where"] == "4Ki seed 1 step 3", name
        said = [w for w in warnings(plan, arms, None) if "looks unstable" in w]
        assert len(said) == flagged and (not flagged or said[0].startswith("angpt:") and why in said[0]), name
        md = render_markdown(plan, _report(plan, arms), {})
        assert ("**unstable**" in md) is flagged


# ---------------------------------------------------------------------------------------------- plots
def test_plot_rules(tmp_path, monkeypatch, data_dir):
    assert not wants_log_y([3.5, 3.0, 2.2]) and wants_log_y([9.0, 3.0, 2.2])  # an early spike to 9
    assert spread_note(3) == "band: ±1 std over 3 seeds" and spread_note(1) == "one seed, no spread"
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    plan = make_plan(data_dir, **TINY, budgets=[2048], arms=["gpt+"])
    assert write_plots(plan, {}, {}, tmp_path) == ({}, [NO_MATPLOTLIB]) and not list(tmp_path.iterdir())


# ------------------------------------------------------------------------ multiplicity, intervals, power
def test_holm_by_hand_and_on_the_controls_report():
    """Holm's step-down adjustment worked out by hand; then the 21 paired tests of evidence-cpu-controls: 12 had
    p < 0.05 unadjusted, and at most two survive (Benjamini-Hochberg, less strict, kept two); gpt+cos, once called
    "the only arm significantly ahead", does not."""
    from angpt.stats import holm

    # sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005, 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    arms = json.loads((ROOT / "benchmarks/evidence-cpu-controls/report.json").read_text())["arms"]
    tests = [
        (label, r["budget"], r["difference"]["paired"]["p"])
        for label, e in arms.items()
        for r in e["budgets"]
        if (r.get("difference") or {}).get("paired")
    ]
    assert len(tests) == 21 and sum(p < 0.05 for *_, p in tests) == 12
    adjusted = dict(zip([t[:2] for t in tests], holm([p for *_, p in tests])))
    assert sum(p < 0.05 for p in adjusted.values()) <= 2
    assert adjusted[("gpt+cos", 2097152)] > 0.05


def test_detectable_difference_against_scipy():
    from scipy import stats as sps

    from angpt.stats import detectable_difference, mean_ci95

    for sd, n in ((0.1, 3), (0.04, 5), (0.2, 10)):
        want = (sps.t.ppf(0.975, n - 1) + sps.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
        assert detectable_difference(sd, n) == pytest.approx(want, rel=1e-9)
    xs = [1.2, 1.5, 1.35, 1.4]
    lo, hi = mean_ci95(xs)
    half = sps.t.ppf(0.975, 3) * sps.tstd(xs) / 2
    assert (lo, hi) == pytest.approx((sum(xs) / 4 - half, sum(xs) / 4 + half), rel=1e-9)
    assert detectable_difference(0.1, 1) is None and mean_ci95([1.0]) is None


def test_a_speedup_is_established_only_if_the_difference_survives_holm(data_dir):
    """Lower at every budget, so a speedup on its face; but the largest budget's paired p (~0.03) does not survive
    Holm's correction over the report's three tests: not established, and the verdict says why."""
    from angpt.study.comparison.analyse import correct_for_multiplicity

    budgets = [2048, 4096, 8192]
    base = {2048: [3.0, 3.1, 2.9], 4096: [2.6, 2.7, 2.5], 8192: [2.3, 2.4, 2.2]}
    cand = {2048: [2.7, 2.9, 2.8], 4096: [2.4, 2.45, 2.42], 8192: [2.2, 2.31, 2.05]}
    plan, arms = _analysed(data_dir, base, cand, budgets)
    assert arms["angpt"]["speedup"]["established"]  # before the correction
    family = correct_for_multiplicity(plan, arms)
    assert family["n_tests"] == 3 and "every budget (3 tests)" in family["family"]
    last = arms["angpt"]["budgets"][-1]["difference"]["paired"]
    assert last["p"] < 0.05 <= last["p_holm"]
    assert not arms["angpt"]["speedup"]["established"]
    line = verdict(plan, "angpt", arms["angpt"])
    from angpt.study.comparison.analyse import _p

    assert f"(Holm-adjusted {_p(last['p_holm'])})" in line and "not significant (Holm-adjusted p=" in line


def test_level_only_when_the_interval_lies_within_the_margin(data_dir):
    from angpt.study.comparison.analyse import LEVEL_MARGIN, difference_text

    budgets = [2048, 4096]
    base = {2048: [3.0, 3.1, 2.9], 4096: [2.5, 2.6, 2.4]}
    tight = {2048: [3.0, 3.1, 2.9], 4096: [2.501, 2.603, 2.398]}  # differences +0.001, +0.003, -0.002
    loose = {2048: [3.0, 3.1, 2.9], 4096: [2.45, 2.7, 2.41]}  # differences -0.05, +0.1, +0.01: CI wide, holds 0
    plan, arms = _analysed(data_dir, base, tight, budgets)
    text = difference_text(plan, arms["angpt"]["budgets"][-1])
    assert f"level: the interval lies within +-{LEVEL_MARGIN} nats" in text
    plan, arms = _analysed(data_dir, base, loose, budgets)
    text = difference_text(plan, arms["angpt"]["budgets"][-1])
    assert "level" not in text and "not distinguishable: this design detects differences of" in text
    # inside +-0.2 but not inside +-0.02: not level (a margin ten times too wide would call it level)
    mid = {2048: [3.0, 3.1, 2.9], 4096: [2.53, 2.61, 2.43]}  # differences +0.03, +0.01, +0.03
    plan, arms = _analysed(data_dir, base, mid, budgets)
    lo, hi = arms["angpt"]["budgets"][-1]["difference"]["paired"]["ci95"]
    assert -0.2 < lo and hi < 0.2 and not (-0.02 < lo and hi < 0.02)
    assert "level" not in difference_text(plan, arms["angpt"]["budgets"][-1])


def test_the_level_margin_is_the_one_docs_protocol_states():
    import re

    from angpt.study.comparison.analyse import LEVEL_MARGIN

    protocol = (ROOT / "docs" / "protocol.md").read_text()
    stated = re.search(
        r"called \"level\" only when the interval of their difference lies within \+-([0-9.]+) nats", protocol
    )
    assert stated and float(stated.group(1)) == LEVEL_MARGIN == 0.02


def test_a_holm_family_counts_runs_shared_by_two_arm_names_once():
    """evidence-cpu-v3 named anGPT's runs twice (`angpt` and `angpt_at_2Mi_lr=angpt` at 0.032, the rate angpt's sweep
    chose): 24 paired tests, of which 3 repeat another's runs (identical per-seed losses). The family is the 21
    distinct comparisons, and both names of one get its one adjusted p."""
    from types import SimpleNamespace

    from angpt.stats import holm
    from angpt.study.comparison.analyse import correct_for_multiplicity

    report = json.loads((ROOT / "benchmarks/evidence-cpu-v3/report.json").read_text())
    arms, baseline = report["arms"], report["baseline"]
    distinct: dict = {}  # by the per-seed losses themselves, not by the arms' settings
    for label, e in arms.items():
        for r in e["budgets"] if label != baseline else []:
            if (r.get("difference") or {}).get("paired"):
                distinct.setdefault((r["budget"], tuple(sorted(r["val_loss"].items()))), r["difference"]["paired"]["p"])
    assert len(distinct) == 21
    want = dict(zip(distinct, holm(list(distinct.values()))))
    plan = SimpleNamespace(baseline=baseline, budgets=report["plan"]["budgets"])
    family = correct_for_multiplicity(plan, arms)
    assert family["n_tests"] == 21 and "3 of an arm whose runs are another arm's" in family["family"]
    for label, e in arms.items():
        for r in e["budgets"] if label != baseline else []:
            key = (r["budget"], tuple(sorted(r["val_loss"].items())))
            assert r["difference"]["paired"]["p_holm"] == pytest.approx(want[key], rel=1e-12), (label, r["budget"])


def test_below_the_horizon_no_p_value_is_printed_bare(data_dir):
    """An 8-step comparison's "20% lower, p = 0.0075" invites the reading the horizon rule forbids: in a smoke test's
    verdict every p-value is followed by what it is, and the difference table says none of its p-values is evidence;
    above the horizon neither is said."""
    from angpt.study.comparison.analyse import SMOKE_P, correct_for_multiplicity
    from angpt.study.comparison.render import _difference_intro

    budgets = [2048, 4096]
    base = {2048: [3.0, 3.1, 2.9], 4096: [2.6, 2.7, 2.5]}
    cand = {2048: [2.4, 2.5, 2.35], 4096: [2.0, 2.12, 1.95]}
    plan, arms = _analysed(data_dir, base, cand, budgets)
    family = correct_for_multiplicity(plan, arms)
    smoke, long = verdict(plan, "angpt", arms["angpt"], smoke=True), verdict(plan, "angpt", arms["angpt"])
    assert "p=" in smoke and SMOKE_P in smoke
    assert SMOKE_P not in long and smoke.replace(SMOKE_P, "").removeprefix("smoke test: ") == long
    assert "no difference here is evidence" in _difference_intro(plan, family, smoke=True)
    assert "no difference here is evidence" not in _difference_intro(plan, family)


# ------------------------------------------------------------------------------------- along the run
def test_where_the_lead_comes_from_is_said_in_words():
    """The GPU race's tuning seed at 8e-3 (issue 53, finding 9): anGPT behind GPT+ on validation at steps 396-660,
    ahead only from 792, in the decay. The words name both spans, their share of the run and their sizes."""
    from angpt.study.comparison.lead import along

    steps = [132, 264, 396, 528, 660, 792, 924, 1052]
    base = dict(zip(steps, [4.0, 3.0, 2.50, 2.30, 2.10, 1.90, 1.75, 1.6757]))
    diffs = [-0.004, -0.001, +0.027, +0.036, +0.009, -0.030, -0.060, -0.0793]
    arm = {s: base[s] + d for s, d in zip(steps, diffs)}
    points = along(base, arm, 1052)
    assert [round(p["diff"], 4) for p in points] == diffs and points[-1]["fraction"] == 1.0
    text = words("angpt", "gpt+", points, 1052)
    assert text == (
        "angpt against gpt+ (validation loss, angpt - gpt+): ahead from step 132 to 264 (13%-25% of the run), "
        "-0.004 to -0.001; behind from step 396 to 660 (38%-63% of the run), +0.009 to +0.036; ahead from step 792 "
        "to the end (75%-100% of the run), -0.079 to -0.030"
    )
    assert words("angpt", "gpt+", points[-1:], 1052).endswith("ahead at step 1,052 (100%), -0.079")


def test_what_the_seeds_detect_is_stated_at_their_spread_and_at_the_planning_one():
    """80% power, paired t at alpha 0.05: (t_.975 + t_.8) sd / sqrt(n); at the planning spread 0.0245, five seeds
    detect about 0.04 nats and three about 0.076 (issue 53, finding 7: three seeds suffice for a 0.07-nat difference
    only if the spread is at most 0.0195). A one-seed plan without a tuning seed tests nothing: no section."""
    from angpt.study.comparison.lead import PLANNING_SD, power, power_text

    class P:  # the plan's fields power() reads
        baseline, seeds, tuning_seed = "gpt+", [0, 1, 2], 1000

    arms = {"gpt+": {}, "angpt": {"budgets": [{"difference": {"n_pairs": 3, "detectable": 0.05}}]}}
    row = power(P, arms)["angpt"]
    t = {2: (4.303, 1.061), 4: (2.776, 0.941)}  # t quantiles .975 and .8 at 2 and 4 degrees of freedom
    assert row["detectable_planning_sd"] == pytest.approx(sum(t[2]) * PLANNING_SD / 3**0.5, rel=1e-3)
    assert row["detectable_five"] == pytest.approx(sum(t[4]) * PLANNING_SD / 5**0.5, rel=1e-3)
    assert round(row["detectable_five"], 3) == 0.041 and round(row["detectable_planning_sd"], 3) == 0.076
    assert sum(t[2]) * 0.0195 / 3**0.5 == pytest.approx(0.0604, abs=1e-3)  # 0.0195 is where three reach ~0.06-0.07
    text = power_text("angpt", row)
    assert "3 reported seeds, which detect 0.050 nats at the spread they show (0.076" in text
    assert "five seeds detect 0.041 nats" in text and "Holm" not in text
    one = power(P, {"gpt+": {}, "angpt": {"budgets": [{"difference": {"n_pairs": 1}}]}})["angpt"]
    assert "1 reported seed: no spread to test yet; five seeds detect 0.041" in power_text("angpt", one)

    class Demo:
        baseline, seeds, tuning_seed = "gpt+", [0], None

    assert power(Demo, arms) == {}
