"""An independent, formula-by-formula reference forward pass for nGPT, anGPT and the GPT+ controls gpt+wn and
gpt+cos (docs/architectures.md).

The reference below is written from the documented equations, not from the model code: it imports nothing from
`angpt.models` for the math (its own RoPE, Norm, causal softmax attention with an explicit mask, SwiGLU, and
its own nu constants, nu_act by quadrature rather than Monte Carlo). It reads only a model's `state_dict()` and
`config`, applies every constant exactly where the paper applies it (nothing merged into weights, nothing folded)
and computes in float64. Each test trains a tiny model a few steps, so that every learned scale has moved away
from its init and the weight constraint has run, then compares the model's fp32 logits with the reference's on
fresh tokens, and checks the trained weights satisfy the documented row constraint (a forward comparison alone reads
the model's own weights and so cannot see a constraint applied along the wrong dimension).

Of the model's state the reference takes one constant as given: anGPT's `nu_att` buffer (the per-position
attention factor, a Monte Carlo estimate or a calibrated value); for `none` and `sqrt_pos` it checks the buffer
against the closed form, and for `dense` that the first position's factor is exactly 1.
"""

from __future__ import annotations

import math

import pytest
import torch

import angpt

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS, LR, BATCH = 6, 2e-2, 4
F64 = torch.float64


# ------------------------------------------------------------------------------------------ building blocks
def norm(x: torch.Tensor) -> torch.Tensor:
    """Norm(x) = x / ||x|| over the last dim."""
    return x / x.pow(2).sum(-1, keepdim=True).sqrt()


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE, rotate-half layout (Qwen3 / Llama): pair (i, i + d_h/2) rotated by t * theta^(-2i/d_h); x [B,H,T,d_h]."""
    T, dh = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, dh, 2, dtype=F64) / dh)
    angle = torch.arange(T, dtype=F64)[:, None] * inv_freq[None, :]  # [T, d_h/2]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * q k^T) v with query t seeing keys 0..t; [B,H,T,d_h]."""
    T = q.shape[-2]
    scores = scale * (q @ k.transpose(-1, -2))
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, -math.inf)
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def act(name: str, z: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return z / (1.0 + torch.exp(-z))
    if name == "gelu":  # exact (erf) GELU
        return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))
    raise ValueError(name)


def gaussian_moment(name: str, std: float, power: int) -> float:
    """E[act(z)^power] for z ~ N(0, std^2), by the trapezoid rule on a fine grid over +-12 std (float64).

    The integrand is smooth and decays like a Gaussian, so the rule is accurate to far below 1e-9 here.
    """
    z = torch.linspace(-12 * std, 12 * std, 48001, dtype=F64)
    density = torch.exp(-0.5 * (z / std) ** 2) / (std * math.sqrt(2 * math.pi))
    return float(torch.trapezoid(act(name, z) ** power * density, z))


def heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, _ = x.shape
    return x.view(B, T, H, -1).transpose(1, 2)


def merge(x: torch.Tensor) -> torch.Tensor:
    B, H, T, dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * dh)


def effective(p: torch.Tensor, init: float, scale: float | None, d: int, speed: float = 1.0) -> torch.Tensor:
    """A reparameterised scale: stored * init / scale, scale None meaning 1/sqrt(d); alpha's scale is divided by
    its speed (alpha_speed)."""
    return p * (init * speed / (scale if scale is not None else 1.0 / math.sqrt(d)))


def default_softmax_scale(cfg) -> float:
    """sqrt(d_h) for nGPT and anGPT (unit-norm q, k; for anGPT's qk_norm_mode="none", q and k have norm
    ~1 through nu_qkv, and the open choices keep the scale, only making it configurable)."""
    return cfg.softmax_scale if cfg.softmax_scale is not None else math.sqrt(cfg.head_dim)


