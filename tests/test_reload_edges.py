"""A reload's edges, run in-process against a config file (the mutation audit of the
live reload: each of these was a slip no test caught)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from controller.config import load
from controller.limits import Limits
from controller.reload import MAX_NAMES_CHECKED, Reloader, limit_changes, reread
from controller.reload_status import ReloadStatus
from tests.test_reload import config_file, tokens_file


def test_a_reload_counts_the_jobs_of_at_most_20_removed_tenants(tmp_path: Path) -> None:
    """Each removed tenant's jobs are a store count; a reload removing hundreds counts
    the first :data:`MAX_NAMES_CHECKED` and says how many it left unchecked."""
    tenants = {f"t{i:02d}": ("submitter", f"token-{i}") for i in range(MAX_NAMES_CHECKED + 5)}
    ops = {"ops": ("operator", "token-ops")}
    tokens = tokens_file(tmp_path / "tokens", {**tenants, **ops})
    running = load(config_file(tmp_path, tokens))
    tokens_file(tokens, ops)
    asked: list[list[str]] = []

    async def jobs_left(names: Sequence[str]) -> Mapping[str, Mapping[str, int]]:
        asked.append(list(names))
        return {}

    found = asyncio.run(Reloader(running, [], jobs_left=jobs_left).reload())
    assert found is not None and found.tokens.removed == tuple(sorted(tenants))
    assert asked == [sorted(tenants)[:MAX_NAMES_CHECKED]]


def test_a_storm_of_sighups_is_one_reload_more(tmp_path: Path) -> None:
    """SIGHUPs while a reload waits for its turn start no other: it reads the file after
    them anyway (a storm of signals is not a storm of reads of the tokens file)."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    status = ReloadStatus(None)
    applied: list[object] = []

    async def storm() -> None:
        reloader = Reloader(running, [applied.append], status=status)
        for _ in range(5):
            reloader.hangup()
        await asyncio.sleep(0)  # the signal's reload takes the lock; ours waits behind it
        assert await reloader.reload() is not None

    asyncio.run(storm())
    assert status.now.begun == 2 and len(applied) == 2


def test_keys_written_in_another_order_are_no_edit(tmp_path: Path) -> None:
    """A table's keys moved about (a tidy-up of the file) change no value: the reload
    names nothing as waiting for a restart."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    path = config_file(tmp_path, tokens)
    running = load(path)
    text = path.read_text()
    assert "slot_seconds = 3600\nwindow = 24\n" in text, text
    path.write_text(text.replace("slot_seconds = 3600\nwindow = 24\n",
                                 "window = 24\nslot_seconds = 3600\n"))  # fmt: skip
    found = reread(running, Path(running.source))
    assert found.restart == () and found.keys == (), (found.restart, found.keys)


def test_a_longest_wait_lowered_to_the_running_default_wait_applies_at_once() -> None:
    """``limits.max_wait_seconds`` equal to the running ``daemon.wait_seconds`` refuses
    nothing (the default wait is within it): applied; only below it waits."""
    running = Limits(max_wait_seconds=7200.0)
    limits, changed, restart = limit_changes(running, Limits(max_wait_seconds=3600.0), 3600.0)
    assert limits.max_wait_seconds == 3600 and restart == ()
    assert changed == ("max_wait_seconds: 7200 -> 3600",)
    limits, changed, restart = limit_changes(running, Limits(max_wait_seconds=3599.0), 3600.0)
    assert limits == running and changed == () and restart == ("limits.max_wait_seconds",)
