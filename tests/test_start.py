"""One decision starts a run (train/setup.py, decide): fresh, resume or init_from, from the run folder read once; the
conflicting options refused; the dry run and a study's runner asking the same decision."""

import json
import shutil

import pytest

from angpt import checkpoint as ckpt
from angpt.checkpoint import RunState

from .test_train import TINY, run_cli

FIXTURE = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "legacy-2026-11-26"


@pytest.fixture(scope="module")
def stopped(data_dir, tmp_path_factory):
    """A GPT+ run stopped at step 2 of 4, with its checkpoint."""
    out = tmp_path_factory.mktemp("start") / "run"
    args = ["--arch", "gpt+", "--data", str(data_dir), *TINY, "--train.max_steps", "4", "--train.save_every", "2"]
    assert run_cli(*args, "--out", out, "--train.stop_at", "2") == 0
    return out, args


def test_resume_and_init_from_together_are_refused_in_one_line(stopped, capsys):
    out, args = stopped
    capsys.readouterr()
    ckpt_dir = ckpt.list_checkpoints(out)[-1]
    for extra in ([], ["--dry-run"]):  # the dry run makes the same decision
        rc = run_cli(*args, "--out", out, "--resume", "auto", "--init_from", ckpt_dir, *extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        assert "--resume auto continues the run in" in err[0] and "which started fresh" in err[0], err
        assert "give one" in err[0]


def test_a_resume_reads_state_json_once(stopped, monkeypatch):
    """The checkpoint's state is read once (it was read six times) and then passed on: checksums, data position,
    step, recipe and dtype all come from that one read."""
    from angpt.train.config import load_run_config
    from angpt.train.loop import Trainer

    out, args = stopped
    copy = out.parent / "resumed-once"
    shutil.copytree(out, copy)
    reads = []
    original = ckpt.read_state

    def counting(path, *a, **k):
        reads.append(str(path))
        return original(path, *a, **k)

    monkeypatch.setattr(ckpt, "read_state", counting)
    from angpt.train.config import load_yaml

    overrides = {flag.lstrip("-"): load_yaml(v) for flag, v in zip(args[::2], args[1::2])}
    cfg = load_run_config(None, {**overrides, "out": str(copy), "resume": "auto"})
    trainer = Trainer(cfg)
    assert trainer.start.mode == "resume" and trainer.step == 2
    assert len([r for r in reads if r.endswith("step_000002")]) == 1, reads


def test_a_study_run_that_stopped_before_its_first_checkpoint_restarts_without_its_folder_deleted(data_dir, tmp_path):
    """The runner asks the trainer for a fresh start (train(..., restart_unsaved=True)) instead of deleting the
    folder; `angpt train` itself still refuses such a folder."""
    from angpt.study import make_plan
    from angpt.study.execute import execute_run
    from angpt.study.store import RunSpec

    plan = make_plan(data_dir, budgets=[1024], arms=["gpt+"], seeds=[0], lr_grid=[1], preset="tiny",
                     batch_tokens=512, eval_batches=1, eval_points=1, dtype="fp32", tuning_seed=None)  # fmt: skip
    spec = RunSpec("gpt+", 1024, 0, plan.initial_grid(plan.arms[0])[0])
    run = spec.run_dir(plan, tmp_path)
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 9.9}) + "\n")  # a crash before the checkpoint
    (run / "notes.txt").write_text("mine")
    assert run_cli("--arch", "gpt+", "--data", data_dir, *TINY, "--out", run, "--train.max_steps", "2") == 2
    rec = execute_run(plan, tmp_path, spec)
    assert rec["status"] == "finished" and (run / "notes.txt").read_text() == "mine"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r][0] == 1 and rows[0].get("loss") != 9.9  # the old row is gone


def test_the_dry_run_plans_the_model_the_start_decides(stopped, tmp_path, capsys):
    """The dry run reads the folder as the run would: an --init_from of another architecture is the run's refusal,
    and its model is the checkpoint's."""
    out, args = stopped
    ckpt_dir = ckpt.list_checkpoints(out)[-1]
    capsys.readouterr()
    rc = run_cli(*[a if a != "gpt+" else "angpt" for a in args], "--out", tmp_path / "o", "--init_from", ckpt_dir,
                 "--dry-run")  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "holds a gpt+ model; pass --arch gpt+" in err[0]
    assert run_cli(*args, "--out", tmp_path / "o", "--init_from", ckpt_dir, "--dry-run", "--dry-run-gpus", "1") == 0
    assert f"checkpoint {ckpt_dir}" in capsys.readouterr().out


def test_a_checkpoints_state_reads_and_writes_back_its_keys():
    """RunState, the typed state.json that save writes and resume reads: a checkpoint written before it existed
    comes back with the same keys and values; its pieces (run config, compute dtype, recipe record) read as one
    record of the run, as a checkpoint written today keeps it (train/record.py)."""
    from angpt.train.record import read_state_record

    path = FIXTURE / "runs" / "gptplus" / "checkpoints" / "step_000002"
    raw = json.loads((path / "state.json").read_text())
    state = RunState.read(path)
    assert state.step == 2 and state.data == raw["data"] and state.run_id == raw["run_id"] and state.run is None
    assert state.to_dict() == raw
    record = read_state_record(raw, path)
    assert record["train"]["dtype"] == raw["compute_dtype"] and record["recipe"] == raw["recipe"]
    assert record["train"]["lr"] == raw["recipe"]["lr"] and record["lr_from"].startswith(" (the gpt+ recipe's when")
    assert record["model"] == raw["model_config"] and record["train"]["seed"] == raw["run_config"]["train"]["seed"]


