"""Client commands: ``oasis submit|quote|jobs|job|cancel|servers|prices|watch``.

Readable tables by default, each slot with the local time it begins; ``--json`` prints
plain JSON (:mod:`controller.commands.records`). A job file holds a job object (SPEC 3,
or in people's units: README "Job specs"), a list of them, or what ``oasis job ID
--json`` printed. Exit status: 0 admitted (or done), 3 rejected, 4 pending (``submit
--wait``), 2 bad input, 1 otherwise, a retry answered with a job cancelled or failed
since included (:mod:`controller.commands.connection`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc

from controller.clock import SlotTimes
from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    INT32_MAX,
    InputError,
    Terminated,
    counted,
    fmt,
    int_at_least,
    read_json,
    seconds_of,
)
from controller.commands.connection import (
    EXIT_REJECTED,
    PartialFailureError,
    Stubs,
    guarded,
    options,
    print_json,
    report_error,
)
from controller.commands.failover import followed_events
from controller.commands.records import (
    ABANDONED,
    STATES,
    agent_heard,
    agent_record,
    clock_caption,
    decision_record,
    event_record,
    job_record,
    local_time,
    plain,
    slot_label,
    spec_of,
    state_name,
)
from controller.commands.utility_words import utility_line
from controller.job_keys import SEPARATOR
from controller.rpc import oasis_pb2 as pb
from controller.table import render_table
from pricing.durations import DURATION_EXAMPLES, format_duration

__all__ = ["register"]


def register(sub: Any) -> None:
    common = options()

    def add(name: str, func: Callable[[argparse.Namespace], int]) -> Any:
        help_ = SUMMARIES[name]
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.set_defaults(func=guarded(func))
        return p

    job_file = "a job object (README: Job specs), a list of them, what `job --json` printed, or -"
    p = add("submit", cmd_submit)
    p.set_defaults(api_flags={"wait_seconds": "--wait"})
    p.add_argument("file", metavar="JOB.json", help=job_file)
    p.add_argument(
        "--wait",
        type=wait_duration,
        default=None,
        metavar="DURATION",
        help="if not admitted now, stay pending this long (e.g. 90s, 30m, 2h, 1d; a bare "
        "number is seconds; 0: reject at once), decided again at each slot boundary "
        "(default: the daemon's daemon.wait_seconds)",
    )
    one_job = "a job object (README: Job specs), what `job --json` printed, or -"
    add("quote", cmd_quote).add_argument("file", metavar="JOB.json", help=one_job)
    p = add("jobs", cmd_jobs)
    p.add_argument("--state", action="append", choices=STATES, default=[],
                   help="only jobs in this state (again for more: --state admitted "
                   "--state running)")  # fmt: skip
    p.add_argument("--limit", type=int_at_least(0, INT32_MAX), default=0,
                   help="at most this many jobs, in decision order (default 0: all)")  # fmt: skip
    named = "the job's id; with tokens, an operator names a submitter's job NAME:ID"
    add("job", cmd_job).add_argument("id", help=named)
    add("cancel", cmd_cancel).add_argument("id", help=named)
    add("servers", cmd_servers)
    p = add("prices", cmd_prices)
    p.set_defaults(api_flags={"first_slot": "--from", "slots": "--slots"})
    p.add_argument("--from", dest="first", type=int_at_least(0), default=0, metavar="SLOT",
                   help="the first slot to show, a slot number as the columns are headed, "
                   "inside the daemon's window (default: the current slot)")  # fmt: skip
    p.add_argument("--slots", type=int_at_least(1, INT32_MAX), default=8,
                   help="slots to show (default 8)")  # fmt: skip
    p.add_argument("--node", dest="node", default="", metavar="NAME",
                   help="one server of the cluster only (as `oasis servers` lists it)")  # fmt: skip
    p.add_argument("--server-name", dest="node", help=argparse.SUPPRESS)  # the old name
    p = add("watch", cmd_watch)
    p.set_defaults(api_flags={"after_sequence": "--from"})
    p.add_argument(
        "--from",
        dest="after",
        type=int_at_least(-1),
        default=-1,
        help="first replay stored events after this sequence (default: none)",
    )


# -- reading job files ---------------------------------------------------------------


def _specs(path: str) -> list[dict[str, Any]]:
    """The job objects of a file: one, a list, or job records as ``job --json`` prints
    them (``{"id", "state", "spec", "decision", ...}``, whose spec is taken). A record an
    operator printed names another tenant's job by its key, ``alice:train-1``, which is
    no id: its spec is taken with the id after ``NAME:`` (the operator's own job of that
    id, as any job an operator submits)."""
    data = read_json(path)
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):
        data = data["jobs"]  # what `jobs --json` printed
    items = data if isinstance(data, list) else [data]
    out = []
    for i, item in enumerate(items):
        where = f"{path}: item {i + 1}" if isinstance(data, list) else path
        if not isinstance(item, dict):
            raise InputError(f"{where}: a job must be a JSON object")
        record = isinstance(item.get("spec"), dict) and "decision" in item
        spec = item["spec"] if record else item
        key = spec.get("id")
        if record and isinstance(key, str) and SEPARATOR in key:
            spec = {**spec, "id": key.rsplit(SEPARATOR, 1)[1]}
        out.append(spec)
    if not out:
        raise InputError(f"{path}: no jobs in it")
    return out


def _request_spec(spec: dict[str, Any]) -> pb.JobSpec:
    return pb.JobSpec(json=json.dumps(spec))


def wait_duration(text: str) -> float:
    """An argparse ``type``: a duration such as ``90s``, ``30m``, ``1h30m`` or ``2d``, or a
    bare number of seconds; >= 0."""
    value = seconds_of(text)
    if value is None or not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"not a duration >= 0: {text!r} (e.g. {DURATION_EXAMPLES}, or seconds)"
        )
    return value


# -- decisions for people ------------------------------------------------------------


def _decision_lines(
    title: str,
    d: pb.Decision,
    times: SlotTimes | None,
    state: str = "",
    quote: bool = False,
    job: pb.Job | None = None,
) -> Iterator[str]:
    would = "would be " if quote else ""
    if state == "pending":
        until = (
            f" until slot {slot_label(job.wait_until_slot, times)}"
            if job is not None and job.HasField("wait_until_slot")
            else ""
        )
        yield (
            f"{title}: pending{until} (decided again at each slot boundary, its utility "
            f"counted from arrival slot {d.arrival_slot}); not admitted now: {d.reason}"
        )
    elif state == "expired":
        yield f"{title}: expired: {d.reason}"
    elif state == "cancelled" and not d.admitted:
        yield f"{title}: cancelled while pending"
    elif state == "cancelled":
        end = (
            f"ran until the end of slot {slot_label(d.completion_slot, times, end=True)}"
            if d.HasField("completion_slot")
            else "never ran"
        )
        yield f"{title}: cancelled ({end}); it had been admitted with {_plan_words(d, times)}"
    elif state == "failed":
        # a failure's reason is stored with it (a submitter may not read the events)
        why = d.reason or "failed before completing (its 'failed' event says why)"
        yield f"{title}: {why}; it had been admitted with {_plan_words(d, times)}"
    elif d.admitted:
        done = f"; done by {local_time(times.start(d.completion_slot + 1))}" if times else ""
        ran = state in ("running", "completed")
        yield (
            f"{title}: {state + ' (admitted)' if ran else would + 'admitted'}, "
            f"{'arrived' if ran else 'arrives'} in slot {slot_label(d.arrival_slot, times)}, "
            f"{'completed' if state == 'completed' else 'completes'} in slot "
            f"{d.completion_slot}{done} (jct {_jct_words(d, times)}); {_worth_words(d)}"
        )
    else:
        yield f"{title}: {would}rejected: {d.reason}"
    if d.allocations:
        by_slot: dict[int, list[str]] = {}
        for a in d.allocations:
            what = f"{a.workers}w" if a.workers else f"{a.ps}ps"
            by_slot.setdefault(a.slot, []).append(f"{a.server}:{what}")
        if times is None:
            rows = [[str(s), " ".join(v)] for s, v in sorted(by_slot.items())]
            yield render_table(["slot", "plan (server:workers w / ps)"], rows, right={0})
        else:
            rows = [[str(s), local_time(times.start(s)), " ".join(v)]
                    for s, v in sorted(by_slot.items())]  # fmt: skip
            yield render_table(["slot", "begins", "plan (server:workers w / ps)"], rows,
                               right={0})  # fmt: skip


def _worth_words(d: pb.Decision) -> str:
    """``utility U, cost C, payoff P`` of an admitted job; its cost and payoff are those of
    its decision, its utility that of its plan now: one moved since (a server failed or
    was cordoned, its work ran slow) says so, rather than show a payoff over its utility
    less its cost."""
    decided = d.payoff + d.cost  # the utility of the plan it was admitted with
    if not _moved(d):
        return f"utility {d.utility:.6g}, cost {d.cost:.6g}, payoff {d.payoff:.6g}"
    return (
        f"utility {d.utility:.6g} as re-planned (its 'replanned' events say why); admitted "
        f"with utility {decided:.6g}, cost {d.cost:.6g}, payoff {d.payoff:.6g}"
    )


def _jct_words(d: pb.Decision, times: SlotTimes | None) -> str:
    """A decision's jct in slots, and in time when the slot length is known: ``5 = 5h``."""
    return f"{d.jct}" + (f" = {format_duration(d.jct * times.slot_seconds)}" if times else "")


