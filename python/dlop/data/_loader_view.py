"""What code written for torch's DataLoader reads from a loader, for OffloadLoader.

Trainers (Lightning's fit loop, a script's progress bar) read ``loader.dataset``
(``len()`` of it), ``loader.sampler`` (``set_epoch`` each epoch, ``len()``),
``batch_size`` and ``drop_last``. On the generic Python path ``dataset`` is the
user's Dataset; a native source has none, so it gets a :class:`SourceDataset`.
The sampler is the loader's plan seen as a DistributedSampler: this rank's
indices of the current epoch, and ``set_epoch`` sets the loader's epoch.
"""

from __future__ import annotations

from typing import Any, Iterator


class SourceDataset:
    """A native source as a map-style dataset's outline: its length and where it is. Its samples are
    decoded by the pipeline, batch by batch, so single items are not served."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self.source, self.kind = loader.source, loader.kind

    def __len__(self) -> int:
        return self._loader._sample_count()

    def __getitem__(self, index: int):
        raise TypeError(f"{self!r} is decoded by the native pipeline a batch at a time: iterate the OffloadLoader")

    def __repr__(self) -> str:
        return f"SourceDataset({self.source!r}, kind={self.kind!r})"


class PlanSampler:
    """The loader's epoch plan as a sampler: this rank's sample indices in the order they are batched."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    @property
    def epoch(self) -> int:
        return self._loader._epoch

    @property
    def shuffle(self) -> bool:
        return self._loader.shuffle

    @property
    def seed(self) -> int:
        return self._loader.seed

    @property
    def rank(self) -> int:
        return self._loader.rank

    @property
    def num_replicas(self) -> int:
        return self._loader.world

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def _indices(self) -> list[int]:
        return [i for batch in self._loader._plan().batches(self._loader._epoch) for i in batch]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())
