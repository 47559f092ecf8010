"""TokenFormer as Hugging Face transformers classes (imports only torch, transformers and modeling_angpt.py).

`angpt.hf.export.export_hf` copies this file and modeling_angpt.py (its RoPE, mask and loss helpers) beside the
weights of an exported TokenFormer, and config.json's `auto_map` points here, so that

    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)

works where the `angpt` package is not installed; this file must therefore never import `angpt`. The parameter
names are angpt's TokenFormer's (frozen tokens, a training-time split, are exported joined). Per block
(Wang et al. 2024, arXiv 2410.23168; angpt's docs/architectures.md#tokenformer):

    Pattention(X) = Theta(X K_P^T) V_P,    Theta(A) = GeLU(A sqrt(n) / ||A||)  or  softmax(A) n
    x = LN(h);  q, k, v = Pattention_Q(x), Pattention_K(x), Pattention_V(x);  q, k = RoPE(q), RoPE(k)
    h = h + Pattention_O(SDPA(q, k, v));    h = h + Pattention_FFN(LN(h))
    logits = W_out LN(h)                     (LN: LayerNorm without gain or bias)

`n` in Theta is a stored constant per kind of Pattention (`norm_tokens`, `ffn_norm_tokens`): a grown model keeps
its original value.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .modeling_angpt import CausalLMSeams, _rope, warn_if_untested

MODEL_TYPE = "angpt_tokenformer"
THETAS = ("l2_norm_gelu", "softmax")


class TokenformerConfig(PretrainedConfig):
    """Shape of a TokenFormer: `param_tokens` per Q, K, V and output Pattention, `ffn_tokens` per FFN Pattention,
    and the `n` each kind's Theta normalises with (default: its token count)."""

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        max_position_embeddings: int = 64,
        rope_theta: float = 10000.0,
        param_tokens: int = 64,
        ffn_tokens: int = 256,
        norm_tokens: int | None = None,
        ffn_norm_tokens: int | None = None,
        pattention: str = "l2_norm_gelu",
        layer_norm_eps: float = 1e-5,
        attention_scale: float | None = None,
        arch: str = "tokenformer",
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        **kwargs,
    ) -> None:
        if pattention not in THETAS:
            raise ValueError(f"pattention must be one of {THETAS}, got {pattention!r}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.param_tokens = param_tokens
        self.ffn_tokens = ffn_tokens
        self.norm_tokens = norm_tokens if norm_tokens is not None else param_tokens
        self.ffn_norm_tokens = ffn_norm_tokens if ffn_norm_tokens is not None else ffn_tokens
        self.pattention = pattention
        self.layer_norm_eps = layer_norm_eps
        self.attention_scale = attention_scale if attention_scale is not None else self.head_dim**-0.5
        self.arch = arch
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


def _layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class Pattention(nn.Module):
    """Theta(X K_P^T) V_P over `tokens` key-value parameter tokens; Theta in fp32 with the stored `norm_tokens`."""

    def __init__(self, d: int, tokens: int, norm_tokens: int, kind: str) -> None:
        super().__init__()
        self.key_tokens = nn.Parameter(torch.empty(tokens, d))
        self.value_tokens = nn.Parameter(torch.empty(tokens, d))
        self.norm_tokens, self.kind = norm_tokens, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.linear(x, self.key_tokens).float()
        if self.kind == "l2_norm_gelu":
            weights = F.gelu(F.normalize(a, dim=-1) * math.sqrt(self.norm_tokens))
        else:
            weights = torch.softmax(a, dim=-1) * self.norm_tokens
        return torch.matmul(weights.to(x.dtype), self.value_tokens)


class TokenformerBlock(nn.Module):
    def __init__(self, config: TokenformerConfig, layer_idx: int) -> None:
        super().__init__()
        d, n, nf = config.hidden_size, config.param_tokens, config.ffn_tokens
        self.layer_idx, self.n_heads, self.eps, self.scale = (
            layer_idx,
            config.num_attention_heads,
            config.layer_norm_eps,
            config.attention_scale,
        )
        self.query = Pattention(d, n, config.norm_tokens, config.pattention)
        self.key = Pattention(d, n, config.norm_tokens, config.pattention)
        self.value = Pattention(d, n, config.norm_tokens, config.pattention)
        self.proj = Pattention(d, n, config.norm_tokens, config.pattention)
        self.ffn = Pattention(d, nf, config.ffn_norm_tokens, config.pattention)

    def forward(self, h, cos, sin, mask, is_causal, cache):
        B, T, _ = h.shape
        x = _layer_norm(h, self.eps)
        q, k, v = (p(x).view(B, T, self.n_heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value))
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale)
        h = h + self.proj(o.transpose(1, 2).reshape(B, T, -1)).to(h.dtype)
        return h + self.ffn(_layer_norm(h, self.eps)).to(h.dtype)


class TokenformerPreTrainedModel(PreTrainedModel):
    config_class = TokenformerConfig
    base_model_prefix = "tokenformer"
    _no_split_modules = ["TokenformerBlock"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # Exported weights always come with the checkpoint; this only gives fresh models (from_config) sane values.
        if isinstance(module, Pattention):
            module.key_tokens.normal_(0.0, 0.02)
            module.value_tokens.normal_(0.0, 2.0 / (self.config.num_hidden_layers * self.config.hidden_size**0.5))
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, 0.02)

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        warn_if_untested()


class TokenformerForCausalLM(CausalLMSeams, TokenformerPreTrainedModel, GenerationMixin):
    """TokenFormer language model with a Hugging Face `Cache` (DynamicCache) for `generate`."""

    def __init__(self, config: TokenformerConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(TokenformerBlock(config, i) for i in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits [B, T, V], and the next-token loss when `labels` are given (transformers' convention: labels
        shifted here, -100 ignored). Masks, positions and the cache as in modeling_angpt's folded class."""
        h, cache, position_ids, (mask, is_causal), (cos, sin) = self.prepare_forward(
            input_ids, inputs_embeds, attention_mask, position_ids, past_key_values, use_cache, kwargs
        )
        for block in self.blocks:
            h = block(h, cos, sin, mask, is_causal, cache)

        return self.output(h, self.head, logits_to_keep, labels, cache, kwargs)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of final hidden states: the non-parametric final LayerNorm, then W_out."""
        return self.lm_head(_layer_norm(h, self.config.layer_norm_eps))
