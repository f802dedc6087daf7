"""The solvers of the offline optimum's ILP (:mod:`pricing.offline_model`): HiGHS and
CBC through PuLP, how each is set up and run, and how its verdict is read.

Solvers, status and gap
    - HiGHS (through highspy, ``pulp.HiGHS``), without its MIP presolve, which returned
      wrong "optimal" answers on this model (see ``_solver``). Status, incumbent and the
      dual bound are read from the ``highspy.Highs`` object PuLP keeps. A given start
      allocation is handed to it as its first incumbent. While it searches, its
      incumbent and bound are reported every :data:`PROGRESS_SECONDS` (``report``).
    - CBC (the binary PuLP bundles, ``pulp.COIN_CMD``). PuLP reports only "optimal",
      "stopped with an incumbent" or "infeasible"; CBC's own log tells a time limit from
      infeasibility, and CBC's bound does not come back, so a stopped CBC solve has status
      ``"feasible"`` and gap None. It gets no start (its MIP start crashed it here).
    Both run with a relative gap tolerance of 0 and an absolute one of ``ABS_GAP``.
    "optimal" means proven; the gap is 0.0 only then (:func:`status_and_gap`).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pricing.offline_model import OfflineError, _Model, _pulp

__all__ = [
    "ABS_GAP",
    "INTERRUPT_MARGIN_SECONDS",
    "PROGRESS_SECONDS",
    "SYMMETRY_MAX_COLUMNS",
    "Report",
    "SolverName",
    "Status",
    "status_and_gap",
    "within_tolerance",
]

SolverName = Literal["highs", "cbc"]
Status = Literal["optimal", "feasible", "infeasible", "no solution"]

ABS_GAP = 1e-6
"""Utility by which the optimum may fall short of the bound and still count as proven,
times the optimum's magnitude when it is over 1 (:func:`within_tolerance`): both
solvers run with a relative gap tolerance of 0 and this absolute one."""

SYMMETRY_MAX_COLUMNS = 100_000
"""HiGHS looks for symmetry (identical servers) in a model of at most this many columns:
its search checks no time limit, and in one of 160,000 (a horizon of 20,000 slots) it
ran for minutes past a limit of 10 s."""

INTERRUPT_MARGIN_SECONDS = 1.0
"""Past its time limit, HiGHS is interrupted from its callbacks after this long more
(its own limit, where it checks it, ends it first)."""

PROGRESS_SECONDS = 10.0
"""Seconds between two reports of a HiGHS branch and bound's incumbent and bound: before,
nothing was said between "solving ILP ..." and its end (``--method ilp --time-limit
600``: ten silent minutes, and Ctrl-C left no bound on the screen)."""

Report = Callable[[float | None, float | None, float], None]
"""Called with the solver's incumbent utility and upper bound (None: none yet), in the
model's units, and the seconds it has run."""


@dataclass(frozen=True)
class _Verdict:
    """What the solver says, before the incumbent is checked.

    Attributes:
        proven: the solver proved its incumbent optimal (within ``ABS_GAP``).
        incumbent: it holds an integer-feasible allocation.
        infeasible: it claims no allocation exists.
        bound: its best upper bound on the optimum, if it reports one.
    """

    proven: bool
    incumbent: bool
    infeasible: bool
    bound: float | None


def _highs(warm: bool, time_limit: float | None, report: Report | None = None) -> Any:
    """``pulp.HiGHS`` that, with ``warm``, hands HiGHS the variables' current values as a
    starting solution (PuLP's HiGHS API class has no warm start of its own), and with a
    ``time_limit`` also interrupts it from its simplex, interior-point and MIP callbacks
    once that many seconds (and a margin) have passed: HiGHS's own limit went unchecked
    in the root LP of a model of 220,000 rows (a horizon of 20,000 slots), which ran for
    minutes past a limit of 10 s. With ``report``, its MIP callback also reports the
    incumbent and bound every :data:`PROGRESS_SECONDS`."""
    import highspy

    class HiGHSBounded(_pulp().HiGHS):  # type: ignore[misc]
        def callSolver(self, lp: Any) -> None:  # noqa: N802 - PuLP's name
            model = lp.solverModel
            if model.getNumCol() > SYMMETRY_MAX_COLUMNS:
                model.setOptionValue("mip_detect_symmetry", False)
            if warm:
                cols = lp.variables()
                index = np.array([v.index for v in cols], dtype=np.int32)
                value = np.array([float(v.varValue or 0.0) for v in cols])
                if model.setSolution(len(cols), index, value) == highspy.HighsStatus.kError:
                    raise OfflineError("HiGHS rejected the starting allocation")
            if time_limit is not None or report is not None:
                began = time.monotonic()
                deadline = began + (math.inf if time_limit is None else time_limit)
                deadline += INTERRUPT_MARGIN_SECONDS
                due = [began + PROGRESS_SECONDS]
                mip = int(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)

                def interrupt(kind: int, message: str, out: Any, into: Any, data: Any) -> None:
                    now = time.monotonic()
                    if now > deadline:
                        into.user_interrupt = True
                    if report is not None and int(kind) == mip and now >= due[0]:
                        due[0] = now + PROGRESS_SECONDS
                        # PuLP hands HiGHS the minimisation of -objective
                        report(_negated(out.mip_primal_bound), _negated(out.mip_dual_bound),
                               now - began)  # fmt: skip

                model.setCallback(interrupt, None)
                kinds = highspy.cb.HighsCallbackType
                for kind in (kinds.kCallbackSimplexInterrupt, kinds.kCallbackIpmInterrupt,
                             kinds.kCallbackMipInterrupt):  # fmt: skip
                    model.startCallback(kind)
            super().callSolver(lp)

    return HiGHSBounded


