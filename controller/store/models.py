"""SQLAlchemy 2 models. Keep in step with migrations/versions/.

Typed columns other than keys read leniently (:mod:`controller.store.lenient`): a value
an edit left that is not of the column's type reads as None."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from controller.store.lenient import (
    LenientBigInteger,
    LenientBoolean,
    LenientFloat,
    LenientInteger,
    LenientTime,
)

__all__ = [
    "AllocationRow",
    "Base",
    "EventRow",
    "JobRow",
    "MetaRow",
    "OutageRow",
    "ProgressRow",
    "ServerRow",
]


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, bool: LenientBoolean}


class ServerRow(Base):
    """A server as configured: ``kind`` is ``worker`` or ``ps``; capacity per resource."""

    __tablename__ = "servers"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    position: Mapped[int] = mapped_column(LenientInteger)
    capacity: Mapped[dict[str, Any]] = mapped_column(JSON)


class JobRow(Base):
    """A submitted job, its spec (canonical JSON), who submitted it and the decision.

    ``sequence`` is the order decisions were taken in; the ledger is rebuilt in it. A
    pending job keeps its submission's place until it is admitted, then takes the next one.
    """

    __tablename__ = "jobs"
    # the job's key: its id, or NAME:ID for a job submitted with a token (0008)
    id: Mapped[str] = mapped_column(String(400), primary_key=True)
    sequence: Mapped[int] = mapped_column(LenientBigInteger, unique=True)
    spec: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    submitted_slot: Mapped[int] = mapped_column(LenientBigInteger)
    arrival_slot: Mapped[int] = mapped_column(LenientBigInteger)
    work: Mapped[int] = mapped_column(LenientBigInteger)
    admitted: Mapped[bool]
    payoff: Mapped[float | None] = mapped_column(LenientFloat)
    cost: Mapped[float | None] = mapped_column(LenientFloat)
    start_slot: Mapped[int | None] = mapped_column(LenientBigInteger)
    completion_slot: Mapped[int | None] = mapped_column(LenientBigInteger)
    jct: Mapped[int | None] = mapped_column(LenientBigInteger)
    utility: Mapped[float | None] = mapped_column(LenientFloat)
    reason: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    decision_ms: Mapped[float] = mapped_column(LenientFloat, default=0.0)
    decided_at: Mapped[datetime] = mapped_column(LenientTime)
    cancelled_slot: Mapped[int | None] = mapped_column(LenientBigInteger)
    # the name of the token it was submitted with (controller/auth.py); None without auth
    submitter: Mapped[str | None] = mapped_column(String(200))
    # a job submitted with a wait: the last slot it may be admitted at (None: no wait)
    wait_until_slot: Mapped[int | None] = mapped_column(LenientBigInteger)
    # the slot of its latest decision (a pending job is decided again at each boundary)
    decided_slot: Mapped[int | None] = mapped_column(LenientBigInteger)

    # a page of one state's or one submitter's jobs reads them in decision order (0006)
    __table_args__ = (
        Index("ix_jobs_state_sequence", "state", "sequence"),
        Index("ix_jobs_submitter_sequence", "submitter", "sequence"),
    )


class AllocationRow(Base):
    """Workers (on a worker server) or PS (on a PS server) of a job in a slot."""

    __tablename__ = "allocations"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    slot: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    server: Mapped[str] = mapped_column(String(200), primary_key=True)
    workers: Mapped[int] = mapped_column(LenientInteger, default=0)
    ps: Mapped[int] = mapped_column(LenientInteger, default=0)

    __table_args__ = (Index("ix_allocations_slot", "slot"),)


class EventRow(Base):
    """The event log: decisions and state changes, in order."""

    __tablename__ = "events"
    sequence: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime] = mapped_column(LenientTime)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(400), default="", index=True)
    slot: Mapped[int] = mapped_column(LenientBigInteger)
    state: Mapped[str] = mapped_column(String(16), default="")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class MetaRow(Base):
    """Small named values the daemon keeps: the price-bound estimate, the slot clock."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON)


CORDONED = "cordoned"
"""``OutageRow.cause`` of an operator's cordon (the execution plane's failures: ``"failed"``)."""


class OutageRow(Base):
    """A server out of service: down from slot ``down_from`` until ``up_from`` (None:
    still down). The ledger blocks it in those slots. ``cause``: ``"failed"``, declared by
    the execution plane (its agent fell silent; its heartbeats end it), or
    ``"cordoned"``, by an operator (``oasis cordon``; only ``oasis uncordon`` ends it)."""

    __tablename__ = "server_outages"
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    server: Mapped[str] = mapped_column(String(200), index=True)
    down_from: Mapped[int] = mapped_column(LenientBigInteger)
    up_from: Mapped[int | None] = mapped_column(LenientBigInteger)
    detected_at: Mapped[datetime] = mapped_column(LenientTime)
    cause: Mapped[str] = mapped_column(String(16), default="failed", server_default="failed")
    # a cordon's: the operator's --reason and token name (NULL for a failure)
    reason: Mapped[str | None] = mapped_column(Text)
    by: Mapped[str | None] = mapped_column(String(200))


class ProgressRow(Base):
    """A job's reported progress: totals, the latest totals per server
    (``{server: [minibatches, worker_seconds]}``) and the samples the runtime estimate
    is fitted to (``[[minibatches, worker_seconds], ...]``, the latest few hundred)."""

    __tablename__ = "job_progress"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    minibatches: Mapped[float] = mapped_column(LenientFloat)
    worker_seconds: Mapped[float] = mapped_column(LenientFloat)
    per_server: Mapped[dict[str, Any]] = mapped_column(JSON)
    samples: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(LenientTime)
