"""The ``oasis`` client in a user's terms (issue 13), against ``oasisd`` as a subprocess:
job specs in seconds and times, ids the daemon makes, strict errors listed at once,
JSON that round-trips, exit codes, wall-clock times, addresses and what to check when
the daemon cannot be reached; and issue 12's clean INVALID_ARGUMENT cases."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status

from controller.clock import SlotTimes
from controller.commands.records import local_time
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from pricing.durations import format_time
from pricing.runtime_estimate import RuntimePrior, fit
from tests.servers import ROOT, SMALL_JOB, Daemon, free_port, json_log, oasis, write_config

PEOPLE: dict[str, Any] = {  # SMALL_JOB in people's units: 36 s is 0.01 of an hour
    **{k: v for k, v in SMALL_JOB.items() if k != "tau"},
    "minibatch_seconds": 36,
    "utility": {"kind": "deadline", "value": 50, "deadline": "6h", "half_life": "1h"},
}


@pytest.fixture(scope="module")
def epoch() -> float:
    return time.time()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, epoch: float) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("client")
    config = write_config(tmp / "oasisd.toml", tmp / "data", epoch=epoch)
    d = Daemon(config, tmp / "oasisd.log").start()
    yield d
    assert d.stop() == 0, (tmp / "oasisd.log").read_text()


def write(tmp_path: Path, spec: Any, name: str = "job.json") -> str:
    path = tmp_path / name
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return str(path)


def run(*args: str, server: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "controller.cli", *args, "--server", server]
    return subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )


def cluster_info(address: str) -> pb.GetClusterInfoResponse:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ClusterStub(channel)
        info: pb.GetClusterInfoResponse = stub.GetClusterInfo(
            pb.GetClusterInfoRequest(), timeout=10
        )
        return info


def without_ms(decision: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in decision.items() if k != "decision_ms"}


def test_a_job_in_seconds_without_an_id_gets_one(tmp_path: Path, daemon: Daemon) -> None:
    out = run("submit", write(tmp_path, PEOPLE), server=daemon.address)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split(":", 1)[0]
    assert job_id.startswith("job-") and ": admitted, arrives in slot" in out.stdout
    shown = json.loads(run("job", job_id, "--json", server=daemon.address).stdout)
    assert shown["id"] == job_id and shown["state"] == "admitted"
    assert shown["spec"] == {**PEOPLE, "id": job_id}  # as given, in seconds and durations
    again = run("submit", write(tmp_path, PEOPLE), server=daemon.address)
    assert again.stdout.split(":", 1)[0] not in (job_id, "")  # no id: a new job each time


def test_a_submit_with_no_answer_names_the_id_its_job_may_have_been_admitted_as(
    tmp_path: Path, daemon: Daemon
) -> None:
    """The CLI audit: a submit without an id that timed out (the answer waits for its
    commit) exited 1, yet had admitted its job, under an id the client never learnt; a
    retry admitted a second copy. The client now names the id it sent."""
    assert daemon.proc is not None
    kids = subprocess.run(["pgrep", "-P", str(daemon.proc.pid)], capture_output=True,
                          text=True, check=False).stdout.split()  # fmt: skip
    assert len(kids) == 1, kids  # the commit process
    committer = int(kids[0])
    path = write(tmp_path, SMALL_JOB)
    os.kill(committer, signal.SIGSTOP)
    try:
        out = run("submit", path, "--timeout", "1", server=daemon.address)
    finally:
        os.kill(committer, signal.SIGCONT)
    assert out.returncode == 1 and "DEADLINE_EXCEEDED" in out.stderr, out.stderr
    said = re.search(r"may have been admitted as '(job-[0-9a-f]+)' before the call", out.stderr)
    assert said, out.stderr
    job_id = said.group(1)
    for _ in range(100):  # committed once the commit process goes on
        shown = run("job", job_id, "--json", server=daemon.address)
        if shown.returncode == 0:
            break
        time.sleep(0.1)
    assert json.loads(shown.stdout)["state"] == "admitted", shown.stdout + shown.stderr
    with_id = write(tmp_path, {**SMALL_JOB, "id": job_id}, "again.json")
    again = run("submit", with_id, server=daemon.address)
    assert again.returncode == 0 and "already decided" in again.stdout, again.stdout
    # --json: the id and the note are keys of the error object
    os.kill(committer, signal.SIGSTOP)
    try:
        out = run("submit", path, "--timeout", "1", "--json", server=daemon.address)
    finally:
        os.kill(committer, signal.SIGCONT)
    error = json.loads(out.stdout)
    assert "error" in error, (out.stdout, out.stderr)
    assert error["error"]["code"] == "DEADLINE_EXCEEDED" and error["id"].startswith("job-")
    assert error["id"] in error["note"]
    # a list's item too (the review): its failed entry says so, and names the id
    many = write(tmp_path, [SMALL_JOB, SMALL_JOB], "many.json")
    os.kill(committer, signal.SIGSTOP)
    try:
        out = run("submit", many, "--timeout", "1", "--json", server=daemon.address)
    finally:
        os.kill(committer, signal.SIGCONT)
    failed = json.loads(out.stdout)["failed"]
    assert failed["item"] == 0 and failed["id"] in failed["note"], failed
    assert "may have been admitted" in failed["note"]


def test_job_json_round_trips_to_the_same_decision(
    tmp_path: Path, daemon: Daemon, epoch: float
) -> None:
    """``job --json`` -> ``quote`` on a daemon in the same state equals the decision."""
    times = SlotTimes(epoch, 3600.0)
    now = cluster_info(daemon.address).current_slot
    due = format_time(times.start(now + 8))
    spec = {**PEOPLE, "id": "rt1", "utility": {"kind": "deadline", "value": 30, "deadline": due}}
    submitted = run("submit", write(tmp_path, spec), "--json", server=daemon.address)
    assert submitted.returncode == 0, submitted.stderr
    record = json.loads(submitted.stdout)
    printed = run("job", "rt1", "--json", server=daemon.address)
    assert json.loads(printed.stdout)["spec"] == spec  # the time shown as given

    # a second daemon with the same clock and cluster holds exactly what the first held
    # before rt1: the same jobs in the same order
    twin_dir = tmp_path / "twin"
    twin = Daemon(
        write_config(tmp_path / "twin.toml", twin_dir, epoch=epoch), tmp_path / "twin.log"
    ).start()
    try:
        before = json.loads(run("jobs", "--json", server=daemon.address).stdout)["jobs"]
        for earlier in before:
            if earlier["id"] != "rt1":
                replayed = run("submit", "-", server=twin.address, stdin=json.dumps(earlier))
                assert replayed.returncode in (0, 3), replayed.stderr
        quoted = run("quote", "-", "--json", server=twin.address, stdin=printed.stdout)
        assert quoted.returncode == 0, quoted.stderr
        assert without_ms(json.loads(quoted.stdout)["decision"]) == without_ms(record["decision"])
    finally:
        assert twin.stop() == 0
    # the same file again is the same job (its time resolves to the same slot)
    retried = run("submit", write(tmp_path, spec), server=daemon.address)
    assert retried.returncode == 0 and "already decided" in retried.stdout


def test_every_problem_is_listed_once_in_plain_words(tmp_path: Path, daemon: Daemon) -> None:
    bad = {
        **PEOPLE,
        "epoch": 2,
        "arrival": 3,
        "chunks": "8",
        "utility": {"kind": "deadline", "value": 50, "deadline": "2030-01-01T00:00"},
    }
    del bad["epochs"]
    path = write(tmp_path, bad)
    out = run("submit", path, server=daemon.address)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "oasis submit: INVALID_ARGUMENT: invalid input:",
        "  job.epoch: unknown key; did you mean 'epochs'?",
        "  job.arrival: is not taken here: a job submitted during slot s arrives at s + 1",
        "  job.epochs: is required",
        "  job.chunks: must be an integer, got the string '8'",
        "  job.utility.deadline: the time '2030-01-01T00:00' has no UTC offset: give one, "
        "as in '2030-01-01T00:00Z' (UTC) or +02:00",
    ]
    js = run("submit", path, "--json", server=daemon.address)
    assert js.returncode == 2 and js.stderr == ""
    error = json.loads(js.stdout)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["field"] == "job.epoch"
    assert [p["field"] for p in error["problems"]] == [
        "job.epoch",
        "job.arrival",
        "job.epochs",
        "job.chunks",
        "job.utility.deadline",
    ]
    assert error["message"].startswith("job.epoch: unknown key; did you mean 'epochs'?; ")
    unreadable = run("submit", write(tmp_path, "{nope"), "--json", server=daemon.address)
    assert unreadable.returncode == 2
    assert json.loads(unreadable.stdout)["error"]["message"].endswith(
        "not JSON: Expecting property name enclosed in double quotes at line 1 column 2 "
        '(a key without quotes: JSON takes "nope", in double quotes)'
    )
    # the specs audit: a comma after the last key was "Expecting property name enclosed
    # in double quotes at line 3 column 1", a line the user had not touched
    trailing = write(tmp_path, '{"epochs": 10,\n "chunks": 8,\n}\n', "trailing.json")
    said = run("submit", trailing, server=daemon.address)
    assert said.returncode == 2 and said.stderr.endswith(
        "not JSON: Expecting property name enclosed in double quotes at line 3 column 1 (a "
        "comma after the last item, at line 2 column 13: JSON allows none there; remove it)\n"
    ), said.stderr


def test_a_list_with_bad_items_submits_none_and_names_each(tmp_path: Path, daemon: Daemon) -> None:
    """Before: the items ahead of the first bad one were submitted, and the list stopped
    there naming that one alone. Every item is now read first as the daemon reads it;
    with any bad, none is sent, and each bad item's problems are named with its index
    (and its id, if the file gives one)."""
    bad_worker = {**PEOPLE["worker"], "bandwidth": 0}
    jobs = [
        {**PEOPLE, "id": "b0"},
        {**PEOPLE, "id": "b1", "epochs": -1, "worker": bad_worker},
        dict(PEOPLE),
        {**PEOPLE, "chunks": "8"},
        {**PEOPLE, "id": "b0", "epochs": 3},  # b0's id, another spec
        # a resource the daemon's cluster lacks (GetClusterInfo names them): before, found
        # at its turn only, the items before it submitted
        {**PEOPLE, "id": "b5", "worker": {**PEOPLE["worker"], "GPU": 1}},
    ]
    out = run("submit", write(tmp_path, jobs), server=daemon.address)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.splitlines() == [
        f"oasis submit: {tmp_path / 'job.json'}: 4 of 6 jobs have bad input; none was submitted:",
        "  item 2 (b1): job.epochs: must be >= 1, got -1",
        "  item 2 (b1): job.worker.bandwidth: must be > 0 (transfer time divides by it)",
        "  item 4: job.chunks: must be an integer, got the string '8'",
        "  item 5 (b0): job.id: also item 1's, whose spec differs (epochs): the daemon would "
        "refuse this one",
        "  item 6 (b5): job.worker.GPU: unknown resource; did you mean 'gpu'? (the cluster "
        "has: gpu, cpu, mem, disk, bandwidth)",
    ]
    listed = json.loads(run("jobs", "--json", server=daemon.address).stdout)["jobs"]
    assert not [j for j in listed if j["id"] in ("b0", "b1")]
    out = run("submit", write(tmp_path, jobs), "--json", server=daemon.address)
    answer = json.loads(out.stdout)
    assert out.returncode == 2 and answer["submitted"] == []
    assert [(p["item"], p["id"], p["field"]) for p in answer["error"]["problems"]] == [
        (1, "b1", "job.epochs"), (1, "b1", "job.worker.bandwidth"), (3, None, "job.chunks"),
        (4, "b0", "job.id"), (5, "b5", "job.worker.GPU"),
    ]  # fmt: skip
    assert answer["error"]["code"] == "INVALID_ARGUMENT"
    # a long list's problems on the terminal: the first 20 and a count, as for a trace
    # (a list of 20,000 bad items printed 20,001 lines); --json lists every one
    many = [{**PEOPLE, "id": f"m{i}", "epochs": 0} for i in range(30)]
    out = run("submit", write(tmp_path, many), server=daemon.address)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 22, out.stderr
    assert lines[-1] == "  ... and 10 more (--json lists every one)"
    out = run("submit", write(tmp_path, many), "--json", server=daemon.address)
    assert len(json.loads(out.stdout)["error"]["problems"]) == 30


def test_a_list_names_the_item_the_daemon_refused(tmp_path: Path, daemon: Daemon) -> None:
    """What only the daemon can find (here a worker larger than any server) still stops
    a list at that item, the ones before it submitted."""
    huge = {**PEOPLE["worker"], "gpu": 99}
    jobs = [{**PEOPLE, "id": "l0"}, {**PEOPLE, "id": "l1", "worker": huge}, {**PEOPLE, "id": "l2"}]
    out = run("submit", write(tmp_path, jobs), server=daemon.address)
    assert out.returncode == 2
    assert out.stdout.startswith("l0: admitted")
    assert "item 2 (l1) failed; the one before it was submitted, the rest were not" in out.stderr
    assert "job.worker: one worker fits on no worker server" in out.stderr


def test_a_list_stopped_at_an_item_warns_that_jobs_without_ids_would_go_twice(
    tmp_path: Path, daemon: Daemon
) -> None:
    """A list of jobs without ids, stopped by the daemon at item 3: the two before it
    were admitted under ids the client made, and the line said only "the 2 before it
    were submitted". The user mends item 3 and runs the file again, and those two are
    admitted a second time under new ids, holding capacity twice. The line now names
    them and says so; an item with its own id would be answered as a retry."""
    huge = {**PEOPLE["worker"], "gpu": 99}
    jobs = [dict(PEOPLE), {**PEOPLE, "id": "own-1"}, {**PEOPLE, "worker": huge}]
    out = run("submit", write(tmp_path, jobs), server=daemon.address)
    assert out.returncode == 2, out.stderr
    made = out.stdout.splitlines()[0].split(":", 1)[0]
    assert made.startswith("job-"), out.stdout
    said = [line for line in out.stderr.splitlines() if "failed; the 2 before it" in line]
    assert len(said) == 1, out.stderr
    assert said[0].endswith(
        f'; 1 of the jobs submitted has no "id" in the file ({made}): run as it is again, '
        "the file would submit it again as a new job; give it that id, or take it out"
    ), said[0]
    ids = [dict(PEOPLE, id="own-2"), {**PEOPLE, "worker": huge}]  # every id given: no word
    out = run("submit", write(tmp_path, ids, "ids.json"), server=daemon.address)
    assert out.returncode == 2 and "run as it is again" not in out.stderr, out.stderr


def test_a_list_with_json_keeps_the_decisions_taken_before_an_item_failed(
    tmp_path: Path, daemon: Daemon
) -> None:
    """Before: with --json, stdout held only the error: the items decided before the
    failing one (with ids the daemon made) were printed nowhere, so a script took it
    that nothing was submitted, and a retry submitted them again under new ids."""
    huge = {**PEOPLE["worker"], "gpu": 99}
    jobs = [dict(PEOPLE), {**PEOPLE, "worker": huge}, dict(PEOPLE)]  # no ids
    out = run("submit", write(tmp_path, jobs), "--json", server=daemon.address)
    assert out.returncode == 2, out.stderr
    answer = json.loads(out.stdout)
    assert answer["error"]["field"] == "job.worker"
    assert answer["failed"]["item"] == 1 and answer["failed"]["not_sent"] == 1
    [first] = answer["submitted"]
    assert first["id"] and first["decision"]["admitted"]
    assert answer["failed"]["id"] != first["id"]  # the client named every item
    again = json.loads(run("job", first["id"], "--json", server=daemon.address).stdout)
    assert again["id"] == first["id"]


def test_a_deadline_too_close_says_by_how_much(tmp_path: Path, daemon: Daemon) -> None:
    spec = {
        **PEOPLE,
        "minibatch_seconds": 360,
        "utility": {"kind": "deadline", "value": 5, "deadline": "1h"},
    }
    out = run("submit", write(tmp_path, spec), server=daemon.address)
    assert out.returncode == 2
    assert (
        "job.utility.deadline: leaves 1 slot (1h) after the job's arrival, but it needs "
        "at least 11 slots (11h) even on an empty cluster" in out.stderr
    )
    # an hour of compute and 16 us of gradient transfer: two slots, and the message
    # says why (before, only "needs at least 2 slots (2h)")
    due = {"kind": "deadline", "value": 5, "deadline": "1h"}
    hour = {**PEOPLE, "epochs": 1, "chunks": 1, "minibatches": 1, "minibatch_seconds": 3600,
            "grad_mb": 0.001, "utility": due}  # fmt: skip
    out = run("quote", write(tmp_path, hour), server=daemon.address)
    assert out.returncode == 2
    assert "needs at least 2 slots (2h) even on an empty cluster" in out.stderr
    assert "job.work: 1 x 1 x 1 mini-batches of 3600.00002 s (3600 s compute + 1.6e-05 s " \
           "gradient transfer) = 1.000000004 worker-slots, rounded up to 2" in out.stderr, \
           out.stderr  # fmt: skip


def test_exit_codes_admitted_rejected_bad_input_other(tmp_path: Path, daemon: Daemon) -> None:
    admitted = run("submit", write(tmp_path, {**PEOPLE, "id": "x0"}), server=daemon.address)
    assert admitted.returncode == 0
    worthless = {
        **PEOPLE,
        "id": "x3",
        "utility": {"kind": "deadline", "value": 1e-6, "deadline": "6h"},
    }
    rejected = run("submit", write(tmp_path, worthless), "--json", server=daemon.address)
    assert rejected.returncode == 3, rejected.stderr
    assert json.loads(rejected.stdout)["state"] == "rejected"
    # the daemon's log line says why (the observability audit: an operator had to ask)
    reason = json.loads(rejected.stdout)["decision"]["reason"]
    time.sleep(0.5)  # the log's writer thread
    lines = [e for e in json_log(daemon.log_path) if e.get("event") == "decided"]
    assert [e["reason"] for e in lines if e["job"] == "x3"] == [reason[:300]] and reason
    assert all("reason" not in e for e in lines if e["admitted"])
    assert run("quote", write(tmp_path, worthless), server=daemon.address).returncode == 3
    bad = run("submit", write(tmp_path, {**PEOPLE, "epochs": 0}), server=daemon.address)
    assert bad.returncode == 2 and "job.epochs: must be >= 1, got 0" in bad.stderr
    missing = run("job", "nope", "--json", server=daemon.address)
    assert missing.returncode == 1
    assert json.loads(missing.stdout) == {
        "error": {"code": "NOT_FOUND", "message": "no job 'nope'", "field": "", "problems": []}
    }


def test_a_wait_given_to_a_job_decided_already_is_said_to_change_nothing(
    tmp_path: Path, daemon: Daemon
) -> None:
    """A job rejected, then submitted again under its id with ``--wait 2h`` as the README
    suggests, got its first rejection back ("already decided: this is the first
    decision", exit 3), the wait dropped without a word: it read as a wait that did not
    help. The line now says that a wait queues a new submission only."""
    worthless = {**PEOPLE, "id": "x4", "utility": {"kind": "deadline", "value": 1e-6,
                                                   "deadline": "6h"}}  # fmt: skip
    path = write(tmp_path, worthless)
    assert run("submit", path, server=daemon.address).returncode == 3
    again = run("submit", path, "--wait", "2h", server=daemon.address)
    assert again.returncode == 3, again.stderr
    first = again.stdout.splitlines()[0]
    assert first.startswith("x4: rejected: ") and "already decided" in first, again.stdout
    assert first.endswith(
        "--wait applies to a new submission only: give the job another id to queue it)"
    ), first
    plain = run("submit", path, server=daemon.address)  # no --wait: nothing to say of it
    assert plain.stdout.splitlines()[0].endswith("(already decided: this is the first decision)")


def test_a_retry_of_a_job_cancelled_since_does_not_exit_as_admitted(
    tmp_path: Path, daemon: Daemon
) -> None:
    """The specs audit: a job cancelled, then its file submitted again (a script's retry,
    or a user starting it over) got the cancelled job back as a duplicate with exit 0,
    the status of an admitted job: `oasis submit job.json && wait_for_it` waited on a
    job that would never run. It now exits 1 and says the id is not decided again; a
    quote's status is the one its submission would get."""
    path = write(tmp_path, {**PEOPLE, "id": "c9"})
    assert run("submit", path, server=daemon.address).returncode == 0
    assert run("cancel", "c9", server=daemon.address).returncode == 0
    again = run("submit", path, server=daemon.address)
    assert again.returncode == 1, again.stdout + again.stderr
    first = again.stdout.splitlines()[0]
    assert first.startswith("c9: cancelled (never ran); it had been admitted with"), first
    assert first.endswith(
        "(already decided: this is the first decision, cancelled since; this id names that "
        "job and is not decided again: give the job another id to submit it anew)"
    ), first
    record = run("submit", path, "--json", server=daemon.address)
    assert record.returncode == 1
    shown = json.loads(record.stdout)
    assert (shown["state"], shown["duplicate"]) == ("cancelled", True)
    quoted = run("quote", path, server=daemon.address)
    assert quoted.returncode == 1 and "c9: cancelled (never ran)" in quoted.stdout


def test_job_shows_the_utility_its_spec_asked_for_in_local_time(
    tmp_path: Path, daemon: Daemon, epoch: float
) -> None:
    """The specs audit: `oasis job ID` showed the plan but not what the spec asked for;
    a deadline given as 13:30+02:00 and held to its slot's start (11:00 UTC with hour
    slots) showed only in `--json`, in UTC. It now says the utility with its times local,
    as the table's, and a duration with the time it ends."""
    times = SlotTimes(epoch, 3600.0)
    arrival = cluster_info(daemon.address).current_slot + 1
    due = datetime.fromtimestamp(times.start(arrival + 8) + 1800, timezone(timedelta(hours=2)))
    spec = {**PEOPLE, "id": "u7", "utility": {**PEOPLE["utility"], "deadline": due.isoformat()}}
    assert run("submit", write(tmp_path, spec), server=daemon.address).returncode == 0
    shown = run("job", "u7", server=daemon.address).stdout.splitlines()[-1]
    start = times.start(arrival + 8)
    assert shown == f"utility: 50 if done by {local_time(start)}, then halving every 1h", shown
    spec = {**PEOPLE, "id": "u8"}  # "deadline": "6h"
    assert run("submit", write(tmp_path, spec), server=daemon.address).returncode == 0
    shown = run("job", "u8", server=daemon.address).stdout.splitlines()[-1]
    after = local_time(times.start(arrival + 6))
    assert shown == f"utility: 50 if done by {after} (6h after its arrival), then halving every 1h"


def test_quote_reads_as_a_quote(tmp_path: Path, daemon: Daemon) -> None:
    out = run("quote", write(tmp_path, {**PEOPLE, "id": "q1"}), server=daemon.address)
    assert out.returncode == 0
    assert out.stdout.startswith("quote for q1: would be admitted, arrives in slot ")
    assert "(quote)" not in out.stdout and out.stdout.rstrip().endswith("(nothing committed)")
    anonymous = run("quote", write(tmp_path, PEOPLE), server=daemon.address)
    assert anonymous.stdout.startswith("quote: would be admitted")
    # the specs audit: its help offered "a list of them", then refused one in 4 words
    assert "a list of them" not in run("quote", "--help", server=daemon.address).stdout
    listed = run("quote", write(tmp_path, [PEOPLE, PEOPLE], "two.json"), server=daemon.address)
    assert listed.returncode == 2 and listed.stderr.endswith(
        "two.json: a list of 2 jobs; quote takes one (give each its own file, or - with one "
        "job on standard input)\n"
    ), listed.stderr


def test_an_empty_job_list_says_so(daemon: Daemon) -> None:
    """Before: the table's header and rule, with nothing under them."""
    out = run("jobs", "--state", "expired", "--state", "failed", server=daemon.address).stdout
    assert out == "no jobs in state expired or failed\n"
    listed = json.loads(run("jobs", "--state", "expired", "--json", server=daemon.address).stdout)
    assert listed == {"jobs": []}


def test_tables_show_wall_clock_times(tmp_path: Path, daemon: Daemon, epoch: float) -> None:
    info = cluster_info(daemon.address)
    assert (info.slot_seconds, info.epoch, info.window) == (3600.0, epoch, 24)
    assert abs(info.now - time.time()) < 60
    run("submit", write(tmp_path, {**PEOPLE, "id": "t1"}), server=daemon.address)
    times = SlotTimes(info.epoch, info.slot_seconds)
    arrival = info.current_slot + 1
    begins = local_time(times.start(arrival))
    jobs = run("jobs", server=daemon.address).stdout
    row = next(line for line in jobs.splitlines() if line.startswith("t1 "))
    assert f"{arrival} ({begins})" in row
    assert "a slot is 1h" in jobs
    job = run("job", "t1", server=daemon.address).stdout
    assert f"arrives in slot {arrival} ({begins})" in job and "begins" in job
    status = run("status", server=daemon.address).stdout
    assert f"slot {info.current_slot} (" in status and "run from" in status
    record = json.loads(run("job", "t1", "--json", server=daemon.address).stdout)
    assert record["decision"]["arrives_at"] == format_time(times.start(arrival))
    # "completes (done by)": the completion slot and when it ends, the next one's start
    # (the client audit's R08: the slot's own start passed every test)
    done = record["decision"]["completion_slot"]
    assert f"{done} ({local_time(times.start(done + 1))})" in row, row


def test_watch_json_detail_is_json(tmp_path: Path, daemon: Daemon) -> None:
    run("submit", write(tmp_path, {**PEOPLE, "id": "w1"}), server=daemon.address)
    cmd = [
        sys.executable,
        "-m",
        "controller.cli",
        "watch",
        "--from",
        "0",
        "--json",
        "--server",
        daemon.address,
    ]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) as watch:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        watch.kill()
    assert first["kind"] == "decided" and isinstance(first["sequence"], int)
    assert first["state"] in ("admitted", "rejected")
    assert isinstance(first["detail"], dict) and "admitted" in first["detail"]
    # when its slot begins, as every other record says it (the client audit's R09)
    info = cluster_info(daemon.address)
    begins = SlotTimes(info.epoch, info.slot_seconds).start(first["slot"])
    assert first["slot_starts_at"] == format_time(begins), first
    # for people, the detail's numbers to 6 digits, as other commands print them (the
    # README audit: "payoff": 6.927184195498584); --json keeps every digit
    cmd.remove("--json")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT) as watch:  # fmt: skip
        assert watch.stdout is not None
        line = watch.stdout.readline()
        # SIGTERM (a unit's stop, `timeout`) is said and exits 143, as for every other
        # command; watch read it as Ctrl-C: 130, no word
        watch.terminate()
        _, err = watch.communicate(timeout=30)
    assert (watch.returncode, err.strip()) == (143, "oasis watch: terminated")
    shown = json.loads(line[line.index("{") :])
    payoff = first["detail"]["payoff"]
    assert shown["payoff"] == float(f"{payoff:.6g}"), (line, payoff)
    assert line.startswith(f"#{first['sequence']} slot ")