# ---------------------------------------------------------------------------------------------- nGPT
def ngpt_logits(sd: dict[str, torch.Tensor], cfg, x: torch.Tensor) -> torch.Tensor:
    d, H, dh, dff = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.ffn_dim
    W = {k: v.detach().to(F64) for k, v in sd.items()}
    scale = default_softmax_scale(cfg)
    h = W["embed.weight"][x]  # unit rows: the first h, not renormalised
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        Wqkv = W[p + "qkv.weight"]
        Wq, Wk, Wv = Wqkv[:d], Wqkv[d : 2 * d], Wqkv[2 * d :]
        q, k, v = heads(h @ Wq.T, H), heads(h @ Wk.T, H), heads(h @ Wv.T, H)
        s_qk = effective(W[p + "s_qk.param"], cfg.s_qk_init, cfg.s_qk_scale, d).view(H, 1, dh)
        q = s_qk * norm(rope(q, cfg.rope_theta))  # per head, after RoPE
        k = s_qk * norm(rope(k, cfg.rope_theta))
        o = causal_attention(q, k, v, scale)
        h_A = norm(merge(o) @ W[p + "proj.weight"].T)
        a_A = effective(W[p + "alpha_A.param"], cfg.alpha_init, cfg.alpha_scale, d, cfg.alpha_speed).abs()
        h = norm(h + a_A * (h_A - h))
        Wup = W[p + "up.weight"]
        s_uz = effective(W[p + "s_uz.param"], cfg.s_uz_init, cfg.s_uz_scale, d) * math.sqrt(d)
        u = s_uz[:dff] * (h @ Wup[:dff].T)
        z = s_uz[dff:] * (h @ Wup[dff:].T)
        h_M = norm((u * act(cfg.activation, z)) @ W[p + "down.weight"].T)
        a_M = effective(W[p + "alpha_M.param"], cfg.alpha_init, cfg.alpha_scale, d, cfg.alpha_speed).abs()
        h = norm(h + a_M * (h_M - h))
    s_z = effective(W["s_z.param"], cfg.s_z_init, cfg.s_z_scale, d)
    return s_z * (h @ W["lm_head.weight"].T)  # no final norm


# --------------------------------------------------------------------------------------------- anGPT
def nu(a: torch.Tensor) -> torch.Tensor:
    return 1.0 / (a**2 + (1.0 - a) ** 2).sqrt()


def angpt_nu_act(cfg) -> float:
    d, dff = cfg.d_model, cfg.ffn_dim
    z_std = math.sqrt(d / dff) * math.sqrt(d) / math.sqrt(d)  # nu_uz * c_z / sqrt(d)
    return gaussian_moment(cfg.activation, z_std, 2) ** -0.5


def angpt_logits(sd: dict[str, torch.Tensor], cfg, x: torch.Tensor, nu_act_factor: float = 1.0) -> torch.Tensor:
    """anGPT per docs/architectures.md; `nu_act_factor` perturbs nu_act (for the tolerance, see `_assert_matches`)."""
    d, H, dh, dff = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.ffn_dim
    W = {k: v.detach().to(F64) for k, v in sd.items()}
    T = x.shape[1]
    nu_qkv = math.sqrt(d / dh)
    nu_p = math.sqrt(dh / d)
    nu_uz = math.sqrt(d / dff)
    nu_d = math.sqrt(dff / d)
    nu_act = angpt_nu_act(cfg) * nu_act_factor
    nu_att = W["nu_att"][:T].view(T, 1)  # the model's buffer (per query position)
    scale = default_softmax_scale(cfg)
    h = W["embed.weight"][x]
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        Wqkv = W[p + "qkv.weight"]
        Wq, Wk, Wv = Wqkv[:d], Wqkv[d : 2 * d], Wqkv[2 * d :]
        a = norm(h) if cfg.input_norm == "block" else h  # ours: an exact norm of the attention's input
        q = heads(nu_qkv * (a @ Wq.T), H)
        k = heads(nu_qkv * (a @ Wk.T), H)
        v = heads(nu_qkv * (a @ Wv.T), H)
        q, k = rope(q, cfg.rope_theta), rope(k, cfg.rope_theta)
        if cfg.qk_norm_mode == "exact":
            s_qk = effective(W[p + "s_qk.param"], cfg.s_qk_init, cfg.s_qk_scale, d).view(H, 1, dh)
            q, k = s_qk * norm(q), s_qk * norm(k)
        o = nu_att * causal_attention(q, k, v, scale)
        h_A = nu_p * (merge(o) @ W[p + "proj.weight"].T)
        a_A = effective(W[p + "alpha_A.param"], cfg.alpha_init, cfg.alpha_scale, d, cfg.alpha_speed).abs()
        h = nu(a_A) * (h + a_A * (h_A - h))
        if cfg.gate_scale == "learnable":
            c_z = effective(W[p + "c_z.param"], cfg.s_uz_init, cfg.s_uz_scale, d) * math.sqrt(d)
        else:
            c_z = math.sqrt(d)
        Wup = W[p + "up.weight"]
        m_in = norm(h) if cfg.input_norm in ("mlp", "block") else h  # ours: an exact norm of the MLP's input
        u = nu_uz * (m_in @ Wup[:dff].T)
        z = nu_uz * c_z * (m_in @ Wup[dff:].T)
        m = nu_act * u * act(cfg.activation, z)
        h_M = nu_d * (m @ W[p + "down.weight"].T)
        a_M = effective(W[p + "alpha_M.param"], cfg.alpha_init, cfg.alpha_scale, d, cfg.alpha_speed).abs()
        h = nu(a_M) * (h + a_M * (h_M - h))
    # s_z starts where GPT+'s logits start: std init_std * sqrt(d) = s_z / sqrt(d) for unit h and rows
    s_z_init = cfg.s_z_init if cfg.s_z_init is not None else cfg.init_std * d
    s_z = effective(W["s_z.param"], s_z_init, cfg.s_z_scale, d)
    return s_z * (h @ W["lm_head.weight"].T)


