"""Lazily imported submodules, so that `cw.io.safetensors` works after a bare `import candle_web`
while the import itself still loads only the standard library and numpy (PEP 562)."""

from __future__ import annotations

import importlib


def lazy_submodules(package: str, names: tuple[str, ...], namespace: dict,
                    aliases: dict[str, str] | None = None):
    """The module-level `__getattr__` and `__dir__` for a package whose submodules `names` are
    imported on first attribute access, then cached in the package's namespace. `aliases` maps
    an attribute to a module elsewhere (a public name kept where a module moved)."""
    aliases = aliases or {}

    def __getattr__(name: str):
        if name in names or name in aliases:
            module = importlib.import_module(aliases.get(name, f"{package}.{name}"))
            namespace[name] = module  # later accesses are plain attribute lookups
            return module
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(names) | set(aliases))

    return __getattr__, __dir__
