"""Inference forms of nGPT and anGPT with every constant folded into the weights.

See docs/architectures.md#inference-folding.

A constant that multiplies a linear map's output folds into the rows of that map: nu * (W h) = (nu W) h, and a
per-unit vector s does too: s * (W h) = (diag(s) W) h. Attention is the same in both folded forms:

    q, k, v = W_qkv h;  q, k = g * Norm(RoPE(q)), Norm(RoPE(k))     [g = s_qk^2 * softmax scale, per head]
    o = SDPA(q, k, v, scale=1) * c_t                                  [c_t = nu_qkv nu_att[t] for anGPT]

What is left of each residual update:

    nGPT:   h = Norm(r_A * h + b_A * Norm(W_p o)),   r = 1 - a, b = a (its exact norms are its definition)
    anGPT:  h = r_A * h + W_p o,                     r = nu(a) (1 - a); nu(a) a nu_p folded into W_p's rows

With LAUREL (models/laurel.py) anGPT and GPT+ add B' A h + sum_j G_j * x_{i-j} to the update (`FoldedLaurel`),
its RW weights and normalising factor folded into W_p, W_d, r, B' and G; GPT+ with LAUREL keeps its pre-norms.
`FoldedGPT.fold` is the GPT family's one fold: weight normalisation (gpt+wn) into plain weights, then LAUREL's.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from angpt.models.base import Block, Context, LanguageModel
from angpt.models.config import ModelConfig
from angpt.models.gpt import GPT, make_norm
from angpt.models.laurel import FoldedLaurel, folded_laurel
from angpt.models.layers import ACTIVATIONS, attend, merge_heads, split_heads, unit_norm, unit_qk


class FoldedBlock(Block):
    """What both folded blocks share: attention with q, k unit per head (gain on q) or plain, and the SwiGLU MLP.

    The weights sit flat on the block (qkv, proj, up, down, q_gain): the Hugging Face class uses the same names.
    """

    scale = 1.0  # the softmax scale (folded into q's gain, except for GPT+)

    def __init__(self, cfg: ModelConfig, layer: int, qk_unit: bool) -> None:
        super().__init__()
        d, dff = cfg.d_model, cfg.ffn_dim
        self.layer, self.n_heads, self.d_ff = layer, cfg.n_heads, dff
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * dff, bias=False)  # [u; z]
        self.down = nn.Linear(dff, d, bias=False)
        self.q_gain = nn.Parameter(torch.ones(cfg.n_heads, 1, cfg.head_dim)) if qk_unit else None
        self.q_norm = self.k_norm = None  # GPT+'s QK-norm (per-head RMSNorm before RoPE)
        self.act = ACTIVATIONS[cfg.activation]

    def attention(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(h), 3 * self.n_heads).chunk(3, dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = ctx.rotate(q), ctx.rotate(k)
        if self.q_gain is not None:
            q, k = unit_qk(q, k, self.q_gain)
        o = attend(q, k, v, self.scale, ctx.cache, self.layer)
        if ctx.att_scale is not None:
            o = o * ctx.att_factor(q.shape[-2]).to(o.dtype)
        return self.proj(merge_heads(o)).to(h.dtype)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        u, z = self.up(h).split(self.d_ff, dim=-1)
        return self.down(u * self.act(z)).to(h.dtype)

    @staticmethod
    def scaled_update(h, x, res, laurel: FoldedLaurel | None, ctx: Context) -> torch.Tensor:
        """h = r * h + x, plus LAUREL's terms where there are any."""
        out = torch.addcmul(x, h, res.to(h.dtype))
        return out if laurel is None else out + laurel(h, ctx)


