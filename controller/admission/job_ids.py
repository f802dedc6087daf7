"""The ids of the stored jobs, kept in memory as 64-bit digests.

The decision thread asks, for every submission, whether its id is stored already: a new
id is then decided without a read of the store. A Python set of the ids themselves held
about 190 bytes per job (188 MB with 10^6 jobs kept, ``bench/history_scale.py``); the
digests take 8 bytes per job in a sorted array, plus a small set of the ids added or
removed since it was last merged.

A digest that matches may be another id's (about 1 in 10^7 with 10^6 jobs kept), so a
match means "maybe stored": the caller reads the store, as it does for every id that is
stored, and a job it does not find is new. A miss is certain. The digest is Python's
``hash`` of the id, randomised per process and stable within it, which is all that is
needed: the digests are never stored.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

__all__ = ["JobIds"]

_MASK = (1 << 64) - 1
_MERGE_AT = 4096
"""Changes kept apart before they are merged into the sorted array (and at least an
eighth of it), so a merge's O(n) is paid once per that many changes."""


def _digest(job_id: str) -> int:
    return hash(job_id) & _MASK


def _sorted_digests(ids: Iterable[str]) -> NDArray[np.uint64]:
    """The digests of ``ids``, sorted, each once (``hash`` is a signed 64-bit int: read
    as int64, seen as uint64, the same bits as ``_digest``)."""
    return _sorted_once(np.fromiter(map(hash, ids), dtype=np.int64).view(np.uint64))


def _sorted_once(values: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``values`` sorted, each once: ``np.unique`` took 0.6 s for 10^6 of them here
    (numpy 2's), a sort 0.03 s."""
    values = np.sort(values)
    if values.size > 1:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return values


class JobIds:
    """The stored jobs' ids as digests: ``job_id in ids`` is True for every id added and
    not removed since, and for another id only when their digests match (a match is a
    "maybe": module docstring)."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._sorted = _sorted_digests(ids)
        self._added: set[int] = set()
        self._removed: set[int] = set()

    def __contains__(self, job_id: object) -> bool:
        if not isinstance(job_id, str):
            return False
        d = _digest(job_id)
        if d in self._added:
            return True
        if d in self._removed:
            return False
        i = int(np.searchsorted(self._sorted, np.uint64(d)))
        return i < self._sorted.size and int(self._sorted[i]) == d

    def add(self, job_id: str) -> None:
        d = _digest(job_id)
        self._removed.discard(d)
        self._added.add(d)
        self._maybe_merge()

    def difference_update(self, job_ids: Iterable[str]) -> None:
        """Forget ``job_ids`` (deleted from the store). Another id with the same digest
        then reads as absent too; none does among the ids of one store in practice, and
        the store's primary key refuses a second job of a reused id anyway."""
        for job_id in job_ids:
            d = _digest(job_id)
            self._added.discard(d)
            self._removed.add(d)
        self._maybe_merge()

    @property
    def nbytes(self) -> int:
        """Bytes of the sorted array (the sets of changes not counted)."""
        return int(self._sorted.nbytes)

    def _maybe_merge(self) -> None:
        if len(self._added) + len(self._removed) < max(_MERGE_AT, self._sorted.size // 8):
            return
        merged = self._sorted
        if self._removed:
            gone = np.fromiter(self._removed, dtype=np.uint64, count=len(self._removed))
            merged = merged[~np.isin(merged, gone)]
        if self._added:
            new = np.fromiter(self._added, dtype=np.uint64, count=len(self._added))
            merged = _sorted_once(np.concatenate((merged, new)))
        self._sorted = merged
        self._added.clear()
        self._removed.clear()
