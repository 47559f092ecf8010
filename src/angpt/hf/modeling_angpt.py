"""Folded nGPT / anGPT (and GPT+ with LAUREL) as Hugging Face transformers classes (self-contained: imports only
torch and transformers).

`angpt.hf.export.export_hf` copies this file beside the weights of an exported nGPT or anGPT, and config.json's
`auto_map` points at it, so that

    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)

works where the `angpt` package is not installed. It must therefore never import `angpt`.

The model is angpt's `FoldedLM` (see angpt/models/folded.py): every constant of the training model already sits
in the weights, and the parameter names are FoldedLM's, so its state dict loads unchanged. Per block:

    q, k, v = W_qkv h;  q, k = RoPE(q), RoPE(k);  q, k = g * Norm(q), Norm(k)      (g only with unit q, k)
    o = SDPA(q, k, v, scale=1) * c[t]                                               (c: anGPT's nu_att; t = position)
    anGPT: h = r_A * h + W_p o;                  h = r_M * h + W_d (u * silu(z)),  [u; z] = W_uz h
    nGPT:  h = Norm(r_A * h + b_A * Norm(W_p o)); h = Norm(r_M * h + b_M * Norm(W_d (u * silu(z))))
    logits = W_out h

GPT+ with LAUREL ("prenorm") is the Qwen3 block with anGPT's update: h = r_A * h + Attn(RMSNorm(h)) (QK-norm: RMSNorm
of q, k before RoPE, the usual softmax scale), then the MLP likewise, and a final RMSNorm before W_out. With LAUREL
(angpt/models/laurel.py) each update adds B A h + sum_j gamma_j * x_{i-j}, where x_i is the input of residual
connection i (2l: layer l's attention, 2l + 1: its MLP) and gamma_j a vector per channel.

Positions come from `position_ids` (what `generate` derives from the attention mask), so a left-padded row sees
the same RoPE angles and the same per-position factor c[t] as when it is run alone.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

try:  # transformers >= 4.36
    from transformers import DynamicCache
except ImportError:  # pragma: no cover - very old transformers: generation then runs without a cache
    DynamicCache = None

MODEL_TYPE = "angpt_folded"

# transformers renamed the KV cache from `past_key_values` to `cache` (5.24: `generate` passes `cache=` to forward and
# reads `outputs["cache"]`; the old name is a deprecated alias). Our forwards take either name, and return the cache
# under whichever field this transformers' output class declares (a public dataclass field, no internals).
# The transformers releases `make test-compat` has run these classes on (its oldest and newest legs); outside this
# range loading warns once, since a renamed argument can change what `generate` computes without failing.
TESTED_TRANSFORMERS = ("4.51.0", "5.24.0")
_warned_untested = False


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def warn_if_untested(version: str | None = None) -> bool:
    """Warn once per process when `version` (default: the installed transformers) is outside TESTED_TRANSFORMERS."""
    global _warned_untested
    version = version or transformers.__version__
    low, high = TESTED_TRANSFORMERS
    if _warned_untested or _release(low) <= _release(version) <= _release(high):
        return False
    _warned_untested = True
    warnings.warn(
        f"transformers {version} is outside the range this model class was tested on ({low} to {high}); if "
        "generate() output looks wrong, compare it with generate(..., use_cache=False)",
        stacklevel=3,
    )
    return True


CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


class AngptFoldedConfig(PretrainedConfig):
    """Shape and form of a folded model.

    `residual` is "normalized" (h = Norm(r h + b Norm(x)) after each sub-layer x: nGPT), "scaled"
    (h = r h + x: anGPT) or "prenorm" (h = r h + x with x = f(RMSNorm(h)): GPT+); `qk_unit` says whether q and k are
    normalised per head, `qk_norm` whether they get a per-head RMSNorm (GPT+); `position_scale` whether attention
    outputs carry a per-position factor (anGPT's nu_att); `softmax_scale` is SDPA's scale (1 where it is folded into
    q's gain); `laurel_rank` and `laurel_pa_depth` are LAUREL's rank and depth (0: that part is off); `arch` only
    records what was exported.
    """

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int = 64,
        intermediate_size: int = 256,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        max_position_embeddings: int = 64,
        rope_theta: float = 10000.0,
        arch: str = "angpt",
        residual: str = "scaled",
        qk_unit: bool = True,
        position_scale: bool = False,
        hidden_act: str = "silu",
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        softmax_scale: float = 1.0,
        laurel_rank: int = 0,
        laurel_pa_depth: int = 0,
        input_norm: str = "none",
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        **kwargs,
    ) -> None:
        if residual not in BLOCKS:
            raise ValueError(f"residual must be one of {sorted(BLOCKS)}, got {residual!r}")
        if input_norm not in INPUT_NORMS:
            raise ValueError(f"input_norm must be one of {sorted(INPUT_NORMS)}, got {input_norm!r}")
        if hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {hidden_act!r}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.arch = arch
        self.residual = residual
        self.qk_unit = bool(qk_unit)
        self.position_scale = bool(position_scale)
        self.hidden_act = hidden_act
        self.qk_norm = bool(qk_norm)
        self.norm_eps = float(norm_eps)
        self.softmax_scale = float(softmax_scale)
        self.laurel_rank = int(laurel_rank)
        self.laurel_pa_depth = int(laurel_pa_depth)
        self.input_norm = input_norm
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """x / ||x|| over the last dim, the sum of squares in fp32 (as angpt's unit_norm)."""
    return x * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True).clamp_min(1e-24)).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [B, H, T, d_h] with cos, sin [B or 1, 1, T, d_h]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, T, d_h] at `position_ids` [B, T]: the same float64 angles as angpt's RoPE buffer, computed
    per call (no non-persistent buffers to restore)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=position_ids.device) / head_dim)
    )
    angles = position_ids.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, d_h]
    return angles.cos().float(), angles.sin().float()


