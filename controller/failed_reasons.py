"""Why a job failed, in words its submitter reads: the ``reason`` stored with a failed
job's decision (``oasis job``, the console's job page). Its ``failed`` event says the
same in fields, but the event stream is an operator's (``WatchEvents``), and ``oasis
job`` used to send a submitter there.

One function over every ``failed`` event's ``detail``: a move that stranded the job
(:mod:`controller.admission.moves`: a server cordoned or failed, the configuration
changed) and the execution plane's review of a job whose plan ended short of its work
(:mod:`controller.plane.job_review`: ``plan_ended``, ``plan_not_sent``)."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_REASON", "failed_reason"]

MAX_REASON = 1000
"""Most characters of a stored reason."""

_STRANDED = {
    "server_cordoned": "its server {server} was cordoned by an operator",
    "server_failed": "its server {server} failed (its agent fell silent)",
    "config_changed": "the cluster's configuration changed ({why})",
}


def _runs(runs: Any) -> str:
    """``[[2, 4], [7, 7]]`` as ``"2-4, 7"`` (what a detail holds; anything else as is)."""
    if not isinstance(runs, list):
        return str(runs)
    words = []
    for run in runs[:5]:
        a, b = (run[0], run[-1]) if isinstance(run, list) and run else (run, run)
        words.append(str(a) if a == b else f"{a}-{b}")
    return ", ".join(words) + (f" and {len(runs) - 5} more runs" if len(runs) > 5 else "")


_AGENTS_WHY = (
    ("agents_never_heard",
     "was never heard (not installed or not started there: it did not run there)"),
    ("agents_following_no_plan",
     "never had a plan (it beat, but its broker user may not read its plan's topic: it "
     "did not run there)"),
    ("agents_behind_their_plan",
     "never took that plan (it follows an older one: it refused the newer, or cannot read "
     "it; it did not run there)"),
)  # fmt: skip
"""The ``failed`` event's lists of servers whose agents did not run a job, and why."""


def _plan_ended(detail: dict[str, Any]) -> str:
    done, of = detail.get("minibatches"), detail.get("of")
    done_words = f"{done:g}" if isinstance(done, int | float) else "?"
    text = (f"failed: its plan ended in slot {detail.get('completion_slot')} and its agents "
            f"reported {done_words} of its {of} mini-batches")  # fmt: skip
    if detail.get("reason") == "plan_not_sent":
        runs = detail.get("not_sent_slots")
        run = runs[0] if isinstance(runs, list) and len(runs) == 1 else None
        one = isinstance(run, list) and len(run) > 0 and run[0] == run[-1]
        whose = "plan of slot" if one else "plans of slots"  # "the plans of slots 3" read odd
        text += (f"; the {whose} {_runs(runs)} never reached its agents (oasisd, its broker "
                 "or its store was out)")  # fmt: skip
    for key, why in _AGENTS_WHY:
        servers = detail.get(key)
        if isinstance(servers, list) and servers:
            names = ", ".join(str(s) for s in servers[:5]) + (", ..." if len(servers) > 5 else "")
            text += f"; the agent of {names}, where its plan placed it, {why}"
    failing = detail.get("worker_failures")
    if isinstance(failing, list) and failing and isinstance(failing[0], dict):
        first = failing[0]
        text += (f"; its workers failed {first.get('failures')} time(s) on "
                 f"{first.get('server')}, last: {first.get('last_failure')}")  # fmt: skip
    return text


def failed_reason(detail: dict[str, Any]) -> str:
    """Why a job failed, from its ``failed`` event's ``detail``, at most
    :data:`MAX_REASON` characters."""
    reason = str(detail.get("reason"))
    if reason in ("plan_ended", "plan_not_sent"):
        return _plan_ended(detail)[:MAX_REASON]
    why = _STRANDED.get(reason, "{reason}")
    cause = why.format(**{"server": "?", "why": "", "reason": "?", **detail})
    return (f"failed from slot {detail.get('from_slot')}: {cause}, and no other server had "
            "room for the rest of its work")[:MAX_REASON]  # fmt: skip
