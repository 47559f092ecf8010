"""Whether a checkpoint may be resumed under the requested run config, and what changes on the way.

Identical settings continue. A longer (or shorter) `max_steps` is well defined and applies: the LR schedule is
recomputed for the new length from the current step on (a WSD run resumed from its stable phase with a shorter
`max_steps` is a branch: it decays to the new end). Settings that only steer logging, evaluation,
checkpointing or the process (`eval_every`, `device`, `compile`, ...) apply freely. Everything that shapes the
optimisation or the data the run sees (learning rate, warm-up, betas, batch geometry, seed, dtype, model, data,
tokenizer) refuses with a one-line error naming the field: resuming under it would silently make a different run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from angpt.checkpoint import RunState
from angpt.errors import UserError
from angpt.models import ModelConfig, registry
from angpt.train.config import RunConfig, resolve_model_config, run_config_from_dict

# train.* fields that change how the optimisation goes or which tokens are seen: fixed for the life of a run.
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


def recipe_difference(saved: Any, arch: str, preset: str, train: Any, recipe: Any) -> str | None:
    """How the recipe fields a run recorded (`saved`, None for runs that predate the record) differ from those the
    same settings take today (`recipe`: the architecture's Recipe), as `the ARCH recipe's KEY=WAS (now NOW)`; None
    when they agree or nothing was recorded."""
    if not isinstance(saved, dict):
        return None
    now = recipe.used(preset, train)
    keys = [k for k in saved if k in now and saved[k] != now[k]]
    return ", ".join(f"the {arch} recipe's {k}={saved[k]!r} (now {now[k]!r})" for k in keys) or None


def recipe_value(
    key: str, value: Any, arch: str, preset: str, recipe: Any, recorded: dict[str, Any] | None = None
) -> tuple[Any, str]:
    """(the value a run uses, how it got it): an unset lr or weight decay is the architecture's `recipe`'s at `preset`,
    as the run recorded it (`recorded`) or, for runs that predate the record, as it is today. The one place a run's
    rate is looked up: train/setup.py's resolve and check_resume (what a resumed run trained with) both ask it."""
    if value is None and key in ("lr", "weight_decay"):
        if recorded and key in recorded:
            return recorded[key], f" (the {arch} recipe's when the run started; train.{key} unset)"
        return recipe.default(key, preset), f" (the {arch} recipe's at {preset}; train.{key} unset)"
    return value, ""


# The fields of a resolved run (train/setup.py's ResolvedRun) that a resume must keep: what the optimisation and the
# data stream are. max_steps may change (the schedule is recomputed), and so may what only steers the process.
RESOLVED_FIXED = (
    "arch",
    "model",
    "optimizer",
    "betas",
    "dtype",
    *(k for k in FIXED_TRAIN if k not in ("beta1", "beta2")),
)


def check_resolved(path: Any, recorded: dict[str, Any], run: Any) -> None:
    """Raise UserError when the run a checkpoint recorded as resolved (`recorded`, ResolvedRun.to_dict(), since
    2026-11-28) differs from the run now resolved (`run`) in a field the optimisation depends on; a warm-up that a
    changed max_steps moves (the recipe's fraction of the run) is the one change allowed."""
    now = run.to_dict()
    recorded = {**recorded, "model": _resolved(recorded.get("model"))}  # model fields added since: their defaults
    for key in RESOLVED_FIXED:
        if key not in recorded or recorded[key] == now[key]:
            continue
        if key == "warmup_steps" and now["warmup_from"] and recorded.get("max_steps") != now["max_steps"]:
            continue  # the recipe's fraction of a longer (or shorter) run: as the schedule, recomputed
        was, got = recorded[key], now[key]
        if key == "model":
            diff = [k for k in got if was.get(k) != got[k]]
            was, got = {k: was.get(k) for k in diff[:3]}, {k: got[k] for k in diff[:3]}
        flag = {"betas": "train.beta1 / train.beta2", "model": "model.*", "arch": "--arch", "optimizer": None}.get(
            key, f"train.{key}"
        )
        words = now.get(f"{key}_from", "") if key in ("lr", "weight_decay", "warmup_steps") else ""
        fix = (
            f"pass --{flag} {was}"
            if flag and flag.startswith("train.") and key != "betas"
            else "give the run's own settings"
        )
        raise UserError(
            f"cannot resume {path} with {key}={got!r}{words}: the run was trained with {was!r}; {fix} to resume it as "
            "it was trained, or start a new run (--out)"
        )


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


def check_resume(
    path: Any,
    state: RunState,
    cfg: RunConfig,
    mcfg: ModelConfig,
    data_identity: dict[str, Any] | None,
    dtype: str | None = None,
    *,
    recipe: Any,
) -> list[str]:
    """Raise UserError when checkpoint `path` (its `state`) cannot be resumed as `cfg`, computing in `dtype` (the
    resolved compute dtype), under its architecture's optimizer `recipe` (the registry entry's, as train/setup.py
    read it); else the changes applied."""
    saved = state.run_config or {}
    saved_train = saved.get("train") or {}
    if (difference := model_difference(state.model_config, mcfg)) is not None:
        raise UserError(
            f"checkpoint {path} was trained with a different model config ({difference}); "
            "resume with the run's --arch, --preset and model settings, or use a new --out"
        )
    # The compute dtype is compared as resolved (`auto` differs between machines) where the checkpoint records it;
    # older checkpoints compare the requested setting.
    recorded_dtype = state.compute_dtype if dtype is not None else None
    arch, preset = saved.get("arch", cfg.arch), saved.get("preset", cfg.preset)  # the same arch: the model agrees
    kept = state.recipe  # the recipe values the run recorded (None for runs before the record)
    for key in FIXED_TRAIN if recorded_dtype is not None else (*FIXED_TRAIN, "dtype"):
        if key not in saved_train:
            continue
        if key == "lr" and saved_train[key] is None and "lr" not in (kept or {}):
            continue  # a run older than the recipe record: its scheduler state has the rate (check_resumed_rate)
        was = recipe_value(key, saved_train[key], arch, preset, recipe, kept)
        now = recipe_value(key, getattr(cfg.train, key), cfg.arch, cfg.preset, recipe)  # as this run would train
        if was[0] != now[0]:
            same = f"pass --train.{key} {was[0]}" if was[0] is not None else "resume without changing it"
            raise UserError(
                f"cannot resume {path} with train.{key}={now[0]!r}{now[1]}: the run was trained with {was[0]!r}"
                f"{was[1]}; {same} to resume it as it was trained, or start a new run (--out)"
            )
    # What the loop cannot see: the optimizer, and the warm-up's fraction and cap where train.warmup_steps stays unset
    # (a changed unset rate or weight decay has stopped above, with its own message).
    if (difference := recipe_difference(kept, arch, preset, cfg.train, recipe)) is not None:
        raise UserError(
            f"cannot resume {path}: {difference} since the run started; set the run's value (train.*) to "
            "resume it as it was trained, or start a new run (--out)"
        )
    if recorded_dtype is not None and recorded_dtype != dtype:
        raise UserError(
            f"cannot resume {path} computing in {dtype} (train.dtype={cfg.train.dtype}): the run was trained in "
            f"{recorded_dtype}; resume with --train.dtype {recorded_dtype} (or auto), or start a new run (--out)"
        )
    recorded = state.data_identity
    if recorded and data_identity:
        if recorded.get("tokenizer_hash") != data_identity.get("tokenizer_hash"):
            raise UserError(
                f"cannot resume {path} on {cfg.data}: its tokenizer differs from the one the run was trained with "
                "(the token ids would mean other text)"
            )
        if recorded.get("data_fingerprint") != data_identity.get("data_fingerprint"):
            raise UserError(
                f"cannot resume {path} on {cfg.data}: the token data differs from the data the run was trained on; "
                "resume on the same prepared folder, or start a new run"
            )
    notes = []
    old_steps = saved_train.get("max_steps")
    if old_steps is not None and old_steps != cfg.train.max_steps:
        if cfg.train.max_steps < state.step:
            raise UserError(
                f"cannot resume {path} at step {state.step} with train.max_steps={cfg.train.max_steps}: "
                "the run is already past it"
            )
        notes.append(
            f"train.max_steps {old_steps} -> {cfg.train.max_steps}: the {cfg.train.schedule} schedule is recomputed "
            "for the new length from here on"
        )
    return notes


def check_resumed_rate(path: str | Path, scheduler_state: dict[str, Any], run: Any) -> None:
    """Raise UserError when the peak rate in checkpoint `path`'s scheduler state differs from the one `run` (the
    resolved run, train/setup.py) trains at. Loading that state restores its rate, so a run that predates the recipe
    record (check_resume falls back to today's recipe there) would otherwise go on at its old rate while this run
    records the new one."""
    was = (scheduler_state.get("base_lrs") or [None])[0]
    if was is None or math.isclose(was, run.lr, rel_tol=1e-9):
        return
    raise UserError(
        f"cannot resume {path} with train.lr={run.lr!r}{run.lr_from}: the run was trained with {was!r} (its "
        f"optimizer's schedule); pass --train.lr {was} to resume it as it was trained, or start a new run (--out)"
    )


def model_drift(run_dir: str | Path, data_meta: dict[str, Any]) -> str | None:
    """How the model a run directory was trained with (its config.json) differs from the one its own recorded run
    config makes today on a dataset with `data_meta`, as `model.KEY=WAS (now NOW)`; None when they agree, when nothing
    was trained there yet, when config.json cannot be read (resuming such a run meets check_resume instead), and for
    runs started from other weights (`init_from`: their model is the checkpoint's).

    A model default changed since the run (in the registry or a preset) is the usual cause: the same arm name and
    settings now make another model, so a finished run must not be reported, or a sweep extended, as today's.
    The optimizer recipe's fields the run took (its rate where train.lr was unset, its weight decay, warm-up and
    optimizer) are compared too where config.json recorded them (`recipe`, since 2026-11-26)."""
    path = Path(run_dir) / "config.json"
    try:
        stored = json.loads(path.read_text())
        cfg = run_config_from_dict(stored["run"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if cfg.init_from:
        return None
    try:
        now = resolve_model_config(cfg, data_meta)
    except UserError as e:
        return f"settings this angpt no longer builds ({e})"
    return model_difference(stored.get("model"), now) or recipe_difference(
        stored.get("recipe"), cfg.arch, cfg.preset, cfg.train, registry.get(cfg.arch).recipe
    )