def attention_mask_for(attention_mask, past: int, T: int, device) -> tuple[torch.Tensor | None, bool]:
    """(mask, is_causal) for SDPA over `past` cached and T new positions, from the usual 2D [B, past + T] mask of
    1 (token) / 0 (padding) or a 4D one.

    A boolean mask [B, 1, T, past + T] (True = attend) only where one is needed: with padding, or when the queries
    do not start at key 0 (SDPA's is_causal aligns top-left, we need bottom-right).
    """
    if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2 and bool((attention_mask == 0).any()):
        keys = attention_mask[:, : past + T].bool()
        causal = torch.arange(past + T, device=device)[None] <= torch.arange(past, past + T, device=device)[:, None]
        return causal[None, None] & keys[:, None, None, :], False
    if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 4:
        return (attention_mask.bool() if attention_mask.dtype == torch.bool else attention_mask == 0), False
    if past == 0:
        return None, T > 1
    if T > 1:
        causal = torch.arange(past + T, device=device)[None] <= torch.arange(past, past + T, device=device)[:, None]
        return causal[None, None], False
    return None, False


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}
INPUT_NORMS = ("none", "mlp", "block")


class RMSNorm(nn.Module):
    """RMSNorm with a learnable gain, computed in fp32 (as angpt's and Qwen3's)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight.to(x.dtype)


class Laurel(nn.Module):
    """LAUREL's terms in a residual update (folded): B A h + sum_{j=1..min(i,k)} gamma_j * x_{i-j}; stores x_i = h."""

    def __init__(self, config: AngptFoldedConfig, index: int) -> None:
        super().__init__()
        d, r, k = config.hidden_size, config.laurel_rank, config.laurel_pa_depth
        self.index, self.pa = index, k > 0
        self.A = nn.Parameter(torch.zeros(r, d)) if r else None
        self.B = nn.Parameter(torch.zeros(d, r)) if r else None
        n = min(index, k)  # connection i < k has only i earlier states (connection 0 none)
        self.gamma = nn.Parameter(torch.zeros(n, d)) if n else None

    def forward(self, h: torch.Tensor, states: dict) -> torch.Tensor:
        out = 0 if self.A is None else F.linear(F.linear(h, self.A), self.B).to(h.dtype)
        if self.pa:
            states[self.index] = h
        if self.gamma is not None:
            gamma = self.gamma.to(h.dtype)
            out = out + sum(g * states[self.index - j] for j, g in enumerate(gamma, start=1))
        return out


