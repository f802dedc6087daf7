"""The daemon's admission controller: Alg. 1 over a rolling window, backed by the store.

Every decision is serialised (each one changes prices), computed off the event loop in
one worker thread (the compiled search releases the GIL), committed to the store, and
only then applied to the in-memory ledger and answered. After a crash, :meth:`open`
rebuilds the ledger from the store's allocations in decision order, which reproduces the
prices bit for bit, so the next decision equals that of a daemon that never stopped.

The window: at slot ``s`` the ledger covers ``s .. s + T``; a job submitted during ``s``
arrives at ``a = s + 1`` and may be planned over ``a .. a + T - 1`` (SPEC 1).

The parts: :mod:`.views` (what the API reports), :mod:`.state` (what the parts share),
:mod:`.decide` (decide and commit), :mod:`.recovery` (rebuild the ledger from the store),
:mod:`.lifecycle` (slot ticks, cancellation), :mod:`.reads` (read views) and
:mod:`.controller` (the async API, serialised off the event loop).
"""

from __future__ import annotations

from controller.admission.controller import AdmissionController
from controller.admission.state import SETTINGS_KEY
from controller.admission.views import STATES, DecisionView, JobView, canonical_spec
from controller.errors import (
    ConflictError,
    DrainingError,
    NotFoundError,
    PreconditionError,
    QueueFullError,
)

__all__ = [
    "SETTINGS_KEY",
    "STATES",
    "AdmissionController",
    "ConflictError",
    "DecisionView",
    "DrainingError",
    "JobView",
    "NotFoundError",
    "PreconditionError",
    "QueueFullError",
    "canonical_spec",
]
