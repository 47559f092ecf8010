"""GPT+ (pre-norm Transformer with QK-norm; the paper's baseline) and its comparison rows.

See docs/architectures.md#gpt-baseline.

`qk_norm=False` is plain GPT; `norm="dyt"` replaces every RMSNorm by DyT (Zhu et al. 2025); `norm="ln_scaling"`
multiplies the output of each pre-norm of layer l by 1/sqrt(l) (Sun et al. 2025). At equal config this is
transformers' Qwen3 block (RMSNorm, QK-norm before RoPE, SwiGLU, no biases). `laurel` replaces each residual
connection by LAUREL's (models/laurel.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from angpt.models.base import Block, Context, LanguageModel
from angpt.models.config import ModelConfig
from angpt.models.laurel import connection
from angpt.models.layers import ACTIVATIONS, DyT, RMSNorm, attend, merge_heads, split_heads


def make_norm(cfg: ModelConfig, dim: int, layer_scale: float = 1.0) -> nn.Module:
    if cfg.norm == "dyt":
        return DyT(dim, cfg.dyt_alpha_init)
    return RMSNorm(dim, cfg.norm_eps, layer_scale if cfg.norm == "ln_scaling" else 1.0)


class GPTBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int, scale: float) -> None:
        super().__init__()
        self.layer = layer
        d, dff = cfg.d_model, cfg.ffn_dim
        self.n_heads, self.d_ff, self.scale = cfg.n_heads, dff, scale
        lscale = 1.0 / math.sqrt(layer + 1)
        self.attn_norm = make_norm(cfg, d, lscale)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.proj = nn.Linear(d, d, bias=False)
        self.mlp_norm = make_norm(cfg, d, lscale)
        self.up = nn.Linear(d, 2 * dff, bias=False)  # [u; z], the value and gate branches of SwiGLU
        self.down = nn.Linear(dff, d, bias=False)
        self.act = ACTIVATIONS[cfg.activation]
        # the residual connections: h + f(h), or LAUREL's (models/laurel.py)
        self.residual_A = connection(cfg, 2 * layer)
        self.residual_M = connection(cfg, 2 * layer + 1)

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        # h = h + Attn(Norm(h))
        q, k, v = split_heads(self.qkv(self.attn_norm(h)), 3 * self.n_heads).chunk(3, dim=1)
        if self.q_norm is not None:  # QK-norm: per-head RMSNorm before RoPE, as in Qwen3 / OLMo-2
            q, k = self.q_norm(q), self.k_norm(k)
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
    """GPT+ / GPT / DyT / LN-scaling, by config; any of them with LAUREL."""

    supports_laurel = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        scale = self.default_softmax_scale(config)
        self.blocks = nn.ModuleList(GPTBlock(config, i, scale) for i in range(config.n_layers))
        self.final_norm = make_norm(config, config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.init_std
        for m in self.modules():  # every linear map and the embedding; LAUREL's own init draws nothing
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)
        out_std = std / math.sqrt(2 * self.config.n_layers)  # residual-branch outputs (GPT-2 scheme)
        for block in self.blocks:
            block.proj.weight.normal_(0.0, out_std)
            block.down.weight.normal_(0.0, out_std)
            block.residual_A.reset_parameters()
            block.residual_M.reset_parameters()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.final_norm(h))