def _negated(x: float) -> float | None:
    return -float(x) if math.isfinite(x) else None


def _solver(
    name: SolverName,
    time_limit: float | None,
    threads: int | None,
    warm: bool,
    log_path: str | None = None,
    report: Report | None = None,
) -> Any:
    """A configured PuLP solver: relative gap 0, absolute gap ``ABS_GAP``, quiet; with
    ``warm``, it starts from the variables' current values; CBC writes its log to
    ``log_path``; HiGHS calls ``report`` as it searches (CBC cannot)."""
    pulp = _pulp()

    if name == "highs":
        # HiGHS's MIP presolve (1.15.1, the newest available here) returns wrong
        # "optimal" answers on this model: 4 of 150 random tiny traces in a check against
        # exhaustive search (CBC and HiGHS without presolve: 0). Similar reports upstream:
        # ERGO-Code/HiGHS issues 3043, 3073, 3094, 3274. Branch and bound stays on.
        solver = _highs(warm, time_limit, report)(
            msg=False,
            timeLimit=time_limit,
            threads=threads,
            gapRel=0.0,
            gapAbs=ABS_GAP,
            presolve="off",
        )
    elif name == "cbc":
        # PULP_CBC_CMD is deprecated; COIN_CMD runs the same CBC binary PuLP bundles
        # when no ``cbc`` is on PATH.
        options = {
            "msg": False,
            "timeLimit": time_limit,
            "threads": threads,
            "gapRel": 0.0,
            "gapAbs": ABS_GAP,
            "warmStart": warm,
            "logPath": log_path,
        }
        solver = pulp.COIN_CMD(**options)
        if not solver.available():
            solver = pulp.COIN_CMD(path=pulp.PULP_CBC_CMD.pulp_cbc_path, **options)
    else:
        raise OfflineError(f"unknown solver {name!r} (known: highs, cbc)")
    if not solver.available():
        raise OfflineError(f"solver {name!r} is not available in this environment")
    return solver


