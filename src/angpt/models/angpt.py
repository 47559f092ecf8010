"""anGPT: the Approximately Normalized Transformer (Franke et al. 2025, arXiv 2505.22014; SPEC.md section 1).

nGPT with every exact normalisation of a hidden state replaced by a constant `nu` (constants.py), and every
weight row constrained to ||w|| <= 1 instead of = 1. Constant factors that multiply a linear map's output are
merged into one multiply where that is exact (the comments give the paper's equation each line computes);
`fold_for_inference` folds them into the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from angpt.models.base import Block, Context
from angpt.models.config import ModelConfig
from angpt.models.constants import ANGPTConstants, angpt_constants, nu_lerp
from angpt.models.layers import Scale, attend, merge_heads, split_heads, unit_norm
from angpt.models.ngpt import SphereLM, _alpha


class ANGPTBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int, nu: ANGPTConstants) -> None:
        super().__init__()
        self.layer = layer
        d, dff = cfg.d_model, cfg.ffn_dim
        self.n_heads, self.head_dim, self.d_ff = cfg.n_heads, cfg.head_dim, dff
        self.scale = cfg.effective_softmax_scale
        self.nu = nu
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * dff, bias=False)  # [u; z]
        self.down = nn.Linear(dff, d, bias=False)
        # Default QK normalisation: exact, with nGPT's learnable s_qk (SPEC.md section 2).
        self.s_qk = (
            Scale(d, cfg.s_qk_init, cfg.scale_or_default(cfg.s_qk_scale)) if cfg.qk_norm_mode == "exact" else None
        )
        # Gate scale c_z: fixed sqrt(d), or learnable like nGPT's s_uz (starting at the same value).
        self.c_z = Scale(dff, cfg.s_uz_init, cfg.s_uz_scale) if cfg.gate_scale == "learnable" else None
        self.alpha_A = _alpha(cfg)
        self.alpha_M = _alpha(cfg)

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        nu, rec = self.nu, self.recorder is not None
        # q, k, v = nu_qkv * W_{q,k,v} h. v's nu_qkv is applied after SDPA (linear in v), merged with nu_att.
        q, k, v = split_heads(self.qkv(h), 3 * self.n_heads).chunk(3, dim=1)
        dt = q.dtype  # the branch's compute dtype (bf16 under autocast); the residual stream keeps h.dtype
        if rec:
            self.record(q=q * nu.nu_qkv, k=k * nu.nu_qkv, v=v * nu.nu_qkv)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if self.s_qk is not None:
            # q, k = s_qk * Norm(q), s_qk * Norm(k) (nu_qkv cancels in Norm). Only the product enters the
            # logits, (s q^).(s k^) = (s^2 q^).k^, so s_qk^2 and the softmax scale go onto q alone.
            s_qk = self.s_qk().view(self.n_heads, 1, self.head_dim)
            q, k, scale = unit_norm(q) * (s_qk * s_qk * self.scale).to(dt), unit_norm(k), 1.0
        else:
            scale = self.scale * nu.nu_qkv**2  # (nu q).(nu k) = nu^2 q.k
        # o = nu_att * SDPA(q, k, v); ctx.att_scale holds nu_qkv * nu_att[t]
        T = q.shape[-2]
        o = attend(q, k, v, scale, ctx.cache, self.layer) * ctx.att_factor(T).to(dt)
        # h_A = nu_p W_p o;  h = nu(a_A) (h + a_A (h_A - h)) = nu(a_A)(1 - a_A) h + [nu(a_A) a_A nu_p] (W_p o).
        # The bracket scales W_p's output rows: applied to the [d, d] weight, not the [B, T, d] activation.
        a = self.alpha_A()
        n = nu_lerp(a)
        x = F.linear(merge_heads(o), self.proj.weight * (n * a * nu.nu_p).unsqueeze(-1).to(self.proj.weight.dtype))
        if rec:
            self.record(attn_out=o, h_A=x / (n * a).to(dt))
        h = torch.addcmul(x.to(h.dtype), h, (n * (1 - a)).to(h.dtype))
        # u = nu_uz W_u h;  z = nu_uz c_z W_z h;  m = nu_act u silu(z);  h_M = nu_d W_d m
        # Applied to the weights' rows: [nu_uz nu_act; nu_uz c_z] on W_uz, nu(a_M) a_M nu_d on W_d.
        w = self.up.weight
        c_z = self.c_z() * nu.c_z if self.c_z is not None else w.new_full((self.d_ff,), nu.c_z)
        up_rows = torch.cat([w.new_full((self.d_ff,), nu.nu_uz * nu.nu_act), nu.nu_uz * c_z])
        u, z = F.linear(h, w * up_rows.unsqueeze(-1).to(w.dtype)).split(self.d_ff, -1)
        a = self.alpha_M()
        n = nu_lerp(a)
        x = F.linear(u * F.silu(z), self.down.weight * (n * a * nu.nu_d).unsqueeze(-1).to(self.down.weight.dtype))
        if rec:
            self.record(h_M=x / (n * a).to(dt))
        # h = nu(a_M) (h + a_M (h_M - h))
        h = torch.addcmul(x.to(h.dtype), h, (n * (1 - a)).to(h.dtype))
        if rec:
            self.record(h=h)
        return h


class ANGPT(SphereLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.nu = angpt_constants(config)  # one set of constants, shared by every block
        self.blocks = nn.ModuleList(ANGPTBlock(config, i, self.nu) for i in range(config.n_layers))
        # nu_att is a persistent buffer so that a checkpoint carries the constants it was trained with
        # (needed for `calibrated`; harmless otherwise).
        self.register_buffer("nu_att", self.nu.nu_att.clone())
        self.reset_parameters()

    @property
    def att_scale(self) -> torch.Tensor:
        return (self.nu_att * self.nu.nu_qkv).unsqueeze(-1)

    def constraint_groups(self) -> dict[str, list[tuple[torch.Tensor, int]]]:
        # Rows along the input dimension, dim 1 of every [out, in] matrix and of the embedding (SPEC.md).
        rows = [(self.embed.weight, 1), (self.lm_head.weight, 1)]
        for b in self.blocks:
            rows += [(b.qkv.weight, 1), (b.proj.weight, 1), (b.up.weight, 1), (b.down.weight, 1)]
        return {self.config.effective_weight_constraint: rows}


@torch.no_grad()
def calibrate_nu_att(model: ANGPT, batches) -> torch.Tensor:
    """Measure 1/sqrt(E||o_t||^2) per position on real data and freeze it as nu_att (the `calibrated` choice).

    The mean is over layers, heads and sequences of the un-scaled attention output nu_qkv * SDPA(q, k, v).
    """
    T = model.config.context_length
    total = torch.zeros(T, dtype=torch.float64)
    count = torch.zeros(T, dtype=torch.float64)

    def recorder(name: str, x: torch.Tensor) -> None:
        if name == "attn_out":
            scale = model.nu_att[: x.shape[-2]].to(x.dtype).view(1, 1, -1, 1)
            sq = (x / scale).double().pow(2).sum(-1).mean((0, 1)).cpu()
            total[: sq.shape[0]] += sq
            count[: sq.shape[0]] += 1

    for b in model.blocks:
        b.recorder = recorder
    try:
        for x in batches:
            model(x)
    finally:
        for b in model.blocks:
            b.recorder = None
    seen = count > 0
    nu_att = model.nu_att.clone()
    nu_att[seen] = (total[seen] / count[seen]).rsqrt().float().to(nu_att.device)
    model.nu_att.copy_(nu_att)
    return nu_att
