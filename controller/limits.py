"""Limits that keep one client or one job from stalling the daemon (``[limits]``).

- ``max_message_bytes``: the largest request the gRPC server reads; a larger one is
  refused by gRPC itself with RESOURCE_EXHAUSTED.
- ``max_job_work`` (worker-slots ``W``) and ``max_job_chunks`` (``N``): a job above
  either is refused with INVALID_ARGUMENT naming the limit.
- ``max_search_steps`` and ``max_search_mb``: the budget of one best-schedule search
  (:mod:`pricing.best_schedule`). Its DP runs over up to ``T`` slots (the window); in
  each it tries every worker count ``y`` up to ``Y`` (the most that fit in one slot of
  the empty cluster, at most ``N``) against every work level up to ``W``, and keeps a
  ``(T, W + 1)`` and a ``(T, N + 1)`` table of float64. So a search takes at most
  ``T * Y * (W + 1)`` steps and ``8 T (W + N + 2)`` bytes; a job whose bound exceeds
  the budget is refused before the search starts, with the numbers. Measured by
  ``bench/search_budget.py`` (``bench/RESULTS.md``): 0.3 ns per step for the kernel
  alone on an idle 2-core machine, 1.3-2 ns with the cores shared, and the whole
  ``best_schedule`` call up to twice the kernel; the default ``3e8`` keeps a decision
  under a second there (the former ``2e9`` took 1.4-4 s). The largest job of the
  paper-scale workload needs 1.3e8. It may be at most :data:`MAX_TURN_STEPS` (1e10), as
  may the budgets of one turn below (``pending_steps_per_boundary``,
  ``replan_steps_per_review``).
- ``max_wait_seconds``: the longest wait a submission may ask for (``--wait``), at most
  :data:`MAX_WAIT_SECONDS` (100 years);
  ``max_pending_per_submitter`` and ``max_pending``: how many jobs one submitter, and all
  together, may have ``pending`` at once. Each pending job is searched again at every slot
  boundary, so these bound the work of a boundary, and one tenant cannot fill the queue: a
  submission that would go over fails with RESOURCE_EXHAUSTED (nothing is committed; it may
  be retried). Without ``[auth]`` every caller is one submitter. Unless given,
  ``max_pending_per_submitter`` is a tenth of ``max_pending`` (at most 100, at least 1),
  so a smaller queue keeps its submitters' shares.
- ``pending_steps_per_submitter``: the search steps (each search's bound
  ``T * Y * (W + 1)``, as ``max_search_steps`` counts them) one submitter's pending jobs
  may take at one slot boundary. The pending jobs are decided again in one step of the
  decision thread, before any newcomer, so without this one submitter's queue (up to
  ``max_pending_per_submitter`` jobs, each up to ``max_search_steps``) would hold every
  other tenant's calls for all of its searches at every boundary. A submitter's jobs are
  decided in turn until the next would take its steps past the budget (its first always
  runs); the rest stay pending, untouched, and go first at the next boundary (the least
  recently decided first), so none starves. Expiries that need no search (a wait that
  ended, a job that can no longer pay off) are not charged. The default ``3e8``, one
  search of the largest job ``max_search_steps`` allows, holds a boundary for one
  submitter's queue about as long as one of its largest decisions (see above).
- ``pending_steps_per_boundary``: the same, for all submitters' pending jobs together at
  one boundary. Per submitter alone, a boundary with many submitters' queues would hold
  every tenant's calls for the sum of their budgets (by the searches' bounds, 50
  submitters: 50 of the largest decisions). Past it (the first search of the boundary
  always runs), the jobs not reached stay pending, untouched, and go first at the next
  boundary as above. The
  default ``1.5e9``, five submitters' budgets, leaves a queue of a few submitters as it
  was.
- ``replan_steps_per_submitter`` and ``replan_steps_per_review``: the same for slow
  jobs' re-plans (the execution plane re-plans a job its agents report slower than
  planned, in the decision thread): the search steps one submitter's re-plans may take
  in a slot (3e9), and all re-plans of one review of reported progress together (3e8;
  :mod:`controller.plane.replan_turns`).
- ``rate`` and ``burst``: requests per second per client, a token bucket each (0: no
  limit). A client is its token's name when ``[auth]`` is on, else its address. Over the
  rate, a call fails with RESOURCE_EXHAUSTED, the seconds to wait in the message and in
  the ``grpc-retry-pushback-ms`` trailer (gRPC's retry-throttling hint, gRFC A6).
  A submit or quote is charged by its search's cost too: one more token per
  ``search_steps_per_token`` steps of its bound ``T * Y * (W + 1)``, taken after the
  token of the call (the bucket may go below zero: the client's next calls wait until
  it refills), so a client's expensive searches count against its rate as they cost.
- ``max_in_flight``: a client with that many calls waiting for (or in) the decision
  thread gets RESOURCE_EXHAUSTED for more. The thread serves waiting clients in turn,
  round-robin, so one client's burst delays another's call by one of its decisions.

- ``max_spec_bytes`` and ``max_table_points``: a job spec larger than ``max_spec_bytes``
  as canonical JSON, or a table utility with more than ``max_table_points`` values, is
  refused with INVALID_ARGUMENT naming the field, before it is queued for a decision (a
  stored spec is returned by every read of the job, so its size bounds theirs).
  ``max_spec_bytes`` may be at most :data:`MAX_SPEC_BYTES` (2 MiB).
- ``max_utility``: the most a job may be worth, its best utility ``f(d_min)`` (what the
  price-bound estimate takes in, and the most any schedule of it earns; a sigmoid's is
  just under its ``priority``). A job above it is refused with INVALID_ARGUMENT naming
  the utility's field (``job.utility.priority``, ``.values`` or ``.value``) and the cap.
  The default ``1e9`` is ten million times the largest priority ``oasis gen`` draws (100);
  0 turns the cap off. The estimate is robust without it (one job moves the bounds by at
  most ``e^0.1``), but a cap makes a typo of a few extra zeros an error, not a job that
  outbids everyone. ``max_utility_by_submitter`` (a table, ``{token name: cap}``) puts
  a submitter's own cap in its place: the median of the submitters' estimates keeps a
  tenant whose priorities run high from moving the prices
  (:mod:`pricing.shared_estimate`), not from outbidding others for capacity.
- ``max_ledger_mb``: the most memory the price ledger may take, MiB. It holds amounts and
  prices per server, resource and slot of the window, about ``16 R + 1`` bytes per server
  and slot (:func:`pricing.ledger.ledger_bytes`; 81 with five resources), and a rebuild
  holds two for a moment. A config whose ``daemon.window`` and cluster need more is
  refused at start-up with the numbers, instead of a daemon the kernel kills when the
  pages are first touched. The default 8192 allows 10,000 servers over 10,000 slots.
- ``max_stored_mb_per_day``: the most bytes of job specs one submitter (every caller
  together without ``[auth]``) may have stored in a day, MiB; past it its new jobs are
  refused with RESOURCE_EXHAUSTED and nothing is stored
  (:mod:`controller.admission.stored_budget`). Every submission is stored, a rejected one
  too, so one tenant's stream of large rejected specs filled the disk every tenant's
  submissions need (28 GB a day within the example's rate). The default 1024 is some
  two million jobs of a typical spec (300-500 bytes) a day; 0 turns it off.
- ``max_page_jobs`` and ``max_page_bytes``: the most jobs, and about the most bytes of
  them, one ``ListJobs`` answer holds; the rest follow on later pages (``page_token``).
  ``max_page_bytes`` also ends a page of ``GetPrices`` asked with ``page_size``
  (:mod:`controller.admission.price_pages`). They may be at most :data:`MAX_PAGE_JOBS`
  (1,000) and :data:`MAX_PAGE_BYTES` (8 MiB).

Job ids are checked here too, whatever the limits: 1-128 characters of
``A-Z a-z 0-9 . _ -`` (SPEC 3). An id names the job's MQTT topic
(``<prefix>/v1/jobs/<id>/events``), where ``/``, ``+``, ``#`` or NUL would change or
break the topic, and fits the store's 200-character column.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from controller.plane.worker_room import worker_room_problem
from pricing import fields
from pricing.cluster import Cluster
from pricing.errors import Problem, SpecError, check_all
from pricing.job import Job, max_workers_per_slot
from pricing.utility import Deadline, Sigmoid, Table

__all__ = [
    "DEFAULT_MAX_UTILITY",
    "MAX_JOB_ID_CHARS",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_JOBS",
    "MAX_SPEC_BYTES",
    "MAX_TURN_STEPS",
    "MAX_WAIT_SECONDS",
    "JobTooLargeError",
    "Limits",
    "RateLimiter",
    "SearchSize",
    "check_job_id",
    "check_job_key",
    "limits_from_dict",
    "machine_mb",
    "search_size",
]

MAX_JOB_ID_CHARS = fields.MAX_JOB_ID_CHARS
"""The longest job id (SPEC 3); the store's ``jobs.id`` column is ``VARCHAR(200)``."""

