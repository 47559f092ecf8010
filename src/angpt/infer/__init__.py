"""Inference: sampling with a KV cache (every architecture), batched left-padded generation, streaming text,
and the lm-evaluation-harness adapter (`angpt.infer.harness`, which imports lm_eval; not imported here)."""

from __future__ import annotations

from angpt.infer.generate import (
    IncrementalDecoder,
    generate,
    generate_batch,
    iter_tokens,
    sample_stream,
)

__all__ = ["IncrementalDecoder", "generate", "generate_batch", "iter_tokens", "sample_stream"]
