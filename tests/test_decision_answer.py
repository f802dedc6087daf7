"""The answer to a submission is built from the decision, not read back from the store
(issue 16): it equals what a read of the stored job gives, for admitted, rejected and
pending jobs; and the in-memory index of stored ids keeps submissions idempotent, also
after the ledger was rebuilt from the store."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from controller.admission import ConflictError
from controller.clock import FakeClock
from tests.test_pending import SLOT, blocker, controller, small


def test_the_answer_is_the_stored_job(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        answers = [
            asyncio.run(c.submit(blocker(), by="alice")),  # admitted: every GPU
            asyncio.run(c.submit(small("s2"), by="bob")),  # rejected: no GPU left
            asyncio.run(c.submit(small("s3"), by="bob", wait_seconds=5 * SLOT)),  # pending
        ]
        assert [a.state for a in answers] == ["admitted", "rejected", "pending"]
        assert answers[0].decision.allocations and answers[1].decision.reason
        for answer in answers:
            assert answer == c._get_sync(answer.id)
        again = asyncio.run(c.submit(small("s2"), by="bob"))  # a retry: the stored job
        assert again == replace(answers[1], duplicate=True)
    finally:
        c.close()


def test_ids_stay_known_after_a_rebuild(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        asyncio.run(c.submit(small("s1")))
        c._stale = True  # as after a store outage: the next step rebuilds the ledger
        with pytest.raises(ConflictError, match="another spec"):
            asyncio.run(c.submit(small("s1", epochs=3)))
        assert asyncio.run(c.submit(small("s1"))).duplicate
    finally:
        c.close()
    reopened = controller(tmp_path, clock)  # a restart loads the ids from the store
    try:
        assert asyncio.run(reopened.submit(small("s1"))).duplicate
        assert "s1" in reopened._stored_ids() and "s9" not in reopened._stored_ids()
    finally:
        reopened.close()