class AngptFoldedBlock(nn.Module):
    """Attention and MLP of a folded block; subclasses say how each sub-layer's output x updates h."""

    def __init__(self, config: AngptFoldedConfig, layer_idx: int) -> None:
        super().__init__()
        d, dff, H = config.hidden_size, config.intermediate_size, config.num_attention_heads
        self.layer_idx, self.n_heads, self.d_ff = layer_idx, H, dff
        self.scale = config.softmax_scale
        self.act = ACTIVATIONS[config.hidden_act]
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * dff, bias=False)  # [u; z]: value branch, then gate
        self.down = nn.Linear(dff, d, bias=False)
        self.q_gain = nn.Parameter(torch.ones(H, 1, d // H)) if config.qk_unit else None
        self.q_norm = RMSNorm(d // H, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d // H, config.norm_eps) if config.qk_norm else None
        self.res_A = nn.Parameter(torch.ones(d))
        self.res_M = nn.Parameter(torch.ones(d))
        laurel = config.laurel_rank or config.laurel_pa_depth
        self.laurel_A = Laurel(config, 2 * layer_idx) if laurel else None
        self.laurel_M = Laurel(config, 2 * layer_idx + 1) if laurel else None

    def _update(self, h, x, res, branch, laurel, states):
        raise NotImplementedError

    def attention(self, x, cos, sin, mask, is_causal, att_scale, cache):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3 * self.n_heads, -1).transpose(1, 2).chunk(3, dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.q_gain is not None:
            q, k = self.q_gain.to(x.dtype) * _unit(q), _unit(k)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale)
        if att_scale is not None:
            o = o * att_scale.to(o.dtype)
        return self.proj(o.transpose(1, 2).reshape(B, T, -1))

    def mlp(self, x):
        u, z = self.up(x).split(self.d_ff, dim=-1)
        return self.down(u * self.act(z))

    def forward(self, h, cos, sin, mask, is_causal, att_scale, cache, states):
        x = self.attention(h, cos, sin, mask, is_causal, att_scale, cache)
        h = self._update(h, x, self.res_A, self.branch_A, self.laurel_A, states)
        return self._update(h, self.mlp(h), self.res_M, self.branch_M, self.laurel_M, states)


class ScaledResidualBlock(AngptFoldedBlock):
    """anGPT: h = r h + x (the branch factor already sits in the sub-layer's output rows), plus LAUREL's terms.
    `input_norm` "mlp" feeds the MLP Norm(h) instead of h, "block" both sub-layers."""

    branch_A = branch_M = None

    def __init__(self, config: AngptFoldedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.norm_attn_input = config.input_norm == "block"
        self.norm_mlp_input = config.input_norm in ("mlp", "block")

    def forward(self, h, cos, sin, mask, is_causal, att_scale, cache, states):
        x = self.attention(_unit(h) if self.norm_attn_input else h, cos, sin, mask, is_causal, att_scale, cache)
        h = self._update(h, x, self.res_A, self.branch_A, self.laurel_A, states)
        x = self.mlp(_unit(h) if self.norm_mlp_input else h)
        return self._update(h, x, self.res_M, self.branch_M, self.laurel_M, states)

    def _update(self, h, x, res, branch, laurel, states):
        out = torch.addcmul(x.to(h.dtype), h, res.to(h.dtype))
        return out if laurel is None else out + laurel(h, states)


class PreNormBlock(ScaledResidualBlock):
    """GPT+ with LAUREL: the scaled update after each sub-layer of RMSNorm(h)."""

    def __init__(self, config: AngptFoldedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)

    def forward(self, h, cos, sin, mask, is_causal, att_scale, cache, states):
        x = self.attention(self.attn_norm(h), cos, sin, mask, is_causal, att_scale, cache)
        h = self._update(h, x, self.res_A, self.branch_A, self.laurel_A, states)
        return self._update(h, self.mlp(self.mlp_norm(h)), self.res_M, self.branch_M, self.laurel_M, states)


class NormalizedResidualBlock(AngptFoldedBlock):
    """nGPT: h = Norm(r h + b Norm(x)), its exact norms kept (no LAUREL)."""

    def __init__(self, config: AngptFoldedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.branch_A = nn.Parameter(torch.ones(config.hidden_size))
        self.branch_M = nn.Parameter(torch.ones(config.hidden_size))

    def _update(self, h, x, res, branch, laurel, states):
        return _unit(torch.addcmul(h * res.to(h.dtype), _unit(x.to(h.dtype)), branch.to(h.dtype)))


BLOCKS = {"scaled": ScaledResidualBlock, "normalized": NormalizedResidualBlock, "prenorm": PreNormBlock}


class CausalLMSeams:
    """What our causal-LM classes share with transformers' conventions: embedding accessors (`embed`, `lm_head`),
    the inputs of a forward (cache, positions, mask, RoPE tables) and its output (kept logits, shifted loss)."""

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def prepare_forward(
        self, input_ids, inputs_embeds, attention_mask, position_ids, past_key_values, use_cache, kwargs
    ):
        """(h, cache or None, position_ids [B, T], (mask, is_causal), (cos, sin)) for one forward.

        The cache comes as `past_key_values` (transformers < 5.24) or as `cache` in `kwargs` (5.24 on; taken out of
        `kwargs` here). `attention_mask` is the usual 2D [B, past + T] mask of 1 (token) / 0 (padding);
        `position_ids` default to past .. past + T - 1; a DynamicCache is made when `use_cache` and none is given.
        """
        cache_kw = kwargs.pop("cache", None)
        if cache_kw is not None and past_key_values is not None and cache_kw is not past_key_values:
            raise ValueError("pass the KV cache as one of `cache` and `past_key_values`, not both")
        past_key_values = cache_kw if cache_kw is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = h.shape[:2]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None and DynamicCache is not None:
            try:
                past_key_values = DynamicCache(config=self.config)
            except TypeError:  # transformers < 4.56: DynamicCache takes no config
                past_key_values = DynamicCache()
        cache = past_key_values if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=h.device)[None]
        if position_ids.max() >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the context length "
                f"{self.config.max_position_embeddings} this model was trained for"
            )
        position_ids = position_ids.expand(B, T) if position_ids.shape[0] == 1 else position_ids
        masks = attention_mask_for(attention_mask, past, T, h.device)
        return h, cache, position_ids, masks, rope_tables(position_ids, self.config.head_dim, self.config.rope_theta)

    @staticmethod
    def output(h, head, logits_to_keep, labels, cache, kwargs) -> CausalLMOutputWithPast:
        """Logits `head(h)` at the kept positions, and the loss against `labels` (`causal_lm_loss`)."""
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep > 0 else h
        else:
            h = h[:, logits_to_keep]
        logits = head(h)
        loss = None
        if labels is not None:
            n_items, shifted = kwargs.get("num_items_in_batch"), kwargs.get("shift_labels")
            loss = causal_lm_loss(logits, labels, num_items_in_batch=n_items, shift_labels=shifted)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})


