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
