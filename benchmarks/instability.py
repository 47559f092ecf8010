"""Where anGPT's early loss spike comes from: per-step norms of every block's quantities on a fixed batch.

    python benchmarks/instability.py --data data/stdlib-bpe4096 [--steps 6] [--lr 4e-3] [--set key=value ...]

Trains anGPT at the demo preset with its recipe (Adam at its rate for --preset unless --lr, no warm-up, clip 1.0)
and, after each optimizer step,
prints the pre-clip gradient norm, the loss, and the mean norms of h_A, h_M and h per layer on a held-out batch,
plus the largest singular value of each block's weight *update* so far (a coherent, low-rank update is what
breaks the concentration-of-measure assumption behind nu). docs/open_choices.md#early-instability reads it.
"""

from __future__ import annotations

import argparse
import math

import torch

from angpt.data import TokenLoader
from angpt.models import build_model, inspect_norms, registry
from angpt.train.optim import make_optimizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--arch", default="angpt")
    p.add_argument("--preset", default="demo")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=None, help="default: the arch's recipe rate at --preset")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--betas", default="0.9,0.95")
    p.add_argument("--set", nargs="*", default=[])
    a = p.parse_args()
    torch.manual_seed(0)
    overrides = {k: type_of(v) for k, v in (s.split("=", 1) for s in a.set)}
    model = build_model(a.arch, a.preset, **overrides)
    b1, b2 = (float(x) for x in a.betas.split(","))
    lr = a.lr if a.lr is not None else registry.get(a.arch).recipe.lr_for(a.preset)
    opt, sched = make_optimizer(model, lr=lr, max_steps=1000, betas=(b1, b2))
    train = TokenLoader(a.data, "train", a.batch, a.seq, seed=0)
    val, val_y = TokenLoader(a.data, "val", 8, a.seq, seed=0).next_batch()
    w0 = {n: p.detach().clone() for n, p in model.named_parameters() if p.ndim == 2 and "blocks" in n}
    for step in range(1, a.steps + 1):
        x, y = train.next_batch()
        _, loss = model(x, y)
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        with torch.no_grad():
            norms = inspect_norms(model.eval(), val)
            _, vloss = model(val, val_y)
        model.train()
        print(f"step {step}: loss {loss.item():8.3f}  grad_norm {gn:9.2f}  val(after) {vloss.item():8.3f}")
        for name in ("h_A", "h_M", "h"):
            per_layer = " ".join(f"{float(norms[f'layer{i}.{name}']):7.2f}" for i in range(model.config.n_layers))
            print(f"   {name:<3} {per_layer}")
        with torch.no_grad():
            params = dict(model.named_parameters())
            # a diverged step leaves non-finite weights, whose singular values do not exist
            sigma = {
                n: float(torch.linalg.matrix_norm(params[n] - w, ord=2)) if params[n].isfinite().all() else math.inf
                for n, w in w0.items()
            }
        top = sorted(sigma.items(), key=lambda kv: -kv[1])[:4]
        print("   largest update sigma_max: " + ", ".join(f"{n} {s:.2f}" for n, s in top))


def type_of(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v, v)


if __name__ == "__main__":
    main()
