"""The PostgreSQL connection of a store (psycopg): every round trip to the server bounded
in time. A module of its own, imported only for a PostgreSQL store (see
:func:`controller.store.database._bounded_connect`)."""

from __future__ import annotations

from typing import Any

import psycopg

from controller.store.database import _CLIENT_MARGIN, _patience

__all__ = ["BoundedConnection"]


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every round trip to the server (a statement, fetching
    its rows, a commit) ends within ``round_trip_limit`` seconds: past it the connection
    is closed and :class:`psycopg.OperationalError` raised. psycopg itself waits for
    ever on a server that accepted the connection and then stopped answering."""

    round_trip_limit: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        patience = _patience.get()
        limit = self.round_trip_limit
        if patience is not None and limit is not None:
            limit = max(limit, patience + _CLIENT_MARGIN)
        if timeout is not None or limit is None:  # psycopg's own bounded waits
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, limit)
        except psycopg.errors._WaitTimeout:  # psycopg's own (private, an OperationalError)
            # cut off mid-protocol: the connection cannot be used again
            self.pgconn.finish()
            raise psycopg.OperationalError(f"the store did not answer within {limit:g} s") from None