# -------------------------------------------------------------------------------------------- helpers
def _batch(gen: torch.Generator, V: int, B: int, T: int) -> torch.Tensor:
    """Random 16-token snippets repeated: copying them rewards sharp attention, so attention actually trains."""
    snippet = torch.randint(0, V, (B, 16), generator=gen)
    return snippet.repeat(1, (T + 15) // 16)[:, :T]


def _train(model, steps: int = STEPS, lr: float = LR) -> None:
    cfg = model.config
    opt, sched = angpt.make_optimizer(model, lr=lr, max_steps=steps)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = _batch(gen, cfg.vocab_size, BATCH, cfg.context_length + 1)
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)


SCALES = {  # stored-parameter suffix -> (init, scale, speed) config fields; no speed field: 1
    "alpha_A.param": ("alpha_init", "alpha_scale", "alpha_speed"),
    "alpha_M.param": ("alpha_init", "alpha_scale", "alpha_speed"),
    "s_qk.param": ("s_qk_init", "s_qk_scale", None),
    "s_uz.param": ("s_uz_init", "s_uz_scale", None),
    "c_z.param": ("s_uz_init", "s_uz_scale", None),
    "s_z.param": ("s_z_init", "s_z_scale", None),
}


def _assert_scales_moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], cfg) -> None:
    seen = set()
    for name, p in after.items():
        suffix = ".".join(name.split(".")[-2:])
        if suffix not in SCALES:
            continue
        init, scale, speed = (getattr(cfg, f) if f else 1.0 for f in SCALES[suffix])
        init = cfg.init_std * cfg.d_model if init is None else init  # s_z_init null: GPT+'s logit spread
        moved = effective(p - before[name], init, scale, cfg.d_model, speed).abs()  # effective is linear in p
        # 1e-3, or 2% of a small init (alpha 0.01 moves 5x less per step than nGPT's 0.05)
        enough = min(1e-3, 0.02 * abs(init))
        assert moved.max() > enough, f"{name} did not move in training: the test would not see a wrong scale there"
        seen.add(suffix)
    expected = {"alpha_A.param", "alpha_M.param", "s_z.param"}
    if cfg.arch == "ngpt" or cfg.qk_norm_mode == "exact":
        expected.add("s_qk.param")
    if cfg.arch == "ngpt":
        expected.add("s_uz.param")
    if cfg.arch == "angpt" and cfg.gate_scale == "learnable":
        expected.add("c_z.param")
    assert seen == expected, f"learned scales {sorted(seen)}, expected {sorted(expected)}"


@torch.no_grad()
def _flip_alpha_signs(model) -> None:
    """Negate every other stored alpha coordinate (scalar alpha: block 0's), after training.

    Training a few steps from alpha_init = 0.05 does not reliably cross zero, yet the effective alpha is |.|
    (learned scales), so negating a stored alpha must leave the model unchanged: a model that forgot the abs() now
    computes a different function from the reference.
    """
    for name, p in model.named_parameters():
        if name.endswith(("alpha_A.param", "alpha_M.param")):
            if p.numel() > 1:
                p[::2].neg_()
            elif name.startswith("blocks.0."):
                p.neg_()


