"""``oasis gen``: seeded, byte-for-byte reproducible SPEC 6 traces; bad flags named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.cli import main
from pricing import trace_from_dict
from pricing.workload import generate_trace

SMALL = ["--jobs", "12", "--worker-servers", "3", "--ps-servers", "2", "--horizon", "15"]


def _gen(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    assert main(["gen", *SMALL, *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_same_seed_same_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    _gen(capsys, "--seed", "7", "-o", str(a))
    _gen(capsys, "--seed", "7", "-o", str(b))
    _gen(capsys, "--seed", "8", "-o", str(c))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.mark.parametrize("slot", ["1800", "30m"])  # a duration too, as --wait takes
def test_stdout_is_the_generator_output(capsys: pytest.CaptureFixture[str], slot: str) -> None:
    out, err = _gen(capsys, "--seed", "3", "--slot-seconds", slot)
    expected = generate_trace(
        np.random.default_rng(3),
        n_jobs=12,
        n_worker_servers=3,
        n_ps_servers=2,
        horizon=15,
        slot_seconds=1800.0,
    )
    assert json.loads(out) == expected
    assert err.strip() == (
        "oasis gen: 12 jobs, 3 worker + 2 PS servers, horizon 15 slots of 1800 s, seed 3, "
        "oracle bounds -> stdout"
    )


@pytest.mark.parametrize("pricing", ["oracle", "estimate"])
def test_output_is_a_valid_trace(pricing: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _gen(capsys, "--pricing", pricing, "--compact")
    assert out.count("\n") == 1
    raw = json.loads(out)
    assert raw["pricing"] == {"bounds": pricing}
    trace = trace_from_dict(raw)
    assert len(trace.jobs) == 12
    assert len(trace.cluster.worker_names) == 3
    assert len(trace.cluster.ps_names) == 2
    assert trace.horizon == 15


def test_mix_selects_the_utility_classes(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _gen(capsys, "--mix", "0,0,1")
    decays = [job["utility"]["decay"] for job in json.loads(out)["jobs"]]
    assert all(4.0 <= d <= 6.0 for d in decays)  # time-critical only
    out, _ = _gen(capsys, "--mix", "1,0,0")
    assert all(job["utility"]["decay"] == 0 for job in json.loads(out)["jobs"])


def test_a_generated_trace_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    _gen(capsys, "-o", str(path))
    assert main(["replay", str(path), "--json", "--no-progress"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert len(doc["jobs"]) == 12


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--mix", "0.5,0.5"], "--mix"),
        (["--mix", "0.5,0.5,0.5"], "--mix"),
        (["--mix", "-0.1,0.6,0.5"], "--mix"),
        (["--mix", "a,b,c"], "--mix"),
        (["--jobs", "-1"], "--jobs"),
        (["--worker-servers", "0"], "--worker-servers"),
        (["--ps-servers", "x"], "--ps-servers"),
        (["--horizon", "0"], "--horizon"),
        (["--slot-seconds", "0"], "--slot-seconds"),
        (["--slot-seconds", "inf"], "--slot-seconds"),
        (["--slot-seconds", "1 hour"], "--slot-seconds: not seconds or a duration: '1 hour'"),
        (["--seed", "-3"], "--seed"),
        (["--pricing", "explicit"], "--pricing"),
        (["--max-share", "0"], "--max-share"),
        (["--max-share", "1.01"], "--max-share"),
        (["--max-share", "x"], "--max-share"),
    ],
)
def test_bad_flag_exits_2_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["gen", *argv])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"argument {named}" in captured.err


def test_slots_too_short_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["gen", "--jobs", "3", "--slot-seconds", "0.01", "--horizon", "2"])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("oasis gen: --slot-seconds / --horizon: ")


def test_unwritable_output_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing-dir" / "t.json"
    assert main(["gen", *SMALL, "-o", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"oasis gen: -o {target}: cannot write: ")
    assert not target.exists()


def test_long_drawing_says_how_far_it_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """10^6 jobs drew for minutes without a word on stderr; now a line every
    PROGRESS_SECONDS (0 here: one per job), none with --no-progress, and the same bytes."""
    from controller.commands import gen

    monkeypatch.setattr(gen, "PROGRESS_SECONDS", 0.0)
    out, err = _gen(capsys)
    drawn = [line for line in err.splitlines() if line.startswith("oasis gen: drew ")]
    assert drawn == [f"oasis gen: drew {i} of 12 jobs" for i in range(1, 13)], err
    quiet, err = _gen(capsys, "--no-progress")
    assert quiet == out and "drew" not in err
