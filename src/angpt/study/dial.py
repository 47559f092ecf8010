"""The size dial of a scaling ladder: one integer per model (its depth, or its width) gives the whole shape.

As nanochat's ``--depth`` dial: width = depth x aspect, heads = width / head_dim, every other field the preset's.
A fixed aspect ratio and head dimension make the sizes one family, so a fit over them measures scale, not shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from angpt.errors import UserError

DEFAULT_ASPECT = 64  # width per layer (nanochat: model_dim = 64 x depth)
DEFAULT_HEAD_DIM = 64


@dataclass(frozen=True)
class Shape:
    """One size of the ladder."""

    depth: int
    width: int
    heads: int
    d_ff: int | None = None  # None: the model's default, 4 x width

    @property
    def name(self) -> str:
        """The size's directory name and table label: ``L4_d256``."""
        return f"L{self.depth}_d{self.width}"

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def model_settings(self) -> dict[str, Any]:
        """The `model.*` settings that make this shape (every arm of the size gets them)."""
        out: dict[str, Any] = {"model.n_layers": self.depth, "model.d_model": self.width, "model.n_heads": self.heads}
        if self.d_ff is not None:
            out["model.d_ff"] = self.d_ff
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "width": self.width, "heads": self.heads, "d_ff": self.d_ff}


# The model fields the dial owns: an arm or --set may not change them, or the sizes would not be one family.
SHAPE_KEYS = frozenset({"n_layers", "d_model", "n_heads", "d_ff"})


def _positive_ints(values: list[int] | None, what: str) -> list[int]:
    if not values:
        return []
    if any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
        raise UserError(f"{what} {values} must be positive integers")
    if len(set(values)) != len(values):
        raise UserError(f"{what} {values} has a repeated size")
    return sorted(values)


def dial_shapes(
    *,
    depths: list[int] | None = None,
    widths: list[int] | None = None,
    aspect: int = DEFAULT_ASPECT,
    head_dim: int = DEFAULT_HEAD_DIM,
    ffn_mult: float | None = None,
) -> list[Shape]:
    """The ladder's shapes, smallest first, from depths (width = depth x aspect) or widths (depth = width / aspect).

    Every size must split into whole heads of `head_dim` (an even number: RoPE rotates pairs); a size the dial
    cannot make is a one-line UserError naming it and what to change.
    """
    if (depths is None) == (widths is None):
        raise UserError("give the sizes by exactly one dial: --depths 2,3,4,5,6 or --widths 128,192,256")
    for name, v in (("--aspect", aspect), ("--head-dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise UserError(f"{name} {v!r} must be a positive integer")
    if head_dim % 2:
        raise UserError(f"--head-dim {head_dim} is odd, but RoPE rotates pairs of dimensions; use an even head dim")
    if ffn_mult is not None and not ffn_mult > 0:
        raise UserError(f"--ffn-mult {ffn_mult!r} must be positive")
    if depths is not None:
        pairs = [(d, d * aspect) for d in _positive_ints(depths, "--depths")]
    else:
        pairs = []
        for w in _positive_ints(widths, "--widths"):
            if w % aspect:
                raise UserError(f"width {w} is not a multiple of --aspect {aspect}, so it has no whole depth")
            pairs.append((w // aspect, w))
    if not pairs:
        raise UserError("no sizes: give e.g. --depths 2,3,4,5,6")
    shapes = []
    for depth, width in pairs:
        if width % head_dim:
            raise UserError(
                f"size depth {depth} (width {depth} x {aspect} = {width}) does not split into heads of {head_dim}; "
                f"choose depths whose width is a multiple of {head_dim}, or another --head-dim / --aspect"
            )
        d_ff = None if ffn_mult is None else max(1, round(ffn_mult * width))
        shapes.append(Shape(depth=depth, width=width, heads=width // head_dim, d_ff=d_ff))
    return shapes
