"""The pending queue: jobs that wait for room, decided again at each slot boundary.

Why: ``oasis submit --wait`` keeps a job that is not admitted at once as ``pending``
(a state: the column is already a string) until its wait ends. The store must say until
when (``wait_until_slot``, the last slot it may be admitted at) and in which slot it was
last decided (``decided_slot``), so a restarted daemon decides each pending job again at
the next boundary, not twice in one slot. Jobs decided before this revision have neither
(NULL): they never waited.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # SQLite cannot ALTER every way: batch
        batch.add_column(sa.Column("wait_until_slot", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("decided_slot", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # Before this revision no job waited: a pending or expired job was a rejected one.
    op.execute("UPDATE jobs SET state = 'rejected' WHERE state IN ('pending', 'expired')")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("decided_slot")
        batch.drop_column("wait_until_slot")
