"""What every language model here shares: embedding, block loop, KV cache, loss, norm recording."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from angpt.models.config import ModelConfig
from angpt.models.layers import KVCache, RoPE, cross_entropy, row_positions, scaled_linear, softmax_scale
from angpt.models.loss import linear_cross_entropy

Recorder = Callable[[str, torch.Tensor], None]


@dataclass
class Context:
    """Per-forward state the blocks share: positions start at `start`; `cache` is the KV cache or None."""

    rope: RoPE
    start: int
    cache: KVCache | None
    att_scale: torch.Tensor | None = None  # anGPT's per-position attention factor, [T_max, 1]
    offsets: torch.Tensor | None = None  # [B] left padding per row (from the cache): positions shift back by it
    states: dict[int, torch.Tensor] = field(default_factory=dict)  # LAUREL-PA: residual connection i -> its input

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """RoPE at this forward's positions."""
        return self.rope(x, self.start, self.offsets)

    def att_factor(self, T: int) -> torch.Tensor:
        """att_scale at this forward's T positions: [T, 1], or [B, 1, T, 1] for a left-padded batch."""
        if self.offsets is None:
            return self.att_scale[self.start : self.start + T]
        return self.att_scale[row_positions(self.offsets, self.start, T)][:, None]


class Block(nn.Module):
    """A Transformer block; `recorder`, when set by `inspect_norms`, receives named intermediate tensors."""

    recorder: Recorder | None = None
    layer: int = 0

    def record(self, **tensors: torch.Tensor) -> None:
        if self.recorder is not None:
            for name, x in tensors.items():
                self.recorder(name, x)


_UNSET = object()


@contextlib.contextmanager
def recording(blocks: Sequence[Block], recorder_of: Callable[[int], Recorder]) -> Iterator[None]:
    """Block i's `recorder` is `recorder_of(i)` inside the with-body; afterwards each block is as it was (the
    attribute deleted again where the block had none of its own). Setting it back to None instead would leave
    `recorder` in the instance's dict, which a compiled forward's guards check: the next training step would
    compile the model again (seen after the first step of a compiled deviation screen, 2026-11-27)."""
    before = [b.__dict__.get("recorder", _UNSET) for b in blocks]
    for i, b in enumerate(blocks):
        b.recorder = recorder_of(i)
    try:
        yield
    finally:
        for b, old in zip(blocks, before):
            if old is _UNSET:
                del b.recorder
            else:
                b.recorder = old


class LanguageModel(nn.Module):
    """Token embedding -> blocks -> logits. Subclasses build `blocks` and implement `logits(h)`.

    Class attributes state what follows from the equations: `unit_qk` (q and k have unit norm, so the default
    softmax scale is sqrt(d_h) rather than 1/sqrt(d_h)), `weight_constraint`, the row constraint after every
    optimizer step unless the config names another, and `controls`, the control options it implements. Under bf16
    autocast the residual stream keeps the parameters' dtype (fp32) and each block casts its branch outputs to it
    explicitly (CPU and CUDA autocast differ in how they promote mixed operands).
    """

    blocks: nn.ModuleList
    unit_qk: bool = False
    weight_constraint: str = "none"
    controls: frozenset[str] = frozenset()  # the control options (config.CONTROLS) this model implements
    checkpoint_blocks: bool = False  # recompute each block in backward (set by train.dist.parallelize)
    fused_loss: bool = False  # forward(x, targets) -> (None, loss) without the full logits (set by training)

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        """Raise a one-line ConfigError for option combinations this model cannot build (none by default)."""

    @classmethod
    def default_softmax_scale(cls, cfg: ModelConfig) -> float:
        return softmax_scale(cfg, cls.unit_qk)

    @classmethod
    def constraint_of(cls, cfg: ModelConfig) -> str:
        """The row constraint of `cfg`: its own `weight_constraint`, or the architecture's for "auto"."""
        return cls.weight_constraint if cfg.weight_constraint == "auto" else cfg.weight_constraint

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.check_config(config)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.rope = RoPE(config.head_dim, config.context_length, config.rope_theta)

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The LM head as (x, W, scale): logits = scale * (x W^T), scale None or a [V] vector."""
        raise NotImplementedError

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        x, weight, scale = self.head(h)
        return scaled_linear(x, weight, scale) if scale is not None else F.linear(x, weight)

    def hidden(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final hidden states [B, T, d] (before the LM head); advances the cache by T."""
        T = input_ids.shape[1]
        start = cache.pos if cache is not None else 0
        offsets = cache.offsets if cache is not None else None
        end = start + T - (int(offsets.min()) if offsets is not None else 0)  # the longest row's real length
        if end > self.config.context_length:
            raise ValueError(f"sequence of {end} tokens exceeds the context length {self.config.context_length}")
        ctx = Context(self.rope, start, cache, getattr(self, "att_scale", None), offsets)
        h = self.embed(input_ids)
        recompute = self.checkpoint_blocks and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            h = checkpoint(block, h, ctx, use_reentrant=False) if recompute else block(h, ctx)
        if cache is not None:
            cache.pos += T
        return h

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return (logits [B, T, V], mean cross-entropy against `targets` or None); with `fused_loss` set and targets
        given, (None, loss), the loss computed chunk by chunk without the logits (models/loss.py)."""
        h = self.hidden(input_ids, cache)
        if self.fused_loss and targets is not None:
            x, weight, scale = self.head(h)
            return None, linear_cross_entropy(x, weight, targets, scale)
        logits = self.logits(h)
        loss = cross_entropy(logits, targets) if targets is not None else None
        return logits, loss

    def make_cache(self, batch: int, max_len: int | None = None, dtype=None) -> KVCache:
        """An empty KV cache for `batch` sequences of up to `max_len` tokens."""
        c = self.config
        p = next(self.parameters())
        return KVCache(
            c.n_layers, batch, c.n_heads, max_len or c.context_length, c.head_dim, p.device, dtype or p.dtype
        )

    def num_params(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if embeddings else n - self.embed.weight.numel()

    def constraint_groups(self) -> dict[str, list[tuple[torch.Tensor, int]]]:
        """Matrices to constrain after each step: {"unit"|"bounded": [(weight, dim), ...]} (none for GPT)."""
        return {}

    def matrices(self) -> list[nn.Parameter]:
        """All weight matrices (embedding and LM head included): the ones that get weight decay in GPT+."""
        return [p for p in self.parameters() if p.ndim >= 2]

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token at sequence length T: 6 N + 12 L T d (PaLM, arXiv 2204.02311, Appendix B).

        N counts the weights that multiply activations: every matrix but the embedding table (a lookup), so the
        untied LM head is in. One multiply-add per weight is 2 N in the forward and 4 N in the backward: 6 N.
        Attention adds, per layer and token, 2 T d for the scores Q K^T and 2 T d for the weighted sum of V in the
        forward, three times that with the backward: 12 L T d. As PaLM does, this counts the full T x T score
        matrix; a causal kernel skips the masked half (the useful work is 6 L T d), so MFU by this count is the
        published convention's. Norms, activations, RoPE and the softmax are not counted.
        """
        c = self.config
        T = seq_len or c.context_length
        n = sum(p.numel() for p in self.matrices()) - self.embed.weight.numel()
        return 6.0 * n + 12.0 * c.n_layers * T * c.d_model