def test_prices_take_the_node_flag(daemon: Daemon) -> None:
    for flag in ("--node", "--server-name"):  # the old name still works
        out = run("prices", "--json", flag, "w1", server=daemon.address)
        rows = json.loads(out.stdout)["prices"]
        assert rows and {r["server"] for r in rows} == {"w1"}
        assert all(r["kind"] == "worker" for r in rows)
        assert isinstance(json.loads(out.stdout)["first_slot"], int)


def test_prices_from_is_a_slot_of_the_window(daemon: Daemon) -> None:
    """Before: ``--from`` said "(0: now)" but takes a slot number; one past the window
    printed an empty table (exit 0), one before it the current slot's prices."""
    help_ = " ".join(run("prices", "--help", server=daemon.address).stdout.split())
    assert "(0: now)" not in help_ and "a slot number as the columns are headed" in help_
    now = cluster_info(daemon.address).current_slot
    shown = json.loads(
        run("prices", "--json", "--from", str(now + 2), server=daemon.address).stdout
    )
    assert shown["first_slot"] == now + 2
    window = f"outside the window, slots {now}..{now + 24}"
    out = run("prices", "--from", str(now + 10_000), server=daemon.address)
    assert out.returncode == 2 and f"--from: slot {now + 10_000} is {window}" in out.stderr
    out = run("prices", "--from", str(now + 10_000), "--json", server=daemon.address)
    error = json.loads(out.stdout)["error"]
    assert out.returncode == 2 and error["field"] == "--from" and window in error["message"]


