"""`angpt grow`: a trained checkpoint grown into a larger model with the same logits (TokenFormer's progressive
scaling, docs/architectures.md#progressive-growth), written as a weights-only checkpoint folder that
`angpt train --init_from OUT` continues from."""

from __future__ import annotations

from pathlib import Path

import torch

from angpt import checkpoint as ckpt
from angpt.errors import ConfigError, UserError
from angpt.models import registry


def grow_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    add_tokens: int,
    add_ffn_tokens: int | None = None,
    *,
    freeze_old: bool = False,
    seed: int = 0,
) -> Path:
    """Grow the model of `checkpoint` (a checkpoint folder, or a run folder: its latest checkpoint) by `add_tokens`
    parameter tokens per attention Pattention and `add_ffn_tokens` per FFN Pattention (default: proportionally),
    and write it to the new folder `out`; returns `out`.

    New values are drawn with torch seed `seed`. `out` holds model.safetensors, state.json (the grown config, the
    source's path, step, tokens and weight checksum, the growth arguments) and the source's tokenizer files, each
    with its sha256. Bad input (a count that is not positive, an existing `out`, a missing or damaged checkpoint, an
    architecture that cannot grow) is a one-line UserError, and nothing is written.
    """
    for name, value in (("--add-tokens", add_tokens), ("--add-ffn-tokens", add_ffn_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise UserError(f"{name} {value!r} must be a positive integer (the parameter tokens to append)")
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise UserError(f"{out} already exists; growing writes a new checkpoint folder, so choose a new path")
    source = Path(checkpoint)
    if source.is_dir() and not (source / ckpt.STATE_FILE).is_file() and ckpt.list_checkpoints(source):
        source = ckpt.list_checkpoints(source)[-1]  # a run folder: its latest checkpoint
    model, _ = ckpt.load_checkpoint_model(source)  # checks the folder, the checksums and the weights
    torch.manual_seed(seed)
    try:
        grown = registry.grow(model, add_tokens, add_ffn_tokens, freeze_old=freeze_old)
    except ConfigError as e:
        raise UserError(f"{source}: {e}") from None
    saved = ckpt.read_state(source)
    state = {
        "model_config": grown.config.to_dict(),
        "imported_from": str(source),  # weights only: `--init_from OUT` starts a run from it, `--resume` refuses
        "tokens": 0,
        "grown_from": {
            "checkpoint": str(source.resolve()),
            "model_sha256": saved.get("files", {}).get(ckpt.MODEL_FILE),
            "step": saved.get("step"),
            "tokens": saved.get("tokens"),
            "params": model.num_params(),
            "add_tokens": add_tokens,
            "add_ffn_tokens": grown.config.ffn_dim - model.config.ffn_dim,
            "freeze_old": freeze_old,
            "seed": seed,
        },
        "params": grown.num_params(),
    }
    return ckpt.save_weights_checkpoint(out, grown.state_dict(), state, tokenizer_dir=source)
