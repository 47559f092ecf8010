"""A run's record: what config.json and every checkpoint's state.json keep of a resolved run (train/setup.py's
ResolvedRun.to_dict), and its reading back.

One record a run: its invocation's settings, every train.* value as it used them, its model and what was derived
(the recipe's values and where each came from, the batch geometry). A resume restarts from its settings
(:func:`record_settings`) and is checked once against it (train/resume.py); a study checks it against the model the
same settings make today. Records written before 2026-11-29 kept the run in pieces (a run config as given, a model
config, a compute dtype, a recipe record, and from 2026-11-28 a resolved run beside them): :func:`legacy` turns those
into one record, once, as they are read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from angpt.errors import UserError

# Settings that belong to one invocation, not to a run: a resume does not take them from the run's record.
PER_INVOCATION = ("out", "resume", "train.stop_at", "train.compile", "train.device")
DERIVED = {"lr": "lr_from", "weight_decay": "weight_decay_from", "warmup_steps": "warmup_from"}


def record_settings(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """The settings a resume of a recorded run starts from (`load_run_config`'s base): its arch, preset, data, model
    overrides and train.* values, less the invocation's own, with the values its recipe decided and those it did not
    record left unset (derived again, so that `--train.max_steps` recomputes a recipe's warm-up)."""
    from angpt.train.config import TrainConfig

    known = {f.name for f in fields(TrainConfig)}
    out: list[tuple[str, Any]] = [(k, record.get(k)) for k in ("arch", "preset", "data", "dist", "init_from")]
    out += [(f"model.{k}", v) for k, v in (record.get("model_overrides") or {}).items()]
    for key, value in (record.get("train") or {}).items():
        if key not in known or f"train.{key}" in PER_INVOCATION:
            continue
        if value is not None and not record.get(DERIVED.get(key, "")):
            out.append((f"train.{key}", value))
    return [(k, v) for k, v in out if k not in PER_INVOCATION]


def recipe_settings(path: str | Path | None) -> list[tuple[str, Any]] | None:
    """The settings of a run's config.json given as a recipe (`angpt train --config runs/x/config.json`), as
    :func:`record_settings`; None for any other file (a YAML recipe)."""
    try:
        stored = json.loads(Path(path).read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("run"), dict):
        return None
    return record_settings(from_config_json(stored))


def read_config_json(run_dir: Path) -> dict[str, Any] | None:
    """The record in `run_dir`'s config.json (an older one's turned into one), None where there is none; a one-line
    UserError for one that is not a run's."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        return from_config_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{path} is not a run's config.json ({type(e).__name__}); resume with --config RECIPE") from e


def from_config_json(stored: dict[str, Any]) -> dict[str, Any]:
    """A config.json's record: {"run": record} since 2026-11-29; before, {"run": run config, "model", "recipe"}."""
    run = stored["run"]
    if "model_overrides" in run:
        return run
    return legacy(run, stored.get("model"), stored.get("recipe"))


def read_state_record(state: dict[str, Any], checkpoint: Path | None = None) -> dict[str, Any] | None:
    """The record in a checkpoint's state.json (`state`; the record beside its model config since 2026-11-29; an
    older checkpoint's pieces turned into one); None for a checkpoint of weights only. `checkpoint` is read for the
    rate of a run recorded before its recipe was (its optimizer's schedule holds it)."""
    if "run" in state:
        return {**state["run"], "model": state.get("model_config")}
    if "run_config" not in state:
        return None
    return legacy(state["run_config"], state.get("model_config"), state.get("recipe"), state.get("compute_dtype"),
                  state.get("resolved"), state.get("world_size", 1), checkpoint)  # fmt: skip


def legacy(
    run_config: dict[str, Any],
    model: dict[str, Any] | None,
    recipe: dict[str, Any] | None = None,
    compute_dtype: str | None = None,
    resolved: dict[str, Any] | None = None,
    world_size: int = 1,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """The record of a run written before 2026-11-29, from its pieces: the run config as given, its model config, the
    recipe's fields it took (since 2026-11-26), its compute dtype and, from 2026-11-28, its resolved run. Values it
    derived are filled as it derived them: from its resolved run, else its recipe record, else (a run older than
    both) its rate from its optimizer's schedule (`checkpoint`)."""
    from angpt.models import registry
    from angpt.train.config import TrainConfig, check_batch_geometry

    arch, preset = run_config.get("arch", "angpt"), run_config.get("preset", "demo")
    given = run_config.get("train") or {}
    train = asdict(TrainConfig()) | {k: v for k, v in given.items() if k in {f.name for f in fields(TrainConfig)}}
    recipe, resolved, model = dict(recipe or {}), resolved or {}, dict(model or {})
    today = registry.get(arch).recipe
    words = {}
    for key in ("lr", "weight_decay"):
        words[key] = "" if train[key] is not None else f" (the {arch} recipe's when the run started; train.{key} unset)"
        if train[key] is None:
            train[key] = recipe.get(key, resolved.get(key))
    optimizer = recipe.get("optimizer") or resolved.get("optimizer") or today.optimizer
    if optimizer == "adam":
        train["weight_decay"], words["weight_decay"] = 0.0, f" (the {arch} recipe's Adam decays nothing)"
    if train["lr"] is None and checkpoint is not None:  # older than the recipe record: the schedule knows the rate
        train["lr"], words["lr"] = _scheduled_rate(checkpoint), " (its optimizer's schedule)"
    words["warmup_steps"] = ""
    if train["warmup_steps"] is None:
        fraction = recipe.get("warmup_fraction", today.warmup_fraction)
        cap = recipe.get("warmup_cap", today.warmup_cap)
        words["warmup_steps"] = f" ({fraction:.0%} of the run, at most {cap} steps: the {arch} recipe's)"
        schedule = replace(today, warmup_fraction=fraction, warmup_cap=cap)
        train["warmup_steps"] = resolved.get("warmup_steps", schedule.warmup_steps(train["max_steps"]))
    train["seq_len"] = train["seq_len"] or resolved.get("seq_len") or model.get("context_length")
    train["dtype"] = compute_dtype or resolved.get("dtype") or train["dtype"]
    if train["dtype"] == "auto":  # what auto gave was not recorded: not compared, resolved again on resume
        train["dtype"] = None
    train["compile"] = resolved.get("compile", train["compile"])
    try:
        accum = resolved.get("accum") or check_batch_geometry(train["batch_tokens"], train["seq_len"],
                                                              train["micro_batch"], world_size)  # fmt: skip
    except (UserError, TypeError):
        accum = None
    return {
        "arch": arch,
        "preset": preset,
        "data": run_config.get("data"),
        "dist": run_config.get("dist", "ddp"),
        "init_from": run_config.get("init_from"),
        "model": model,
        "model_overrides": dict(run_config.get("model") or {}),
        "model_from": "",
        "train": train,
        "lr_from": words["lr"],
        "weight_decay_from": words["weight_decay"],
        "warmup_from": words["warmup_steps"],
        "optimizer": optimizer,
        "recipe": recipe,
        "accum": accum,
        "world_size": resolved.get("world_size", world_size),
    }


def _scheduled_rate(checkpoint: Path) -> float | None:
    """The peak rate in a checkpoint's optimizer schedule (its trainer state), None where it cannot be read."""
    from angpt import checkpoint as ckpt

    try:
        trainer = ckpt.load_trainer_state(checkpoint)
    except Exception:  # noqa: BLE001 - no rate: the check then compares none
        return None
    return ((trainer or {}).get("scheduler") or {}).get("base_lrs", [None])[0]
