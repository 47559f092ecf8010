"""TokenFormer's Hugging Face export (the registry entry's `hf_module`): its own transformers class,
`TokenformerForCausalLM` (hf/modeling_tokenformer.py), copied beside the weights with modeling_angpt.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

MODELING_FILES = ("modeling_tokenformer.py", "modeling_angpt.py")  # the class, then the helpers it imports


def register() -> None:
    """Register the TokenFormer classes with AutoConfig / AutoModelForCausalLM (idempotent)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from angpt.hf.modeling_tokenformer import MODEL_TYPE, TokenformerConfig, TokenformerForCausalLM

    AutoConfig.register(MODEL_TYPE, TokenformerConfig, exist_ok=True)
    AutoModelForCausalLM.register(TokenformerConfig, TokenformerForCausalLM, exist_ok=True)


def export_files(model, folder: Path) -> tuple[dict[str, torch.Tensor], object]:
    """The state dict and `TokenformerConfig` of an angpt TokenFormer; copies the modelling files into `folder`.

    Each Pattention's frozen and trainable tokens (a training-time split) are written joined, frozen first.
    """
    from angpt.hf import modeling_tokenformer
    from angpt.models.tokenformer import Pattention

    cfg = model.config
    (n, norm, _), (n_ffn, norm_ffn, _) = cfg.pattention_sizes(ffn=False), cfg.pattention_sizes(ffn=True)
    hf_config = modeling_tokenformer.TokenformerConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        max_position_embeddings=cfg.context_length,
        rope_theta=cfg.rope_theta,
        param_tokens=n,
        ffn_tokens=n_ffn,
        norm_tokens=norm,
        ffn_norm_tokens=norm_ffn,
        pattention=cfg.pattention,
        layer_norm_eps=cfg.norm_eps,
        attention_scale=model.default_softmax_scale(cfg),
        arch=cfg.arch,
    )
    hf_config.architectures = ["TokenformerForCausalLM"]
    stem = Path(MODELING_FILES[0]).stem
    hf_config.auto_map = {
        "AutoConfig": f"{stem}.TokenformerConfig",
        "AutoModelForCausalLM": f"{stem}.TokenformerForCausalLM",
    }
    here = Path(modeling_tokenformer.__file__).parent
    for name in MODELING_FILES:
        shutil.copyfile(here / name, folder / name)
    sd: dict[str, torch.Tensor] = {"embed.weight": model.embed.weight, "lm_head.weight": model.lm_head.weight}
    for name, module in model.named_modules():
        if isinstance(module, Pattention):
            keys, values = module.tokens()
            sd[f"{name}.key_tokens"], sd[f"{name}.value_tokens"] = keys, values
    return sd, hf_config
