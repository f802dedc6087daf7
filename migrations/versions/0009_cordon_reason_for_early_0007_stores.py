"""A cordon's ``reason`` and ``by`` on stores that an early 0007 migrated.

Why: revision 0007 was first released adding only ``server_outages.cause``; ``reason``
and ``by`` were added to it later, under the same revision. A store that first release
migrated is marked 0007 without those columns, so the newer daemon migrated it on to
0008 and then stopped at every start on ``no such column: server_outages.reason`` (the
upgrade audit), and the older one refused the store as too new. This revision adds each
column where it is missing, and leaves stores that have them as they are. Released
revisions are not edited again: a change comes as a new revision.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_COLUMNS = (("reason", sa.Text()), ("by", sa.String(200)))


def upgrade() -> None:
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("server_outages")}
    missing = [(name, kind) for name, kind in _COLUMNS if name not in present]
    if missing:
        with op.batch_alter_table("server_outages") as batch:
            for name, kind in missing:
                batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    """Nothing: the columns are 0007's, which its own downgrade drops."""
