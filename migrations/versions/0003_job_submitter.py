"""Who submitted each job.

Why: with token authentication (controller/auth.py) a submitter may read only the jobs it
submitted, so the store records the token's name with the job. Jobs decided before this
revision, or without authentication, have none (NULL): only operators see them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # SQLite cannot ALTER every way: batch
        batch.add_column(sa.Column("submitter", sa.String(200), nullable=True))
        batch.create_index("ix_jobs_submitter", ["submitter"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_submitter")
        batch.drop_column("submitter")
