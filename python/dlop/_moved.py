"""Where dlop's modules moved when the package was split by concern.

The one table of old paths, kept for one release: importing an old module
path gives the module at its new path (the same object, so ``isinstance`` and
pickles agree) and warns with a DeprecationWarning naming the new path. A
moved package moves its submodules too (``dlop.scaling.controller`` is
``dlop.fleet.scaling.controller``). ``dlop/__init__.py`` installs the finder;
``dlop.fleet`` asks :func:`moved_name` for the names the old ``dlop.fleet``
module defined.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

MODULES = {
    "dlop._backend": "dlop.c10d.backend",
    "dlop._device_backend": "dlop.c10d.device",
    "dlop._shared_device": "dlop.c10d.shared_device",
    "dlop.run_loaders": "dlop.data.run_loaders",
    "dlop.run": "dlop.fleet.run",
    "dlop.local_offloaders": "dlop.fleet.local",
    "dlop.offloader_launcher": "dlop.fleet.launcher",
    "dlop._slurm": "dlop.fleet.slurm",
    "dlop.slurm_template": "dlop.fleet.slurm_template",
    "dlop.offloader_stats": "dlop.fleet.stats",
    "dlop.data.discovery": "dlop.fleet.discovery",
    "dlop.data.autoscale": "dlop.fleet.scaling.policy",
    "dlop.scaling": "dlop.fleet.scaling",
}

# Names of a module that became a package: (old module, name) -> the module that holds the name now.
NAMES = {
    ("dlop.fleet", name): "dlop.fleet.dns"
    for name in ("split_host_port", "join_host_port", "resolve", "answers", "Candidates", "wait_for_any", "Watcher")
}


def new_path(old: str) -> str | None:
    """The module path that `old` moved to, or None if it did not move."""
    head, dot, rest = old, "", ""
    while head:
        if head in MODULES:
            return MODULES[head] + dot + rest
        head, _, last = head.rpartition(".")
        rest, dot = last + dot + rest, "."
    return None


def _warn(old: str, new: str, stacklevel: int) -> None:
    # The import system's own frames do not count, so the warning names the line that used the old path.
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning,
                  stacklevel=stacklevel + 1)


def moved_name(module: str, name: str):
    """The object `module`.`name` moved to (warning once per access), or AttributeError."""
    where = NAMES.get((module, name))
    if where is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{where}.{name}", stacklevel=3)  # past the module's __getattr__
    return getattr(importlib.import_module(where), name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        new = new_path(fullname)
        if new is None:
            return None
        moved = importlib.util.find_spec(new)
        if moved is None:
            return None
        # The new module's file as origin: `python -m OLD` runs its code with that __file__.
        return importlib.machinery.ModuleSpec(fullname, self, origin=moved.origin)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        # The import system returns whatever sys.modules holds under the old name once this returns:
        # the module at its new path, whose own spec stays untouched.
        old = module.__name__
        new = new_path(old)
        _warn(old, new, stacklevel=2)
        sys.modules[old] = importlib.import_module(new)

    def get_code(self, old: str):
        # `python -m OLD` (runpy asks for the code to run as __main__): the new module's code.
        new = new_path(old)
        _warn(f"python -m {old}", f"python -m {new}", stacklevel=2)
        spec = importlib.util.find_spec(new)
        return spec.loader.get_code(new)


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
