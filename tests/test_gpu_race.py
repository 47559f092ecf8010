"""Issue 37's GPU race, rehearsed on the CPU: the loan planner (benchmarks/gpu/loan.py), the machine corpus
(corpus.py) and the report over every loan (race_report.py).

The smoke cycle runs three loans of the `loan-smoke` profile as a GPU would (each brings back its results.json, which
the next reads as if committed); the report tests feed race_report hand-made loans whose answers are known."""

import copy
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
RUN = GPU / "run.sh"


def _module(name):
    """A module of benchmarks/gpu (not a package: its scripts import each other by name, as the kit runs them)."""
    if str(GPU) not in sys.path:
        sys.path.insert(0, str(GPU))
    return importlib.import_module(name)


rr = _module("race_report")
loan = _module("loan")
corpus = _module("corpus")


def kit(*args, timeout=600):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(RUN), *args], capture_output=True, text=True, env=env, timeout=timeout)


# ------------------------------------------------------------------------------------------------ the smoke cycle
@pytest.fixture(scope="module")
def cycle(tmp_path_factory):
    """Three loans on a CPU, each reading the loans before it: 3 pieces, then 8, then the rest."""
    base = tmp_path_factory.mktemp("race")
    root = base / "gpu-race"
    root.mkdir()
    reports = []
    for i, pieces in enumerate(("3", "8", "100"), 1):
        out = base / f"out{i}"
        res = kit(
            str(out), "--loan", "--smoke", "--race-root", str(root), "--work", str(base / f"w{i}"), "--pieces", pieces
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        (root / f"loan-{i}").mkdir()
        shutil.copy(out / "results.json", root / f"loan-{i}" / "results.json")
        reports.append((out / "report.md").read_text())
    res = subprocess.run(
        [sys.executable, str(GPU / "race_report.py"), "--root", str(root)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return root, rr.load_loans(root), reports


def _keys(loan_record):
    return [p["key"] for p in loan_record["pieces"] if p["status"] == "done"]


def test_each_loan_takes_the_next_pieces_in_the_issues_order(cycle):
    root, loans, _ = cycle
    first, second, third = (_keys(x) for x in loans)
    assert first[0].startswith("speed") and [k.split()[0] for k in first[1:]] == ["screen", "screen"]
    assert all(k.startswith("tune") for k in second)  # the screen was done: the tuning comes next
    stages = [k.split()[0] for k in third]
    assert stages[-1] == "seed" and "tune" not in stages[stages.index("seed") :]  # seeds only after every rate
    done = [k for x in loans for k in _keys(x)]
    assert len(done) == len(set(done))  # nothing ran twice
    assert loans[0]["speed"][0]["status"] == "done" and loans[0]["speed"][0]["rows"][0]["profile"]
    assert loans[0]["data"]["corpus_fingerprint"] and loans[2]["data"]["same_image_as"] == ["loan-1", "loan-2"]


def test_the_seeds_run_at_the_rates_the_tuning_chose_by_validation_loss(cycle):
    root, loans, _ = cycle
    race = loans[0]["settings"]["race"]
    tune = [r for r in rr.runs(loans, "tune")]
    for arm in race["arms"]:
        mine = [r for r in tune if r["arm"] == arm]
        best = min(mine, key=lambda r: r["val_loss"])
        assert {float(x) for x in race["grid"][arm]} <= {r["lr"] for r in mine}  # >= 3 rates each
        for r in rr.runs(loans, "seed"):
            if r["arm"] == arm:
                assert r["lr"] == best["lr"]
    report = json.loads((root / "report.json").read_text())
    assert report["seeds"] == [0, 1]
    rows = report["arms"]["angpt"]["budgets"]
    assert [r["steps"] for r in rows] == [12, 24] and all(r["seeds"] == [0, 1] for r in rows)
    assert all(r["verdict"] == "two-seed screen" for r in rows)
    assert not report["horizon"]["evidence"]
    md = (root / "report.md").read_text()
    assert "a smoke test, not evidence" in md and (root / "race.png").exists()


def test_a_loan_with_other_race_settings_is_refused_in_one_line(cycle, tmp_path):
    root, _, _ = cycle
    text = (GPU / "settings.yaml").read_text()
    changed = text.replace("    steps: 24\n    budgets: [0.5, 1.0]", "    steps: 30\n    budgets: [0.5, 1.0]")
    assert changed != text
    (tmp_path / "s.yaml").write_text(changed)
    res = kit(
        str(tmp_path / "o"), "--loan", "--smoke", "--race-root", str(root), "--settings", str(tmp_path / "s.yaml")
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "this loan has other race settings than loan loan-2: race.steps=30 (there 24)" in res.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


# ------------------------------------------------------------------------------------------------ the report
RACE = {
    "arms": ["gpt+", "angpt"],
    "extra_arms": [],
    "preset": "tiny",
    "model": {"d_model": 384, "n_layers": 8, "n_heads": 6},
    "seq_len": 1024,
    "batch_tokens": 131072,
    "micro_batch": 64,
    "steps": 1450,
    "budgets": [0.5, 1.0],
    "tuning_seed": 1000,
    "grid": {"gpt+": [1e-3, 2e-3, 4e-3], "angpt": [2e-3, 4e-3, 8e-3]},
    "seeds": [0, 1, 2, 3, 4],
    "dtype": "bf16",
}
CORPUS = {"tokenizer": "bpe:8192", "val_fraction": 0.01, "test_fraction": 0.01, "train_tokens": 195000000}
PARAMS = {"params": 25_000_000, "params_non_embedding": 18_900_000}


def _run(arm, lr, seed, steps, val, test=None):
    curve = [{"step": steps, "tokens": steps * 131072, "val_loss": val}]
    return {"arm": arm, "lr": lr, "seed": seed, "steps": steps, "status": "finished", "val_loss": val,
            "test_loss": val if test is None else test, **PARAMS, "curve": curve}  # fmt: skip


def _loan(name, pieces, race=RACE, fp="aaa"):
    return {"loan": name, "settings": {"race": race, "corpus": CORPUS}, "revision": "r1",
            "data": {"corpus_fingerprint": fp, "data_fingerprint": fp + "-tok"}, "pieces": pieces}  # fmt: skip


def _tuning(gpt=(3.30, 3.20, 3.25), angpt=(3.40, 3.15, 3.18)):
    runs = [_run("gpt+", lr, 1000, 1450, v) for lr, v in zip((1e-3, 2e-3, 4e-3), gpt)]
    runs += [_run("angpt", lr, 1000, 1450, v) for lr, v in zip((2e-3, 4e-3, 8e-3), angpt)]
    return [{"stage": "tune", "key": f"t{i}", "status": "done", "runs": [r]} for i, r in enumerate(runs)]


# per seed: (gpt+ at 725, angpt at 725, gpt+ at 1450, angpt at 1450), test losses
SEEDS = {0: (3.50, 3.46, 3.30, 3.24), 1: (3.52, 3.47, 3.31, 3.26), 2: (3.49, 3.45, 3.29, 3.25)}


def _seed_pieces(seed, losses, lrs=(2e-3, 4e-3)):
    g725, a725, g1450, a1450 = losses
    return [
        {"stage": "seed", "key": f"s{seed}-1450", "status": "done",
         "runs": [_run("gpt+", lrs[0], seed, 1450, 9.0, g1450), _run("angpt", lrs[1], seed, 1450, 9.0, a1450)]},
        {"stage": "seed", "key": f"s{seed}-725", "status": "done",
         "runs": [_run("gpt+", lrs[0], seed, 725, 9.0, g725), _run("angpt", lrs[1], seed, 725, 9.0, a725)]},
    ]  # fmt: skip


def _three_loans():
    return [
        _loan("2026-12-01-H100", _tuning()),
        _loan("2026-12-02-H100", _seed_pieces(0, SEEDS[0]) + _seed_pieces(1, SEEDS[1])),
        _loan("2026-12-03-H200", _seed_pieces(2, SEEDS[2])),
    ]


def test_the_report_pairs_seeds_across_loans_against_an_independent_reference():
    from scipy import stats

    a = rr.analyse(_three_loans())
    assert a["rates"]["gpt+"]["lr"] == 2e-3 and a["rates"]["angpt"]["lr"] == 4e-3
    assert a["seeds"] == [0, 1, 2] and not a["stale"] and not a["warnings"]
    rows = a["arms"]["angpt"]["budgets"]
    pvals = []
    for row, (gi, ai) in zip(rows, ((0, 1), (2, 3))):
        g, c = [SEEDS[s][gi] for s in (0, 1, 2)], [SEEDS[s][ai] for s in (0, 1, 2)]
        ref = stats.ttest_rel(c, g)
        assert row["seeds"] == [0, 1, 2]
        assert row["mean_diff"] == pytest.approx(sum(x - y for x, y in zip(c, g)) / 3)
        assert row["test"]["p"] == pytest.approx(ref.pvalue, rel=1e-6)
        lo, hi = ref.confidence_interval(0.95)
        assert row["test"]["ci95"] == pytest.approx([lo, hi], rel=1e-6)
        pvals.append(ref.pvalue)
    # Holm over the two budgets: the smaller p doubled, the larger kept at least as large
    small, large = sorted(pvals)
    assert sorted(r["p_holm"] for r in rows) == pytest.approx(
        sorted([min(1, 2 * small), max(min(1, 2 * small), large)])
    )
    # the speedup of docs/protocol.md, seed 0 by hand: gpt+ at 1450 (3.30) is reached by angpt between 725 (3.46)
    # and 1450 (3.24), log-linearly; gpt+ at 725 (3.50) is below angpt's range (a bound, left out)
    d0, d1 = 725 * 131072, 1450 * 131072
    reach = math.exp(math.log(d0) + (3.30 - 3.46) * (math.log(d1) - math.log(d0)) / (3.24 - 3.46))
    sp = a["arms"]["angpt"]["speedup"]
    assert sp["per_seed"][0]["speedup"] == pytest.approx(d1 / reach)
    assert sp["n_seeds"] == 3 and sp["below_range"] == 3 and sp["ci95"] is not None


def test_verdict_words_follow_the_protocol():
    significant = {"mean_diff": -0.05, "ci95": [-0.07, -0.03]}
    assert rr.verdict_word(2, significant, 0.001) == "two-seed screen"
    assert rr.verdict_word(1, None, None) == "one-seed screen"
    assert rr.verdict_word(3, significant, 0.01) == "established"
    assert rr.verdict_word(3, {"mean_diff": 0.05, "ci95": [0.03, 0.07]}, 0.01) == "behind"
    assert rr.verdict_word(5, {"mean_diff": 0.0, "ci95": [-0.019, 0.019]}, 0.9) == "level"
    # inside +-0.2 but not +-0.02 (docs/protocol.md's margin): not level
    assert rr.verdict_word(5, {"mean_diff": 0.0, "ci95": [-0.05, 0.05]}, 0.9) == "not distinguishable"
    assert rr.verdict_word(5, significant, 0.06) == "not distinguishable"  # raw p small, Holm's not


def test_rates_are_chosen_by_validation_loss_and_an_edge_extends_the_grid():
    tune = rr.runs([_loan("a", _tuning())], "tune")
    # the test loss disagrees with the validation loss: selection must not look at it
    for r in tune:
        r["test_loss"] = 10 - r["val_loss"]
    rates = rr.select_rates(RACE, tune)
    assert rates["gpt+"]["lr"] == 2e-3 and rates["gpt+"]["finished"] and rates["gpt+"]["edge"] is None
    edge = rr.select_rates(RACE, rr.runs([_loan("a", _tuning(gpt=(3.3, 3.2, 3.1)))], "tune"))["gpt+"]
    assert edge["lr"] == 4e-3 and edge["todo"] == [8e-3] and not edge["finished"]
    low = rr.select_rates(RACE, rr.runs([_loan("a", _tuning(angpt=(3.1, 3.2, 3.3)))], "tune"))["angpt"]
    assert low["todo"] == [1e-3]
    # after MAX_EXTENSIONS points beyond the grid the sweep stops, flagged
    pieces = _tuning(gpt=(3.3, 3.2, 3.1))
    pieces += [{"stage": "tune", "key": "x", "status": "done", "runs": [_run("gpt+", lr, 1000, 1450, v)]}
               for lr, v in ((8e-3, 3.0), (1.6e-2, 2.9))]  # fmt: skip
    out = rr.select_rates(RACE, rr.runs([_loan("a", pieces)], "tune"))["gpt+"]
    assert out["finished"] and out["edge"] == "high" and out["lr"] == 1.6e-2
    none_yet = rr.select_rates(RACE, [])["angpt"]
    assert none_yet["lr"] is None and none_yet["todo"] == [2e-3, 4e-3, 8e-3]


def test_mismatched_settings_are_refused_and_stale_or_foreign_runs_are_named():
    loans = _three_loans()
    other = copy.deepcopy(RACE)
    other["batch_tokens"] = 65536
    loans[2] = _loan("2026-12-03-H200", _seed_pieces(2, SEEDS[2]), race=other)
    with pytest.raises(
        rr.RaceError,
        match=r"loan 2026-12-03-H200 has .* than loan 2026-12-01-H100: race.batch_tokens=65536 \(there 131072\)",
    ):
        rr.analyse(loans)
    # a seed run at a rate the tuning no longer chooses is left out and listed
    loans = _three_loans()
    loans.append(_loan("2026-12-04-H100", _seed_pieces(3, SEEDS[0], lrs=(1e-3, 4e-3)), fp="bbb"))
    a = rr.analyse(loans)
    assert {(r["arm"], r["seed"]) for r in a["stale"]} == {("gpt+", 3)}
    assert 3 not in a["arms"]["angpt"]["budgets"][0]["seeds"]
    assert any("the image changed the corpus" in w and "2026-12-04-H100" in w for w in a["warnings"])
    md = rr.render(a)
    assert "Left out (run at a rate no longer chosen)" in md and "gpt+ @ 0.001, seed 3" in md


def test_the_report_cli_refuses_in_one_line(tmp_path):
    loans = _three_loans()
    loans[1]["settings"]["race"] = {**RACE, "steps": 1000}
    for x in loans:
        (tmp_path / x["loan"]).mkdir()
        (tmp_path / x["loan"] / "results.json").write_text(json.dumps(x))
    res = subprocess.run(
        [sys.executable, str(GPU / "race_report.py"), "--root", str(tmp_path)], capture_output=True, text=True
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "race.steps=1000" in res.stderr
    assert not (tmp_path / "report.md").exists()


# ------------------------------------------------------------------------------------------------ the planner
LOAN_CFG = {
    "deadline_s": 585,
    "assume": {"corpus_s_per_mtoken": 0.5, "screen_step_s": 2.5, "race_step_s": 0.1, "race_setup_s": 30},
    "corpus": CORPUS,
    "speed": {"budget_s": 300, "shapes": [{"preset": "gpt2-small", "batch": 16, "seq_len": 1024, "compile": False}]},
    "screen": {"preset": "gpt2-small", "seq_len": 1024, "batch_tokens": 524288, "micro_batch": 32, "steps": 100,
               "lr": 2e-3, "runs": [["angpt[input_norm=none]", 0], ["angpt", 0]]},
    "race": {**RACE, "preset": "gpt2-small", "extra_arms": ["ngpt"], "grid": {**RACE["grid"], "ngpt": [4e-3]},
             "defaults_settled": True},
}  # fmt: skip


class FakeResults:
    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value


def _simulate(cfg, loans, seconds, clock, **kw):
    """run_loan with executors that take `seconds` of a fake clock per run and return losses from a table."""

    def race_run(data, run):
        clock[0] += seconds
        return {"status": "finished", "val_loss": 3.5 + abs(math.log2(run.lr / 4e-3)) / 10, "test_loss": 3.5,
                **PARAMS, "step_time": 0.1}  # fmt: skip

    def screen_run(data, run, end):
        clock[0] += seconds
        return {"status": "finished", "step_time": 2.5, "records": []}

    res = FakeResults()
    loan.run_loan(
        cfg,
        loans,
        res,
        clock[0] + cfg["deadline_s"],
        make_data=lambda n: {"source": "machine", "tokens": {"train": n}, "corpus_s": 1, "prepare_s": 1},
        speed=lambda shapes: clock.__setitem__(0, clock[0] + 10),
        screen_run=screen_run,
        race_run=race_run,
        **kw,
    )
    return res.data


def test_the_planner_keeps_the_order_and_starts_only_what_fits(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(loan.time, "time", lambda: clock[0])
    cfg = copy.deepcopy(LOAN_CFG)
    cfg["race"]["defaults_settled"] = False
    data = _simulate(cfg, [], 200, clock)
    # speed, then screens of ~270 s each (100 steps at 2.5 s): 10 + corpus + 200 + 200 fits 585 - 20; nothing else
    assert [p["key"].split()[0] for p in data["pieces"]] == ["speed", "screen", "screen"]
    assert any("waits for the deviation screen's decision" in n for n in data["plan"]["notes"])
    # the next loan: the screen is done, defaults settled: tuning, required pieces before nGPT's optional one
    done = {
        "loan": "l1",
        "settings": cfg,
        "pieces": data["pieces"],
        "speed": [{**cfg["speed"]["shapes"][0], "status": "done"}],
    }
    cfg["race"]["defaults_settled"] = True
    pieces, _ = loan.plan(cfg, [done])
    assert [p.stage for p in pieces[:6]] == ["tune"] * 6 and not any(p.optional for p in pieces[:6])
    assert pieces[6].optional and pieces[6].runs[0].arm == "ngpt"
    assert all(p.stage != "seed" for p in pieces)  # no seed before the rates are chosen
    # a race run is estimated at 1450 x 0.1 x 1.05 + 30 = 182 s, the corpus at ~108 s; runs that take 200 s: after
    # two, 165 s are left, and no other piece fits
    clock[0] = 5000.0
    data = _simulate(cfg, [done], 200, clock)
    started = [p["key"] for p in data["pieces"]]
    assert len(started) == 2 and all(k.startswith("tune") for k in started)
    assert data["waiting"] and data["waiting"][0].startswith("tune")


def test_a_compiled_speed_shape_is_planned_with_its_compiling_and_alone():
    """The 2026-11-27 loan (H200) timed gpt2-small eager (35.5 s) and compiled (211.7 s) and the 0.5B eager (68.3 s);
    its 0.5B compiled shape, planned as one piece with the rest at a share of the budget (105 s), was cut off by
    the command's limit. Each shape is now its own piece, a compiled one estimated as its eager twin plus the
    compiling measured elsewhere (with a quarter more): 68.3 + 1.25 x 176.2 = 288.6 s."""
    shapes = [{"preset": p, "batch": b, "seq_len": t, "compile": c}
              for p, b, t in (("gpt2-small", 16, 1024), ("0.5B", 8, 2048)) for c in (False, True)]  # fmt: skip
    cfg = {**copy.deepcopy(LOAN_CFG), "speed": {"budget_s": 420, "shapes": shapes}}
    first, _ = loan.plan(cfg, [])
    assert [p.key for p in first[:4]] == [f"speed {loan._shape_name(s)}" for s in shapes]
    assert [p.estimate_s for p in first[:4]] == [105.0] * 4  # nothing measured yet: a share of the budget each
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu-race" / "2026-11-27-H200" / "results.json"
    measured = json.loads(root.read_text())
    assert [s["seconds"] for s in measured["speed"]] == [35.5, 211.7, 68.3]
    # the race runs compiled: its step is estimated at GPT+'s compiled MFU (46%; eager: 23%), x 0.7
    race = {**cfg["race"], "compile": True}
    per_step, how = loan.race_step_estimate(race, [measured], cfg["assume"])
    peak = measured["env"]["bf16_matmul_tflops"] * 1e12
    mfu = measured["speed"][1]["rows"][0]["train_flops"] / peak
    assert how == "GPT+'s measured MFU compiled 46% x 0.7"
    assert per_step == pytest.approx(loan.race_flops_per_token(race) * race["batch_tokens"] / (0.7 * mfu * peak))
    assert loan.race_step_estimate({**race, "compile": False}, [measured], cfg["assume"])[1].endswith("eager 23% x 0.7")
    pieces, _ = loan.plan(cfg, [measured])
    assert pieces[0].key == "speed 0.5B 8x2048 compiled" and pieces[0].shapes == [shapes[3]]
    assert pieces[0].estimate_s == pytest.approx(68.3 + 1.25 * (211.7 - 35.5))
    assert pieces[1].stage == "screen"
    # a fix to measure again: a shape with `since` after the loan's start is planned again, at its time and a tenth
    again = copy.deepcopy(cfg)
    again["speed"]["shapes"][1]["since"] = "2026-11-27 03:40"  # the loan started at 02:35:44
    pieces, _ = loan.plan(again, [measured])
    assert [p.key for p in pieces[:2]] == ["speed gpt2-small 16x1024 compiled", "speed 0.5B 8x2048 compiled"]
    assert pieces[0].estimate_s == pytest.approx(1.1 * 211.7)
    again["speed"]["shapes"][1]["since"] = "2026-11-27 02:00"
    assert loan.plan(again, [measured])[0][0].key == "speed 0.5B 8x2048 compiled"


def test_mfu_is_read_against_the_environment_steps_peak_and_the_datasheets():
    """The 2026-11-27 loan's bench measured its peak with single 2048-size matmuls, 404 TFLOP/s on an H200 whose
    8192-size matmuls ran at 781.5 (the environment step): its rows say 91% MFU for GPT+ compiled. The report
    divides by the environment's peak instead (360 TFLOP/s: 46%) and gives the datasheet's (989.5: 36%) beside it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import report

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu-race" / "2026-11-27-H200" / "results.json"
    d = json.loads(root.read_text())
    compiled = d["speed"][1]
    assert compiled["compile"] and compiled["rows"][0]["arch"] == "gpt+" and compiled["rows"][0]["peak_fraction"] > 0.9
    lines = report.targets(compiled, d["env"])
    assert lines[0].startswith("GPT+ compiled at gpt2-small: 46% of the measured bf16 matmul peak")
    assert "met; 36% of the datasheet's" in lines[0]
    table = "\n".join(report._speed(d["speed"], d["env"]))
    assert "| gpt+ | 191M | 46.6 | 1.000 | 351,855 | 360 | 46% | 36% | 11.8 | 1.000 |" in table


def test_optional_pieces_fill_room_that_a_required_piece_does_not_fit(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(loan.time, "time", lambda: clock[0])
    cfg = copy.deepcopy(LOAN_CFG)
    done = {"loan": "l1", "settings": cfg, "speed": [{**cfg["speed"]["shapes"][0], "status": "done"}],
            "pieces": [{"stage": "screen", "key": "s", "status": "done",
                        "runs": [{"arm": a, "lr": 2e-3, "seed": 0, "steps": 100, "status": "finished"}
                                 for a in ("angpt[input_norm=none]", "angpt")]}]}  # fmt: skip
    # gpt+ at its three rates and angpt at two are done: angpt at 8e-3 is the one required tuning run left
    done["pieces"] += _tuning()[:5]
    # time for the corpus (~108 s) and two runs of ~182 s
    cfg["deadline_s"] = 108 + 182 + 182 + 20 + 5
    pieces, _ = loan.plan(cfg, [done])  # gpt+ is tuned, angpt is not: no reported seed yet, not even gpt+'s
    assert [p.key for p in pieces if not p.optional] == ["tune angpt lr=0.008 seed=1000 steps=1450"]
    assert pieces[0].key.startswith("tune angpt") and all(p.optional for p in pieces[1:])
    # the required run first (150 s); of what is left (327 s) the seed pair at the full budget (364 s) does not fit,
    # the pair at half of it (212 s) does: a required piece, before nGPT's optional tuning run
    data = _simulate(cfg, [done], 150, clock)
    keys = [p["key"] for p in data["pieces"]]
    assert keys[0].startswith("tune angpt lr=0.008") and keys[1].startswith("seed 0 steps=725 gpt+@0.002, angpt")
    # a loan whose room holds no required piece: an optional one fills it. Speed shape marked optional (~100 s):
    # the screen's first run (this corpus ~37 s + 270 s) does not fit 300 s, the optional shape does
    cfg = copy.deepcopy(LOAN_CFG)
    cfg["race"]["defaults_settled"] = False
    cfg["speed"] = {"budget_s": 100, "shapes": [{**cfg["speed"]["shapes"][0], "optional": True}]}
    cfg["deadline_s"] = 20 + 300
    pieces, _ = loan.plan(cfg, [])
    assert [p.stage for p in pieces] == ["screen", "screen", "speed"] and pieces[-1].optional
    data = _simulate(cfg, [], 100, clock)
    assert [p["key"] for p in data["pieces"]] == ["speed gpt2-small 16x1024"]


# ------------------------------------------------------------------------------------------------ the corpus
def _tree(root: Path, files: dict):
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_the_corpus_is_deterministic_deduplicated_and_fingerprinted(tmp_path):
    text = "def f(x):\n    return x + 1\n" * 20  # ~560 bytes
    files = {
        "pkg/a.py": text,
        "pkg/b.py": text,  # a vendored copy: kept once
        "pkg/c.h": "#define X 1\n" * 40,
        "pkg/tiny.py": "x = 1\n",  # too small
        "pkg/bin.txt": b"\x00" * 400,  # binary
        "pkg/latin.txt": "caf\xe9 ".encode("latin-1") * 100,  # not UTF-8
        "pkg/min.js": "var a=1;" * 200,  # one long line: minified
        "pkg/data.bin": "not a text suffix " * 40,
        "pkg/__pycache__/a.py": text + "#",
    }
    _tree(tmp_path / "one" / "site", files)
    _tree(tmp_path / "two" / "site", files)  # the same files under another prefix
    roots = [("site-packages", tmp_path / "one" / "site")]
    a = corpus.build_corpus(tmp_path / "a.jsonl", max_bytes=10**9, workers=1, roots=roots)
    b = corpus.build_corpus(
        tmp_path / "b.jsonl", max_bytes=10**9, workers=4, roots=[("site-packages", tmp_path / "two" / "site")]
    )
    assert a["files"] == 2 and a["duplicates"] == 1 and a["skipped"] == 4 and a["complete"]
    assert a["corpus_fingerprint"] == b["corpus_fingerprint"] and a["image_fingerprint"] == b["image_fingerprint"]
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    docs = [json.loads(line)["text"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert docs == [text, "#define X 1\n" * 40]
    # a changed file changes the fingerprint; a byte cap keeps the first files in order
    (tmp_path / "two" / "site" / "pkg" / "c.h").write_text("#define X 2\n" * 40)
    c = corpus.build_corpus(
        tmp_path / "c.jsonl", max_bytes=10**9, workers=2, roots=[("site-packages", tmp_path / "two" / "site")]
    )
    assert c["corpus_fingerprint"] != a["corpus_fingerprint"]
    d = corpus.build_corpus(tmp_path / "d.jsonl", max_bytes=100, workers=2, roots=roots)
    assert d["files"] == 1 and not d["complete"]
    assert d["corpus_fingerprint"] != a["corpus_fingerprint"] and d["image_fingerprint"] == a["image_fingerprint"]


def test_the_race_data_has_held_out_splits_and_the_same_fingerprint_twice(tmp_path, monkeypatch):
    text = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(30))
    files = {f"pkg/m{i:03d}.py": text.replace("x", f"v{i}") for i in range(300)}
    _tree(tmp_path / "site", files)
    monkeypatch.setattr(corpus, "default_roots", lambda: [("site-packages", tmp_path / "site")])
    spec = {"tokenizer": "bpe:300", "val_fraction": 0.05, "test_fraction": 0.05, "train_tokens": 40_000}
    one = corpus.prepare_race_data(spec, tmp_path / "w1", workers=2)
    two = corpus.prepare_race_data(spec, tmp_path / "w2", workers=1)
    assert one["data_fingerprint"] == two["data_fingerprint"] and one["corpus_fingerprint"] == two["corpus_fingerprint"]
    assert one["documents"]["val"] > 0 and one["documents"]["test"] > 0 and one["tokens"]["train"] >= 40_000


def test_a_seed_pair_that_no_loan_holds_runs_one_arm_per_loan():
    cfg = copy.deepcopy(LOAN_CFG)
    cfg["race"]["extra_arms"] = []
    tuned = {"loan": "l1", "settings": cfg, "pieces": _tuning()}
    pieces, _ = loan.plan(cfg, [tuned])  # a run ~182 s, the corpus ~108 s: a pair fits 585 s
    first = [p for p in pieces if p.stage == "seed"][0]
    assert [r.arm for r in first.runs] == ["gpt+", "angpt"] and first.runs[0].steps == 1450
    cfg["deadline_s"] = 400  # room for 272 s of runs: one at a time
    pieces, _ = loan.plan(cfg, [tuned])
    seeds = [p for p in pieces if p.stage == "seed"]
    assert [[r.arm for r in p.runs] for p in seeds[:2]] == [["gpt+"], ["angpt"]]
    assert seeds[0].runs[0].lr == 2e-3 and seeds[1].runs[0].lr == 4e-3 and seeds[0].runs[0].seed == 0
