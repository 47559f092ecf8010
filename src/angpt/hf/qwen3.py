"""GPT+ <-> transformers' Qwen3 (RMSNorm, QK-norm before RoPE, SwiGLU, no biases): the same model, renamed.

Only GPT+ with RMSNorm maps onto Qwen3; GPT without QK-norm, DyT and LN-scaling have no Qwen3 equivalent.
"""

from __future__ import annotations

import torch

from angpt.errors import ConfigError
from angpt.models import GPT, ModelConfig, make_config, registry


def qwen3_config_dict(cfg: ModelConfig) -> dict:
    """The Qwen3Config keyword arguments of a GPT+ config."""
    if registry.get(cfg.arch).export != "native" or cfg.norm != "rmsnorm" or not cfg.qk_norm:
        raise ConfigError(
            f"only GPT+ with RMSNorm and QK-norm maps onto Qwen3 (got arch={cfg.arch}, norm={cfg.norm}, "
            f"qk_norm={cfg.qk_norm}); nGPT and anGPT export through their own model classes"
        )
    if cfg.softmax_scale is not None and abs(cfg.softmax_scale - cfg.head_dim**-0.5) > 1e-12:
        raise ConfigError("Qwen3 uses the softmax scale 1/sqrt(head_dim); unset model.softmax_scale to export")
    return llama_family_config_dict(cfg)


def llama_family_config_dict(cfg: ModelConfig) -> dict:
    """The config keywords Qwen3Config and LlamaConfig share, for a GPT-family config (MHA, no biases)."""
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context_length,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        hidden_act=cfg.activation,
        tie_word_embeddings=False,
        attention_bias=False,
        initializer_range=cfg.init_std,
    )


def to_qwen3_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our GPT+ (GPT) weights under Qwen3ForCausalLM's (LlamaForCausalLM's) names (fused qkv and [u; z] split apart)."""
    d, dff = model.config.d_model, model.config.ffn_dim
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight}
    sd["lm_head.weight"] = model.lm_head.weight
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        q, k, v = b.qkv.weight.split(d)
        u, z = b.up.weight.split(dff)
        sd |= {
            p + "input_layernorm.weight": b.attn_norm.weight,
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": b.proj.weight,
            p + "post_attention_layernorm.weight": b.mlp_norm.weight,
            p + "mlp.up_proj.weight": u,
            p + "mlp.gate_proj.weight": z,
            p + "mlp.down_proj.weight": b.down.weight,
        }
        if b.q_norm is not None:  # GPT without QK-norm has the Llama layout: the same names minus these two
            sd[p + "self_attn.q_norm.weight"] = b.q_norm.weight
            sd[p + "self_attn.k_norm.weight"] = b.k_norm.weight
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def config_from_qwen3(hf_config) -> ModelConfig:
    """A GPT+ config with the shape of a Qwen3Config (MHA only: num_key_value_heads must equal num_attention_heads)."""
    c = hf_config
    if c.num_key_value_heads != c.num_attention_heads:
        raise ConfigError(
            f"checkpoint uses grouped-query attention ({c.num_attention_heads} query heads, {c.num_key_value_heads} "
            "kv heads); angpt's GPT+ supports only multi-head attention"
        )
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ConfigError(f"head_dim {head_dim} x heads {c.num_attention_heads} != hidden_size {c.hidden_size}")
    rope = getattr(c, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"rope_type {rope.get('rope_type')!r} is not supported; only default RoPE")
    return make_config(
        "gpt+",
        dict(
            vocab_size=c.vocab_size,
            d_model=c.hidden_size,
            n_layers=c.num_hidden_layers,
            n_heads=c.num_attention_heads,
            d_ff=c.intermediate_size,
            context_length=c.max_position_embeddings,
            rope_theta=float(theta),
            norm_eps=c.rms_norm_eps,
            activation=c.hidden_act,
        ),
    )


@torch.no_grad()
def gpt_from_qwen3_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> GPT:
    """Our GPT+ (or GPT, from Llama) from Qwen3ForCausalLM weights: the inverse of :func:`to_qwen3_state_dict`."""
    model = GPT(cfg)
    ours = to_qwen3_state_dict(model)
    missing = sorted(set(ours) - set(sd))
    if missing:
        raise ConfigError(f"Qwen3 checkpoint lacks {len(missing)} tensor(s), e.g. {missing[0]}")
    for k, v in ours.items():
        if sd[k].shape != v.shape:
            raise ConfigError(f"tensor {k} has shape {tuple(sd[k].shape)}, expected {tuple(v.shape)}")
    model.embed.weight.copy_(sd["model.embed_tokens.weight"])
    model.final_norm.weight.copy_(sd["model.norm.weight"])
    model.lm_head.weight.copy_(sd["lm_head.weight"])
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        b.attn_norm.weight.copy_(sd[p + "input_layernorm.weight"])
        b.qkv.weight.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
        b.proj.weight.copy_(sd[p + "self_attn.o_proj.weight"])
        if b.q_norm is not None:
            b.q_norm.weight.copy_(sd[p + "self_attn.q_norm.weight"])
            b.k_norm.weight.copy_(sd[p + "self_attn.k_norm.weight"])
        b.mlp_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
        b.up.weight.copy_(torch.cat([sd[p + "mlp.up_proj.weight"], sd[p + "mlp.gate_proj.weight"]]))
        b.down.weight.copy_(sd[p + "mlp.down_proj.weight"])
    return model