_KEYS = {
    "max_message_bytes",
    "max_job_work",
    "max_job_chunks",
    "max_search_steps",
    "max_search_mb",
    "rate",
    "burst",
    "max_wait_seconds",
    "max_pending_per_submitter",
    "max_pending",
    "pending_steps_per_submitter",
    "pending_steps_per_boundary",
    "replan_steps_per_submitter",
    "replan_steps_per_review",
    "max_spec_bytes",
    "max_table_points",
    "max_page_jobs",
    "max_page_bytes",
    "max_in_flight",
    "search_steps_per_token",
    "max_utility",
    "max_utility_by_submitter",
    "max_ledger_mb",
    "max_stored_mb_per_day",
}


MAX_GRPC_MESSAGE_BYTES = 2**31 - 1
"""The largest ``limits.max_message_bytes``: gRPC takes its message limits as a C int."""

MAX_TURN_STEPS = 1e10
"""The largest ``limits.max_search_steps``, ``pending_steps_per_boundary`` and
``replan_steps_per_review``: the search steps one turn of the decision thread may take,
while every tenant's calls wait. A whole decision took 3.2 ns a step with the machine's two
cores shared (``bench/RESULTS.md``: 2e9 steps in 6.3 s), so 1e10 is about 30 s, the
time a stop waits for the decisions in flight (``controller.daemon.DRAIN_SECONDS``);
past it a decision is cut off there. Before, ``max_search_steps = 1e15`` was taken as
it was: one tenant's job could hold the thread for a month."""

