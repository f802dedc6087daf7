"""``oasis agent --server NAME``: the reference node agent.

It follows its server's retained plan (:class:`~controller.plane.plan_messages.Plan`): in each
slot it runs the tasks planned there, switching to the plan's next slot on its own at
the slot boundary (so a late plan or a broker outage does not stall it), and ignores a
plan whose epoch is lower than the one it follows. Once the last slot it has a plan for
has ended (the next slot's start plus the plan's slot length) it runs nothing: that
capacity may have been given to other jobs meanwhile; a new plan sets it going again.
It sends heartbeats and cumulative progress per job (mini-batches done, worker-seconds
spent), at most :data:`~controller.plane.agent_messages.MAX_REPORT_JOBS` jobs per message.

It also reads the daemon's retained status: once the daemon says it is online and its
cluster has no server of this agent's name, the agent stops with
:class:`UnknownServerError` (a typo would otherwise wait forever for a plan). Each
time the daemon says it is online (it connected, e.g. after a restart), and each time
the agent reconnects, the counts of the jobs reported within the last two slots are sent
again, and so are those of the jobs of every new plan: reports sent while the daemon or
the broker was away are lost.

Work is either simulated -- each worker finishes a mini-batch every
``minibatch_seconds / speed`` seconds (``--speed 2``: twice as fast as planned) -- or
done by a command launched per worker (``--command``), which gets ``OASIS_JOB``,
``OASIS_SERVER``, ``OASIS_WORKER``, ``OASIS_MINIBATCH_SECONDS``, ``OASIS_AGENT`` and
``OASIS_AGENT_KEY`` in its environment, its own devices in ``CUDA_VISIBLE_DEVICES``
and ``OASIS_DEVICES`` when its task needs any (:mod:`controller.plane.devices`), and its
task's demand in ``OASIS_DEMAND`` and ``OASIS_DEMAND_<NAME>`` when the plan says it
(:mod:`controller.plane.demand`; a guard may stop one over its memory demand:
:mod:`controller.plane.memory_guard`), and
prints its cumulative mini-batch count, one number per line, as it goes; it is stopped
(SIGTERM, then SIGKILL after a grace) when its task leaves the plan, and started again
after a back-off if it fails (:mod:`controller.plane.workers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiomqtt
import structlog

from controller.plane.agent_messages import (
    MAX_COUNT,
    MAX_ENTRIES_LEFT_OUT,
    MAX_FAILURES,
    MAX_REPORT_JOBS,
    Heartbeat,
    Progress,
    Status,
    TaskProgress,
)
from controller.plane.client import LatestPerTopic, Stopping, client_for
from controller.plane.devices import Devices
from controller.plane.memory_guard import MemoryGuard
from controller.plane.one_agent import agent_key
from controller.plane.plan_messages import Plan, PlanParts, SlotPlan
from controller.plane.set_aside import SetAside
from controller.plane.settings import MIN_HEARTBEAT_SECONDS, MqttConfig
from controller.plane.topics import Topics, topic_name
from controller.plane.workers import (
    STOP_GRACE,
    Commands,
    JobWorkers,
    OutputBudget,
    worker_environment,
)
from pricing.errors import SpecError
from pricing.fields import closest

__all__ = [
    "MIN_HEARTBEAT_SECONDS",
    "Agent",
    "TaskState",
    "UnknownServerError",
    "worker_environment",
]

_STEP = 0.05  # seconds between simulation steps
_FORGET_EVERY = 10.0  # seconds between looks for jobs to set aside (Agent.forget_idle)
_BACKOFF_MAX = 5.0


NO_PLAN_SECONDS = 30.0
"""Seconds connected without a plan after which the agent warns, once: the daemon
publishes every configured server's plan, retained, so one connected to the right broker
and prefix, whose user may read its plan's topic, has it at once. One run by hand with
another ``--mqtt-username`` than its node (the broker's ACL lets a user read its own
server's plan only) beat on without a word, its jobs never run (the first-day audit)."""

LAST_REPORT_SECONDS = 3.0
"""The longest the agent's stop waits to send its workers' last counts."""


class UnknownServerError(Exception):
    """The daemon is online and its cluster has no server of the agent's name."""

    def __init__(self, server: str, known: list[str]) -> None:
        close = closest(server, known)
        hint = f"; did you mean {close!r}?" if close else ""
        shown = ", ".join(sorted(known)[:20]) + (", ..." if len(known) > 20 else "")
        super().__init__(f"server {server!r} is not in the daemon's cluster (known: {shown}){hint}")
        self.server = server


@dataclass
class TaskState:
    """What this agent did for one job (cumulative over the agent's life).

    Attributes:
        minibatches: mini-batches its workers here finished.
        worker_seconds: seconds its workers ran, summed over workers.
        workers: its worker commands (``--command``: :mod:`controller.plane.workers`),
            with the counts of those that exited.
        run: the admission these counts are for (:class:`Task`); "": not said.
        total: the job's mini-batches in all (its task's), a cap on ``minibatches``.
    """

    minibatches: float = 0.0
    worker_seconds: float = 0.0
    workers: JobWorkers = field(default_factory=JobWorkers)
    run: str = ""
    total: int = 0  # the job's mini-batches, as its plan's task says (0: not known yet)


class Agent:
    """One server's agent; see the module docstring.

    Args:
        server: the server's name, as in the daemon's cluster.
        mqtt: the broker.
        speed: simulated speed relative to the plan (1: as planned).
        command: a shell command run per worker instead of the simulation.
        report_seconds: how often progress is sent, seconds.
        wall: Unix time, to find the slot in progress.
        stop_grace: seconds from a departing worker's SIGTERM to its SIGKILL.
        adopt_orphans: stop the workers' descendants that leave their sessions (the
            agent's process becomes their subreaper: ``oasis agent`` itself).
        devices: the ids of the server's devices to hand to workers (``--devices``);
            None: ``0 .. n - 1`` of the plan's ``devices``.
        devices_from: where ``devices`` came from, for warnings.
        key: this agent's place on the machine (:func:`~controller.plane.one_agent.
            agent_key`); None: computed from ``mqtt`` and ``server``.
        memory_guard: stop the worker commands over their memory demand
            (``--memory-resource``: :mod:`controller.plane.memory_guard`); None: none.
    """

    def __init__(
        self,
        server: str,
        mqtt: MqttConfig,
        speed: float = 1.0,
        command: str = "",
        report_seconds: float = 1.0,
        wall: Callable[[], float] = time.time,
        stop_grace: float = STOP_GRACE,
        adopt_orphans: bool = False,
        devices: Sequence[str] | None = None,
        devices_from: str = "--devices",
        key: str | None = None,
        memory_guard: MemoryGuard | None = None,
        no_plan_seconds: float = NO_PLAN_SECONDS,
    ) -> None:
        if not (0 < speed < math.inf):
            raise ValueError(f"speed: must be a number > 0, got {speed}")
        self.server = topic_name(server, "server")
        self.mqtt = mqtt
        self.topics = Topics(mqtt.topic_prefix)
        self.stopping = Stopping()  # asked by SIGTERM (controller.commands.agent.run_agent)
        self.speed = speed
        self.command = command
        self.report_seconds = report_seconds
        self.wall = wall
        self.session = uuid.uuid4().hex[:12]
        self.plan: Plan | None = None
        self._parts = PlanParts()  # a plan published in parts, put back together
        self.tasks: dict[str, TaskState] = {}
        self.log = structlog.get_logger("oasis-agent").bind(server=server)
        self._reported: dict[str, tuple[float, float]] = {}
        self._failures_sent: dict[str, int] = {}  # job -> its workers' failures last sent
        self._sent_at: dict[str, float] = {}  # job -> monotonic time its counts last went out
        # jobs this server no longer runs, their counts sent long ago, out of the loops
        # that run every step (:meth:`forget_idle`), until no plan can bring them back
        self._idle = SetAside()
        self._away_since: float | None = None  # monotonic time the daemon was seen offline
        self._ran_out = False  # the plan's last slot ended (logged once)
        self._late_by = 0.0  # seconds the plan followed had run out by when it came
        self._counted: int | None = None  # the devices the plan counts
        self.memory_guard = memory_guard
        self._unguarded_said = False  # plans whose demands lack the memory resource: said
        self.no_plan_seconds = no_plan_seconds
        self._no_plan_said = False  # connected that long with no plan: said (once)
        self.commands = (
            Commands(command, self.server, self.session, self._read_counts, self.log,
                     stop_grace, adopt_orphans, devices=Devices(devices, devices_from),
                     key=key if key is not None else agent_key(
                         mqtt.host, mqtt.port, mqtt.topic_prefix, self.server),
                     memory_guard=memory_guard)
            if command else None
        )  # fmt: skip

    # -- the plan -----------------------------------------------------------------------

    def accept(self, plan: Plan) -> bool:
        """Follow ``plan`` unless it is older than the one followed; True if taken. A new
        plan's jobs get their counts sent again: the daemon that issued it (perhaps just
        restarted, or after the broker's) may have missed them."""
        if plan.server != self.server:
            return False
        if self.plan is not None and plan.epoch < self.plan.epoch:
            self.log.info("stale plan ignored", epoch=plan.epoch, following=self.plan.epoch)
            return False
        if self.plan is None or plan.epoch != self.plan.epoch:
            self.log.info("plan", epoch=plan.epoch, slot=plan.current.slot,
                          tasks=[(t.job, t.workers, t.ps) for t in plan.current.tasks])  # fmt: skip
            refused, error = plan.left_out
            if refused:
                self.log.warning(
                    "plan entries left out as bad: their jobs do not run here, every "
                    "other task of the plan does", epoch=plan.epoch, entries=refused,
                    error=error,
                )  # fmt: skip
            for task in (*plan.current.tasks, *plan.next.tasks):
                self._reported.pop(task.job, None)
        if self.plan is None or plan.epoch != self.plan.epoch:
            self._late_by = self.wall() - (plan.next.starts_at + plan.slot_seconds)
        self.plan = plan
        if self.commands is not None:
            self._size_devices(plan.devices)
            self._check_guarded(plan)
        return True

    def _check_guarded(self, plan: Plan) -> None:
        """Say once that the plan's tasks carry demands without the memory guard's
        resource (its name mistyped, or a cluster without it): no worker is limited."""
        guard = self.memory_guard
        if guard is None or self._unguarded_said:
            return
        tasks = [t for t in (*plan.current.tasks, *plan.next.tasks) if t.demand]
        if tasks and all(guard.amount(t.demand) is None for t in tasks):
            self._unguarded_said = True
            self.log.warning("no task of the plan has a demand of the memory resource: "
                             "its workers are not limited", resource=guard.resource,
                             carried=sorted({n for t in tasks for n in t.demand}))  # fmt: skip

    def _size_devices(self, count: int | None) -> None:
        """The plan counts ``count`` devices (None: says nothing of them): hand out as
        many, or say once a count that the ids given are fewer."""
        assert self.commands is not None
        devices = self.commands.devices
        devices.resize(count)
        given = devices.given
        if (
            given is not None
            and count is not None
            and count != self._counted
            and len(given) < count
        ):
            self.log.warning(f"the plan counts more devices than {devices.source} lists: "
                             "workers will share devices", planned=count,
                             listed=len(given), ids=given)  # fmt: skip
        self._counted = count

    def active(self) -> SlotPlan | None:
        """The slot plan in force now: the next slot's once it has begun; None with no
        plan, or once the plan's next slot has ended (nothing is planned past it)."""
        plan = self.plan
        if plan is None:
            return None
        now = self.wall()
        if now >= plan.next.starts_at + plan.slot_seconds:
            if not self._ran_out:
                self._ran_out = True
                self.log.warning("plan ran out; idle until a new plan", epoch=plan.epoch,
                                 last_slot=plan.next.slot, why=self._why_ran_out())  # fmt: skip
            return None
        self._ran_out = False
        if now >= plan.next.starts_at:
            return plan.next
        return plan.current

    def _why_ran_out(self) -> str:
        """The likely cause of a plan running out, for the operator: the daemon offline,
        this server's clock ahead (the plan had run out by it when it came, the daemon
        online: a plan comes at each slot boundary, its current slot just begun), or no
        newer plan reaching this server."""
        if self._away_since is not None:
            return "the daemon is offline; its plans resume when it is back"
        if self._late_by > 0:
            return (f"the plan had run out by this server's clock when it came, "
                    f"{self._late_by:.0f} s past its last slot: this server's clock may be "
                    "ahead of the head node's (check NTP; the daemon's metric "
                    "oasis_agent_clock_offset_seconds says by how much)")  # fmt: skip
        return "no newer plan has come: the broker or the daemon may be out of reach"

    # -- work ---------------------------------------------------------------------------

    def step(self, dt: float) -> None:
        """Simulate ``dt`` seconds of the active slot's tasks: one task per job, its
        last in the slot, as the worker commands take them (:meth:`_commands`). Before, a
        plan naming one job twice in a slot, under two admissions (``run``), started the
        job's counts afresh twice a step, for good: it never progressed, and the agent
        logged 40 lines a second (the audit of what arrives on the plan topic)."""
        slot = self.active()
        if slot is None:
            return
        for task in {t.job: t for t in slot.tasks}.values():
            if task.workers <= 0:
                continue
            state = self._task(task.job, task.run)
            if state.minibatches >= task.minibatches:
                continue
            rate = task.workers * self.speed / task.minibatch_seconds
            state.minibatches = min(float(task.minibatches), state.minibatches + rate * dt)
            state.worker_seconds += task.workers * dt

    async def _commands(self, dt: float) -> None:
        """Start and stop the per-worker commands so they match the active slot
        (:class:`~controller.plane.workers.Commands`)."""
        assert self.commands is not None
        slot = self.active()
        wanted = {t.job: t for t in (slot.tasks if slot else []) if t.workers > 0}
        for job, task in wanted.items():
            self._task(job, task.run).total = task.minibatches
        for state in self.tasks.values():
            state.worker_seconds += len(state.workers.running) * dt
        await self.commands.follow(
            {job: state.workers for job, state in self.tasks.items()},
            {job: (task.workers, {"OASIS_MINIBATCH_SECONDS": str(task.minibatch_seconds)},
                   task.devices, task.demand)
             for job, task in wanted.items()},
        )  # fmt: skip
        self._fold_counts()

    def _fold_counts(self) -> None:
        """Each job's mini-batches from its worker commands' counts."""
        assert self.commands is not None
        for state in self.tasks.values():
            # not past the job's whole: one line of 9e15 showed as 9e15 of 60 (the re-audit)
            counted = self.commands.count(state.workers)
            state.minibatches = min(counted, state.total) if state.total else counted

    async def _read_counts(
        self,
        stream: asyncio.StreamReader,
        count: list[float],
        budget: OutputBudget | None = None,
    ) -> None:
        """Follow a worker command's counts (its output ``stream``), one number a line, to
        the end of its output, no faster than ``budget`` allows; other lines are skipped,
        a line over the stream's limit (64 KiB) too: the reading goes on (it stopped
        there before, and the command then blocked on a full pipe)."""
        rest = False  # what comes up to the next newline is the rest of a long line
        while True:
            try:
                line = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:  # the end: a last line, or none
                line = end.partial
                if not line:
                    break
            except asyncio.LimitOverrunError as over:  # a line over the limit (64 KiB)
                await stream.readexactly(over.consumed)  # its start, dropped
                if budget is not None:
                    await budget.spend(over.consumed)
                rest = True
                continue
            if budget is not None:
                await budget.spend(len(line))
            if rest:  # its tail, with the newline (were it digits, it is no count)
                rest = False
                continue
            with contextlib.suppress(ValueError):
                value = float(line.decode().strip())
                if 0 <= value <= MAX_COUNT:  # not nan or inf: the daemon refuses those
                    count[0] = max(count[0], value)

    def _task(self, job: str, run: str = "") -> TaskState:
        """``job``'s state here for its admission ``run`` (:class:`Task`), its counts
        carried on if it was set aside idle. Counts of another run of the same id are
        dropped (its commands stopped): before, a job submitted again under the id of
        one lost with a restored store began at the lost one's 47%, and completed with
        half its work done (the restore audit)."""
        state = self.tasks.get(job)
        if state is not None and run and state.run and state.run != run:
            self.log.info("job id planned for another admission: its counts start afresh",
                          job=job, run=run, before=state.run)  # fmt: skip
            if self.commands is not None:
                self.commands.stop_job(state.workers)
            del self.tasks[job]
            self._reported.pop(job, None)
            self._failures_sent.pop(job, None)
            state = None
        if state is None:
            done, seconds, was = self._idle.take(job)
            if run and was and was != run:
                done, seconds = 0.0, 0.0
            state = self.tasks[job] = TaskState(
                done, seconds, JobWorkers(done_before=done), run=run or was
            )
        elif run and not state.run:
            state.run = run
        return state

    def forget_idle(self, now: float | None = None) -> int:
        """Set aside the jobs this server no longer runs: in neither slot of its plan,
        no command running, their last counts sent more than two slots ago, and the
        daemon online (it may ask for them again after a reconnection). Their counts are
        kept, and carried on if a plan brings one back, but no step loops over them:
        every job an agent ever ran was looked at every 50 ms, 15 ms a step (31% of a
        core) after 20,000 jobs. Their counts go once no plan can bring the job back
        (:meth:`.SetAside.expire`). Returns how many were set aside."""
        now = time.monotonic() if now is None else now
        plan = self.plan
        if self._away_since is not None:
            return 0
        ahead: tuple[SlotPlan, ...] = ()  # the slots of its plan that have not ended
        if plan is not None:
            ahead = (
                (plan.next,) if self.wall() >= plan.next.starts_at else (plan.current, plan.next)
            )
        planned = {t.job for slot in ahead for t in slot.tasks}
        horizon = 2 * (plan.slot_seconds if plan else 3600.0)
        idle = [
            job
            for job, state in self.tasks.items()
            if job not in planned
            and not (self.commands is not None and self.commands.busy(state.workers))
            and self._reported.get(job) == (state.minibatches, state.worker_seconds)
            and self._failures_sent.get(job, 0) == _failures(state)
            and now - self._sent_at.get(job, now) >= horizon
        ]
        for job in idle:
            state = self.tasks.pop(job)
            self._idle.put(job, state.minibatches, state.worker_seconds, state.run)
            self._reported.pop(job, None)
            self._failures_sent.pop(job, None)
            self._sent_at.pop(job, None)
        if plan is not None:  # and those no plan can bring back any more are dropped
            self._idle.expire(self.wall(), plan.window, plan.slot_seconds)
        return len(idle)

    def progress(self, only_changed: bool = True) -> Progress | None:
        """The progress report to send (None if nothing changed since the last one)."""
        reports = self.reports(only_changed)
        return reports[0] if reports else None

    def reports(self, only_changed: bool = True) -> list[Progress]:
        """The progress to send, in messages of at most ``MAX_REPORT_JOBS`` jobs (the
        daemon drops larger ones); ``[]`` if nothing changed since the last one."""
        jobs = []
        for job, s in self.tasks.items():
            now = (s.minibatches, s.worker_seconds)
            # a new failure is news too: workers failing at once add no worker-second
            if (only_changed and self._reported.get(job) == now
                    and self._failures_sent.get(job, 0) == _failures(s)):  # fmt: skip
                continue
            # within what the daemon takes, or it drops the entry (workers' sums can pass it)
            jobs.append(TaskProgress(job, min(s.minibatches, MAX_COUNT),
                                     min(s.worker_seconds, MAX_COUNT), s.run, _failures(s),
                                     s.workers.last_failure))  # fmt: skip
        return [
            Progress(self.server, self.session, jobs[i : i + MAX_REPORT_JOBS])
            for i in range(0, len(jobs), MAX_REPORT_JOBS)
        ]

    def resend_recent(self, now: float | None = None) -> None:
        """After a reconnection: send again the counts of the jobs reported within the
        last two slots (the broker may have lost them in flight), and all those reported
        since the daemon was seen going offline (it heard none of them; a job whose plan
        ended meanwhile still counts them). Older ones reached the daemon long ago and no
        longer count there, so they are not sent again."""
        now = time.monotonic() if now is None else now
        horizon = 2 * (self.plan.slot_seconds if self.plan else 3600.0)
        if self._away_since is not None:
            horizon = max(horizon, now - self._away_since + horizon)
        for job in [j for j, at in self._sent_at.items() if now - at < horizon]:
            self._reported.pop(job, None)

    def status(self, status: Status) -> None:
        """The daemon's status: UnknownServerError if it is online without this server.
        A daemon (re)connecting says it is online: it missed what was reported while it
        was away, so the recent counts go out again."""
        if status.online and self.server not in status.servers:
            raise UnknownServerError(self.server, status.servers)
        if status.online:
            self.resend_recent()
            self._away_since = None
        elif self._away_since is None:
            self._away_since = time.monotonic()

    # -- the connection -----------------------------------------------------------------

    async def run(self) -> None:
        """Work and talk to the broker until cancelled; reconnect with backoff. If the
        work loop fails (a bug), the agent stops with its error, rather than heartbeat on
        while running nothing (the review)."""
        worker = asyncio.create_task(self._work())
        main = asyncio.current_task()
        failed: list[BaseException] = []

        def ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None and main is not None:
                failed.append(task.exception())  # type: ignore[arg-type]
                main.cancel()

        worker.add_done_callback(ended)
        delay = 0.2
        last_error = ""
        try:
            while True:
                if failed:  # the cancellation may have come out as a broker error
                    raise asyncio.CancelledError
                self.stopping.check()
                client = self._client()
                try:
                    async with client:
                        delay, last_error = 0.2, ""
                        self.resend_recent()
                        await self._session(client)
                except aiomqtt.MqttError as err:
                    # a new reason (a refused password, a bad certificate, the broker
                    # down) is a warning once, as the daemon's; the same on each retry is
                    # not. All info, a refused login went unseen under --log-level warning
                    level = self.log.info if str(err) == last_error else self.log.warning
                    level("broker unavailable", error=str(err), retry_in=delay)
                    last_error = str(err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
        except asyncio.CancelledError:
            if failed:
                raise RuntimeError(f"the agent's work loop failed: {failed[0]!r}") from failed[0]
            raise
        finally:
            worker.cancel()
            if self.commands is not None:  # every worker gone before the agent is
                await self.commands.stop_all()
                self._fold_counts()
                await self._last_report()

    async def _last_report(self) -> None:
        """Once the workers are gone: the counts not sent yet (those printed during
        their stop grace included) go out on a connection of their own, within
        :data:`LAST_REPORT_SECONDS`. Before, the agent's stop sent none: the audit's job
        was reported 24 mini-batches short of what its workers did."""
        reports = self.reports()
        if not reports:
            return
        try:
            async with asyncio.timeout(LAST_REPORT_SECONDS):
                async with self._client() as client:
                    await self._publish(client, reports)
            self.log.info("last progress sent", jobs=sum(len(r.jobs) for r in reports))
        except (aiomqtt.MqttError, OSError, TimeoutError) as err:
            self.log.warning("last progress not sent: the broker is away",
                             error=str(err) or type(err).__name__)  # fmt: skip

    async def _work(self) -> None:
        last = forgot = time.monotonic()
        while True:
            await asyncio.sleep(_STEP)
            now = time.monotonic()
            dt, last = now - last, now
            if self.command:
                await self._commands(dt)
            else:
                self.step(dt)
            if now - forgot >= _FORGET_EVERY:
                self.forget_idle(now)
                forgot = now

    async def _session(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self.topics.plan(self.server), qos=1)
        await client.subscribe(self.topics.plan_parts(self.server), qos=1)  # a plan in parts
        await client.subscribe(self.topics.status, qos=1)
        self.log.info("connected", host=self.mqtt.host, port=self.mqtt.port)
        self.stopping.check()  # else the task group would run on, never cancelled
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive(client))
                group.create_task(self._beat(client))
                group.create_task(self._report(client))
        except* aiomqtt.MqttError as lost:  # one task saw the connection go: reconnect
            raise lost.exceptions[0] from None
        except* UnknownServerError as unknown:
            raise unknown.exceptions[0] from None

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray | str):
                continue
            is_status = str(message.topic) == self.topics.status
            if not payload and not is_status:  # a part's topic cleared: nothing there
                continue
            try:
                if is_status:
                    self.status(Status.parse(payload))
                else:
                    whole = self._parts.add(Plan.parse(payload))
                    if whole is not None:
                        self.accept(whole)
            except SpecError as err:
                self.log.warning("bad status" if is_status else "bad plan", error=str(err))

    async def _beat(self, client: aiomqtt.Client) -> None:
        connected = time.monotonic()
        while True:
            self.stopping.check()
            self._no_plan_yet(time.monotonic() - connected)
            epoch = self.plan.epoch if self.plan else 0
            store = self.plan.store if self.plan else ""
            short = self.commands.devices_short() if self.commands is not None else 0
            left = self.plan.left_out[0] if self.plan else 0
            beat = Heartbeat(self.server, self.session, epoch, sent_at=self.wall(), store=store,
                             devices_short=short,
                             entries_left_out=min(left, MAX_ENTRIES_LEFT_OUT))  # fmt: skip
            await client.publish(self.topics.heartbeat(self.server), beat.to_bytes(), qos=0)
            sent = time.monotonic()
            # the interval comes with the plan, which may arrive (or change) meanwhile
            while time.monotonic() - sent < self._beat_interval():
                await asyncio.sleep(min(0.05, self._beat_interval()))

    def _no_plan_yet(self, connected_for: float) -> None:
        """Warn, once, when connected ``connected_for`` seconds (at least
        :data:`NO_PLAN_SECONDS`) without a plan: what to check."""
        if self.plan is not None or self._no_plan_said or connected_for < self.no_plan_seconds:
            return
        self._no_plan_said = True
        self.log.warning(
            "no plan received: oasisd publishes every configured server's plan, retained, "
            "while it runs with [mqtt]; check that it runs with this broker and topic "
            "prefix, and that this broker user may read the topic (the broker's ACL: a "
            "node's user reads its own server's plan, so --mqtt-username is the node's "
            "name)",
            seconds=round(connected_for), topic=self.topics.plan(self.server),
            username=self.mqtt.username or None,
        )  # fmt: skip

    def _beat_interval(self) -> float:
        """Seconds between heartbeats: the plan's, else the broker settings', at least
        :data:`MIN_HEARTBEAT_SECONDS`. Before, a plan of ``heartbeat_seconds`` 1e-300
        (any number > 0 parses) sent thousands a second: past the daemon's rate per
        agent, which then dropped this server's progress reports as well (the audit of
        what arrives on the plan topic)."""
        asked = self.plan.heartbeat_seconds if self.plan else self.mqtt.heartbeat_seconds
        return max(MIN_HEARTBEAT_SECONDS, asked)

    async def _report(self, client: aiomqtt.Client) -> None:
        while True:
            self.stopping.check()
            await asyncio.sleep(self.report_seconds)
            await self._publish(client, self.reports())

    async def _publish(self, client: aiomqtt.Client, reports: list[Progress]) -> None:
        """Send ``reports`` (:meth:`reports`), each job's counts noted as sent."""
        for report in reports:
            await client.publish(self.topics.progress(self.server), report.to_bytes(), qos=1)
            for t in report.jobs:
                self._reported[t.job] = (t.minibatches, t.worker_seconds)
                self._failures_sent[t.job] = t.failures
                self._sent_at[t.job] = time.monotonic()

    def _client(self) -> aiomqtt.Client:
        """A broker connection of this agent's session (one at a time)."""
        return client_for(self.mqtt, f"agent-{self.server}-{self.session}",
                          queue_type=LatestPerTopic)  # fmt: skip


def _failures(state: TaskState) -> int:
    """The failures of ``state``'s workers, as a report says them."""
    return min(state.workers.failed, MAX_FAILURES)