def _check_constraint(sd: dict[str, torch.Tensor], cfg) -> None:
    """nGPT rows unit along the d dimension (dim 1 of embedding, head, W_qkv, W_uz; dim 0 of W_p, W_d);
    anGPT every row along the input dimension (dim 1) has norm <= 1."""
    names = ["embed.weight", "lm_head.weight"]
    for i in range(cfg.n_layers):
        names += [f"blocks.{i}.{n}.weight" for n in ("qkv", "proj", "up", "down")]
    for name in names:
        w = sd[name].double()
        if cfg.arch == "ngpt":
            dim = 0 if name.endswith(("proj.weight", "down.weight")) else 1
            err = (w.norm(dim=dim) - 1).abs().max().item()
            assert err < 1e-5, f"{name}: slices along dim {dim} are not unit norm (max |norm - 1| = {err:.2e})"
        else:
            excess = (w.norm(dim=1) - 1).max().item()
            assert excess < 1e-5, f"{name}: a row along dim 1 has norm 1 + {excess:.2e} > 1"


def _check_nu_att(nu_att: torch.Tensor, cfg) -> None:
    t = torch.arange(1, cfg.context_length + 1, dtype=F64)
    nu_att = nu_att.double()
    if cfg.nu_att == "none":
        torch.testing.assert_close(nu_att, torch.ones_like(t))
    elif cfg.nu_att == "sqrt_pos":
        torch.testing.assert_close(nu_att, t.sqrt())
    elif cfg.nu_att == "dense":  # one key: o_1 = v_1 exactly, so the factor is 1
        assert abs(nu_att[0].item() - 1) < 1e-6
        assert (nu_att[1:] > 1).all() and (nu_att.diff() >= -1e-3).all()


# fp32 forward against a float64 reference: the observed max error is ~3e-7 of the logits' scale at these sizes
# (a few ulps per op over a few layers); 5e-6 leaves a >10x margin and is still far below any wrong constant.
FP32_REL = 5e-6
# The model's nu_act is a seeded Monte Carlo estimate over `mc_samples` draws, the reference's is exact (the two
# differ by ~1.1e-3 relative at 2^20 samples, 1.6 standard errors). Allow NU_ACT_SIGMAS standard errors of that
# estimator (relative SE of 1/sqrt(mean of act(z)^2) is CV / (2 sqrt(N)), CV of act(z)^2 from the quadrature).
NU_ACT_SIGMAS = 5.0


def _assert_matches(got: torch.Tensor, ref: torch.Tensor, sd, cfg, x: torch.Tensor) -> None:
    """max |model - reference| within fp32 rounding, after (anGPT) explaining the nu_act Monte Carlo error.

    anGPT: a blanket tolerance wide enough for the Monte Carlo nu_act (~1e-3 of the logits) would also hide
    small real errors. Instead, fit the one scalar that is legitimately unknown: the relative error eps of the
    model's nu_act. J = d logits / d(log nu_act) by a central difference of the reference at 1 +- delta; eps is
    the least-squares coefficient of (model - reference) on J. The test requires |eps| <= delta (the Monte Carlo
    bound) and the residual model - reference - eps J to be fp32 rounding plus the second-order term, which for
    |eps| <= delta is at most |ref(1+delta) + ref(1-delta) - 2 ref| / 2. Any other discrepancy (a dropped or
    misplaced constant, a wrong RoPE, a missing abs) either is not along J or needs |eps| >> delta.
    """
    scale = ref.abs().max().item()
    fp32 = FP32_REL * scale
    diff = got - ref
    if cfg.arch == "ngpt":
        err = diff.abs().max().item()
        assert err <= fp32, f"max |model - reference| = {err:.3e} > {fp32:.3e} (max |logit| {scale:.3f})"
        return
    z_std = math.sqrt(cfg.d_model / cfg.ffn_dim)  # nu_uz * c_z / sqrt(d), c_z = sqrt(d)
    m2, m4 = gaussian_moment(cfg.activation, z_std, 2), gaussian_moment(cfg.activation, z_std, 4)
    delta = NU_ACT_SIGMAS * math.sqrt(m4 / m2**2 - 1) / (2 * math.sqrt(cfg.mc_samples))
    plus = angpt_logits(sd, cfg, x, nu_act_factor=1 + delta)
    minus = angpt_logits(sd, cfg, x, nu_act_factor=1 - delta)
    J = (plus - minus) / (2 * delta)
    eps = ((diff * J).sum() / (J * J).sum()).item()
    assert abs(eps) <= delta, (
        f"model - reference is {eps:.3e} * d logits/d log(nu_act): more than the Monte Carlo bound {delta:.2e} "
        f"on nu_act's relative error (max |model - reference| = {diff.abs().max():.3e})"
    )
    resid = (diff - eps * J).abs().max().item()
    tol = fp32 + (plus + minus - 2 * ref).abs().max().item() / 2
    assert resid <= tol, (
        f"max |model - reference - eps J| = {resid:.3e} > {tol:.3e} (eps = {eps:.2e}; max |logit| {scale:.3f})"
    )


