"""Wall time to slots. The clock is a seam: tests use a FakeClock they advance (or step).
The daemon reads the system clock through a :class:`SteadyClock`, which holds off its
steps until they last."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from datetime import time as dt_time
from typing import Any, Protocol

__all__ = [
    "CONFIRM_SECONDS",
    "LATEST_EPOCH",
    "STEP_SECONDS",
    "Clock",
    "FakeClock",
    "SlotClock",
    "SlotTimes",
    "SteadyClock",
    "SystemClock",
    "epoch",
    "first_epoch",
]

LATEST_EPOCH = 32_503_680_000.0
"""The latest slot 0 taken (3000-01-01T00:00:00Z): slot times a window ahead of it stay
dates that every client can show (a slot 0 of 1e300 made every listing's times overflow
in the client)."""


def epoch(value: object, field: str) -> float:
    """``value`` as slot 0's Unix time, from 0 to :data:`LATEST_EPOCH`: a number, or a
    time with a UTC offset (a TOML date-time, ``2026-01-01T00:00:00Z``, or that text).

    Raises:
        SpecError: naming ``field``.
    """
    from pricing import fields
    from pricing.durations import parse_time
    from pricing.errors import SpecError

    example = "a Unix time such as 1767225600, or a date-time with its UTC offset such as "
    example += "2026-01-01T00:00:00Z"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise SpecError.one(field, f"the date-time {value.isoformat()} has no UTC offset: "
                                f"give {example}")  # fmt: skip
        value = value.timestamp()
    elif isinstance(value, date | dt_time):  # a TOML date, or a time of day
        raise SpecError.one(field, f"must be {example}, got {value.isoformat()}")
    elif isinstance(value, str):
        try:
            at = parse_time(value)
        except ValueError as err:
            raise SpecError.one(field, str(err)) from None
        if at is None:
            raise SpecError.one(field, f"must be {example}, got {fields.show(value)}")
        value = at
    x = fields.number(value, field)
    if not 0.0 <= x <= LATEST_EPOCH:
        raise SpecError.one(
            field, f"must be a Unix time from 0 to {LATEST_EPOCH:.0f} (the year 3000), got {x:g}"
        )
    return x


def slots_for(seconds: float, slot_seconds: float) -> int:
    """The whole slots ``seconds`` take, rounded up (a float's last bit forgiven: 7200 s
    of 3600 s slots are 2, not 3)."""
    return math.ceil(seconds / slot_seconds - 1e-9)


def first_epoch(now: float, slot_seconds: float) -> float:
    """Slot 0's start for a daemon first started at Unix time ``now`` without an epoch
    in its config: ``now`` floored to a whole multiple of ``slot_seconds`` in Unix time
    (a whole minute for 60 s slots, an hour for an hour's, midnight UTC for a day's),
    or to a whole second for a slot shorter than that, so slot times print round. Slot
    0 is then the current slot, with up to a slot (a second) of it already gone."""
    step = max(slot_seconds, 1.0)
    return min(math.floor(now / step) * step, now)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...


def _since_boot() -> float:
    """Seconds since an arbitrary start that no setting of the wall clock moves, counting
    a suspended machine's sleep (``CLOCK_BOOTTIME`` on Linux; monotonic elsewhere)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        return time.time()

    def elapsed(self) -> float:
        """Seconds passed, as :func:`_since_boot` counts them."""
        return _since_boot()


