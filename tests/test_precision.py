"""Every architecture trains in fp32 and under bf16 autocast, whatever this machine's hardware prefers.

Each dtype path is forced explicitly: `train.dtype: auto` picks bf16 on CUDA and on CPUs with native bf16, fp32
elsewhere, so a test that relied on `auto` would test a different path on each machine.
"""

import json

import pytest
import torch

import angpt
from angpt.models import registry

from .test_train import TINY, metrics, run_cli

# Each architecture, plus the variant arms that change the forward pass.
VARIANTS = [(arch, {}) for arch in angpt.ARCHS] + [
    ("gpt+", {"norm": "dyt"}),
    ("gpt+", {"norm": "ln_scaling"}),
    ("angpt", {"qk_norm_mode": "none"}),
    ("angpt", {"gate_scale": "learnable", "alpha_shape": "scalar"}),
]
IDS = [arch + "".join(f"-{v}" for v in kw.values()) for arch, kw in VARIANTS]


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def trained_tiny(arch, steps=4, **overrides):
    torch.manual_seed(0)
    model = angpt.build_model(arch, "tiny", **overrides)
    opt, _ = angpt.make_optimizer(model, lr=3e-3, max_steps=100)
    x = torch.randint(0, model.config.vocab_size, (4, 33))
    for _ in range(steps):
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt, x


@pytest.mark.parametrize("arch, overrides", VARIANTS, ids=IDS)
def test_bf16_training_step_keeps_fp32_master_weights(arch, overrides):
    model, opt, x = trained_tiny(arch, steps=0, **overrides)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with bf16():
        logits, loss = model(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    opt.step()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p).all(), name
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # The constraint ran after the bf16 step on the fp32 weights: rows are unit (nGPT) or inside the ball (anGPT).
    for kind, weights in model.constraint_groups().items():
        for w, dim in weights:
            norms = w.norm(dim=dim)
            if kind == "unit":
                assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
            elif kind == "bounded":
                assert norms.max() <= 1 + 1e-5


@pytest.mark.parametrize("arch, overrides", VARIANTS, ids=IDS)
def test_bf16_logits_stay_close_to_fp32(arch, overrides):
    """On trained weights, bf16 autocast logits are within 2% (relative RMS) of fp32 logits.

    bf16 keeps 8 significant bits, so one rounding of the logits alone costs ~0.2% relative; with fp32 accumulation
    in the matmuls and fp32 norms the whole forward measures 0.3-0.4% for every architecture at 2 and 12 layers. The
    2% bound leaves 5x headroom for hardware differences and still fails for a constant lost or applied twice on the
    bf16 path, or a norm computed in bf16 over a long sum.
    """
    model, _, x = trained_tiny(arch, **overrides)
    with torch.no_grad():
        ref, _ = model(x)
        with bf16():
            low, _ = model(x)
    rel = (low.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert rel < 0.02, f"{arch}: bf16 logits differ from fp32 by {float(rel):.3%} (relative RMS)"


@pytest.mark.parametrize("arch", ["ngpt", "angpt", "gpt+"])
def test_bf16_run_trains_and_resumes_exactly(arch, data_dir, tmp_path):
    """`angpt train --train.dtype bf16` (the path `auto` takes on GPUs and AMX CPUs) runs and resumes bit for bit."""
    common = ["--arch", arch, "--data", data_dir, *TINY, "--train.max_steps", "4", "--train.deterministic", "true"]
    common += ["--train.dtype", "bf16", "--train.save_every", "0"]
    assert run_cli(*common, "--out", tmp_path / "straight") == 0
    assert run_cli(*common, "--out", tmp_path / "split", "--train.stop_at", "2") == 0
    assert run_cli(*common, "--out", tmp_path / "split", "--resume", "auto") == 0
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert all(r["loss"] == r["loss"] for r in a)  # no NaN


def test_activation_checkpointing_gives_the_same_gradients():
    """Recomputing each block in backward (train.activation_checkpointing) changes memory, not numbers."""
    from angpt.train.dist import DistInfo, parallelize

    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = angpt.build_model("angpt", "tiny")
        model = parallelize(model, DistInfo(0, 1, 0, torch.device("cpu")), activation_checkpointing=recompute)
        x = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


def test_activation_checkpointing_recomputes_blocks(monkeypatch):
    """With checkpointing on, each block's forward runs twice per training step (forward, then in backward)."""
    from angpt.models.angpt import ANGPTBlock
    from angpt.train.dist import DistInfo, parallelize

    calls = []
    original = ANGPTBlock.forward
    monkeypatch.setattr(ANGPTBlock, "forward", lambda self, h, ctx: calls.append(1) or original(self, h, ctx))
    model = parallelize(
        angpt.build_model("angpt", "tiny"), DistInfo(0, 1, 0, torch.device("cpu")), activation_checkpointing=True
    )
    x = torch.randint(0, 256, (2, 17))
    model(x[:, :-1], x[:, 1:])[1].backward()
    assert len(calls) == 2 * model.config.n_layers
    calls.clear()
    with torch.no_grad():
        model.eval()(x)  # evaluation never recomputes
    assert len(calls) == model.config.n_layers


def test_fsdp_mixed_precision_policy_under_bf16(monkeypatch):
    """FSDP2 under bf16: parameters gathered in bf16 for compute, gradients reduced in fp32."""
    import torch.distributed.fsdp as fsdp

    from angpt.train.dist import DistInfo, parallelize

    policies = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, mp_policy=None: policies.append(mp_policy))
    parallelize(angpt.build_model("angpt", "tiny"), DistInfo(0, 2, 0, torch.device("cpu")), "fsdp", dtype="bf16")
    *blocks, root = policies
    assert blocks and all(p.param_dtype == torch.bfloat16 and p.reduce_dtype == torch.float32 for p in blocks)
    assert root.param_dtype is None and root.reduce_dtype == torch.float32  # embedding/head fp32: fp32 residual


