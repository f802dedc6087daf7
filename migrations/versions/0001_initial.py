"""The first schema: servers, jobs with their decisions, allocations, events, meta.

Why: the daemon commits every decision before answering and rebuilds its ledger from
the allocations of admitted jobs, in decision order (``jobs.sequence``), after a crash.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "servers",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("capacity", sa.JSON, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("sequence", sa.BigInteger, nullable=False, unique=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("submitted_slot", sa.BigInteger, nullable=False),
        sa.Column("arrival_slot", sa.BigInteger, nullable=False),
        sa.Column("work", sa.BigInteger, nullable=False),
        sa.Column("admitted", sa.Boolean, nullable=False),
        sa.Column("payoff", sa.Float),
        sa.Column("cost", sa.Float),
        sa.Column("start_slot", sa.BigInteger),
        sa.Column("completion_slot", sa.BigInteger),
        sa.Column("jct", sa.BigInteger),
        sa.Column("utility", sa.Float),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("decision_ms", sa.Float, nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cancelled_slot", sa.BigInteger),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "allocations",
        sa.Column("job_id", sa.String(200), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("slot", sa.BigInteger, primary_key=True),
        sa.Column("server", sa.String(200), primary_key=True),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("ps", sa.Integer, nullable=False),
    )
    op.create_index("ix_allocations_slot", "allocations", ["slot"])
    op.create_table(
        "events",
        sa.Column(
            "sequence",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(200), nullable=False),
        sa.Column("slot", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_table(
        "meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("meta")
    op.drop_table("events")
    op.drop_index("ix_allocations_slot", "allocations")
    op.drop_table("allocations")
    op.drop_index("ix_jobs_state", "jobs")
    op.drop_table("jobs")
    op.drop_table("servers")
