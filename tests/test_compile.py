"""torch.compile: every architecture's training forward is one graph, compiled steps match eager, no recompiles.

Inductor's cold start costs 10-45 s per model on CPU, so the per-architecture checks use the `aot_eager` backend,
which captures the same forward and backward graphs (Dynamo + AOTAutograd) without generating code; one test runs
the real thing (inductor, through `angpt train --train.compile true`) for anGPT.
"""

import pytest
import torch
import torch._dynamo

import angpt
from angpt.train.step import TrainStep

from .test_train import TINY, metrics, run_cli


def steps(model, forward, n=3):
    """Losses of `n` training steps through the shared TrainStep, on fixed random batches."""
    opt, sched = angpt.make_optimizer(model, lr=3e-3, max_steps=10)
    step = TrainStep(model, opt, sched, device=torch.device("cpu"), dtype="fp32", forward=forward)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(n):
        x = torch.randint(0, model.config.vocab_size, (2, 17), generator=gen)
        losses.append(step(lambda x=x: (x[:, :-1], x[:, 1:])).loss)
    return losses


@pytest.mark.parametrize("arch", angpt.ARCHS)
def test_compiled_training_is_one_graph_matches_eager_and_does_not_recompile(arch):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = angpt.build_model(arch, "tiny")
    torch.manual_seed(0)
    model = angpt.build_model(arch, "tiny")
    # training's default loss (models/loss.py) on both sides; its equality with the logits path is
    # tests/test_fused_loss.py's (Adam turns rounding-level gradient differences into 1e-5 weight differences)
    model.fused_loss = eager.fused_loss = True
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break raises
    with torch._dynamo.config.patch(error_on_recompile=True):  # same shapes every step: one compile only
        got = steps(model, compiled)
    want = steps(eager, eager)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert all(
        torch.equal(a, b) or torch.allclose(a, b, atol=1e-6) for a, b in zip(model.parameters(), eager.parameters())
    )


@pytest.mark.slow
def test_train_compile_true_matches_eager(data_dir, tmp_path):
    """`angpt train --train.compile true` (inductor) gives eager's losses and un-prefixed checkpoint keys."""
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--train.max_steps", "3", "--train.save_every", "0"]
    assert run_cli(*common, "--out", tmp_path / "eager") == 0
    assert run_cli(*common, "--out", tmp_path / "compiled", "--train.compile", "true") == 0
    a, b = metrics(tmp_path / "eager"), metrics(tmp_path / "compiled")
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-4)
    from safetensors.torch import load_file

    ckpt = sorted((tmp_path / "compiled" / "checkpoints").glob("step_*"))[-1]
    assert not any(k.startswith("_orig_mod") for k in load_file(str(ckpt / "model.safetensors")))


def test_compile_without_a_compiler_is_a_one_line_error(data_dir, tmp_path, monkeypatch, capsys):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "run"
    rc = run_cli("--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.compile", "true")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "C++ compiler" in err[0], err
    assert not out.exists()  # nothing written


def test_bf16_where_it_does_not_pay_warns(monkeypatch):
    from angpt.train import hardware, step

    cpu = torch.device("cpu")
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.0)  # no bf16 instructions: emulated
    assert any("100x slower" in w for w in step.check_compute("bf16", cpu, compile=False))
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.6)  # instructions, but slower than fp32 (AMX hidden)
    (warning,) = step.check_compute("bf16", cpu, compile=False)
    assert "0.60x the speed of fp32" in warning and "--train.dtype fp32" in warning
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 2.0)
    assert step.check_compute("bf16", cpu, compile=False) == []
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.0)
    assert step.check_compute("fp32", cpu, compile=False) == []


@pytest.mark.parametrize("arch", angpt.ARCHS)
def test_compiled_kv_cache_generation_matches_eager_without_recompiling_every_step(arch):
    from torch._dynamo.utils import counters

    from angpt.infer import generate

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = angpt.build_model(arch, "tiny").eval()
    x = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    want = generate(model, x, max_new_tokens=12, temperature=0)
    got = generate(model, x, max_new_tokens=12, temperature=0, compile="aot_eager")
    assert torch.equal(got, want)
    assert counters["stats"]["unique_graphs"] <= 2  # 11 decoding steps, at most two compilations
