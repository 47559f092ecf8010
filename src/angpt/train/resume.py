"""Whether a checkpoint may be resumed under the requested run config, and what changes on the way.

Identical settings continue. A longer (or shorter) `max_steps` is well defined and applies: the LR schedule is
recomputed for the new length from the current step on (a WSD run resumed from its stable phase with a shorter
`max_steps` is a branch: it decays to the new end). Settings that only steer logging, evaluation,
checkpointing or the process (`eval_every`, `device`, `compile`, ...) apply freely. Everything that shapes the
optimisation or the data the run sees (learning rate, warm-up, betas, batch geometry, seed, dtype, model, data,
tokenizer) refuses with a one-line error naming the field: resuming under it would silently make a different run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from angpt.checkpoint import RunState
from angpt.errors import UserError
from angpt.models import ModelConfig, registry
from angpt.train.config import load_run_config, resolve_model_config
from angpt.train.record import DERIVED

# train.* fields that change how the optimisation goes or which tokens are seen, and the dtype it computes in: fixed
# for the life of a run.
FIXED_TRAIN = (
    "lr",
    "weight_decay",
    "warmup_steps",
    "min_lr_ratio",
    "schedule",
    "decay_fraction",
    "decay_shape",
    "beta1",
    "beta2",
    "grad_clip",
    "batch_tokens",
    "micro_batch",
    "seq_len",
    "seed",
    "dtype",
)


def _resolved(saved: Any) -> Any:
    """A saved model config with the defaults of fields added since it was written (they did not exist, so the
    run had them off); unreadable ones come back as they are and compare unequal."""
    if not isinstance(saved, dict):
        return saved
    try:
        return ModelConfig.from_dict(saved).to_dict()
    except (ValueError, TypeError):
        return saved


def recipe_difference(recorded: Any, arch: str, preset: str, recipe: Any) -> str | None:
    """How the recipe fields a run recorded (`recorded`: the values it took from its architecture's recipe, None for
    runs that predate the record) differ from what `recipe` (today's) gives them, as `the ARCH recipe's KEY=WAS (now
    NOW)`; None when they agree or nothing was recorded."""
    if not isinstance(recorded, dict):
        return None
    now = {k: recipe.default(k, preset) if k in ("lr", "weight_decay") else getattr(recipe, k, None) for k in recorded}
    keys = [k for k in recorded if recorded[k] != now[k]]
    return ", ".join(f"the {arch} recipe's {k}={recorded[k]!r} (now {now[k]!r})" for k in keys) or None


def model_difference(saved: Any, mcfg: ModelConfig) -> str | None:
    """How a saved model config (fields added since it was written take their defaults) differs from `mcfg`: the
    fields as `model.KEY=WAS (now NOW)`, at most four; None when they agree."""
    saved = _resolved(saved)
    if saved == mcfg.to_dict():
        return None
    if not isinstance(saved, dict):
        return "the checkpoint's model config is unreadable"
    now = mcfg.to_dict()
    keys = [k for k in now if saved.get(k) != now[k]] + [k for k in saved if k not in now]
    shown = [f"{'arch' if k == 'arch' else 'model.' + k}={saved.get(k)!r} (now {now.get(k)!r})" for k in keys[:4]]
    return ", ".join(shown) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _source(recorded: dict[str, Any], key: str) -> str:
    """Where the run's recorded value of train.`key` came from, in its words: the recipe's when it started, or as
    the record says (a very old run's rate: its optimizer's schedule); "" where train.* gave it."""
    words = recorded.get(DERIVED.get(key, "")) or ""
    if words and key in (recorded.get("recipe") or {}):
        return f" (the {recorded['arch']} recipe's when the run started; train.{key} unset)"
    return words


def check_resume(path: Any, recorded: dict[str, Any], run: Any, state: RunState) -> list[str]:
    """The one check of a resume: the run checkpoint `path` recorded (`recorded`, train/record.py: read once, an
    older checkpoint's turned into one) against the run resolved now (`run`, train/setup.py's ResolvedRun). A field
    the optimisation or the data stream depends on that differs is a one-line UserError naming it and the value to
    pass; a longer (or shorter) max_steps applies, its schedule recomputed, and comes back as a note."""
    if (difference := model_difference(recorded.get("model"), run.model)) is not None:
        raise UserError(
            f"checkpoint {path} was trained with a different model config ({difference}); "
            "resume with the run's --arch, --preset and model settings, or use a new --out"
        )
    # The recipe's optimizer and warm-up rule as the run took them (its rate and decay are compared as values below).
    took = {k: v for k, v in (recorded.get("recipe") or {}).items() if k not in ("lr", "weight_decay")}
    took = {k: v for k, v in took.items() if run.warmup_from or not k.startswith("warmup")}
    if (difference := recipe_difference(took, run.arch, run.preset, run.spec.recipe)) is not None:
        raise UserError(
            f"cannot resume {path}: {difference} since the run started; set the run's value (train.*) to resume it "
            "as it was trained, or start a new run (--out)"
        )
    was, now = recorded.get("train") or {}, run.train
    for key in FIXED_TRAIN:
        if was.get(key) is None or was[key] == getattr(now, key):
            continue
        if key == "warmup_steps" and run.warmup_from and was.get("max_steps") != now.max_steps:
            continue  # the recipe's fraction of a longer (or shorter) run: as the schedule, recomputed
        if key == "dtype":
            raise UserError(
                f"cannot resume {path} computing in {now.dtype}: the run was trained in {was['dtype']}; resume "
                f"with --train.dtype {was['dtype']} (or auto), or start a new run (--out)"
            )
        raise UserError(
            f"cannot resume {path} with train.{key}={getattr(now, key)!r}{getattr(run, DERIVED.get(key, ''), '')}: "
            f"the run was trained with {was[key]!r}{_source(recorded, key)}; pass --train.{key} {was[key]} to resume "
            "it as it was trained, or start a new run (--out)"
        )
    if state.data_identity and run.data_identity:
        if state.data_identity.get("tokenizer_hash") != run.data_identity.get("tokenizer_hash"):
            raise UserError(
                f"cannot resume {path} on {run.data}: its tokenizer differs from the one the run was trained with "
                "(the token ids would mean other text)"
            )
        if state.data_identity.get("data_fingerprint") != run.data_identity.get("data_fingerprint"):
            raise UserError(
                f"cannot resume {path} on {run.data}: the token data differs from the data the run was trained on; "
                "resume on the same prepared folder, or start a new run"
            )
    old_steps = was.get("max_steps")
    if old_steps is None or old_steps == now.max_steps:
        return []
    if now.max_steps < state.step:
        raise UserError(
            f"cannot resume {path} at step {state.step} with train.max_steps={now.max_steps}: the run is already "
            "past it"
        )
    return [f"train.max_steps {old_steps} -> {now.max_steps}: the {now.schedule} schedule is recomputed for the new "
            "length from here on"]  # fmt: skip


def model_drift(run_dir: str | Path, data_meta: dict[str, Any]) -> str | None:
    """How the model a run directory was trained with (its config.json's record) differs from the one its own
    recorded settings make today on a dataset with `data_meta`, as `model.KEY=WAS (now NOW)`; None when they agree,
    when nothing was trained there yet, when config.json cannot be read (resuming such a run meets check_resume
    instead), and for runs started from other weights (`init_from`: their model is the checkpoint's).

    A model default changed since the run (in the registry or a preset) is the usual cause: the same arm name and
    settings now make another model, so a finished run must not be reported, or a sweep extended, as today's. The
    optimizer recipe's fields the run took (its rate where train.lr was unset, its weight decay, warm-up and
    optimizer) are compared too where the record has them (since 2026-11-26)."""
    from angpt.train.record import read_config_json, record_settings

    try:
        recorded = read_config_json(Path(run_dir))
    except UserError:
        return None
    if recorded is None or recorded.get("init_from"):
        return None
    try:
        cfg = load_run_config(None, record_settings(recorded))
        now = resolve_model_config(cfg, data_meta)
    except UserError as e:
        return f"settings this angpt no longer builds ({e})"
    recipe = registry.get(cfg.arch).recipe
    return model_difference(recorded.get("model"), now) or recipe_difference(
        recorded.get("recipe"), cfg.arch, cfg.preset, recipe
    )
