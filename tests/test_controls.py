"""The review's missing controls (docs/architectures.md#controls): gpt+wn, gpt+cos and frozen eigen learning rates.

Each test checks the control's defining property; the registry-wide tests (models, precision, generation, compile,
dry run) cover the new entries as they cover every architecture, and tests/test_reference.py checks gpt+wn's and
gpt+cos's forward pass against a float64 reference written from the equations.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

import angpt
from angpt.cli import main
from angpt.errors import ConfigError
from angpt.models import registry
from angpt.models.layers import WNLinear

from .test_reference import rope
from .test_train import TINY, final_weights, metrics, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")


def tokens(batch=4, length=33, seed=0, vocab=256):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def train(model, steps=4, lr=1e-2):
    """`steps` optimizer steps of the architecture's own recipe (no warm-up), on fixed random batches."""
    opt, _ = angpt.make_optimizer(model, lr=lr, max_steps=steps, warmup_steps=0)
    for i in range(steps):
        x = tokens(seed=i)
        model(x[:, :-1], x[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt


# -------------------------------------------------------------------------------------------------- gpt+wn
def test_gpt_wn_normalises_every_linear_map_but_not_the_embedding():
    """Every linear map of GPT+ (W_qkv, W_p, W_uz, W_d and the LM head) stores V and g instead of W; the embedding,
    a lookup, stays a plain table."""
    plain, wn = angpt.build_model("gpt+", "tiny"), angpt.build_model("gpt+wn", "tiny")
    maps = [n.removesuffix(".weight") for n, p in plain.named_parameters() if p.ndim == 2 and n != "embed.weight"]
    assert len(maps) == 4 * plain.config.n_layers + 1
    names = {n for n, _ in wn.named_parameters()}
    for m in maps:
        assert {m + ".v", m + ".g"} <= names and m + ".weight" not in names, m
        assert isinstance(wn.get_submodule(m), WNLinear)
    assert "embed.weight" in names


def test_gpt_wn_starts_as_gpt_plus():
    """g = ||V|| at init, so the effective weights are GPT+'s draws and the logits are GPT+'s, bit for bit."""
    torch.manual_seed(3)
    plain = angpt.build_model("gpt+", "tiny")
    torch.manual_seed(3)
    wn = angpt.build_model("gpt+wn", "tiny")
    for name, p in plain.named_parameters():
        owner, _, leaf = name.rpartition(".")
        assert torch.equal(getattr(wn.get_submodule(owner), leaf), p), name
    x = tokens()
    with torch.no_grad():
        assert torch.equal(wn(x)[0], plain(x)[0])


def test_gpt_wn_rows_have_norm_g_after_training():
    """After AdamW steps (weight decay on V, none on g), every row of the effective W has norm |g| to fp32
    precision and equals g V/||V|| computed here in float64; g and V both moved, g away from ||V||."""
    model = angpt.build_model("gpt+wn", "tiny")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, lr=2e-2)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, WNLinear)]
    assert len(layers) == 4 * model.config.n_layers + 1
    for name, m in layers:
        V, g = m.v.detach().double(), m.g.detach().double()
        assert not torch.equal(m.v, before[name + ".v"]) and not torch.equal(m.g, before[name + ".g"]), name
        assert (g - V.norm(dim=1)).abs().max() > 1e-3 * g.abs().max(), name  # g no longer ||V||: it is learned
        W = m.weight.detach()
        torch.testing.assert_close(W.double().norm(dim=1), g.abs(), rtol=1e-5, atol=0, msg=name)
        torch.testing.assert_close(W.double(), g[:, None] * V / V.norm(dim=1, keepdim=True), rtol=1e-5, atol=1e-8)


def test_gpt_wn_keeps_gpt_plus_recipe():
    """Same optimizer recipe as GPT+: AdamW, weight decay on every matrix (the directions V and the embedding),
    none on the gains g and the norms' gains, warm-up."""
    model = angpt.build_model("gpt+wn", "tiny")
    opt, _ = angpt.make_optimizer(model, lr=1e-3, max_steps=100)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["lr"] < 1e-3
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    named = dict(model.named_parameters())
    assert decayed == {id(p) for n, p in named.items() if n.endswith(".v") or n == "embed.weight"}
    assert registry.get("gpt+wn").recipe == registry.get("gpt+").recipe