class AngptFoldedPreTrainedModel(PreTrainedModel):
    config_class = AngptFoldedConfig
    base_model_prefix = "angpt"
    _no_split_modules = ["ScaledResidualBlock", "NormalizedResidualBlock", "PreNormBlock"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        warn_if_untested()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # Exported weights always come with the checkpoint; this only gives fresh models (from_config) sane values.
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, 0.02)
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, 0.02)


class AngptFoldedForCausalLM(CausalLMSeams, AngptFoldedPreTrainedModel, GenerationMixin):
    """Folded nGPT / anGPT (or GPT+ with LAUREL) language model with a Hugging Face `Cache` for `generate`."""

    def __init__(self, config: AngptFoldedConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        block = BLOCKS[config.residual]
        self.blocks = nn.ModuleList(block(config, i) for i in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.final_norm = RMSNorm(config.hidden_size, config.norm_eps) if config.residual == "prenorm" else None
        if config.position_scale:
            # anGPT's per-position attention factor nu_att[t] (a checkpoint tensor, since it may be calibrated)
            self.register_buffer("att_scale", torch.ones(config.max_position_embeddings, 1))
        else:
            self.att_scale = None
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
        """Logits [B, T, V], and the next-token loss when `labels` are given (`causal_lm_loss`: transformers'
        convention, labels shifted here, -100 ignored; `num_items_in_batch` and `shift_labels` are honoured).

        `attention_mask` is the usual 2D [B, past + T] mask of 1 (token) / 0 (padding); `position_ids` default to
        past .. past + T - 1.
        """
        h, cache, position_ids, (mask, is_causal), (cos, sin) = self.prepare_forward(
            input_ids, inputs_embeds, attention_mask, position_ids, past_key_values, use_cache, kwargs
        )
        att_scale = self.att_scale[position_ids][:, None] if self.att_scale is not None else None  # [B, 1, T, 1]
        states: dict = {}  # LAUREL-PA: the input of every residual connection so far, in this forward
        for block in self.blocks:
            h = block(h, cos, sin, mask, is_causal, att_scale, cache, states)
        if self.final_norm is not None:
            h = self.final_norm(h)

        return self.output(h, self.lm_head, logits_to_keep, labels, cache, kwargs)


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Next-token cross-entropy with transformers' conventions (its `ForCausalLMLoss`, which Qwen3 and Llama use).

    `labels` are aligned with the inputs and shifted here: position t is scored against labels[t + 1], the last
    position against nothing; `shift_labels`, when given, are already shifted and used as they are. Labels equal
    to `ignore_index` do not count. The loss is the mean over the counted labels, or, when `num_items_in_batch`
    is given (Trainer does so under gradient accumulation, since this forward takes **kwargs), their sum divided
    by it, so that the micro-batches of one optimizer step add up to the mean over the whole batch.
    """
    logits = logits.float()
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(logits.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), shift_labels.reshape(-1), ignore_index=ignore_index, reduction=reduction
    )
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss
