"""Whether PostgreSQL lets the daemon's role make a decision's writes, asked without
writing anything: for the gRPC health of the Admission service (``controller/daemon.py``).

The store watch's ``SELECT 1`` goes through while a DBA's ``REVOKE``, a read-only
database or hot standby, or a moved ``search_path`` refuses every commit
(:mod:`.refusals`), so the health stayed SERVING and a load balancer kept sending writes
there. :data:`DRY_WRITES` runs the statements a decision's commit runs
(:func:`controller.store.decisions.write_decisions`, fenced by
:func:`controller.store.writer_lock.check_epoch`) on no rows, in one round trip, in a
transaction that is rolled back: PostgreSQL checks privileges, read-only transactions and
the tables' names before it looks for rows, so each refusal of :mod:`.refusals` shows,
and nothing is written (no WAL, no row locked). Not seen: a commit refused for space on
PostgreSQL's disk, or for a sequence's ``USAGE`` (no row asks ``nextval``); a failed
commit reports those (``Database.note_failed_write``).
"""

from __future__ import annotations

__all__ = ["DRY_WRITES", "LOCK_TIMEOUT_MS"]

LOCK_TIMEOUT_MS = 100
"""The dry writes wait at most this long (milliseconds) for a table's lock: behind a
DBA's ``LOCK TABLE`` or a ``VACUUM FULL`` they give up at once, saying nothing about
writes, rather than hold the store watch for ``daemon.store_timeout`` every second."""

DRY_WRITES = "; ".join(
    (
        f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'",
        "SELECT 1 FROM meta WHERE false FOR SHARE",  # the fence's row lock
        "INSERT INTO jobs SELECT * FROM jobs WHERE false",
        "INSERT INTO allocations SELECT * FROM allocations WHERE false",
        "UPDATE meta SET value = value WHERE false",  # the estimate's rows
        "INSERT INTO meta SELECT * FROM meta WHERE false",
        "INSERT INTO events SELECT * FROM events WHERE false",
    )
)
"""A decision's writes on no rows (the module docstring); without parameters, so the
driver sends them as one simple query."""