def test_options_are_named_in_the_daemons_errors(tmp_path: Path, daemon: Daemon) -> None:
    """Before: ``submit --wait 1000d`` said ``wait_seconds: ...``, the request's field."""
    path = write(tmp_path, {**PEOPLE, "id": "w1"})
    out = run("submit", path, "--wait", "1000d", server=daemon.address)
    assert out.returncode == 2 and "  --wait: 1000d (8.64e+07 s) exceeds" in out.stderr
    out = run("submit", path, "--wait", "1000d", "--json", server=daemon.address)
    assert json.loads(out.stdout)["error"]["message"].startswith("--wait: 1000d")


def test_a_quote_of_a_stored_id_says_what_a_submission_gets(tmp_path: Path, daemon: Daemon) -> None:
    """Before: quote said 'would be admitted' for an id submit then refused, or for
    which submit returned the first decision."""
    path = write(tmp_path, {**PEOPLE, "id": "qx"})
    assert run("submit", path, server=daemon.address).returncode == 0
    same = run("quote", write(tmp_path, {**PEOPLE, "id": "qx", "epochs": 2.0}, "same.json"),
               server=daemon.address)  # fmt: skip
    assert same.returncode == 0, same.stderr
    assert "but qx exists already with this spec: a submission returns its first " \
           "decision, not this quote:\nqx: admitted, arrives in slot" in same.stdout  # fmt: skip
    record = json.loads(run("quote", path, "--json", server=daemon.address).stdout)
    assert record["existing"]["id"] == "qx" and record["decision"]["admitted"]
    fresh = json.loads(
        run("quote", write(tmp_path, PEOPLE), "--json", server=daemon.address).stdout
    )
    assert fresh["existing"] is None
    other = write(tmp_path, {**PEOPLE, "id": "qx", "epochs": 3}, "other.json")
    quoted = run("quote", other, server=daemon.address)
    submitted = run("submit", other, server=daemon.address)
    assert quoted.returncode == submitted.returncode == 1
    message = "ALREADY_EXISTS: job 'qx' exists with another spec (epochs: stored 2, sent 3)"
    assert message in quoted.stderr and message in submitted.stderr
    assert quoted.stderr.replace("quote", "submit") == submitted.stderr


