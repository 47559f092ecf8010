"""nGPT: the normalized Transformer (Loshchilov et al. 2024, arXiv 2410.01131; docs/architectures.md#ngpt).

Hidden states, embeddings and every weight row live on the unit hypersphere; each sub-layer takes a learned step
`alpha` from h towards its output and the result is projected back with an exact Norm.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from angpt.models.base import Block, Context, LanguageModel
from angpt.models.config import ModelConfig
from angpt.models.layers import (
    ACTIVATIONS,
    Scale,
    attend,
    init_unit_rows,
    merge_heads,
    scaled_linear,
    split_heads,
    unit_norm,
    unit_qk,
)


def _alpha(cfg: ModelConfig) -> Scale:
    """The eigen learning rate alpha: a vector in R^d (or one scalar), effective value |.|. A smaller stored scale
    (`alpha_speed` > 1) makes Adam's steps, ~lr on the stored value, move the effective alpha further."""
    shape = cfg.d_model if cfg.alpha_shape == "vector" else 1
    return Scale(shape, cfg.alpha_init, cfg.scale_or_default(cfg.alpha_scale) / cfg.alpha_speed, absolute=True)


class NGPTBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int, scale: float) -> None:
        super().__init__()
        self.layer = layer
        d, dff = cfg.d_model, cfg.ffn_dim
        self.n_heads, self.head_dim, self.d_ff = cfg.n_heads, cfg.head_dim, dff
        self.scale = scale  # sqrt(d_h) by default: q, k are unit vectors
        self.act = ACTIVATIONS[cfg.activation]
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * dff, bias=False)  # [u; z]
        self.down = nn.Linear(dff, d, bias=False)
        self.s_qk = Scale(d, cfg.s_qk_init, cfg.scale_or_default(cfg.s_qk_scale))
        self.s_uz = Scale(2 * dff, cfg.s_uz_init, cfg.s_uz_scale)
        self.uz_gain = math.sqrt(d)  # s_uz's effective value is s_uz * sqrt(d) (nGPT section 2.5)
        self.alpha_A = _alpha(cfg)
        self.alpha_M = _alpha(cfg)

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        # q, k, v = W_q h, W_k h, W_v h
        q, k, v = split_heads(self.qkv(h), 3 * self.n_heads).chunk(3, dim=1)
        self.record(q=q, k=k, v=v)
        # q, k = s_qk Norm(RoPE(q)), s_qk Norm(RoPE(k)) per head, logits sqrt(d_h) q.k. Only the product enters the
        # logits, (s q^).(s k^) = (s^2 q^).k^, so s_qk^2 and the softmax scale go onto q alone.
        s_qk = self.s_qk().view(self.n_heads, 1, self.head_dim)
        q, k = unit_qk(ctx.rotate(q), ctx.rotate(k), s_qk * s_qk * self.scale)
        o = attend(q, k, v, 1.0, ctx.cache, self.layer)
        # h_A = Norm(W_p o);  h = Norm(h + |a_A| (h_A - h))
        h_A = unit_norm(self.proj(merge_heads(o)).to(h.dtype))
        h = unit_norm(torch.lerp(h, h_A, self.alpha_A().to(h.dtype)))
        self.record(attn_out=o, h_A=h_A)
        # u, z = s_u (W_u h), s_z (W_z h), with s_uz = stored s_uz * sqrt(d)
        u, z = scaled_linear(h, self.up.weight, self.s_uz() * self.uz_gain).split(self.d_ff, dim=-1)
        # h_M = Norm(W_d (u silu(z)));  h = Norm(h + |a_M| (h_M - h))
        h_M = unit_norm(self.down(u * self.act(z)).to(h.dtype))
        h = unit_norm(torch.lerp(h, h_M, self.alpha_M().to(h.dtype)))
        self.record(h_M=h_M, h=h)
        return h


class SphereLM(LanguageModel):
    """What nGPT and anGPT share: an LM head scaled by the learned s_z, unit-row init of every matrix, and the
    frozen-scale controls."""

    unit_qk = True
    controls = frozenset({"freeze_alpha", "freeze_scales"})

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.s_z = Scale(config.vocab_size, config.logits_init_scale, config.scale_or_default(config.s_z_scale))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for weights in self.constraint_groups().values():
            for w, dim in weights:
                init_unit_rows(w, dim)

    def freeze_controls(self) -> None:
        """The frozen eigen learning rates control (docs/architectures.md#controls): alpha_A, alpha_M
        (`freeze_alpha`) or every learned scale (`freeze_scales`) stays at its init. The parameters stay in the
        state dict (checkpoints, folding and export are unchanged); with requires_grad off the optimizer skips them.
        """
        if self.config.freeze_scales:
            frozen = [m for m in self.modules() if isinstance(m, Scale)]
        elif self.config.freeze_alpha:
            frozen = [a for b in self.blocks for a in (b.alpha_A, b.alpha_M)]
        else:
            frozen = []
        for scale in frozen:
            scale.param.requires_grad_(False)

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # logits = s_z * (W_out h); no final norm
        return h, self.lm_head.weight, self.s_z()


class NGPT(SphereLM):
    weight_constraint = "unit"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        scale = self.default_softmax_scale(config)
        self.blocks = nn.ModuleList(NGPTBlock(config, i, scale) for i in range(config.n_layers))
        self.reset_parameters()
        self.freeze_controls()

    def constraint_groups(self) -> dict[str, list[tuple[torch.Tensor, int]]]:
        # Every matrix is normalised along its d-sized dimension: the input for embedding, head, W_qkv and
        # W_uz (dim 1), the output for the attention and MLP output projections (dim 0).
        along_d = [(self.embed.weight, 1), (self.lm_head.weight, 1)]
        for b in self.blocks:
            along_d += [(b.qkv.weight, 1), (b.up.weight, 1), (b.proj.weight, 0), (b.down.weight, 0)]
        return {self.constraint_of(self.config): along_d}
