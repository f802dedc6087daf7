""":func:`controller.admission.rewind.rewound`, read on a store a daemon wrote: which
stored events tell that the store was rewound under the daemon, and which do not."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from controller.admission.rewind import EventMark, mark_at, rewound
from controller.clock import FakeClock
from controller.store import EventRow
from tests.test_daemon_e2e import job
from tests.test_pending import controller


def test_an_event_is_the_one_applied_only_with_its_time_kind_and_job(tmp_path: Path) -> None:
    """The event a standby applied last is the one stored under its number only if its
    time, kind and job are all the same: a restore the leader numbered past gives the
    number to another event, which may share any two of them. A mark of another number
    than the one applied last says nothing. The mutation audit: with the job or the
    time left out of the comparison, or the mark's number not checked, every test
    passed."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        for job_id in ("a", "b"):
            assert asyncio.run(c.submit(job(job_id))).state == "admitted"
        with c.db.session() as session:
            newest = session.scalar(select(EventRow.sequence).order_by(EventRow.sequence.desc()))
            assert newest is not None and newest >= 2
            mark = mark_at(session, newest)
            before = mark_at(session, newest - 1)
            assert mark is not None and before is not None and mark.at is not None
            assert rewound(session, newest, mark) == ""
            assert rewound(session, newest, before) == ""  # a mark of another event
            assert rewound(session, newest - 1, before) == ""
            others: list[EventMark] = [
                replace(mark, job_id=mark.job_id + "x"),
                replace(mark, at=mark.at - timedelta(seconds=1)),
                replace(mark, kind="cancelled"),
            ]
            for other in others:
                assert rewound(session, newest, other).startswith(f"event {newest} is another")
            assert "older than event" in rewound(session, newest + 1, None)
    finally:
        c.close()
