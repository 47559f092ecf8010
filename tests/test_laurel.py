"""LAUREL (models/laurel.py; docs/architectures.md#laurel): the base model at init, the paper's formulas, parameter
counts, cache and checkpointing, anGPT's norm, folding, errors, bf16, and the compare / bench / info seams."""

import json
import math

import pytest
import torch

import angpt
from angpt.errors import ConfigError
from angpt.infer import generate
from angpt.models.base import Context
from angpt.models.folded import FoldedLM
from angpt.models.laurel import ApproxLaurel, Laurel, laurel_params

VARIANTS = ["rw", "lr", "pa", "rw+lr", "rw+lr+pa"]
ARCHS = ["gpt+", "angpt"]

pytestmark = pytest.mark.usefixtures("one_thread")


def tokens(batch=2, length=40, vocab=256, seed=0):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def build(arch, **overrides):
    torch.manual_seed(0)
    return angpt.build_model(arch, "tiny", **overrides)


def train_steps(model, steps=4, lr=0.02, forward=None):
    opt, _ = angpt.make_optimizer(model, lr=lr, max_steps=steps, warmup_steps=0)
    for i in range(steps):
        x = tokens(4, 33, seed=i)
        (model if forward is None else forward)(x[:, :-1], x[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad()
    return model


def connections(model):
    return [m for m in model.modules() if isinstance(m, Laurel)]


def name_of(model, param):
    return next(n for n, p in model.named_parameters() if p is param)


# ------------------------------------------------------------------------------------------- init and steps
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "variant,extra",
    [(v, {}) for v in VARIANTS] + [("rw+lr+pa", {"laurel_rw_shape": "vector", "laurel_rw_bound": "sigmoid"})],
)
def test_each_variant_is_its_base_model_at_init(arch, variant, extra):
    x = tokens()
    with torch.no_grad():
        assert torch.equal(build(arch, laurel=variant, **extra)(x)[0], build(arch)(x)[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_steps_move_every_laurel_parameter_and_the_logits(arch):
    model = build(arch, laurel="rw+lr+pa", laurel_rw_shape="vector")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    base = train_steps(build(arch))
    train_steps(model)
    for conn in connections(model):
        assert (conn.w != 0).all() and (conn.B != 0).all(), conn.index
        assert not torch.equal(conn.A, before[name_of(model, conn.A)]), conn.index
        # min(i, k) gammas: connection i < k has only i earlier states, connection 0 none
        assert (
            (conn.gamma is None and conn.index == 0)
            or (conn.gamma != 0).all()
            and len(conn.gamma) == min(conn.index, 3)
        )
    with torch.no_grad():
        assert not torch.allclose(model(tokens())[0], base(tokens())[0], atol=1e-4)


# --------------------------------------------------------------------------------------- the paper's formulas
def test_connection_computes_the_papers_formulas():
    """x_{i+1} = alpha f + beta (x + B A x) + sum_j gamma_j x_{i-j}, (alpha, beta) = 2 softmax(w), by hand."""
    cfg = angpt.make_config("gpt+", "tiny", laurel="rw+lr+pa", laurel_rank=8, laurel_pa_depth=2)
    conn = Laurel(cfg, index=3)
    with torch.no_grad():
        conn.w.copy_(torch.tensor([math.log(3.0), 0.0]))  # softmax = (3/4, 1/4): alpha = 1.5, beta = 0.5
        conn.B.normal_()
        conn.gamma.copy_(torch.tensor([0.25, -0.5]))
    x, fx = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    ctx = Context(None, 0, None)
    ctx.states.update({0: torch.randn(2, 5, 64), 1: torch.randn(2, 5, 64), 2: torch.randn(2, 5, 64)})
    expected = 1.5 * fx + 0.5 * (x + x @ conn.A.T @ conn.B.T) + 0.25 * ctx.states[2] - 0.5 * ctx.states[1]
    assert torch.allclose(conn(x, fx, ctx), expected, atol=1e-5)
    assert ctx.states[3] is x  # what connections 4 and 5 will read
    sig = Laurel(angpt.make_config("gpt+", "tiny", laurel="rw", laurel_rw_bound="sigmoid"), 0)
    with torch.no_grad():
        sig.w.copy_(torch.tensor([0.0, math.log(3.0)]))  # 2 sigmoid: alpha = 1, beta = 1.5
    assert torch.allclose(sig(x, fx, ctx), fx + 1.5 * x, atol=1e-6)


@pytest.mark.parametrize("arch", ["gpt+", "gpt+wn", "gpt+cos", "angpt"])
def test_laurel_draws_nothing_and_keeps_its_init(arch):
    """Seeded alike, a model with LAUREL has its base model's weights bit for bit (LAUREL's A, B draw no random
    numbers and the base init does not re-draw them), and A, B keep LAUREL's init."""
    base, model = build(arch), build(arch, laurel="rw+lr+pa")
    for name, p in base.named_parameters():
        assert torch.equal(model.get_parameter(name), p), name
    r, d = 32, 64
    pattern = (torch.arange(d) % r == torch.arange(r)[:, None]).float() / math.sqrt(r * d)
    for conn in connections(model):
        assert torch.equal(conn.A, pattern) and not conn.B.any(), conn.index


def test_low_rank_init_is_the_column_orthogonal_pattern():
    r, d = 32, 64
    A = build("gpt+", laurel="lr").blocks[0].residual_A.A
    expected = torch.zeros(r, d)
    for j in range(d):
        expected[j % r, j] = 1 / math.sqrt(r * d)
    assert torch.equal(A, expected)
    assert torch.allclose(A @ A.T, torch.eye(r) * (d / r) / (r * d))  # orthogonal rows of norm 1/r
    assert torch.equal(build("gpt+", laurel="lr").blocks[1].residual_M.B, torch.zeros(d, r))


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_counts_by_hand(arch):
    L, d, r = 2, 64, 32  # the tiny preset; 2 L = 4 residual connections
    base = build(arch).num_params()
    # RW: 2 per connection; LR: 2 r d per connection; PA (k = 3): min(i, 3) for connection i = 0, 1, 2, 3
    expect = {"rw": 2 * L * 2, "lr": 2 * L * 2 * r * d, "pa": 0 + 1 + 2 + 3}
    for variant in VARIANTS:
        model = build(arch, laurel=variant)
        n = sum(expect[part] for part in variant.split("+"))
        assert model.num_params() - base == laurel_params(model) == n, variant
    vector = build(arch, laurel="rw", laurel_rw_shape="vector")
    assert vector.num_params() - base == 2 * L * 2 * d
    ranked = build(arch, laurel="lr", laurel_rank=5)
    assert ranked.num_params() - base == 2 * L * 2 * 5 * d
    deep = angpt.make_config(arch, "tiny", n_layers=4, laurel="pa", laurel_pa_depth=2)  # 8 connections
    assert laurel_params(angpt.models.model_from_config(deep)) == 0 + 1 + 2 * 6


def test_weight_decay_reaches_A_and_B_only():
    """GPT+ decays matrices (AdamW 0.1): LR's A, B are matrices; RW's w and PA's gamma are not."""
    model = build("gpt+", laurel="rw+lr+pa", laurel_rw_shape="vector")
    opt, _ = angpt.make_optimizer(model, lr=1e-3)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    conn = model.blocks[0].residual_A
    assert id(conn.A) in decayed and id(conn.B) in decayed
    assert id(conn.w) not in decayed and id(conn.gamma) not in decayed
    # anGPT: no decay (Adam) and no row constraint on A, B (they are not unit-norm maps)
    an = build("angpt", laurel="lr")
    constrained = {id(w) for ws in an.constraint_groups().values() for w, _ in ws}
    assert constrained and not constrained & {id(p) for c in connections(an) for p in c.parameters()}


# ------------------------------------------------------------------------------------- cache, checkpointing
@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_equals_full_forward(arch):
    model = train_steps(build(arch, laurel="rw+lr+pa")).eval()
    x = tokens(2, 30)
    with torch.no_grad():
        full, _ = model(x)
        cache = model.make_cache(2)
        steps = [model(x[:, :17], cache=cache)[0]] + [model(x[:, t : t + 1], cache=cache)[0] for t in range(17, 30)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    prompt = x[:, :12]
    cached = generate(model, prompt, max_new_tokens=16, temperature=0)
    assert torch.equal(cached, generate(model, prompt, max_new_tokens=16, temperature=0, use_cache=False))


@pytest.mark.parametrize("arch", ARCHS)
def test_activation_checkpointing_gives_the_same_gradients(arch):
    """PA reads earlier states from the forward's context; recomputing a block must read the same ones."""
    model = train_steps(build(arch, laurel="rw+lr+pa"), steps=2)
    x = tokens(2, 33)
    grads = []
    for recompute in (False, True):
        model.checkpoint_blocks = recompute
        model.zero_grad()
        model(x[:, :-1], x[:, 1:])[1].backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5), n


@pytest.mark.slow
def test_compiled_training_is_one_graph_and_matches_eager():
    """PA's state dict is written inside the forward: still one graph (aot_eager, as tests/test_compile.py); ~8 s,
    anGPT's form only (GPT+'s shares `previous` and the states)."""
    import torch._dynamo

    torch._dynamo.reset()
    model, eager = build("angpt", laurel="rw+lr+pa"), build("angpt", laurel="rw+lr+pa")
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        train_steps(model, steps=3, forward=compiled)
    train_steps(eager, steps=3)
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


# --------------------------------------------------------------------------------------------- anGPT's norm
def test_angpt_factor_is_the_expected_norm_under_its_assumptions():
    """The derivation (docs/architectures.md#laurel-on-angpt) checked by sampling: unit h uniform on the sphere, an
    independent unit branch output h_X, the earlier states equal to h: then E||y||^2 = 1 for any a, w, B, A, gamma,
    here with B A = 0.5 * (the projection onto A's rows) + noise, whose diagonal the factor must count."""
    torch.manual_seed(0)
    d, N = 256, 8192
    cfg = angpt.make_config("angpt", "tiny", d_model=d, n_heads=4, laurel="rw+lr+pa", laurel_rw_shape="vector")
    conn = ApproxLaurel(cfg, index=5)
    r = conn.A.shape[0]
    with torch.no_grad():
        conn.w.normal_(0, 0.5)
        conn.B.copy_(0.5 * r * r * conn.A.t() + 0.3 * torch.randn(d, r))  # A^T A = P / r^2
        conn.gamma.copy_(torch.tensor([0.3, 0.1, 0.2]))
    a = 0.05 + 0.25 * torch.rand(d)
    h = torch.nn.functional.normalize(torch.randn(N, d), dim=-1)
    h_X = torch.nn.functional.normalize(torch.randn(N, d), dim=-1)
    ctx = Context(None, 0, None)
    ctx.states.update({j: h for j in range(5)})
    with torch.no_grad():
        y = conn(h, h_X, torch.eye(d), 1.0, a, ctx)
        c_h, c_A = conn.factors(a)[1:]
        raw = c_A * h_X + c_h * (h + h @ conn.A.T @ conn.B.T) + 0.6 * h  # the same update without nu
    assert y.pow(2).sum(-1).mean().item() == pytest.approx(1.0, abs=0.02)
    assert raw.pow(2).sum(-1).mean().item() > 1.5  # what nu corrects


@pytest.mark.parametrize(
    "variant,energy,gamma,w", [("lr", 0.25, 0, 0), ("pa", 0, 0.2, 0), ("rw+lr+pa", 0.03, 0.1, 0.3)]
)
def test_angpt_norm_stays_near_one_with_nonzero_laurel_weights(variant, energy, gamma, w):
    """ApproxLaurel's nu keeps ||h|| within 10% of 1 at every layer of a 12-layer d=256 anGPT with LAUREL's weights
    far from init: ||B A||_F^2 / d = `energy` (150 training steps reach <= 0.016), every gamma_j = `gamma` (trained:
    |gamma| <= 0.06), w ~ N(0, w^2). With anGPT's plain nu(a) instead, ||h|| reaches 1e2-1e9 by layer 12; with the
    earlier states taken as independent of h, 1e3 or inf (measured)."""
    model = build("angpt", laurel=variant, d_model=256, n_heads=4, n_layers=12, vocab_size=512, context_length=128)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for conn in connections(model):
            if conn.B is not None:
                r, d = conn.A.shape
                conn.B.copy_(torch.randn(d, r, generator=gen) * math.sqrt(energy * r))  # ||BA||^2/d = |B|^2/(r^2 d)
            if conn.gamma is not None:
                conn.gamma.fill_(gamma)
            if conn.w is not None:
                conn.w.copy_(w * torch.randn(conn.w.shape, generator=gen))
    norms = angpt.inspect_norms(model, tokens(4, 128, vocab=512))
    h = torch.stack([norms[f"layer{i}.h"] for i in range(12)])
    assert ((h - 1).abs() < 0.1).all(), h.tolist()


# ------------------------------------------------------------------------------------------------- folding
@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("gpt+", {"laurel": "rw+lr+pa", "laurel_rw_shape": "vector"}),
        ("gpt", {"laurel": "lr"}),
        ("gpt+", {"laurel": "pa", "norm": "ln_scaling"}),
        ("angpt", {"laurel": "rw+lr+pa"}),
        ("angpt", {"laurel": "rw+lr", "alpha_shape": "scalar", "laurel_rw_shape": "vector"}),
        ("gpt+wn", {"laurel": "rw+lr+pa"}),  # W = g V/||V|| folded too
        ("gpt+cos", {"laurel": "rw+lr+pa", "laurel_rw_shape": "vector"}),  # 1/tau onto q's gain
    ],
)
def test_folded_logits_equal_unfolded(arch, overrides):
    model = train_steps(build(arch, **overrides), steps=3).eval()
    folded = angpt.fold_for_inference(model)
    assert isinstance(folded, FoldedLM)
    # RW's weights, weight normalisation's V and g, cosine attention's log(1/tau): all folded away
    assert not any(n.endswith((".w", ".v", ".g", "logit_scale")) for n, _ in folded.named_parameters())
    x = tokens(2, 48)
    with torch.no_grad():
        ref = model(x)[0]
        assert torch.allclose(folded(x)[0], ref, atol=1e-5, rtol=1e-5)
    assert type(angpt.fold_for_inference(build("gpt+"))) is type(build("gpt+"))  # nothing to fold without LAUREL


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "arch,overrides,match",
    [
        ("gpt+", {"laurel": "rw+pa"}, "use one of: none, rw, lr, pa, rw\\+lr, rw\\+lr\\+pa"),
        ("gpt+", {"laurel": "lr", "laurel_rank": 65}, "laurel_rank=65 exceeds model.d_model=64"),
        ("gpt+", {"laurel": "lr", "laurel_rank": 0}, "laurel_rank=0 must be a positive integer"),
        ("angpt", {"laurel_pa_depth": -1}, "laurel_pa_depth=-1 must be a positive integer"),
        ("gpt+", {"laurel_rw_shape": "matrix"}, "laurel_rw_shape"),
        ("ngpt", {"laurel": "lr"}, "laurel='lr' does not apply to arch 'ngpt'; it applies to: gpt, gpt\\+, angpt, "),
        ("tokenformer", {"laurel": "rw"}, "laurel='rw' does not apply to arch 'tokenformer'"),
        # the frozen-alpha control with RW: RW's weights would learn the step size the control fixes
        ("angpt", {"laurel": "rw+lr", "freeze_alpha": True}, r"freeze_alpha with model.laurel=rw\+lr: LAUREL's RW"),
        ("angpt", {"laurel": "rw", "freeze_scales": True}, "freeze_scales with model.laurel=rw: LAUREL's RW"),
    ],
)
def test_bad_laurel_configs_are_one_line_errors(arch, overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        angpt.make_config(arch, "tiny", **overrides)
    assert "\n" not in str(e.value)


def test_frozen_alpha_goes_with_laurel_parts_that_leave_the_step_alone():
    for laurel in ("lr", "pa"):
        model = angpt.build_model("angpt", "tiny", laurel=laurel, freeze_alpha=True)
        assert not any(b.alpha_A.param.requires_grad for b in model.blocks)


def test_rank_above_width_is_fine_without_lr():
    assert angpt.make_config("gpt+", "tiny", laurel="pa", laurel_rank=1000).laurel == "pa"


# ------------------------------------------------------------------------------------------------ precision
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_autocast_step(arch):
    model = train_steps(build(arch, laurel="rw+lr+pa"), steps=2)
    opt, _ = angpt.make_optimizer(model, lr=1e-2, max_steps=10)
    x = tokens(4, 33)
    with torch.no_grad():
        ref = model(x)[0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.hidden(x).dtype == torch.float32  # the residual stream stays fp32
        logits, loss = model(x[:, :-1], x[:, 1:])
        with torch.no_grad():
            low = model(x)[0]
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert (low.float() - ref).pow(2).mean().sqrt() < 0.02 * ref.pow(2).mean().sqrt()
    loss.backward()
    opt.step()
    for conn in connections(model):
        for n, p in conn.named_parameters():
            assert p.dtype == torch.float32 and torch.isfinite(p).all() and p.grad.dtype == torch.float32, n
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if ".B" in n)


# ----------------------------------------------------------------------------------- compare, bench, info
def test_compare_arm_with_laurel_runs_end_to_end(data_dir, tmp_path):
    from angpt.study import make_plan, run_comparison

    plan = make_plan(
        data_dir,
        arms=["gpt+lr=gpt+[laurel=lr,laurel_rank=8]"],
        budgets=[2048],
        seeds=[0],
        lr_grid=[1],
        preset="tiny",
        batch_tokens=512,
        eval_batches=2,
        eval_points=2,
        dtype="fp32",
    )
    assert plan.arms[0].arch == "gpt+" and plan.arms[0].model == {"laurel": "lr", "laurel_rank": 8}
    report = run_comparison(plan, tmp_path / "rep", threads=1, progress=False)
    assert math.isfinite(report.arms["gpt+lr"]["budgets"][0]["val_loss"]["0"])
    run = plan.run_dir(tmp_path / "rep", plan.arms[0], 2048, 0, plan.centre_lr(plan.arms[0]))
    saved = json.loads((run / "config.json").read_text())["run"]
    assert saved["model"]["laurel"] == "lr" and saved["model"]["laurel_rank"] == 8


def test_bench_step_takes_arms_with_overrides(monkeypatch):
    from angpt.bench import step
    from angpt.bench.step import bench_step

    monkeypatch.setattr(step, "matmul_peak", lambda *args, **kwargs: 1e9)  # not under test here, and slow
    rows = bench_step(["gpt+", "lr=gpt+[laurel=lr]"], "tiny", batch_size=2, seq_len=16, warmup=0, reps=1)
    assert [r.arch for r in rows] == ["gpt+", "lr"]
    assert rows[1].params - rows[0].params == 4 * 2 * 32 * 64


def test_info_shows_config_and_parameter_count(capsys):
    from angpt import cli

    assert cli.main(["info", "--arch", "gpt+", "--preset", "tiny", "--set", "laurel=rw+lr"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["laurel"] == "rw+lr"
    assert out["params"]["laurel"] == 4 * (2 + 2 * 32 * 64)
    assert out["params"]["total"] == build("gpt+").num_params() + out["params"]["laurel"]
