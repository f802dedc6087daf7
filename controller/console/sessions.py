"""Console logins: a token (as ``[auth]`` knows it) becomes a server-side session, and
the browser holds only the session's random id in an HttpOnly, SameSite=Strict cookie.

A session carries the caller (name and role, as the gRPC interceptor would find them),
its expiry (``[web] session_hours``) and a CSRF token that every state-changing form
(cancel, logout) must send back. Sessions live in the daemon's memory: a restart logs
everyone out. At most :data:`MAX_SESSIONS_PER_CALLER` are kept per user (a token's
name), beyond which that user's oldest goes, so one user logging in again and again
cannot log the others out; and at most :data:`MAX_SESSIONS` in all, the oldest going.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.auth import Caller

__all__ = ["COOKIE", "MAX_SESSIONS", "MAX_SESSIONS_PER_CALLER", "Session", "Sessions"]

COOKIE = "oasis_session"
MAX_SESSIONS = 10_000
MAX_SESSIONS_PER_CALLER = 100
"""Sessions one user (a token's name) may hold; a login past it ends its own oldest."""


@dataclass(frozen=True)
class Session:
    """One login.

    Attributes:
        id: the cookie's value, 256 random bits (URL-safe base64).
        caller: who logged in.
        expires: monotonic time it ends, seconds.
        csrf: the token its forms carry, 256 random bits.
    """

    id: str
    caller: Caller
    expires: float
    csrf: str

    def csrf_ok(self, sent: str) -> bool:
        """True if ``sent`` is this session's CSRF token (compared in constant time)."""
        return hmac.compare_digest(self.csrf.encode(), sent.encode())


class Sessions:
    """The live sessions.

    Args:
        lifetime: seconds a session lasts from its login.
        monotonic: the clock, seconds (a seam for tests).
    """

    def __init__(self, lifetime: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = lifetime
        self._now = monotonic
        self._by_id: dict[str, Session] = {}

    def open(self, caller: Caller) -> Session:
        """A new session for ``caller``."""
        now = self._now()
        mine = [sid for sid, s in self._by_id.items() if s.caller.name == caller.name]
        for sid in mine[: max(0, len(mine) - MAX_SESSIONS_PER_CALLER + 1)]:
            del self._by_id[sid]  # this user's oldest, never another's
        if len(self._by_id) >= MAX_SESSIONS:
            self._expire(now)
        while len(self._by_id) >= MAX_SESSIONS:  # the oldest goes (dicts keep order)
            del self._by_id[next(iter(self._by_id))]
        session = Session(
            secrets.token_urlsafe(32), caller, now + self.lifetime, secrets.token_urlsafe(32)
        )
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        """The live session of ``session_id``; None if unknown or expired."""
        session = self._by_id.get(session_id)
        if session is None:
            return None
        if session.expires <= self._now():
            del self._by_id[session_id]
            return None
        return session

    def close(self, session_id: str) -> None:
        """End a session (logout); unknown ids are ignored."""
        self._by_id.pop(session_id, None)

    def retain(self, keep: Callable[[Session], bool]) -> int:
        """End every session for which ``keep`` is false (a reload revoked its token);
        returns how many ended."""
        gone = [sid for sid, s in self._by_id.items() if not keep(s)]
        for sid in gone:
            del self._by_id[sid]
        return len(gone)

    def __len__(self) -> int:
        return len(self._by_id)

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, s in self._by_id.items() if s.expires <= now]:
            del self._by_id[sid]
