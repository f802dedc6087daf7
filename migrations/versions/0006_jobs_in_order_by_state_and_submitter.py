"""Indexes on the jobs by state and by submitter, each in decision order.

Why: a page of jobs of one state (``oasis jobs --state rejected``, the console's job list
filtered by state) or of one submitter (every ListJobs of a submitter's token) reads the
jobs after a sequence in decision order. With an index on the state (or the submitter)
alone, each page read every job of that state (or submitter) and sorted them: with 10^6
jobs kept (``keep_days = 0``), 0.31 s for a page of rejected jobs, 0.09 s for a
submitter's first page, growing with the history. With the sequence in the index a page
reads its own rows. The new indexes serve the lookups by state or submitter alone too,
so they replace the old ones.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_sequence", "jobs", ["state", "sequence"])
    op.create_index("ix_jobs_submitter_sequence", "jobs", ["submitter", "sequence"])
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_index("ix_jobs_submitter", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_submitter", "jobs", ["submitter"])
    op.drop_index("ix_jobs_submitter_sequence", table_name="jobs")
    op.drop_index("ix_jobs_state_sequence", table_name="jobs")
