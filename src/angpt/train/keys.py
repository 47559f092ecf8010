"""Every config key with its default and meaning, read from the config dataclasses themselves (`angpt train
--help-config`): a field's meaning is its own line's comment, so a new field without one fails the tests instead of
going undocumented."""

from __future__ import annotations

import dataclasses
import inspect
import re

from angpt.models.config import ModelConfig
from angpt.train.config import RunConfig, TrainConfig

_FIELD = re.compile(r"^\s+(\w+): [^=#]+=[^#]*#\s*(.+)$")


def meanings(cls: type) -> dict[str, str]:
    """{field: the comment on its line} for a dataclass's fields."""
    found = {}
    for line in inspect.getsource(cls).splitlines():
        m = _FIELD.match(line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return "null" if f.default is None else repr(f.default) if isinstance(f.default, str) else str(f.default)
    return "{}" if f.default_factory is dict else "-"  # type: ignore[comparison-overlap]


def reference() -> list[tuple[str, str, str]]:
    """(key as written on the command line, default, meaning) for the top-level, train.* and model.* keys."""
    rows = []
    for prefix, cls, skip in (("", RunConfig, {"train", "model"}), ("train.", TrainConfig, set()),
                              ("model.", ModelConfig, {"arch", "extra"})):  # fmt: skip
        text = meanings(cls)
        for f in dataclasses.fields(cls):
            if f.name not in skip:
                rows.append((f"--{prefix}{f.name}", _default(f), text.get(f.name, "")))
    return rows


def format_reference() -> str:
    rows = reference()
    width = max(len(k) for k, _, _ in rows)
    dwidth = min(max(len(d) for _, d, _ in rows), 14)
    lines = [
        "Every key of a run (YAML recipe or --section.key VALUE on the command line). model.* defaults are the",
        "field defaults; the preset and the architecture's registry entry set some of them first (angpt info --arch A",
        "--preset P shows a resolved config); train.lr, weight_decay and warmup_steps null mean the arch's recipe.",
        "",
    ]
    lines += [f"{k:<{width}}  {d:<{dwidth}}  {m}" for k, d, m in rows]
    return "\n".join(lines)
