"""angpt: the Approximately Normalized Transformer (anGPT), nGPT, GPT+ and TokenFormer, with tools to train, compare
and ship them.

>>> import angpt
>>> model = angpt.build_model("angpt", "tiny")
>>> optimizer, scheduler = angpt.make_optimizer(model, lr=4e-3, max_steps=100)

The names below load on first use: `import angpt` (or `import angpt.data`) imports no model or training code, and
heavy dependencies (transformers, datasets, matplotlib) are imported only by the functions that need them.
"""

from __future__ import annotations

from angpt.lazy import lazy_names

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        (
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
        ),
        "angpt.models",
    ),
    "make_optimizer": "angpt.train.optim",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names("angpt", _EXPORTS, globals())