def _plan_words(d: pb.Decision, times: SlotTimes | None) -> str:
    """An abandoned plan (a cancelled or failed job's) in words, said to be a plan:
    ``payoff 99.8 (planned: completion in slot 5, jct 5 = 5h, utility 100)``."""
    if not d.HasField("jct"):
        return f"payoff {fmt(d.payoff if d.HasField('payoff') else None)}"
    return (
        f"payoff {d.payoff:.6g} (planned: completion in slot {d.arrival_slot + d.jct - 1}, "
        f"jct {_jct_words(d, times)}, utility {d.utility:.6g})"
    )


_T = TypeVar("_T")

EXIT_PENDING = 4
"""``submit --wait``: a job not admitted yet is pending (and none was rejected)."""


def _verdict(decisions: list[pb.Decision], states: list[int] | None = None) -> int:
    if states and any(state_name(s) in ABANDONED for s in states):
        # a retry answered with a job cancelled or failed since: it will not run, though
        # its decision admitted it (exit 0 read as "running" to a script)
        return EXIT_FAILURE
    if all(d.admitted for d in decisions):
        return EXIT_OK
    if states and all(d.admitted or s == pb.JOB_STATE_PENDING
                      for d, s in zip(decisions, states, strict=True)):  # fmt: skip
        return EXIT_PENDING
    return EXIT_REJECTED