def test_gpt_wn_folds_into_a_plain_gpt_plus():
    model = angpt.build_model("gpt+wn", "tiny")
    train(model)
    folded = angpt.fold_for_inference(model)
    assert not folded.config.weight_norm and not any(isinstance(m, WNLinear) for m in folded.modules())
    plain = angpt.build_model("gpt+", "tiny")
    assert {n for n, _ in folded.named_parameters()} == {n for n, _ in plain.named_parameters()}
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(folded(x)[0], model.eval()(x)[0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------- gpt+cos
def captured_attention(model, x, monkeypatch):
    """The (q, k, scale) each block hands to attention, in block order."""
    from angpt.models import gpt

    seen = []
    real = gpt.attend

    def attend(q, k, v, scale, *rest):
        seen.append((q, k, scale))
        return real(q, k, v, scale, *rest)

    monkeypatch.setattr(gpt, "attend", attend)
    with torch.no_grad():
        model(x)
    return seen


def test_gpt_cos_tau_starts_at_swin_v2_value():
    model = angpt.build_model("gpt+cos", "tiny")
    for block in model.blocks:
        assert block.q_norm is None and block.k_norm is None  # no RMSNorm gains: cosine attention replaces QK-norm
        torch.testing.assert_close(block.inv_tau(), torch.full((model.config.n_heads,), 10.0))  # 1/tau = 10
    cfg = angpt.make_config("gpt+cos", "tiny", cos_tau_init=0.25)
    torch.testing.assert_close(angpt.models.model_from_config(cfg).blocks[0].inv_tau(), torch.full((4,), 4.0))


def test_gpt_cos_at_tau_one_over_sqrt_dh_starts_as_gpt_plus():
    """QK-norm's logits at init (unit gains) are q.k/sqrt(d_h) over RMS-normalised q, k: sqrt(d_h) cos(q, k). So
    cosine attention with tau = 1/sqrt(d_h) is GPT+ at init, up to RMSNorm's eps (the documented equivalence)."""
    torch.manual_seed(5)
    plain = angpt.build_model("gpt+", "tiny")
    torch.manual_seed(5)
    cos = angpt.build_model("gpt+cos", "tiny", cos_tau_init=plain.config.head_dim**-0.5)
    torch.manual_seed(5)
    swin = angpt.build_model("gpt+cos", "tiny")  # the same weights at Swin v2's tau = 0.1: other logits
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(cos(x)[0], plain(x)[0], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(swin(x)[0], plain(x)[0], atol=1e-3)


def test_gpt_cos_logits_are_cosine_over_tau_with_tau_clamped(monkeypatch):
    """Block 0's attention logits (q . k times SDPA's scale, as handed to attention) equal cos(RoPE(W_q x),
    RoPE(W_k x)) / tau computed here in float64, per head; a head whose tau is set below 0.01 uses 1/0.01."""
    model = angpt.build_model("gpt+cos", "tiny")
    taus = torch.tensor([0.05, 0.3, 0.001, 0.0099])  # heads 2 and 3: below the clamp
    with torch.no_grad():
        model.blocks[0].inv_tau.logit_scale.copy_(torch.log(1 / taus))
    torch.testing.assert_close(model.blocks[0].inv_tau(), torch.tensor([20.0, 1 / 0.3, 100.0, 100.0]))
    x = tokens(2, 24)
    q, k, scale = captured_attention(model, x, monkeypatch)[0]
    got = (q.double() @ k.double().transpose(-1, -2)) * scale

    cfg, sd = model.config, {n: t.double() for n, t in model.state_dict().items()}
    h = sd["embed.weight"][x]
    a = h / (h.pow(2).mean(-1, keepdim=True) + cfg.norm_eps).sqrt() * sd["blocks.0.attn_norm.weight"]
    qkv = (a @ sd["blocks.0.qkv.weight"].T).view(2, 24, 3, cfg.n_heads, cfg.head_dim).permute(2, 0, 3, 1, 4)
    q_raw, k_raw = rope(qkv[0], cfg.rope_theta), rope(qkv[1], cfg.rope_theta)
    for head, tau in enumerate([0.05, 0.3, 0.01, 0.01]):
        qh, kh = q_raw[:, head], k_raw[:, head]
        cos = (qh @ kh.transpose(-1, -2)) / (qh.norm(dim=-1)[..., :, None] * kh.norm(dim=-1)[..., None, :])
        torch.testing.assert_close(got[:, head], cos / tau, rtol=1e-5, atol=1e-5 / tau, msg=f"head {head}")


def test_gpt_cos_tau_is_learned():
    model = angpt.build_model("gpt+cos", "tiny")
    before = [b.inv_tau.logit_scale.detach().clone() for b in model.blocks]
    opt = train(model, steps=2)
    assert all(not torch.equal(b.inv_tau.logit_scale, s) for b, s in zip(model.blocks, before))
    no_decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(b.inv_tau.logit_scale) in no_decay for b in model.blocks)  # a vector: no weight decay


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (dict(attention="cosine"), "set model.qk_norm=false"),  # gpt+ keeps QK-norm unless told
        (dict(attention="cosine", qk_norm=False, softmax_scale=2.0), "unset model.softmax_scale"),
        (dict(attention="cosine", qk_norm=False, cos_tau_init=0.005), "cos_tau_init"),
        (dict(attention="softmax"), "model.attention"),
    ],
)
def test_gpt_cos_bad_configs(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)) as e:
        angpt.make_config("gpt+", "tiny", **overrides)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ frozen eigen rates
