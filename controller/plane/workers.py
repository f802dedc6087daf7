"""The worker commands of ``oasis agent --command``: one process per planned worker,
started, counted, restarted and stopped so that what runs on the server is what its plan
says, and nothing of a job outlasts its place in the plan.

- **Stop.** A worker whose task leaves the plan gets SIGTERM once (its process group:
  each command runs in a session of its own), and SIGKILL ``stop_grace`` seconds later
  if it is still there. No command of any job starts on the server while one is
  departing: the capacity is the departing job's until it is gone, at most
  ``stop_grace`` seconds into the slot. Before, SIGTERM came again every 50 ms (which
  many frameworks read as "exit now"), never SIGKILL, and the next tenant's workers
  started beside a worker that ignored it, on the same GPUs, for good (the audit of jobs
  that do not follow their plan). A worker is gone once its process group is empty;
  one the agent may not signal (another user's) or that a process outside its group
  keeps open is given up :data:`GIVE_UP_SECONDS` after its SIGKILL, with an error, so
  that it never holds the server's other jobs for good.
- **Escapes** (``adopt_orphans``: ``oasis agent`` itself). The agent is its workers'
  subreaper (``PR_SET_CHILD_SUBREAPER``): a process that leaves its worker's session
  (``setsid``, a daemon) is reparented to the agent when its parent exits, instead of
  to init. Such an orphan, known by this agent's ``OASIS_AGENT`` in its environment, is
  stopped the same way once its job (``OASIS_JOB``) has no worker running here; a
  process without the mark is never signalled. The orphans' exits are reaped.
- **Exits.** A worker that exits 0 has done its part: it is not started again for that
  admission. One that fails (any other status, or a signal it did not get from the
  agent) is started again after a back-off, 1 s doubling to 60 s, from 1 s again once a
  run lasted 60 s; each exit is logged with its status. Before, any exit was restarted
  within 50 ms: a worker failing at start forked 30 times a second, and its counts,
  summed over the restarts, completed its job in one slot.
- **Counts.** Each process prints its own cumulative mini-batch count (the largest
  number it printed counts); the job's count is the sum over every process of the job
  on this server, those that exited included (their mini-batches went to the parameter
  servers). An exited process is kept as its count only.
- **Indices.** ``OASIS_WORKER`` is the worker's index, 0 .. workers - 1: a restart takes
  the index that is free (two live workers had the same before).
- **Bounds.** A server runs at most :data:`MAX_WORKERS` worker commands: a task asking
  for more alone is skipped, and the others start in plan order while there is room,
  each said once in the log. Before, a plan's task of 2**53 workers (a broken or
  hostile plan: a broker without the shipped ACL) built a set of 2**53 indices at each
  step, until the agent ran out of memory, and one of 10**6 forked 10**6 processes.
- **Devices.** Each worker gets devices of its own in ``CUDA_VISIBLE_DEVICES``, as its
  task's demand asks (:mod:`controller.plane.devices`), given back once it is gone.
- **Demand.** Each worker is told its task's demand in ``OASIS_DEMAND`` and
  ``OASIS_DEMAND_<NAME>`` (:mod:`controller.plane.demand`), for a launcher to enforce;
  with a :class:`~controller.plane.memory_guard.MemoryGuard`, one over its memory
  demand is stopped, a failure for its back-off (:mod:`controller.plane.memory_guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from controller.plane.agent_messages import MAX_FAILURE_CHARS
from controller.plane.demand import Demand, demand_environment
from controller.plane.devices import Devices
from controller.plane.memory_guard import SAMPLE_SECONDS, MemoryGuard, group_rss
from controller.plane.worker_errors import log_errors
from controller.plane.worker_marks import Marks, environment_of
from controller.procfs import ZOMBIE_STATES, pids, stat_fields

__all__ = [
    "MAX_STOP_GRACE",
    "MAX_WORKERS",
    "RESTART_FIRST",
    "RESTART_MAX",
    "STOP_GRACE",
    "Commands",
    "HeldDevices",
    "JobWorkers",
    "OutputBudget",
    "Worker",
    "worker_environment",
]

STOP_GRACE = 10.0
"""Seconds between a departing worker's SIGTERM and its SIGKILL (``--stop-grace``)."""

MAX_STOP_GRACE = 600.0
"""The longest ``--stop-grace``: no worker of another job starts meanwhile."""

MAX_WORKERS = 1024
"""The most worker commands one agent runs at once (see the module docstring)."""

RESTART_FIRST = 1.0
"""Seconds before a failed worker is started again; doubled at each failure in a row."""

RESTART_MAX = 60.0
"""The longest back-off; a run this long starts the back-off from RESTART_FIRST again."""

PRIVATE_VARIABLES = ("PGPASSWORD",)
"""Variables of the agent's environment, besides every ``OASIS_*`` one, that its worker
commands do not get (:func:`worker_environment`)."""


