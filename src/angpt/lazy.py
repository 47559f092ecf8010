"""A package's names loaded on first use (PEP 562): `import angpt` and `import angpt.data` load no model, training or
torch code until a name that needs it is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """(__getattr__, __dir__) for `package`, whose names (`exports`: name -> the module that defines it) are
    imported when first looked up and then kept in the package's `namespace`."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next lookup is a plain attribute
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
