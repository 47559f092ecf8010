"""The batch-size study's plot: final loss against batch size, each arm's critical batch circled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from angpt.units import format_tokens


def batch_plot(plt, out: Path, b: dict[str, Any]) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, e in b["arms"].items():
        bs = [x for x in e["batches"] if np.isfinite(e["loss"][x])]
        if not bs:
            continue
        (line,) = ax.plot(bs, [e["loss"][x] for x in bs], marker="o", label=label)
        c = e["critical"]
        if c["critical"] is not None:
            ax.axhline(c["threshold"], color=line.get_color(), ls=":", lw=0.8)
            ax.scatter(
                [c["critical"]],
                [e["loss"][c["critical"]]],
                s=120,
                facecolors="none",
                edgecolors=line.get_color(),
                linewidths=1.5,
                zorder=4,
            )
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(b["batch_sizes"]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([format_tokens(x) for x in b["batch_sizes"]])
    ax.set_xlabel("batch size (tokens per step)")
    ax.set_ylabel(f"final validation loss at {format_tokens(b['tokens'])} tokens")
    ax.set_title(f"batch size (circle: critical batch, within {b['tolerance']:.0%} of the best)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "batch_size.png", dpi=120)
    plt.close(fig)
    return out / "batch_size.png"