def test_a_resume_takes_the_runs_stored_settings(data_dir, tmp_path, capsys):
    """`--out X --resume auto` alone continues the run with the settings it was started with (issue 39: every
    override had to be typed again, and a half-retyped set failed: batch 2,048 with the old micro-batch). A flag given
    explicitly overrides its stored value and is checked as before; the per-invocation stop_at is not inherited."""
    out = tmp_path / "run"
    started = ["--arch", "gpt+", "--data", data_dir, *TINY, "--train.micro_batch", "2", "--train.lr", "0.003"]
    first = ["--out", out, "--train.max_steps", "4", "--train.save_every", "0", "--train.stop_at", "2"]
    assert run_cli(*started, *first) == 0
    capsys.readouterr()
    assert run_cli("--out", out, "--resume", "auto") == 0  # nothing retyped: no data, no arch, no batch geometry
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if "step" in r) == 4  # ran to the stored max_steps, not stopped at 2 again
    run = json.loads((out / "config.json").read_text())["run"]
    assert (run["arch"], run["train"]["micro_batch"], run["train"]["lr"]) == ("gpt+", 2, 0.003)
    assert run["train"]["stop_at"] is None
    assert run_cli("--out", out, "--resume", "auto", "--train.max_steps", "6") == 0  # an explicit flag applies
    assert json.loads((out / "config.json").read_text())["run"]["train"]["max_steps"] == 6
    capsys.readouterr()
    assert run_cli("--out", out, "--resume", "auto", "--train.lr", "0.001") == 2  # and is checked as before
    assert "train.lr=0.001" in capsys.readouterr().err


def test_a_runs_config_json_is_a_recipe(stopped, tmp_path, capsys):
    """`--config runs/x/config.json` starts a new run with that run's settings (it was refused: unknown key 'run'),
    not with its --resume or stop_at."""
    from angpt.cli import build_parser, run_config_from_args

    out, _ = stopped
    args, args.extra = build_parser("train").parse_known_args(["train", "--config", str(out / "config.json")])
    cfg = run_config_from_args(args)
    stored = json.loads((out / "config.json").read_text())["run"]
    assert (cfg.arch, cfg.train.batch_tokens, cfg.train.max_steps) == ("gpt+", stored["train"]["batch_tokens"], 4)
    assert cfg.train.stop_at is None and cfg.resume is None


def test_a_run_started_from_other_weights_resumes_with_or_without_repeating_them(stopped, data_dir, tmp_path, capsys):
    """The same command again with --resume auto continues a run started --init_from X (the weights it started from
    are the run's, not a second start); so does --resume auto alone, from the stored settings. Other weights than
    the run started from are refused in one line."""
    source, _ = stopped
    weights = ckpt.list_checkpoints(source)[-1]
    out = tmp_path / "from"
    cmd = ["--arch", "gpt+", "--init_from", weights, "--data", data_dir, *TINY, "--train.max_steps", "4"]
    cmd += ["--out", out, "--train.save_every", "0"]
    assert run_cli(*cmd, "--train.stop_at", "1") == 0
    assert run_cli(*cmd, "--resume", "auto", "--train.stop_at", "2") == 0
    assert run_cli("--out", out, "--resume", "auto") == 0
    assert max(json.loads(x).get("step", 0) for x in (out / "metrics.jsonl").read_text().splitlines()) == 4
    capsys.readouterr()
    other = tmp_path / "elsewhere"
    shutil.copytree(weights, other)
    assert run_cli("--out", out, "--resume", "auto", "--init_from", other) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"which started from {weights}" in err[0], err


def test_a_resume_is_compared_with_the_run_its_checkpoint_recorded_as_resolved(stopped, capsys):
    """Each checkpoint records the run once, as train/setup.py resolved it (rate, optimizer, warm-up, batch, seed,
    dtype, model; no copy beside it); a resume resolves its own and is checked once against it, refused where one
    differs. Here the recorded rate is changed (as a recipe changed since in a way the settings do not show):
    refused in one line naming it. A longer run resumes, its recipe warm-up recomputed. Watched failing with the
    check removed."""
    out, args = stopped
    copy = out.parent / "resolved-check"
    shutil.copytree(out, copy)
    state_path = ckpt.list_checkpoints(copy)[-1] / "state.json"
    state = json.loads(state_path.read_text())
    assert not {"run_config", "compute_dtype", "recipe", "resolved"} & set(state)  # one record: "run"
    run = state["run"]
    resolved = run["train"]
    assert run["arch"] == "gpt+" and run["optimizer"] == "adamw" and resolved["warmup_steps"] >= 1
    assert resolved["lr"] == run["recipe"]["lr"]  # train.lr unset: the recipe's
    state["run"] = {**run, "train": {**resolved, "lr": resolved["lr"] * 2}}
    state_path.write_text(json.dumps(state))
    capsys.readouterr()
    assert run_cli(*args, "--out", copy, "--resume", "auto") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"with train.lr={resolved['lr']!r} (the gpt+ recipe's" in err[0], err
    assert f"the run was trained with {resolved['lr'] * 2!r}" in err[0], err
    assert f"; pass --train.lr {resolved['lr'] * 2} to resume it" in err[0], err
    longer = out.parent / "resolved-longer"
    shutil.copytree(out, longer)
    # train.max_steps 4 -> 40: GPT+'s warm-up (5% of the run, at least a step) moves from 1 to 2 steps with it
    assert run_cli(*args, "--train.max_steps", "40", "--out", longer, "--resume", "auto", "--train.stop_at", "3") == 0