def worker_environment() -> dict[str, str]:
    """The environment a worker command starts from: the agent's, without its own
    settings (every ``OASIS_*`` variable: ``$OASIS_MQTT_PASSWORD``, a ``$OASIS_BROKER``
    with a password in it, ``$OASIS_TOKEN``) and :data:`PRIVATE_VARIABLES`. Before, a
    tenant's job got the agent's broker password, logged in as the agent, and reported
    another tenant's job on the same server as done."""
    return {
        k: v for k, v in os.environ.items()
        if not k.startswith("OASIS_") and k not in PRIVATE_VARIABLES
    }  # fmt: skip


GIVE_UP_SECONDS = 5.0
"""Seconds after its SIGKILL that a departing worker still there is given up on (logged
as an error): it no longer holds the server's other jobs."""

_LINE_LIMIT = 1 << 16
"""The longest worker output line read whole (asyncio's default); longer ones are skipped."""

OUTPUT_LINES_PER_SECOND = 2000.0
"""The most lines of one worker's output the agent reads a second (:class:`OutputBudget`)."""

OUTPUT_BYTES_PER_SECOND = float(1 << 20)
"""The most bytes of one worker's output the agent reads a second."""

DRAIN_SECONDS = 0.5
"""How long the agent reads what a worker whose processes are all gone left in its pipe
(at most the pipe's and the reader's buffers) before it counts the worker gone: a
process that escaped the worker's group may hold the pipe open for good."""

ORPHAN_SCAN_SECONDS = 1.0
"""How often the agent looks for workers' descendants reparented to it."""

_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Worker:
    """One running worker command.

    Attributes:
        proc: the process (the leader of its own session and process group).
        index: its ``OASIS_WORKER``.
        count: ``[n]``, the largest mini-batch count it printed.
        reader: the task following its output; done once it exited and was reaped.
        started: monotonic time it started.
        job: the :class:`JobWorkers` it counts for.
        stop_sent: monotonic time of its SIGTERM (None: not departing).
        killed: SIGKILL sent.
    """

    proc: asyncio.subprocess.Process
    index: int
    count: list[float]
    reader: asyncio.Task[None]
    started: float
    job: JobWorkers
    stop_sent: float | None = None
    killed: bool = False
    emptied_at: float | None = None  # monotonic time its process group was found empty
    devices: dict[str, float] = field(default_factory=dict)  # its shares of the devices
    demand: float = 0.0  # the devices its task needs
    job_id: str = ""  # its job's id
    memory_limit: int | None = None  # resident bytes it may use (MemoryGuard); None: any
    memory_demand: float | None = None  # its task's demand of the memory resource


@dataclass
class JobWorkers:
    """One job's worker commands on this server (for one admission).

    Attributes:
        running: the live workers, not departing.
        done_before: mini-batches of its processes that exited or were stopped.
        finished: indices whose worker exited 0: not started again.
        failures: failures in a row per index (the back-off's exponent).
        retry_at: per index, the monotonic time before which it is not started again.
        failed: its workers' failures in all (each counted by the back-off), reported
            to the daemon for the job's tenant.
        last_failure: the latest of them in words (``exit status 1``, ``over its memory
            demand``); "": none yet.
    """

    running: list[Worker] = field(default_factory=list)
    done_before: float = 0.0
    finished: set[int] = field(default_factory=set)
    failures: dict[int, int] = field(default_factory=dict)
    retry_at: dict[int, float] = field(default_factory=dict)
    all_done_said: bool = False  # every planned index exited 0: warned once
    failed: int = 0
    last_failure: str = ""


@dataclass
class HeldDevices:
    """Devices of a worker gone from the agent's view whose processes may still run on
    them: held until none of ``pids`` is left.

    Attributes:
        job: the worker's job ("": not needed, a worker given up on).
        pids: the processes (a given-up worker's group leader, or the processes that
            escaped its group).
        devices: its shares of the devices (:meth:`Devices.take`).
        escaped: the processes left the worker's group: stopped once ``job`` no longer
            runs here.
    """

    job: str
    pids: list[int]
    devices: dict[str, float]
    escaped: bool = False


