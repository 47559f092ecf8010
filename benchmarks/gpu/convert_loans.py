"""One-off (issue 53): the race runs of the committed loans into the study engine's store, once.

    python benchmarks/gpu/convert_loans.py        # writes benchmarks/gpu-race/store from benchmarks/gpu-race/*/

Only the 2026-11-28 H200 loan ran race runs (its seven tuning runs); the 2026-11-27 loan measured step times only.
Each run becomes a store run as `angpt compare` writes one (result.json, metrics.jsonl with its curve: the training
loss and pre-clip gradient norm every 10 steps, the validation loss at every evaluation, validation and test at the
end); the store's plan is loan.race_plan's on a stand-in of the loan's data (its meta.json: vocabulary and splits),
with the data fingerprint the loan recorded. Deleted once run: the store is the record.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

import loan  # noqa: E402
from kit import load_settings  # noqa: E402

from angpt.study.arms import parse_arm  # noqa: E402
from angpt.study.store import PLAN_FILE, RunSpec, run_health, write_json  # noqa: E402


def stand_in(data: dict, folder: Path) -> Path:
    """A folder with the loan's data's meta.json only: what planning the race needs of it."""
    folder.mkdir(parents=True, exist_ok=True)
    splits = {k: {"tokens": data["tokens"][k], "documents": data["documents"][k]} for k in data["tokens"]}
    from angpt.data.format import FORMAT_VERSION

    meta = {
        "format_version": FORMAT_VERSION,
        "vocab_size": data["vocab_size"],
        "splits": splits,
        "tokenizer": {"spec": "bpe:8192"},
        "tokenizer_hash": data["tokenizer_hash"],
        "source": "machine",
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def rows(run: dict) -> list[dict]:
    """metrics.jsonl of a race run: its curve, one row a step (a step with a loss and a validation merged)."""
    by_step: dict[int, dict] = {}
    for r in run["curve"]:
        by_step.setdefault(int(r["step"]), {}).update(r)
    return [by_step[s] for s in sorted(by_step)]


def main() -> int:
    cfg = load_settings(HERE / "settings.yaml", "loan")
    store = loan.STORE
    if (store / PLAN_FILE).exists():
        sys.exit(f"error: {store} exists already")
    loans = [x for x in loan.load_loans() if any(p.get("stage") in ("tune", "seed") for p in x.get("pieces", []))]
    (source,) = loans  # the one loan that ran race runs
    data = source["data"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = stand_in(data, Path(tmp) / "data")
        race = cfg["race"]
        plan = loan.race_plan(
            cfg, folder, loan.data_fingerprint(data, cfg["corpus"]["tokenizer"]), race["arms"], race["seeds"][:1]
        )
    plan.data = data["dir"]  # where the runs read it, on the loan's machine
    store.mkdir(parents=True)
    write_json(store / PLAN_FILE, plan.to_dict())
    where = f"benchmarks/gpu-race/{source['loan']}/results.json"
    n = 0
    for piece in source["pieces"]:
        for run in piece.get("runs", []):
            spec = RunSpec(run["arm"], run["steps"] * race["batch_tokens"], run["seed"], run["lr"])
            folder = spec.run_dir(plan, store)
            folder.mkdir(parents=True)
            metrics = rows(run)
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
            keep = (
                "params",
                "params_non_embedding",
                "flops_per_token",
                "lr_from",
                "warmup_steps",
                "weight_decay",
                "epochs",
                "first_batch",
                "tokens_per_s",
                "train_tflops",
                "mfu_datasheet",
                "max_memory_gb",
            )
            record = {
                "arm": run["arm"],
                "arch": parse_arm(run["arm"]).arch,
                "budget": spec.budget,
                "seed": run["seed"],
                "lr": run["lr"],
                "setting": {},
                "steps": run["steps"],
                "tokens": spec.budget,
                "status": run["status"],
                "val_loss": run["val_loss"],
                "val_bpb": None,
                "test_loss": run["test_loss"],
                "test_bpb": None,
                "train_loss": metrics[-1].get("loss"),
                "step_time_median": run["step_time"],
                "dtype": "bf16",
                "compiled": run["compiled"],
                "first_step_s": run["step_time"] + run["first_window_extra_s"],
                "model_reused": run["model_reused"],
                "wall_s": run["seconds"],
                "gpu": source["env"]["gpu"],
                **run_health(metrics),
                **{k: run[k] for k in keep if k in run},
                "converted_from": f"{where} (trained by benchmarks/gpu/race.py at revision {source['revision'][:7]}: "
                "one model an arm, its runs equal to separate `angpt train` runs)",
            }
            write_json(folder / "result.json", record)
            n += 1
    print(f"{n} runs of {source['loan']} into {store}")
    print(loan.write_race_report(cfg, store, loan.load_loans()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