MAX_WAIT_SECONDS = 36525 * 86400.0
"""The largest ``limits.max_wait_seconds``, 100 years: a pending job's last slot is
stored in a 64-bit column, and one slot is 1 s at least. Before, ``max_wait_seconds =
1e300`` was taken, and a submission asking that long a wait made a slot number of 297
digits: its commit failed (``OverflowError: Python int too large to convert to SQLite
INTEGER``), and a failed batch fails every decision in it, other tenants' too
(:mod:`controller.admission.writer`)."""

DEFAULT_MAX_UTILITY = 1e9
"""``limits.max_utility`` unless the config sets it: far above ``oasis gen``'s 1-100."""

_UTILITY_FIELD = {Sigmoid: "priority", Table: "values", Deadline: "value"}
"""The field of each kind of utility that sets its scale (named when over the cap)."""


MAX_RETRY_HINT_SECONDS = 1e12
"""The longest wait a refusal over the rate names (about 31,700 years): the hint of a
bucket so far below zero that its wait is infinite."""

MAX_SPEC_BYTES = 2 * 2**20
"""The largest ``limits.max_spec_bytes``: half of what the store reads back of a spec
(``controller.store.stored.MAX_STORED_SPEC``, 4 Mi characters; a job's key adds to its
id), as an answer carries a spec twice (its fields and its JSON). Before,
``max_spec_bytes = 1e8`` was taken: a spec of 4,454,580 characters (a table utility of
450,000 points, ``max_table_points`` and ``max_message_bytes`` raised too) was admitted
and stored, every read of it showed ``{"id": ...}`` alone, and at the next start the job
failed, its plan dropped ("4454600 characters, over 4194304")."""

MAX_PAGE_JOBS = 1000
"""The largest ``limits.max_page_jobs``: a page's job rows and their plans are read
whole from the store (``max_page_jobs + 1`` rows) before the page is cut at
``max_page_bytes``, so each ``ListJobs`` of every tenant read that many. Before,
``max_page_jobs = 1e6`` was taken: one ``oasis jobs`` read every stored job (up to 64
KiB of spec each) and every plan, in the store-read pool, at every call."""

MAX_PAGE_BYTES = 8 * 2**20
"""The largest ``limits.max_page_bytes``: half the largest message the daemon sends
(``controller.tls.MAX_RESPONSE_BYTES``, 16 MiB), as a page ends after the job that
reaches it, and one job read back may be 4 MiB (``controller.store.stored.
MAX_STORED_SPEC``) and its plan. Before, ``max_page_bytes = 1e9`` was taken, and a
ListJobs page of five such jobs (20 MiB) failed RESOURCE_EXHAUSTED ("Sent message larger
than max") at every ``oasis jobs`` of every operator."""

