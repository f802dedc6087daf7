"""The execution plane: server outages and reported job progress.

Why: capacity changes and re-plans must survive a restart exactly. A server declared
failed is down from a slot on (``server_outages``, ``up_from`` set when it comes back),
and the ledger rebuilt at start blocks it there again. Progress reported by the node
agents (``job_progress``) feeds the runtime estimate of each job; keeping it means a
restarted daemon neither forgets how far a job got nor re-plans it from scratch.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_outages",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("server", sa.String(200), nullable=False),
        sa.Column("down_from", sa.BigInteger, nullable=False),
        sa.Column("up_from", sa.BigInteger),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_server_outages_server", "server_outages", ["server"])
    op.create_table(
        "job_progress",
        sa.Column("job_id", sa.String(200), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("minibatches", sa.Float, nullable=False),
        sa.Column("worker_seconds", sa.Float, nullable=False),
        sa.Column("per_server", sa.JSON, nullable=False),
        sa.Column("samples", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_progress")
    op.drop_index("ix_server_outages_server", "server_outages")
    op.drop_table("server_outages")
