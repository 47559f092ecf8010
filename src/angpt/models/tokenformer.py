"""TokenFormer: model parameters as tokens (Wang et al. 2024, arXiv 2410.23168; docs/architectures.md#tokenformer).

Every linear map of the Transformer block becomes a Pattention, attention from the input tokens to n learnable
key-value *parameter tokens* (the paper's "Pattention"):

    Pattention(X) = Theta(X K_P^T) V_P,    K_P in R^{n x d_in}, V_P in R^{n x d_out}
    Theta(A) = GeLU(A * sqrt(n) / ||A||_2)      the L2 norm over the n scores of each token (the default)
             | softmax(A) * n                   (model.pattention = "softmax", the ablation's alternative)

A model grows by appending key-value tokens to every Pattention (the paper's "progressive model scaling"): a new
key of zeros scores 0 and GeLU(0) = 0, so the new tokens add nothing, and the `n` inside Theta is a stored constant
(`model.norm_tokens`, the official TPU code's `zoom_dim`), so the old scores are normalised as before: the grown
model's logits equal the original's. `grow` does this; the old tokens can be frozen for the continued training.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from angpt.errors import ConfigError
from angpt.models.base import Block, Context, LanguageModel
from angpt.models.config import ModelConfig
from angpt.models.layers import attend, merge_heads, split_heads


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without a learnable gain or bias (the paper's non-parametric norm), in fp32."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def theta(scores: torch.Tensor, kind: str, n: int) -> torch.Tensor:
    """Theta of the Pattention scores A [..., tokens], in fp32; `n` is the stored normalising size."""
    a = scores.float()
    if kind == "l2_norm_gelu":  # GeLU(A sqrt(n) / ||A||_2): F.normalize divides by max(||A||, 1e-12)
        return F.gelu(F.normalize(a, dim=-1) * math.sqrt(n))
    return torch.softmax(a, dim=-1) * n  # "softmax": softmax times n, so that the n weights average 1


class Pattention(nn.Module):
    """Theta(X K_P^T) V_P over n parameter tokens; the first `frozen` of them are not trained.

    Frozen tokens are separate parameters with requires_grad=False: the optimizer never sees them, so neither
    gradients nor AdamW's decoupled weight decay move them (a gradient mask alone would leave the decay on).
    """

    def __init__(self, d_in: int, d_out: int, tokens: int, norm_tokens: int, frozen: int, kind: str) -> None:
        super().__init__()
        self.kind, self.norm_tokens, self.frozen = kind, norm_tokens, frozen
        self.key_tokens = nn.Parameter(torch.empty(tokens - frozen, d_in))  # K_P
        self.value_tokens = nn.Parameter(torch.empty(tokens - frozen, d_out))  # V_P
        if frozen:
            self.frozen_key_tokens = nn.Parameter(torch.empty(frozen, d_in), requires_grad=False)
            self.frozen_value_tokens = nn.Parameter(torch.empty(frozen, d_out), requires_grad=False)
        else:
            self.frozen_key_tokens = self.frozen_value_tokens = None

    def tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K_P, V_P), frozen tokens first."""
        if self.frozen_key_tokens is None:
            return self.key_tokens, self.value_tokens
        keys = torch.cat([self.frozen_key_tokens, self.key_tokens])
        return keys, torch.cat([self.frozen_value_tokens, self.value_tokens])

    @torch.no_grad()
    def set_tokens(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Load all n tokens (frozen first), split as this layer stores them."""
        f = self.frozen
        self.key_tokens.copy_(keys[f:])
        self.value_tokens.copy_(values[f:])
        if f:
            self.frozen_key_tokens.copy_(keys[:f])
            self.frozen_value_tokens.copy_(values[:f])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys, values = self.tokens()
        weights = theta(F.linear(x, keys), self.kind, self.norm_tokens)  # Theta(X K_P^T), [..., n]
        return torch.matmul(weights.to(x.dtype), values)

    def extra_repr(self) -> str:
        n = self.key_tokens.shape[0] + self.frozen
        return f"tokens={n}, frozen={self.frozen}, theta={self.kind}, norm_tokens={self.norm_tokens}"


def _pattention(cfg: ModelConfig, ffn: bool) -> Pattention:
    tokens, norm, frozen = cfg.pattention_sizes(ffn)
    return Pattention(cfg.d_model, cfg.d_model, tokens, norm, frozen, cfg.pattention)


class TokenFormerBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int, scale: float) -> None:
        super().__init__()
        self.layer, self.n_heads, self.scale, self.eps = layer, cfg.n_heads, scale, cfg.norm_eps
        self.query = _pattention(cfg, ffn=False)
        self.key = _pattention(cfg, ffn=False)
        self.value = _pattention(cfg, ffn=False)
        self.proj = _pattention(cfg, ffn=False)
        self.ffn = _pattention(cfg, ffn=True)

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        # X = LN(h);  Q, K, V = Pattention_Q(X), Pattention_K(X), Pattention_V(X)
        x = layer_norm(h, self.eps)
        q, k, v = (split_heads(p(x), self.n_heads) for p in (self.query, self.key, self.value))
        self.record(q=q, k=k, v=v)
        # token-token attention stays standard: softmax(Q K^T / sqrt(d_h)) V, with RoPE on q and k
        q, k = ctx.rotate(q), ctx.rotate(k)
        o = attend(q, k, v, self.scale, ctx.cache, self.layer)
        self.record(attn_out=o)
        h_a = self.proj(merge_heads(o))  # O = Pattention_O(attention)
        self.record(h_A=h_a)
        h = h + h_a.to(h.dtype)
        h_m = self.ffn(layer_norm(h, self.eps))  # FFN = Pattention_FFN(LN(h))
        self.record(h_M=h_m)
        h = h + h_m.to(h.dtype)
        self.record(h=h)
        return h


class TokenFormer(LanguageModel):
    """Pre-norm Transformer whose Q, K, V, output and FFN maps are Pattentions (no biases, no norm gains)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        scale = self.default_softmax_scale(config)
        self.blocks = nn.ModuleList(TokenFormerBlock(config, i, scale) for i in range(config.n_layers))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def pattentions(self) -> list[Pattention]:
        return [m for m in self.modules() if isinstance(m, Pattention)]

    def value_std(self) -> float:
        """Value tokens' init std, 2 / (L sqrt(d)): the official code's `wang_init` (its output-layer init)."""
        return 2.0 / (self.config.n_layers * math.sqrt(self.config.d_model))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.init_std  # key tokens, embedding and LM head: N(0, 0.02^2) (the official `normal` init)
        self.embed.weight.normal_(0.0, std)
        self.lm_head.weight.normal_(0.0, std)
        for p in self.pattentions():
            for keys in (p.key_tokens, p.frozen_key_tokens):
                if keys is not None:
                    keys.normal_(0.0, std)
            for values in (p.value_tokens, p.frozen_value_tokens):
                if values is not None:
                    values.normal_(0.0, self.value_std())

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return layer_norm(h, self.config.norm_eps), self.lm_head.weight, None


def saved_per_token(cfg: ModelConfig, e: int) -> float:
    """Bytes one block saves for the backward per token, with e bytes per compute element (train/dryrun.py's
    method, Korthikanti et al. 2022): the fp32 inputs of the two LayerNorms 2 * 4h; per Pattention over n tokens
    its input's e-byte copy (e h), the fp32 scores kept by the L2 norm and by GeLU (8n) and the e-byte weights of
    Theta V (e n); attention as in the GPT block, 7e h. 40h + 16e h + (8 + e) f in all (f: the FFN's tokens).
    """
    h, f = cfg.d_model, cfg.ffn_dim
    n = cfg.attn_tokens
    return 2 * 4 * h + 4 * (e * h + (8 + e) * n) + (e * h + (8 + e) * f) + 7 * e * h


# --------------------------------------------------------------------------------------------------- growth
def ffn_growth(cfg: ModelConfig, add_tokens: int) -> int:
    """Tokens the FFN Pattention gains when each attention Pattention gains `add_tokens`: the same proportion
    (4x by default, as in the paper's 354M -> 757M configs: 768 -> 1792 and 3072 -> 7168 tokens)."""
    return max(1, round(add_tokens * cfg.ffn_dim / cfg.attn_tokens))


@torch.no_grad()
def grow(
    model: TokenFormer, add_tokens: int, add_ffn_tokens: int | None = None, *, freeze_old: bool = False
) -> TokenFormer:
    """A new TokenFormer with `add_tokens` key-value tokens appended to every Q, K, V and output Pattention and
    `add_ffn_tokens` (default: the same proportion, `ffn_growth`) to every FFN Pattention; `model` is unchanged.

    New keys are 0 (the paper's progressive scaling), so their scores are 0 and GeLU(0) = 0; new values are drawn like a
    fresh model's (N(0, (2 / (L sqrt(d)))^2), from torch's global RNG) so that the new keys get gradients at once.
    The normalising sizes stay those of `model`: the grown model's logits equal the original's. With `freeze_old`
    every old token is frozen (not trained); without it all tokens train, including any frozen before.
    """
    cfg = model.config
    if cfg.pattention != "l2_norm_gelu":
        raise ConfigError(
            f"growth preserves the model only with model.pattention=l2_norm_gelu (a zero key still takes "
            f"softmax weight); this model has {cfg.pattention}"
        )
    for name, value in (("add_tokens", add_tokens), ("add_ffn_tokens", add_ffn_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    add_ffn_tokens = ffn_growth(cfg, add_tokens) if add_ffn_tokens is None else add_ffn_tokens
    (n, norm, _), (n_ffn, norm_ffn, _) = cfg.pattention_sizes(ffn=False), cfg.pattention_sizes(ffn=True)
    new_cfg = dataclasses.replace(
        cfg,
        param_tokens=n + add_tokens,
        d_ff=n_ffn + add_ffn_tokens,
        norm_tokens=norm,
        ffn_norm_tokens=norm_ffn,
        frozen_tokens=n if freeze_old else 0,
        frozen_ffn_tokens=n_ffn if freeze_old else 0,
    )
    like = next(model.parameters())
    grown = type(model)(new_cfg).to(like.device, like.dtype)  # a fresh init: its value tokens give the new values
    grown.embed.weight.copy_(model.embed.weight)
    grown.lm_head.weight.copy_(model.lm_head.weight)
    for old, new in zip(model.pattentions(), grown.pattentions()):
        keys, values = old.tokens()
        fresh = new.tokens()[1][keys.shape[0] :]  # the fresh model's values at the new positions
        new.set_tokens(torch.cat([keys, keys.new_zeros(len(fresh), keys.shape[1])]), torch.cat([values, fresh]))
    return grown.train(model.training)
