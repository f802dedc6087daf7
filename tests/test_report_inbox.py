"""The bounded inbox of agents' progress reports (controller/plane/intake.py): with a
server's queue and its carry full, a newer count of a job the carry holds replaces the
older one; only entries of jobs the carry does not hold are dropped."""

from __future__ import annotations

from controller.plane.agent_messages import Progress, TaskProgress
from controller.plane.intake import Received, ReportInbox


def test_a_full_carry_takes_a_newer_count_of_a_job_it_holds_and_drops_only_new_jobs() -> None:
    """The mutation audit: a full carry that dropped every entry, those of the jobs it
    holds included, passed every test; then a job's last count (the one that completes
    it) was lost under a flood, its older count kept in its place."""
    inbox = ReportInbox(max_entries=2)

    def put(at: float, *jobs: tuple[str, float]) -> None:
        inbox.put(Received(at, 0, Progress("w0", "s", [TaskProgress(j, n, n) for j, n in jobs])))

    put(1.0, ("a", 1.0), ("b", 1.0))
    put(2.0, ("c", 1.0))  # a and b to the carry: full
    put(3.0, ("a", 20.0), ("b", 7.0))  # c leaves the queue: a job the carry lacks, dropped
    put(4.0, ("d", 1.0))  # a's and b's newer counts leave the queue: they replace the older
    counts = {t.job: t.minibatches for r in inbox.take() for t in r.progress.jobs}
    assert counts == {"a": 20.0, "b": 7.0, "d": 1.0}
    assert inbox.dropped == 1 and inbox.take_dropped() == {"w0": 1}