SENT_FACTOR = 4
"""How much larger than ``max_spec_bytes`` a spec may be as sent (:meth:`Limits.check_sent`)."""

BYTES_PER_TOKEN = 16 * 1024
"""A spec's bytes as sent, and a submitter's answer's bytes, past the first this many cost
the client a token each this many more (on top of the call's one): reading a spec costs
the event loop about 1.5 ms each, building an answer about 10 ms."""


class JobTooLargeError(SpecError):
    """A job over a configured limit (INVALID_ARGUMENT: it is refused whatever the load)."""


@dataclass(frozen=True)
class Limits:
    """The ``[limits]`` table; see the module docstring.

    Attributes:
        max_message_bytes: largest request read, bytes.
        max_job_work: largest ``W``, worker-slots.
        max_job_chunks: largest ``N``.
        max_search_steps: largest DP bound ``T * Y * (W + 1)`` of one search.
        max_search_mb: largest DP tables of one search, MiB.
        rate: requests per second per client; 0: no limit.
        burst: requests a client may make at once (bucket size); 0: ``max(1, rate)``.
        max_wait_seconds: the longest wait of a pending job, seconds.
        max_pending_per_submitter: pending jobs of one submitter at once.
        max_pending: pending jobs at once, all submitters together.
        pending_steps_per_submitter: search steps one submitter's pending jobs may take
            at one slot boundary (the first job's always runs).
        pending_steps_per_boundary: search steps all pending jobs together may take at
            one slot boundary (the first job's always runs).
        replan_steps_per_submitter: search steps one submitter's slow jobs' re-plans may
            take in one slot (:mod:`controller.plane.replan_turns`; the first runs).
        replan_steps_per_review: search steps all re-plans of one review of reported
            progress may take together (the first runs; the rest at the next review).
        max_spec_bytes: largest job spec, bytes of canonical JSON.
        max_table_points: most values of a table utility.
        max_page_jobs: most jobs in one ``ListJobs`` page.
        max_page_bytes: a ``ListJobs`` page stops after the job that reaches this size,
            bytes (so a page holds at least one job); a paged ``GetPrices`` answer holds
            the servers whose prices fit in it (at least one).
        max_in_flight: most calls of one client waiting for the decision thread.
        search_steps_per_token: a submit or quote costs one token plus one per this many
            steps of its search bound (with ``rate`` on).
        max_utility: the largest best utility ``f(d_min)`` of a job; 0: no cap.
        max_utility_by_submitter: ``max_utility`` of named submitters (their tokens'
            names), in place of the one for everyone.
        max_ledger_mb: the largest price ledger (window x servers x resources), MiB.
        max_stored_mb_per_day: the most job spec bytes one submitter may have stored
            in a day, MiB (:mod:`controller.admission.stored_budget`); 0: no limit.
    """

    max_message_bytes: int = 1 << 20
    max_job_work: int = 100_000
    max_job_chunks: int = 10_000
    max_search_steps: float = 3e8
    max_search_mb: float = 512.0
    rate: float = 0.0
    burst: float = 0.0
    max_wait_seconds: float = 7 * 86400.0
    max_pending_per_submitter: int = 100
    max_pending: int = 1000
    pending_steps_per_submitter: float = 3e8
    pending_steps_per_boundary: float = 1.5e9
    replan_steps_per_submitter: float = 3e9
    replan_steps_per_review: float = 3e8
    max_spec_bytes: int = 64 * 1024
    max_table_points: int = 1000
    max_page_jobs: int = 100
    max_page_bytes: int = 1 << 20
    max_in_flight: int = 4
    search_steps_per_token: float = 5e7
    max_utility: float = DEFAULT_MAX_UTILITY
    max_ledger_mb: float = 8192.0
    max_stored_mb_per_day: float = 1024.0
    max_utility_by_submitter: Mapping[str, float] = field(default_factory=dict)

    def search_tokens(self, steps: float) -> float:
        """Tokens a search bounded by ``steps`` costs on top of its call's one."""
        return steps / self.search_steps_per_token

    def check_sent(self, sent_bytes: int, table_points: int) -> None:
        """Raise JobTooLargeError if a spec as sent (``sent_bytes`` of its message, a table
        utility of ``table_points``) is over the limits before it is even read: a 1 MB
        spec took 94 ms of the event loop to parse before :meth:`check_spec` refused it.
        Sent JSON may carry spaces its canonical form drops: up to
        :data:`SENT_FACTOR` times ``max_spec_bytes`` is read."""
        problems = self._table_problems(table_points)
        most = SENT_FACTOR * self.max_spec_bytes
        if sent_bytes > most:
            problems.append(Problem(
                "job", f"spec of {sent_bytes} bytes as sent exceeds {SENT_FACTOR} x "
                f"limits.max_spec_bytes = {most}"
            ))  # fmt: skip
        if problems:
            raise JobTooLargeError(problems)

    def _table_problems(self, points: int) -> list[Problem]:
        """A table utility of ``points`` values over ``max_table_points``, as a problem."""
        if points <= self.max_table_points:
            return []
        why = f"{points} points exceed limits.max_table_points = {self.max_table_points}"
        return [Problem("job.utility.values", why)]

    def check_spec(self, spec: Mapping[str, Any]) -> None:
        """Raise SpecError if the raw spec is over ``max_spec_bytes`` or its table
        utility over ``max_table_points`` (before it is parsed or queued)."""
        utility = spec.get("utility")
        values = utility.get("values") if isinstance(utility, Mapping) else None
        problems = self._table_problems(len(values) if isinstance(values, list) else 0)
        size = len(json.dumps(spec, sort_keys=True, separators=(",", ":")))
        if size > self.max_spec_bytes:
            why = f"spec of {size} bytes exceeds limits.max_spec_bytes = {self.max_spec_bytes}"
            problems.append(Problem("job", why))
        if problems:
            raise JobTooLargeError(problems)

    def check_job(
        self, job: Job, cluster: Cluster, window: int, submitter: str | None = None
    ) -> None:
        """Raise JobTooLargeError naming each limit ``job`` (of ``submitter``) is over: its
        utility, its size, its search's budget, or more of its workers on one server
        than a node agent runs (:mod:`controller.plane.worker_room`)."""
        check_all(
            lambda: self.check_utility(job, submitter),
            lambda: self.check_search(job, cluster, window),
            lambda: self.check_worker_room(job, cluster),
        )

    @staticmethod
    def check_worker_room(job: Job, cluster: Cluster) -> None:
        """Raise JobTooLargeError if more workers of ``job`` fit on one server than
        :func:`controller.plane.worker_room.most_per_server` allows."""
        problem = worker_room_problem(job, cluster)
        if problem is not None:
            raise JobTooLargeError([problem])

    def check_search(self, job: Job, cluster: Cluster, window: int) -> None:
        """Raise JobTooLargeError if a search for ``job`` over ``window`` slots is over
        ``max_job_work``, ``max_job_chunks``, ``max_search_steps`` or ``max_search_mb``:
        every best-schedule search in the decision thread is held to these, a job's
        re-plan from its reported progress (:mod:`controller.plane.job_review`) too."""
        problems = []
        if job.work > self.max_job_work:
            problems.append(Problem("job", f"work W = {job.work} worker-slots exceeds "
                                    f"limits.max_job_work = {self.max_job_work}"))  # fmt: skip
        if job.chunks > self.max_job_chunks:
            problems.append(Problem("job.chunks", f"{job.chunks} exceeds "
                                    f"limits.max_job_chunks = {self.max_job_chunks}"))  # fmt: skip
        if problems:  # the search's size follows from these: no more said of it
            raise JobTooLargeError(problems)
        size = search_size(job, cluster, window)
        if size.steps > self.max_search_steps:
            raise JobTooLargeError.one(
                "job",
                f"too large to decide: its search may take {size.steps:.3g} steps ({size.slots} "
                f"slots x {size.workers} workers per slot x {job.work + 1} work levels), over "
                f"limits.max_search_steps = {self.max_search_steps:.3g}",
            )
        if size.megabytes > self.max_search_mb:
            raise JobTooLargeError.one(
                "job",
                f"too large to decide: its search needs {size.megabytes:.0f} MiB of tables, "
                f"over limits.max_search_mb = {self.max_search_mb:g}",
            )

    def check_utility(self, job: Job, submitter: str | None = None) -> None:
        """Raise JobTooLargeError if ``job``'s best utility ``f(d_min)`` is over
        ``max_utility``, or ``submitter``'s own cap (compared in logs: no overflow for
        any finite spec)."""
        cap, key = self.max_utility, "limits.max_utility"
        if submitter is not None and submitter in self.max_utility_by_submitter:
            cap = self.max_utility_by_submitter[submitter]
            key = f"limits.max_utility_by_submitter.{submitter}"
        if cap <= 0:
            return
        log_best = float(job.utility.log_values(job.min_slots))
        if not log_best > math.log(cap):  # nan (impossible) is not refused
            return
        name = _UTILITY_FIELD.get(type(job.utility), "")
        best = math.exp(min(log_best, 709.0))
        raise JobTooLargeError.one(
            f"job.utility.{name}" if name else "job.utility",
            f"the job's best utility f({job.min_slots}) = {best:.6g} exceeds {key} = {cap:g}",
        )