def test_agent_names_its_node_with_node() -> None:
    out = oasis("agent", "--server", "w0", check=False)
    assert out.returncode == 2
    assert (
        "--server now names the daemon's address in every command; the node flag of the "
        "agent is --node: oasis agent --node w0" in out.stderr
    )
    assert "--node NAME" in oasis("agent", "--help").stdout


def test_tls_against_a_plaintext_daemon_says_it_may_serve_plaintext(
    tmp_path: Path, daemon: Daemon
) -> None:
    """The README audit: ``--tls`` to a daemon without ``[tls]`` was told to check the
    certificate and ``--tls-ca`` alone. ``--tls-ca`` alone is TLS too (the mutation
    audit: told so for ``--tls`` only, it read "then give --tls-ca FILE or --tls")."""
    from tests.test_security import make_pki

    ca = str(make_pki(tmp_path).ca)
    for flags in (["--tls"], ["--tls-ca", ca]):
        out = oasis("status", *flags, "--timeout", "5", server=daemon.address, check=False)
        assert out.returncode == 1
        assert "the TLS handshake failed" in out.stderr
        assert "(one without [tls] serves plaintext: call it without --tls)" in out.stderr
        assert "then give --tls-ca" not in out.stderr


def test_a_daemon_that_takes_the_connection_but_never_answers_is_said_to_be_hung() -> None:
    """The HA keepalive audit: given two nodes whose processes were stopped (SIGSTOP;
    here, sockets that listen and never answer: the kernel takes the connection all the
    same), `oasis jobs` said `cannot reach the daemon at ...: failed to connect to all
    addresses; last error: UNKNOWN: ...: connection attempt timed out before receiving
    SETTINGS frame`, and to check the address and TLS, neither of which was wrong."""
    silent = []
    try:
        for _ in range(2):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
            silent.append(sock)
        both = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in silent)
        out = oasis("jobs", "--timeout", "6", server=both, check=False)
    finally:
        for sock in silent:
            sock.close()
    assert out.returncode == 1
    assert "it took the connection but did not answer (the process stopped or hung" in out.stderr
    assert "--tls-ca" not in out.stderr, out.stderr
    # one that stops answering during a call (a keepalive ping unanswered) says so too:
    # it read "Stream removed (ping timeout)" and no more
    from controller.commands.connection import _explain

    args = argparse.Namespace(server=both, timeout=6.0, tls=False, tls_ca="")
    said = _explain(grpc.StatusCode.UNAVAILABLE, "Stream removed (ping timeout)", args)
    assert "it took the connection but did not answer" in said


