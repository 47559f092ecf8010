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


def _stretched(arch):
    """A tiny model whose rows lie on both sides of norm 1 (anGPT's projection moves only the longer ones)."""
    torch.manual_seed(0)
    model = angpt.build_model(arch, "tiny")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(0.5 + torch.rand(p.shape[0], 1, generator=gen))
    return model


def test_a_compiled_training_forward_compiles_the_weight_constraint_too(monkeypatch):
    """`compile_for_training` (train.compile, the compiled bench and screen) hands the optimizer's constraint hook to
    torch.compile as well: eager it launches a norm and a division per matrix from Python after every step, most of
    anGPT's excess over GPT+'s compiled step on the H200 (benchmarks/RESULTS.md). torch.compile stubbed here; the
    compiled projection's numbers are test_the_compiled_weight_constraint_matches_the_eager_one's."""
    from angpt.train import step as train_step

    compiled = []
    monkeypatch.setattr(train_step.torch, "compile", lambda f, **kw: compiled.append(f) or f)
    for arch, hooked in (("angpt", True), ("ngpt", True), ("gpt+", False)):
        compiled.clear()
        model = angpt.build_model(arch, "tiny")
        opt, _ = angpt.make_optimizer(model, lr=1e-3, max_steps=10)
        assert hasattr(opt, "weight_constraint") == hooked
        assert train_step.compile_for_training(model, opt) is model
        assert compiled[-1] is model and len(compiled) == 1 + hooked
        if hooked:
            assert opt.weight_constraint.compiled is not None and compiled[0] is angpt.models.constraints.project


@pytest.mark.slow
def test_the_compiled_weight_constraint_matches_the_eager_one():
    """inductor's projection gives the eager constraint's weights: anGPT's rows longer than 1 come to 1 and the others
    stay as they were; nGPT's all come to 1, over the dims each matrix is constrained along."""
    from angpt.models.constraints import ConstraintHook

    for arch in ("angpt", "ngpt"):
        eager, compiled = _stretched(arch), _stretched(arch)
        before = {n: p.detach().clone() for n, p in eager.named_parameters()}
        ConstraintHook(eager.constraint_groups())()
        hook = ConstraintHook(compiled.constraint_groups())
        hook.compile()
        hook()
        assert hook.compiled is not None
        moved = 0
        for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), (arch, name)
            moved += int(not torch.equal(b, before[name]))
        assert moved >= 2 * eager.config.n_layers  # the projection ran on the compiled model's weights
    with pytest.raises(ValueError, match="unknown weight constraint"):
        angpt.models.constraints.project([torch.ones(2, 2)], (1,), "sphere")


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


