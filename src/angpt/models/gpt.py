"""GPT+ (pre-norm Transformer with QK-norm; the paper's baseline) and its comparison rows.

See docs/architectures.md#gpt-baseline.

`qk_norm=False` is plain GPT; `norm="dyt"` replaces every RMSNorm by DyT (Zhu et al. 2025); `norm="ln_scaling"`
multiplies the output of each pre-norm of layer l by 1/sqrt(l) (Sun et al. 2025). At equal config this is
transformers' Qwen3 block (RMSNorm, QK-norm before RoPE, SwiGLU, no biases). `laurel` replaces each residual
connection by LAUREL's (models/laurel.py).

Two of the review's controls (docs/architectures.md#controls) are GPT+ options: `weight_norm=True` makes every
linear map W = g V/||V|| per row (gpt+wn), `attention="cosine"` replaces QK-norm by scaled cosine attention,
logits cos(q, k)/tau with a learned tau per head (gpt+cos).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from angpt.errors import ConfigError
from angpt.models.base import Block, Context, LanguageModel
from angpt.models.config import ModelConfig
from angpt.models.laurel import connection
from angpt.models.layers import (
    ACTIVATIONS,
    CosineLogitScale,
    DyT,
    RMSNorm,
    WNLinear,
    attend,
    merge_heads,
    split_heads,
    stored_matrix,
    unit_norm,
)


def make_norm(cfg: ModelConfig, dim: int, layer_scale: float = 1.0) -> nn.Module:
    if cfg.norm == "dyt":
        return DyT(dim, cfg.dyt_alpha_init)
    return RMSNorm(dim, cfg.norm_eps, layer_scale if cfg.norm == "ln_scaling" else 1.0)


def make_linear(cfg: ModelConfig, d_in: int, d_out: int) -> nn.Module:
    """A bias-free linear map: plain, or weight-normalised W = g V/||V|| per row (gpt+wn)."""
    return WNLinear(d_in, d_out) if cfg.weight_norm else nn.Linear(d_in, d_out, bias=False)


class GPTBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int, scale: float) -> None:
        super().__init__()
        self.layer = layer
        d, dff = cfg.d_model, cfg.ffn_dim
        self.n_heads, self.d_ff, self.scale = cfg.n_heads, dff, scale
        lscale = 1.0 / math.sqrt(layer + 1)
        self.attn_norm = make_norm(cfg, d, lscale)
        self.qkv = make_linear(cfg, d, 3 * d)
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.inv_tau = CosineLogitScale(cfg.n_heads, cfg.cos_tau_init) if cfg.attention == "cosine" else None
        self.proj = make_linear(cfg, d, d)
        self.mlp_norm = make_norm(cfg, d, lscale)
        self.up = make_linear(cfg, d, 2 * dff)  # [u; z], the value and gate branches of SwiGLU
        self.down = make_linear(cfg, dff, d)
        self.act = ACTIVATIONS[cfg.activation]
        # the residual connections: h + f(h), or LAUREL's (models/laurel.py)
        self.residual_A = connection(cfg, 2 * layer)
        self.residual_M = connection(cfg, 2 * layer + 1)

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        # h = h + Attn(Norm(h))
        q, k, v = split_heads(self.qkv(self.attn_norm(h)), 3 * self.n_heads).chunk(3, dim=1)
        if self.q_norm is not None:  # QK-norm: per-head RMSNorm before RoPE, as in Qwen3 / OLMo-2
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.inv_tau is not None:  # scaled cosine attention (Swin v2): q.k = cos(q, k) / tau, SDPA scale 1.
            # Normalised before RoPE, as QK-norm is; RoPE is a rotation, so the cosine is the same either way.
            q, k = unit_norm(q) * self.inv_tau().view(-1, 1, 1).to(q.dtype), unit_norm(k)
        self.record(q=q, k=k, v=v)
        q, k = ctx.rotate(q), ctx.rotate(k)
        o = attend(q, k, v, self.scale, ctx.cache, self.layer)
        self.record(attn_out=o)
        h_a = self.proj(merge_heads(o))
        self.record(h_A=h_a)
        h = self.residual_A(h, h_a, ctx)
        # h = h + MLP(Norm(h)), MLP = W_d (u * silu(z))
        u, z = self.up(self.mlp_norm(h)).split(self.d_ff, dim=-1)
        h_m = self.down(u * self.act(z))
        self.record(h_M=h_m)
        h = self.residual_M(h, h_m, ctx)
        self.record(h=h)
        return h


class GPT(LanguageModel):
    """GPT+ / GPT / DyT / LN-scaling, and the controls gpt+wn and gpt+cos, by config; any of them with LAUREL."""

    controls = frozenset({"weight_norm", "attention", "laurel"})

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        if cfg.attention == "cosine" and cfg.qk_norm:
            raise ConfigError(
                "model.attention=cosine replaces QK-norm (q, k are L2-normalised, logits cos(q, k)/tau); "
                "set model.qk_norm=false, as arch gpt+cos does"
            )
        if cfg.attention == "cosine" and cfg.softmax_scale is not None:
            raise ConfigError(
                "cosine attention learns its logit scale 1/tau; unset model.softmax_scale (model.cos_tau_init sets "
                "the initial tau)"
            )

    @classmethod
    def default_softmax_scale(cls, cfg: ModelConfig) -> float:
        # Cosine attention puts its learned 1/tau on q, so SDPA's own scale is 1.
        return 1.0 if cfg.attention == "cosine" else super().default_softmax_scale(cfg)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        scale = self.default_softmax_scale(config)
        self.blocks = nn.ModuleList(GPTBlock(config, i, scale) for i in range(config.n_layers))
        self.final_norm = make_norm(config, config.d_model)
        self.lm_head = make_linear(config, config.d_model, config.vocab_size)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.init_std
        # Every linear map (a weight-normalised map's V: the same draws as the plain map's W) and the embedding, in
        # module order; LAUREL's A, B are matrices too but draw nothing, so the stream is the same with and without it.
        for m in self.modules():
            if isinstance(m, (nn.Linear, WNLinear, nn.Embedding)):
                stored_matrix(m).normal_(0.0, std)
        out_std = std / math.sqrt(2 * self.config.n_layers)  # residual-branch outputs (GPT-2 scheme)
        for block in self.blocks:
            stored_matrix(block.proj).normal_(0.0, out_std)
            stored_matrix(block.down).normal_(0.0, out_std)
            block.residual_A.reset_parameters()
            block.residual_M.reset_parameters()
        for m in self.modules():
            if isinstance(m, WNLinear):
                m.match_gain()  # g = ||V||: W = V, so gpt+wn starts as GPT+ does (same seed, same weights)

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return self.final_norm(h), self.lm_head.weight, None  # a WNLinear's weight is its effective g V/||V||

    @classmethod
    @torch.no_grad()
    def fold(cls, model: nn.Module) -> GPT:
        """The inference form of a weight-normalised GPT (gpt+wn): each W = g V/||V|| computed once into a plain
        weight. The result is a GPT+ (weight_norm off) with the same logits, which exports as a native Qwen3."""
        wn = {name: m for name, m in model.named_modules() if isinstance(m, WNLinear)}
        sd = {k: t for k, t in model.state_dict().items() if k.rpartition(".")[0] not in wn}
        sd |= {f"{name}.weight": m.weight for name, m in wn.items()}
        out = cls(dataclasses.replace(model.config, weight_norm=False)).to(next(model.parameters()).device)
        out.load_state_dict({k: t.float() for k, t in sd.items()})
        return out.eval()