@dataclass(frozen=True)
class SearchSize:
    """Upper bounds on one best-schedule search.

    Attributes:
        slots: slots the DP may scan (the window ``T``).
        workers: ``Y``, the most workers per slot it tries.
        steps: ``T * Y * (W + 1)``, inner-loop steps.
        megabytes: ``8 T (W + N + 2)`` bytes of DP tables, in MiB.
    """

    slots: int
    workers: int
    steps: int
    megabytes: float


def search_size(job: Job, cluster: Cluster, window: int) -> SearchSize:
    """The bounds of :class:`SearchSize` for ``job`` in a window of ``window`` slots."""
    workers = max_workers_per_slot(job, cluster)
    steps = window * workers * (job.work + 1)
    megabytes = 8.0 * window * (job.work + job.chunks + 2) / 2**20
    return SearchSize(window, workers, steps, megabytes)


def check_job_id(job_id: str, field: str = "job.id") -> None:
    """Raise SpecError (INVALID_ARGUMENT) unless ``job_id`` is 1-128 characters of
    ``A-Z a-z 0-9 . _ -`` (:func:`pricing.fields.job_id`, the rule traces follow too)."""
    fields.job_id(job_id, field)


def check_job_key(key: str, field: str = "job.id") -> None:
    """Raise SpecError (INVALID_ARGUMENT) unless ``key`` is a job's key: its id, or its
    submitter's name, ``:`` and its id (:mod:`controller.job_keys`)."""
    fields.job_key(key, field)


