"""What the execution plane's parts share (:class:`~controller.plane.outages.Outages`,
:class:`~controller.plane.job_review.JobReview`,
:class:`~controller.plane.plans.PlanBuilder`): the controller, the broker settings, the
job specs, the slot length and the log. Decision thread only
(:mod:`controller.plane.execution`), but for :meth:`PlanBuilder.build
<controller.plane.plans.PlanBuilder.build>`.
"""

from __future__ import annotations

import structlog

from controller.plane.jobs import Jobs
from controller.plane.port import AdmissionPort
from controller.plane.settings import MqttConfig

__all__ = ["PlanePart"]


class PlanePart:
    """A part of the plane: reads ``controller`` (its ledger and store), ``mqtt`` (the
    broker settings) and ``jobs`` (the job specs), with the slot length in seconds as
    :attr:`slot_seconds`, read once."""

    def __init__(self, controller: AdmissionPort, mqtt: MqttConfig, jobs: Jobs) -> None:
        self.c = controller
        self.mqtt = mqtt
        self.jobs = jobs
        self.slot_seconds = controller.config.slot_seconds
        self.log = structlog.get_logger("oasisd")