_NO_EFFECT = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED,
})  # fmt: skip
"""Refusals after which a submitted job was surely not admitted; after any other failure
(no answer in time, the connection lost, the daemon stopping) it may have been."""


def cmd_submit(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    specs = _specs(args.file)
    responses: list[pb.SubmitJobResponse] = []
    # every job is sent with an id: a retry on another node must carry the same one, the
    # items of a list that took effect before one failed must be named, and a call that
    # fails without an answer may still have admitted its job (the CLI audit: each
    # `submit --timeout 1` that timed out had, and a retry admitted a second copy)
    from controller.jobspec import new_id  # numpy: not at the parser's start-up

    given = [s.get("id") if isinstance(s.get("id"), str) else None for s in specs]
    specs = [s if s.get("id") else {**s, "id": new_id()} for s in specs]
    info = stubs.info() if len(specs) > 1 else None
    if info is not None:  # without a slot clock: each item is checked there
        from controller.commands.precheck import check_items

        clock = SlotTimes(info.epoch, info.slot_seconds)
        check_items(specs, given, clock, info.window, info.current_slot + 1, args.file,
                    info.resources)  # fmt: skip
    for i, spec in enumerate(specs):
        req = pb.SubmitJobRequest(job=_request_spec(spec), wait_seconds=args.wait)
        submit = functools.partial(stubs.admission.SubmitJob, req, timeout=stubs.timeout)
        try:
            resp = stubs.paced(submit)  # refused unread for the rate: sent again
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
            return _interrupted(args, specs, i, responses, given, stop)
        except grpc.RpcError as err:
            job_id = spec["id"]
            note = (f"the job may have been admitted as {job_id!r} before the call failed: "
                    f"see `oasis job {job_id}`. To submit it again, give it \"id\": "
                    f'"{job_id}": a copy already admitted is then answered as a duplicate, '
                    "not admitted twice") if err.code() not in _NO_EFFECT else ""  # fmt: skip
            if len(specs) == 1:
                if note:
                    raise PartialFailureError(err, {"id": job_id, "note": note}) from err
                raise
            name = spec.get("id") if isinstance(spec.get("id"), str) else "without an id"
            if not args.json:
                before = ("none before it was" if i == 0 else "the one before it was"
                          if i == 1 else f"the {i} before it were")  # fmt: skip
                print(f"oasis submit: item {i + 1} ({name}) failed; {before} submitted, the rest "
                      f"were not{_sent_again(given, specs, i)}", file=sys.stderr)  # fmt: skip
                if note:  # said after the error's own line (connection.report_error)
                    raise PartialFailureError(err, {"note": note}) from err
                raise
            # the decisions taken stay answered: a script must not think none were
            try:
                times = stubs.times() if responses else None
            except grpc.RpcError:  # the daemon went away: slot numbers without times
                times = None
            done = _submitted(responses, times)
            failed = {"item": i, "id": name, "not_sent": len(specs) - i - 1}
            if note:
                failed["note"] = note
            raise PartialFailureError(err, {"failed": failed, "submitted": done}) from err
        responses.append(resp)
        if not args.json:
            state = state_name(resp.job.state)
            note = _duplicate_note(state, args.wait) if resp.duplicate else ""
            lines = _decision_lines(
                resp.job.spec.id, resp.job.decision, _clock_after(stubs), state, job=resp.job
            )
            for n, line in enumerate(lines):
                print(line + note if note and n == 0 else line)
    if args.json:
        times = _clock_after(stubs)
        records = _submitted(responses, times)
        print_json(records if len(records) != 1 else records[0])
    return _verdict([r.job.decision for r in responses], [r.job.state for r in responses])


def _clock_after(stubs: Stubs) -> SlotTimes | None:
    """The slot clock for answers already had (:meth:`Stubs.times`, paced), or None if it
    cannot be had now: the answers are then shown with slot numbers alone. Asked after a
    submission, a refusal of it for the rate failed `oasis submit` (exit 1,
    RESOURCE_EXHAUSTED, which reads as "not admitted") with its job admitted."""
    try:
        return stubs.times()
    except grpc.RpcError:
        return None


def _duplicate_note(state: str, wait: float | None) -> str:
    """What the first line of a retry's answer adds: that it is the first decision, and,
    for a job that will not run, that its id is not decided again (a script that
    submitted the file again after a cancel read it as running)."""
    if state in ABANDONED:
        return (
            f" (already decided: this is the first decision, {state} since; this id names "
            "that job and is not decided again: give the job another id to submit it anew)"
        )
    if state == "rejected" and wait:  # the retry's wait was not applied
        return (
            " (already decided: this is the first decision; --wait applies to a new "
            "submission only: give the job another id to queue it)"
        )
    return " (already decided: this is the first decision)"


def _submitted(
    responses: list[pb.SubmitJobResponse], times: SlotTimes | None
) -> list[dict[str, Any]]:
    """``submit --json``'s record of each answered submission."""
    return [job_record(r.job, times) | {"duplicate": r.duplicate} for r in responses]


def _sent_again(given: Sequence[str | None], specs: list[dict[str, Any]], i: int) -> str:
    """``"; 2 of the jobs submitted have no "id" in the file (job-..., ...): ..."``: that
    the items before item ``i`` that the file gives no id (``given``: each one's id as
    the file gives it) were submitted under ids the client made, so the file run again,
    item ``i`` mended, would admit them a second time; ``""`` if every one has an id (a
    retry of it is answered with its first decision)."""
    made = [specs[k]["id"] for k in range(i) if given[k] is None]
    if not made:
        return ""
    shown = ", ".join(made[:5]) + (f" and {len(made) - 5} more" if len(made) > 5 else "")
    if len(made) == 1:
        return (
            f'; 1 of the jobs submitted has no "id" in the file ({shown}): run as it is '
            "again, the file would submit it again as a new job; give it that id, or take "
            "it out"
        )
    return (
        f'; {len(made)} of the jobs submitted have no "id" in the file ({shown}): run as '
        "it is again, the file would submit them again as new jobs; give them those ids, "
        "or take them out"
    )


def _interrupted(
    args: argparse.Namespace,
    specs: list[dict[str, Any]],
    i: int,
    responses: list[pb.SubmitJobResponse],
    given: Sequence[str | None],
    stop: KeyboardInterrupt | None = None,
) -> int:
    """Ctrl-C while item ``i`` of ``specs`` was being submitted: say what was submitted
    (with ``--json`` the partial-failure object), and that item ``i`` may have been;
    exit 130. Before, a traceback, and under ``--json`` nothing at all: 171 of 300 jobs
    were stored and the script could not tell which (the CLI audit). A SIGTERM
    (``stop`` a :class:`Terminated`) is said as ``terminated``, status 143, as every
    other command says it (it read ``interrupted``, 130, as if a person had pressed
    Ctrl-C)."""
    word, status = ("terminated", EXIT_TERMINATED) if isinstance(stop, Terminated) else (
        "interrupted", EXIT_INTERRUPTED)  # fmt: skip
    job_id = specs[i]["id"]
    note = (f"item {i + 1}, {job_id!r}, may have been admitted: see `oasis job {job_id}`; "
            f"{len(specs) - i - 1} after it were not sent")  # fmt: skip
    if args.json:
        failed = {"item": i, "id": job_id, "not_sent": len(specs) - i - 1}
        extra = {"failed": failed, "submitted": _submitted(responses, None), "note": note}
        report_error(args, "CANCELLED", word, extra=extra)
    else:
        print(f"oasis submit: {word}; {len(responses)} submitted before it; {note}"
              f"{_sent_again(given, specs, i)}", file=sys.stderr)  # fmt: skip
    return status


def cmd_quote(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    specs = _specs(args.file)
    if len(specs) != 1:  # help said "a list of them" too, as submit's does
        raise InputError(
            f"{args.file}: a list of {len(specs)} jobs; quote takes one (give each its own "
            "file, or - with one job on standard input)"
        )
    req = pb.QuoteJobRequest(job=_request_spec(specs[0]))
    resp = stubs.admission.QuoteJob(req, timeout=stubs.timeout)
    times = stubs.times()
    existing = resp.existing if resp.HasField("existing") else None
    if args.json:
        print_json({
            "decision": decision_record(resp.decision, times),
            "existing": None if existing is None else job_record(existing, times),
        })  # fmt: skip
    else:
        given = specs[0].get("id")
        title = f"quote for {given}" if isinstance(given, str) and given else "quote"
        for line in _decision_lines(title, resp.decision, times, quote=True):
            print(line)
        print("(nothing committed)")
        if existing is not None:
            first = next(_decision_lines(existing.spec.id, existing.decision, times,
                                         state_name(existing.state), job=existing))  # fmt: skip
            print(f"but {existing.spec.id} exists already with this spec: a submission "
                  f"returns its first decision, not this quote:\n{first}")  # fmt: skip
    if existing is not None:  # a submission returns it: its exit status is the quote's
        return _verdict([existing.decision], [existing.state])
    return _verdict([resp.decision])


def _job_row(job: pb.Job, times: SlotTimes | None) -> list[str]:
    d = job.decision
    if state_name(job.state) in ABANDONED:  # its plan's numbers were never earned
        return [job.spec.id, state_name(job.state), str(job.sequence),
                slot_label(d.arrival_slot, times), "-", "-", "-", "-"]  # fmt: skip
    done = d.completion_slot if d.HasField("completion_slot") else None
    jct = "-"
    if d.HasField("jct"):
        jct = str(d.jct) + (f" ({format_duration(d.jct * times.slot_seconds)})" if times else "")
    return [
        job.spec.id,
        state_name(job.state),
        str(job.sequence),
        slot_label(d.arrival_slot, times),
        "-" if done is None else slot_label(done, times, end=True),
        jct,
        fmt(d.payoff if d.HasField("payoff") else None),
        fmt(d.utility if d.HasField("utility") else None) + ("*" if _moved(d) else ""),
    ]


def _moved(d: pb.Decision) -> bool:
    """Whether an admitted job's plan changed since its decision (a server failed or was
    cordoned, its work ran slow): its utility now is not its decision's payoff + cost."""
    if not (d.HasField("payoff") and d.HasField("utility") and d.HasField("cost")):
        return False
    return not math.isclose(d.payoff + d.cost, d.utility, rel_tol=1e-9, abs_tol=1e-9)


_MOVED_NOTE = ("* re-planned since its admission: payoff is the decision's, utility the "
               "plan's now (oasis job ID says why)")  # fmt: skip


_JOB_HEADERS = ["job", "state", "seq", "arrival (begins)", "completes (done by)", "jct",
                "payoff", "utility"]  # fmt: skip


def _jobs_table(jobs: list[pb.Job], times: SlotTimes | None) -> str:
    table = render_table(_JOB_HEADERS, [_job_row(j, times) for j in jobs], right={2, 5, 6, 7})
    if any(_moved(j.decision) for j in jobs if state_name(j.state) not in ABANDONED):
        table += f"\n{_MOVED_NOTE}"
    caption = clock_caption(times)
    return f"{table}\n{caption}" if caption and jobs else table


def list_jobs(stubs: Stubs, states: Sequence[Any], limit: int = 0) -> list[pb.Job]:
    """Every job in ``states`` (empty: all), up to ``limit`` (0: all), page after page."""
    jobs: list[pb.Job] = []
    token = ""
    while True:
        left = limit - len(jobs) if limit > 0 else 0
        req = pb.ListJobsRequest(states=states, limit=left, page_token=token)
        resp = stubs.admission.ListJobs(req, timeout=stubs.timeout)
        jobs.extend(resp.jobs)
        token = resp.next_page_token
        if not token or (limit > 0 and len(jobs) >= limit):
            return jobs


PRICE_PAGE = 1000
"""Servers asked per ``GetPrices`` page (the daemon may give fewer, by bytes)."""


def get_prices(stubs: Stubs, first_slot: int, slots: int, server: str = "") -> pb.GetPricesResponse:
    """Every server's prices (or ``server``'s) over ``slots`` slots from ``first_slot`` (0:
    the current slot), page after page, as one answer: at 10,000 servers, more than 40
    slots of them do not fit in one message. Later pages ask the first page's slot, so a
    slot boundary between pages does not shift them."""
    out = pb.GetPricesResponse()
    token = ""
    while True:
        req = pb.GetPricesRequest(first_slot=first_slot, slots=slots, server=server,
                                  page_size=PRICE_PAGE, page_token=token)  # fmt: skip
        resp = stubs.cluster.GetPrices(req, timeout=stubs.timeout)
        out.first_slot = first_slot = resp.first_slot
        out.prices.extend(resp.prices)
        token = resp.next_page_token
        if not token:
            return out


def cmd_jobs(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    states = [f"JOB_STATE_{s.upper()}" for s in args.state]
    # one more than --limit: whether jobs were left out, which the table did not say
    listed = list_jobs(stubs, states, args.limit + 1 if args.limit else 0)
    more = bool(args.limit) and len(listed) > args.limit
    resp = pb.ListJobsResponse(jobs=listed[: args.limit] if more else listed)
    times = stubs.times()
    if args.json:
        print_json({"jobs": [job_record(j, times) for j in resp.jobs]})
    elif not resp.jobs:  # a header and a rule alone read as a broken table
        print("no jobs" + (f" in state {' or '.join(args.state)}" if args.state else ""))
    else:
        print(_jobs_table(list(resp.jobs), times))
        if more:
            print(f"the first {args.limit} in decision order; more follow (--limit 0 lists "
                  "every one)")  # fmt: skip
    return EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    resp = stubs.admission.GetJob(pb.GetJobRequest(id=args.id), timeout=stubs.timeout)
    times = stubs.times()
    if args.json:
        print_json(job_record(resp.job, times))
        return EXIT_OK
    print(_jobs_table([resp.job], times))
    print()
    state = state_name(resp.job.state)
    for line in _decision_lines(resp.job.spec.id, resp.job.decision, times, state, job=resp.job):
        print(line)
    said = utility_line(spec_of(resp.job.spec), resp.job.decision.arrival_slot, times)
    if said:  # what the spec asked for, its times local as the table's
        print(said)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    resp = stubs.admission.CancelJob(pb.CancelJobRequest(id=args.id), timeout=stubs.timeout)
    if args.json:
        record = job_record(resp.job, _clock_after(stubs))  # cancelled: not lost for it
        print_json({"job": record, "released_worker_slots": resp.released_worker_slots})
    else:
        released = resp.released_worker_slots
        print(f"{args.id}: cancelled; " + (
            f"{counted(released, 'worker-slot')} released" if released
            else "nothing was planned for it ahead, so no slot was released"))  # fmt: skip
    return EXIT_OK


def cmd_servers(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    resp = stubs.cluster.ListServers(pb.ListServersRequest(), timeout=stubs.timeout)
    # the config's order (a daemon older than that field: by name)
    resources = list(resp.resources) or sorted({r for s in resp.servers for r in s.capacity})
    if args.json:
        data = plain(resp)
        for server, s in zip(data["servers"], resp.servers, strict=True):
            for key in ("capacity", "used"):  # maps in the config's order, as the table
                given = server[key]
                server[key] = {r: given[r] for r in resources if r in given} | given
            server.update(agent_record(s))  # never heard: no Infinity (not JSON)
        print_json(data)
        return EXIT_OK
    rows = []
    for s in resp.servers:
        kind = "worker" if s.kind == pb.SERVER_KIND_WORKER else "ps"
        cells = [  # "-": a resource this server has none of (a PS server's gpu)
            f"{s.used.get(r, 0):g}/{s.capacity.get(r, 0):g}" if s.capacity.get(r, 0) else "-"
            for r in resources
        ]
        rows.append([s.name, kind, s.state or "up", agent_heard(s), *cells])
    print(f"slot {slot_label(resp.current_slot, stubs.times())}: used/capacity; state from "
          "the next slot; agent: when last heard")  # fmt: skip
    right = {3, *range(4, 4 + len(resources))}
    print(render_table(["server", "kind", "state", "agent", *resources], rows, right=right))
    times = stubs.times()
    for s in resp.servers:
        if s.cordoned_from_slot:  # cordoned, or a cordon planned (its state is not yet)
            who = f" by {s.cordoned_by}" if s.cordoned_by else ""
            why = f": {s.cordon_reason}" if s.cordon_reason else ""
            until = (f" until slot {slot_label(s.cordoned_until_slot, times)}"
                     if s.cordoned_until_slot else "")  # fmt: skip
            what = "cordoned" if s.state == "cordoned" else "a cordon planned"
            print(f"{s.name}: {what} from slot {slot_label(s.cordoned_from_slot, times)}"
                  f"{until}{who}{why} (oasis uncordon {s.name})")  # fmt: skip
    return EXIT_OK


def cmd_prices(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    resp = get_prices(stubs, args.first, args.slots, args.node or "")
    if args.json:  # the pages as one answer: no token to follow
        print_json({k: v for k, v in plain(resp).items() if k != "next_page_token"})
        return EXIT_OK
    n = max((len(p.prices) for p in resp.prices), default=0)
    headers = ["server", "resource", *(str(resp.first_slot + i) for i in range(n))]
    rows = [[p.server, p.resource, *(f"{x:.3g}" for x in p.prices)] for p in resp.prices]
    times = stubs.times()
    when = f"; slot {slot_label(resp.first_slot, times)}, {clock_caption(times)}" if times else ""
    print(f"unit prices by slot{when}")
    print(render_table(headers, rows, right=set(range(2, 2 + n))))
    return EXIT_OK


def short_numbers(detail: str) -> str:
    """An event's JSON ``detail`` for people: each number not a whole one to 6
    significant digits, as the other commands print them (``"payoff": 6.92718``, not
    ``6.927184195498584``); text that is not JSON as it is. ``--json`` keeps every
    digit."""
    try:
        value = json.loads(detail)
    except ValueError:
        return detail

    def short(x: Any) -> Any:
        if isinstance(x, float) and math.isfinite(x) and not x.is_integer():
            return float(f"{x:.6g}")
        if isinstance(x, dict):
            return {k: short(v) for k, v in x.items()}
        if isinstance(x, list):
            return [short(v) for v in x]
        return x

    return json.dumps(short(value))


def cmd_watch(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    times = stubs.times()
    last = args.after  # the last event shown (-1: none, and none asked for before)
    try:
        for event in followed_events(stubs.pool, args.after):
            last = max(last, event.sequence)
            if args.json:
                print(json.dumps(event_record(event, times)), flush=True)
            else:
                state = state_name(event.state) if event.state else ""
                detail = short_numbers(event.detail)
                print(f"#{event.sequence} slot {slot_label(event.slot, times)} {event.kind} "
                      f"{event.job_id} {state} {detail}", flush=True)  # fmt: skip
    except grpc.RpcError as err:
        if last < 0 or err.code() == grpc.StatusCode.INVALID_ARGUMENT:  # a --from refused
            raise
        # the daemon stopped or restarted (one node): where to go on without a gap; the
        # message's "submitted again" is a submission's, and the events meanwhile are
        # stored (before, nothing said which was the last one shown)
        note = (f"the stream ended after event #{last}: oasis watch --from {last} shows "
                "those stored since, then follows again")  # fmt: skip
        raise PartialFailureError(err, {"note": note}) from err
    except Terminated:  # SIGTERM (a unit's stop, `timeout`): said, status 143, as elsewhere
        raise
    except KeyboardInterrupt:  # the way to stop watching: quiet, with the shell's status
        return EXIT_INTERRUPTED
    return EXIT_OK
