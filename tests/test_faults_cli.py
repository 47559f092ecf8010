"""The command line as a new user meets it (issue 10): README command lines parse as written (scientific notation
included), bad values are one-line errors that write nothing, no argparse prefix matching, a hub-only task offline
is one line and the shipped example task works, the last line of `angpt train` reads well and names the dtype used,
and a run stopped by a signal exits 128 + the signal number."""

import argparse
import json
import re
import shlex
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import angpt.train.loop
from angpt.cli import build_parser, main
from angpt.errors import ConfigError
from angpt.train.config import load_run_config, parse_overrides
from angpt.train.dist import pick_device
from angpt.train.step import resolve_dtype

from .test_train import TINY

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


def train(data, out, *extra) -> int:
    return main(["train", "--arch", "angpt", "--data", str(data), *TINY, "--out", str(out), *map(str, extra)])


def one_line_error(capsys, rc, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], (rc, err)
    return err[0]


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("faults_cli") / "run"
    assert train(data_dir, out, "--train.max_steps", "3") == 0
    return out


# ------------------------------------------------------------------------------ 1. numbers as people write them
def test_scientific_notation_parses_in_overrides_and_recipes(tmp_path, capsys):
    items = parse_overrides(["--train.lr", "4e-3", "--train.weight_decay=1E-2", "--model.alpha_init", "5e-2"])
    assert items == [("train.lr", 0.004), ("train.weight_decay", 0.01), ("model.alpha_init", 0.05)]
    assert all(type(v) is float for _, v in items)
    cfg = load_run_config(None, items + [("train.max_steps", "1e3"), ("train.min_lr_ratio", "1e-1")])
    assert cfg.train.lr == 0.004 and cfg.train.max_steps == 1000 and cfg.train.min_lr_ratio == 0.1
    assert cfg.model["alpha_init"] == 0.05
    recipe = tmp_path / "r.yaml"
    recipe.write_text("arch: angpt\ntrain:\n  lr: 4e-3\n  grad_clip: 1e0\n  warmup_steps: 1e2\n")
    recipe.write_text(recipe.read_text() + "model:\n  norm_eps: 1e-5\n")
    cfg = load_run_config(recipe)
    assert (cfg.train.lr, cfg.train.grad_clip, cfg.train.warmup_steps) == (0.004, 1.0, 100)
    assert cfg.model["norm_eps"] == 1e-5
    assert main(["info", "--arch", "angpt", "--preset", "tiny", "--set", "norm_eps=1e-5"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["norm_eps"] == 1e-5
    # text fields stay text, whatever they look like
    assert parse_overrides(["--train.wandb_project", "1e3"]) == [("train.wandb_project", "1e3")]


def _readme_commands() -> list[tuple[str, list[str]]]:
    """Every `angpt train|compare ...` line of the README's (and docs') fenced code blocks, as argv lists."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" # ")[0].split("  #")[0]
                m = re.match(r"\s*(?:torchrun .*?-m )?angpt (train|compare)\b(.*)", line)
                if m:
                    found.append((f"{doc.name}: {line.strip()}", [m.group(1), *shlex.split(m.group(2))]))
    return found


def _unbracket(a: str) -> str:
    """An [optional] part's brackets off a token, keeping brackets that belong to it (an arm's `angpt[k=v]`)."""
    a = a[1:] if a.startswith("[") else a
    return a[:-1] if a.endswith("]") and a.count("]") > a.count("[") else a


def _expand(argv: list[str]) -> list[list[str]]:
    """The README's notation, resolved: [optional] parts kept, `...` dropped, each `a|b` alternative tried."""
    argv = [a for a in map(_unbracket, argv) if a not in ("", "...")]
    out = [[]]
    for a in argv:
        alts = a.split("|") if "|" in a and not a.startswith("--") else [a]
        out = [prev + [alt] for prev in out for alt in alts]
    return out


README_COMMANDS = _readme_commands()


def test_readme_has_the_commands_it_documents():
    """The README's own-text lines (train, compare) and docs/usage.md's reference are among the lines checked below."""
    readme = [line for line, _ in README_COMMANDS if line.startswith("README.md")]
    assert any("train" in line for line in readme) and any("compare" in line for line in readme), readme
    usage = [line for line, _ in README_COMMANDS if line.startswith("usage.md")]
    assert any("--train.lr 4e-3" in line for line in usage), usage
    assert "--tasks capitals --include tasks/" in (ROOT / "docs" / "usage.md").read_text()


@pytest.mark.parametrize("line,argv", README_COMMANDS, ids=[line for line, _ in README_COMMANDS])
def test_readme_command_lines_parse_as_written(line, argv, data_dir, monkeypatch):
    """Parsed and resolved (config, overrides, plan), not run: a rejected override fails here."""
    from angpt.cli import run_config_from_args
    from angpt.study.comparison.cli import plan_from_args

    monkeypatch.chdir(ROOT)
    for variant in _expand(argv):
        args, args.extra = build_parser(variant[0]).parse_known_args(variant)  # as `main` does: overrides: extras
        if args.command == "train":
            cfg = run_config_from_args(args)
            if "--train.lr" in variant:
                assert cfg.train.lr == float(variant[variant.index("--train.lr") + 1])
        elif args.report_only:  # the plan comes from --out's plan.json: only the flags are checked
            assert not args.extra and args.out, args
        else:
            assert not args.extra, args.extra
            plan_from_args(args, data=data_dir)  # the README's data folder does not exist here


# ------------------------------------------------------------------------- 2. bad values: one line, nothing written
@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--train.warmup_steps", "-1"], "train.warmup_steps"),
        (["--train.warmup_steps", "1.5"], "train.warmup_steps"),
        (["--train.warmup_steps", "ten"], "train.warmup_steps"),
        (["--train.min_lr_ratio", "abc"], "train.min_lr_ratio"),
        (["--train.min_lr_ratio", "null"], "train.min_lr_ratio"),
        (["--train.beta1", "0"], "train.beta1"),
        (["--train.beta1", "1.5"], "train.beta1"),
        (["--train.beta2", "1"], "train.beta2"),
        (["--train.beta2", "x"], "train.beta2"),
        (["--train.weight_decay", "-0.1"], "train.weight_decay"),
        (["--train.weight_decay", "lots"], "train.weight_decay"),
        (["--train.grad_clip", "abc"], "train.grad_clip"),
        (["--train.grad_clip", "nan"], "train.grad_clip"),
        (["--train.lr", "true"], "train.lr"),
        (["--train.seed", "1.5"], "train.seed"),
        (["--train.compile", "maybe"], "train.compile"),
        (["--train.stop_at", "0"], "train.stop_at"),
    ],
)
def test_bad_train_values_are_one_line_errors(extra, needle, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    one_line_error(capsys, train(data_dir, out, "--train.max_steps", "2", *extra), needle)
    assert not out.exists()


def test_weight_decay_null_means_the_recipe_default():
    assert load_run_config(None, [("train.weight_decay", None)]).train.weight_decay is None
    assert parse_overrides(["--train.weight_decay", "null"]) == [("train.weight_decay", None)]


def test_out_that_is_a_file(data_dir, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    one_line_error(capsys, train(data_dir, target, "--train.max_steps", "2"), "is a file")
    one_line_error(capsys, train(data_dir, target / "run", "--train.max_steps", "2"), "is a file")
    assert target.read_text() == "keep me"


def test_cuda_without_cuda_is_one_line(data_dir, run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        pick_device("cuda")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        pick_device("cuda:0")
    with pytest.raises(ConfigError, match="device 'gpu'"):
        pick_device("gpu")
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    out = tmp_path / "run"
    for flag in (["--train.device", "cuda"], ["--device", "cuda"]):
        one_line_error(capsys, train(data_dir, out, "--train.max_steps", "2", *flag), "CUDA is not available")
        assert not out.exists()
    for verb in (["generate", str(run_dir), "--prompt", "a"], ["eval", str(run_dir), "--tasks", "capitals"]):
        one_line_error(capsys, main([*verb, "--device", "cuda"]), "CUDA is not available")


def test_cuda_picks_this_ranks_gpu(monkeypatch):
    """`--train.device cuda` under torchrun: rank 1 computes on cuda:1, not on every other rank's cuda:0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert pick_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="cuda:2.*2 CUDA device"):
        pick_device("cuda:2")
    with pytest.raises(ConfigError, match="LOCAL_RANK 2.*2 CUDA device"):
        pick_device("cuda", local_rank=2)


# ------------------------------------------------------------------------------------ 3. no prefix matching
def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_no_parser_matches_prefixes():
    from angpt.cli import VERBS

    parsers = [p for verb in VERBS for p in _all_parsers(build_parser(verb))]
    assert len(parsers) >= 9 and "compare" in {p.prog.split()[-1] for p in parsers}
    assert [p.prog for p in parsers if p.allow_abbrev] == []


def test_a_misspelt_flag_is_an_error_not_a_prefix(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = train(data_dir, out, "--dry-run", "--resum", "auto")
    assert "resum" in one_line_error(capsys, rc, "unknown config key")
    with pytest.raises(SystemExit) as e:
        main(["generate", "x", "--max-new", "5"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("angpt generate: error:") and "--max-new" in err[0], err


def test_compare_typo_is_one_line_that_names_compares_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compare", "--data", "d", "--out", "o", "--bugdets", "1M"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("angpt compare: error:") and "--bugdets" in err[0], err
    assert err[0].endswith("see angpt compare --help"), err


@pytest.mark.parametrize("verb", [["compare"], ["scaling", "--depths", "2,3,4"]])
def test_a_negative_budget_is_one_line(verb, capsys):
    """Issue 55: `--budgets -16Ki` printed argparse's 20-line usage (the value taken for a flag); one line says how
    such a value is written, and written so it is refused as a token count."""
    with pytest.raises(SystemExit) as e:
        main([*verb, "--data", "d", "--out", "o", "--budgets", "-16Ki"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--budgets=VALUE" in err[0], err
    rc = main([*verb, "--data", "d", "--out", "o", "--budgets=-16Ki"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "-16Ki" in err[0], err


# ----------------------------------------------------------------------------------- 4. lm-eval tasks offline
@pytest.mark.slow
def test_hub_task_offline_is_one_line(run_dir, data_dir, tmp_path, capsys, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_cache")  # nothing cached here
    rc = main(["eval", str(run_dir), "--tasks", "hellaswag", "--limit", "2"])
    msg = one_line_error(capsys, rc, "hellaswag")
    assert "Hugging Face Hub" in msg and "--include" in msg
    # in training: refused before step 1 (not at the first evaluation) and before --out is created
    out = tmp_path / "run"
    tasks = ["--train.eval_tasks", "hellaswag", "--train.eval_tasks_every", "1", "--train.max_steps", "2"]
    assert "Hugging Face Hub" in one_line_error(capsys, train(data_dir, out, *tasks), "hellaswag")
    assert not out.exists()


def test_shipped_example_task_as_the_readme_runs_it(run_dir, tmp_path, capsys, monkeypatch):
    """`angpt eval runs/x --tasks capitals --include tasks/` from the repository root, offline."""
    rows = (ROOT / "tasks" / "capitals" / "capitals.jsonl").read_text().splitlines()
    assert len(rows) >= 24 and all(len(json.loads(r)["choices"]) == 4 for r in rows)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "results.json"
    assert main(["eval", str(run_dir), "--tasks", "capitals", "--include", "tasks/", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["results"]["capitals"]
    assert 0 <= result["acc,none"] <= 1 and result["sample_len"] == len(rows)
    assert "capitals: acc,none=" in capsys.readouterr().out


def test_shipped_example_task_in_training_from_any_directory(data_dir, tmp_path, monkeypatch):
    """The task finds its data beside its YAML, not relative to the shell: run from elsewhere, inside training."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    tasks = ["--train.eval_tasks", "capitals", "--train.eval_tasks_include", ROOT / "tasks"]
    assert train(data_dir, out, *tasks, "--train.eval_tasks_every", "2", "--train.max_steps", "2") == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "task/capitals/acc" in r] == [2]


# -------------------------------------------------------------------------------------- 5. what train says
def _fake_train(monkeypatch, **fields):
    """`angpt train` with the training replaced by a result: the CLI's last line and exit code only."""
    base = dict(
        out=Path("runs/x"), step=24, status="finished", final_loss=2.0, val_loss=None, val_bpb=None,
        checkpoint=Path("runs/x/checkpoints/step_000024"), tokens=1, step_time_median=None,
    )  # fmt: skip
    monkeypatch.setattr(angpt.train.loop, "train", lambda cfg, *a, **kw: SimpleNamespace(**(base | fields)))


def test_last_line_without_validation_loss_reads_well(data_dir, tmp_path, capsys, monkeypatch):
    _fake_train(monkeypatch)
    assert train(data_dir, tmp_path / "r") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert ": ;" not in line and line.startswith("finished at step 24; "), line
    assert "checkpoint runs/x/checkpoints/step_000024" in line and "metrics runs/x/metrics.jsonl" in line
    _fake_train(monkeypatch, val_loss=1.23456, val_bpb=0.5)
    assert train(data_dir, tmp_path / "r") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("finished at step 24: val_loss 1.2346 (0.500 bits/byte); "), line


def test_last_line_names_the_dtype_used(data_dir, tmp_path, capsys, monkeypatch):
    _fake_train(monkeypatch)
    assert train(data_dir, tmp_path / "r", "--train.dtype", "auto") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"; dtype {resolve_dtype('auto', pick_device('auto'))};" in line and "auto" not in line, line


def test_resuming_a_finished_run_says_so_plainly(run_dir, data_dir, tmp_path, capsys):
    """A real run resumed at its last step: nothing left to train, and the line still reads well."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    assert train(data_dir, copy, "--train.max_steps", "3", "--resume", "auto") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("finished at step 3") and ": ;" not in line and "dtype fp32" in line, line


def test_existing_run_with_checkpoints_says_resume_not_no_checkpoint(run_dir, data_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    msg = one_line_error(capsys, train(data_dir, copy, "--train.max_steps", "3"), "--resume auto")
    assert "no checkpoint" not in msg and "step_000003" in msg, msg


# ---------------------------------------------------------------------------------------- 6. exit codes
@pytest.mark.parametrize(
    "fields,code",
    [
        (dict(status="interrupted", signal=signal.SIGINT), 130),
        (dict(status="interrupted", signal=signal.SIGTERM), 143),
        (dict(status="interrupted", signal=None), 0),  # train.stop_at: a planned stop
        (dict(status="interrupted"), 0),  # a TrainResult without the field (before train/loop.py records it)
        (dict(status="finished", signal=None), 0),
    ],
)
def test_signal_stop_exits_128_plus_signal(fields, code, data_dir, tmp_path, capsys, monkeypatch):
    _fake_train(monkeypatch, **fields)
    assert train(data_dir, tmp_path / "r") == code
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"{fields['status']} at step 24")


@pytest.mark.parametrize(
    ("arms", "setting", "meant"),
    [
        ("gpt+,angpt", "model.d_modle=64", "'d_model'"),
        ("gpt+,angpt", "train.grad_clp=0.5", "'grad_clip'"),
        ("gpt+,angpt[nu_at=none]", None, "'nu_att'"),
    ],
)
def test_compare_names_the_key_a_typo_meant(arms, setting, meant, capsys):
    """Issue 55: `angpt train` says "did you mean" of a mistyped key; `compare --set` and an arm's options said only
    the list of valid keys."""
    extra = ["--set", setting] if setting else []
    rc = main(["compare", "--data", "d", "--out", "o", "--arms", arms, "--budgets", "16Ki", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"(did you mean {meant}?)" in err[0], err