class Commands:
    """Starts and stops one server's worker commands; see the module docstring.

    Args:
        command: the shell command run per worker.
        server: the server's name (``OASIS_SERVER``).
        session: the agent's session id, given to workers as ``OASIS_AGENT``: the mark
            of the processes this agent may stop as orphans.
        read_counts: follows a process's output into its count (the agent's), within
            an :class:`OutputBudget`.
        log: a structlog logger.
        stop_grace: seconds from SIGTERM to SIGKILL.
        adopt_orphans: become the subreaper of the workers' descendants and stop the
            escaped ones (the ``oasis agent`` process: it has no other children; a
            process that embeds an agent, a test, should not).
        monotonic: the clock (tests).
        devices: the server's devices, handed to the workers
            (:mod:`controller.plane.devices`); the agent sizes it from its plan.
        key: the agent's place on the machine (broker, prefix, server:
            :func:`~controller.plane.one_agent.agent_key`), given to workers as
            ``OASIS_AGENT_KEY``: an earlier agent's leftovers are those of the same key.
        memory_guard: stop the workers over their memory demand
            (:mod:`controller.plane.memory_guard`); None: no limit.
    """

    def __init__(
        self,
        command: str,
        server: str,
        session: str,
        read_counts: Any,
        log: Any,
        stop_grace: float = STOP_GRACE,
        adopt_orphans: bool = False,
        monotonic: Any = time.monotonic,
        devices: Devices | None = None,
        key: str = "",
        memory_guard: MemoryGuard | None = None,
    ) -> None:
        self.command = command
        self.memory_guard = memory_guard
        self._sampled = -SAMPLE_SECONDS  # monotonic time of the last memory sample
        self.devices = devices if devices is not None else Devices()
        self.key = key
        self._short_said = False  # devices oversubscribed: warned once
        self.server = server
        self.session = session
        self.read_counts = read_counts
        self.log = log
        self.stop_grace = stop_grace
        self.monotonic = monotonic
        self.departing: list[Worker] = []
        self.live: dict[int, Worker] = {}  # pid -> a running worker, not departing
        self._orphans: dict[int, tuple[float, bool]] = {}  # pid -> (SIGTERM time, killed)
        # processes given up on (GIVE_UP_SECONDS past their SIGKILL): never tried again,
        # or the orphan scan took a given-up worker back and held the server for good
        self._given_up: set[int] = set()
        # devices of workers gone from the agent's view whose processes may still run on
        # them (given up on, or escaped from their group): held until those are gone
        # (job, pids, devices, escaped): escaped processes are stopped with their job
        self._held_on: list[HeldDevices] = []
        self._scanned = -ORPHAN_SCAN_SECONDS
        self._leftovers_stopped = False
        self._over: set[str] = set()  # jobs whose workers are not started (MAX_WORKERS): said
        self.subreaper = adopt_orphans and _become_subreaper()
        # the marks of processes, each read once (worker_marks.py); by the name looked up
        # at each read, which a test may replace
        self.marks = Marks(lambda pid: _environment_of(pid))  # noqa: PLW0108

    # -- each step ----------------------------------------------------------------------

    async def follow(
        self,
        jobs: dict[str, JobWorkers],
        wanted: dict[str, tuple[int, Any, float, Demand]],
    ) -> None:
        """Make the running workers match ``wanted`` (``{job: (workers, env extra,
        devices per worker, demand per worker)}``):
        reap the exited, stop the unwanted (indices from the planned count on) and those
        over their memory demand, escalate the departing, and, once none is departing,
        start the missing indices."""
        now = self.monotonic()
        for job_id, job in jobs.items():
            self._reap(job_id, job, now)
            want = wanted[job_id][0] if job_id in wanted else 0
            for worker in [w for w in job.running if w.index >= want]:
                self.stop(worker, now)
        departed = self._reap_departing(now)
        for held in [h for h in self._held_on if not any(map(_still_there, h.pids))]:
            self._held_on.remove(held)
            self.devices.give_back(held.devices)
        if self.memory_guard is not None and now - self._sampled >= SAMPLE_SECONDS:
            self._sampled = now
            self._guard_memory(self.memory_guard, now)
        running = {j for j, (n, _e, _d, _m) in wanted.items() if n > 0}
        self._stop_escaped(running, now)
        self._escalate(now)
        if self.subreaper and not self._leftovers_stopped:
            self._leftovers_stopped = True
            self._stop_leftovers(now)
        # a scan as soon as a worker has departed: a process of it that escaped its
        # group is found before the next job's workers start (the re-audit: they started
        # beside it for up to a second and the grace)
        if self.subreaper and (departed or now - self._scanned >= ORPHAN_SCAN_SECONDS):
            self._scanned = now
            self._scan_orphans(running, now)
        if self.departing or self._orphans:
            return  # the capacity is the departing jobs' until they are gone
        self._over &= wanted.keys()  # said again if it comes back after a plan without it
        room = MAX_WORKERS - len(self.live)
        for job_id, (workers, extra, devices, demand) in wanted.items():
            job = jobs[job_id]
            if workers > MAX_WORKERS:
                self._too_many(job_id, workers, room)
                continue
            if workers and not job.all_done_said and set(range(workers)) <= job.finished:
                job.all_done_said = True
                self.log.warning("every worker of the job exited 0: none is started again "
                                 "for this admission", job=job_id, workers=workers,
                                 minibatches=self.count(job))  # fmt: skip
            taken = {w.index for w in job.running}
            missing = [i for i in range(workers) if i not in taken and i not in job.finished]
            if len(missing) > room:  # none of them, rather than part of the job
                self._too_many(job_id, workers, room)
                continue
            for index in missing:
                if job.retry_at.get(index, 0) > now:
                    continue
                await self._start(job_id, job, index, extra, devices, demand, now)
                room -= 1

    def _too_many(self, job_id: str, workers: int, room: int) -> None:
        """Say once (while its job stays planned) that ``job_id``'s ``workers`` are
        not started: over :data:`MAX_WORKERS` alone, or over the ``room`` the server's
        other workers left."""
        if job_id in self._over:
            return
        self._over.add(job_id)
        why = (
            f"over the {MAX_WORKERS} worker commands an agent runs"
            if workers > MAX_WORKERS
            else "the server runs as many as it may already"
        )
        self.log.error(f"a task's workers are not started: {why}; the plan may be broken",
                       job=job_id, workers=workers, room=max(room, 0))  # fmt: skip

    def _guard_memory(self, guard: MemoryGuard, now: float) -> None:
        """Stop each running worker whose process group's resident memory is over its
        limit (:mod:`controller.plane.memory_guard`): logged once, a failure for the
        back-off. One pass over ``/proc`` for all of them."""
        limited = [w for w in self.live.values() if w.memory_limit is not None]
        if not limited:
            return
        rss = group_rss({w.proc.pid for w in limited})
        for worker in limited:
            used = rss.get(worker.proc.pid, 0)
            assert worker.memory_limit is not None
            if used <= worker.memory_limit:
                continue
            self.log.error("worker over its memory demand: stopped", job=worker.job_id,
                           worker=worker.index, pid=worker.proc.pid, rss_bytes=used,
                           demand=worker.memory_demand, unit=guard.unit,
                           resource=guard.resource,
                           limit_bytes=worker.memory_limit)  # fmt: skip
            self.stop(worker, now)
            self._failed(worker.job_id, worker.job, worker.index, "over its memory demand",
                         now - worker.started, now, what="worker stopped")  # fmt: skip

    def devices_short(self) -> int:
        """How many running workers are short of devices now: on a device others' shares
        take past a whole one, or holding none while their task needs some."""
        if not self.devices.managed:
            return 0
        return sum(1 for w in self.live.values() if self.devices.short(w.devices, w.demand))

    def count(self, job: JobWorkers) -> float:
        """The job's mini-batches on this server: every process's count, summed."""
        total = job.done_before + sum(w.count[0] for w in job.running)
        return total + sum(w.count[0] for w in self.departing if w.job is job)

    def stop(self, worker: Worker, now: float | None = None) -> None:
        """SIGTERM ``worker``'s process group, once; it departs (SIGKILL after the grace)."""
        if worker.stop_sent is not None:
            return
        worker.stop_sent = self.monotonic() if now is None else now
        with contextlib.suppress(ValueError):
            worker.job.running.remove(worker)
        self.live.pop(worker.proc.pid, None)
        self.departing.append(worker)
        _kill_group(worker.proc.pid, signal.SIGTERM)

    async def stop_all(self) -> None:
        """Stop every worker and orphan, SIGKILL what is left after the grace, and wait
        for them, at most the grace and :data:`GIVE_UP_SECONDS` (the agent's exit:
        before, it left without waiting, and a worker that ignored SIGTERM ran on). A
        cancellation meanwhile (a second signal) kills what is left at once."""
        start = self.monotonic()
        for worker in list(self.live.values()):
            self.stop(worker, start)
        try:
            while True:
                now = self.monotonic()
                if self.subreaper:
                    self._scan_orphans(set(), now)
                self._reap_departing(now)
                self._escalate(now)
                if not (self.departing or self._orphans):
                    return
                if now - start >= self.stop_grace + GIVE_UP_SECONDS:
                    self.log.error("workers left running at the agent's exit",
                                   pids=[w.proc.pid for w in self.departing],
                                   orphans=list(self._orphans))  # fmt: skip
                    return
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:  # a second signal: everything killed at once
            for worker in self.departing:
                _kill_group(worker.proc.pid, signal.SIGKILL)
            for pid in self._orphans:
                _signal_group(pid, signal.SIGKILL)
            raise

    def busy(self, job: JobWorkers) -> bool:
        """Whether a worker of ``job`` runs or departs."""
        return bool(job.running) or any(w.job is job for w in self.departing)

    def stop_job(self, job: JobWorkers) -> None:
        """Stop every worker of ``job`` (an admission replaced under the same id)."""
        for worker in list(job.running):
            self.stop(worker)

    # -- the mechanics -------------------------------------------------------------------

    async def _start(
        self,
        job_id: str,
        job: JobWorkers,
        index: int,
        extra: dict[str, str],
        demand: float,
        needs: Demand,
        now: float,
    ) -> None:
        held, enough = self.devices.take(demand)
        if enough:
            self._short_said = False
        elif not self._short_said:  # once a shortage
            self._short_said = True
            source = self.devices.source if self.devices.given is not None else "the plan"
            event = (
                "not enough free devices for a worker: it shares devices others hold (a "
                "worker given up on still holds its own, fractional demands fragmented "
                "the devices, or fewer ids than the plan counts)"
                if held
                else "no device for a worker that needs some: the agent may use none"
            )
            self.log.warning(event, job=job_id, worker=index, devices=list(held),
                             demand=demand, known=len(self.devices.ids),
                             ids_from=source)  # fmt: skip
        env = {**worker_environment(), **extra, **self.devices.environment(held),
               **demand_environment(needs),
               "OASIS_JOB": job_id, "OASIS_SERVER": self.server, "OASIS_WORKER": str(index),
               "OASIS_AGENT": self.session, "OASIS_AGENT_KEY": self.key}  # fmt: skip
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader(limit=_LINE_LIMIT)
        errors = asyncio.StreamReader(limit=_LINE_LIMIT)
        proc: asyncio.subprocess.Process | None = None
        pipes: list[Any] = []  # the read ends, as files
        writes: list[int] = []  # the write ends, closed once the worker has them
        transports: list[asyncio.ReadTransport] = []
        try:
            # the agent's own pipes, not asyncio's: a process that escaped the worker's
            # group may hold them open, and a worker given up on must leave no transport;
            # its standard error too (worker_errors.py: it was the agent's own, unbounded)
            for _ in range(2):
                read_end, write_end = os.pipe()
                writes.append(write_end)
                pipes.append(os.fdopen(read_end, "rb", buffering=0))  # closes read_end
            proc = await asyncio.create_subprocess_shell(
                self.command, stdout=writes[0], stderr=writes[1], env=env,
                start_new_session=True,
            )  # fmt: skip
            _close_all(writes)
            for pipe, into in zip(pipes, (stream, errors), strict=True):
                transport, _ = await loop.connect_read_pipe(_protocol_of(into), pipe)
                transports.append(transport)
        # out of processes or descriptors, or an environment no process can carry (a
        # plan's job id with a NUL: the ValueError ended the work loop, and the agent
        # with every worker of the server, at each restart): a failure, backed off; or
        # the agent stopping (its work loop cancelled) after the process started but
        # before it was counted: the worker, in a session of its own that no stop would
        # reach, ran on after the agent, holding the server (a CI run's SIGTERM test)
        except (OSError, ValueError, asyncio.CancelledError) as err:
            self.devices.give_back(held)
            _close_all(writes)
            for transport in transports:
                transport.close()
            for pipe in pipes:
                pipe.close()  # every failed start leaked it (the second review)
            if proc is not None:  # started, but its output cannot be followed
                _kill_group(proc.pid, signal.SIGKILL)
            if isinstance(err, asyncio.CancelledError):
                if proc is not None:  # its transport closes with its exit, seen here
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(GIVE_UP_SECONDS):
                            await proc.wait()
                raise
            why = f"{type(err).__name__}: {err}"
            self._failed(job_id, job, index, why, 0.0, now, started=False,
                         said=f"could not start: {why}")  # fmt: skip
            return
        count = [0.0]
        tags = {"job": job_id, "worker": index, "pid": proc.pid}
        reader = loop.create_task(self._follow(proc, stream, errors, transports, count, tags))
        guard = self.memory_guard
        limit = guard.limit(needs) if guard is not None else None
        amount = guard.amount(needs) if guard is not None else None
        worker = Worker(proc, index, count, reader, now, job, devices=held, demand=demand,
                        job_id=job_id, memory_limit=limit, memory_demand=amount)  # fmt: skip
        job.running.append(worker)
        self.live[proc.pid] = worker
        self.log.info("worker started", job=job_id, worker=index, pid=proc.pid,
                      devices=list(held) if self.devices.managed else None)  # fmt: skip

    async def _follow(
        self,
        proc: asyncio.subprocess.Process,
        stream: asyncio.StreamReader,
        errors: asyncio.StreamReader,
        transports: list[asyncio.ReadTransport],
        count: list[float],
        tags: dict[str, Any],
    ) -> None:
        """Read a worker's counts to the end of its output, and log its standard error
        (:func:`~controller.plane.worker_errors.log_errors`), then wait for its exit;
        the pipes are closed however this ends (a cancellation included)."""

        def ended() -> bool:
            return proc.returncode is not None and not _group_alive(proc.pid)

        budget = OutputBudget(ended, self.monotonic)
        error_budget = OutputBudget(ended, self.monotonic)
        try:
            await asyncio.gather(
                self.read_counts(stream, count, budget),
                log_errors(errors, self.log, error_budget.spend, self.monotonic, **tags),
            )
        finally:
            for transport in transports:
                transport.close()
        await proc.wait()

    def _reap(self, job_id: str, job: JobWorkers, now: float) -> None:
        """Take the exited workers of ``job`` out, their counts kept; a failure is
        started again after its back-off, an exit 0 not at all."""
        for worker in [w for w in job.running if self._gone(w)]:
            worker.reader.cancel()  # done, or held open by a process outside its group
            job.running.remove(worker)
            self.live.pop(worker.proc.pid, None)
            self._release(job_id, worker)
            job.done_before += worker.count[0]
            code = worker.proc.returncode
            if code == 0:
                job.finished.add(worker.index)
                self.log.info("worker finished", job=job_id, worker=worker.index,
                              minibatches=worker.count[0])  # fmt: skip
                continue
            self._failed(job_id, job, worker.index, _status(code), now - worker.started, now,
                         said=_in_words(code))  # fmt: skip

    def _release(self, job_id: str, worker: Worker) -> None:
        """Give back the devices of ``worker``, which exited, unless a process of it that
        left its group (``setsid``, a launcher's child) still runs: on them, as its
        ``CUDA_VISIBLE_DEVICES`` says; then they are held until it is gone (the review:
        the next tenant's worker was put on the GPU it still used)."""
        if not worker.devices:
            return
        escaped = self._escaped_of(job_id, worker.index)
        if escaped:
            self.log.warning("a worker's process that left its group still runs: its "
                             "devices stay its own", job=job_id, worker=worker.index,
                             pids=escaped, devices=list(worker.devices))  # fmt: skip
            self._held_on.append(HeldDevices(job_id, escaped, worker.devices, escaped=True))
        else:
            self.devices.give_back(worker.devices)

    def _stop_escaped(self, wanted: set[str], now: float) -> None:
        """Stop, as orphans, the processes holding devices that escaped the group of a
        worker whose job no longer runs here: no worker starts until they are gone (the
        re-audit: the next tenant's worker started on the GPU while one still ran, until
        the orphan scan found it a second later, and its grace after). Not the agent's
        subreaper alone: such a process may have been reparented to init."""
        for pid in [p for p in self._orphans if not _still_there(p)]:
            del self._orphans[pid]  # gone (reaped by init, or by the orphan scan)
        for held in self._held_on:
            if not held.escaped or held.job in wanted:
                continue
            job_id = held.job
            # a pid is its process's only while that process carries the worker's mark:
            # one that exited since may be another tenant's process by now (the isolation
            # audit: pid_max 32768, and a job planned for hours), never to be signalled
            held.pids = [p for p in held.pids if _still_there(p) and self._marked(p, job_id)]
            for pid in held.pids:
                if pid in self._orphans or pid in self._given_up:
                    continue
                self._orphans[pid] = (now, False)
                self.log.warning("a worker's process that left its session is stopped",
                                 pid=pid, job=job_id)  # fmt: skip
                _signal_group(pid, signal.SIGTERM)

    def _marked(self, pid: int, job_id: str) -> bool:
        """Whether process ``pid`` carries the mark of a worker of ``job_id`` of this
        agent (its ``OASIS_AGENT`` and ``OASIS_JOB``)."""
        env = self.marks.of(pid)
        return env.get("OASIS_AGENT") == self.session and env.get("OASIS_JOB") == job_id

    def _escaped_of(self, job_id: str, index: int) -> list[int]:
        """The live processes marked as worker ``index`` of ``job_id`` of this agent."""
        out = []
        every = _other_pids()
        self.marks.keep(set(every))
        for pid in every:
            if pid in self.live or _ended(pid):
                continue
            env = self.marks.of(pid)
            if (env.get("OASIS_AGENT") == self.session and env.get("OASIS_JOB") == job_id
                    and env.get("OASIS_WORKER") == str(index)):  # fmt: skip
                out.append(pid)
        return out

    def _failed(
        self,
        job_id: str,
        job: JobWorkers,
        index: int,
        status: str,
        ran: float,
        now: float,
        started: bool = True,
        what: str = "",
        said: str = "",
    ) -> None:
        """Worker ``index`` of ``job`` failed after ``ran`` seconds (or could not be
        ``started``; ``what`` happened, for the log: its exit by default): its
        back-off, and one more of the job's failures, ``said`` (``status`` if "") the
        latest, for its tenant."""
        job.failed += 1
        job.last_failure = (said or status)[:MAX_FAILURE_CHARS]
        failures = 1 if ran >= RESTART_MAX else job.failures.get(index, 0) + 1
        job.failures[index] = failures
        delay = min(RESTART_MAX, RESTART_FIRST * 2 ** (failures - 1))
        job.retry_at[index] = now + delay
        what = what or ("worker exited" if started else "worker could not be started")
        self.log.warning(f"{what}; started again after a back-off", job=job_id,
                         worker=index, status=status, ran_seconds=round(ran, 1),
                         failures=failures, restart_in=delay)  # fmt: skip

    def _gone(self, worker: Worker) -> bool:
        """Whether ``worker`` has ended: its output read to the end, or its process
        group found empty :data:`DRAIN_SECONDS` ago (a process outside the group may
        hold its output open; meanwhile the reader takes what is left in the pipe)."""
        if worker.reader.done():
            return True
        if worker.proc.returncode is None or _group_alive(worker.proc.pid):
            return False
        now: float = self.monotonic()
        if worker.emptied_at is None:
            worker.emptied_at = now
        return now - worker.emptied_at >= DRAIN_SECONDS

    def _reap_departing(self, now: float) -> bool:
        """Take out the departing workers that are gone: output read to its end, or
        their process group empty (a process outside it may hold the output open), or
        given up :data:`GIVE_UP_SECONDS` after their SIGKILL. True if any was."""
        before = len(self.departing)
        for worker in list(self.departing):
            gone = self._gone(worker)
            assert worker.stop_sent is not None
            stuck = now - worker.stop_sent >= self.stop_grace + GIVE_UP_SECONDS
            if not (gone or stuck):
                continue
            if not gone:
                self.log.error(
                    "a departing worker could not be stopped (another user's process?); "
                    "the server's other workers start beside it, on other devices while "
                    "there are", pid=worker.proc.pid, worker=worker.index,
                    devices=list(worker.devices),
                )  # fmt: skip
                self._given_up.add(worker.proc.pid)
                if worker.devices:  # it may still run on them (the review)
                    self._held_on.append(HeldDevices("", [worker.proc.pid], worker.devices))
            else:  # as an exit's: a process that left its group keeps them (the
                # isolation audit: a stopped worker's setsid child ran on, its job still
                # planned here, and the next tenant's worker was put on its GPU)
                self._release(worker.job_id, worker)
            worker.reader.cancel()  # its output is no longer followed
            self.departing.remove(worker)
            worker.job.done_before += worker.count[0]
        return len(self.departing) < before

    def _escalate(self, now: float) -> None:
        """SIGKILL the departing workers and orphans past their grace."""
        for worker in self.departing:
            assert worker.stop_sent is not None
            if not worker.killed and now - worker.stop_sent >= self.stop_grace:
                worker.killed = True
                if _group_alive(worker.proc.pid):
                    self.log.warning("worker did not stop within the grace: killed",
                                     pid=worker.proc.pid, worker=worker.index,
                                     grace_seconds=self.stop_grace)  # fmt: skip
                    _kill_group(worker.proc.pid, signal.SIGKILL)  # its leader may be gone
        for pid, (sent, killed) in list(self._orphans.items()):
            if not killed and now - sent >= self.stop_grace:
                self._orphans[pid] = (sent, True)
                self.log.warning("an escaped worker process did not stop within the grace: "
                                 "killed", pid=pid, grace_seconds=self.stop_grace)  # fmt: skip
                _signal_group(pid, signal.SIGKILL)
            elif now - sent >= self.stop_grace + GIVE_UP_SECONDS:
                self.log.error("an escaped worker process could not be stopped", pid=pid)
                del self._orphans[pid]
                self._given_up.add(pid)

    def _stop_leftovers(self, now: float) -> None:
        """At the first step: stop the workers an earlier agent of this server left
        behind (killed with -9, or by the kernel's OOM killer): they were reparented to
        init, not to this agent, and ran on beside the workers it started (the
        re-audit: four workers for a plan of two). They are known by their environment:
        this agent's ``OASIS_AGENT_KEY`` (the same broker, prefix and server; before, any
        agent of the server name's, and an agent of another prefix stopped a running
        agent's workers), another agent's ``OASIS_AGENT``. Stopped as orphans are; no
        worker starts until they are gone."""
        for pid in _other_pids():
            env = self.marks.of(pid)
            agent = env.get("OASIS_AGENT")
            if not agent or agent == self.session or not self.key:
                continue
            if env.get("OASIS_AGENT_KEY") != self.key:  # another broker's, prefix's or server's
                continue
            self._orphans[pid] = (now, False)
            self.log.warning("a worker an earlier agent of this server left is stopped",
                             pid=pid, job=env.get("OASIS_JOB"), agent=agent)  # fmt: skip
            _signal_group(pid, signal.SIGTERM)

    def _scan_orphans(self, wanted: set[str], now: float) -> None:
        """Stop the processes reparented to the agent that carry its mark and whose
        job is not running here; reap those that exited (every child of the agent is
        its workers' or their descendants')."""
        known = {w.proc.pid for w in self.departing} | self.live.keys()
        seen: set[int] = set()
        children = _children()
        self._given_up &= set(children)  # gone: its pid may come back as another's
        for pid in children:
            if pid in known or pid in self._given_up:  # asyncio reaps the workers
                continue
            if _ended(pid):  # a zombie to reap (or gone meanwhile)
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
                self._orphans.pop(pid, None)
                continue
            seen.add(pid)
            if pid in self._orphans:
                continue
            env = self.marks.of(pid)
            if env.get("OASIS_AGENT") != self.session:
                continue  # not marked as this agent's: never signalled
            try:
                group = os.getpgid(pid)
            except ProcessLookupError:
                continue
            if group in known:  # still in its worker's group: stopped with the group
                continue
            job = env.get("OASIS_JOB")
            if job in wanted:
                continue  # its job runs here: it is part of its work
            self._orphans[pid] = (now, False)
            self.log.warning("a worker's process that left its session is stopped",
                             pid=pid, job=job)  # fmt: skip
            _signal_group(pid, signal.SIGTERM)
        for pid in [p for p in self._orphans if p not in seen and _ended(p)]:
            del self._orphans[pid]  # gone (a leftover is no child of this agent)


