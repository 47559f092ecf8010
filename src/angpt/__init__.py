"""angpt: the Approximately Normalized Transformer (anGPT), nGPT, GPT+ and TokenFormer, with tools to train, compare
and ship them.

>>> import angpt
>>> model = angpt.build_model("angpt", "tiny")
>>> optimizer, scheduler = angpt.make_optimizer(model, lr=4e-3, max_steps=100)

Heavy dependencies (transformers, datasets, matplotlib) are imported only by the functions that need them.
"""

from __future__ import annotations

from angpt.models import (
    ARCHS,
    PRESETS,
    KVCache,
    ModelConfig,
    attach_constraints,
    build_model,
    describe_constants,
    fold_for_inference,
    grow,
    inspect_norms,
    make_config,
)
from angpt.train.optim import make_optimizer

__version__ = "0.1.0"

__all__ = [
    "ARCHS",
    "PRESETS",
    "KVCache",
    "ModelConfig",
    "attach_constraints",
    "build_model",
    "describe_constants",
    "fold_for_inference",
    "grow",
    "inspect_norms",
    "make_config",
    "make_optimizer",
]
