"""``oasis replay`` end to end: the table, SPEC 6 JSON, and errors on bad traces."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.reference_alg2 import replay_reference
from controller.cli import main
from pricing.baselines import POLICIES
from pricing.workload import generate_trace
from tests.servers import ROOT

DEMO = Path(__file__).resolve().parent.parent / "config" / "demo-trace.json"


def _write(tmp_path: Path, data: Any, name: str = "trace.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def _small_trace(seed: int = 3) -> dict[str, Any]:
    return generate_trace(
        np.random.default_rng(seed), n_jobs=25, n_worker_servers=4, n_ps_servers=4, horizon=30
    )


def test_replay_json_follows_spec_6(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _small_trace()
    assert main(["replay", _write(tmp_path, trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"jobs", "summary"}
    assert [j["id"] for j in out["jobs"]] == [j["id"] for j in trace["jobs"]]
    keys = {"id", "admitted", "payoff", "cost", "jct", "utility", "decision_ms", "allocations"}
    keys.add("reason")  # why a job was rejected (null for an admitted one)
    names = {s["name"]: s["kind"] for s in trace["servers"]}
    total = 0.0
    for job in out["jobs"]:
        assert set(job) == keys
        assert job["decision_ms"] >= 0
        if job["admitted"]:
            assert job["payoff"] > 1e-9
            assert job["payoff"] == pytest.approx(job["utility"] - job["cost"], rel=1e-9)
            assert job["allocations"]
            last = max(a["slot"] for a in job["allocations"] if "workers" in a)
            arrival = next(j["arrival"] for j in trace["jobs"] if j["id"] == job["id"])
            assert job["jct"] == last - arrival + 1
            for a in job["allocations"]:
                kind = "workers" if names[a["server"]] == "worker" else "ps"
                assert set(a) == {"slot", "server", kind} and a[kind] > 0
            total += job["utility"]
        else:
            assert job["cost"] is None and job["jct"] is None and job["utility"] is None
            assert job["allocations"] == []
            assert job["payoff"] is None or job["payoff"] <= 1e-9
    s = out["summary"]
    assert s["admitted"] == sum(j["admitted"] for j in out["jobs"])
    assert s["rejected"] == len(out["jobs"]) - s["admitted"]
    assert s["total_utility"] == pytest.approx(total)
    assert 0 < s["admitted"] < len(out["jobs"])  # the trace is loaded enough to reject some


def test_replay_matches_the_reference_transcription(tmp_path: Path) -> None:
    """Independent replays agree: the optimised engine and the plain Alg. 2."""
    for seed in (11, 12):
        trace = _small_trace(seed)
        proc = subprocess.run(
            [sys.executable, "-m", "controller.cli", "replay", _write(tmp_path, trace), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        ours = json.loads(proc.stdout)["jobs"]
        ref = replay_reference(copy.deepcopy(trace))
        for mine, theirs in zip(ours, ref, strict=True):
            assert mine["admitted"] == theirs["admitted"], mine["id"]
            if theirs["payoff"] is None:
                assert mine["payoff"] is None
            else:
                assert mine["payoff"] == pytest.approx(theirs["payoff"], rel=1e-9, abs=1e-12)
            assert mine["allocations"] == theirs["allocations"], mine["id"]


def test_replay_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(DEMO)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "job", "arrival", "decision", "payoff", "cost", "jct", "utility", "peak_w", "ms",
    ]  # fmt: skip
    assert "admitted" in out and "total utility" in out


def test_replay_table_says_why_a_job_had_no_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that can never finish before the horizon (here a ``tau`` of 5 meant as
    seconds, read as slots) was a bare ``reject`` with payoff ``-`` in the table, like
    one priced out; its reason was in ``--json`` alone."""
    trace = json.loads(DEMO.read_text())
    trace["jobs"][0]["tau"] = 5
    assert main(["replay", _write(tmp_path, trace)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("1 job rejected with no schedule found (payoff -):")
    assert lines[at + 1].startswith("  j1: cannot finish before the horizon even on an empty")
    assert len(lines) == at + 2  # j2 was admitted: not listed


def test_a_job_refused_unsearched_is_not_called_one_without_a_feasible_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay audit: a job refused unsearched (its search over --max-search-steps)
    was listed under "1 job without any feasible schedule (payoff -)", yet it has one:
    `oasis offline` admitted such a job (a million chunks on the demo's two servers made
    a million times larger: optimum 61.55 against the replay's 36.55)."""
    trace = json.loads(DEMO.read_text())
    for server in trace["servers"]:
        server["capacity"] = {r: 1e6 for r in server["capacity"]}
    trace["jobs"][1].update(chunks=1000, epochs=1, minibatches=1, tau=2.0, grad_mb=1)
    assert main(["replay", _write(tmp_path, trace), "--max-search-steps", "1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("1 job rejected with no schedule found (payoff -):")
    assert lines[at + 1].startswith("  j2: not searched: its search would take "), lines
    assert not [line for line in lines if "feasible" in line], lines


def test_replay_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _small_trace(5))
    runs = []
    for _ in range(2):
        assert main(["replay", path, "--json"]) == 0
        jobs = json.loads(capsys.readouterr().out)["jobs"]
        runs.append([{k: v for k, v in j.items() if k != "decision_ms"} for j in jobs])
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t["jobs"][1].update(tau=-1), "jobs[1].tau: must be > 0"),
        (lambda t: t["jobs"][0]["worker"].update(gpux=1), "jobs[0].worker.gpux: unknown resource"),
        (lambda t: t["jobs"][2].update(chunks=2.5), "jobs[2].chunks: must be an integer"),
        (lambda t: t.update(version=2), "version: must be 1"),
        (lambda t: t["servers"][0].update(kind="gpu"), "servers[0].kind: must be 'worker' or 'ps'"),
        (
            lambda t: t["jobs"][3]["utility"].update(decay=-0.5),
            "jobs[3].utility.decay: must be >= 0",
        ),
        (lambda t: t["jobs"][4].update(arrival=0), "jobs[4].arrival: arrivals must not decrease"),
        (  # one arrival too large: the next ones' errors name it (before: them alone)
            lambda t: t["jobs"][2].update(arrival=t["jobs"][2]["arrival"] + 500),
            "jobs[3].arrival: arrivals must not decrease: ",
        ),
        (
            lambda t: t["jobs"][2].update(arrival=t["jobs"][2]["arrival"] + 500),
            "(jobs[2].arrival; is that one too late?)",
        ),
    ],
)
def test_bad_trace_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Any, expected: str
) -> None:
    trace = _small_trace()
    trace["jobs"][4]["arrival"] = max(trace["jobs"][4]["arrival"], 1)
    for j in trace["jobs"][5:]:
        j["arrival"] = max(j["arrival"], trace["jobs"][4]["arrival"])
    mutate(trace)
    assert main(["replay", _write(tmp_path, trace), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert expected in captured.err


def test_every_problem_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _small_trace()
    trace["jobs"][0]["tau"] = 0
    trace["jobs"][5]["grad_mb"] = "big"
    assert main(["replay", _write(tmp_path, trace)]) == 2
    err = capsys.readouterr().err
    assert "jobs[0].tau" in err and "jobs[5].grad_mb: must be a number" in err


def test_a_job_spec_given_as_a_trace_is_named_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``oasis replay job.json`` (``oasis submit``'s input): before, a line "unknown key"
    for each of its fields, or "trace: must be an object" for a list of specs, and no
    word of what a trace is. Both now end with a line saying so."""
    job = _small_trace()["jobs"][0]
    hint = "which oasis submit takes; a trace is an object with version, horizon"
    for data, what in ((job, "a job spec"), ([job, job], "a list of job specs")):
        path = tmp_path / "job.json"
        path.write_text(json.dumps(data))
        assert main(["replay", str(path)]) == 2
        last = capsys.readouterr().err.splitlines()[-1]
        assert (
            last == f"  (this looks like {what}, {hint}, resources, servers, pricing "
            "and jobs: oasis gen writes one)"
        ), last
    assert main(["replay", _write(tmp_path, {**_small_trace(), "horizon": 0})]) == 2
    assert "looks like" not in capsys.readouterr().err  # a trace's mistakes: no such line


def test_a_trace_wrong_throughout_says_twenty_problems_and_counts_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace whose every job has the same mistake: before, a line per job (200,000
    lines for a trace of 10^5 servers named twice)."""
    trace = _small_trace()
    for job in trace["jobs"]:
        job["tau"] = 0
    assert main(["replay", _write(tmp_path, trace)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("invalid trace:") and len(lines) == 22, lines
    assert lines[1].strip().startswith("jobs[0].tau") and lines[20].strip().startswith("jobs[19].")
    assert lines[21] == f"  ... and {len(trace['jobs']) - 20:,} more"


def test_a_trace_with_more_bad_jobs_than_it_lists_counts_every_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the 50 problems a trace keeps, the rest were one problem line, and the
    terminal counted that line: 1,000 bad jobs said "... and 31 more"."""
    trace: dict[str, Any] = generate_trace(
        np.random.default_rng(3), n_jobs=120, n_worker_servers=4, n_ps_servers=4, horizon=30
    )
    for job in trace["jobs"]:
        job["tau"] = -1
    assert main(["replay", _write(tmp_path, trace)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 22 and lines[20].strip().startswith("jobs[19].tau"), lines
    assert lines[21] == "  ... and 100 more"


@pytest.mark.parametrize(
    ("pricing", "expected"),
    [
        ({"bounds": "oracel"}, "pricing.bounds: must be 'oracle' or 'estimate'"),
        ({"bounds": "estimate", "trim": 2}, "pricing.trim: must be in [0, 1)"),
        ({"bounds": "oracle", "eta1": 0.5}, "pricing.eta1"),
    ],
)
def test_a_bad_pricing_is_reported_with_the_jobs_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pricing: Any, expected: str
) -> None:
    """Before, the pricing's problem was the only one named (an audit): README says a
    bad trace names every bad field."""
    trace = {**_small_trace(), "pricing": pricing}
    trace["jobs"][3]["tau"] = -1
    assert main(["replay", _write(tmp_path, trace)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "jobs[3].tau: must be > 0" in err
    del trace["jobs"]  # and with no jobs at all (the session's review)
    assert main(["replay", _write(tmp_path, trace)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "jobs: is required" in err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not JSON"),
        ("[]", "trace: must be an object"),
        ('{"version": true}', "version: must be 1, got True"),
        ('{"version": 1.0}', "version: must be 1, got 1.0"),
    ],
)
def test_unreadable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    assert main(["replay", _write(tmp_path, content)]) == 2
    assert expected in capsys.readouterr().err


def test_a_compressed_trace_is_named_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The replay audit: a week's trace kept gzip-compressed (`oasis replay week.json.gz`)
    was refused as "not UTF-8 text: invalid start byte at byte 1", which does not say why."""
    import gzip

    path = tmp_path / "week.json.gz"
    path.write_bytes(gzip.compress(DEMO.read_bytes()))
    for command in ("replay", "offline"):
        assert main([command, str(path)]) == 2
        assert capsys.readouterr().err == (
            f"oasis {command}: {path}: not UTF-8 text: invalid start byte at byte 1 "
            "(gzip-compressed: decompress it first)\n"
        )


def test_a_byte_order_mark_is_no_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The offline tools' audit: a trace saved with a UTF-8 byte-order mark (as some
    Windows editors write) was refused with "decode using utf-8-sig"."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + DEMO.read_bytes())
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"]


def test_store_copy_refuses_a_store_that_keeps_nothing_before_any_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An in-memory SQLite store (either side) or a SQLite file in a folder that does
    not exist is a bad command line (exit 2), said before either store is opened."""
    source = tmp_path / "oasis.db"
    source.write_bytes(b"")
    for argv, said in (
        (["--from", "sqlite:///:memory:", "--to", str(tmp_path / "new.db")],
         "--from: an in-memory SQLite database holds no daemon's store"),
        (["--from", str(source), "--to", "sqlite:///:memory:"],
         "--to: an in-memory SQLite database keeps nothing; name a file"),
        (["--from", str(source), "--to", f"sqlite:///{tmp_path}/no/such/new.db"],
         "no such folder for the SQLite file"),
    ):  # fmt: skip
        assert main(["store", "copy", *argv, "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert said in err, err
    assert not (tmp_path / "new.db").exists() and source.read_bytes() == b""


@pytest.mark.parametrize("command", ["offline", "calibrate"])
def test_a_trace_and_a_store_together_are_refused_not_one_chosen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Given both a TRACE and --store, neither was to be compared silently."""
    store = tmp_path / "oasis.db"
    store.write_bytes(b"")
    assert main([command, str(DEMO), "--store", str(store)]) == 2
    assert capsys.readouterr().err == f"oasis {command}: give either a TRACE or --store STORE\n"


def test_calibrate_will_not_write_its_prior_over_the_trace_it_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(DEMO.read_bytes())
    assert main(["calibrate", str(path), "-o", str(path)]) == 2
    assert "that is the trace read" in capsys.readouterr().err
    assert path.read_bytes() == DEMO.read_bytes()


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "/nonexistent/trace.json"]) == 2
    assert "cannot read" in capsys.readouterr().err


UNREADABLE = {
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "digits": (
        b'{"version": 1, "horizon": ' + b"9" * 5000 + b"}",
        "cannot be read: an integer of more than 4300 digits",
    ),
    "latin-1": (b'{"epochs": \xff}', "not UTF-8 text"),
}
COMMANDS = {
    "replay": ["replay"],
    "offline": ["offline"],
    "calibrate": ["calibrate"],
    "submit": ["submit", "--server", "127.0.0.1:1"],
    "quote": ["quote", "--server", "127.0.0.1:1"],
    "bounds pin": ["bounds", "pin", "--server", "127.0.0.1:1", "--file"],
}


@pytest.mark.parametrize("content", UNREADABLE, ids=str)
@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_json_file_reader_says_why_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, content: str
) -> None:
    """Each command that reads a JSON file names a file it cannot read, with exit 2 (not
    a RecursionError, ValueError or UnicodeDecodeError traceback), before any connection."""
    data, expected = UNREADABLE[content]
    path = tmp_path / "input.json"
    path.write_bytes(data)
    assert main([*COMMANDS[command], str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "input.json" in err, err


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_json_file_reader_reads_a_device_only_so_far(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The offline tools' audit: ``oasis replay /dev/zero`` (or quote, calibrate...) read
    until the machine ran out of memory (24 GB). A JSON input is read up to
    ``MAX_INPUT_BYTES`` (512 MiB; 1 MiB here), then refused naming the file, exit 2."""
    from controller.commands import common

    monkeypatch.setattr(common, "MAX_INPUT_BYTES", 1 << 20)
    assert main([*COMMANDS[command], "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert "/dev/zero" in err and "the most read" in err, err


def test_a_replay_off_a_terminal_says_how_far_it_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline tools' audit: off a terminal (a log, a CI job) or with --json, a
    replay printed nothing until it ended (150,000 jobs: a minute). It prints a line
    every PROGRESS_SECONDS on stderr; stdout stays the JSON alone; --no-progress: none."""
    from controller.commands import replay as replay_command

    monkeypatch.setattr(replay_command, "PROGRESS_SECONDS", 0.0)
    assert main(["replay", str(DEMO), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["jobs"]
    total = len(json.loads(DEMO.read_text())["jobs"])
    assert err.splitlines()[-1] == f"oasis replay: decided {total:,} of {total:,} jobs", err
    assert main(["replay", str(DEMO), "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("policy", ["dorm", "rrh"])
def test_a_baseline_replay_off_a_terminal_says_how_far_it_is(
    policy: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--policy`` printed nothing on stderr until it ended: Dorm over 2,000 jobs and
    168 slots was silent for 207 s. It says the slot it re-planned at every
    PROGRESS_SECONDS, as the OASiS replay says its jobs; --no-progress: none."""
    from controller.commands import replay as replay_command

    monkeypatch.setattr(replay_command, "PROGRESS_SECONDS", 0.0)
    assert main(["replay", str(DEMO), "--policy", policy, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["jobs"]
    lines = err.splitlines()
    assert lines and all(x.startswith(f"oasis replay: {policy} at slot ") for x in lines), err
    assert lines[-1].endswith(" of 0..19"), err  # the demo's horizon is 20
    assert main(["replay", str(DEMO), "--policy", policy, "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_a_ledger_past_this_machines_memory_is_refused_up_front(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline tools' audit: a 1 KB trace's horizon may ask for a ledger of up to
    16 GiB, which on a smaller machine the kernel killed as the replay filled it, with no
    word. A ledger over MEMORY_SHARE of this machine's memory is refused naming it (a
    share of 10^-9 here stands in for a machine too small for the demo trace)."""
    from controller.commands import common

    assert main(["replay", str(DEMO), "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(common, "MEMORY_SHARE", 1e-9)
    for command in (["replay"], ["offline", "--no-progress"], ["calibrate", "-o", "/dev/null"]):
        assert main([*command, str(DEMO)]) == 2
        err = capsys.readouterr().err
        assert "horizon: 20 slots of 2 servers need a price ledger of" in err, err
        assert "of this machine's" in err and "of memory" in err


def test_a_traces_prior_is_read_within_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace names its prior file, so the path is the trace author's choice: a device
    or pipe is refused, not read without end, and a large file is read only so far."""
    from pricing.bound_prior import MAX_PRIOR_BYTES

    trace = json.loads(DEMO.read_text())
    trace["pricing"] = {"bounds": "estimate", "prior": "/dev/zero"}
    assert main(["replay", _write(tmp_path, trace)]) == 2
    assert "cannot read /dev/zero: not a regular file" in capsys.readouterr().err
    (tmp_path / "big.json").write_bytes(b" " * (MAX_PRIOR_BYTES + 1) + b"{}")
    trace["pricing"]["prior"] = "big.json"
    assert main(["replay", _write(tmp_path, trace)]) == 2
    assert f"larger than {MAX_PRIOR_BYTES} bytes" in capsys.readouterr().err


def test_a_pin_file_with_a_huge_integer_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pins.json"
    path.write_text('{"worker": {"gpu": {"U": ' + "9" * 400 + "}}}")
    assert main(["bounds", "pin", "--server", "127.0.0.1:1", "--file", str(path)]) == 2
    assert "worker.gpu.U: must be finite, got 99999999999999999999...(400 characters)" in (
        capsys.readouterr().err
    )


def test_a_pin_file_lists_every_problem_by_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key other than U and L was reported as 'need "U" and/or "L"' of an object that
    gave both, and an empty object was dropped unsaid (a file of only that was told to
    "give --upper R=X, --lower R=Y or --file", which it had). Nothing is sent: the
    daemon at port 1 is never asked."""
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({
        "workr": {"gpu": {"U": 1}},
        "worker": {"gpu": {"U": 50, "L": 0.01, "X": 1}, "cpu": {}, "mem": {"U": "50"},
                   "disk": {"u": 2}},
        "ps": [1],
    }))  # fmt: skip
    assert main(["bounds", "pin", "--server", "127.0.0.1:1", "--file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oasis bounds: --file {path}: invalid pins:\n"), err
    for line in (
        "  workr: unknown key; did you mean 'worker'?",
        "  worker.gpu.X: unknown key (known: L, U)",
        '  worker.cpu: must be an object with "U" and/or "L", e.g. {"U": 50}',
        "  worker.mem.U: must be a number, got the string '50'",
        "  worker.disk.u: unknown key; did you mean 'U'?",
        '  ps: must be an object of resources, {"gpu": {"U": x}}',
    ):
        assert line in err.splitlines(), (line, err)
    assert main(["bounds", "pin", "--server", "127.0.0.1:1", "--file", str(path), "--json"]) == 2
    problems = json.loads(capsys.readouterr().out)["error"]["problems"]
    assert {p["field"] for p in problems} == {
        "workr", "worker.gpu.X", "worker.cpu", "worker.mem.U", "worker.disk.u", "ps"}  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["pin", "--upper", "gpu=0"], "--upper: 'gpu=0': a bound must be a finite number > 0"),
        (["pin"], "pin: give --upper R=X, --lower R=Y or --file"),
        (["reset", "--file", "pins.json"], "--upper, --lower and --file go with pin"),
        (["pin", "--upper", "gpu=5", "--submitter", "sam"], "--submitter goes with reset"),
        (["reset", "gpu"], "reset: takes no resources (unpin does)"),
        (["show", "gpu"], "show: takes no resources (unpin does)"),
    ],
    ids=str,
)
def test_a_bounds_change_not_asked_as_written_is_refused_before_any_call(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    """An option that goes with another action is refused, naming it, before the daemon
    is asked (at port 1 nobody answers): ``oasis bounds reset gpu`` reset every
    resource's estimate, not gpu's, and ``reset --file PINS`` reset it without pinning;
    a pin of nothing, or of a bound of 0, is named by the flag, not by the RPC."""
    assert main(["bounds", *argv, "--server", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err == f"oasis bounds: {said}\n", err


def test_pins_of_a_file_and_the_options_keep_their_kinds_and_sides(tmp_path: Path) -> None:
    """``--file``'s ``worker``/``ps`` and the options' ``worker.R``, ``ps.R`` or ``R``
    reach the request as that kind and side: a pin of ps cpu's L from the file was not
    to become both kinds' (every server's price)."""
    import argparse

    from controller.commands.bounds import pins_of
    from controller.rpc import oasis_pb2 as pb

    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"worker": {"gpu": {"U": 50}}, "ps": {"cpu": {"L": 0.5}}}))
    args = argparse.Namespace(file=str(path), upper=["ps.cpu=9", "mem=3"], lower=["worker.gpu=2"])
    got = {
        (p.kind, p.resource): (p.HasField("upper") and p.upper, p.HasField("lower") and p.lower)
        for p in pins_of(args)
    }
    assert got == {
        (pb.SERVER_KIND_WORKER, "gpu"): (50.0, 2.0),
        (pb.SERVER_KIND_PS, "cpu"): (9.0, 0.5),
        (pb.SERVER_KIND_UNSPECIFIED, "mem"): (3.0, False),
    }


@pytest.mark.parametrize(
    ("eta", "expected"),
    [
        (5e-324, "pricing.eta1: must be >= 1 (SPEC 4: 1/eta = min(1, ...)), got 4.94066e-324"),
        (0.5, "pricing.eta1: must be >= 1"),
        (1e308, ""),
    ],
)
def test_an_eta_below_1_is_named_and_a_huge_one_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], eta: float, expected: str
) -> None:
    """Before, eta 5e-324 overflowed the prices (NaN costs: "cannot fit" on an empty
    cluster) and 1e308 overflowed 4 * eta (blamed on "a utility of 0"); now the first
    is refused and the second is a floor L far below 1e-308, kept as its log."""
    trace = json.loads(DEMO.read_text())
    trace["pricing"] = {"bounds": "oracle", "eta1": eta, "eta2": 1.0}
    assert main(["replay", _write(tmp_path, trace), "--json"]) == (2 if expected else 0)
    captured = capsys.readouterr()
    if expected:
        assert expected in captured.err
    else:
        assert all(j["admitted"] for j in json.loads(captured.out)["jobs"])


def test_utilities_summing_past_the_largest_float_print_no_infinity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each job's utility is finite, but three of 1.7e308 summed to inf: `replay --json`
    printed a total of `Infinity` and `offline --json` an optimum and a ratio of
    `Infinity`, which no JSON reader takes. Now `offline` refuses such a trace (its
    totals are over every job), `replay` decides it and refuses only to print the total
    (its table says inf). One such job is fine."""
    trace = json.loads(DEMO.read_text())
    utility = {"kind": "sigmoid", "priority": 1.7e308, "decay": 0, "target": 1}
    trace["jobs"] = [{**trace["jobs"][0], "utility": utility}]
    assert main(["replay", _write(tmp_path, trace), "--json"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=pytest.fail)  # no Infinity, no NaN
    trace["jobs"] = [{**trace["jobs"][0], "id": f"j{i}", "utility": utility} for i in range(3)]
    path = _write(tmp_path, trace)
    assert main(["offline", path, "--json"]) == 2
    assert "jobs: the jobs' best utilities f(d_min) sum past the largest number" in (
        capsys.readouterr().err
    )
    for policy in ("oasis", "fifo"):
        assert main(["replay", path, "--json", "--policy", policy]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "a total is past the largest number" in captured.err
        assert main(["replay", path, "--policy", policy]) == 0
        assert "total utility inf" in capsys.readouterr().out


def test_a_trace_without_jobs_replays_with_estimated_bounds_not_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Estimated bounds start from the prior and need no job; SPEC 4's oracle bounds are
    taken over the jobs, so that trace names what to give instead."""
    trace = json.loads(DEMO.read_text())
    trace["jobs"] = []
    trace["pricing"] = {"bounds": "estimate"}
    assert main(["replay", _write(tmp_path, trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == []
    trace["pricing"] = {"bounds": "oracle"}
    assert main(["replay", _write(tmp_path, trace)]) == 2
    assert "oracle price bounds need at least one job" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse: exit 2, the option named
        main(["gen", "--jobs", "0", "-o", str(tmp_path / "none.json")])
    assert refused.value.code == 2 and "--jobs: must be >= 1" in capsys.readouterr().err


def test_careless_arguments_are_refused_before_any_harm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an audit, each before: ``calibrate T -o T`` overwrote the trace with the
    prior; a mistyped ``--store`` path left an empty SQLite file there and said "no such
    table"; ``--timeout inf`` (or 0) failed every call at once, blaming the daemon;
    ``gen --slot-seconds 1e20`` ran for hours."""
    trace = _write(tmp_path, _small_trace())
    before = Path(trace).read_text()
    assert main(["calibrate", trace, "-o", trace]) == 2
    assert "that is the trace read" in capsys.readouterr().err
    assert Path(trace).read_text() == before
    missing = tmp_path / "typo.db"
    for command in (["calibrate"], ["offline", "--no-progress"]):
        assert main([*command, "--store", f"sqlite:///{missing}"]) == 2
        assert "no such file" in capsys.readouterr().err
    assert not missing.exists()
    # the README audit: README's sqlite:///var/lib/oasis/oasis.db names a relative path
    assert main(["calibrate", "--store", "sqlite:///var/lib/oasis/oasis.db"]) == 2
    assert "for /var/lib/oasis/oasis.db write sqlite:////var/lib/oasis/oasis.db" in (
        capsys.readouterr().err
    )
    for bad in ("inf", "0", "-1", "nan", "1e9"):
        with pytest.raises(SystemExit) as refused:
            main(["jobs", "--timeout", bad])
        assert refused.value.code == 2
        assert "--timeout" in capsys.readouterr().err
    out = tmp_path / "gen.json"
    assert main(["gen", "--jobs", "2", "--slot-seconds", "1e20", "-o", str(out)]) == 2
    assert "--slot-seconds: at most 31622400" in capsys.readouterr().err
    assert not out.exists()
    # drawn for minutes into gigabytes, a trace no replay reads (the offline tools' audit)
    huge = [(["--jobs", "100000000"], "--jobs: at most 1,000,000"),
            (["--worker-servers", "1000000"], "need a price ledger of 22.6 GiB")]  # fmt: skip
    for argv, said in huge:
        assert main(["gen", *argv, "-o", str(out)]) == 2
        assert said in capsys.readouterr().err
        assert not out.exists()
    # the agent: nan or inf as its speed reported every planned job done at once, nan
    # as its report interval spun the loop (the MQTT audit); refused before it connects
    for flag, least in (("--speed", "> 0"), ("--report-seconds", ">= 0.1")):
        for bad in ("nan", "inf", "0"):
            argv = ["agent", "--node", "w0", "--broker", "mqtt://127.0.0.1:9", flag, bad]
            assert main(argv) == 2
            assert f"{flag}: must be a number {least}" in capsys.readouterr().err


def _bandwidth_trace(capacity: float, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A trace of one resource, ``bandwidth``: one worker and one PS server of
    ``capacity`` each, over 20 slots."""
    return {
        "version": 1, "horizon": 20, "resources": ["bandwidth"],
        "servers": [{"name": "w", "kind": "worker", "capacity": {"bandwidth": capacity}},
                    {"name": "p", "kind": "ps", "capacity": {"bandwidth": capacity}}],
        "jobs": jobs,
    }  # fmt: skip


def test_replay_rejects_a_job_past_the_search_limit_unsearched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a 350-byte trace (one job of 1e6 chunks with a tiny demand) searched for
    hours in `replay` and `offline`, which held no job to the daemon's search limit."""
    job = {"arrival": 0, "epochs": 1, "minibatches": 10, "tau": 1, "grad_mb": 1e-9,
           "worker": {"bandwidth": 0.001}, "ps": {"bandwidth": 1},
           "utility": {"kind": "sigmoid", "priority": 10, "decay": 0, "target": 1}}  # fmt: skip
    trace = _bandwidth_trace(
        1e6, [{**job, "id": "huge", "chunks": 10**6}, {**job, "id": "small", "chunks": 2}]
    )
    path = _write(tmp_path, trace)
    assert main(["replay", path, "--json", "--max-search-steps", "1e6"]) in (0, 3)
    out = json.loads(capsys.readouterr().out)
    first = out["jobs"][0]
    assert first["id"] == "huge" and not first["admitted"] and first["payoff"] is None
    assert "not searched: its search would take" in first["reason"]
    assert "over max_search_steps = 1e+06" in first["reason"]
    assert [j["id"] for j in out["jobs"]] == ["huge", "small"]
    assert main(["replay", path, "--max-search-steps", "-1"]) == 2
    assert "--max-search-steps: must be a number >= 0" in capsys.readouterr().err


def test_replay_rejects_a_job_past_the_search_memory_limit_unsearched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: one job of 2**26 chunks and a single worker-slot of work (well under the
    step limit) took `replay` 23 s and 6.5 GB for its search's tables; 2**30 chunks took
    the machine's memory. The daemon refuses it by limits.max_search_mb; so does replay."""
    job = {"arrival": 0, "epochs": 1, "minibatches": 1, "tau": 1e-12, "grad_mb": 1e-9,
           "worker": {"bandwidth": 1}, "ps": {"bandwidth": 1},
           "utility": {"kind": "sigmoid", "priority": 10, "decay": 0, "target": 1}}  # fmt: skip
    trace = _bandwidth_trace(
        4, [{**job, "id": "wide", "chunks": 2**26}, {**job, "id": "small", "chunks": 2, "tau": 1}]
    )
    path = _write(tmp_path, trace)
    assert main(["replay", path, "--json"]) in (0, 3)
    out = json.loads(capsys.readouterr().out)
    first = out["jobs"][0]
    assert first["id"] == "wide" and not first["admitted"] and first["payoff"] is None
    assert "its search would need 10240 MiB of tables" in first["reason"]
    assert "over max_search_mb = 512" in first["reason"]
    assert out["jobs"][1]["admitted"]  # the other job is decided as ever
    assert main(["replay", path, "--max-search-mb", "nan"]) == 2
    assert "--max-search-mb: must be a number >= 0" in capsys.readouterr().err


def test_out_of_memory_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a trace whose horizon the ledger's 16 GiB cap lets through, on a machine
    with less memory (here: the ledger's allocation fails), ended in numpy's
    _ArrayMemoryError traceback."""
    from controller.commands import replay as replay_command

    def no_memory(*_args: Any, **_kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(replay_command, "replay", no_memory)
    assert main(["replay", _write(tmp_path, _small_trace())]) == 1
    err = capsys.readouterr().err
    assert err.startswith("oasis replay: out of memory") and "Traceback" not in err


def test_replay_json_under_dorm_is_json_alone(tmp_path: Path) -> None:
    """Dorm's MILP solver (HiGHS) prints its banner on descriptor 1 whatever its options
    say: before, `replay --json --policy dorm` put it ahead of the JSON (a fresh process:
    the banner comes once per process)."""
    out = subprocess.run(
        [sys.executable, "-m", "controller.cli", "replay", str(DEMO), "--json", "--policy", "dorm"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["jobs"]


def test_replay_help_names_every_policy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The --policy help lists each choice it explains: before, rrh-np (README, "Replay a
    trace") was a choice the help's words left out."""
    monkeypatch.setenv("COLUMNS", "1000")  # no line break inside "rrh-np"
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in POLICIES:
        assert f"{name}," in text or f"{name} (" in text, name


def test_offline_help_says_what_the_time_limit_does_not_count(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--time-limit`` said "stop after this long", but the online replay before the
    solve, and the first bound and allocation, run whatever it is: 3,000 jobs on
    100 + 100 servers at --time-limit 60 took 80 s."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["offline", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "seconds for the solve (default: 60); the online replay before it is not counted" in text
    assert "stop after this long" not in text


def test_output_to_a_full_disk_is_one_line_and_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`oasis replay > out.json` on a full disk printed a traceback; `oasis gen -o` left
    a truncated trace, and `calibrate -o` could truncate the prior a config names."""
    import os
    import stat

    from controller.files import write_whole

    with open("/dev/full", "w") as full_disk:
        out = subprocess.run(
            [sys.executable, "-m", "controller.cli", "replay", str(DEMO)],
            stdout=full_disk, stderr=subprocess.PIPE, text=True, check=False,
        )  # fmt: skip
    assert out.returncode == 1 and out.stderr == "oasis replay: No space left on device\n"
    prior = tmp_path / "prior.json"
    prior.write_text('{"the": "prior a config names"}\n')

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_whole(prior, "x" * 100_000)
    assert prior.read_text() == '{"the": "prior a config names"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["prior.json"]  # no temporary left
    monkeypatch.undo()
    assert main(["gen", "--jobs", "3", "-o", str(prior)]) == 0
    assert json.loads(prior.read_text())["jobs"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(prior.stat().st_mode) == 0o666 & ~mask


def test_a_file_written_whole_keeps_its_mode_and_its_link(tmp_path: Path) -> None:
    """`sudo oasis calibrate -o prior.json` under a 077 umask made a prior kept 0640
    root:oasis unreadable to the daemon, and a link to it a plain file."""
    import os
    import stat

    from controller.files import write_whole

    prior = tmp_path / "prior.json"
    prior.write_text("old\n")
    prior.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(prior)
    old = os.umask(0o077)
    try:
        write_whole(link, "new\n")
    finally:
        os.umask(old)
    assert link.is_symlink() and prior.read_text() == "new\n"
    assert stat.S_IMODE(prior.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "prior.json"]


def test_a_new_file_written_whole_gets_the_mode_open_gives_or_is_not_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`oasis calibrate -o prior.json` where no prior is yet: the file is made whole or
    not at all (a full disk leaves nothing, not half a prior), with the mode ``open()``
    gives under the umask (0644 under 022, readable by the daemon), not the temporary's
    0600. The mutation audit: a new file written in place, or left 0600, passed."""
    import os
    import stat

    from controller.files import write_whole

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    prior = tmp_path / "prior.json"
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_whole(prior, "x" * 100_000)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    old = os.umask(0o022)
    try:
        write_whole(prior, "new\n")
    finally:
        os.umask(old)
    assert prior.read_text() == "new\n" and stat.S_IMODE(prior.stat().st_mode) == 0o644


def test_a_token_before_the_command_is_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    """`oasis --token T jobs` named the token as an invalid command, on the terminal."""
    with pytest.raises(SystemExit):
        main(["--token", "s3cret-token-value", "jobs"])
    err = capsys.readouterr().err
    assert "s3cret-token-value" not in err and "--token goes after the command" in err


def test_an_option_before_the_command_is_said_to_go_after_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README audit: `oasis --server HOST jobs` answered only "invalid choice: 'HOST'"
    (and `oasis --json jobs` "unrecognized arguments"), without saying that a command's
    options follow the command."""
    for argv in (["--server", "127.0.0.1:50051", "jobs"], ["--server=h:1", "jobs"]):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert "(--server goes after the command: oasis jobs --server ...;" in err, err
    with pytest.raises(SystemExit):
        main(["--json", "status"])
    out = json.loads(capsys.readouterr().out)
    assert "--json goes after the command: oasis status --json" in out["error"]["message"]
    with pytest.raises(SystemExit):
        main(["--bogus"])  # no command takes it: no such hint
    assert "goes after the command" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "field", "reason"),
    [
        (["gen", "--jobs", "x"], "--jobs", "not an integer: 'x'"),
        (["gen", "-o"], "--output", "expected one argument"),
        (["replay"], "TRACE", "required"),
        (["replay", "t.json", "--bogus", "1"], "--bogus", "not an option or argument"),
    ],
)
def test_a_json_usage_error_names_its_option(
    argv: list[str], field: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error under ``--json`` had ``"field": ""`` and no problems: a script had
    to parse the message for the option it gave wrong."""
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--json"])
    assert stopped.value.code == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["field"] == field, error
    assert [p["field"] for p in error["problems"]] == [field], error
    assert error["problems"][0]["message"].startswith(reason), error


def _interrupted(
    args: list[str],
    after: str,
    tmp_path: Path,
    sig: int = 2,
    env: dict[str, str] | None = None,
    terminal: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``oasis ARGS`` as a subprocess, sent ``sig`` (SIGINT: Ctrl-C) once its stderr says
    ``after``; its output. ``terminal``: its stderr a terminal (a pty), where progress is
    a count updated in place from the first item (else a line every 10 s)."""
    import contextlib
    import os
    import pty
    import threading
    import time

    err_path = tmp_path / "err"
    with open(err_path, "w") as err:
        master, slave = pty.openpty() if terminal else (-1, err.fileno())
        proc = subprocess.Popen([sys.executable, "-m", "controller.cli", *args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=slave, text=True,
                                env=env)  # fmt: skip
        said = bytearray()
        if terminal:
            os.close(slave)

            def drain() -> None:  # a pty's writer blocks once its buffer is full
                with contextlib.suppress(OSError):  # EIO: the child's end closed
                    while chunk := os.read(master, 65536):
                        said.extend(chunk)

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
        deadline = time.monotonic() + 120
        text = (lambda: said.decode(errors="replace")) if terminal else err_path.read_text
        while after not in text():
            assert proc.poll() is None and time.monotonic() < deadline, text()
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        if terminal:
            reader.join(10)
            os.close(master)
    return subprocess.CompletedProcess(args, proc.returncode, out, text())


def test_ctrl_c_says_interrupted_and_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """The CLI audit: Ctrl-C printed a traceback in every command, and during the ILP of
    `oasis offline` said "an allocation ... beats the solver's bound -0: its proof is
    wrong" (HiGHS stops on the signal and keeps it). On a terminal, the replay's count
    updated in place is ended first: "interrupted" was written after it, on its line."""
    trace = tmp_path / "trace.json"
    assert main(["gen", "--jobs", "2000", "--seed", "3", "-o", str(trace)]) == 0
    ilp = tmp_path / "ilp.json"
    assert main(["gen", "--jobs", "40", "--worker-servers", "4", "--ps-servers", "4",
                 "--horizon", "30", "--seed", "7", "-o", str(ilp)]) == 0  # fmt: skip
    for args, after, terminal in (
        (["replay", str(trace)], "decided 1/", True),
        (["offline", str(ilp), "--method", "ilp", "--json"], "solving ILP", False),
    ):
        got = _interrupted(args, after, tmp_path, terminal=terminal)
        assert got.returncode == 130, (args, got.returncode, got.stderr)
        assert "Traceback" not in got.stderr and "proof is wrong" not in got.stderr, got.stderr
        last = got.stderr.rstrip().splitlines()[-1]
        assert last.strip() == f"oasis {args[0]}: interrupted", got.stderr[-300:]


def test_sigterm_ends_a_command_as_ctrl_c_does_with_its_clean_up(tmp_path: Path) -> None:
    """The replay audit: ``timeout 60 oasis offline --solver cbc`` (SIGTERM, as a batch
    scheduler's limit sends) ended with no word and left CBC's model in a
    ``/tmp/oasis-offline-*`` folder. Now SIGTERM ends a command as Ctrl-C does: its
    clean-up runs, a line says so, status 143."""
    import os
    import signal

    ilp = tmp_path / "ilp.json"
    assert main(["gen", "--jobs", "40", "--worker-servers", "4", "--ps-servers", "4",
                 "--horizon", "30", "--seed", "7", "-o", str(ilp)]) == 0  # fmt: skip
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    args = ["offline", str(ilp), "--method", "ilp", "--solver", "cbc", "--json"]
    got = _interrupted(args, "solving ILP", tmp_path, signal.SIGTERM, env)
    assert got.returncode == 143, (got.returncode, got.stderr)
    assert "Traceback" not in got.stderr, got.stderr
    assert got.stderr.rstrip().endswith("oasis offline: terminated"), got.stderr
    assert list(temp.iterdir()) == []  # CBC's model folder removed
    assert got.stdout == ""


def test_version_and_a_closed_stdout(tmp_path: Path) -> None:
    """The CLI audit: neither oasis nor oasisd had --version, and `oasis jobs >&-` (its
    stdout closed) ended in a traceback."""
    for module, name in (("controller.cli", "oasis"), ("controller.daemon", "oasisd")):
        out = subprocess.run([sys.executable, "-m", module, "--version"], cwd=ROOT,
                             capture_output=True, text=True, check=False)  # fmt: skip
        assert out.returncode == 0 and out.stdout.startswith(f"{name} "), out
        assert out.stdout.split()[1][0].isdigit(), out.stdout  # installed: its version
    shell = f"{sys.executable} -m controller.cli jobs --server 127.0.0.1:1 >&-"
    out = subprocess.run(["bash", "-c", shell], cwd=ROOT, capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "cannot reach the daemon" in out.stderr


def test_a_json_error_of_a_local_command_is_json(tmp_path: Path) -> None:
    """The CLI audit: `oasis token NAME --add-to FILE --json` said what was wrong as text
    on standard error; the trace tools keep theirs there (SPEC 6's output alone)."""
    args = ["token", "carol", "--add-to", str(tmp_path / "no" / "tokens"), "--json"]
    out = subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=ROOT,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 2 and out.stderr == "", out
    error = json.loads(out.stdout)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and "--add-to" in error["message"]


def test_ctrl_c_ends_offline_within_seconds_while_the_solver_holds_on(tmp_path: Path) -> None:
    """In the rounding's MIP HiGHS calls back seldom, and Python runs a signal's handler
    only between its own instructions: Ctrl-C took 5-18 s there (up to 0.3 of
    ``--time-limit``; the offline audit). Here a native call that never returns to
    Python stands in for the solve: past the grace the process ends, status 130."""
    import signal
    import time

    code = (
        "import hashlib, sys\n"
        "import controller.commands.offline as o\n"
        "with o._interrupts([]):\n"
        "    print('solving', flush=True)\n"
        "    hashlib.pbkdf2_hmac('sha256', b'x', b'y', 2_000_000_000)  # minutes, no callback\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "solving\n"
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.rstrip().endswith("oasis offline: interrupted"), err
    assert took < 20, took  # the grace (2 s), not the native call's minutes


def test_ctrl_c_wrapped_by_numba_or_during_start_up_is_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay audit: Ctrl-C while a numba-compiled function called back into Python
    came out as ``SystemError: CPUDispatcher(<function _runs ...>) returned a result
    with an exception set`` (caused by the KeyboardInterrupt, through more SystemErrors),
    a traceback and status 1; and Ctrl-C in a command's first seconds (its imports, in
    build_parser) a traceback too. Both stand in here as what they raised."""
    import controller.commands.replay as replay_command
    from controller import cli
    from controller.commands.common import Terminated

    trace = _write(tmp_path, _small_trace())

    def numba_wrapped(stop: type[KeyboardInterrupt]) -> Any:
        def replay(*args: Any, **kwargs: Any) -> Any:
            try:
                try:
                    raise stop
                except KeyboardInterrupt as err:
                    raise SystemError("<function _numba_unpickle> returned a result") from err
            except SystemError as err:
                raise SystemError("CPUDispatcher(<function _runs>) returned a result") from err

        return replay

    for stop, code, word in ((KeyboardInterrupt, 130, "interrupted"), (Terminated, 143,
                                                                        "terminated")):  # fmt: skip
        monkeypatch.setattr(replay_command, "replay", numba_wrapped(stop))
        assert main(["replay", trace]) == code
        assert capsys.readouterr().err == f"oasis replay: {word}\n"

    def unrelated(*args: Any, **kwargs: Any) -> Any:
        raise SystemError("a SystemError of its own")

    monkeypatch.setattr(replay_command, "replay", unrelated)
    with pytest.raises(SystemError, match="of its own"):  # not taken for Ctrl-C
        main(["replay", trace])

    def importing(only: str | None = None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", importing)
    assert main(["offline", trace]) == 130
    assert capsys.readouterr().err == "oasis offline: interrupted\n"


def test_offline_says_how_far_its_online_replay_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay audit: `oasis offline` said "replaying 5000 jobs with the online
    algorithm..." and nothing more for the 35 s that replay took (125,000 jobs: two
    minutes), where `oasis replay` says how far it is every 10 s. Now it says so too,
    every REPLAY_PROGRESS_SECONDS; --no-progress: none."""
    from controller.commands import offline as offline_command

    monkeypatch.setattr(offline_command, "REPLAY_PROGRESS_SECONDS", 0.0)
    assert main(["offline", str(DEMO), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["online"] > 0
    total = len(json.loads(DEMO.read_text())["jobs"])
    said = [line for line in err.splitlines() if line.startswith("replaying: ")]
    assert said[-1] == f"replaying: decided {total:,} of {total:,} jobs", err
    assert main(["offline", str(DEMO), "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_an_ilp_past_this_machines_memory_is_refused_before_it_is_built(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay audit: `oasis offline --method ilp` builds any model up to 2 million
    variables, at 3.7 KB each (673,359 took 2.6 GB, 246,665 took 1.1 GB): about 8 GB at
    the cap, which a smaller head node's kernel kills with no word. Now a model over
    MEMORY_SHARE of this machine's memory is refused up front, naming --method auto (a
    share of 100 KB here stands in for a machine too small for the demo's ILP)."""
    from controller.commands import common
    from controller.commands import offline as offline_command
    from pricing.ledger import ledger_bytes
    from pricing.offline import Held
    from pricing.offline_solve import ilp_size

    trace = common.load_trace(str(DEMO))
    size = ilp_size(trace, Held.nothing(trace))
    assert ledger_bytes(trace.cluster, trace.horizon) < 100_000  # the ledger passes
    assert size * offline_command.ILP_BYTES_PER_VARIABLE > 100_000
    monkeypatch.setattr(common, "MEMORY_SHARE", 100_000 / common.machine_memory())
    assert main(["offline", str(DEMO), "--method", "ilp", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oasis offline: --method ilp: the compact ILP has {size:,} "), err
    assert "of this machine's" in err and "Use --method auto" in err, err
    assert main(["offline", str(DEMO), "--no-progress"]) == 0  # auto: no such model
