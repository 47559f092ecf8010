"""The command line over a trained checkpoint: generate, export, import-hf, eval, info, bench; one-line errors."""

import json
import shutil

import pytest
import torch

from angpt.checkpoint import load_checkpoint_model, save_checkpoint
from angpt.cli import main

from .test_lm_eval import memorise_capitals, write_tasks
from .test_train import TINY


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert train("angpt", data_dir, out, "--train.max_steps", "3") == 0
    return out


def train(arch, data, out, *extra) -> int:
    """`angpt train` of a tiny model (the shared TINY settings) on `data` into `out`."""
    return main(["train", "--arch", arch, "--data", str(data), *TINY, "--out", str(out), *map(str, extra)])


def one_line_error(capsys, rc, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_generate_is_deterministic_and_cache_free_path_agrees(run_dir, capsys):
    args = ["generate", str(run_dir), "--prompt", "the quick", "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args + ["--no-cache"]) == 0
    assert capsys.readouterr().out == first and len(first.strip()) > 0


def test_generate_prints_the_prompt_then_its_continuation_and_a_newline(run_dir, capsys):
    """Issue 55: generate printed the continuation alone and ended without a newline; it reads as a completion,
    the prompt first, ends its line, and --no-echo prints the continuation alone."""
    args = ["generate", str(run_dir), "--prompt", "the quick", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert main([*args, "--no-echo"]) == 0
    alone = capsys.readouterr().out
    assert out.startswith("the quick") and out.endswith("\n") and alone.endswith("\n")
    assert out == "the quick" + alone and len(alone.strip()) > 0


def test_generate_prompt_longer_than_context(run_dir, capsys):
    one_line_error(capsys, main(["generate", str(run_dir), "--prompt", "x" * 500]), "context")


def test_export_and_import_round_trip(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), str(out), "--format", "hf"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    one_line_error(capsys, main(["export", str(run_dir), str(tmp_path / "x"), "--format", "onnx"]), "onnx")
    assert not (tmp_path / "x").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    one_line_error(capsys, main(["export", str(run_dir), str(tmp_path / "busy")]), "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"


def test_import_hf_then_continue_training(data_dir, tmp_path, capsys):
    gpt_run = tmp_path / "gpt"
    assert train("gpt+", data_dir, gpt_run, "--train.max_steps", "2") == 0
    assert main(["export", str(gpt_run), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "qwen3"
    assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    original, _ = load_checkpoint_model(gpt_run)
    imported, tok = load_checkpoint_model(tmp_path / "imported")
    x = torch.tensor([tok.encode("the lazy dog")])
    assert torch.equal(original(x)[0], imported(x)[0])
    ckpt = sorted((tmp_path / "imported" / "checkpoints").glob("step_*"))[-1]
    cont = tmp_path / "continued"
    assert train("gpt+", data_dir, cont, "--train.max_steps", "1", "--init_from", ckpt) == 0
    first = json.loads((cont / "metrics.jsonl").read_text().splitlines()[0])
    fresh = json.loads((gpt_run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] < fresh["loss"]  # it starts from the imported (trained) weights, not a fresh init


@pytest.fixture(scope="module")
def capitals_run(tok, tmp_path_factory):
    """A run directory whose checkpoint is the anGPT that has memorised 8 capitals (see test_lm_eval)."""
    model = memorise_capitals(tok)
    root = tmp_path_factory.mktemp("capitals")
    tok.save(root / "tok")
    state = {"model_config": model.config.to_dict()}
    save_checkpoint(root / "run", 150, model.state_dict(), {}, state, tokenizer_dir=root / "tok")
    return root / "run"


def test_eval_on_a_local_task(capitals_run, tmp_path, capsys):
    """`angpt eval` scores what the model learned: the memorised capitals far above chance (1/4), the same
    questions with every label moved to a wrong choice below it."""
    write_tasks(tmp_path)
    out = tmp_path / "results.json"
    tasks = "capitals_true,capitals_shuffled"
    assert main(["eval", str(capitals_run), "--tasks", tasks, "--include", str(tmp_path), "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    true_acc, shuffled_acc = results["capitals_true"]["acc,none"], results["capitals_shuffled"]["acc,none"]
    assert true_acc >= 0.75 and shuffled_acc <= 0.25 < true_acc - 0.5, results
    assert results["capitals_true"]["sample_len"] == results["capitals_shuffled"]["sample_len"] == 8
    printed = capsys.readouterr().out
    assert f"capitals_true: acc,none={true_acc:.4f}" in printed
    assert f"capitals_shuffled: acc,none={shuffled_acc:.4f}" in printed


def test_missing_or_broken_checkpoint(run_dir, tmp_path, capsys):
    one_line_error(capsys, main(["generate", str(tmp_path / "nope"), "--prompt", "a"]), "does not exist")
    broken = tmp_path / "broken"
    shutil.copytree(sorted((run_dir / "checkpoints").glob("step_*"))[-1], broken)
    (broken / "model.safetensors").unlink()
    one_line_error(capsys, main(["export", str(broken), str(tmp_path / "o")]), "model.safetensors")
    assert not (tmp_path / "o").exists()


def test_info_prints_constants(capsys):
    assert main(["info", "--arch", "angpt", "--preset", "tiny", "--set", "nu_att=sqrt_pos"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["nu_att"] == "sqrt_pos" and info["constants"]["nu_qkv"] == pytest.approx(2.0)
    one_line_error(capsys, main(["info", "--arch", "angpt", "--preset", "tiny", "--set", "nu_att=bad"]), "nu_att")


def test_checkpoint_with_mismatched_shapes(run_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(sorted((run_dir / "checkpoints").glob("step_*"))[-1], bad)
    state = json.loads((bad / "state.json").read_text())
    state["model_config"]["d_ff"] = 96  # the stored weights have d_ff = 256
    (bad / "state.json").write_text(json.dumps(state))
    one_line_error(capsys, main(["generate", str(bad), "--prompt", "a"]), "shape")


def test_in_loop_task_evaluation(data_dir, tmp_path):
    write_tasks(tmp_path)
    out = tmp_path / "run"
    extra = ["--train.eval_tasks", "capitals_true", "--train.eval_tasks_every", "1"]
    extra += ["--train.eval_tasks_include", tmp_path, "--train.max_steps", "2"]
    assert train("gpt+", data_dir, out, *extra) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "task/capitals_true/acc" in r] == [1, 2]


def test_generate_compile_flag_compiles_the_decoding_step(run_dir, capsys, monkeypatch):
    import importlib

    gen = importlib.import_module("angpt.infer.generate")  # the module (angpt.infer.generate is also a function)

    compiled = []
    monkeypatch.setattr(gen.torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    args = ["generate", str(run_dir), "--prompt", "the quick", "--max-new-tokens", "8", "--temperature", "0"]
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main(args + ["--compile"]) == 0
    assert capsys.readouterr().out == eager and compiled == [{"backend": "inductor"}]


def test_prepare_doc_separator_flag(tmp_path, capsys):
    big = tmp_path / "book.txt"
    big.write_text("".join(f"chapter {i} " * 50 + "\n@@@\n" for i in range(40)))
    assert (
        main(
            [
                "prepare",
                "--source",
                str(big),
                "--tokenizer",
                "bytes",
                "--out",
                str(tmp_path / "d"),
                "--doc-separator",
                "@@@",
                "--val-fraction",
                "0.1",
                "--quiet",
            ]
        )
        == 0
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["options"]["doc_separator"] == "@@@"
    assert all(meta["splits"][s]["tokens"] > 0 for s in ("train", "val"))


def test_each_command_loads_only_its_own_code():
    """`angpt --version` took 7.6 s on a busy laptop, all of it importing torch for the parser (issue 48); `angpt train
    --help` imported nine study modules and torch, because every verb's parser was built (issue 54). Each command now
    builds its own parser only: neither loads torch nor a study module, and --version is argparse's own."""
    import subprocess
    import sys

    from angpt import __version__

    for argv, says in ((["--version"], f"angpt {__version__}"), (["train", "--help"], "usage: angpt train")):
        loaded = "'torch' in sys.modules, any(m.startswith('angpt.study') for m in sys.modules)"
        code = f"import sys\nfrom angpt.cli import main\ntry:\n    main({argv!r})\n"
        code += f"except SystemExit as e:\n    print(e.code, {loaded})"
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        lines = res.stdout.splitlines()
        assert res.returncode == 0 and lines[0].startswith(says) and lines[-1] == "0 False False", res.stdout[-500:]