def _highs_threads() -> None:
    """Let the next HiGHS run take its own ``threads`` option.

    HiGHS keeps a scheduler per thread, sized by the thread's first run; a later run in
    that thread asking another thread count does not run at all ("already been
    initialized"), and its status was read as no solution with bound 0 (an audit:
    ``oasis offline --threads 1`` after column generation's LPs). Resetting it
    (blocking) lets the next run size it again; other threads' runs are not disturbed
    (checked by the session's review)."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)


def _highs_verdict(prob: Any) -> _Verdict:
    """Read HiGHS's model status and bound from the ``highspy.Highs`` PuLP kept.

    Raises:
        OfflineError: HiGHS did not run (its model status is still "not set")."""
    import highspy

    h = prob.solverModel
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kNotset:
        raise OfflineError("the highs solver did not run (its model status is not set)")
    info = h.getInfo()
    incumbent = int(info.primal_solution_status) == int(
        highspy.SolutionStatus.kSolutionStatusFeasible
    )
    # PuLP hands HiGHS the minimisation of -objective: its dual bound is -(our bound)
    dual = float(info.mip_dual_bound)
    bound = -dual if math.isfinite(dual) else None
    return _Verdict(
        proven=status == highspy.HighsModelStatus.kOptimal and incumbent,
        incumbent=incumbent,
        infeasible=status == highspy.HighsModelStatus.kInfeasible,
        bound=bound,
    )


def _cbc_verdict(prob: Any, log: str) -> _Verdict:
    """Read CBC's verdict as PuLP reports it; PuLP does not return CBC's bound.

    CBC stopped by the time limit before it found an integer solution writes "Integer
    infeasible", which PuLP reports as infeasible; its log's "Result - Stopped on time"
    line tells the two apart. An unreadable log leaves no incumbent and no verdict,
    never "infeasible": admitting nothing is always feasible.
    """
    pulp = _pulp()

    proven = prob.sol_status == pulp.LpSolutionOptimal
    # stopped inside the root LP, CBC writes "Stopped on iterations - objective value"
    # and the LP's fractional values, which PuLP reports as an integer solution; only a
    # branch and bound that ran (its "Result - " line) holds a real one
    searched = "Result - " in log
    incumbent = searched and (proven or prob.sol_status == pulp.LpSolutionIntegerFeasible)
    finished = searched and "Result - Stopped" not in log
    return _Verdict(
        proven=proven and searched,
        incumbent=incumbent,
        infeasible=prob.status == pulp.LpStatusInfeasible and finished,
        bound=None,
    )


def _run(
    model: _Model,
    solver: SolverName,
    time_limit: float | None,
    threads: int | None,
    warm: bool,
    report: Report | None = None,
) -> _Verdict:
    """Solve the model in place and read the solver's verdict; HiGHS calls ``report``
    as it searches."""
    pulp = _pulp()
    # CBC's files only: HiGHS runs in this process, whose Ctrl-C may end it with
    # os._exit (controller/commands/offline.py), which left the folder behind
    folder: contextlib.AbstractContextManager[str] = (
        tempfile.TemporaryDirectory(prefix="oasis-offline-")
        if solver == "cbc"
        else contextlib.nullcontext("")
    )
    with folder as tmp:
        log_path = str(Path(tmp) / "cbc.log") if solver == "cbc" else None
        engine = _solver(solver, time_limit, threads, warm, log_path, report)
        if solver == "cbc":
            engine.tmpDir = tmp  # PuLP leaves its model files behind when CBC fails
        if solver == "highs" and threads is not None:
            _highs_threads()
        try:
            model.prob.solve(engine)
        except pulp.PulpSolverError as err:
            raise OfflineError(f"the {solver} solver failed: {err}") from err
        except (ArithmeticError, LookupError, ValueError) as err:  # PuLP reading a failed
            # solve back (an objective past 1e20, which HiGHS takes as infinite, did so
            # before the utilities were put in the solvers' units: pricing/offline_units.py)
            raise OfflineError(
                f"the {solver} solver failed ({type(err).__name__}: {str(err)[:200]}); "
                "its numbers may be past what it represents"
            ) from err
        except BaseException:  # Ctrl-C: PuLP stops waiting, CBC would run on
            if solver == "cbc":
                _end_cbc(tmp)
            raise
        if solver == "highs":
            return _highs_verdict(model.prob)
        assert log_path is not None
        log = Path(log_path).read_text(errors="replace") if Path(log_path).exists() else ""
        return _cbc_verdict(model.prob, log)


def _end_cbc(folder: str) -> None:
    """Kill the CBC process this process started on the model files in ``folder``.

    Interrupted (``kill -INT`` of oasis alone, ``timeout -s INT``), PuLP stops waiting
    for CBC and leaves it running: after ``oasis offline --solver cbc`` had exited
    with 130, CBC ran on to its time limit, a core busy and its files written into a
    folder already removed. Children are found in ``/proc`` (Linux; elsewhere
    nothing is done): ours, with ``folder`` in the command line."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        after = stat[stat.rfind(b")") + 2 :].split()  # past the name, which may hold ")"
        if len(after) > 1 and int(after[1]) == me and folder.encode() in command:
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(pid, signal.SIGKILL)


def within_tolerance(optimum: float, bound: float) -> bool:
    """Whether ``bound`` is within ``ABS_GAP * max(1, |optimum|)`` above ``optimum``."""
    return bound - optimum <= ABS_GAP * max(1.0, abs(optimum))


def status_and_gap(
    verdict_proven: bool,
    verdict_infeasible: bool,
    optimum: float | None,
    bound: float | None,
) -> tuple[Status, float | None, float | None]:
    """``(status, gap, bound)`` from the solver's verdict and the checked incumbent.

    Optimal only when proven: by the solver, or by a reported bound within
    :func:`within_tolerance` of the optimum (a bound below the optimum by float noise is
    raised to it). The tolerance is relative past 1: column generation's certified bound
    carries a margin of ``1e-9`` of the magnitudes summed, so an allocation reaching the
    bound of 300 jobs worth 8210.32 in all was 8.3e-6 short and "not proven". A proven
    optimum without a reported bound is its own bound. Otherwise the gap is
    ``(bound - optimum) / optimum``, or None without a bound.
    """
    if optimum is None:
        return ("infeasible" if verdict_infeasible else "no solution"), None, bound
    if bound is not None and within_tolerance(optimum, bound):
        return "optimal", 0.0, max(bound, optimum)
    if verdict_proven:
        return "optimal", 0.0, optimum if bound is None else bound
    if bound is None:
        return "feasible", None, None
    gap = (bound - optimum) / abs(optimum) if optimum != 0 else math.inf
    return "feasible", gap, bound
