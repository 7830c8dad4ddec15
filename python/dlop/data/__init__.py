"""dlop.data: offloaded data loading.

``OffloadLoader`` yields batches made by ``dlop-offloader`` daemons (or, with
one warning, by local worker processes running the same native pipeline);
``offload(loader)`` maps a DataLoader over a torchvision ImageFolder with
standard transforms onto it; ``make_dataset`` generates the built-in synthetic dataset. The native
pipeline itself is in ``dlop._C.media``. ``metrics`` holds what a loader measures (its
``stats()``, the DLOP_METRICS_PORT endpoint); dlop.fleet sizes the offloader fleet from it; ``run_loaders`` offloads
the DataLoaders of a command run by ``dlop run``.
"""

__all__ = ["OffloadLoader", "offload"]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def __getattr__(name: str):
    # Imported on first use: `python -m dlop.data.make_dataset` needs neither torch nor the extension.
    if name == "OffloadLoader":
        from dlop.data.offload_loader import OffloadLoader

        return OffloadLoader
    if name == "offload":
        from dlop.data.wrap import offload

        return offload
    raise AttributeError(f"module 'dlop.data' has no attribute {name!r}")
