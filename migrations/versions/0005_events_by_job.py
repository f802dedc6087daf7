"""An index on the event log's job ids.

Why: deleting the events of the finished jobs retention removes (``daemon.keep_days``,
:mod:`controller.admission.retention`), a job's events on the console and the latest
event of each job (the plane's retained events) are all looked up by job id, and the
event log grows with every decision: without the index each lookup read all of it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_events_job_id", "events", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_events_job_id", table_name="events")
