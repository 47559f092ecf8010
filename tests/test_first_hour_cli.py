"""A newcomer's first hour at the command line: the version, defaults in the help, an export over an existing
folder, length warnings from an export's generate, and what a mistyped key, a missing dataset or a missing
checkpoint is told. Each test fails with its fix removed."""

import argparse
import contextlib
import logging
import shutil
import warnings

import pytest
import torch

import angpt
from angpt.cli import build_parser, main


def one_line_error(capsys, rc, *needles) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and all(n in err[0] for n in needles), err
    return err[0]


def verb(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


# ------------------------------------------------------------------------------------------------ --version
def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own --version (issue 54: the parser loads no torch)
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"angpt {angpt.__version__}"


# ------------------------------------------------------------------------------------------- help defaults
@pytest.mark.parametrize("name", ["prepare", "generate", "export", "import-hf", "grow", "eval", "bench"])
def test_every_option_with_a_value_shows_its_default(name):
    hidden = []
    for action in verb(name)._actions:
        takes_value = action.option_strings and action.nargs != 0 and not action.required
        if takes_value and "default" not in (action.help or ""):
            hidden.append(action.option_strings[0])
    assert not hidden, f"{name}: say the default of {hidden}"
    text = verb(name).format_help()
    for action in verb(name)._actions:  # a literal default is printed as it is
        if isinstance(action.default, (int, float, str)) and action.nargs != 0 and action.option_strings:
            assert f"(default: {action.default})" in " ".join(text.split()), action.option_strings[0]


# ------------------------------------------------------------------------------------ export over a folder
@pytest.fixture(scope="module")
def run(data_dir, tmp_path_factory):
    """A tiny GPT+ run of 3 steps with a checkpoint at each, and checkpoints/best (its final validation)."""
    from .test_train import TINY, run_cli

    out = tmp_path_factory.mktemp("first-hour-cli") / "run"
    extra = ["--train.max_steps", "3", "--train.save_every", "1", "--train.keep_last", "10"]
    assert run_cli("--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, *extra) == 0
    return out


def files(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_export_over_a_previous_export_needs_overwrite(run, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out)]) == 0
    (out / "notes.txt").write_text("keep me")
    before = files(out)
    line = one_line_error(capsys, main(["export", str(run), str(out)]), str(out), "--overwrite")
    assert "previous export" in line
    assert files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert main(["export", str(run), str(out), "--overwrite", "--dtype", "bfloat16"]) == 0
    after = files(out)
    assert after["notes.txt"] == b"keep me" and after["model.safetensors"] != before["model.safetensors"]


def test_an_export_refused_for_its_folder_loads_nothing_first(run, tmp_path):
    """Issue 55: refusing an export over a previous one took ~9 s, the checkpoint and transformers loaded before the
    folder was looked at; the folder is checked first, in a process that has not imported torch."""
    import subprocess
    import sys

    out = tmp_path / "hf"
    assert main(["export", str(run), str(out)]) == 0
    code = (
        "import sys\nfrom angpt.cli import main\n"
        f"rc = main(['export', {str(run)!r}, {str(out)!r}])\n"
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["2", "False", "False"], res.stdout + res.stderr[-2000:]
    assert "previous export" in res.stderr


# ------------------------------------------------------------------------------- generate() on an export
@contextlib.contextmanager
def transformers_messages():
    """What transformers logs (its logger does not propagate to pytest's) and warns, collected."""
    said = []

    class Collect(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logger, handler = logging.getLogger("transformers"), Collect(logging.WARNING)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
        said += [str(w.message) for w in caught]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("arch", ["gpt+", "angpt"])  # a native Qwen3 export and the folded class
def test_an_export_generates_max_new_tokens_without_a_length_warning(arch, tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    from angpt.hf.export import export_hf

    path = export_hf(angpt.build_model(arch, "tiny", vocab_size=tok.vocab_size), tmp_path / "exp", tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    x = torch.tensor([tok.encode("the quick")])
    with transformers_messages() as said:
        out = hf.generate(x, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == x.shape[1] + 5
    assert not [m for m in said if "max_length" in m], said
    # The context still bounds a generate() that names no length: 60 prompt tokens stop at its 64.
    assert hf.config.max_position_embeddings == 64
    with transformers_messages():  # transformers' advice to pass max_new_tokens
        assert hf.generate(torch.tensor([tok.encode("a" * 60)]), do_sample=False).shape[1] == 64


# --------------------------------------------------------------------------------------- a mistyped key
@pytest.mark.parametrize(
    "flags, recipe, hint",
    [
        (["--train.lrr", "0.01"], None, "(did you mean 'train.lr'?)"),
        (["--lr", "0.01"], None, "(did you mean 'train.lr'?)"),  # the section forgotten
        (["--trian.lr", "0.01"], None, "(did you mean 'train.lr'?)"),
        (["--model.d_modle", "32"], None, "d_modle (did you mean 'model.d_model'?)"),
        ([], "train:\n  lrr: 0.01\n", "(did you mean 'train.lr'?)"),
        ([], "model:\n  n_layer: 2\n", "(did you mean 'model.n_layers'?)"),
        (["--train.zzzzz", "1"], None, None),  # nothing close: no guess
    ],
)
def test_a_mistyped_config_key_suggests_the_closest(flags, recipe, hint, data_dir, tmp_path, capsys):
    if recipe is not None:
        (tmp_path / "recipe.yaml").write_text(recipe)
        flags = ["--config", str(tmp_path / "recipe.yaml")]
    rc = main(["train", "--data", str(data_dir), "--out", str(tmp_path / "run"), *flags])
    line = one_line_error(capsys, rc, "unknown")
    assert (hint in line) if hint else "did you mean" not in line
    assert not (tmp_path / "run").exists()


def test_a_mistyped_model_override_of_info_suggests_the_closest(capsys):
    line = one_line_error(capsys, main(["info", "--arch", "angpt", "--set", "d_modl=32"]), "d_modl")
    assert "(did you mean 'd_model'?)" in line


# ------------------------------------------------------------------------------------------ a missing --data
def test_a_missing_data_folder_is_named_as_missing_not_unprepared(tmp_path, capsys):
    common = ["train", "--preset", "tiny", "--out", str(tmp_path / "run")]
    missing = tmp_path / "does" / "not" / "exist"
    line = one_line_error(capsys, main([*common, "--data", str(missing)]), str(missing), "does not exist")
    assert "meta.json" not in line and "angpt prepare" in line
    (tmp_path / "notes").mkdir()
    line = one_line_error(capsys, main([*common, "--data", str(tmp_path / "notes")]), "not a prepared dataset")
    assert "no meta.json" in line and "angpt prepare --source" in line
    (tmp_path / "file.txt").write_text("text")
    one_line_error(capsys, main([*common, "--data", str(tmp_path / "file.txt")]), "is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "notes"]  # no run folder made


# ----------------------------------------------------------------------------------- a missing checkpoint
def test_a_missing_checkpoint_names_the_ones_that_exist(run, tmp_path, capsys):
    ckpts = run / "checkpoints"
    missing = ckpts / "step_000999"
    line = one_line_error(capsys, main(["generate", str(missing), "--prompt", "a"]), f"{missing} does not exist")
    assert line.endswith(f"; {ckpts} holds step_000001, step_000002, step_000003, best"), line
    # checkpoints/ left out of the path: the run folder's are named too; the export writes nothing
    line = one_line_error(capsys, main(["export", str(run / "step_000003"), str(tmp_path / "hf")]), "does not exist")
    assert line.endswith(f"; {ckpts} holds step_000001, step_000002, step_000003, best"), line
    assert list(tmp_path.iterdir()) == []
    # many: the newest five, how many older, and best
    many = shutil.copytree(run, tmp_path / "run") / "checkpoints"
    for step in range(4, 9):
        shutil.copytree(many / "step_000003", many / f"step_{step:06d}")
    line = one_line_error(capsys, main(["export", str(many / "step_9"), str(tmp_path / "hf")]), "does not exist")
    newest = ", ".join(f"step_{s:06d}" for s in range(4, 9))
    assert line.endswith(f"; {many} holds 3 older and {newest}, best"), line
    # a run folder without a complete checkpoint says so, not "missing state.json"
    (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
    line = one_line_error(capsys, main(["generate", str(tmp_path / "fresh"), "--prompt", "a"]), "a run folder")
    assert line.endswith("checkpoints holds no complete checkpoint"), line
    # elsewhere there is nothing to list
    line = one_line_error(capsys, main(["generate", str(tmp_path / "nope"), "--prompt", "a"]), "does not exist")
    assert "holds" not in line


# ---------------------------------------------------------------------------------------------- train --out
def test_train_refuses_a_full_folder_that_holds_no_run(data_dir, tmp_path, capsys):
    """Issue 55: `angpt train --out x` into a non-empty folder that is no run trained there without a word (with or
    without --resume auto); `angpt compare` refuses the same. One line, nothing written."""
    from .test_train import TINY, run_cli

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for resume in ([], ["--resume", "auto"]):
        line = one_line_error(
            capsys, run_cli("--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, *resume), str(out)
        )
        assert "not empty and holds no run" in line
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_resume_auto_into_a_new_folder_says_it_starts_fresh(data_dir, tmp_path, capsys):
    """Issue 55: `--resume auto` with a misspelled --out started at step 0 silently; it says so in one line, and
    resuming the run it wrote says nothing of the kind."""
    from .test_train import TINY, run_cli

    out = tmp_path / "new"
    args = ("--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--resume", "auto", "--train.max_steps", "1")
    assert run_cli(*args) == 0
    fresh = [x for x in capsys.readouterr().err.splitlines() if "nothing to resume" in x]
    assert fresh == [f"angpt train: nothing to resume in {out}, starting fresh"]
    assert run_cli(*args[:-1], "2") == 0
    assert "nothing to resume" not in capsys.readouterr().err