FROZEN = [
    ("ngpt", "freeze_alpha", ("alpha_A", "alpha_M")),
    ("angpt", "freeze_alpha", ("alpha_A", "alpha_M")),
    ("ngpt", "freeze_scales", ("alpha_A", "alpha_M", "s_qk", "s_uz", "s_z")),
    ("angpt", "freeze_scales", ("alpha_A", "alpha_M", "s_qk", "s_z", "c_z")),
]


@pytest.mark.parametrize("arch,option,frozen", FROZEN, ids=[f"{a}-{o}" for a, o, _ in FROZEN])
def test_frozen_scales_stay_at_init_while_the_rest_trains(arch, option, frozen):
    """After steps at a large LR the frozen scales are bit-identical to their init; every other parameter moved;
    the optimizer does not hold them; the state dict has the unfrozen model's keys."""
    extra = {"gate_scale": "learnable"} if arch == "angpt" else {}  # anGPT's c_z exists only when learnable
    model = angpt.build_model(arch, "tiny", **{option: True}, **extra)
    assert model.state_dict().keys() == angpt.build_model(arch, "tiny", **extra).state_dict().keys()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = train(model, steps=5, lr=5e-2)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    is_frozen = {n: n.removesuffix(".param").rpartition(".")[2] in frozen for n in before}
    assert sum(is_frozen.values()) >= 2 * model.config.n_layers
    for name, p in model.named_parameters():
        if is_frozen[name]:
            assert torch.equal(p, before[name]) and not p.requires_grad and id(p) not in held, name
        else:
            assert not torch.equal(p, before[name]) and id(p) in held, name
    alpha = model.blocks[0].alpha_A()
    torch.testing.assert_close(alpha, torch.full_like(alpha, model.config.alpha_init))