# ---------------------------------------------------------------------------------------------- tests
CASES = [
    ("ngpt", {}),
    ("ngpt", dict(n_layers=3, d_model=128, n_heads=4)),
    ("ngpt", dict(softmax_scale=3.0)),
    (
        "ngpt",  # every init and scale away from its default, so a swapped init/scale or a dropped gain shows
        dict(alpha_init=0.1, alpha_scale=0.5, s_qk_init=1.5, s_qk_scale=0.25, s_uz_init=0.5, s_uz_scale=2.0)
        | dict(s_z_init=2.0, s_z_scale=0.5, rope_theta=500.0),
    ),
    ("angpt", {}),
    ("angpt", dict(qk_norm_mode="none")),
    ("angpt", dict(qk_norm_mode="none", softmax_scale=2.0)),
    ("angpt", dict(gate_scale="learnable", alpha_shape="scalar")),
    ("angpt", dict(nu_att="sqrt_pos")),
    ("angpt", dict(nu_att="dense", n_layers=3, d_model=128, n_heads=8, d_ff=384)),  # the paper's (default: none)
    (
        "angpt",
        dict(gate_scale="learnable", s_uz_init=0.5, s_uz_scale=2.0, alpha_init=0.1, alpha_scale=0.5)
        | dict(s_qk_init=1.5, s_qk_scale=0.25, s_z_init=2.0, s_z_scale=0.5, softmax_scale=2.5),
    ),
    ("angpt", dict(activation="gelu")),
    ("angpt", dict(input_norm="block")),
    # the defaults before 2026-11-25
    ("angpt", dict(input_norm="none", s_z_init=1.0, alpha_init=0.05, alpha_speed=1.0, nu_att="dense")),
    ("ngpt", dict(activation="gelu")),
]


def _case_id(arch: str, overrides: dict) -> str:
    return arch + "".join(f"-{k}={v}" for k, v in overrides.items())


@pytest.mark.parametrize(
    "arch,overrides",
    CASES,
    ids=[_case_id(*(c.values if hasattr(c, "values") else c)) for c in CASES],
)
def test_logits_match_reference_after_training(arch, overrides):
    model = angpt.build_model(arch, "tiny", **overrides)
    cfg = model.config
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model)
    sd = model.state_dict()
    _assert_scales_moved(before, sd, cfg)
    _check_constraint(sd, cfg)
    if arch == "angpt":
        _check_nu_att(sd["nu_att"], cfg)
    _flip_alpha_signs(model)

    x = _batch(torch.Generator().manual_seed(123), cfg.vocab_size, 2, cfg.context_length)
    with torch.no_grad():
        got = model(x)[0].double()
    sd = model.state_dict()
    ref = (ngpt_logits if arch == "ngpt" else angpt_logits)(sd, cfg, x)
    assert got.shape == ref.shape == (2, cfg.context_length, cfg.vocab_size)
    _assert_matches(got, ref, sd, cfg, x)


def test_reference_nu_act_is_the_papers():
    """The quadrature nu_act for SiLU at z_std = 0.5 is the paper's ~3.74 (3.72 exactly; the paper's is a MC value)."""
    cfg = angpt.build_model("angpt", "tiny").config
    assert abs(angpt_nu_act(cfg) - 3.74) < 0.03


# ------------------------------------------------------------------------------- GPT+ and its controls
def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * gain