def test_an_unreachable_daemon_says_what_to_check() -> None:
    address = f"127.0.0.1:{free_port()}"
    out = oasis("jobs", "--timeout", "5", server=address, check=False)
    assert out.returncode == 1
    assert (
        f"oasis jobs: UNAVAILABLE: cannot reach the daemon at {address}: connection "
        "refused: nothing listens there. Check that oasisd runs there" in out.stderr
    )
    assert "--server or $OASIS_SERVER" in out.stderr and "--tls-ca" in out.stderr
    as_json = oasis("status", "--json", "--timeout", "5", server=address, check=False)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["error"]["code"] == "UNAVAILABLE"

    # an HTTP server there (the console's port, say): said in words, not cut mid-word
    http = subprocess.Popen([sys.executable, "-m", "http.server", address.rsplit(":", 1)[1],
                             "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", int(address.rsplit(":", 1)[1])))
                break
            time.sleep(0.05)
        out = oasis("jobs", "--timeout", "5", server=address, check=False)
        assert out.returncode == 1 and (
            "something other than gRPC answered there (the console's port?)" in out.stderr
        ), out.stderr
    finally:
        http.terminate()
        http.wait(10)


def test_no_port_means_50051() -> None:
    """``--server HOST`` reaches HOST:50051 (the message names the address it tried)."""
    out = oasis("jobs", "--timeout", "3", server="127.0.0.2", check=False)
    assert out.returncode == 1 and "127.0.0.2:50051" in out.stderr