class OutputBudget:
    """How fast the agent reads one worker's output: :data:`OUTPUT_LINES_PER_SECOND`
    lines and :data:`OUTPUT_BYTES_PER_SECOND` bytes a second, a second's worth at once.
    A worker that writes faster waits on its full pipe, which slows only itself. Before,
    a worker printing as fast as it could (``yes``) took a whole core of the server
    from the other tenants' workers, and the agent's event loop with it
    (``bench/agent_output.py``). Once the worker's leader has exited and its group is
    empty, what is left in the pipe (bounded) is read at once, its last count included.

    Args:
        ended: whether the worker's processes are all gone.
        monotonic: the clock.
    """

    def __init__(self, ended: Any, monotonic: Any = time.monotonic) -> None:
        self.ended = ended
        self.monotonic = monotonic
        self.lines = OUTPUT_LINES_PER_SECOND
        self.bytes = OUTPUT_BYTES_PER_SECOND
        self.at = monotonic()

    async def spend(self, size: int) -> None:
        """One line of ``size`` bytes was read: wait while over the budget."""
        now = self.monotonic()
        elapsed, self.at = now - self.at, now
        self.lines = min(OUTPUT_LINES_PER_SECOND,
                         self.lines + elapsed * OUTPUT_LINES_PER_SECOND) - 1  # fmt: skip
        self.bytes = min(OUTPUT_BYTES_PER_SECOND,
                         self.bytes + elapsed * OUTPUT_BYTES_PER_SECOND) - size  # fmt: skip
        wait = max(-self.lines / OUTPUT_LINES_PER_SECOND, -self.bytes / OUTPUT_BYTES_PER_SECOND)
        if wait > 0 and not self.ended():
            await asyncio.sleep(wait)