class FoldedNGPTBlock(FoldedBlock):
    """h = Norm(r * h + b * Norm(x)) after each sub-layer x."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer, qk_unit=True)
        d = cfg.d_model
        self.res_A, self.branch_A = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.res_M, self.branch_M = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))

    @staticmethod
    def update(h, x, res, branch):
        return unit_norm(torch.addcmul(h * res.to(h.dtype), unit_norm(x), branch.to(h.dtype)))

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        h = self.update(h, self.attention(h, ctx), self.res_A, self.branch_A)
        return self.update(h, self.mlp(h), self.res_M, self.branch_M)


class FoldedANGPTBlock(FoldedBlock):
    """h = r * h + x after each sub-layer x (its branch factor is in the sub-layer's output rows)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer, qk_unit=cfg.qk_norm_mode == "exact")
        self.res_A, self.res_M = nn.Parameter(torch.ones(cfg.d_model)), nn.Parameter(torch.ones(cfg.d_model))
        self.laurel_A, self.laurel_M = folded_laurel(cfg, 2 * layer), folded_laurel(cfg, 2 * layer + 1)
        self.norm_attn_input, self.norm_mlp_input = cfg.input_norm == "block", cfg.input_norm in ("mlp", "block")

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        x = unit_norm(h) if self.norm_attn_input else h  # model.input_norm: an exact norm of the branch input
        h = self.scaled_update(h, self.attention(x, ctx), self.res_A, self.laurel_A, ctx)
        x = unit_norm(h) if self.norm_mlp_input else h
        return self.scaled_update(h, self.mlp(x), self.res_M, self.laurel_M, ctx)


class FoldedGPTBlock(FoldedBlock):
    """GPT+ with LAUREL folded in: h = r * h + x + LAUREL's terms after x = Attn(Norm(h)), then MLP(Norm(h)).

    Cosine attention (gpt+cos) is q, k unit per head with 1/tau as q's gain and softmax scale 1 (RoPE is a rotation:
    normalising after it is normalising before it).
    """

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer, qk_unit=cfg.attention == "cosine")
        d = cfg.d_model
        self.scale = GPT.default_softmax_scale(cfg)
        self.attn_norm, self.mlp_norm = make_norm(cfg, d), make_norm(cfg, d)  # LN-scaling's factor sits in the gain
        if cfg.qk_norm:
            self.q_norm, self.k_norm = make_norm(cfg, cfg.head_dim), make_norm(cfg, cfg.head_dim)
        self.res_A, self.res_M = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.laurel_A, self.laurel_M = folded_laurel(cfg, 2 * layer), folded_laurel(cfg, 2 * layer + 1)

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        h = self.scaled_update(h, self.attention(self.attn_norm(h), ctx), self.res_A, self.laurel_A, ctx)
        return self.scaled_update(h, self.mlp(self.mlp_norm(h)), self.res_M, self.laurel_M, ctx)


class FoldedLM(LanguageModel):
    """A folded model: the training model's logits with no constant multiplies left. Subclasses set `block`."""

    block: type[Block]
    residual: str  # "normalized", "scaled" or "prenorm": the Hugging Face class's name for the block's update
    has_att_scale = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.blocks = nn.ModuleList(self.block(config, i) for i in range(config.n_layers))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if self.has_att_scale:
            self.register_buffer("att_scale", torch.ones(config.context_length, 1))
        else:
            self.att_scale = None

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return h, self.lm_head.weight, None

    @classmethod
    def start(cls, model: nn.Module) -> tuple[nn.Module, FoldedLM]:
        """(an fp32 copy of `model`, a folded model with its embedding and s_z-scaled head filled in)."""
        src = copy.deepcopy(model).float()
        out = cls(src.config).to(src.embed.weight.device)  # folded where the model is (a GPU model on the GPU)
        out.embed.weight.copy_(src.embed.weight)
        out.lm_head.weight.copy_(src.lm_head.weight * src.s_z()[:, None])  # logits = s_z * (W_out h)
        return src, out


def _q_gain(sb) -> torch.Tensor:
    """q.k = sum_i s_i^2 q^_i k^_i times the softmax scale: all onto q, per head."""
    return (sb.s_qk().view(sb.n_heads, 1, -1) ** 2) * sb.scale


class FoldedNGPT(FoldedLM):
    block = FoldedNGPTBlock
    residual = "normalized"

    @classmethod
    @torch.no_grad()
    def fold(cls, model: nn.Module) -> FoldedNGPT:
        """nGPT in folded form: s_qk and the softmax scale onto q's gain, s_uz onto W_uz's rows."""
        return _fold_ngpt(*cls.start(model))


class FoldedANGPT(FoldedLM):
    block = FoldedANGPTBlock
    residual = "scaled"
    has_att_scale = True

    @classmethod
    @torch.no_grad()
    def fold(cls, model: nn.Module) -> FoldedANGPT:
        """anGPT in folded form: every nu, c_z and the residual's branch factor nu(a) a onto the weights' rows."""
        return _fold_angpt(*cls.start(model))