def test_train_compile_auto_compiles_on_cuda_where_triton_is(monkeypatch):
    """`train.compile: auto` (the default) compiles on a GPU, where the step takes half the eager time (the H200 of
    2026-11-27), and not on a CPU; an explicit true or false is kept; anything else is refused by the config."""
    import importlib.util

    from angpt.train import config, step

    assert config.TrainConfig().compile == "auto"
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    real = importlib.util.find_spec
    monkeypatch.setattr(step.importlib.util, "find_spec", lambda name: object() if name == "triton" else real(name))
    monkeypatch.setattr(step.torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert step.resolve_compile("auto", cuda) is True and step.resolve_compile("auto", cpu) is False
    assert step.resolve_compile(False, cuda) is False and step.resolve_compile(True, cpu) is True
    monkeypatch.setattr(step.importlib.util, "find_spec", lambda name: None if name == "triton" else real(name))
    assert step.resolve_compile("auto", cuda) is False  # no triton: eager, not the one-line error of `true`
    monkeypatch.setattr(step.importlib.util, "find_spec", lambda name: object() if name == "triton" else real(name))
    monkeypatch.setattr(step.torch.cuda, "get_device_capability", lambda device: (6, 0))
    assert step.resolve_compile("auto", cuda) is False  # a Pascal GPU: triton does not run there
    cfg = config.load_run_config(None, {"train.compile": "auto"})
    assert cfg.train.compile == "auto"
    assert [config.parse_value("train.compile", t) for t in ("true", "false", "auto")] == [True, False, "auto"]
    with pytest.raises(angpt.errors.ConfigError, match="true, false or auto"):
        config.load_run_config(None, {"train.compile": "sometimes"})


def test_a_run_compiles_as_train_compile_resolves_and_afresh(data_dir, tmp_path, monkeypatch):
    """The trainer compiles by `resolve_compile`, not by the setting's truth ("auto" is a true string): a default run
    on a CPU trains eagerly, `true` compiles, with Dynamo reset first (one run of a study's many in a process).
    compile_for_training stubbed: a real compile costs seconds here."""
    import torch._dynamo

    from angpt.train import setup
    from angpt.train import step as train_step

    calls, resets = [], []
    monkeypatch.setattr(setup, "compile_for_training", lambda m, o, **kw: calls.append(kw) or m)
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--train.max_steps", "1", "--train.save_every", "0"]
    assert run_cli(*common, "--out", tmp_path / "auto") == 0 and calls == []
    assert run_cli(*common, "--out", tmp_path / "on", "--train.compile", "true") == 0 and calls == [{"fresh": True}]
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(train_step.torch, "compile", lambda f, **kw: f)
    model = angpt.build_model("gpt+", "tiny")
    opt, _ = angpt.make_optimizer(model, lr=1e-3, max_steps=2)
    train_step.compile_for_training(model, opt)
    assert resets == []
    train_step.compile_for_training(model, opt, fresh=True)
    assert resets == [1]


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


def test_sharded_weights_keep_the_eager_constraint(tmp_path, monkeypatch):
    """FSDP2 shards weights as DTensors, which the compiled projection is not written for: `compile()` leaves such a
    hook eager, and the eager (foreach) constraint still bounds a DTensor's rows. One process, a world of one (gloo);
    torch.compile stubbed to record what it is asked to compile."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from angpt.models import constraints

    asked = []
    monkeypatch.setattr(constraints.torch, "compile", lambda f, **kw: asked.append(f) or f)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        rows = torch.tensor([[3.0, 4.0], [0.3, 0.4]])  # norms 5 and 0.5
        sharded = torch.nn.Parameter(distribute_tensor(rows.clone(), mesh, [Shard(0)]))
        plain = torch.nn.Parameter(rows.clone())
        hook = constraints.ConstraintHook({"bounded": [(sharded, -1)]})
        hook.compile()
        assert hook.compiled is None and asked == []  # sharded: stays eager
        hook()
        assert isinstance(sharded.data, DTensor)
        got = sharded.data.full_tensor()
        assert torch.allclose(got, torch.tensor([[0.6, 0.8], [0.3, 0.4]]))  # the long row to 1, the short kept
        whole = constraints.ConstraintHook({"bounded": [(plain, -1)]})
        whole.compile()
        assert whole.compiled is constraints.project and asked == [constraints.project]  # plain: compiled
    finally:
        dist.destroy_process_group()


def test_measuring_norms_between_compiled_steps_does_not_recompile():
    """The deviation screen measures every layer's ||h|| after each compiled step (`inspect_norms`), and a
    calibrated nu_att measures attention outputs before one (`calibrate_nu_att`): both set the blocks' `recorder`.
    Dynamo guards on whether a block holds that attribute itself, so leaving it behind (even as None) compiled the
    whole model again at the next step (a 2.35 s second step on this CPU's tiny model; a full compile on a GPU).
    Afterwards each block is as it was, and the next compiled step runs under error_on_recompile."""
    from angpt.models import calibrate_nu_att, inspect_norms

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = angpt.build_model("angpt", "tiny")
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    before = [dict(b.__dict__) for b in model.blocks]
    compiled(x, x)[1].backward()
    assert set(inspect_norms(model, x)) >= {"layer0.h", "layer1.h"}
    calibrate_nu_att(model, [x])
    assert [dict(b.__dict__) for b in model.blocks] == before
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(x, x)[1].backward()
