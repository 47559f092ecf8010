"""Logging (metrics.jsonl always, TensorBoard / W&B when asked), MFU, per-layer health metrics, loss plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from angpt.train.hardware import measured_cpu_peak, peak_for_device_name


def peak_flops(device: torch.device, override: float | None = None, dtype: str = "bf16") -> float | None:
    """Peak FLOP/s of one `device`, for MFU: `override` (train.peak_flops) if given; on CUDA the dense bf16 peak of
    the accelerator table by device name (None when the name is not in it); on a CPU the measured matmul peak in
    the run's `dtype` (train/hardware.py; measured once per process)."""
    if override:
        return float(override)
    if device.type == "cuda":
        return peak_for_device_name(torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return measured_cpu_peak(dtype)
    return None


class MetricsLogger:
    """Appends one JSON row per call to OUT/metrics.jsonl; mirrors scalars to TensorBoard / W&B if enabled."""

    def __init__(
        self,
        out: Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str = "angpt",
        config: dict | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.path = Path(out) / "metrics.jsonl"
        self.tb = self.wb = None
        if not enabled:
            return
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(out) / "tensorboard"))
            except ImportError:
                self.tb = None
        if wandb:
            import wandb as wb

            self.wb = wb.init(project=wandb_project, config=config, dir=str(out))

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        step = row.get("step", 0)
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wb is not None:
            self.wb.log(scalars, step=step)

    def close(self) -> None:
        """Flush and close the TensorBoard / W&B writers (metrics.jsonl is closed after every row)."""
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish()
        self.tb = self.wb = None


def read_metrics(out: str | Path) -> list[dict[str, Any]]:
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@torch.no_grad()
def health_metrics(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """Per-layer effective alpha_A/alpha_M, s_z statistics, residual-stream norm, weight row norms, largest logit."""
    from angpt.models import inspect_norms

    out: dict[str, float] = {}
    blocks = getattr(model, "blocks", [])
    for i, b in enumerate(blocks):
        for name in ("alpha_A", "alpha_M"):
            if hasattr(b, name):
                out[f"health/{name}/{i}"] = getattr(b, name)().mean().item()
    if hasattr(model, "s_z"):
        s = model.s_z()
        out["health/s_z_mean"], out["health/s_z_std"] = s.mean().item(), s.std().item()
    norms = inspect_norms(model, x)
    for i in range(len(blocks)):
        out[f"health/residual_norm/{i}"] = norms[f"layer{i}.h"].item()
    for name, p in model.named_parameters():
        if p.ndim == 2:
            rows = torch.linalg.vector_norm(p.float(), dim=1)
            out[f"health/row_norm_max/{name}"] = rows.max().item()
    out["health/max_logit"] = norms["head.max_logit"].item()  # from inspect_norms' forward: no second one
    return out


def bits_per_byte(loss_nats: float, bytes_per_token: float | None) -> float | None:
    """Cross-entropy per token (nats) -> bits per byte of the original text."""
    if not bytes_per_token:
        return None
    return loss_nats / math.log(2) / bytes_per_token


def plot_loss_curve(out: str | Path, title: str | None = None) -> Path | None:
    """Write OUT/loss_curve.png (train loss and validation loss vs step); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_metrics(out)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if not train and not val:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if train:
        ax.plot(*zip(*train), label="train loss", alpha=0.6)
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or Path(out).name)
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(out) / "loss_curve.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