def gpt_logits(sd: dict[str, torch.Tensor], cfg, x: torch.Tensor) -> torch.Tensor:
    """GPT+ (docs/architectures.md#gpt-baseline) with the controls of docs/architectures.md#controls.

    weight_norm: every linear map (W_qkv, W_p, W_uz, W_d, W_out) is W = g V/||V|| per row (the embedding is a
    plain lookup). attention="cosine": no QK-norm; per head, logits cos(q, k) / tau with tau = max(exp(-s), 0.01)
    for the stored log-inverse s, computed here after RoPE (the model normalises before it).
    """
    d, H, dff, eps = cfg.d_model, cfg.n_heads, cfg.ffn_dim, cfg.norm_eps
    W = {k: v.detach().to(F64) for k, v in sd.items()}

    def linear(name: str) -> torch.Tensor:
        if cfg.weight_norm:
            V, g = W[name + ".v"], W[name + ".g"]
            return g[:, None] * V / V.norm(dim=1, keepdim=True)
        return W[name + ".weight"]

    assert cfg.softmax_scale is None
    h = W["embed.weight"][x]
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        a = rms_norm(h, W[p + "attn_norm.weight"], eps)
        Wqkv = linear(p + "qkv")
        q, k, v = heads(a @ Wqkv[:d].T, H), heads(a @ Wqkv[d : 2 * d].T, H), heads(a @ Wqkv[2 * d :].T, H)
        if cfg.attention == "cosine":
            tau = torch.exp(-W[p + "inv_tau.logit_scale"]).clamp(min=0.01).view(H, 1, 1)
            q, k = norm(rope(q, cfg.rope_theta)), norm(rope(k, cfg.rope_theta))
            o = causal_attention(q / tau, k, v, 1.0)
        else:
            if cfg.qk_norm:
                q, k = rms_norm(q, W[p + "q_norm.weight"], eps), rms_norm(k, W[p + "k_norm.weight"], eps)
            o = causal_attention(rope(q, cfg.rope_theta), rope(k, cfg.rope_theta), v, 1 / math.sqrt(cfg.head_dim))
        h = h + merge(o) @ linear(p + "proj").T
        m = rms_norm(h, W[p + "mlp_norm.weight"], eps)
        Wup = linear(p + "up")
        h = h + ((m @ Wup[:dff].T) * act(cfg.activation, m @ Wup[dff:].T)) @ linear(p + "down").T
    return rms_norm(h, W["final_norm.weight"], eps) @ linear("lm_head").T


GPT_CASES = [
    ("gpt+", {}),
    ("gpt+wn", {}),
    ("gpt+cos", {}),
    ("gpt+cos", dict(cos_tau_init=0.5, n_heads=8)),
    ("gpt+wn", dict(attention="cosine", qk_norm=False)),  # both controls at once
]


@pytest.mark.parametrize("arch,overrides", GPT_CASES, ids=[_case_id(*c) for c in GPT_CASES])
def test_gpt_controls_match_reference_after_training(arch, overrides):
    """After a few AdamW steps (g no longer ||V||, every tau moved), the model's logits are the reference's. One
    head's tau is then pushed below 0.01, so a model that forgot the clamp (or clamped the wrong way) differs."""
    model = angpt.build_model(arch, "tiny", **overrides)
    cfg = model.config
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model)
    sd = model.state_dict()
    for name, t in sd.items():
        if name.endswith(".g"):  # the gains moved away from the row norms they started at
            drift = (t - sd[name[:-1] + "v"].norm(dim=1)).abs().max().item()
            assert drift > 1e-3 * t.abs().max().item(), f"{name} still equals ||V||: a model ignoring g would pass"
        if name.endswith("logit_scale"):
            assert (t - before[name]).abs().max() > 1e-2, f"{name} did not move in training"
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("logit_scale"):
                t[0] = math.log(1 / 0.002)  # tau = 0.002 < 0.01: the clamp must bite
    x = _batch(torch.Generator().manual_seed(123), cfg.vocab_size, 2, cfg.context_length)
    with torch.no_grad():
        got = model(x)[0].double()
    ref = gpt_logits(model.state_dict(), cfg, x)
    err, scale = (got - ref).abs().max().item(), ref.abs().max().item()
    # The clamped head's attention logits reach 1/tau = 100: their fp32 rounding (~1e-5 absolute) goes through a
    # steep softmax; measured up to 8e-6 of the output scale (3e-7 to 7e-7 without that head), hence 10x FP32_REL.
    tol = (10 if cfg.attention == "cosine" else 1) * FP32_REL * scale
    assert err <= tol, f"max |model - reference| = {err:.3e} > {tol:.3e} (max |logit| {scale:.3f})"
