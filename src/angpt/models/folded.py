"""Inference form of nGPT and anGPT with every constant folded into the weights (SPEC.md section 1, "Inference").

A constant that multiplies a linear map's output folds into the rows of that map: nu * (W h) = (nu W) h, and a
per-unit vector s does too: s * (W h) = (diag(s) W) h. What is left per block:

    q, k, v = W_qkv h;  q, k = g * Norm(RoPE(q)), Norm(RoPE(k))     [g = s_qk^2 * softmax scale]
    o = SDPA(q, k, v, scale=1) * c_t                                  [c_t = nu_att for anGPT]
    h = r_A * h + W_p o                                               [anGPT: r = nu(a)(1-a), nu(a) a nu_p in W_p]
    h = r_M * h + W_d (u * silu(z)),  [u; z] = W_uz h

nGPT keeps its exact norms (they are its definition): h = Norm(r * h + b * Norm(W x)) with r = 1 - a, b = a.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from angpt.models.base import Block, Context, LanguageModel
from angpt.models.config import ModelConfig
from angpt.models.constants import nu_lerp
from angpt.models.layers import attend, merge_heads, split_heads, unit_norm


class FoldedBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        d, dff = cfg.d_model, cfg.ffn_dim
        self.n_heads, self.d_ff = cfg.n_heads, dff
        self.renorm = cfg.arch == "ngpt"  # exact Norm after each sub-layer (nGPT); anGPT has none
        self.qk_unit = cfg.arch == "ngpt" or cfg.qk_norm_mode == "exact"
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * dff, bias=False)
        self.down = nn.Linear(dff, d, bias=False)
        self.q_gain = nn.Parameter(torch.ones(cfg.n_heads, 1, cfg.head_dim)) if self.qk_unit else None
        self.res_A = nn.Parameter(torch.ones(d))
        self.res_M = nn.Parameter(torch.ones(d))
        self.branch_A = nn.Parameter(torch.ones(d)) if self.renorm else None
        self.branch_M = nn.Parameter(torch.ones(d)) if self.renorm else None

    def _update(self, h: torch.Tensor, x: torch.Tensor, res: nn.Parameter, branch: nn.Parameter | None):
        if branch is None:
            return torch.addcmul(x, h, res.to(h.dtype))
        return unit_norm(torch.addcmul(h * res.to(h.dtype), unit_norm(x), branch.to(h.dtype)))

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(h), 3 * self.n_heads).chunk(3, dim=1)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if self.q_gain is not None:
            q, k = self.q_gain.to(h.dtype) * unit_norm(q), unit_norm(k)
        o = attend(q, k, v, 1.0, ctx.cache, self.layer)
        if ctx.att_scale is not None:
            o = o * ctx.att_factor(q.shape[-2]).to(h.dtype)
        h = self._update(h, self.proj(merge_heads(o)), self.res_A, self.branch_A)
        u, z = self.up(h).split(self.d_ff, dim=-1)
        return self._update(h, self.down(u * F.silu(z)), self.res_M, self.branch_M)


class FoldedLM(LanguageModel):
    """Folded nGPT or anGPT: same logits as the training model, no constant multiplies left."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.blocks = nn.ModuleList(FoldedBlock(config, i) for i in range(config.n_layers))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.arch == "angpt":
            self.register_buffer("att_scale", torch.ones(config.context_length, 1))
        else:
            self.att_scale = None

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)


@torch.no_grad()
def fold_for_inference(model: nn.Module) -> nn.Module:
    """An equivalent inference model with constants and reparameterised scales folded into the weights.

    GPT+ has nothing to fold and comes back as an eval-mode copy. The result is in fp32 and eval mode.
    """
    from angpt.models.constraints import unwrap

    model = unwrap(model)
    cfg: ModelConfig = model.config
    if cfg.arch in ("gpt", "gpt+"):
        return copy.deepcopy(model).float().eval()
    src = copy.deepcopy(model).float()
    out = FoldedLM(cfg)
    out.embed.weight.copy_(src.embed.weight)
    out.lm_head.weight.copy_(src.lm_head.weight * src.s_z()[:, None])  # logits = s_z * (W_out h)
    d, dff, H = cfg.d_model, cfg.ffn_dim, cfg.n_heads
    for sb, fb in zip(src.blocks, out.blocks):
        qkv, up, down, proj = sb.qkv.weight.clone(), sb.up.weight.clone(), sb.down.weight.clone(), sb.proj.weight
        a_A, a_M = sb.alpha_A().expand(d), sb.alpha_M().expand(d)
        if fb.q_gain is not None:  # q.k = sum_i s_i^2 q^_i k^_i, times the softmax scale: all onto q
            fb.q_gain.copy_((sb.s_qk().view(H, 1, -1) ** 2) * sb.scale)
        if cfg.arch == "ngpt":
            up *= (sb.s_uz() * sb.uz_gain)[:, None]
            fb.res_A.copy_(1 - a_A), fb.branch_A.copy_(a_A)
            fb.res_M.copy_(1 - a_M), fb.branch_M.copy_(a_M)
            fb.proj.weight.copy_(proj)
        else:
            nu = sb.nu
            if not fb.qk_unit:  # nu_qkv and the softmax scale onto q and k's rows
                qkv[: 2 * d] *= nu.nu_qkv
                qkv[:d] *= sb.scale
            qkv[2 * d :] *= nu.nu_qkv  # v = nu_qkv W_v h
            c_z = sb.c_z() * nu.c_z if sb.c_z is not None else torch.full((dff,), nu.c_z)
            up[dff:] *= (nu.nu_uz * c_z)[:, None]  # z = nu_uz c_z W_z h
            n_A, n_M = nu_lerp(a_A), nu_lerp(a_M)
            fb.res_A.copy_(n_A * (1 - a_A))
            fb.res_M.copy_(n_M * (1 - a_M))
            fb.proj.weight.copy_(proj * (n_A * a_A * nu.nu_p)[:, None])
            down *= (n_M * a_M * nu.nu_uz * nu.nu_act * nu.nu_d)[:, None]
        fb.qkv.weight.copy_(qkv)
        fb.up.weight.copy_(up)
        fb.down.weight.copy_(down)
    if cfg.arch == "angpt":
        out.att_scale.copy_(src.nu_att.unsqueeze(-1))
    return out.eval()