def machine_mb() -> float | None:
    """This machine's memory, MiB (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, ValueError, OSError):
        return None


def _within_memory(mb: float) -> float:
    """``limits.max_search_mb``, refused past this machine's memory: a search that large
    is never refused by its size, and one job's would have the daemon killed for memory
    (every tenant's calls lost with it, and under systemd the daemon restarted while the
    tenant retried). Before, ``max_search_mb = 1e12`` was taken as it was."""
    memory = machine_mb()
    if memory is not None and mb > memory:
        raise SpecError.one(
            "limits.max_search_mb",
            f"must be at most this machine's memory ({memory:.0f} MiB): one job's search "
            f"tables that large would have oasisd killed for memory, got {mb:g}",
        )
    return mb


_N = TypeVar("_N", int, float)

_TURN = (
    "the decision thread, where every tenant's calls wait, takes about 30 s for that many "
    "steps (3.2 ns a step with the cores shared), as long as a stop waits for a decision"
)
_CEILINGS: dict[str, tuple[float, str, str]] = {
    # key: (the largest value, how it is said, why)
    "max_search_steps": (MAX_TURN_STEPS, f"{MAX_TURN_STEPS:g}", _TURN),
    "pending_steps_per_boundary": (MAX_TURN_STEPS, f"{MAX_TURN_STEPS:g}", _TURN),
    "replan_steps_per_review": (MAX_TURN_STEPS, f"{MAX_TURN_STEPS:g}", _TURN),
    "max_wait_seconds": (
        MAX_WAIT_SECONDS,
        f"{MAX_WAIT_SECONDS:.0f} (100 years)",
        "a pending job's last slot must fit the store's 64-bit column",
    ),
    "max_spec_bytes": (
        MAX_SPEC_BYTES,
        f"{MAX_SPEC_BYTES} (2 MiB)",
        "a larger spec would be stored but not read back (the store reads 4 Mi characters "
        "of a spec), and its job failed at the next start",
    ),
    "max_page_jobs": (
        MAX_PAGE_JOBS,
        f"{MAX_PAGE_JOBS}",
        "each ListJobs reads that many jobs and their plans from the store before the page "
        "is cut (oasis jobs follows the pages)",
    ),
    "max_page_bytes": (
        MAX_PAGE_BYTES,
        f"{MAX_PAGE_BYTES} (8 MiB)",
        "a page ends after the job that reaches it, and must fit the 16 MiB the daemon "
        "sends in one answer",
    ),
    "max_message_bytes": (
        MAX_GRPC_MESSAGE_BYTES,
        f"{MAX_GRPC_MESSAGE_BYTES} (2 GiB - 1)",
        "gRPC keeps the limit in a C int",
    ),
}
"""The ``[limits]`` keys with a ceiling, refused past it at start naming the key (exit
2); the reasons are in the ``MAX_*`` constants' docstrings."""