def test_issue_12_inputs_are_invalid_argument(tmp_path: Path, daemon: Daemon) -> None:
    for changes, message in [
        ({"worker": {**PEOPLE["worker"], "gpu": 5e-324}}, "job.worker.gpu: must be 0 or at"),
        (
            {"utility": {"kind": "sigmoid", "priority": 1, "decay": 1, "target": -1e308}},
            "job.utility.target: must be at most 2**53 slots away",
        ),
    ]:
        out = run("submit", write(tmp_path, {**PEOPLE, **changes}), server=daemon.address)
        assert out.returncode == 2 and message in out.stderr, out.stderr

    with grpc.insecure_channel(daemon.address) as channel:
        raw = channel.unary_unary("/oasis.v1.Admission/SubmitJob")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff\x0f", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed request" in (err.value.details() or "")
        watch = channel.unary_stream("/oasis.v1.Admission/WatchEvents")
        with pytest.raises(grpc.RpcError) as err:
            next(iter(watch(b"\x08", timeout=10)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # 3,000 unknown resources (a spec under limits.max_spec_bytes): a bounded message
        # (gRPC clients refuse trailers over 8 KiB), and the first fields as details
        stub = pb_grpc.AdmissionStub(channel)
        many = {**PEOPLE, "worker": {f"r{i}": 1 for i in range(3_000)}}
        call = stub.SubmitJob.with_call
        with pytest.raises(grpc.RpcError) as err:
            call(pb.SubmitJobRequest(job=pb.JobSpec(json=json.dumps(many))), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.value.details() or "") < 2_000
        status = rpc_status.from_call(err.value)
        assert status is not None
        bad = error_details_pb2.BadRequest()
        status.details[0].Unpack(bad)
        shown = len(bad.field_violations) - 1
        assert shown >= 10 and bad.field_violations[0].field == "job.worker.r0"
        assert bad.field_violations[-1].description == f"and {3_000 - shown} more problems"
        # 40,000: refused for its size before anything parses it
        huge = {**PEOPLE, "worker": {f"r{i}": 1 for i in range(40_000)}}
        with pytest.raises(grpc.RpcError) as err:
            call(pb.SubmitJobRequest(job=pb.JobSpec(json=json.dumps(huge))), timeout=30)
        assert "exceeds 4 x limits.max_spec_bytes" in (err.value.details() or "")  # as sent


def test_reflection_v1_and_v1alpha(daemon: Daemon) -> None:
    request = reflection_pb2.ServerReflectionRequest
    response = reflection_pb2.ServerReflectionResponse
    with grpc.insecure_channel(daemon.address) as channel:
        for version in ("v1", "v1alpha"):
            call = channel.stream_stream(
                f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            )
            asked = [
                request(list_services=""),
                request(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
                request(file_containing_symbol="oasis.v1.Cluster"),
            ]
            listed, v1_file, oasis_file = list(call(iter(asked), timeout=10))
            names = {s.name for s in listed.list_services_response.service}
            assert {
                "oasis.v1.Admission",
                "oasis.v1.Cluster",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= names
            assert v1_file.HasField("file_descriptor_response"), version
            assert oasis_file.HasField("file_descriptor_response"), version


def test_progress_intervals_are_never_negative() -> None:
    """Before any report the estimate is the prior's, whose t interval reaches below 0:
    seconds cannot be negative, so it is cut off there (``oasis progress``)."""
    empty = fit([], [], RuntimePrior(2.0))
    for interval in (empty.minibatch_seconds(0.95), empty.seconds_at(10_000, 0.95)):
        assert 0.0 <= interval.low < interval.mean < interval.high


def test_progress_says_each_servers_failing_workers_and_nothing_without() -> None:
    from controller.commands.progress import render

    quiet = pb.JobProgress(id="j1", minibatches_total=10)
    assert "failing" not in render(quiet)
    failing = pb.JobProgress(id="j1", minibatches_total=10, worker_failures=[
        pb.WorkerFailures(server="w0", failures=6, last_failure="over its memory demand",
                          seconds_ago=12.4),
        pb.WorkerFailures(server="w1", failures=1, last_failure="exit status 1", seconds_ago=0.2),
    ])  # fmt: skip
    lines = render(failing).splitlines()
    assert lines[-2:] == [
        "  workers failing on w0: 6 times, last: over its memory demand (12s ago)",
        "  workers failing on w1: once, last: exit status 1 (0s ago)",
    ]


def test_addresses_and_arguments_are_checked_by_the_client_and_json_stays_json() -> None:
    """Found by an audit, each before: ``--server :`` became ``:50051:50051`` and port
    99999 read as "nothing listens there"; ``prices --slots -1`` showed the whole
    window; a usage error with --json left stdout empty; ``watch --json`` ended its
    one-event-per-line stream with an indented error."""
    bad = {
        ":": "not HOST[:PORT]",
        "127.0.0.1:99999": "the port must be 1..65535, got 99999",
        "127.0.0.1:0": "the port must be 1..65535, got 0",  # gRPC: "failed to connect"
        # a URL, as the console's is written, was gRPC's "errors resolving
        # http://head:50051: [...] Misformatted domain name" (exit 1, as if unreachable)
        "http://head:50051/": "is a URL; give the daemon's gRPC address as HOST[:PORT]: "
        "head:50051 (the console's http:// address is another port)",
        "https://head:50051": "HOST[:PORT]: head:50051 (TLS: --tls, or --tls-ca FILE)",
        # a list of none (the client audit's N21: without the check the pool of no
        # daemon failed past the argument checks)
        ",": "--server: no address given",
        " , ": "--server: no address given",
    }
    for address, message in bad.items():
        out = run("jobs", server=address)
        assert out.returncode == 2 and message in out.stderr, out.stderr
    # with --json the option the client refused is the error's field, as argparse's are
    # (it was "", the option named only inside the message)
    for argv, field in (
        (["jobs", "--json"], ("127.0.0.1:99999", "--server")),
        (["jobs", "--json", "--token", "a\tb"], ("127.0.0.1:1", "--token")),
        (["jobs", "--json", "--tls-cert", "c.pem"], ("127.0.0.1:1", "")),  # names two
    ):
        out = run(*argv, server=field[0])
        error = json.loads(out.stdout)["error"]
        assert out.returncode == 2 and error["field"] == field[1], error
        if field[1]:
            assert error["problems"][0]["field"] == field[1], error
    out = run("prices", "--slots", "-1", server="127.0.0.1:1")
    assert out.returncode == 2 and "--slots: must be >= 1" in out.stderr, out.stderr
    out = run("submit", "job.json", "--wait", "5x", "--json", server="127.0.0.1:1")
    assert out.returncode == 2
    assert "argument --wait: not a duration" in json.loads(out.stdout)["error"]["message"]
    out = run("watch", "--json", "--timeout", "1", server="127.0.0.1:1")
    assert out.returncode == 1 and len(out.stdout.splitlines()) == 1, out.stdout
    assert json.loads(out.stdout)["error"]["code"] == "UNAVAILABLE"


# the mutation audit's tests of the module's daemon last: they leave jobs in it (admitted,
# then cancelled), which moved the prices the tests above read


def test_a_list_exits_rejected_if_any_of_its_jobs_was(tmp_path: Path, daemon: Daemon) -> None:
    """The mutation audit of the client: a list whose first job was admitted and second
    rejected must not exit 0 (a script reads 0 as every job admitted), with or without
    ``--json``, whichever comes first."""
    worthless = {"kind": "deadline", "value": 1e-6, "deadline": "6h"}
    for n, flags in enumerate(([], ["--json"])):
        worth = {**PEOPLE["utility"], "value": 5000}  # admitted whatever the prices now
        jobs = [{**PEOPLE, "id": f"mix{n}a", "utility": worth},
                {**PEOPLE, "id": f"mix{n}b", "utility": worthless}]  # fmt: skip
        out = run("submit", write(tmp_path, jobs), *flags, server=daemon.address)
        assert out.returncode == 3, out.stdout + out.stderr
        again = run("submit", write(tmp_path, jobs[::-1]), *flags, server=daemon.address)
        assert again.returncode == 3, again.stdout + again.stderr  # retries, either order
    shown = json.loads(run("submit", write(tmp_path, jobs), "--json", server=daemon.address).stdout)
    assert [(j["id"], j["state"], j["duplicate"]) for j in shown] == [
        ("mix1a", "admitted", True), ("mix1b", "rejected", True)]  # fmt: skip
    for job_id in ("mix0a", "mix1a"):  # the module's daemon as it was, for the tests after
        assert run("cancel", job_id, server=daemon.address).returncode == 0


def test_a_list_of_two_is_checked_whole_before_either_is_sent(
    tmp_path: Path, daemon: Daemon
) -> None:
    """The mutation audit: checked only from three items on, a list of two sent its good
    first job (admitted) before the daemon refused the second."""
    jobs = [{**PEOPLE, "id": "two0"}, {**PEOPLE, "id": "two1", "epochs": -1}]
    out = run("submit", write(tmp_path, jobs), server=daemon.address)
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert out.stderr.splitlines() == [
        f"oasis submit: {tmp_path / 'job.json'}: 1 of 2 jobs has bad input; none was submitted:",
        "  item 2 (two1): job.epochs: must be >= 1, got -1",
    ]
    assert run("job", "two0", server=daemon.address).returncode == 1  # NOT_FOUND


def test_cancel_says_what_it_released_in_words_and_in_json(tmp_path: Path, daemon: Daemon) -> None:
    """The mutation audit: ``cancel --json`` lost ``released_worker_slots`` with every
    test passing. A job admitted ahead and cancelled before it ran releases its plan."""
    for job_id, flags in (("cx1", []), ("cx2", ["--json"])):
        worth = {**PEOPLE["utility"], "value": 5000}  # admitted whatever the prices now
        path = write(tmp_path, {**PEOPLE, "id": job_id, "utility": worth})
        planned = json.loads(run("submit", path, "--json", server=daemon.address).stdout)
        released = sum(a.get("workers", 0) for a in planned["decision"]["allocations"])
        assert planned["state"] == "admitted" and released > 0, planned
        out = run("cancel", job_id, *flags, server=daemon.address)
        assert out.returncode == 0, out.stderr
        if flags:
            record = json.loads(out.stdout)
            assert record["released_worker_slots"] == released, record
            assert (record["job"]["id"], record["job"]["state"]) == (job_id, "cancelled")
        else:
            assert out.stdout == f"{job_id}: cancelled; {released} worker-slots released\n"