@pytest.mark.parametrize("arch", angpt.ARCHS)
def test_bf16_kv_cache_decoding_matches_full_forward(arch):
    """Incremental decoding through the KV cache under bf16 autocast gives the full forward's logits (within bf16)."""
    model, _, x = trained_tiny(arch)
    model.eval()
    x = x[:2, :24]
    with torch.no_grad(), bf16():
        full, _ = model(x)
        cache = model.make_cache(2, 24)
        steps = [model(x[:, :8], cache=cache)[0]] + [model(x[:, t : t + 1], cache=cache)[0] for t in range(8, 24)]
    inc = torch.cat(steps, dim=1).float()
    rel = (inc - full.float()).pow(2).mean().sqrt() / full.float().pow(2).mean().sqrt()
    assert rel < 0.02, f"{arch}: cached bf16 decoding differs from the full forward by {float(rel):.3%}"


@pytest.mark.parametrize("arch", [a for a in angpt.ARCHS if registry.get(a).folded is not None])
def test_folded_model_under_bf16_matches_training_model(arch):
    model, _, x = trained_tiny(arch)
    model.eval()
    folded = angpt.fold_for_inference(model)
    with torch.no_grad(), bf16():
        a, _ = model(x)
        b, _ = folded(x)
    rel = (a.float() - b.float()).pow(2).mean().sqrt() / a.float().pow(2).mean().sqrt()
    assert rel < 0.02


def test_auto_resolves_once_per_run_and_a_resume_keeps_it(data_dir, tmp_path, monkeypatch, capsys):
    """`train.dtype: auto` is resolved when a run starts and recorded in its checkpoints: resumed on a machine
    that would pick fp32, the run goes on in bf16, bit for bit; asking for the other dtype is refused in one line,
    and naming the recorded one explicitly is the same run."""
    from angpt.train import hardware

    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--train.max_steps", "4", "--train.deterministic", "true"]
    common += ["--train.save_every", "0"]
    assert run_cli(*common, "--train.dtype", "bf16", "--out", tmp_path / "straight") == 0

    split = [*common, "--train.dtype", "auto", "--out", tmp_path / "split"]
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 2.0)  # this machine: bf16 pays
    assert run_cli(*split, "--train.stop_at", "2") == 0
    (ckpt,) = (tmp_path / "split" / "checkpoints").glob("step_*")
    assert json.loads((ckpt / "state.json").read_text())["run"]["train"]["dtype"] == "bf16"

    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.6)  # another machine: auto would pick fp32
    capsys.readouterr()
    rows = metrics(tmp_path / "split")
    assert run_cli(*common, "--train.dtype", "fp32", "--out", tmp_path / "split", "--resume", "auto") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained in bf16" in err[0] and "--train.dtype bf16" in err[0], err
    assert metrics(tmp_path / "split") == rows  # nothing trained, nothing rewritten

    assert run_cli(*split, "--train.stop_at", "3", "--resume", "auto") == 0
    assert run_cli(*common, "--train.dtype", "bf16", "--out", tmp_path / "split", "--resume", "auto") == 0
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def test_auto_picks_bf16_only_where_it_is_measured_faster(monkeypatch):
    """bf16 on a CPU only where its matmuls are measured >= 1.5x fp32's: the flags alone do not say it (a Xeon
    with AMX hidden by its hypervisor reports AVX512-BF16 and multiplies bf16 at ~0.6x fp32's speed)."""
    from angpt.train import hardware
    from angpt.train.step import resolve_dtype

    cpu = torch.device("cpu")
    for speedup, want in ((0.0, "fp32"), (0.6, "fp32"), (1.49, "fp32"), (1.5, "bf16"), (8.0, "bf16")):
        monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda s=speedup: s)
        assert resolve_dtype("auto", cpu) == want, speedup
        assert resolve_dtype("fp32", cpu) == "fp32" and resolve_dtype("bf16", cpu) == "bf16"


