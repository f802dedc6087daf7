"""Cordoned servers: an operator takes a server out of service without a restart.

Why: ``oasis cordon SERVER`` (maintenance, a suspect GPU) blocks a server from the next
slot on, as a failure does, until ``oasis uncordon``; the execution plane's heartbeats
must not end it, and a restart or a standby must find it again. The outage rows say
which: ``cause`` is ``failed`` for every row before this revision (only the execution
plane wrote them) and ``cordoned`` for an operator's, with its ``reason`` and who
cordoned it (``by``), shown by ``oasis servers`` as long as it lasts.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("server_outages") as batch:
        batch.add_column(sa.Column("cause", sa.String(16), nullable=False, server_default="failed"))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("by", sa.String(200), nullable=True))


def downgrade() -> None:
    # An older oasis knows only failures, which heartbeats end: a cordon it would read
    # as a failure of a server whose agent is alive, ended at once. Ending the cordons
    # where they stand keeps their past slots blocked and frees the rest.
    op.execute(
        "UPDATE server_outages SET up_from = down_from WHERE cause = 'cordoned' AND up_from IS NULL"
    )
    with op.batch_alter_table("server_outages") as batch:
        batch.drop_column("by")
        batch.drop_column("reason")
        batch.drop_column("cause")
