"""The decorator of the compiled kernels: ``@njit(cache=True, nogil=True)`` whose on-disk
cache is valid only for the sources of this whole package, not just the kernel's file.

numba's cache keeps a kernel's compiled code under a stamp of the file that defines it
(a hash of its contents in numba 0.68, its time and size in older ones) and reuses the
code while that stamp matches (``numba/core/caching.py``: ``IndexDataCacheFile`` compares
the locator's ``get_source_stamp()``). But the compiled code also holds every jitted
function the kernel calls, and the globals they read, from other files: the search in
``best_schedule.py`` carries ``placement.py``'s helpers. A change to ``placement.py``
alone left ``best_schedule.py``'s stamp as it was, so the old search ran on, in an
editable checkout and even after ``pip install .`` (the defining file's contents were
unchanged), until someone deleted the cache files (numba issue #1833).

Here each kernel gets numba's own cache with its own locators (where the files go:
``NUMBA_CACHE_DIR``, as the systemd unit sets it, else ``__pycache__`` beside the
source, else the user's cache directory when the package is installed read only), except
that their stamp is a hash of every ``.py`` file of the package. Any change in the
package recompiles every kernel once, into the same files (numba rewrites a stale index
and reuses its numbered data files), so nothing accumulates. numba's version and
Python's are already in the cache's keys.

The hash is taken once per process, when the first kernel is decorated (about 1.5 ms for
the package's 37 files, 385 kB), so it describes the sources the process imported.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from numba import njit
from numba.core import caching
from numba.core.dispatcher import Dispatcher

__all__ = ["UNCACHED", "kernel", "source_stamp"]

_PACKAGE = Path(__file__).resolve().parent

UNCACHED: list[str] = []
"""Why kernels could not be cached (numba found no folder it may write: the package is
read only, the user has no home, ``NUMBA_CACHE_DIR`` unset); they are compiled at each
start instead. The daemon logs it; before, the import raised and oasisd died with a
traceback."""

_Function = TypeVar("_Function", bound=Callable[..., object])


@functools.cache
def source_stamp() -> str:
    """A SHA-256 over the relative path and contents of every ``.py`` file of the
    package, in a fixed order."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


class _PackageStamp:
    def get_source_stamp(self) -> str:
        return source_stamp()


def _package_stamped(locator: type[object]) -> type[object]:
    """``locator`` with the package's stamp where numba's is the defining file's (a
    package in a zip, or code typed at IPython's prompt, keeps numba's: oasis runs as
    neither)."""
    if issubclass(locator, caching._SourceFileBackedLocatorMixin) and (
        "get_source_stamp" not in vars(locator)
    ):
        return type(locator.__name__, (_PackageStamp, locator), {})
    return locator


class _PackageCacheImpl(caching.CompileResultCacheImpl):
    _locator_classes = [  # noqa: RUF012 (numba's own attribute, a list)
        _package_stamped(locator) for locator in caching.CompileResultCacheImpl._locator_classes
    ]


class _PackageCache(caching.FunctionCache):
    """numba's cache of one kernel, with the package's stamp; a damaged cache file is a
    miss, not an error.

    numba raises from a cache index or data file it cannot unpickle (a file left empty
    or truncated by a power loss or a full disk: ``UnpicklingError: pickle data was
    truncated``) on every import, so the daemon failed at every start, and systemd
    restarted it into the same failure. Here such a load compiles the kernel afresh,
    and the damaged index is removed so that the save writes a whole one; a save that
    fails (a full disk) leaves the kernel compiled in memory, not cached."""

    _impl_class = _PackageCacheImpl

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)  # type: ignore[no-untyped-call]
        except Exception:  # whatever the file holds: compile instead
            self._discard_index()
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            super().save_overload(sig, data)  # type: ignore[no-untyped-call]
        except Exception:  # a full disk, a damaged index: not cached
            self._discard_index()

    def _discard_index(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self._cache_file._index_path)


def kernel(function: _Function) -> Dispatcher[_Function]:
    """``function`` compiled in nopython mode without the GIL, cached on disk with the
    package's stamp."""
    dispatcher = njit(nogil=True)(function)
    if hasattr(dispatcher, "enable_caching"):  # not a plain function (NUMBA_DISABLE_JIT)
        # what enable_caching() does (njit's cache=True), with the package's stamp
        try:
            dispatcher._cache = _PackageCache(function)  # type: ignore[attr-defined,no-untyped-call]
        except RuntimeError as err:  # "no locator available": nowhere to write the cache
            if not UNCACHED:
                UNCACHED.append(str(err))
    return dispatcher