class FoldedGPT(FoldedLM):
    block = FoldedGPTBlock
    residual = "prenorm"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.final_norm = make_norm(config, config.d_model)

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return self.final_norm(h), self.lm_head.weight, None

    @classmethod
    @torch.no_grad()
    def fold(cls, model: nn.Module) -> nn.Module:
        """The GPT family's inference form, in two steps. Weight normalisation (gpt+wn) first: each W = g V/||V||
        computed into a plain weight (`GPT.fold`). Then LAUREL: alpha onto W_p's and W_d's rows, beta into r and B',
        gamma into G (and cosine attention's 1/tau onto q's gain).

        Without LAUREL the plain GPT+ of the first step comes back (eval mode, fp32), which exports as Qwen3 / Llama.
        """
        src = GPT.fold(model) if model.config.weight_norm else copy.deepcopy(model).float().eval()
        if not src.config.laurel_parts:
            return src
        out = cls(src.config).to(src.embed.weight.device)
        out.embed.weight.copy_(src.embed.weight)
        out.lm_head.weight.copy_(src.lm_head.weight)
        _copy_module(out.final_norm, src.final_norm)
        for sb, fb in zip(src.blocks, out.blocks):
            for name in ("qkv", "proj", "up", "down", "attn_norm", "mlp_norm", "q_norm", "k_norm"):
                if getattr(sb, name) is not None:
                    _copy_module(getattr(fb, name), getattr(sb, name))
            if sb.inv_tau is not None:  # cosine attention: logits cos(q, k) / tau
                fb.q_gain.copy_(sb.inv_tau().view(-1, 1, 1).expand_as(fb.q_gain))
            for conn, weight, res, laurel in (
                (sb.residual_A, fb.proj.weight, fb.res_A, fb.laurel_A),
                (sb.residual_M, fb.down.weight, fb.res_M, fb.laurel_M),
            ):
                alpha, beta = conn.rw() if conn.w is not None else (weight.new_ones(()), weight.new_ones(()))
                weight.mul_(alpha.expand(weight.shape[0])[:, None])  # alpha f(x) = (diag(alpha) W) m
                res.copy_(beta.expand_as(res))
                if laurel is not None:
                    laurel.load(conn, beta, weight.new_ones(()))
        return out.eval()


def _copy_module(dst: nn.Module, src: nn.Module) -> None:
    """Copy a module's weights; an LN-scaling RMSNorm's 1/sqrt(l) goes into its gain."""
    dst.load_state_dict(src.state_dict())
    if getattr(src, "scale", 1.0) != 1.0:
        dst.weight.mul_(src.scale)


def _fold_ngpt(src: nn.Module, out: FoldedNGPT) -> FoldedNGPT:
    d = src.config.d_model
    for sb, fb in zip(src.blocks, out.blocks):
        a_A, a_M = sb.alpha_A().expand(d), sb.alpha_M().expand(d)
        fb.q_gain.copy_(_q_gain(sb))
        fb.qkv.weight.copy_(sb.qkv.weight)
        fb.proj.weight.copy_(sb.proj.weight)
        fb.up.weight.copy_(sb.up.weight * (sb.s_uz() * sb.uz_gain)[:, None])
        fb.down.weight.copy_(sb.down.weight)
        fb.res_A.copy_(1 - a_A), fb.branch_A.copy_(a_A)
        fb.res_M.copy_(1 - a_M), fb.branch_M.copy_(a_M)
    return out.eval()


def _fold_angpt(src: nn.Module, out: FoldedANGPT) -> FoldedANGPT:
    cfg = src.config
    d, dff = cfg.d_model, cfg.ffn_dim
    for sb, fb in zip(src.blocks, out.blocks):
        nu = sb.nu
        qkv, up, down = sb.qkv.weight.clone(), sb.up.weight.clone(), sb.down.weight.clone()
        a_A, a_M = sb.alpha_A().expand(d), sb.alpha_M().expand(d)
        qkv *= nu.nu_qkv  # q, k, v = nu_qkv W h (cancels in q and k under the exact QK-norm)
        if fb.q_gain is not None:
            fb.q_gain.copy_(_q_gain(sb))
        else:  # the softmax scale onto q's rows
            qkv[:d] *= sb.scale
        c_z = sb.c_z() * nu.c_z if sb.c_z is not None else up.new_full((dff,), nu.c_z)
        up[dff:] *= (nu.nu_uz * c_z)[:, None]  # z = nu_uz c_z W_z h
        up[:dff] *= nu.nu_uz  # u = nu_uz W_u h
        # h = nu (c_A h_X + c_h h [+ LAUREL's terms]): nu c_h into r, nu c_A and the branch constant into W's rows
        (n_A, ch_A, cA_A), (n_M, ch_M, cA_M) = sb.residual_A.factors(a_A), sb.residual_M.factors(a_M)
        fb.res_A.copy_(n_A * ch_A)
        fb.res_M.copy_(n_M * ch_M)
        fb.qkv.weight.copy_(qkv)
        fb.proj.weight.copy_(sb.proj.weight * (n_A * cA_A * nu.nu_p)[:, None])
        fb.up.weight.copy_(up)
        fb.down.weight.copy_(down * (n_M * cA_M * nu.nu_act * nu.nu_d)[:, None])  # h_M = nu_d W_d (nu_act m)
        for laurel, conn, n, c_h in ((fb.laurel_A, sb.residual_A, n_A, ch_A), (fb.laurel_M, sb.residual_M, n_M, ch_M)):
            if laurel is not None:
                laurel.load(conn, n * c_h, n)
    out.att_scale.copy_(src.att_scale)  # nu_att[t]
    return out.eval()
