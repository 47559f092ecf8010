"""TokenFormer (docs/architectures.md#tokenformer): its equations against an independent float64 reference, its init,
its parameter count beside GPT+, progressive growth (same logits, new tokens train, frozen ones do not), the
`angpt grow` verb and its bad input, and the Hugging Face export.

The properties every architecture must have (KV cache, causality, bf16 steps, compile) come from the registry-wide
tests; this file checks TokenFormer's own claims.
"""

from __future__ import annotations

import json
import math
import os
import textwrap

import pytest
import safetensors.torch
import torch
import transformers

import angpt
from angpt.checkpoint import load_checkpoint_model, read_state, save_weights_checkpoint
from angpt.cli import main
from angpt.errors import ConfigError, UserError
from angpt.models.tokenformer import ffn_growth

from .test_hf_export import run_isolated
from .test_reference import causal_attention, rope
from .test_train import TINY, final_weights, metrics

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64


def tokens(vocab=256, batch=2, length=40, seed=0):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def train_steps(model, steps=4, lr=1e-2, seed=0):
    """A few AdamW steps (the recipe's optimizer) on random batches; returns the optimizer."""
    opt, _ = angpt.make_optimizer(model, lr=lr, max_steps=100, warmup_steps=0)
    for i in range(steps):
        x = tokens(model.config.vocab_size, 4, 33, seed=seed + i)
        model(x[:, :-1], x[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad()
    return opt


# ------------------------------------------------------------------------------------- independent reference
def gelu(z):
    return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


def pattention_ref(x, keys, values, n, kind):
    """Theta(X K^T) V in float64, Theta from the paper: GeLU(A sqrt(n) / ||A||_2) or softmax(A) * n."""
    a = x @ keys.T
    if kind == "l2_norm_gelu":
        w = gelu(a * math.sqrt(n) / a.pow(2).sum(-1, keepdim=True).sqrt())
    else:
        e = (a - a.amax(-1, keepdim=True)).exp()
        w = e / e.sum(-1, keepdim=True) * n
    return w @ values


def layer_norm_ref(x, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / ((x - mu).pow(2).mean(-1, keepdim=True) + eps).sqrt()


def tokenformer_ref(sd, cfg, x):
    """Logits of a TokenFormer from its state dict alone (frozen tokens first), in float64."""
    sd = {k: v.to(F64) for k, v in sd.items()}
    d, H, eps = cfg.d_model, cfg.n_heads, cfg.norm_eps
    n_attn = cfg.norm_tokens or cfg.param_tokens or d  # the stored n of Theta, else the token count
    n_ffn = cfg.ffn_norm_tokens or cfg.d_ff or 4 * d

    def pat(prefix, inp, n):
        keys, values = sd[prefix + "key_tokens"], sd[prefix + "value_tokens"]
        if prefix + "frozen_key_tokens" in sd:
            keys = torch.cat([sd[prefix + "frozen_key_tokens"], keys])
            values = torch.cat([sd[prefix + "frozen_value_tokens"], values])
        return pattention_ref(inp, keys, values, n, cfg.pattention)

    h = sd["embed.weight"][x]
    B, T, _ = h.shape
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        z = layer_norm_ref(h, eps)
        q, k, v = (
            pat(p + name + ".", z, n_attn).view(B, T, H, d // H).transpose(1, 2) for name in ("query", "key", "value")
        )
        o = causal_attention(rope(q, cfg.rope_theta), rope(k, cfg.rope_theta), v, 1 / math.sqrt(d // H))
        h = h + pat(p + "proj.", o.transpose(1, 2).reshape(B, T, d), n_attn)
        h = h + pat(p + "ffn.", layer_norm_ref(h, eps), n_ffn)
    return layer_norm_ref(h, eps) @ sd["lm_head.weight"].T


@pytest.mark.parametrize(
    "overrides",
    [{}, {"pattention": "softmax"}, {"param_tokens": 48, "d_ff": 80, "n_layers": 3}],
    ids=["l2_norm_gelu", "softmax", "other-token-counts"],
)
def test_logits_match_an_independent_reference_after_training(overrides):
    model = angpt.build_model("tokenformer", "tiny", **overrides)
    train_steps(model)
    x = tokens(length=model.config.context_length, seed=123)
    with torch.no_grad():
        got = model.eval()(x)[0].double()
    ref = tokenformer_ref(model.state_dict(), model.config, x)
    assert torch.allclose(got, ref, atol=2e-5 * ref.abs().max().item()), (got - ref).abs().max()


def test_reference_sees_a_grown_and_frozen_model():
    """The reference reads the stored n of Theta and the frozen split: a grown, frozen, trained model matches it."""
    model = angpt.build_model("tokenformer", "tiny")
    train_steps(model, steps=2)
    grown = angpt.grow(model, 16, freeze_old=True)
    train_steps(grown, steps=2, seed=10)
    x = tokens(seed=5)
    with torch.no_grad():
        got = grown.eval()(x)[0].double()
    ref = tokenformer_ref(grown.state_dict(), grown.config, x)
    assert torch.allclose(got, ref, atol=2e-5 * ref.abs().max().item()), (got - ref).abs().max()


# ------------------------------------------------------------------------------------------- init and size
def test_init_follows_the_official_code():
    """Keys N(0, 0.02^2) (`normal` init); values N(0, (2 / (L sqrt(d)))^2) (`wang_init`); embedding and head 0.02."""
    model = angpt.build_model("tokenformer", "demo", n_layers=4)
    block = model.blocks[1]
    for p in (block.query, block.proj, block.ffn):
        assert p.key_tokens.std().item() == pytest.approx(0.02, rel=0.02)
        assert p.value_tokens.std().item() == pytest.approx(2 / (4 * math.sqrt(256)), rel=0.02)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert not any(n.endswith("bias") for n, _ in model.named_parameters())  # no biases, no norm gains
    assert all(p.ndim == 2 for p in model.parameters())


def test_parameter_count_equals_gpt_plus_at_every_preset_but_for_norm_gains():
    """Per layer: four Pattentions of n = d tokens (2 d n each) and an FFN of 4d tokens (2 d 4d) = 16 d^2, the same
    as GPT+'s attention (4 d^2) plus SwiGLU with d_ff = 4d (3 d 4d): `angpt compare --arms gpt+,tokenformer` puts
    them side by side at equal non-embedding parameters, GPT+ ahead by its RMSNorm gains only."""
    for preset in angpt.PRESETS:
        with torch.device("meta"):
            tf, gpt = angpt.build_model("tokenformer", preset), angpt.build_model("gpt+", preset)
        c = tf.config
        d, L, V = c.d_model, c.n_layers, c.vocab_size
        assert tf.num_params(embeddings=False) == L * 16 * d * d + V * d
        gains = L * (2 * d + 2 * c.head_dim) + d  # two pre-norms, QK-norm, final norm
        assert gpt.num_params(embeddings=False) - tf.num_params(embeddings=False) == gains


def test_info_shows_the_config_constants_and_parameter_count(capsys):
    assert main(["info", "--arch", "tokenformer"]) == 0  # the demo preset
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["arch"] == "tokenformer" and info["config"]["pattention"] == "l2_norm_gelu"
    assert info["constants"]["value_init_std"] == pytest.approx(2 / (6 * 16))
    assert info["params"]["non_embedding"] == 6 * 16 * 256**2 + 4096 * 256
    assert info["params"]["total"] == info["params"]["non_embedding"] + 4096 * 256


def test_bad_tokenformer_configs_are_one_line_errors():
    for overrides, field in [
        ({"pattention": "relu"}, "pattention"),
        ({"param_tokens": 0}, "param_tokens"),
        ({"norm_tokens": -2}, "norm_tokens"),
        ({"frozen_tokens": 64}, "frozen_tokens"),  # all 64 tokens frozen: nothing left to train
        ({"frozen_ffn_tokens": -1}, "frozen_ffn_tokens"),
    ]:
        with pytest.raises(ConfigError, match=field) as e:
            angpt.build_model("tokenformer", "tiny", **overrides)
        assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ growth
@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    model = angpt.build_model("tokenformer", "tiny")
    train_steps(model, steps=3)
    return model.eval()


@pytest.mark.parametrize("freeze", [False, True])
def test_growth_preserves_logits(trained, freeze):
    """fp64: equal to rounding (1e-12 relative). fp32: within 1e-6 relative; bitwise equality is not guaranteed,
    because BLAS sums the n + m products of Theta V in another blocking order than the n of the original (the
    zero terms themselves are exact). A wrong n in Theta (sqrt(n + m)) moves the logits by ~10%."""
    model64 = angpt.build_model("tokenformer", "tiny").double()
    model64.load_state_dict(trained.state_dict())
    x = tokens(seed=7)
    for model, tol in ((model64, 1e-12), (trained, 1e-6)):
        grown = angpt.grow(model, 24, freeze_old=freeze)
        with torch.no_grad():
            before, after = model(x)[0], grown.eval()(x)[0]
        assert after.dtype == before.dtype
        assert (after - before).abs().max() <= tol * before.abs().max(), (after - before).abs().max()
    c = grown.config
    assert (c.param_tokens, c.d_ff, c.norm_tokens, c.ffn_norm_tokens) == (64 + 24, 256 + 96, 64, 256)
    assert (c.frozen_tokens, c.frozen_ffn_tokens) == ((64, 256) if freeze else (0, 0))
    assert grown.num_params() == trained.num_params() + 2 * 2 * 64 * (4 * 24 + 96)  # 2 layers, keys and values


def test_growth_appends_zero_keys_and_fresh_values_and_keeps_the_old_tokens(trained):
    grown = angpt.grow(trained, 24)
    for old, new in zip(trained.pattentions(), grown.pattentions()):
        (k0, v0), (k1, v1) = old.tokens(), new.tokens()
        n = k0.shape[0]
        assert torch.equal(k1[:n], k0) and torch.equal(v1[:n], v0)
        assert torch.equal(k1[n:], torch.zeros_like(k1[n:]))
        assert v1[n:].std().item() == pytest.approx(grown.value_std(), rel=0.15)
    # grown again, the stored n stays the first model's, and the model still matches the first
    twice = angpt.grow(grown, 8, 8)
    assert (twice.config.param_tokens, twice.config.d_ff, twice.config.norm_tokens) == (96, 360, 64)
    x = tokens(seed=3)
    with torch.no_grad():
        assert torch.allclose(twice.eval()(x)[0], trained(x)[0], rtol=0, atol=1e-6 * trained(x)[0].abs().max())


def test_grown_model_rebuilds_from_its_config(trained):
    """What a checkpoint of the grown model holds (config + state dict) builds the same model (strict load)."""
    grown = angpt.grow(trained, 5, freeze_old=True)
    again = angpt.models.model_from_config(angpt.ModelConfig.from_dict(grown.config.to_dict()))
    again.load_state_dict(grown.state_dict())  # strict: same names (frozen split included) and shapes
    x = tokens(seed=1)
    with torch.no_grad():
        assert torch.equal(again.eval()(x)[0], grown.eval()(x)[0])


@pytest.mark.parametrize("freeze", [False, True])
def test_new_tokens_train_and_frozen_old_tokens_do_not(trained, freeze):
    grown = angpt.grow(trained, 16, freeze_old=freeze).train()
    before = [tuple(t.detach().clone() for t in p.tokens()) for p in grown.pattentions()]
    old_counts = [p.tokens()[0].shape[0] for p in trained.pattentions()]
    opt = train_steps(grown, steps=3, lr=1e-2, seed=20)
    optimised = {id(p) for g in opt.param_groups for p in g["params"]}
    for p, (k0, v0), n in zip(grown.pattentions(), before, old_counts):
        k1, v1 = p.tokens()
        assert not torch.equal(k1[n:], k0[n:]) and not torch.equal(v1[n:], v0[n:])  # the new tokens moved
        if freeze:  # neither the gradient nor AdamW's weight decay touched them
            assert torch.equal(k1[:n], k0[:n]) and torch.equal(v1[:n], v0[:n])
            assert id(p.frozen_key_tokens) not in optimised and id(p.key_tokens) in optimised
        else:
            assert not torch.equal(k1[:n], k0[:n]) and not torch.equal(v1[:n], v0[:n])


def test_frozen_model_trains_under_bf16_autocast(trained):
    grown = angpt.grow(trained, 16, freeze_old=True).train()
    opt, _ = angpt.make_optimizer(grown, lr=1e-2, max_steps=10)
    x = tokens(seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = grown(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    loss.backward()
    frozen = grown.blocks[0].query.frozen_key_tokens
    assert frozen.grad is None and grown.blocks[0].query.key_tokens.grad.dtype == torch.float32
    before = frozen.detach().clone()
    opt.step()
    assert torch.equal(frozen, before)


def test_growth_refuses_what_it_cannot_preserve(trained):
    with pytest.raises(ConfigError, match="cannot grow"):
        angpt.grow(angpt.build_model("gpt+", "tiny"), 8)
    with pytest.raises(ConfigError, match="softmax"):
        angpt.grow(angpt.build_model("tokenformer", "tiny", pattention="softmax"), 8)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="add_tokens"):
            angpt.grow(trained, bad)
    assert ffn_growth(trained.config, 24) == 96  # FFN tokens grow in proportion: 256 / 64 = 4 per attention token


# -------------------------------------------------------------------------------------------- angpt grow
@pytest.fixture(scope="module")
def tf_run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tf") / "run"
    args = ["--arch", "tokenformer", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "2"]
    assert main(["train", *map(str, args)]) == 0
    return out


def one_line_error(capsys, rc, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_grow_cli_writes_a_checkpoint_that_train_continues_from(tf_run, data_dir, tmp_path, capsys):
    out = tmp_path / "grown"
    assert main(["grow", str(tf_run), str(out), "--add-tokens", "16", "--freeze-old"]) == 0
    assert "same logits" in capsys.readouterr().out
    source = sorted((tf_run / "checkpoints").glob("step_*"))[-1]
    state = read_state(out)
    assert state["grown_from"]["checkpoint"] == str(source.resolve())
    assert state["grown_from"]["model_sha256"] == read_state(source)["files"]["model.safetensors"]
    assert set(state["files"]) == {"model.safetensors", "tokenizer.json", "angpt_tokenizer.json"}
    (small, _), (big, _) = load_checkpoint_model(tf_run), load_checkpoint_model(out)  # checksums verified
    x = tokens(seed=4)
    with torch.no_grad():
        a, b = small(x)[0], big(x)[0]
    assert torch.allclose(a, b, rtol=0, atol=1e-6 * a.abs().max())
    assert big.config.frozen_tokens == 64 and big.num_params() > small.num_params()

    # continued training: straight, and stopped after step 1 then resumed (the optimizer holds no frozen tokens)
    args = ["--arch", "tokenformer", "--init_from", out, "--data", data_dir, *TINY, "--train.max_steps", "2"]
    assert main(["train", *map(str, args), "--out", str(tmp_path / "straight")]) == 0
    split = ["train", *map(str, args), "--out", str(tmp_path / "split")]
    assert main([*split, "--train.stop_at", "1"]) == 0 and main([*split, "--resume", "auto"]) == 0
    assert [r["loss"] for r in metrics(tmp_path / "split")] == [r["loss"] for r in metrics(tmp_path / "straight")]
    grown, trained = load_checkpoint_model(out)[0].state_dict(), final_weights(tmp_path / "split")
    for name in grown:
        assert torch.equal(trained[name], grown[name]) == ("frozen" in name), name  # only the old tokens stay


def test_grow_cli_bad_input_is_one_line_and_writes_nothing(tf_run, tmp_path, capsys, monkeypatch):
    gpt = tmp_path / "gpt"
    model = angpt.build_model("gpt+", "tiny")
    save_weights_checkpoint(gpt, model.state_dict(), {"model_config": model.config.to_dict()})
    soft = tmp_path / "soft"
    model = angpt.build_model("tokenformer", "tiny", pattention="softmax")
    save_weights_checkpoint(soft, model.state_dict(), {"model_config": model.config.to_dict()})
    (tmp_path / "exists").mkdir()
    listing = sorted(os.listdir(tmp_path))
    cases = [
        ([str(gpt), str(tmp_path / "a"), "--add-tokens", "8"], "gpt+ model cannot grow"),
        ([str(soft), str(tmp_path / "a"), "--add-tokens", "8"], "l2_norm_gelu"),
        ([str(tf_run), str(tmp_path / "a"), "--add-tokens", "0"], "--add-tokens 0 must be a positive integer"),
        ([str(tf_run), str(tmp_path / "a"), "--add-tokens", "-4"], "must be a positive integer"),
        ([str(tf_run), str(tmp_path / "a"), "--add-tokens", "8", "--add-ffn-tokens", "0"], "--add-ffn-tokens"),
        ([str(tf_run), str(tmp_path / "exists"), "--add-tokens", "8"], "already exists"),
        ([str(tmp_path / "missing"), str(tmp_path / "exists"), "--add-tokens", "8"], "already exists"),  # checked first
        ([str(tmp_path / "missing"), str(tmp_path / "a"), "--add-tokens", "8"], "does not exist"),
    ]
    for argv, needle in cases:
        one_line_error(capsys, main(["grow", *argv]), needle)
        assert sorted(os.listdir(tmp_path)) == listing  # nothing written, no temporary folder left
    assert os.listdir(tmp_path / "exists") == []

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    one_line_error(capsys, main(["grow", str(tf_run), str(tmp_path / "a"), "--add-tokens", "8"]), "nothing was written")
    assert sorted(os.listdir(tmp_path)) == listing


# ---------------------------------------------------------------------------------------------- HF export
def test_hf_export_round_trip_of_a_grown_model(trained, tok, tmp_path):
    from angpt.hf.export import export_hf
    from angpt.infer import generate

    grown = angpt.grow(trained, 8, freeze_old=True).eval()  # frozen tokens are exported joined
    with pytest.raises(UserError, match="a tokenformer model exports as 'custom', not 'qwen3'"):
        export_hf(grown, tmp_path / "hf", tok, format="qwen3")
    out = export_hf(grown, tmp_path / "hf", tok)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "angpt_tokenformer" and cfg["norm_tokens"] == 64 and cfg["param_tokens"] == 72
    assert {"modeling_tokenformer.py", "modeling_angpt.py"} <= set(os.listdir(out))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)  # registered by importing angpt.hf.export
    assert type(hf).__name__ == "TokenformerForCausalLM"
    x = tokens(seed=9)
    with torch.no_grad():
        ours = grown(x)[0]
        assert torch.allclose(hf(x).logits, ours, rtol=0, atol=1e-6 * ours.abs().max())
        expected = grown(x[:, :-1], x[:, 1:])[1]
        assert hf(input_ids=x, labels=x).loss.item() == pytest.approx(expected.item(), rel=1e-5)
    greedy = hf.generate(x[:, :12], max_new_tokens=10, do_sample=False)
    assert torch.equal(greedy, hf.generate(x[:, :12], max_new_tokens=10, do_sample=False, use_cache=False))
    assert torch.equal(greedy, generate(grown, x[:, :12], max_new_tokens=10, temperature=0))


@pytest.mark.slow
def test_hf_export_loads_where_angpt_is_not_importable(trained, tmp_path):
    """trust_remote_code in a fresh interpreter that cannot import angpt: modeling_tokenformer.py and the
    modeling_angpt.py it imports are enough."""
    from angpt.hf.export import export_hf

    out = export_hf(trained, tmp_path / "hf")
    x = tokens(seed=11)
    (tmp_path / "in.json").write_text(json.dumps({"ids": x.tolist(), "path": str(out)}))
    script = textwrap.dedent(
        """
        import json
        import torch
        from transformers import AutoModelForCausalLM
        spec = json.load(open("in.json"))
        m = AutoModelForCausalLM.from_pretrained(spec["path"], trust_remote_code=True)
        with torch.no_grad():
            logits = m(torch.tensor(spec["ids"])).logits
        json.dump({"module": type(m).__module__, "logits": logits.tolist()}, open("out.json", "w"))
        """
    )
    res = run_isolated(script, tmp_path)
    assert res["module"].startswith("transformers_modules.")
    with torch.no_grad():
        ours = trained(x)[0]
    assert torch.allclose(torch.tensor(res["logits"]), ours, rtol=0, atol=1e-6 * ours.abs().max())
