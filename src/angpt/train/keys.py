"""Every config key with its default and meaning, read from the config dataclasses themselves (`angpt train
--help-config`): a field's meaning is its own line's comment, so a new field without one fails the tests instead of
going undocumented."""

from __future__ import annotations

import dataclasses
import inspect
import re

from angpt.models import registry
from angpt.models.config import ARCH_DEFAULT, BASE, ModelConfig
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


def _show(value: object) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _default(f: dataclasses.Field, arch: str | None = None) -> str:
    if f.default is ARCH_DEFAULT:  # the architecture's: its registry entry's value, or the field's base one
        if arch is not None:
            return _show(registry.get(arch).config.get(f.name, BASE[f.name]))
        return "by arch"
    if f.default is not dataclasses.MISSING:
        return _show(f.default)
    return "{}" if f.default_factory is dict else "-"  # type: ignore[comparison-overlap]


def _by_arch(name: str) -> str:
    """`[angpt 'mlp'; others 'none']`: a field whose default depends on the architecture, per registry entry."""
    setting = {arch: s.config[name] for arch, s in registry.ARCHITECTURES.items() if name in s.config}
    shown = "; ".join(f"{arch} {_show(v)}" for arch, v in setting.items())
    return f" [{shown}; others {_show(BASE[name])}]"


def reference(arch: str | None = None) -> list[tuple[str, str, str]]:
    """(key as written on the command line, default, meaning) for the top-level, train.* and model.* keys; the
    model.* defaults as `arch` takes them (None: every architecture's, where they differ)."""
    rows = []
    for prefix, cls, skip in (("", RunConfig, {"train", "model"}), ("train.", TrainConfig, set()),
                              ("model.", ModelConfig, {"arch", "extra"})):  # fmt: skip
        text = meanings(cls)
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            meaning = text.get(f.name, "")
            if f.default is ARCH_DEFAULT and arch is None:
                meaning += _by_arch(f.name)
            rows.append((f"--{prefix}{f.name}", _default(f, arch), meaning))
    return rows


def format_reference(arch: str | None = None) -> str:
    rows = reference(arch)
    width = max(len(k) for k, _, _ in rows)
    dwidth = min(max(len(d) for _, d, _ in rows), 14)
    whose = f"{arch}'s" if arch else "the field defaults; where they differ by architecture, each one's in brackets"
    lines = [
        f"Every key of a run (YAML recipe or --section.key VALUE on the command line). model.* defaults: {whose}",
        "(the preset sets the shape first; angpt info --arch A --preset P shows a resolved config; angpt train",
        "--help-config --arch A shows A's defaults). train.lr, weight_decay and warmup_steps null: the arch's recipe.",
        "",
    ]
    lines += [f"{k:<{width}}  {d:<{dwidth}}  {m}" for k, d, m in rows]
    return "\n".join(lines)
