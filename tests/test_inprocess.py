"""The in-process executor (`--executor inprocess`, study/inprocess.py): every run in one process, each arm's model
built and compiled once, runs in the plan's order, none started that cannot end before the deadline."""

from __future__ import annotations

import json

import pytest

from angpt.cli import main
from angpt.study.inprocess import InProcess, groups, parse_deadline, run_groups
from angpt.study.store import RunSpec

TINY = ["--preset", "tiny", "--batch-tokens", "256", "--seq-len", "32", "--micro-batch", "8", "--eval-batches", "2",
        "--set", "model.d_model=32", "model.n_layers=2", "model.n_heads=2"]  # fmt: skip


def compare(data_dir, out, *extra):
    return ["compare", "--data", str(data_dir), "--out", str(out), "--arms", "gpt+,angpt", "--quiet", *TINY, *extra]


def records(out) -> dict[str, dict]:
    return {str(p.parent.relative_to(out)): json.loads(p.read_text()) for p in out.glob("runs/**/result.json")}


def test_its_runs_equal_separate_angpt_train_runs(data_dir, tmp_path):
    """A comparison in one process (a sweep of two rates and two seeds at two budgets, each arm's model built once
    and set in place for every run) gives, run for run, the losses of separate `angpt train` runs of the same
    settings, each building its own model (eager, on the CPU: exactly). Checked failing with the weights not reset
    between runs (build's reinitialise skipped)."""
    from angpt.study.stored import load_plan
    from angpt.train.config import load_run_config
    from angpt.train.loop import train
    from angpt.train.metrics import read_metrics

    out = tmp_path / "study"
    args = compare(data_dir, out, "--budgets", "2Ki,3Ki", "--seeds", "0,1", "--lr-grid", "1,2",
                   "--max-extensions", "0", "--executor", "inprocess")  # fmt: skip
    assert main(args) == 0
    got = records(out)
    assert len(got) == 2 * (2 + 2 * 2 + 3)  # per arm: the sweep's 2 rates, 2 seeds x 2 budgets, the LR check's 3
    reused = [r["model_reused"] for r in got.values()]
    assert reused.count(False) == 2, reused  # one model an arm: every other run borrowed it
    plan = load_plan(out)
    for name, rec in sorted(got.items())[::3]:  # every third: both arms, both budgets, sweep and reported seeds
        spec = RunSpec(rec["arm"], rec["budget"], rec["seed"], rec["lr"])
        over = dict(plan.run_overrides(plan.arm(spec.arm), spec.budget, spec.seed, spec.lr, tmp_path / "ref" / name))
        cfg = load_run_config(None, {**over, "train.progress": False})
        ref = train(cfg)  # its own model, built afresh
        assert rec["val_loss"] == ref.val_loss and rec["test_loss"] == ref.test_loss, name
        mine = [r["loss"] for r in read_metrics(out / name) if "loss" in r]
        assert mine == [r["loss"] for r in read_metrics(ref.out) if "loss" in r], name


def test_a_compiled_arm_compiles_once_for_all_its_runs(data_dir, tmp_path):
    """Every run of an arm after its first reuses the first's compiled forward and weight constraint: no graph is
    compiled again (aot_eager, Dynamo's error_on_recompile), and the losses are those of the same runs eager (float
    tolerance)."""
    import torch
    from torch._dynamo.utils import counters

    import angpt.study.execute as execute

    def study(out, compiled):
        return compare(data_dir, out, "--arms", "angpt", "--budgets", "1Ki", "--seeds", "0", "--lr-grid", "1,2",
                       "--max-extensions", "0", "--executor", "inprocess",
                       "--set", f"train.compile={compiled}")  # fmt: skip

    real_compile, real_run, graphs = torch.compile, execute.execute_run, []

    def watched(plan, report_dir, spec, models=None):
        if not graphs:  # the first run compiles
            graphs.append(None)
            return real_run(plan, report_dir, spec, models)
        graphs.append(counters["stats"]["unique_graphs"])
        with torch._dynamo.config.patch(error_on_recompile=True):
            return real_run(plan, report_dir, spec, models)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": "aot_eager"}))
        mp.setattr(execute, "execute_run", watched)
        assert main(study(tmp_path / "compiled", "true")) == 0
    assert len(graphs) == 3 and graphs[1] >= 2 and graphs[1] == graphs[2]  # forward and constraint, once
    assert main(study(tmp_path / "eager", "false")) == 0
    compiled, eager = records(tmp_path / "compiled"), records(tmp_path / "eager")
    assert all(r["compiled"] for r in compiled.values()) and not any(r["compiled"] for r in eager.values())
    assert [r["model_reused"] for _, r in sorted(compiled.items())].count(False) == 1
    for name, rec in eager.items():
        assert compiled[name]["val_loss"] == pytest.approx(rec["val_loss"], rel=1e-5), name