def _at_most(key: str, value: _N) -> _N:
    """``limits.<key>``'s ``value``, refused past its ceiling in :data:`_CEILINGS`."""
    ceiling, said, why = _CEILINGS[key]
    if value > ceiling:
        raise SpecError.one(f"limits.{key}", f"must be at most {said}: {why}; got {value:g}")
    return value


def limits_from_dict(raw: Mapping[str, Any]) -> Limits:
    """Read the ``[limits]`` table (absent keys keep their defaults)."""
    fields.check_known_keys(raw, _KEYS, "limits")
    d = Limits()

    def count(key: str, default: int) -> int:
        return fields.positive_int(raw.get(key, default), f"limits.{key}")

    def positive(key: str) -> float:
        return fields.positive(raw.get(key, getattr(d, key)), f"limits.{key}")

    def positive_at_most(key: str) -> float:
        return _at_most(key, positive(key))

    def counted(key: str) -> int:
        return _at_most(key, count(key, getattr(d, key)))

    rate = fields.non_negative(raw.get("rate", d.rate), "limits.rate")
    burst = fields.non_negative(raw.get("burst", d.burst), "limits.burst")
    if burst and not rate:
        raise SpecError.one("limits.burst", "needs limits.rate > 0")
    if 0 < burst < 1:
        # A bucket that never holds a whole token would refuse every request forever.
        raise SpecError.one("limits.burst", f"must be 0 (= max(1, rate)) or >= 1, got {burst}")
    pending, per_submitter = _pending_caps(raw, count)
    return Limits(
        max_message_bytes=counted("max_message_bytes"),
        max_job_work=count("max_job_work", d.max_job_work),
        max_job_chunks=count("max_job_chunks", d.max_job_chunks),
        max_search_steps=positive_at_most("max_search_steps"),
        max_search_mb=_within_memory(positive("max_search_mb")),
        rate=rate,
        burst=burst,
        max_wait_seconds=_at_most(
            "max_wait_seconds",
            fields.non_negative(
                raw.get("max_wait_seconds", d.max_wait_seconds), "limits.max_wait_seconds"
            ),
        ),
        max_pending_per_submitter=per_submitter,
        max_pending=pending,
        pending_steps_per_submitter=positive("pending_steps_per_submitter"),
        pending_steps_per_boundary=positive_at_most("pending_steps_per_boundary"),
        replan_steps_per_submitter=positive("replan_steps_per_submitter"),
        replan_steps_per_review=positive_at_most("replan_steps_per_review"),
        max_spec_bytes=counted("max_spec_bytes"),
        max_table_points=count("max_table_points", d.max_table_points),
        max_page_jobs=counted("max_page_jobs"),
        max_page_bytes=counted("max_page_bytes"),
        max_in_flight=count("max_in_flight", d.max_in_flight),
        search_steps_per_token=positive("search_steps_per_token"),
        max_utility=fields.non_negative(
            raw.get("max_utility", d.max_utility), "limits.max_utility"
        ),
        max_ledger_mb=positive("max_ledger_mb"),
        max_stored_mb_per_day=fields.non_negative(
            raw.get("max_stored_mb_per_day", d.max_stored_mb_per_day),
            "limits.max_stored_mb_per_day",
        ),
        max_utility_by_submitter=_caps_by_submitter(raw.get("max_utility_by_submitter", {})),
    )


