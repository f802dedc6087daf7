"""Client commands: ``oasis [--server ADDR] submit|quote|jobs|job|cancel|servers|prices|watch``.

Readable tables by default, ``--json`` for scripts. On an error the server's status and
message are printed and the exit status is 2 for bad input (INVALID_ARGUMENT), 1 for
anything else (the daemon unreachable, NOT_FOUND, ALREADY_EXISTS, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from controller.commands.common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, InputError, fmt
from controller.convert import STATE_NAMES, spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.table import render_table
from controller.tls import client_channel, read_pem
from pricing.errors import SpecError

__all__ = ["register"]

DEFAULT_SERVER = "127.0.0.1:50051"
_STATE_OF = {v: k for k, v in STATE_NAMES.items()}


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--server",
        default=os.environ.get("OASIS_SERVER", DEFAULT_SERVER),
        metavar="ADDR",
        help=f"daemon address (default: $OASIS_SERVER or {DEFAULT_SERVER})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")
    env = os.environ.get
    p.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CAs")
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=env("OASIS_TLS_CA", ""),
        help="use TLS, trusting this CA (default: $OASIS_TLS_CA)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        default=env("OASIS_TLS_CERT", ""),
        help="client certificate for mutual TLS (default: $OASIS_TLS_CERT)",
    )
    p.add_argument(
        "--tls-key",
        metavar="FILE",
        default=env("OASIS_TLS_KEY", ""),
        help="its private key (default: $OASIS_TLS_KEY)",
    )
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        default="",
        help="name to verify in the daemon's certificate (default: its host)",
    )
    p.add_argument(
        "--token",
        default=env("OASIS_TOKEN", ""),
        help="bearer token (default: $OASIS_TOKEN, which keeps it out of ps)",
    )
    return p


def connect(args: argparse.Namespace) -> grpc.Channel:
    """A channel to ``args.server`` with the TLS and token options of :func:`_common`."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InputError("--tls-cert and --tls-key go together")

    def pem(path: str, what: str, option: str) -> bytes | None:
        if not path:
            return None
        try:
            return read_pem(Path(path), what, option)
        except SpecError as err:
            raise InputError(str(err)) from err

    return client_channel(
        args.server,
        tls=args.tls,
        ca_pem=pem(args.tls_ca, "CERTIFICATE", "--tls-ca"),
        cert_pem=pem(args.tls_cert, "CERTIFICATE", "--tls-cert"),
        key_pem=pem(args.tls_key, "PRIVATE KEY", "--tls-key"),
        server_name=args.tls_server_name,
        token=args.token,
    )


def register(sub: Any) -> None:
    common = _common()

    def add(name: str, help_: str, func: Callable[[argparse.Namespace], int]) -> Any:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.set_defaults(func=_wrap(func))
        return p

    p = add("submit", "submit a job (or a list of jobs) and print the decision", cmd_submit)
    p.add_argument("file", metavar="JOB.json", help="a job object as in SPEC 3, a list, or -")
    p = add("quote", "price a job without committing anything", cmd_quote)
    p.add_argument("file", metavar="JOB.json", help="a job object as in SPEC 3, or -")
    p = add("jobs", "list jobs", cmd_jobs)
    p.add_argument("--state", action="append", choices=sorted(STATE_NAMES), default=[])
    p.add_argument("--limit", type=int, default=0)
    p = add("job", "show one job with its plan", cmd_job)
    p.add_argument("id")
    p = add("cancel", "cancel a job; its future slots are released", cmd_cancel)
    p.add_argument("id")
    add("servers", "list servers with capacity and current use", cmd_servers)
    p = add("prices", "unit prices per server and resource over the next slots", cmd_prices)
    p.add_argument("--from", dest="first", type=int, default=0, help="first slot (0: now)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--server-name", dest="server_name", default="", help="one server only")
    p = add("watch", "print decisions and state changes as they happen", cmd_watch)
    p.add_argument(
        "--from",
        dest="after",
        type=int,
        default=-1,
        help="first replay stored events after this sequence (default: none)",
    )