def _protocol_of(stream: asyncio.StreamReader) -> Any:
    """A protocol factory feeding ``stream`` (``loop.connect_read_pipe``)."""
    return lambda: asyncio.StreamReaderProtocol(stream)


def _close_all(fds: list[int]) -> None:
    """Close each descriptor of ``fds`` and empty the list (each closed once)."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


def _become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux); False if it cannot."""
    import ctypes  # here: the CLI imports this module for its defaults

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """This process's children, from ``/proc/self/task/*/children``."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                out.extend(int(p) for p in f.read().split())
    return out


def _other_pids() -> list[int]:
    """Every process's id, as ``/proc`` lists them, but this process's."""
    mine = os.getpid()
    return [pid for pid in pids() if pid != mine]


def _ended(pid: int) -> bool:
    """Whether ``pid`` has ended: a zombie, or no such process."""
    try:
        return stat_fields(pid)[0] in ZOMBIE_STATES
    except (OSError, IndexError):
        return True


def _environment_of(pid: int) -> dict[str, str]:
    """``pid``'s environment as it started (its first bytes: :mod:`worker_marks`); {}
    if it cannot be read."""
    return environment_of(pid)


def _signal_group(pid: int, sig: int) -> None:
    """``sig`` to ``pid``'s process group if it leads one, else to ``pid`` alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            leads = os.getpgid(pid) == pid
        except ProcessLookupError:
            return
        if leads:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _still_there(pid: int) -> bool:
    """Whether ``pid``, or the process group it leads, has a process left."""
    return _group_alive(pid) or not _ended(pid)


def _group_alive(group: int) -> bool:
    """Whether process group ``group`` has a process left (one the agent may not signal
    counts as left)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(group: int, sig: int) -> None:
    """``sig`` to process group ``group`` (a worker's: its leader's pid), if any is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _in_words(code: int | None) -> str:
    """A worker's exit in words for its job's tenant (``exit status 1``, ``killed by
    SIGSEGV``)."""
    if code is not None and code >= 0:
        return f"exit status {code}"
    return _status(code)


def _status(code: int | None) -> str:
    """A process's exit status in words."""
    if code is None:
        return "unknown"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"
