"""A newcomer's first hour (issue 24): the messages, warnings and defaults met between `make demo` and training on
one's own text. Each test failed before its fix."""

import pytest

from .test_train import TINY, run_cli


# ------------------------------------------------------------------------------------------ resume messages
@pytest.fixture
def stopped_run(data_dir, tmp_path):
    """An anGPT run at the recipe's learning rate (train.lr unset), stopped after step 2 of 4."""
    out = tmp_path / "run"
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "4"]
    assert run_cli(*common, "--train.save_every", "0", "--train.stop_at", "2") == 0
    return out, common


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_resume_names_the_recipes_learning_rate_not_none(stopped_run, capsys):
    out, common = stopped_run
    capsys.readouterr()
    assert run_cli(*common, "--resume", "auto", "--train.lr", "1e-3") == 2
    line = one_line(capsys)
    assert "train.lr=0.001" in line and "trained with 0.004 (the angpt recipe's; train.lr unset)" in line
    assert "None" not in line
    # the recipe's rate given explicitly is the same run: it resumes
    assert run_cli(*common, "--resume", "auto", "--train.lr", "0.004") == 0


@pytest.mark.parametrize(
    "change, named",
    [
        (["--preset", "demo", "--train.seq_len", "64"], "model.d_model=64 (now 256)"),
        (["--arch", "gpt+"], "arch='angpt' (now 'gpt+')"),
        (["--model.d_model", "32"], "model.d_model=64 (now 32)"),
    ],
)
def test_resume_with_another_model_names_the_differing_field(stopped_run, capsys, change, named):
    out, common = stopped_run
    capsys.readouterr()
    assert run_cli(*common, *change, "--resume", "auto") == 2
    line = one_line(capsys)
    assert "different model config" in line and named in line, line


# --------------------------------------------------------------------------------- a small corpus of one's own
def test_prepare_warns_when_the_validation_split_is_too_small(tmp_path, capsys):
    from angpt.data import prepare_dataset

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"{i}.txt").write_text(f"document {i}: " + "some words of text " * 50)
    prepare_dataset(docs, "bytes", tmp_path / "small", val_fraction=0.1, progress=False)
    err = capsys.readouterr().err
    assert "warning: the validation split holds" in err and "tokens in" in err and "--val-fraction (now 0.1)" in err
    n_tokens = int(err.split("holds ")[1].split(" tokens")[0].replace(",", ""))
    assert 0 < n_tokens < 50_000


def test_prepare_does_not_warn_about_a_large_validation_split(tmp_path, capsys):
    from angpt.data import prepare_dataset

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(200):
        (docs / f"{i}.txt").write_text(f"document {i}: " + "some words of text " * 120)
    prepare_dataset(docs, "bytes", tmp_path / "big", val_fraction=0.3, progress=False)
    assert "validation split" not in capsys.readouterr().err


def test_train_warns_when_it_will_read_its_data_many_times(data_dir, tmp_path, capsys):
    from angpt.data import TokenLoader

    per_epoch = TokenLoader(data_dir, "train", 4, 64).tokens_per_epoch
    steps = 5 * per_epoch // 512 + 1  # a little over 5 epochs at 512 tokens per step
    args = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", tmp_path / "r", "--train.max_steps", str(steps)]
    assert run_cli(*args, "--train.stop_at", "1") == 0
    err = capsys.readouterr().err
    assert f"reads the {per_epoch:,} training tokens 5.0 times (5.0 epochs)" in err, err
    assert run_cli("--arch", "gpt+", "--data", data_dir, *TINY, "--out", tmp_path / "s", "--train.max_steps", "2") == 0
    assert "epochs" not in capsys.readouterr().err


def test_keep_best_keeps_the_lowest_validation_loss_across_rotation_and_resume(data_dir, tmp_path, monkeypatch, capsys):
    """Validation loss 3.0, 2.0, 2.5, 2.8 at steps 1-4: checkpoints/best holds step 2's weights, though rotation
    (keep_last 1) and a resume went past it; the summary line names it."""
    import json

    from safetensors.torch import load_file

    from angpt.train import loop

    vals = iter([3.0, 2.0, 2.5, 2.8])
    monkeypatch.setattr(loop.Trainer, "evaluate", lambda self: (next(vals), None))
    out = tmp_path / "run"
    common = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "4"]
    common += ["--train.eval_every", "1", "--train.save_every", "1", "--train.keep_last", "1"]
    assert run_cli(*common, "--train.stop_at", "2") == 0
    step2 = load_file(str(out / "checkpoints" / "step_000002" / "model.safetensors"))
    assert run_cli(*common, "--resume", "auto") == 0
    assert "best " + str(out / "checkpoints" / "best") + " (val_loss 2.0000)" in capsys.readouterr().out
    assert [p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")] == ["best", "step_000004"]
    best = out / "checkpoints" / "best"
    state = json.loads((best / "state.json").read_text())
    assert state["step"] == 2 and state["best_val_loss"] == 2.0
    assert all(load_file(str(best / "model.safetensors"))[k].equal(v) for k, v in step2.items())
    from angpt.train.checkpoint import load_checkpoint_model

    model, tokenizer = load_checkpoint_model(best)  # generate, export and eval take it like any checkpoint
    assert tokenizer is not None and model.config.arch == "gpt+"


# ------------------------------------------------------------------------------------------ the settings' help
def test_help_config_lists_every_key_with_its_default_and_meaning(capsys):
    import dataclasses

    from angpt.cli import main
    from angpt.models.config import ModelConfig
    from angpt.train.config import TrainConfig

    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("--")}
    keys = {f"--train.{f.name}" for f in dataclasses.fields(TrainConfig)}
    keys |= {f"--model.{f.name}" for f in dataclasses.fields(ModelConfig) if f.name not in ("arch", "extra")}
    assert keys <= set(rows), sorted(keys - set(rows))
    undocumented = [k for k, line in rows.items() if len(line.split(None, 2)) < 3]
    assert not undocumented, f"give these fields a comment on their line: {undocumented}"
    assert rows["--train.beta2"].split()[1] == "0.95" and rows["--model.input_norm"].split()[1] == "'none'"
    assert "Adam beta2" in rows["--train.beta2"]


def test_train_help_points_to_the_settings(capsys):
    from angpt.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--help-config" in out and "(default demo)" in out


# -------------------------------------------------------------------------------------- a one-budget report
def test_a_one_budget_report_shows_what_one_budget_can_show(data_dir, tmp_path):
    """`make demo`'s shape: one budget, one seed. The verdict is a plain sentence, there is no speedup section
    or plot (nothing to draw it from), and the loss curves remain."""
    import re

    from angpt.compare import make_plan, run_comparison

    from .test_compare import TINY as COMPARE

    plan = make_plan(data_dir, **{**COMPARE, "budgets": [4096]}, arms=["gpt+", "angpt"], seeds=[0], lr_grid=[1])
    report = run_comparison(plan, tmp_path / "one", jobs=1, threads=1, progress=False)
    md = (tmp_path / "one" / "report.md").read_text()
    (line,) = [v for v in report.verdicts if v.startswith("smoke test: angpt")] or report.verdicts[-1:]
    pattern = r"angpt ended \d\.\d\d nats (lower|higher) than gpt\+ after 8 steps, one seed: a demonstration"
    assert re.search(pattern, line), line
    assert "no speedup can be claimed" not in md and "## Convergence speedup" not in md
    pngs = sorted(p.name for p in (tmp_path / "one").glob("*.png"))
    assert pngs == ["val_loss_vs_tokens.png"]
