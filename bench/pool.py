"""Where a sweep's traces run: in this process, on a process pool on this machine, or on a
Dask cluster.

Each sweep (``bench/figures.py``, ``bench/offline_optimum.py``) hands independent tasks
(one trace each) to a :class:`concurrent.futures.Executor` and collects the results as
they finish. On one machine that is the standard library's ``ProcessPoolExecutor``
(``spawn`` start method: the workers import the project afresh, as a remote worker
would, and no thread of the parent is forked). With ``--dask-scheduler tcp://HOST:PORT``
it is Dask distributed's executor on that cluster (``Client.get_executor``, the same
``Executor`` interface), so the sweep code does not change.

Why Dask rather than Ray: Dask distributed is pure Python (a small wheel and its
dependencies, no native object store or per-platform runtime), its ``Executor`` is the
``concurrent.futures`` interface the process pool already speaks, and a cluster is
``dask scheduler`` plus ``dask worker tcp://...`` on each node. Ray offers more
(actors, its object store), none of which a sweep of independent traces needs, at the
price of a large native runtime. Dask is an optional extra
(``pip install 'oasis-scheduler[cluster]'``), imported only when a scheduler is given.

Timings measured inside a task (solve seconds) share the machine with the other tasks;
``--workers 1`` runs them one at a time, in this process, as before.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Any, TypeVar

from controller.commands.common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    int_at_least,
    on_sigterm,
)

__all__ = ["add_arguments", "executor", "interruptible", "run_all"]

T = TypeVar("T")


def add_arguments(parser: Any) -> None:
    """``--workers`` and ``--dask-scheduler`` on an argparse parser."""
    parser.add_argument(
        "--workers",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="processes on this machine (default: one per core; 1: in this process, one "
        "trace at a time)",
    )
    parser.add_argument(
        "--dask-scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the traces on a Dask cluster (e.g. tcp://10.0.0.5:8786) instead; needs "
        "the 'cluster' extra (dask distributed)",
    )


@contextmanager
def executor(workers: int | None, dask_scheduler: str | None) -> Iterator[Executor | None]:
    """The executor to run tasks on; None: run them here, in order."""
    if dask_scheduler is not None:
        try:
            from distributed import Client
        except ImportError as err:
            raise SystemExit(
                "--dask-scheduler needs dask distributed: pip install 'oasis-scheduler[cluster]'"
            ) from err
        with Client(dask_scheduler) as client:
            yield client.get_executor(pure=False)
        return
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1:
        yield None
        return
    pool = ProcessPoolExecutor(
        n, mp_context=multiprocessing.get_context("spawn"), initializer=_leave_ctrl_c
    )
    try:
        yield pool
    except BaseException:  # Ctrl-C, SIGTERM (as Terminated), a task's error
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def _leave_ctrl_c() -> None:
    """In a pool's worker: ignore SIGINT. Ctrl-C reaches the terminal's whole process
    group; it is the parent's to handle, which ends the workers (:func:`_stop`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers at once. Leaving the ``with`` of
    the pool on Ctrl-C waited for every task queued (``shutdown(wait=True)``): Ctrl-C at
    25 s of ``python -m bench.figures`` went on running its 147 traces, silently, and
    was not over a minute later. ``_processes`` is the executor's own (Python 3.14 has
    ``terminate_workers()``, which does this)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(ValueError, ProcessLookupError):  # closed, or gone
            if process.is_alive():
                process.terminate()
    for process in processes:
        with contextlib.suppress(ValueError):
            process.join(5)


def run_all(
    pool: Executor | None,
    fn: Callable[..., T],
    tasks: Iterable[tuple[Any, ...]],
    done: Callable[[tuple[Any, ...], T], None] | None = None,
) -> list[T]:
    """``fn(*task)`` for every task, on ``pool`` (or here); results in task order.
    ``done(task, result)`` is called as each finishes (e.g. to move a progress bar)."""
    tasks = list(tasks)
    if pool is None:
        results = []
        for task in tasks:
            results.append(fn(*task))
            if done is not None:
                done(task, results[-1])
        return results
    futures: dict[Future[T], int] = {pool.submit(fn, *task): n for n, task in enumerate(tasks)}
    out: dict[int, T] = {}
    for future in as_completed(futures):
        n = futures[future]
        out[n] = future.result()
        if done is not None:
            done(tasks[n], out[n])
    return [out[n] for n in range(len(tasks))]


def interruptible(prog: str, run: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``run(argv)`` as a benchmark's ``main``: Ctrl-C ends it with status 130, SIGTERM
    (``timeout``, a batch scheduler's limit) with 143, one line each (``prog:
    interrupted``) and no traceback; a pool's workers are ended by :func:`executor`.
    SIGTERM is taken only where its handler is the default, in the main thread, and put
    back after."""
    main_thread = threading.current_thread() is threading.main_thread()
    ours = main_thread and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if ours:
        signal.signal(signal.SIGTERM, on_sigterm)  # raises Terminated, as Ctrl-C raises
    try:
        return run(argv)
    except KeyboardInterrupt as err:  # Terminated too
        word = "terminated" if isinstance(err, Terminated) else "interrupted"
        print(f"{prog}: {word}", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED
    finally:
        if ours:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