class FakeClock:
    """A clock that moves only when told to: :meth:`advance` lets time pass, :meth:`step`
    sets the wall clock alone (an NTP step, an operator's ``date -s``)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.passed = 0.0

    def now(self) -> float:
        return self.t

    def elapsed(self) -> float:
        return self.passed

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.passed += seconds

    def step(self, seconds: float) -> None:
        self.t += seconds


STEP_SECONDS = 5.0
"""A change of the wall clock against the time passed larger than this is a step, which
:class:`SteadyClock` holds off; smaller ones (NTP's slewing, jitter) it follows."""
CONFIRM_SECONDS = 60.0
"""How long a step must hold before :class:`SteadyClock` takes it."""


class SteadyClock:
    """The wall clock of ``inner``, with its steps held off until they last.

    A head node's clock set ten days ahead for three seconds (a wrong RTC read at boot, a
    local-time/UTC mix-up put right) moved the daemon to a slot ten days on: one tick
    completed every tenant's admitted jobs as if they had run, retention deleted them,
    and the daemon, whose slot never moves back, planned every new job ten days out. So
    the time this clock gives moves with the time passed (``inner.elapsed()``, which no
    setting of the wall clock moves; the real time passed where ``inner`` has none), and
    follows the wall clock's small drifts. A step of more than :data:`STEP_SECONDS`
    either way is logged and held off; only once the wall clock has kept to it for
    :data:`CONFIRM_SECONDS` (an operator's or NTP's correction) is it taken, and logged
    again. A step that ends sooner is never seen by the slots. Safe from any thread.
    """

    def __init__(
        self,
        inner: Clock,
        log: Any = None,
        step_seconds: float = STEP_SECONDS,
        confirm_seconds: float = CONFIRM_SECONDS,
    ) -> None:
        self.inner = inner
        if log is None:  # imported here: the client reads slots too, and logs none
            import structlog

            log = structlog.get_logger("oasisd")
        self.log = log
        self.step_seconds = step_seconds
        self.confirm_seconds = confirm_seconds
        elapsed = getattr(inner, "elapsed", None)
        self._elapsed: Callable[[], float] = elapsed if callable(elapsed) else _since_boot
        self._lock = threading.Lock()
        self._offset: float | None = None  # wall time minus time passed, as taken
        self._step: tuple[float, float] | None = None  # a step held off: (offset, seen at)

    def now(self) -> float:
        with self._lock:
            t, said = self._now()
        if said is not None:  # logged outside the lock: a slow log stalls no other caller
            self.log.warning(said[0], **said[1])
        return t

    def _now(self) -> tuple[float, tuple[str, dict[str, float]] | None]:
        """The time, and what to log about a step (the lock held)."""
        wall, passed = self.inner.now(), self._elapsed()
        offset = wall - passed
        if self._offset is None or abs(offset - self._offset) <= self.step_seconds:
            said = None
            if self._step is not None:
                said = ("the system clock is back from its step; the step was ignored",
                        {"step_seconds": round(self._step[0] - offset, 3),
                         "lasted_seconds": round(passed - self._step[1], 3)})  # fmt: skip
                self._step = None
            self._offset = offset
            return wall, said
        by = round(offset - self._offset, 3)
        if self._step is None or abs(offset - self._step[0]) > self.step_seconds:
            self._step = (offset, passed)
            return passed + self._offset, (
                "the system clock stepped; slots keep to the time passed until it holds",
                {"step_seconds": by, "hold_seconds": self.confirm_seconds},
            )
        if passed - self._step[1] >= self.confirm_seconds:
            self._offset, self._step = offset, None
            return wall, ("the system clock's step held; slots follow it", {"step_seconds": by})
        return passed + self._offset, None


@dataclass(frozen=True)
class SlotTimes:
    """Slot numbers to wall-clock times and back (no clock needed).

    Attributes:
        epoch: Unix time at which slot 0 begins.
        slot_seconds: length of a slot, > 0.
    """

    epoch: float
    slot_seconds: float

    def start(self, slot: int) -> float:
        """Unix time at which ``slot`` begins (and ``slot - 1`` ends)."""
        return self.epoch + slot * self.slot_seconds

    def slot_at(self, unix: float) -> int:
        """The slot ``unix`` falls in (negative before the epoch)."""
        return math.floor((unix - self.epoch) / self.slot_seconds)


class SlotClock:
    """Slot ``s`` covers ``[epoch + s * slot_seconds, epoch + (s + 1) * slot_seconds)``."""

    def __init__(self, clock: Clock, slot_seconds: float, epoch: float = 0.0) -> None:
        self.clock = clock
        self.slot_seconds = slot_seconds
        self.epoch = epoch

    @property
    def times(self) -> SlotTimes:
        """Slot numbers to times with the current ``epoch`` (recovery may set it from the
        store after this clock was made)."""
        return SlotTimes(self.epoch, self.slot_seconds)

    def current_slot(self) -> int:
        """The slot the present moment falls in (0 before the epoch)."""
        return self.slot_at(self.clock.now())

    def slot_at(self, t: float) -> int:
        """The slot Unix time ``t`` falls in (0 before the epoch)."""
        return max(0, math.floor((t - self.epoch) / self.slot_seconds))

    def seconds_to_next_slot(self) -> float:
        elapsed = (self.clock.now() - self.epoch) / self.slot_seconds
        return (math.floor(elapsed) + 1 - elapsed) * self.slot_seconds
