"""Each job's reported progress against its plan: the plane's reactions per job, in the
admission controller's decision thread, always committing to the store before the
ledger changes hands:

- **done early**: a job whose reported mini-batches reach ``E * N * M`` completes in
  the current slot; its slots from the next one on are released and prices fall.
- **slower than planned**: the job's mini-batch time is re-estimated
  (:mod:`pricing.runtime_estimate`); when even the optimistic end of the predictive
  interval needs more time than the plan holds, the remaining work is re-planned, and
  the new plan is taken if its payoff is positive (else the job is reported ``behind``).
  The searches take turns (:mod:`controller.plane.replan_turns`): a submitter's in a
  slot, and all of one review's, are held to a budget of steps.
- **stalled**: a job whose workers spent half its planned worker-seconds without one
  mini-batch reported is reported ``behind`` (``no_progress``), once.
- **plan ended short**: a running job whose plan has ended while its agents reported
  less than its work stays ``running`` (the slot clock asks
  :meth:`~controller.plane.execution.Execution.unfinished`, which asks
  :meth:`JobReview.unfinished`); it completes when they report the rest, and becomes
  ``failed`` (``plan_ended``) if they have not within ``heartbeat_timeout`` seconds of
  the slot boundary. A job nobody reported on completes with its plan, as without the
  plane, unless that plan had slots whose plans never went out
  (:attr:`JobReview.unsent`), or slots no round carried its plan in, it being written
  after the round that held them went out (:mod:`controller.plane.sent_plans`):
  ``plan_not_sent``; or servers whose agent was never heard: ``plan_ended``, naming
  them (``agents_never_heard``); or servers whose agent beat but never said it follows a
  plan (``agents_following_no_plan``), or follows an older plan than the one that carried
  the job there (``agents_behind_their_plan``: :mod:`controller.plane.taken_plans`).

The progress it judges is :class:`~controller.plane.execution.Execution`'s (read here,
never changed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from controller.events import Event
from controller.failed_reasons import failed_reason
from controller.limits import search_size
from controller.plane.jobs import ACTIVE, Jobs
from controller.plane.part import PlanePart
from controller.plane.port import AdmissionPort
from controller.plane.progress import LEVEL, MIN_SAMPLES, JobProgress
from controller.plane.replan_turns import ReplanTurns, in_turn
from controller.plane.sent_plans import SentPlans, counter, joined_runs
from controller.plane.settings import MqttConfig
from controller.plane.taken_plans import TakenPlans
from controller.plane.worker_failures import FailuresHeard
from controller.store import AllocationRow, EventRow, JobRow, StoreUnavailableError, in_batches
from pricing import ADMIT_THRESHOLD, Job
from pricing.best_schedule import BestSchedule
from pricing.errors import SpecError
from pricing.replan import release_rest_of, replan_remaining
from pricing.runtime_estimate import RuntimePrior, fit

__all__ = ["COMPLETIONS_PER_REVIEW", "MAX_UNSENT_RUNS", "JobReview"]

MAX_UNSENT_RUNS = 16
"""Runs of slots whose plans never went out that the plane keeps (the newest): a job
planned in one still waits for its agents' counts (:meth:`JobReview.unfinished`)."""

MAX_UNHEARD_NAMED = 10
"""The most servers whose agent was never heard a failed job's event names."""

COMPLETIONS_PER_REVIEW = 250
"""The most jobs one review completes (in one transaction); the rest at the next review,
a second later, every other call decided in between."""


