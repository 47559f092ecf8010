"""A newcomer's first hour (issue 24): the messages, warnings and defaults met between `make demo` and training on
one's own text. Each test failed before its fix."""

import json

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
    assert (
        "train.lr=0.001" in line
        and "trained with 0.004 (the angpt recipe's when the run started; train.lr unset)" in line
    )
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
def prepare_docs(tmp_path, n, words, name, val_fraction):
    """n text files of a repeated phrase, prepared as bytes with `val_fraction`."""
    from angpt.data import prepare_dataset

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(n):
        (docs / f"{i}.txt").write_text(f"document {i}: " + "some words of text " * words)
    return prepare_dataset(docs, "bytes", tmp_path / name, val_fraction=val_fraction, progress=False)


def test_prepare_warns_when_the_validation_split_is_too_small(tmp_path, capsys):
    prepare_docs(tmp_path, 40, 50, "small", 0.1)
    err = capsys.readouterr().err
    assert "warning: the validation split holds" in err and "bytes in" in err and "--val-fraction (now 0.1)" in err
    n_bytes = int(err.split("holds ")[1].split(" bytes")[0].replace(",", ""))  # auto's unit (issue 48)
    assert 0 < n_bytes < 50_000


def test_prepare_does_not_warn_about_a_large_validation_split(tmp_path, capsys):
    prepare_docs(tmp_path, 200, 120, "big", 0.3)
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
    # the dry run of the same run says it too, from meta.json alone (issue 48)
    said = next(line for line in err.splitlines() if "epochs)" in line)
    dry = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", tmp_path / "d", "--train.max_steps", str(steps)]
    assert run_cli(*dry, "--dry-run", "--dry-run-mfu", "0.5") == 0
    assert f"angpt train: {said}" in capsys.readouterr().err.splitlines()


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
    from angpt.checkpoint import load_checkpoint_model

    model, tokenizer = load_checkpoint_model(best)  # generate, export and eval take it like any checkpoint
    assert tokenizer is not None and model.config.arch == "gpt+"
    # the run folder stands for its best checkpoint, not its latest (step 4), as the README and --help say
    from pathlib import Path

    from angpt.checkpoint import run_checkpoint
    from angpt.cli import RUN_HELP

    assert run_checkpoint(out) == best and run_checkpoint(best) == best
    run_model, _ = load_checkpoint_model(out)
    assert all(run_model.state_dict()[k].equal(v) for k, v in step2.items() if k in run_model.state_dict())
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "its best checkpoint, lowest validation loss" in RUN_HELP and "# the best checkpoint" in readme


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
    assert rows["--train.beta2"].split()[1] == "0.95" and "Adam beta2" in rows["--train.beta2"]
    # a default that depends on the architecture says whose it is, not one architecture's value for all
    assert rows["--model.nu_att"].split()[1:3] == ["by", "arch"] and "[angpt 'none'; others 'dense']" in out
    assert main(["train", "--help-config", "--arch", "angpt"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("--")}
    assert rows["--model.nu_att"].split()[1] == "'none'" and rows["--model.input_norm"].split()[1] == "'mlp'"
    assert main(["train", "--help-config", "--arch", "ngpt"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("--")}
    assert rows["--model.nu_att"].split()[1] == "'dense'" and rows["--model.alpha_init"].split()[1] == "0.05"


def test_train_help_points_to_the_settings(capsys):
    from angpt.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--help-config" in out and "(default demo)" in out


# -------------------------------------------------------------------------------------- a one-budget report
def test_a_one_budget_report_shows_what_one_budget_can_show(data_dir, tmp_path):
    """`make demo`'s shape: one budget, one seed. The verdict is a plain sentence, there is no speedup section
    or plot (nothing to draw it from), and the loss curves and the lead along the run remain."""
    import re

    from angpt.study import make_plan, run_comparison

    from .test_compare import TINY as COMPARE

    plan = make_plan(data_dir, **{**COMPARE, "budgets": [4096]}, arms=["gpt+", "angpt"], seeds=[0], lr_grid=[1])
    report = run_comparison(plan, tmp_path / "one", jobs=1, threads=1, progress=False)
    md = (tmp_path / "one" / "report.md").read_text()
    (line,) = [v for v in report.verdicts if v.startswith("smoke test: angpt")] or report.verdicts[-1:]
    pattern = r"angpt ended \d\.\d\d nats (lower|higher) than gpt\+ after 8 steps, one seed: a demonstration"
    assert re.search(pattern, line), line
    assert "no speedup can be claimed" not in md and "## Convergence speedup" not in md
    assert "(one seed: no interval or test)" in md and "with its 95% interval" not in md  # no promise it can't keep
    pngs = sorted(p.name for p in (tmp_path / "one").glob("*.png"))
    assert pngs == ["lead.png", "val_loss_vs_tokens.png"]


# ------------------------------------------------------------------------------------------- smaller ones
@pytest.fixture(scope="module")
def tiny_checkpoint(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "run"
    assert run_cli("--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "1") == 0
    return out


def test_generate_says_when_it_caps_the_length_and_drops_echos_newline(tiny_checkpoint, monkeypatch, capsys):
    import io

    import angpt.infer
    from angpt.cli import main

    seen = {}

    def fake_stream(model, tokenizer, prompt, **kw):
        seen.update(prompt=prompt, max_new=kw["max_new_tokens"])
        return iter(["x"])

    monkeypatch.setattr(angpt.infer, "sample_stream", fake_stream)
    monkeypatch.setattr("sys.stdin", io.StringIO("the quick\n"))
    assert main(["generate", str(tiny_checkpoint), "--max-new-tokens", "500"]) == 0
    assert seen["prompt"] == "the quick"  # the newline echo adds is not part of the prompt
    err = capsys.readouterr().err
    assert f"generating {seen['max_new']} tokens, not 500" in err and "context of 64 tokens" in err
    assert seen["max_new"] == 64 - len("the quick")  # bytes: one token per character
    assert main(["generate", str(tiny_checkpoint), "--prompt", "ab\n", "--max-new-tokens", "5"]) == 0
    assert seen["prompt"] == "ab\n" and "generating" not in capsys.readouterr().err  # --prompt is kept as given


def test_an_empty_txt_source_is_named_without_text_field(tmp_path):
    from angpt.data import prepare_dataset
    from angpt.errors import DataError

    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError) as e:
        prepare_dataset(tmp_path / "empty.txt", "bytes", tmp_path / "out", progress=False)
    assert "text files are empty" in str(e.value) and "text_field" not in str(e.value)


def test_the_progress_bar_explains_slow_first_steps():
    from angpt.train.loop import _postfix

    row = {"loss": 9.0, "tokens_per_sec": 100.0}
    assert "ETA settles" in _postfix({**row, "step": 1}, None)
    assert "ETA settles" not in _postfix({**row, "step": 10}, None)


def test_an_exported_tokenizer_loads_without_a_remote_code_prompt(tmp_path, tok):
    """(The export's context length: tests/test_first_hour_cli.py, which generates from it.)"""
    import angpt
    from angpt.hf.export import export_hf

    transformers = pytest.importorskip("transformers")
    path = export_hf(angpt.build_model("angpt", "tiny", vocab_size=tok.vocab_size), tmp_path / "exp", tok)
    # with angpt installed (importing angpt.hf.export registers the classes), no remote-code prompt for either
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert tokenizer("ab")["input_ids"] == tok.encode("ab")


def test_the_documented_tokenizer_load_needs_no_remote_code_and_no_angpt(tmp_path, tok):
    """Without angpt installed, AutoTokenizer on a custom-class export reads config.json and asks to run remote
    code (transformers' design); the README's way, PreTrainedTokenizerFast, does not ask and loads the same ids."""
    import subprocess
    import sys

    import angpt
    from angpt.hf.export import export_hf

    path = export_hf(angpt.build_model("angpt", "tiny", vocab_size=tok.vocab_size), tmp_path / "exp", tok)
    code = (
        "import sys; sys.modules['angpt'] = None\n"  # as if angpt were not installed
        "from transformers import PreTrainedTokenizerFast\n"
        f"print(PreTrainedTokenizerFast.from_pretrained({str(path)!r})('ab')['input_ids'])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and res.stdout.strip() == str(tok.encode("ab")), res.stderr[-2000:]


def test_eval_fails_fast_when_the_hub_does_not_answer(tiny_checkpoint, tmp_path):
    """No offline variables set and a Hub that refuses connections: a one-line error in seconds, not after the Hub
    clients' half-minute of retries (measured before: 35 s; after: ~10 s, most of it importing lm-eval). Timed
    against the same command told it is offline, run just before under the same load: the Hub's retries wait on
    the network, which a busy machine does not stretch, while the imports both share take what the CPU gives (one
    run beside three training processes took 94 s, all but a few of them importing). The task is hellaswag's
    dataset in a YAML of the test's own: lm-eval's own hellaswag first indexes its ~15k built-in tasks (~8 s)."""
    import os
    import subprocess
    import sys
    import time

    pytest.importorskip("lm_eval")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: Rowan/hellaswag\noutput_type: multiple_choice\nvalidation_split: validation\n"
        'doc_to_text: "{{ctx}}"\ndoc_to_choice: "{{endings}}"\ndoc_to_target: "{{label}}"\n'
    )
    command = [sys.executable, "-m", "angpt", "eval", str(tiny_checkpoint), "--tasks", "hub_task", "--include", tasks]

    def timed(environment):
        t0 = time.time()
        res = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
        return res, time.time() - t0

    offline, baseline = timed({**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert offline.returncode == 2 and "offline here" in offline.stderr.strip().splitlines()[-1], offline.stderr
    res, took = timed(env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "did not answer within 3 s" in lines[-1], res.stderr[-2000:]
    assert took - baseline < 20, (took, baseline)  # the probe's 3 s and noise; the clients' retries took 25 s more


def change_recipe(monkeypatch, arch, **fields):
    """Today's registry with `arch`'s optimizer recipe changed (a new default, as a release might make)."""
    import dataclasses

    from angpt.models import registry

    spec = registry.get(arch)
    changed = dataclasses.replace(spec, recipe=dataclasses.replace(spec.recipe, **fields))
    monkeypatch.setitem(registry.ARCHITECTURES, arch, changed)


def written_before_the_records(record):
    """The run config a run wrote before it recorded its recipe (2026-11-26) or its resolved run: the settings as
    given (the rate, decay and warm-up its recipe decided unset), with no record of the recipe."""
    train = {k: None if record.get(f"{k}_from") else v for k, v in record["train"].items()}
    return {k: record[k] for k in ("arch", "preset", "data")} | {"model": record["model_overrides"], "train": train}


@pytest.mark.parametrize(
    "recorded, trained",
    [
        (True, "trained with 0.004 (the angpt recipe's when the run started; train.lr unset); pass --train.lr 0.004"),
        (False, "trained with 0.004 (its optimizer's schedule); pass --train.lr 0.004"),
    ],
)
def test_a_recipe_rate_changed_since_the_run_refuses_its_resume_and_the_trained_rate_resumes(
    stopped_run, monkeypatch, capsys, recorded, trained
):
    """A run at the recipe's rate (train.lr unset) records it: when the recipe's rate has changed since, resuming
    unchanged would go on at another rate than the first half's. It refuses in one line naming both and the rate to
    pass; passing it resumes, and the run's next checkpoint still records the recipe it started with (not today's,
    without the rate the flag now gives). A checkpoint older than the record (no `recipe` in state.json) is refused
    by its scheduler state's rate, which loading it would otherwise bring back while the run recorded the new one."""
    import json

    out, common = stopped_run
    if not recorded:  # a checkpoint from before the records: neither the recipe nor the resolved run
        (state_json,) = out.glob("checkpoints/step_*/state.json")
        state = json.loads(state_json.read_text())
        state["run_config"] = written_before_the_records(state.pop("run"))
        state_json.write_text(json.dumps(state))
    change_recipe(monkeypatch, "angpt", lr=2e-3)
    capsys.readouterr()
    assert run_cli(*common, "--resume", "auto") == 2
    line = one_line(capsys)
    assert "train.lr=0.002 (the angpt recipe's at tiny; train.lr unset)" in line, line
    assert trained in line, line
    assert run_cli(*common, "--resume", "auto", "--train.lr", "0.004") == 0
    if recorded:  # the resumed run keeps its record: a later resume is checked against the rate it started with
        final = max(out.glob("checkpoints/step_*/state.json"), key=lambda p: int(p.parent.name.split("_")[1]))
        assert json.loads(final.read_text())["run"]["recipe"]["lr"] == 0.004


def test_a_recipe_warmup_changed_since_the_run_refuses_its_resume(stopped_run, monkeypatch, capsys):
    out, common = stopped_run
    change_recipe(monkeypatch, "angpt", warmup_fraction=0.05)
    capsys.readouterr()
    assert run_cli(*common, "--resume", "auto") == 2
    assert "the angpt recipe's warmup_fraction=0.0 (now 0.05) since the run started" in one_line(capsys)


def test_a_finished_run_under_a_changed_recipe_is_not_todays_arm(stopped_run, data_dir, monkeypatch):
    """The sweeps' and compare's check (model_drift) names a recipe changed since the run as it names a model
    default; a run that predates the record (no `recipe` in config.json) is compared on its model only."""
    import json

    from angpt.data import load_meta
    from angpt.train.resume import model_drift

    out, _ = stopped_run
    meta = load_meta(data_dir)
    assert model_drift(out, meta) is None
    change_recipe(monkeypatch, "angpt", lr=2e-3, optimizer="adamw")
    drift = model_drift(out, meta)
    assert drift == "the angpt recipe's optimizer='adam' (now 'adamw'), the angpt recipe's lr=0.004 (now 0.002)", drift
    stored = json.loads((out / "config.json").read_text())
    old = {"run": written_before_the_records(stored["run"]), "model": stored["run"]["model"]}
    (out / "config.json").write_text(json.dumps(old))
    assert model_drift(out, meta) is None


# ---------------------------------------------------------------------------- a default rate for every size
@pytest.mark.parametrize(
    "arch, preset, lr",
    [
        ("angpt", "demo", 4e-3),
        ("angpt", "gpt2-small", 2e-3),  # 200 steps at the paper's batch on a GPU; the demo's 4e-3 is 30 steps there
        ("angpt", "0.5B", 1e-3),
        ("angpt", "1B", 8e-4),
        ("gpt+", "gpt2-small", 2e-3),
        ("gpt+", "0.5B", 1.5e-3),
        ("ngpt", "1B", 1.6e-3),
        ("tokenformer", "gpt2-small", 6e-4),
    ],
)
def test_an_unset_rate_is_the_recipes_at_the_runs_preset(arch, preset, lr, capsys):
    """`angpt train --preset gpt2-small` with train.lr unset trains at the rate measured at that size, not the demo
    model's; the run records it, and the dry run says where it came from."""
    import torch

    from angpt.train.config import load_run_config
    from angpt.train.dryrun import format_report, plan_run
    from angpt.train.setup import resolve

    cfg = load_run_config(None, {"arch": arch, "preset": preset, "train.micro_batch": 1})
    run = resolve(cfg, device=torch.device("cpu"))
    assert run.train.lr == lr and run.lr_from == f" (the {arch} recipe's at {preset}; train.lr unset)"
    assert run.recipe["lr"] == lr  # what the run records
    line = next(x for x in format_report(plan_run(cfg, gpus=1)).splitlines() if x.startswith("  optimizer"))
    assert f"peak lr {lr:g} (the {arch} recipe's at {preset}; train.lr unset)" in line, line
    from angpt.cli import main

    capsys.readouterr()
    assert main(["info", "--arch", arch, "--preset", preset]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"]["lr"] == lr  # `angpt info` says the same
    given = load_run_config(None, {"arch": arch, "preset": preset, "train.lr": 5e-3, "train.micro_batch": 1})
    resolved = resolve(given, device=torch.device("cpu"))
    assert resolved.train.lr == 5e-3 and "lr" not in resolved.recipe


def test_a_comparison_centres_its_sweep_on_the_rate_of_its_preset(data_dir):
    import dataclasses

    from .test_compare import tiny_plan

    plan = tiny_plan(data_dir)
    arm = next(a for a in plan.arms if a.arch == "angpt")
    assert plan.centre_lr(arm) == plan.centres["angpt"] == 4e-3
    assert dataclasses.replace(plan, preset="gpt2-small", centres={}).centre_lr(arm) == 2e-3


def test_a_stored_comparison_keeps_its_centres_when_a_recipe_rate_changes(data_dir, tmp_path, monkeypatch):
    """A report folder records each arm's sweep centre. When a default rate changes since (a new Recipe.lr_at), the
    same command would centre elsewhere and mix grids: it is refused, naming the centres, and --lr with the stored
    centre resumes. A folder written before centres were recorded counts the recipe's one rate as its centre."""
    from angpt.errors import UserError
    from angpt.study.store import PLAN_FILE, check_report_dir, write_json

    from .test_compare import tiny_plan

    legacy, new = tmp_path / "legacy", tmp_path / "new"
    for out in (legacy, new):
        out.mkdir()
        stored = tiny_plan(data_dir).to_dict()
        if out == legacy:
            del stored["centres"]
        write_json(out / PLAN_FILE, stored)
        assert check_report_dir(tiny_plan(data_dir), out) == []  # the same command, the same recipe
    change_recipe(monkeypatch, "angpt", lr_at={"tiny": 1e-3})
    for out in (legacy, new):
        with pytest.raises(
            UserError,
            match=r'centres: \{"angpt": 0.004, "gpt\+": 0.002\} there, '
            r'\{"angpt": 0.001, "gpt\+": 0.002\} here',
        ):
            check_report_dir(tiny_plan(data_dir), out)
        assert check_report_dir(tiny_plan(data_dir, lr={"angpt": 4e-3}), out) == []


def test_a_scaling_ladder_centres_every_size_on_the_small_model_rate(data_dir):
    """A ladder's sizes come from its dial, not its preset: a gpt2-small preset (for the vocabulary and context)
    does not move its sweeps to the gpt2-small rate."""
    from angpt.models import registry
    from angpt.study import make_ladder

    from .test_scaling import TINY

    shape = dict(depths=[1, 2, 3], aspect=16, head_dim=8, budgets=[512, 1024, 1536])
    ladder = make_ladder(data_dir, arms=["gpt+", "angpt"], **shape, **TINY)
    for preset in (ladder.compare["preset"], "gpt2-small"):
        ladder.compare |= {"preset": preset, "seq_len": 64}
        plan = ladder.size_plan(0)
        for arm in plan.arms:
            assert plan.centre_lr(arm) == registry.get(arm.arch).recipe.lr, (preset, arm.label)


@pytest.mark.parametrize("arch", ["angpt", "gpt+"])
def test_the_export_prints_the_load_line_that_works(data_dir, tmp_path, capsys, arch):
    """The lines `angpt export` prints load the export in a fresh Python without angpt imported: anGPT's need
    trust_remote_code=True and say so; GPT+'s (a native Qwen3) do not (issue 48). Pasted at a terminal they run
    unattended: stdin is a pty here, where transformers' "[y/N]" would wait (it waited 40 s in issue 55), and no
    line asks or warns of a model type ``."""
    import os
    import pty
    import subprocess
    import sys

    from angpt.cli import main

    run = tmp_path / "run"
    assert run_cli("--arch", arch, "--data", data_dir, *TINY, "--out", run, "--train.max_steps", "1") == 0
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "hf"), "--format", "hf"]) == 0
    code = capsys.readouterr().out.split("load it with transformers:\n", 1)[1]
    assert ("trust_remote_code=True" in code) == (arch == "angpt")
    check = (
        "\n".join(line.strip() for line in code.splitlines())
        + "\nprint(type(model).__name__, 'angpt' in __import__('sys').modules)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    terminal, other_end = pty.openpty()
    try:
        res = subprocess.run(
            [sys.executable, "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path, stdin=terminal,
            timeout=120,
        )  # fmt: skip
    finally:
        os.close(terminal), os.close(other_end)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == "False", res.stdout
    said = res.stdout + res.stderr
    assert "[y/N]" not in said and "model of type ``" not in said, said[-2000:]


def test_the_readmes_parameter_counts_are_the_models_it_trains():
    """README's "8.4M parameters" (configs/demo-angpt.yaml on the data its own prepare line makes) and "2.1M
    parameters" (`make demo`'s shape, read from the Makefile, and the smoke-size compare line's, read from it) are
    the models those commands build (issue 48: the prepare line's 8,192-token BPE made 10.5M and 3.2M)."""
    import re
    import shlex
    from pathlib import Path

    import torch

    from angpt.models import make_config, model_from_config
    from angpt.train.config import load_run_config

    root = Path(__file__).resolve().parents[1]
    readme, makefile = (root / "README.md").read_text(), (root / "Makefile").read_text()

    def millions(cfg) -> str:
        with torch.device("meta"):
            return f"{model_from_config(cfg).num_params() / 1e6:.1f}M parameters"

    config = load_run_config(root / "configs" / "demo-angpt.yaml")
    prepare = next(x for x in readme.splitlines() if x.startswith("angpt prepare") and "--out data/mine" in x)
    vocab = int(re.search(r"--tokenizer bpe:(\d+)", prepare).group(1))
    own = make_config(config.arch, config.preset, vocab_size=vocab)
    line = next(x for x in readme.splitlines() if "configs/demo-angpt.yaml --data data/mine" in x)
    assert millions(own) in line, line
    text = readme.split("angpt compare --data data/mine", 1)[1].split("\nangpt ", 1)[0].replace("\\\n", " ")
    smoke = dict(w.split("=", 1) for w in text.split() if w.startswith("model.") and "=" in w)
    shape = {k.removeprefix("model."): int(v) for k, v in smoke.items()}
    assert millions(make_config("angpt", "demo", vocab_size=vocab, **shape)) in text, text
    demo = " ".join(makefile.split("\ndemo:", 1)[1].split("\n\t@cat", 1)[0].replace("\\\n", " ").split())
    words = shlex.split(demo)
    sets = dict(w.split("=", 1) for w in words[words.index("--set") + 1 :] if "=" in w and w.startswith("model."))
    shape = {k.removeprefix("model."): int(v) for k, v in sets.items()}
    assert re.search(r"--tokenizer bpe:4096", makefile) and "--arms gpt+,angpt" in demo
    said = f"{shape['n_layers']} layers, d = {shape['d_model']}, "
    for arch in ("gpt+", "angpt"):
        assert said + millions(make_config(arch, "demo", vocab_size=4096, **shape)) in " ".join(readme.split())


# ------------------------------------------------------------------------------------------ the pages
def _prose(text: str) -> str:
    """A page's text outside fenced code blocks."""
    import re

    return re.sub(r"^```.*?^```[^\n]*$", " ", text, flags=re.S | re.M)


def test_the_readme_opens_with_its_two_commands_and_stays_short():
    """Issue 55: `make demo` and `make test` within the README's first 200 words, and at most 1,500 words of prose
    (outside code blocks): the research detail lives in docs/."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    words = text.split()
    first = " ".join(words[:200])
    assert "make demo" in first and "make test" in first, "the two commands come after the first 200 words"
    assert len(_prose(text).split()) <= 1500, len(_prose(text).split())


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_lands():
    """Each relative link of README.md, docs/*.md and benchmarks/RESULTS.md names a file that exists and, with a
    #fragment into a page, a heading of that page (a section moved between pages leaves no dead link behind)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "benchmarks" / "RESULTS.md"]
    dead = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                dead.append(f"{page.name}: {target} (no such file)")
            elif fragment and file.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", _prose(file.read_text()), re.M)}
                if fragment not in headings:
                    dead.append(f"{page.name}: {target} (no such heading)")
    assert not dead, "\n".join(dead)
