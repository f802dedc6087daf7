"""``oasis agent``'s flags at their bounds, pinned where the mutation audit of
controller/commands/agent.py found nothing that would fail. Every command line here
ends in a refusal before the agent holds its server or connects: the flag checked
last (--devices empty, --memory-resource with no --command) shows that the ones
before it, at their bounds, were taken."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.cli import main
from controller.plane.workers import MAX_STOP_GRACE

BASE = ["agent", "--node", "w0", "--broker", "mqtt://127.0.0.1:9"]


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*BASE, *argv]) == 2
    return capsys.readouterr().err


def test_the_agents_bounds_are_taken_and_past_them_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    last = ("--devices", "", "--memory-resource", "mem=GB")  # refused after the rest
    for taken in (["--report-seconds", "0.1"], ["--stop-grace", "0"],
                  ["--stop-grace", f"{MAX_STOP_GRACE:g}"]):  # fmt: skip
        assert "--devices: is empty" in _refusal(capsys, *taken, *last), taken
    for flag, bad in (("--stop-grace", "-1"), ("--stop-grace", f"{MAX_STOP_GRACE + 1:g}"),
                      ("--stop-grace", "nan"), ("--report-seconds", "0.09")):  # fmt: skip
        assert f"{flag}: must be a number" in _refusal(capsys, flag, bad, *last), (flag, bad)


def test_an_agent_with_no_node_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["agent", "--broker", "mqtt://127.0.0.1:9", "--devices", ""]
    assert main(argv) == 2
    assert "--node NAME is required" in capsys.readouterr().err


def test_an_agent_command_of_blanks_and_a_guard_with_no_command_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--command: is empty" in _refusal(capsys, "--command", "  ", "--devices", "")
    # the simulation runs no process to guard; --devices empty is refused before it
    guarded = ("--memory-resource", "mem=GB")
    assert "--memory-resource: needs --command" in _refusal(capsys, *guarded)
    assert "--devices: is empty" in _refusal(capsys, "--devices", "", *guarded)


def test_a_password_file_whose_first_line_is_empty_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rather than log in with no password (refused by the broker, as a retried
    outage) or fall back to $OASIS_MQTT_PASSWORD."""
    from controller.cli import build_parser
    from controller.commands.agent import broker_settings
    from controller.commands.common import InputError

    monkeypatch.setenv("OASIS_MQTT_PASSWORD", "from-env")
    empty = tmp_path / "pw"
    empty.write_text("\nsecond line\n")
    args = build_parser().parse_args(["agent", "--node", "w0", "--mqtt-password-file", str(empty)])
    with pytest.raises(InputError, match=r"--mqtt-password-file: first line of .* is empty"):
        broker_settings(args)