def _wrap(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except grpc.RpcError as err:
            code = err.code()
            print(f"oasis {args.command}: {code.name}: {err.details()}", file=sys.stderr)
            return EXIT_BAD_INPUT if code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILURE

    return run


class _Stubs:
    def __init__(self, args: argparse.Namespace) -> None:
        self.channel = connect(args)
        self.admission = pb_grpc.AdmissionStub(self.channel)  # type: ignore[no-untyped-call]
        self.cluster = pb_grpc.ClusterStub(self.channel)  # type: ignore[no-untyped-call]
        self.timeout = args.timeout


def _read_json(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON: {err.msg} at line {err.lineno}") from err


def _specs(path: str) -> list[pb.JobSpec]:
    data = _read_json(path)
    items = data if isinstance(data, list) else [data]
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputError(f"{path}: item {i}: a job must be a JSON object")
        try:
            out.append(spec_to_proto(item))
        except ValueError as err:
            raise InputError(f"{path}: {err}") from err
    return out


def _dump(msg: Message | list[Message]) -> None:
    def conv(m: Message) -> dict[str, Any]:
        return MessageToDict(
            m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    data = [conv(m) for m in msg] if isinstance(msg, list) else conv(msg)
    print(json.dumps(data, indent=1))


def _decision_lines(job_id: str, d: pb.Decision, state: str = "") -> Iterator[str]:
    if state == "cancelled":
        end = (
            f"ran until slot {d.completion_slot}" if d.HasField("completion_slot") else "never ran"
        )
        yield f"{job_id}: cancelled ({end}); it had been admitted with payoff {d.payoff:.6g}"
    elif d.admitted:
        yield (
            f"{job_id}: admitted, arrives in slot {d.arrival_slot}, completes in slot "
            f"{d.completion_slot} (jct {d.jct}); utility {d.utility:.6g}, cost {d.cost:.6g}, "
            f"payoff {d.payoff:.6g}"
        )
    else:
        yield f"{job_id}: rejected: {d.reason}"
    if d.allocations:
        by_slot: dict[int, list[str]] = {}
        for a in d.allocations:
            what = f"{a.workers}w" if a.workers else f"{a.ps}ps"
            by_slot.setdefault(a.slot, []).append(f"{a.server}:{what}")
        rows = [[str(s), " ".join(v)] for s, v in sorted(by_slot.items())]
        yield render_table(["slot", "plan (server:workers w / ps)"], rows, right={0})


def cmd_submit(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    responses = []
    for spec in _specs(args.file):
        resp = stubs.admission.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=stubs.timeout)
        responses.append(resp)
        if not args.json:
            note = " (already decided: this is the first decision)" if resp.duplicate else ""
            for line in _decision_lines(resp.job.spec.id, resp.job.decision):
                print(line + note if note and line.startswith(resp.job.spec.id) else line)
    if args.json:
        _dump(responses if len(responses) != 1 else responses[0])
    return EXIT_OK


def cmd_quote(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    specs = _specs(args.file)
    if len(specs) != 1:
        raise InputError(f"{args.file}: quote takes one job")
    resp = stubs.admission.QuoteJob(pb.QuoteJobRequest(job=specs[0]), timeout=stubs.timeout)
    if args.json:
        _dump(resp)
    else:
        for line in _decision_lines(specs[0].id + " (quote)", resp.decision):
            print(line)
    return EXIT_OK


def _job_row(job: pb.Job) -> list[str]:
    d = job.decision
    return [
        job.spec.id,
        _STATE_OF.get(job.state, "?"),
        str(job.sequence),
        str(d.arrival_slot),
        fmt(d.payoff if d.HasField("payoff") else None),
        str(d.completion_slot) if d.HasField("completion_slot") else "-",
        str(d.jct) if d.HasField("jct") else "-",
        fmt(d.utility if d.HasField("utility") else None),
    ]


_JOB_HEADERS = ["job", "state", "seq", "arrival", "payoff", "completes", "jct", "utility"]


def list_jobs(stubs: _Stubs, states: Sequence[pb.JobState], limit: int = 0) -> list[pb.Job]:
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


def cmd_jobs(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    if args.limit < 0:
        raise InputError(f"--limit: must be >= 0, got {args.limit}")
    states = [STATE_NAMES[s] for s in args.state]
    resp = pb.ListJobsResponse(jobs=list_jobs(stubs, states, args.limit))
    if args.json:
        _dump(resp)
    else:
        rows = [_job_row(j) for j in resp.jobs]
        print(render_table(_JOB_HEADERS, rows, right={2, 3, 4, 5, 6, 7}))
    return EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    resp = stubs.admission.GetJob(pb.GetJobRequest(id=args.id), timeout=stubs.timeout)
    if args.json:
        _dump(resp)
        return EXIT_OK
    print(render_table(_JOB_HEADERS, [_job_row(resp.job)], right={2, 3, 4, 5, 6, 7}))
    print()
    state = _STATE_OF.get(resp.job.state, "")
    for line in _decision_lines(resp.job.spec.id, resp.job.decision, state):
        print(line)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    resp = stubs.admission.CancelJob(pb.CancelJobRequest(id=args.id), timeout=stubs.timeout)
    if args.json:
        _dump(resp)
    else:
        print(f"{args.id}: cancelled; {resp.released_worker_slots} worker-slots released")
    return EXIT_OK


def cmd_servers(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    resp = stubs.cluster.ListServers(pb.ListServersRequest(), timeout=stubs.timeout)
    if args.json:
        _dump(resp)
        return EXIT_OK
    resources = sorted({r for s in resp.servers for r in s.capacity})
    rows = []
    for s in resp.servers:
        kind = "worker" if s.kind == pb.SERVER_KIND_WORKER else "ps"
        cells = [f"{s.used.get(r, 0):g}/{s.capacity.get(r, 0):g}" for r in resources]
        rows.append([s.name, kind, *cells])
    print(f"slot {resp.current_slot}: used/capacity")
    print(
        render_table(["server", "kind", *resources], rows, right=set(range(2, 2 + len(resources))))
    )
    return EXIT_OK


def cmd_prices(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    req = pb.GetPricesRequest(first_slot=args.first, slots=args.slots, server=args.server_name)
    resp = stubs.cluster.GetPrices(req, timeout=stubs.timeout)
    if args.json:
        _dump(resp)
        return EXIT_OK
    n = max((len(p.prices) for p in resp.prices), default=0)
    headers = ["server", "resource", *(str(resp.first_slot + i) for i in range(n))]
    rows = [[p.server, p.resource, *(f"{x:.3g}" for x in p.prices)] for p in resp.prices]
    print("unit prices by slot")
    print(render_table(headers, rows, right=set(range(2, 2 + n))))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    stubs = _Stubs(args)
    try:
        for event in stubs.admission.WatchEvents(pb.WatchEventsRequest(after_sequence=args.after)):
            if args.json:
                print(
                    json.dumps(MessageToDict(event, preserving_proto_field_name=True)), flush=True
                )
            else:
                state = _STATE_OF.get(event.state, "")
                print(f"#{event.sequence} slot {event.slot} {event.kind} {event.job_id} {state} "
                      f"{event.detail}", flush=True)  # fmt: skip
    except KeyboardInterrupt:
        pass
    return EXIT_OK