def test_frozen_alpha_variants_are_compare_arms():
    assert registry.resolve_arm("ngpt_frozen_alpha") == ("ngpt", {"freeze_alpha": True})
    assert registry.resolve_arm("angpt_frozen_alpha") == ("angpt", {"freeze_alpha": True})
    from angpt.study.arms import parse_arm

    arm = parse_arm("angpt_frozen_alpha[freeze_scales=true]")
    assert arm.arch == "angpt" and arm.model == {"freeze_alpha": True, "freeze_scales": True}


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("gpt+", dict(freeze_alpha=True)),
        ("gpt+wn", dict(freeze_scales=True)),
        ("angpt", dict(weight_norm=True)),
        ("ngpt", dict(attention="cosine")),
    ],
)
def test_a_control_on_an_architecture_without_it_is_a_one_line_error(arch, overrides, capsys):
    ((name, value),) = overrides.items()
    with pytest.raises(ConfigError, match=re.escape(f"model.{name}={value!r} does not apply to arch {arch!r}")) as e:
        angpt.build_model(arch, "tiny", **overrides)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="does not apply"):  # a resolved config (a checkpoint's) is checked too
        angpt.models.model_from_config(dataclasses.replace(angpt.make_config(arch, "tiny"), **overrides))
    assert main(["info", "--arch", arch, "--preset", "tiny", "--set", f"{name}={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not apply" in err[0], err


def test_frozen_alpha_run_resumes_exactly_and_keeps_alpha(data_dir, tmp_path):
    """`angpt train --model.freeze_alpha true`: an interrupted and resumed run equals an uninterrupted one (the
    optimizer state of the trainable parameters round-trips), and the checkpointed alphas are their init."""
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--train.max_steps", "4", "--train.save_every", "0"]
    common += ["--model.freeze_alpha", "true", "--train.deterministic", "true"]
    assert run_cli(*common, "--out", tmp_path / "straight") == 0
    assert run_cli(*common, "--out", tmp_path / "split", "--train.stop_at", "2") == 0
    assert run_cli(*common, "--out", tmp_path / "split", "--resume", "auto") == 0
    assert [r["loss"] for r in metrics(tmp_path / "straight")] == [r["loss"] for r in metrics(tmp_path / "split")]
    wa, wb = final_weights(tmp_path / "straight"), final_weights(tmp_path / "split")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    init = angpt.build_model("angpt", "tiny", vocab_size=wa["embed.weight"].shape[0]).state_dict()
    alphas = [k for k in wa if "alpha_" in k]
    assert alphas and all(torch.equal(wa[k], init[k]) for k in alphas)
    assert not torch.equal(wa["s_z.param"], init["s_z.param"])  # the other scales trained


def test_a_checkpoint_written_before_the_controls_still_resumes():
    """A checkpoint's model config without the control fields (written before they existed) means them off: it
    resumes as the same model, and one with a control on is a different model."""
    from angpt.checkpoint import RunState
    from angpt.errors import UserError
    from angpt.models.config import CONTROLS
    from angpt.train.config import load_run_config
    from angpt.train.record import read_state_record
    from angpt.train.resume import check_resume
    from angpt.train.setup import resolve

    settings = {"arch": "angpt", "preset": "tiny"}
    old = {k: v for k, v in angpt.make_config("angpt", "tiny").to_dict().items() if k not in CONTROLS}
    old.pop("cos_tau_init")
    state = RunState(step=2, model_config=old)
    recorded = read_state_record({"run_config": settings, "model_config": old})  # the checkpoint's record

    def today(**model):
        over = settings | {f"model.{k}": v for k, v in model.items()}
        return resolve(load_run_config(None, over), device=torch.device("cpu"))

    assert check_resume("ckpt", recorded, today(), state) == []
    with pytest.raises(UserError, match="different model config"):
        check_resume("ckpt", recorded, today(freeze_alpha=True), state)


# ---------------------------------------------------------------------------------------------- bf16
@pytest.mark.parametrize("arch", ["gpt+wn", "gpt+cos", "angpt_frozen_alpha", "ngpt_frozen_alpha"])
def test_controls_train_under_bf16_autocast(arch):
    """One step under forced bf16 autocast (tiny shapes): parameters and gradients fp32, finite loss, bf16 logits
    within 2% of fp32 ones, and a frozen scale unchanged."""
    base, overrides = registry.resolve_arm(arch)
    torch.manual_seed(0)
    model = angpt.build_model(base, "tiny", **overrides)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt, _ = angpt.make_optimizer(model, lr=1e-2, max_steps=10, warmup_steps=0)
    x = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    loss.backward()
    opt.step()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32), name
        assert torch.equal(p, before[name]) != p.requires_grad, name  # trainable moved, frozen did not
    with torch.no_grad():
        ref, _ = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low, _ = model(x)
    assert ((low.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item() < 0.02


def test_angpt_info_accepts_controls(capsys):
    import json

    for name, key, value in [("gpt+wn", "weight_norm", True), ("gpt+cos", "attention", "cosine")]:
        assert main(["info", "--arch", name, "--preset", "tiny"]) == 0
        assert json.loads(capsys.readouterr().out)["config"][key] == value
    assert main(["info", "--arch", "angpt_frozen_alpha", "--preset", "tiny"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["arch"] == "angpt" and info["config"]["freeze_alpha"] is True
    assert math.isclose(info["constants"]["nu_qkv"], 2.0)
