"""``oasis offline TRACE``: the offline optimum of a trace against the online algorithm;
``oasis offline --store STORE [--from SLOT --to SLOT]``: the same over what a daemon
decided (controller/history.py says what is compared).

``--method`` picks the exact ILP, a certified bound with an allocation (column
generation), or, by default, whichever the size allows (pricing/offline_solve.py). The
``--json`` document holds SPEC 6's keys and those :func:`offline_json` lists."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from sqlalchemy.exc import SQLAlchemyError

from controller.commands import SUMMARIES, common
from controller.commands.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    InputError,
    Terminated,
    add_arrival_slots,
    add_search_limit,
    check_store_url,
    check_total_utility,
    counted,
    fmt,
    int_at_least,
    json_document,
    load_trace,
    machine_memory,
    positive_seconds,
    quiet_native_stdout,
    search_limits,
    store_url,
    unreadable_store,
)
from controller.history import History, HistoryError, OnlineJob, load_history
from controller.replay import replay
from controller.store import Database, StoreUnavailableError
from pricing.column_generation import ColumnGenerationError
from pricing.errors import SpecError
from pricing.offline import (
    Held,
    OfflineError,
    OfflineResult,
    largest_job_share,
    theorem4_bound,
)
from pricing.offline_allocation import check_schedules
from pricing.offline_solve import ilp_size, solve
from pricing.schedule import Schedule
from pricing.trace import Trace

__all__ = ["offline_json", "register", "run"]

DEFAULT_TIME_LIMIT = 60.0
"""Seconds the solver may run unless ``--time-limit`` says otherwise."""

_SOLVER_LABEL = {"highs": "HiGHS", "cbc": "CBC"}


def register(sub: Any) -> None:
    """Add the ``offline`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "offline",
        help=SUMMARIES["offline"],
        description=(
            "Solve the offline optimum of TRACE (the paper's problem (1)-(13) under the "
            "online algorithm's feasibility rules), replay the online algorithm on the same "
            "trace, and print both, their ratio, a certified upper bound on the optimum and "
            "how it was obtained, the gap, and the worst-case ratio 2*alpha of the paper's "
            "Theorem 4. Small problems are solved exactly (ILP); large ones get a certified "
            "bound from the configuration LP (column generation) and an allocation rounded "
            "from it."
        ),
    )
    p.add_argument(
        "trace", metavar="TRACE", nargs="?", help="trace file (JSON, SPEC 6), or - for stdin"
    )
    p.add_argument(
        "--store",
        metavar="STORE",
        help="compare what the daemon with this store decided, instead of replaying a "
        "TRACE: a SQLAlchemy URL (postgresql+psycopg://oasis@db/oasis), a SQLite file, or "
        "a daemon's data_dir (/var/lib/oasis: its oasis.db)",
    )
    add_arrival_slots(
        p,
        "--store: compare the jobs that arrived from this slot on (default: the first)",
        "--store: ... up to this slot, inclusive (default: the last); other jobs keep "
        "their allocations",
    )
    p.add_argument("--json", action="store_true", help="print JSON (SPEC 6) instead of text")
    p.add_argument(
        "--method",
        choices=("auto", "ilp", "colgen"),
        default="auto",
        help="ilp: the exact ILP alone; colgen: the configuration LP's certified bound and an "
        "allocation rounded from its columns; auto (default): colgen, then the ILP reduced "
        "by its bound when the ILP is small enough",
    )
    p.add_argument(
        "--solver",
        choices=("highs", "cbc"),
        default="highs",
        help="MIP solver of the ILP (default: highs); the LPs always use HiGHS",
    )
    p.add_argument(
        "--time-limit",
        type=positive_seconds,
        default=DEFAULT_TIME_LIMIT,
        metavar="SECONDS",
        help=f"seconds for the solve (default: {DEFAULT_TIME_LIMIT:g}); the online replay "
        "before it is not counted, and a certified bound and a first allocation are made "
        "however short it is; the best allocation found is reported with its gap to the "
        "certified bound",
    )
    p.add_argument(
        "--threads", type=int_at_least(1), default=None, help="solver threads (default: solver's)"
    )
    add_search_limit(p)
    p.add_argument(
        "--cold",
        action="store_true",
        help="do not start from the online allocation (the optimum found may then fall "
        "below the online utility when the time limit cuts the search short)",
    )
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress on stderr"
    )
    p.set_defaults(func=run)


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an infinite gap (optimum 0, bound > 0) is written as null."""
    return x if x is not None and math.isfinite(x) else None


def offline_json(
    result: OfflineResult,
    online_jobs: list[OnlineJob],
    bound_2alpha: float,
    job_share: tuple[float, str] | None = None,
    notes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The ``offline --json`` document: SPEC 6's keys first, then

    - ``bound``: a certified upper bound on the optimum; ``ratio_bound``: bound / online
      (the optimum is at most this many times the online utility);
      ``online_share_certified``: online / bound (the online utility is at least this
      share of the optimum, whether or not the optimum is proven); ``bound_source``: how
      the bound was obtained;
    - ``method``: ``ilp``, ``colgen`` or ``colgen+ilp`` (what ran; ``optimum`` is the
      best allocation found, the optimum only when ``status`` is ``optimal``);
      ``allocation_source``; ``lp_bound``: the configuration LP's certified bound
      (null for ``ilp``); ``columns``, ``rounds``: its column generation;
    - ``solver``, ``solve_seconds`` (wall time of the whole comparison after the online
      replay), ``variables``, ``constraints`` (of the last model solved: the ILP's, or
      the configuration LP's columns and rows);
    - ``theorem4_ratio_bound``: ``2 alpha``; ``theorem4_assumes_small_jobs``: true, with
      ``largest_job_share`` and ``largest_job_share_resource``: the largest share of the
      cluster's total of one resource one job can take in a slot (Theorem 4 assumes it
      is small, and its bound need not hold otherwise);
    - ``notes``: with ``--store``, what the comparison left out or counted otherwise
      and why (controller/history.py: cancelled jobs left out, failed ones counted 0,
      servers out of service held), one line each; empty for a trace;
    - ``jobs``: per job, offline and online admission, completion time and utility, and
      ``online_state``, the job's state in the store (null for a trace).
    """
    online = float(sum(j.utility or 0.0 for j in online_jobs if j.admitted))
    ratio = result.optimum / online if result.optimum is not None and online > 0 else None
    # unproven: the true ratio lies between ratio and bound / online
    ratio_bound = result.bound / online if result.bound is not None and online > 0 else None
    share = online / result.bound if result.bound is not None and result.bound > 0 else None
    jobs = []
    for on, off in zip(online_jobs, result.jobs or [None] * len(online_jobs), strict=True):
        jobs.append(
            {
                "id": on.id,
                "offline_admitted": None if off is None else off.admitted,
                "offline_jct": None if off is None else off.jct,
                "offline_utility": None if off is None else off.utility,
                "online_admitted": on.admitted,
                "online_jct": on.jct,
                "online_utility": on.utility,
                "online_state": on.state,
            }
        )
    return {
        "optimum": result.optimum,
        "online": online,
        "ratio": ratio,
        "status": result.status,
        "gap": _finite(result.gap),
        "bound": result.bound,
        "ratio_bound": ratio_bound,
        "online_share_certified": share,
        "bound_source": result.bound_source or _ilp_bound_source(result),
        "method": result.method,
        "allocation_source": result.allocation_source or "the ILP's incumbent",
        "lp_bound": result.lp_bound,
        "columns": result.columns,
        "rounds": result.rounds,
        "solver": result.solver,
        "solve_seconds": round(result.solve_seconds, 4),
        "variables": result.variables,
        "constraints": result.constraints,
        "theorem4_ratio_bound": bound_2alpha,
        "theorem4_assumes_small_jobs": True,
        "largest_job_share": None if job_share is None else job_share[0],
        "largest_job_share_resource": None if job_share is None else job_share[1],
        "notes": list(notes),
        "jobs": jobs,
    }


def _ilp_bound_source(result: OfflineResult) -> str:
    label = _SOLVER_LABEL[result.solver]
    if result.status == "optimal":
        return f"proven by the ILP ({label})"
    return f"the ILP's dual bound ({label})" if result.bound is not None else "none"


def _text(doc: dict[str, Any], gap: float | None, out: TextIO) -> None:
    admitted_off = sum(bool(j["offline_admitted"]) for j in doc["jobs"])
    admitted_on = sum(bool(j["online_admitted"]) for j in doc["jobs"])
    n = len(doc["jobs"])
    proven = doc["status"] == "optimal"
    gap_text = "unknown (no bound reported)" if gap is None else f"{gap:.3g}"
    ratio_note = ""
    if not proven and doc["ratio"] is not None:
        ratio_note = "; not proven: the optimum may be higher"
        if doc["ratio_bound"] is not None:
            ratio_note = f"; not proven: the true ratio is at most {fmt(doc['ratio_bound'], 4)}"
    first = "offline optimum " if proven else "offline best    "
    found = "" if proven else ", not proven optimal"
    certified = _certified(doc, proven)
    small = ""
    if doc["largest_job_share"] is not None:
        small = (
            f"; here one job can take {100 * doc['largest_job_share']:.3g}% of the "
            f"cluster's {doc['largest_job_share_resource']}"
        )
    of_n = counted(n, "job")
    lines = [
        f"{first} {fmt(doc['optimum'], 6)}  ({admitted_off} of {of_n} admitted{found})",
        f"online utility   {fmt(doc['online'], 6)}  ({admitted_on} of {of_n} admitted)",
        f"ratio            {fmt(doc['ratio'], 4)}  (optimum / online{ratio_note})",
        f"certified        {certified}",
        f"bound            {fmt(doc['bound'], 6)}: {doc['bound_source']}",
        f"method           {doc['method']}; allocation: {doc['allocation_source']}",
        f"solver           {_SOLVER_LABEL[doc['solver']]}: {doc['status']}, gap {gap_text}, "
        f"bound {fmt(doc['bound'], 6)}, {doc['solve_seconds']:.2f} s "
        f"({doc['variables']} variables, {doc['constraints']} constraints)",
        f"Theorem 4        worst-case ratio 2*alpha = {fmt(doc['theorem4_ratio_bound'], 4)} "
        f"(assumes small jobs, each worker's and PS's demand far below a server's "
        f"capacity{small})",
    ]
    print("\n".join(lines), file=out)


def _certified(doc: dict[str, Any], proven: bool) -> str:
    """The text's ``certified`` line. With nothing to earn (no job, or none that can
    finish before the horizon) it said "no bound" beside "bound 0", or "online >= 0% of
    the optimum" of a proven optimum of 0 (the bound's float margin, 1e-9, above it)."""
    share, bound = doc["online_share_certified"], doc["bound"]
    if proven and doc["optimum"] == 0 and doc["online"] == 0:
        return "online = the optimum, 0: no allocation earns anything (proven)"
    if share is not None:
        return f"online >= {100 * share:.3g}% of the optimum (online / bound)"
    if bound is None:
        return "no bound"
    return f"online >= the bound, {fmt(bound, 6)}: it reaches the optimum"


def _from_store(
    args: argparse.Namespace, progress: Any
) -> tuple[Trace, Held | None, list[OnlineJob], list[Schedule | None], tuple[str, ...]]:
    """The stored decisions as an offline problem (controller/history.py)."""
    url = store_url(args.store, "--store")
    check_store_url(url)
    try:
        db = Database(url)
    except SQLAlchemyError as err:
        raise InputError(f"--store: not a usable database URL: {err}") from err
    try:
        history = load_history(db, args.first, args.last)
    except (HistoryError, SpecError) as err:  # a row, or what the jobs make of the bounds
        raise InputError(f"--store: {err}") from err
    except (StoreUnavailableError, SQLAlchemyError) as err:
        # e.g. a file that is no daemon's store has no tables
        raise unreadable_store(err) from err
    finally:
        db.dispose()
    for note in history.notes:  # what the numbers mean: shown even with --no-progress
        print(f"oasis offline: note: {note}", file=sys.stderr, flush=True)
    start = _startable(history, progress)
    return history.trace, history.held, history.online, start, history.notes


def _startable(history: History, progress: Any) -> list[Schedule | None]:
    """The daemon's schedules that make a feasible start for the solver (SPEC 3-5), the
    others None. A job its agents finished early, or one that failed, holds fewer
    worker-slots than its work W in the store; given as part of the start it broke SPEC 4
    and the whole comparison was refused ("the starting allocation breaks SPEC 3-5") on
    any stretch where a job was done early. Such jobs are left out of the start (their
    online utility still counts as controller/history.py says: a completed job's as
    recorded, a failed job's as 0); if what is left still breaks
    the rules (plans stored before the servers shrank), the solver starts from nothing."""
    trace, schedules = history.trace, list(history.schedules)
    short = [
        i
        for i, (job, s) in enumerate(zip(trace.jobs, schedules, strict=True))
        if s is not None and s.work() < job.work
    ]
    for i in short:
        schedules[i] = None
    if short:
        progress(
            "admitted jobs holding fewer worker-slots than their work in the store (done "
            f"early, or failed): {len(short)}, left out of the solver's start"
        )
    problems = check_schedules(trace, history.held, schedules)
    if problems:
        progress(
            f"the daemon's allocation breaks SPEC 3-5 on these servers ({problems[0]}): "
            "the solver starts from nothing"
        )
        return [None] * len(schedules)
    return schedules


def _from_trace(
    args: argparse.Namespace, progress: Any
) -> tuple[Trace, Held | None, list[OnlineJob], list[Schedule | None]]:
    """Replay the trace with the online algorithm."""
    trace = load_trace(args.trace)
    check_total_utility(args.trace, trace)  # the optimum and bound sum every job's
    total = len(trace.jobs)
    progress(f"replaying {counted(total, 'job')} with the online algorithm...")
    steps, mb = search_limits(args)
    records = []
    shown = time.monotonic()
    # a line every REPLAY_PROGRESS_SECONDS, as `oasis replay` says: 5,000 jobs of a week
    # were 35 s without a word after this one, 125,000 jobs two minutes
    for i, record in enumerate(replay(trace, max_search_steps=steps, max_search_mb=mb), 1):
        records.append(record)
        if time.monotonic() - shown >= REPLAY_PROGRESS_SECONDS:
            shown = time.monotonic()
            progress(f"replaying: decided {i:,} of {total:,} jobs")
    online = [
        OnlineJob(
            r.decision.job.id,
            r.decision.admitted,
            r.decision.best.jct if r.decision.admitted else None,
            r.decision.best.utility if r.decision.admitted else None,
        )
        for r in records
    ]
    schedules = [r.decision.best.schedule if r.decision.admitted else None for r in records]
    return trace, None, online, schedules


REPLAY_PROGRESS_SECONDS = 10.0
"""Seconds between two progress lines of the online replay before the solve."""


MAX_ILP_VARIABLES = 2_000_000
"""The largest compact ILP ``--method ilp`` builds (:data:`ILP_BYTES_PER_VARIABLE` each)."""

ILP_BYTES_PER_VARIABLE = 4096
"""Peak memory of ``--method ilp`` per variable of :func:`ilp_size`, rounded up: 0.92 GB
over the replay's for 246,665 and 2.46 GB for 673,359 (3.7 KB each: PuLP's model, its
copy handed to HiGHS, HiGHS's own), measured on 168-slot traces of 10 + 10 servers."""


INTERRUPT_GRACE_SECONDS = 2.0
"""How long Ctrl-C waits for the solver to take it before the process ends at once."""


@contextlib.contextmanager
def _interrupts(noted: list[int]) -> Iterator[None]:
    """Within: SIGINT (Ctrl-C) raises KeyboardInterrupt as before (SIGTERM
    :class:`~controller.commands.common.Terminated`), and is also noted in ``noted``.
    HiGHS runs Python callbacks during its solve; one interrupted there ends the solve
    as a "solve error" and the exception is lost, so the run then
    read as a wrong proof ("an allocation ... beats the solver's bound -0", the CLI
    audit). Off the main thread: nothing is changed.

    In the rounding's MIP HiGHS calls back seldom (3 times in 15 s, measured), and
    Python runs a signal's handler only between its own instructions: Ctrl-C took
    effect 5-18 s late (up to 0.3 of ``--time-limit``). So a watcher thread also reads
    the signal from Python's wakeup file descriptor (written by its C-level handler at
    once, whatever thread the signal reaches) and, if the solver has not let go
    within :data:`INTERRUPT_GRACE_SECONDS`, ends the process at once, status 130 (the
    command writes nothing until the solve is over; the certified bound reached so
    far is in the progress lines)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: Any) -> None:
        noted.append(signum)
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    done = threading.Event()
    readable, writable = os.pipe()
    os.set_blocking(writable, False)

    def watch() -> None:
        while not done.is_set():
            got = os.read(readable, 64)  # signal numbers, one byte each
            if done.is_set() or not got or not {signal.SIGINT, signal.SIGTERM} & set(got):
                continue
            if done.wait(INTERRUPT_GRACE_SECONDS):
                return
            term = signal.SIGTERM in got
            print(f"oasis offline: {'terminated' if term else 'interrupted'}", file=sys.stderr,
                  flush=True)  # fmt: skip
            os._exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED)

    previous = signal.signal(signal.SIGINT, on_signal)
    previous_term = signal.signal(signal.SIGTERM, on_signal)
    previous_fd = signal.set_wakeup_fd(writable, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous_fd)
        os.write(writable, b"\0")  # ends the watcher's read
        watcher.join()
        os.close(readable)
        os.close(writable)
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


def run(args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        if args.progress:
            print(message, file=sys.stderr, flush=True)

    if (args.trace is None) == (args.store is None):
        raise InputError("give either a TRACE or --store STORE")
    if args.store is None and (args.first is not None or args.last is not None):
        raise InputError("--from and --to select slots of a --store")
    if args.store is not None:
        progress("reading the store...")
        trace, held, online_jobs, online, notes = _from_store(args, progress)
        progress(
            f"{counted(len(trace.jobs), 'job')} compared over {counted(trace.horizon, 'slot')}; "
            f"the daemon admitted {sum(j.admitted for j in online_jobs)}"
        )
    else:
        trace, held, online_jobs, online = _from_trace(args, progress)
        notes = ()
    if args.method == "ilp":
        size = ilp_size(trace, held if held is not None else Held.nothing(trace))
        if size > MAX_ILP_VARIABLES:
            raise InputError(
                f"--method ilp: the compact ILP has {size:,} variables, over "
                f"{MAX_ILP_VARIABLES:,}: building it alone takes gigabytes and minutes, "
                "before any time limit counts (4.3 million took 2.6 GB, then failed). Use "
                "--method auto (column generation: a certified bound and an allocation at "
                "any size)"
            )
        need, memory, share = size * ILP_BYTES_PER_VARIABLE, machine_memory(), common.MEMORY_SHARE
        if memory and need > share * memory:
            raise InputError(
                f"--method ilp: the compact ILP has {size:,} variables, which take about "
                f"{need / 2**30:,.1f} GiB to build and solve, more than {share:.0%} "
                f"of this machine's {memory / 2**30:,.1f} GiB of memory. Use --method auto "
                "(column generation: a certified bound and an allocation at any size)"
            )
        progress(f"building the ILP of {size:,} variables (and a running sum per u)...")
    # the online allocation is feasible offline: given as the start (HiGHS begins from
    # it, column generation takes its schedules as columns, the result is never worse),
    # the reported allocation is at least the online utility even when cut short
    interrupted: list[int] = []
    try:
        with quiet_native_stdout(), _interrupts(interrupted):
            result = solve(
                trace,
                method=args.method,
                solver=args.solver,
                time_limit=args.time_limit,
                threads=args.threads,
                start=None if args.cold else online,
                progress=progress,
                held=held,
            )
    except (OfflineError, ColumnGenerationError) as err:
        if interrupted:  # the solver's failure was Ctrl-C's: say that (cli.py: 130)
            raise (Terminated if signal.SIGTERM in interrupted else KeyboardInterrupt) from err
        print(f"oasis offline: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except MemoryError:
        print("oasis offline: out of memory building or solving the model: use --method "
              "auto, or compare fewer slots (--from/--to with --store)",
              file=sys.stderr)  # fmt: skip
        return EXIT_FAILURE
    progress(f"finished in {result.solve_seconds:.2f} s ({result.method}): {result.status}")
    if result.solve_seconds > 1.1 * args.time_limit + 0.01:
        # the user asked for less: say why rather than leave a limit seemingly ignored
        progress(f"  past --time-limit {args.time_limit:g} s: a certified bound and a first "
                 "allocation are made however short it is")  # fmt: skip
    doc = offline_json(result, online_jobs, theorem4_bound(trace), largest_job_share(trace), notes)
    if args.json:
        print(json_document(doc))  # one write (controller/terminal.py)
    else:
        _text(doc, result.gap, sys.stdout)
    # admitting nothing is always feasible: an infeasible verdict is a solver failure
    return EXIT_FAILURE if result.status == "infeasible" else EXIT_OK