def test_a_group_that_cannot_end_before_the_deadline_is_not_started():
    """Runs in order, each started only if its estimate ends before the deadline; a reported seed's runs at one budget
    start together or not at all, and a later run that fits still goes. The clock is the estimates' own."""
    from types import SimpleNamespace

    plan = SimpleNamespace(seeds=[0, 1], tuning_seed=1000)
    specs = [RunSpec("gpt+", 100, 1000, 1e-3), RunSpec("angpt", 100, 1000, 2e-3),  # sweep runs: each alone
             RunSpec("gpt+", 200, 0, 1e-3), RunSpec("angpt", 200, 0, 2e-3),  # seed 0's pair at 200
             RunSpec("gpt+", 100, 0, 1e-3), RunSpec("angpt", 100, 0, 2e-3)]  # fmt: skip
    assert [len(g) for g in groups(plan, specs)] == [1, 1, 2, 2]
    clock = [0.0]
    seconds = {100: 10.0, 200: 20.0}

    def estimate(spec, built):
        return seconds[spec.budget] + (0.0 if built else 5.0)  # an arm's first run builds its model

    def train(spec):
        clock[0] += estimate(spec, spec.arm in ex.built)

    ex = InProcess(deadline=59.0, estimate=estimate, clock=lambda: clock[0])
    run_groups(plan, specs, ex, train)
    # 15 + 15 = 30 s of sweep; the pair at 200 needs 40 (not started, though its first run alone would fit);
    # the pair at 100 needs 20 and ends at 50
    assert ex.started == [specs[0], specs[1], specs[4], specs[5]] and ex.skipped == specs[2:4]
    assert clock[0] == 50.0


def test_the_deadline_leaves_runs_unstarted_stops_partial_and_the_same_command_goes_on(data_dir, tmp_path, capsys):
    """--deadline: a run that would end past it is not started, the report is PARTIAL, the command exits 0 saying
    so; the same command without it finishes the rest. A sweep whose run was left unstarted is not settled on the
    rates that ran (a rate not run is not a rate that diverged)."""
    out = tmp_path / "study"
    args = compare(data_dir, out, "--budgets", "2Ki", "--seeds", "0", "--lr-grid", "1", "--executor", "inprocess")
    assert main([*args, "--deadline", "0.001"]) == 0
    err = capsys.readouterr().err
    assert "comparison stopped at its deadline" in err and "re-run the same command to go on" in err, err
    assert not records(out) and "PARTIAL" in (out / "report.md").read_text()
    assert main(args) == 0
    assert len(records(out)) == 4  # the sweep's run and seed 0, both arms
    assert main([*args, "--deadline", "1h"]) == 0  # nothing left to do: nothing skipped, no stop
    assert "deadline" not in capsys.readouterr().err


def test_the_executor_flags_are_checked_in_one_line(data_dir, tmp_path, capsys):
    inprocess = ["--executor", "inprocess"]
    for extra, says in ((["--deadline", "10"], "--deadline needs --executor inprocess"),
                        ([*inprocess, "--deadline", "soon"], "give seconds from now, e.g. 570, 9.5m or 2h"),
                        ([*inprocess, "--jobs", "2"], "trains one run at a time in this process"),
                        ([*inprocess, "--slurm.partition", "gpu"], "needs --executor slurm")):  # fmt: skip
        assert main(compare(data_dir, tmp_path / "x", "--budgets", "1Ki", *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(says) and "\n" not in err, err
    assert (parse_deadline("570"), parse_deadline("9.5m"), parse_deadline("2h")) == (570, 570, 7200)
    assert not (tmp_path / "x").exists()


def test_the_process_lends_an_arms_model_only_to_runs_of_the_same_model():
    """The cache's key: another width, dtype or compiling is another model; the first compiled model may reset
    Dynamo, none after it (the earlier models' graphs would go)."""
    from types import SimpleNamespace

    from angpt.study.inprocess import ModelCache

    def run(d=32, dtype="fp32", compile=True):
        model = SimpleNamespace(to_dict=lambda: {"arch": "angpt", "d_model": d})
        train = SimpleNamespace(dtype=dtype, compile=compile, activation_checkpointing=False, fused_loss=False)
        return SimpleNamespace(model=model, train=train)

    cache = ModelCache()
    assert cache.lend(run()) == {"fresh_compile": True}
    cache.keep(run(), SimpleNamespace(model="m", forward="f"))
    assert cache.lend(run()) == {"model": "m", "forward": "f"}
    for other in (run(d=64), run(dtype="bf16"), run(compile=False)):
        assert cache.lend(other) == {"fresh_compile": False}


def test_a_sweep_whose_runs_were_not_all_run_does_not_settle():
    """A run the deadline left unstarted has no record: its sweep raises SweepUnfinished instead of reading it as a
    rate that diverged (and choosing among the rates that ran, or extending the grid downwards)."""
    from angpt.study.plan import Arm, Plan
    from angpt.study.sweep import SweepUnfinished, run_sweeps

    plan = Plan(data="d", arms=[Arm("angpt", "angpt", "angpt")], baseline="angpt", budgets=[256], seeds=[0],
                tuning_seed=1000, batch_tokens=256, lr_values={"angpt": [1e-3, 2e-3, 4e-3]})  # fmt: skip

    class Half:  # runs every rate but the highest
        records: dict = {}

        def run(self, specs):
            for s in specs:
                if s.lr < 4e-3:
                    self.records[s] = {"status": "finished", "val_loss": 3.0 - s.lr}

        def known(self, spec):
            return self.records.get(spec)

    with pytest.raises(SweepUnfinished, match="1 sweep run"):
        run_sweeps(plan, Half())
