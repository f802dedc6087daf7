"""The daemon's log never fails or stalls what is logging (controller/logs.py, the disk
audit): a full disk or a pipe whose reader has gone drops lines, counted, and a pipe
nobody reads holds no decision. Before, the first failed write ended the slot clock's
task for good (jobs never completed, health still SERVING), failed a committed cancel
with UNKNOWN and skipped the drain at SIGTERM; a stalled pipe blocked the commit."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from controller.convert import spec_to_proto
from controller.logs import _Lines
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import ROOT, SMALL_JOB, write_config

QUICK = {"epochs": 1, "chunks": 2, "minibatches": 4, "tau": 0.5, "grad_mb": 0.001}


class _Refusing(io.StringIO):
    """A stream whose writes fail (a full disk) while ``full`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(28, "No space left on device")
        return super().write(text)


def test_lines_that_cannot_be_written_are_counted_and_said_once_writing_works() -> None:
    stream = _Refusing()
    lines = _Lines(stream)
    for i in range(5):
        lines.put(f'{{"event": "e{i}"}}')  # never raises into the caller
    deadline = time.monotonic() + 10
    while lines.dropped < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lines.dropped == 5
    stream.full = False
    lines.put('{"event": "after"}')
    lines.close()
    written = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert written[0]["event"] == "log lines dropped" and written[0]["dropped"] == 5
    assert [w["event"] for w in written[1:]] == ["after"]


def test_a_count_of_dropped_lines_that_cannot_be_written_either_is_kept_whole() -> None:
    """The line saying how many were dropped is not itself counted as one line dropped
    when its write fails too: the count carries on (3 dropped, then 2 more: 5)."""
    stream = _Refusing()
    lines = _Lines(stream)
    try:
        lines._write_lines(['{"event": "a"}', '{"event": "b"}', '{"event": "c"}'])
        assert lines.dropped == 3
        lines._write_lines(['{"event": "d"}', '{"event": "e"}'])  # with the count: fails
        assert lines.dropped == 5
        stream.full = False
        lines._write_lines(['{"event": "f"}'])
    finally:
        lines.close()
    written = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (written[0]["event"], written[0]["dropped"]) == ("log lines dropped", 5)
    assert [w["event"] for w in written[1:]] == ["f"]


def test_a_sync_returns_once_the_lines_before_it_are_written() -> None:
    """oasisd syncs before the line that says it listens: a test (or a script) that
    reads the log then finds the console's address in it (a test found none before)."""

    class Slow(io.StringIO):
        def write(self, text: str) -> int:
            time.sleep(0.05)
            return super().write(text)

    stream = Slow()
    lines = _Lines(stream)
    for i in range(3):
        lines.put(f'{{"event": "e{i}"}}')
    assert lines.sync(5.0)
    assert [json.loads(x)["event"] for x in stream.getvalue().splitlines()] == ["e0", "e1", "e2"]
    lines.close()


def test_a_stalled_stream_holds_nobody_and_drops_past_its_queue() -> None:
    release = threading.Event()
    stalled: list[str] = []  # the text of the write the stream holds

    class Stalled(io.StringIO):
        def write(self, text: str) -> int:
            stalled.append(text)
            release.wait()
            return super().write(text)

    stream = Stalled()
    lines = _Lines(stream, capacity=10)
    started = time.monotonic()
    for i in range(1000):
        lines.put(f'{{"event": "e{i}"}}')
    assert time.monotonic() - started < 5  # a put never waits for the stream
    # the count so far, and any the writer moved into the dropped line of the write it
    # holds (it takes the count as it begins a write: a writer scheduled mid-burst did)
    deadline = time.monotonic() + 10
    while not stalled and time.monotonic() < deadline:  # its write begun (the first line)
        time.sleep(0.01)
    held = [json.loads(line) for text in stalled for line in text.splitlines()]
    moved = sum(h["dropped"] for h in held if h.get("event") == "log lines dropped")
    assert lines.dropped + moved >= 1000 - 10 - 256 - 1  # the queue, and a batch in the writer
    release.set()
    lines.close()
    written = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert written[-1]["event"] == "e999" or any(w["event"] == "log lines dropped" for w in written)


def _start(config: Path, stderr: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if match:
            return proc, match.group(1)
        assert line, "oasisd exited early"
    raise TimeoutError("oasisd did not start")


def _stopped(proc: subprocess.Popen[Any]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(40)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_log_pipe_whose_reader_has_gone_stops_nothing(tmp_path: Path) -> None:
    """`oasisd 2>&1 | head -1`, or journald restarted: every write to stderr fails."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data")
    config.write_text(config.read_text().replace("slot_seconds = 3600", "slot_seconds = 1"))
    read, write = os.pipe()
    proc, address = _start(config, write)
    os.close(write)
    with os.fdopen(read) as reader:
        reader.readline()  # the reader goes away: every later write gets EPIPE
    try:
        with grpc.insecure_channel(address) as channel:
            admission = pb_grpc.AdmissionStub(channel)
            for name in ("runs", "cancelled"):
                spec = {**SMALL_JOB, **QUICK, "id": name}
                job = admission.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=30)
                assert job.job.decision.admitted
            # the cancel is committed and answered (UNKNOWN before: its log line failed)
            admission.CancelJob(pb.CancelJobRequest(id="cancelled"), timeout=30)
            # the slot clock goes on: the job completes (it never did before)
            deadline = time.monotonic() + 30
            state = pb.JOB_STATE_ADMITTED
            while state != pb.JOB_STATE_COMPLETED and time.monotonic() < deadline:
                time.sleep(0.5)
                state = admission.GetJob(pb.GetJobRequest(id="runs"), timeout=30).job.state
            assert state == pb.JOB_STATE_COMPLETED
    finally:
        assert _stopped(proc) == 0  # drained and stopped (exit 1 with a traceback before)


def test_a_log_pipe_nobody_reads_holds_no_decision(tmp_path: Path) -> None:
    """Before: once the pipe's 64 KiB were full, the commit waited in print and the
    238th submission got DEADLINE_EXCEEDED."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data")
    read, write = os.pipe()
    proc, address = _start(config, write)
    os.close(write)
    try:
        with grpc.insecure_channel(address) as channel:
            admission = pb_grpc.AdmissionStub(channel)
            for i in range(400):
                spec = {**SMALL_JOB, "id": f"j{i}"}
                admission.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=10)
    finally:
        code = _stopped(proc)
        os.close(read)
    assert code == 0
