"""The architectures, their configs and presets, constants, constraints and inference folding."""

from __future__ import annotations

import torch
from torch import nn

from angpt.models import registry
from angpt.models.angpt import ANGPT, calibrate_nu_att
from angpt.models.base import LanguageModel, recording
from angpt.models.config import PRESETS, ModelConfig
from angpt.models.constants import angpt_constants
from angpt.models.constraints import apply_constraints, attach_constraints, unwrap
from angpt.models.folded import FoldedLM
from angpt.models.gpt import GPT
from angpt.models.layers import KVCache
from angpt.models.ngpt import NGPT
from angpt.models.registry import (
    ARCHS,
    build_model,
    describe_constants,
    fold_for_inference,
    grow,
    make_config,
    model_from_config,
)
from angpt.models.tokenformer import TokenFormer


@torch.no_grad()
def inspect_norms(model: nn.Module, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean L2 norms of each block's intermediate quantities on `input_ids`.

    Keys are "layer{i}.{name}" with name in q, k, v, attn_out (per head: a tensor [H]) and h_A, h_M, h (the
    residual stream after the block): scalars. anGPT records the quantities the paper normalises (q, k, v are
    nu_qkv W h, before the exact QK-norm). The same forward's logits give "head.max_logit", the largest |logit|
    (a scalar): a blow-up can sit there while every residual norm stays near 1.
    """
    base = unwrap(model)
    out: dict[str, torch.Tensor] = {}

    def make_recorder(layer: int):
        def recorder(name: str, x: torch.Tensor) -> None:
            norms = torch.linalg.vector_norm(x.float(), dim=-1)
            # [B, H, T] -> per head; [B, T] -> scalar
            out[f"layer{layer}.{name}"] = norms.mean((0, 2)) if norms.ndim == 3 else norms.mean()

        return recorder

    with recording(base.blocks, make_recorder):
        logits, _ = base(input_ids)
    out["head.max_logit"] = torch.maximum(logits.amax(), -logits.amin()).float()  # no [B, T, V] copy for abs
    return out


__all__ = [
    "ANGPT",
    "ARCHS",
    "FoldedLM",
    "GPT",
    "KVCache",
    "LanguageModel",
    "ModelConfig",
    "NGPT",
    "PRESETS",
    "TokenFormer",
    "angpt_constants",
    "apply_constraints",
    "attach_constraints",
    "build_model",
    "calibrate_nu_att",
    "describe_constants",
    "fold_for_inference",
    "grow",
    "inspect_norms",
    "make_config",
    "model_from_config",
    "registry",
    "unwrap",
]
