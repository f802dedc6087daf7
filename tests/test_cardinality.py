"""What one tenant or agent can make the daemon keep by naming things (the cardinality
audit): state keyed by a name from outside must stay bounded, whatever the names."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.test_mqtt_units import PlaneDaemon


def test_progress_reads_of_ended_jobs_keep_no_spec(tmp_path: Path) -> None:
    # A tenant reading the progress of its many rejected (or long ended) jobs made the
    # plane keep each one's parsed spec until the next slot boundary: 5,000 reads, 196 MB
    plane = PlaneDaemon(tmp_path)
    try:
        plane.submit("live")
        cheap: dict[str, Any] = {**plane.SPEC, "utility": {"kind": "sigmoid", "priority":
                                 1e-6, "decay": 0.5, "target": 3}}  # fmt: skip
        ids = [f"r{i}" for i in range(20)]
        for job_id in ids:
            view = asyncio.run(plane.c.submit({"id": job_id, **cheap}))
            assert not view.decision.admitted
        for job_id in ids:
            assert plane.ex.view_sync(job_id).job_id == job_id
        assert not set(ids) & set(plane.ex.jobs.cache)
        plane.ex.view_sync("live")  # an active job's spec is kept, as its plans need it
        assert "live" in plane.ex.jobs.cache
    finally:
        plane.c.close()