def test_cpu_bf16_speedup_measures_only_cpus_with_bf16_instructions_once_per_machine(monkeypatch, tmp_path):
    """No bf16 instructions: nothing measured. Otherwise one measurement per machine, kept on disk: a later process
    on the same machine reads it back (one machine, one answer), another CPU or torch measures anew."""
    from angpt.train import hardware

    monkeypatch.setenv("ANGPT_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(hardware, "measure_bf16_speedup", lambda: calls.append(1) or 0.6)
    for flags, want, measured in (
        (set(), 0.0, 0),
        ({"avx2", "avx512_bf16"}, 0.6, 1),
        ({"avx2", "avx512_bf16"}, 0.6, 0),  # the same machine again: read back
        ({"amx_bf16"}, 0.6, 1),  # another CPU
    ):
        monkeypatch.setattr(hardware, "cpu_flags", lambda f=flags: frozenset(f))
        hardware.cpu_bf16_speedup.cache_clear()
        calls.clear()
        assert hardware.cpu_bf16_speedup() == pytest.approx(want)
        assert len(calls) == measured, flags
    assert len(json.loads((tmp_path / "cpu_bf16.json").read_text())) == 2
    hardware.cpu_bf16_speedup.cache_clear()


@pytest.mark.parametrize("true_speedup", [2.0, 0.6])
def test_the_dtype_decision_survives_a_noisy_timer(true_speedup):
    """Ten measurements with timings that jitter by +-10% and, one trial in four, slow 8x (another process on the
    core): every one lands within 25% of the true ratio, so auto decides the same way every time."""
    import random

    from angpt.train.hardware import BF16_MIN_SPEEDUP, measure_bf16_speedup

    for seed in range(10):
        rng = random.Random(seed)

        def timer(dtype, rng=rng):
            t = 1.0 if dtype == "fp32" else 1.0 / true_speedup
            return t * rng.uniform(0.9, 1.1) * (8.0 if rng.random() < 0.25 else 1.0)

        got = measure_bf16_speedup(timer)
        assert got == pytest.approx(true_speedup, rel=0.25), (seed, got)
        assert (got >= BF16_MIN_SPEEDUP) == (true_speedup >= BF16_MIN_SPEEDUP)


def test_resume_check_compares_the_recorded_dtype_and_leaves_an_unrecorded_auto_to_this_machine(monkeypatch):
    """A record keeps the dtype `auto` gave: a resume computing in another is refused, `auto` keeps the recorded
    one on any machine. A checkpoint from before the dtype was recorded (requested `auto`) compares none and
    resolves `auto` where it resumes."""
    from angpt.checkpoint import RunState
    from angpt.errors import UserError
    from angpt.train import hardware
    from angpt.train.config import load_run_config
    from angpt.train.record import read_state_record
    from angpt.train.resume import check_resume
    from angpt.train.setup import resolve, resumed_dtype

    cpu = torch.device("cpu")

    def run(dtype):
        return resolve(load_run_config(None, {"arch": "angpt", "preset": "tiny", "train.dtype": dtype}), device=cpu)

    new = run("bf16").to_dict()  # a run whose auto gave bf16
    state = RunState(step=0, model_config=new["model"])
    assert check_resume("ckpt", new, run("bf16"), state) == []
    with pytest.raises(UserError, match="computing in fp32: the run was trained in bf16"):
        check_resume("ckpt", new, run("fp32"), state)
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda: 0.6)  # this machine would pick fp32
    assert resumed_dtype("auto", new, cpu) == "bf16"  # auto keeps the run's dtype on any machine
    assert resumed_dtype("fp32", new, cpu) == "fp32"  # an explicit request is what it says (refused above)
    given = {"arch": "angpt", "preset": "tiny", "train": {"dtype": "auto"}}
    old = read_state_record({"run_config": given, "model_config": new["model"]})  # no compute_dtype recorded
    assert old["train"]["dtype"] is None
    assert check_resume("ckpt", old, run("bf16"), state) == [] and check_resume("ckpt", old, run("fp32"), state) == []
    assert resumed_dtype("auto", old, cpu) == "fp32"


def test_cpuinfo_gives_the_first_processors_model_and_flags(monkeypatch):
    from angpt.train import hardware

    text = "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512_bf16\n\n"
    text += "processor\t: 1\nflags\t: amx_bf16\n"
    info = hardware.parse_cpuinfo(text)
    assert info["model name"] == "Some Xeon" and info["flags"] == "fpu avx2 avx512_bf16"
    monkeypatch.setattr(hardware, "cpu_info", lambda: info)
    assert hardware.cpu_flags() == {"fpu", "avx2", "avx512_bf16"}
    assert hardware.cpu_bf16_instructions() == ["avx512_bf16"]  # not the second processor's amx_bf16