def _pending_caps(raw: Mapping[str, Any], count: Callable[[str, int], int]) -> tuple[int, int]:
    """``(max_pending, max_pending_per_submitter)``. A submitter's cap not given is a
    tenth of the queue's, as the defaults are (100 of 1000), at most the default 100
    and at least 1: with ``max_pending`` lowered alone it stayed 100, so one tenant could
    take every place of a queue of 50 and every other tenant's ``--wait`` was refused.
    One given is the operator's choice, kept as given (at or above ``max_pending``: one
    submitter may fill the queue, as on a cluster of one tenant); refused, a file an
    earlier version started with would stop the daemon at its upgrade."""
    d = Limits()
    pending = count("max_pending", d.max_pending)
    share = min(d.max_pending_per_submitter, max(1, pending // 10))
    return pending, count("max_pending_per_submitter", share)


def _caps_by_submitter(raw: Any) -> dict[str, float]:
    """``[limits.max_utility_by_submitter]``: ``{token name: cap >= 0}``."""
    where = "limits.max_utility_by_submitter"
    table = fields.mapping(raw, where)
    if len(table) > 10_000:
        raise SpecError.one(where, f"at most 10000 submitters, got {len(table)}")
    return {
        str(name): fields.non_negative(cap, f"{where}.{str(name)[:200]}")
        for name, cap in table.items()
    }


class RateLimiter:
    """A token bucket per client: ``rate`` tokens per second up to ``burst``.

    Thread-safe. Buckets of clients idle long enough to be full again are dropped once
    there are more than ``max_clients``, so the table stays small: at most once per
    :attr:`PURGE_SECONDS`, as a pass looks at every bucket (over the cap with every
    client recent, each call looked at all of them: 1.3 -> 103 us a call, the
    cardinality audit).
    """

    PURGE_SECONDS = 1.0

    def __init__(
        self,
        rate: float,
        burst: float = 0.0,
        now: Callable[[], float] = time.monotonic,
        max_clients: int = 10_000,
    ) -> None:
        self._now = now
        self._max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)
        self._purge_after = -math.inf  # no purge before (monotonic seconds)
        self._lock = threading.Lock()
        self.retune(rate, burst)

    def retune(self, rate: float, burst: float = 0.0) -> None:
        """Take ``rate`` (> 0) and ``burst`` (0: ``max(1, rate)``), at start and at a
        reload: buckets keep their tokens, at most the new burst, and refill at the new
        rate from now on."""
        if not rate > 0:
            raise ValueError("rate must be > 0")
        with self._lock:
            self.rate = rate
            self.burst = burst or max(1.0, rate)
            self._buckets = {
                client: (min(tokens, self.burst), at)
                for client, (tokens, at) in self._buckets.items()
            }

    @property
    def words(self) -> str:
        """The limit in a refusal's words: ``rate limit: 1 request/s per client``."""
        return f"rate limit: {self.rate:g} request{'' if self.rate == 1 else 's'}/s per client"

    def charge(self, client: str, tokens: float) -> None:
        """Take ``tokens`` more from ``client``'s bucket, below zero if need be (a debt
        its next calls wait out)."""
        with self._lock:
            now = self._now()
            left, at = self._buckets.get(client, (self.burst, now))
            left = min(self.burst, left + (now - at) * self.rate)
            self._buckets[client] = (left - tokens, now)

    def charge_bytes(self, client: str, nbytes: int) -> None:
        """Charge ``client`` for ``nbytes`` read or answered: nothing for the first
        :data:`BYTES_PER_TOKEN`, then a token each as many more."""
        if nbytes > BYTES_PER_TOKEN:
            self.charge(client, nbytes / BYTES_PER_TOKEN - 1.0)

    def take(self, client: str) -> float:
        """Take one token for ``client``: 0.0 if granted, else the seconds until one is."""
        with self._lock:
            now = self._now()
            tokens, at = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                if len(self._buckets) > self._max_clients and now >= self._purge_after:
                    self._forget_idle(now)
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        self._purge_after = now + self.PURGE_SECONDS
        for client, (tokens, at) in list(self._buckets.items()):
            # full again: forgetting it changes nothing (a bucket still in debt for an
            # expensive search is kept: dropped after a refill's time, its debt was
            # forgiven once the table went over max_clients)
            if tokens + (now - at) * self.rate >= self.burst:
                del self._buckets[client]

    @staticmethod
    def retry_hint_ms(wait: float) -> int:
        """``wait`` seconds as whole milliseconds, at least 1 and at most
        :data:`MAX_RETRY_HINT_SECONDS`'s: a bucket a tiny ``rate`` or
        ``search_steps_per_token`` (both taken if > 0) leaves infinitely far below zero
        waits ``inf`` s, and before, every call of that client raised OverflowError in
        the access interceptor (answered UNKNOWN, a traceback logged each time)."""
        return max(1, math.ceil(min(wait, MAX_RETRY_HINT_SECONDS) * 1000.0))
