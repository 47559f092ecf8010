"""train/setup.py: a run resolved once (ResolvedRun) and built in one place (build), as the trainer, the dry run, the
study's estimate, the benches and the GPU race build it."""

import re
from pathlib import Path

import pytest
import torch

from angpt.train.config import load_run_config
from angpt.train.dist import DistInfo
from angpt.train.setup import build, reinitialise, resolve

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_the_usage_pages_example_runs_as_written(data_dir, capsys):
    """docs/usage.md's block that resolves and builds a run, run on a prepared dataset: it prints what it says."""
    text = (ROOT / "docs" / "usage.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "resolve" in b)
    code = block.replace('"data/mine"', repr(str(data_dir))).replace("meta=None", "meta=load_meta(cfg.data)")
    exec("from angpt.data import load_meta\n" + code, {})  # noqa: S102 - the page's own code
    out = capsys.readouterr().out.split()
    assert out[0] == "0.004" and "recipe's" in " ".join(out) and out[-2:] == ["0", "2"]


@pytest.mark.parametrize(
    ("arch", "lr", "from_words", "warmup"),
    [("gpt+", None, " (the gpt+ recipe's at tiny; train.lr unset)", 10), ("angpt", 3e-3, "", 0)],
)
def test_a_run_is_resolved_once_with_where_its_values_come_from(arch, lr, from_words, warmup):
    over = {"arch": arch, "preset": "tiny", "train.max_steps": 200, "train.batch_tokens": 512, "train.micro_batch": 4}
    if lr is not None:
        over["train.lr"] = lr
    run = resolve(load_run_config(None, over), device=CPU)
    assert run.lr_from == from_words and run.warmup_steps == warmup  # GPT+'s recipe: 5% of 200 steps
    assert run.lr == (lr or 2e-3) and run.accum == 512 // (64 * 4) and run.seq_len == 64
    assert run.optimizer == ("adamw" if arch == "gpt+" else "adam") and run.dtype in ("fp32", "bf16")
    built = build(run, DistInfo())  # the optimizer the recipe names: AdamW with wd 0 is Adam's update, not its kind
    assert type(built.optimizer) is (torch.optim.AdamW if arch == "gpt+" else torch.optim.Adam)
    with pytest.raises(Exception, match="seq_len=64 exceeds the model's context length 32"):
        resolve(load_run_config(None, {**over, "model.context_length": 32, "train.seq_len": 64}), device=CPU)


def test_a_model_built_before_is_set_in_place_to_a_fresh_runs_weights():
    """build(model=...) keeps the tensors (a compiled forward's guards hold) and gives them a fresh run's values
    under the new run's seed; a model of another config is refused. Watched failing with the copy skipped."""
    cfg = load_run_config(None, {"arch": "angpt", "preset": "tiny", "train.seed": 3, "train.batch_tokens": 256,
                                 "train.micro_batch": 4})  # fmt: skip
    first = build(resolve(cfg, device=CPU), DistInfo())
    tensors = {n: p for n, p in first.base.named_parameters()}
    with torch.no_grad():
        for p in first.base.parameters():
            p.add_(1.0)  # trained, say
    cfg.train.seed = 5
    run = resolve(cfg, device=CPU)
    again = build(run, DistInfo(), model=first.model)
    fresh = build(run, DistInfo())
    for (name, p), (_, q) in zip(again.base.named_parameters(), fresh.base.named_parameters(), strict=True):
        assert p is tensors[name] and torch.equal(p, q), name
    other = resolve(load_run_config(None, {"arch": "angpt", "preset": "tiny", "model.d_model": 32,
                                                 "model.n_heads": 2, "train.batch_tokens": 256,
                                                 "train.micro_batch": 4}), device=CPU)  # fmt: skip
    with pytest.raises(ValueError, match="another model config"):
        reinitialise(first.model, other)
