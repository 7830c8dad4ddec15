"""dlop run's hook, loaded at start-up by every Python that `dlop run` starts.

`dlop run` puts this folder first on PYTHONPATH, so Python's ``site`` imports
this file as ``sitecustomize`` in the command and in every process it starts
(torchrun's ranks included). It must cost nothing where no DataLoader is
iterated, so it imports neither torch nor dlop: it chain-loads the
``sitecustomize`` it shadows, then waits, through an import hook, for
``torch.utils.data.dataloader`` to be imported, and only then replaces
``DataLoader.__iter__`` with a stub that hands each iteration to
``dlop.data.run_loaders.iterate`` (imported then, once torch is fully loaded).
"""

import os
import sys


def _chain_load() -> None:
    """Runs the sitecustomize this file hides (a distribution's or the user's)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # as site.py itself does: report and go on
        print(f"dlop run: the shadowed sitecustomize ({spec.origin}) failed: {e!r}", file=sys.stderr)


def _patch(module) -> None:
    cls = module.DataLoader
    if getattr(cls, "_dlop_original_iter", None) is not None:
        return
    original = cls.__iter__

    def __iter__(self):
        # A DataLoader worker process (fork inherits the patch) iterates as usual.
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            return original(self)
        try:
            import dlop.data.run_loaders  # torch is fully imported by now
        except ImportError as e:  # a Python without dlop: train as if dlop run were not there
            if not getattr(cls, "_dlop_import_warned", False):
                cls._dlop_import_warned = True
                import warnings

                warnings.warn(f"dlop run: DataLoaders are not offloaded: this Python cannot import dlop ({e})",
                              RuntimeWarning, stacklevel=2)
            return original(self)
        return dlop.data.run_loaders.iterate(self, original)

    __iter__.__doc__ = original.__doc__
    cls._dlop_original_iter = original
    cls.__iter__ = __iter__


class _Hook:
    """Meta-path finder that patches DataLoader right after its module runs."""

    target = "torch.utils.data.dataloader"

    def find_spec(self, name, path=None, target=None):
        if name != self.target:
            return None
        sys.meta_path.remove(self)  # once; and no recursion through the finders below
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


_chain_load()
_WHERE = ("DLOP_RUN_OFFLOADERS", "DLOP_RUN_DNS", "DLOP_RUN_DISCOVER")  # how dlop run names offloaders
if any(os.environ.get(name) for name in _WHERE) and not os.environ.get("DLOP_RUN_DISABLE"):
    if "torch.utils.data.dataloader" in sys.modules:  # a shadowed sitecustomize imported torch already
        _patch(sys.modules["torch.utils.data.dataloader"])
    else:
        sys.meta_path.insert(0, _Hook())