class JobReview(PlanePart):
    """The per-job reactions to reported progress; see the module docstring.

    Args:
        controller: the opened admission controller.
        mqtt: the broker settings (``heartbeat_timeout``).
        progress: the plane's progress per job (read only).
        jobs: the plane's job specs and guarded ledger changes.
    """

    def __init__(
        self,
        controller: AdmissionPort,
        mqtt: MqttConfig,
        progress: dict[str, JobProgress],
        jobs: Jobs,
        failures: FailuresHeard | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        heard: Callable[[], AbstractSet[str]] | None = None,
        following: Callable[[], AbstractSet[str]] | None = None,
        taken: TakenPlans | None = None,
    ) -> None:
        super().__init__(controller, mqtt, jobs)
        # the servers whose agent was ever heard (the execution's, kept in the store);
        # None: not known (every agent counts as heard)
        self._heard = heard
        # ... and whose agent ever said it follows a plan (None: every one heard did)
        self._following = following
        # the first plan epoch that carried each job to each server, against the
        # epochs the agents follow (None: every plan counts as taken)
        self._taken = taken
        self.progress = progress
        self.failures = failures if failures is not None else FailuresHeard()
        self.monotonic = monotonic
        self.pending: set[str] = set()  # jobs with new progress, to review
        # jobs reported done in a slot before their arrival: never completed there (a jct
        # under 1 slot, a utility no schedule earns), kept pending until they arrive
        self._early: set[str] = set()
        self.reviewed: dict[str, int] = {}  # job -> slot of its last slow-job re-plan try
        limits = controller.config.limits
        self.turns = ReplanTurns(limits.replan_steps_per_submitter, limits.replan_steps_per_review)
        self._next_review: set[str] = set()  # re-plans past this review's budget: the next
        self._waits_said: dict[str, int] = {}  # job -> slot its re-plan's wait was logged
        self.stalled: set[str] = set()  # jobs reported behind for want of any progress
        self.overdue: set[str] = set()  # running past their plan, short of their work
        # the slots whose plans never went out because this daemon was down, or its
        # broker or store was out: (first, last)
        self.unsent: list[tuple[int, int]] = []
        # the last slot the latest plan round covered (its next slot; None: no round yet)
        self.sent_through: int | None = None
        # per job: plans written since the latest round went out, and the slots of theirs
        # no round carried (a plan written after a round, for slots it covered)
        self.sent = SentPlans()

    def pending_sync(self) -> list[Event]:
        """Review the jobs with new progress (:attr:`pending`): early completions and
        slow or stalled jobs."""
        events: list[Event] = []
        limits = self.c.config.limits  # a reload may have changed them
        self.turns.per_submitter = limits.replan_steps_per_submitter
        self.turns.per_review = limits.replan_steps_per_review
        self.turns.new_review(self.c.slot)
        self._next_review.clear()
        order = in_turn(self.pending, self.reviewed)
        rows = self._rows(order)
        completing: list[tuple[Job, float]] = []  # done: completed together, at the end
        try:
            for job_id in order:
                try:
                    events += self._review_job_sync(job_id, rows.get(job_id), completing)
                except StoreUnavailableError:
                    # kept pending: reviewed again once the store is back, even if its
                    # agents have nothing new to report (those of a job that is done never do)
                    raise
                except Exception:
                    self.pending.discard(job_id)  # a bug would fail the same way every time
                    raise
                if job_id in self._early:
                    self._early.discard(job_id)  # reviewed again (its agents may say no more)
                elif job_id not in self._next_review:  # else reviewed again at the next one
                    self.pending.discard(job_id)
            if completing:
                events += self._complete_all_sync(completing)
        except BaseException:
            self.pending.update(job.id for job, _ in completing)  # not completed: again
            raise
        return events

    def _rows(self, job_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        """``{job: (state, submitter)}`` of the active ones of ``job_ids`` (a query per
        :func:`~controller.store.in_batches`, not one per job: a review of 1,000 jobs' counts spent
        0.75 s reading their rows one by one), their specs loaded
        (:meth:`~controller.plane.jobs.Jobs.load`)."""
        out: dict[str, tuple[str, str | None]] = {}
        with self.c.db.session() as session:
            for chunk in in_batches(job_ids):
                query = select(JobRow.id, JobRow.state, JobRow.submitter).where(
                    JobRow.id.in_(chunk), JobRow.state.in_(ACTIVE)
                )
                for job_id, state, submitter in session.execute(query):
                    out[job_id] = (state, submitter)
            self.jobs.load([j for j in job_ids if j in out], session)
        return out

    def forget(self, active: set[str]) -> None:
        """Forget what was kept of jobs not in ``active``."""
        for job_id in [j for j in self.reviewed if j not in active]:
            del self.reviewed[job_id]
        for job_id in [j for j in self._waits_said if j not in active]:
            del self._waits_said[job_id]
        self.stalled &= active
        self.sent.forget(active)

    def find_unsent(self, planned: Any, stored: Any) -> int | None:
        """Note the runs of slots whose plans never went out (:attr:`unsent`): those
        stored (a restart soon after another keeps them) that a job may still be running
        from, and the slots after the latest whose plans did (``planned``; they held the
        next slot too) and before the current one. The daemon was down meanwhile.
        Returns ``planned`` if it reads as a slot, else None."""
        oldest = self.c.slot - self.c.window  # no job planned before it still runs
        if isinstance(stored, list):  # an edited store: what does not read is dropped
            for run in stored[-MAX_UNSENT_RUNS:]:
                pair: list[Any] = run if isinstance(run, list) and len(run) == 2 else [-1, -1]
                first, last = pair
                if counter(first) and counter(last) and oldest <= last and first <= last:
                    self.unsent.append((int(first), int(last)))
        if not counter(planned):
            return None
        assert isinstance(planned, int)
        self.sent_through = planned + 1  # the stored round's next slot
        self._unsent_until(self.c.slot, "oasisd was down")
        return planned

    def plans_sent(self, slot: int) -> None:
        """A round of plans went out in ``slot``, for it and the next; the slots before
        it since the previous round's next one never had theirs (the broker or the store
        was out): noted in :attr:`unsent` and logged."""
        self._unsent_until(slot, "the broker or the store was out")
        self.sent_through = slot + 1

    def _unsent_until(self, slot: int, why: str) -> None:
        """Note the slots after :attr:`sent_through` and before ``slot`` as unsent
        (``why`` they were), if any."""
        if self.sent_through is None:
            return
        first, last = self.sent_through + 1, slot - 1
        if first <= last:
            self.unsent = joined_runs([*self.unsent, (first, last)])[-MAX_UNSENT_RUNS:]
            self.log.warning(f"plans of slots no agent was sent ({why}): a job planned "
                             "in them completes only as its agents report",
                             first_slot=first, last_slot=last)  # fmt: skip
            self.sent_through = last

    def _unsent_runs(self) -> list[tuple[int, int]]:
        """:attr:`unsent`, and the slots since the latest round's next one that have
        begun without a round of their own: the broker or the store is out now (before,
        a job planned only in them completed at its plan's end with its whole utility,
        no agent having been sent its plan)."""
        if self.sent_through is None or self.sent_through + 1 > self.c.slot - 1:
            return self.unsent
        return joined_runs([*self.unsent, (self.sent_through + 1, self.c.slot - 1)])

    def _planned_unsent(self, job_id: str, session: Session) -> list[tuple[int, int]]:
        """The runs of :attr:`unsent` in which ``job_id`` had workers planned, and those
        of its own slots whose plans no round carried (:class:`~controller.plane.
        sent_plans.SentPlans`: its plan written after the latest round went out, for
        slots that round had covered), cut to its planned slots (two queries at most;
        none without such runs)."""
        wide = self._unsent_runs()
        own = self.sent.runs_of(job_id, session, self.c.slot)
        runs = joined_runs([*wide, *own])
        if not runs:
            return []
        slots = set(session.scalars(
            select(AllocationRow.slot).where(
                AllocationRow.job_id == job_id, AllocationRow.workers > 0,
                or_(*(AllocationRow.slot.between(a, b) for a, b in runs)),
            )
        ))  # fmt: skip
        out = [(a, b) for a, b in wide if any(a <= s <= b for s in slots)]
        for a, b in own:
            if planned := [s for s in slots if a <= s <= b]:
                out.append((min(planned), max(planned)))
        return joined_runs(out)

    def unfinished(self, job_id: str, session: Session) -> bool:
        """Whether agents reported progress for ``job_id`` short of its ``E * N * M``
        mini-batches (decision thread). The slot clock asks this of running jobs whose
        plan has ended; one that is short is remembered for :meth:`overdue_sync`. A job
        nobody reported on is not short, its plan being all the daemon knows, unless
        that plan had slots whose plans never went out (:attr:`unsent`, or its own:
        :attr:`sent`), or servers whose agent was never heard: it did not run then, or
        there (the time audit, and the on-call audit, found such jobs completed with their
        whole utility)."""
        short, *_ = self._shortfall(job_id, session)
        if short:
            self.overdue.add(job_id)
        return short

    def _shortfall(
        self, job_id: str, session: Session
    ) -> tuple[bool, list[tuple[int, int]], list[str], list[str], list[str]]:
        """Whether ``job_id`` is short of its work (:meth:`unfinished`), and, for one
        nobody reported on, what makes it so: the runs of :attr:`unsent` its plan had
        workers in, the servers of its plan whose agent was never heard, those whose
        agent was heard but never said it follows a plan, and those whose agent follows
        an older plan than the first that carried the job there."""
        prog = self.progress.get(job_id)
        if prog is None:
            unsent = self._planned_unsent(job_id, session)
            unheard, planless, behind = self._planned_unheard(job_id, session)
            return bool(unsent or unheard or planless or behind), unsent, unheard, planless, behind
        short = prog.totals()[0] < self.jobs.get(job_id, session).total_minibatches - 1e-9
        return short, [], [], [], []

    def _planned_unheard(
        self, job_id: str, session: Session
    ) -> tuple[list[str], list[str], list[str]]:
        """The servers ``job_id``'s plan held workers or parameter servers on whose agent
        was never heard, those whose agent beat but never said it follows a plan, and
        those whose agent follows an older plan than the first that carried the job there
        (:mod:`controller.plane.taken_plans`) (each sorted; one query). Nothing ran
        there: an agent starts a task only from a plan it received over the broker it
        beats on. Before, a job planned on such
        servers alone, which nobody reported on, completed with its whole utility at its
        plan's end, where the README said it fails (the on-call audit); so did one whose
        agent beat with ``epoch`` 0 throughout, never having had a plan (its broker user
        unable to read the plan's topic: the agents audit)."""
        if self._heard is None:
            return [], [], []
        heard = self._heard()  # the event loop adds to it: membership tests only
        following = self._following() if self._following is not None else heard
        servers = sorted(session.scalars(
            select(AllocationRow.server)
            .where(AllocationRow.job_id == job_id)
            .where(or_(AllocationRow.workers > 0, AllocationRow.ps > 0))
            .distinct()
        ))  # fmt: skip
        unheard = [s for s in servers if s not in heard]
        planless = [s for s in servers if s in heard and s not in following]
        behind = (  # ... or an older plan than the one carrying the job
            self._taken.not_taken(job_id, [s for s in servers if s in following])
            if self._taken is not None
            else []
        )
        return unheard, planless, behind

    def overdue_sync(self) -> list[Event]:
        """Fail the jobs left running past their plan short of their work, once their
        agents had ``heartbeat_timeout`` seconds after the plan's end to report the rest
        (called only with the broker connection up for two of their beats: agents resend
        their counts when the daemon comes back, so a job finished while the daemon was
        down or cut off completes rather than fails)."""
        if not self.overdue:
            return []
        s = self.c.slot
        since_boundary = self.slot_seconds - self.c.slots.seconds_to_next_slot()
        now = datetime.now(UTC)
        events: list[Event] = []
        with self.c._write() as session:
            for job_id in sorted(self.overdue):
                row = session.get(JobRow, job_id)
                if row is None or row.state != "running" or row.completion_slot is None:
                    self.overdue.discard(job_id)  # completed by its last report, or ended
                    continue
                since_plan_end = (s - row.completion_slot - 1) * self.slot_seconds + since_boundary
                if since_plan_end <= self.mqtt.heartbeat_timeout:
                    continue
                short, unsent, unheard, planless, behind = self._shortfall(job_id, session)
                if not short:
                    self.overdue.discard(job_id)
                    continue
                job = self.jobs.get(job_id, session)
                prog = self.progress.get(job_id)
                done = prog.totals()[0] if prog is not None else 0.0
                row.state = "failed"
                detail = {"reason": "plan_ended", "minibatches": done,
                          "of": job.total_minibatches,
                          "completion_slot": row.completion_slot}  # fmt: skip
                if unsent:  # no agent ever reported it, and slots of its plan never went out
                    detail.update(reason="plan_not_sent",
                                  not_sent_slots=[list(run) for run in unsent])  # fmt: skip
                if unheard:  # nor was the agent of some of its servers ever heard
                    detail["agents_never_heard"] = unheard[:MAX_UNHEARD_NAMED]
                if planless:  # ... or did it ever follow a plan
                    detail["agents_following_no_plan"] = planless[:MAX_UNHEARD_NAMED]
                if behind:  # ... or the one that carried this job there
                    detail["agents_behind_their_plan"] = behind[:MAX_UNHEARD_NAMED]
                detail.update(self._failing(job_id))
                row.reason = failed_reason(detail)  # for its submitter (no event stream)
                events.append(self.c._event(session, now, "failed", job_id, "failed", detail))
                self.log.warning("job failed: its plan ended before its work", job=job_id,
                                 **detail)  # fmt: skip
        # only once the commit went through: a store outage leaves them to the next review
        for e in events:
            self.overdue.discard(e.job_id)
        return events

    def _review_job_sync(
        self,
        job_id: str,
        row: tuple[str, str | None] | None,
        completing: list[tuple[Job, float]],
    ) -> list[Event]:
        """Review ``job_id`` (``row``: its state and submitter; None: not active); a job
        done is added to ``completing`` (at most :data:`COMPLETIONS_PER_REVIEW`, the
        rest at the next review)."""
        prog = self.progress.get(job_id)
        if prog is None or row is None:
            return []
        state, submitter = row
        job = self.jobs.get(job_id)
        done, spent = prog.totals()
        total = job.total_minibatches
        if done >= total - 1e-9:
            if self.c.slot < job.arrival:  # reported done before it arrived: a report
                self._early.add(job_id)  # of the slot ahead; completes once it arrives
            elif len(completing) < COMPLETIONS_PER_REVIEW:
                completing.append((job, done))
            else:
                self._next_review.add(job_id)
            return []
        s = self.c.slot
        if done <= 0.0 and job_id not in self.stalled:
            stalled = self._stalled_sync(job, state, spent)
            if stalled:
                return stalled
        if len(prog.samples) < MIN_SAMPLES or self.reviewed.get(job_id) == s:
            return []
        if job_id not in self.c._ledger:
            return []
        planned_mb = job.minibatch_slots * self.slot_seconds
        xs = np.array([p[0] for p in prog.samples])
        post = fit(xs, np.array([p[1] for p in prog.samples]), RuntimePrior(planned_mb))
        need = post.seconds_at(total, LEVEL)
        sched = self.c._ledger.schedule(job_id)
        now_workers = int(sched.after(s).before(s + 1).workers.sum())
        in_slot = now_workers * self.c.slots.seconds_to_next_slot()
        held = sched.after(s + 1).work() * self.slot_seconds + in_slot
        if need.low <= spent + held:  # the plan may still suffice
            return []
        slots_needed = (need.mean - spent - in_slot) / self.slot_seconds
        # the search's limits refuse any amount past them; this keeps ceil() finite
        work = max(1, math.ceil(slots_needed - 1e-9)) if slots_needed < 2.0**53 else 2**53
        why = self._replan_refused(job, work, s + 1)
        if not why and not self._take_turn(job, work, submitter):
            return []  # not reviewed: searched at the next review, or the next slot
        self.reviewed[job_id] = s
        ledger = self.c._ledger
        estimate = post.minibatch_seconds(LEVEL)
        detail: dict[str, Any] = {"reason": "slow", "minibatch_seconds": estimate.mean,
                                  "planned_minibatch_seconds": planned_mb,
                                  "work": work}  # fmt: skip
        if why:  # not searched: the job is behind, with the reason
            best = BestSchedule(None, None, None, None, None, slots_scanned=0)
            detail["why"] = why
        else:
            best, whole = replan_remaining(ledger, job, work, s + 1, self.jobs.last_slot(job))
        now = datetime.now(UTC)
        if best.schedule is None or best.payoff is None or best.payoff <= ADMIT_THRESHOLD:
            detail["payoff"] = best.payoff
            with self.c._write() as session:
                event = self.c._event(session, now, "behind", job_id, state, detail)
            self.log.info("job behind its plan", job=job_id, **detail)
            return [event]

        def change() -> list[Event]:
            ledger.replace(job_id, whole)
            detail["payoff"] = best.payoff
            with self.c._write() as session:
                row = session.get(JobRow, job_id)
                assert row is not None
                self.c._write_schedule(session, job, row, whole, s + 1)
                detail["completion_slot"] = row.completion_slot
                event = self.c._event(session, now, "replanned", job_id, row.state, detail)
            self.log.info("slow job re-planned", job=job_id, **detail)
            return [event]

        return self.jobs.guarded(change)

    def _stalled_sync(self, job: Job, state: str, spent: float) -> list[Event]:
        """A ``behind`` event (reason ``no_progress``), once, for a job whose workers
        have spent half its planned worker-seconds without one mini-batch reported. The
        pace fit reads worker-seconds without mini-batches as start-up time, so a job
        whose workers do nothing (hung, or not printing counts) was reported only when
        its plan ended (the audit of jobs that do not follow their plan)."""
        planned = job.work * self.slot_seconds
        if spent < 0.5 * planned:
            return []
        detail = {"reason": "no_progress", "worker_seconds": spent,
                  "planned_worker_seconds": planned, **self._failing(job.id)}  # fmt: skip
        with self.c._write() as session:
            said = session.scalars(select(EventRow.detail).where(
                EventRow.job_id == job.id, EventRow.kind == "behind")).all()  # fmt: skip
            if any(isinstance(d, dict) and d.get("reason") == "no_progress" for d in said):
                event = None  # said before a restart or a takeover: once per job
            else:
                event = self.c._event(session, datetime.now(UTC), "behind", job.id, state,
                                      detail)  # fmt: skip
        self.stalled.add(job.id)  # once committed: a store outage loses nothing
        if event is None:
            return []
        self.log.warning("job without progress: its workers report no mini-batch",
                         job=job.id, **detail)  # fmt: skip
        return [event]

    def _failing(self, job_id: str) -> dict[str, Any]:
        """``{"worker_failures": [{server, failures, last_failure}, ...]}``: the job's
        failing workers as its agents last said (:mod:`controller.plane.worker_failures`),
        for the event that reports it stalled or failed, which is stored, read by its
        tenant, and outlives what the plane keeps of the job; ``{}`` if none failed.
        Before, a job failed for a worker command that exited 1 said only
        ``plan_ended``."""
        failing = self.failures.of(job_id, self.monotonic())
        if not failing:
            return {}
        return {"worker_failures": [
            {"server": f.server, "failures": f.failures, "last_failure": f.last_failure}
            for f in failing
        ]}  # fmt: skip

    def _take_turn(self, job: Job, work: int, submitter: str | None) -> bool:
        """Whether the re-plan of ``work`` worker-slots of ``job`` (of ``submitter``) is
        searched now, its steps charged (:class:`~controller.plane.replan_turns.
        ReplanTurns`); if not, it is left for the next review (this one's budget is
        spent) or for the next slot (its submitter's is), said once a slot."""
        s = self.c.slot
        steps = search_size(replace(job, work=work), self.c.cluster,
                            self._replan_slots(job, s + 1)).steps  # fmt: skip
        spent = self.turns.take(submitter, steps)
        if not spent:
            return True
        if spent == "review":
            self._next_review.add(job.id)
        elif self._waits_said.get(job.id) != s:
            self._waits_said[job.id] = s
            self.log.info("slow job's re-plan waits for the next slot: its submitter's "
                          "re-plans took limits.replan_steps_per_submitter in this one",
                          job=job.id, submitter=submitter, steps=steps)  # fmt: skip
        return False

    def _replan_slots(self, job: Job, first_slot: int) -> int:
        """The slots a re-plan of ``job`` from ``first_slot`` searches (at least 1)."""
        return max(1, min(self.jobs.last_slot(job), self.c._ledger.end - 1) - first_slot + 1)

    def _replan_refused(self, job: Job, work: int, first_slot: int) -> str:
        """Why a re-plan of ``work`` worker-slots of ``job`` from ``first_slot`` is not
        searched (empty: it is): its search would be over the limits every submission is
        held to (``[limits]``, :meth:`controller.limits.Limits.check_search`). A report
        far behind the plan (a slow or misreporting agent, a tau far too small) asks for
        any amount of work, and that search runs in the decision thread, where every
        tenant's calls wait for it."""
        slots = self._replan_slots(job, first_slot)
        try:
            self.c.config.limits.check_search(replace(job, work=work), self.c.cluster, slots)
        except SpecError as err:
            return f"its re-plan is not searched: {err}"
        return ""

    def _complete_all_sync(self, done: list[tuple[Job, float]]) -> list[Event]:
        """Complete the jobs of ``done`` (``(job, mini-batches reported)``) in the
        current slot, their slots from the next one released, in one transaction
        (before, one each: 1,000 of one tenant's jobs reported done at once held the
        decision thread 7.7 s on SQLite)."""
        s = self.c.slot
        now = datetime.now(UTC)

        def change() -> list[Event]:
            released = release_rest_of(self.c._ledger, [job.id for job, _ in done], s + 1)
            events = []
            with self.c._write() as session:
                ids = [job.id for job, _ in done]
                rows: dict[str, JobRow] = {}
                for chunk in in_batches(ids):
                    session.execute(delete(AllocationRow).where(
                        AllocationRow.job_id.in_(chunk), AllocationRow.slot >= s + 1))  # fmt: skip
                    rows.update((r.id, r) for r in session.scalars(
                        select(JobRow).where(JobRow.id.in_(chunk))))  # fmt: skip
                for job, minibatches in done:
                    row = rows[job.id]
                    row.state = "completed"
                    row.completion_slot = s
                    row.jct = s - job.arrival + 1
                    row.utility = float(job.utility.values(row.jct))
                    detail = {"early": True, "released_worker_slots": released[job.id],
                              "minibatches": minibatches}  # fmt: skip
                    events.append(
                        self.c._event(session, now, "completed", job.id, "completed", detail)
                    )
            for job, _ in done:
                self.log.info("job done early", job=job.id, slot=s, released=released[job.id])
            return events

        return self.jobs.guarded(change)
