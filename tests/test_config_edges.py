"""Config values at and past their bounds, of the wrong type, or in the wrong unit are
refused naming the key, and the values at a bound are taken (the mutation audit of
config loading: each of these was a slip no test caught)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.config import Config, ConfigError, from_dict, load

CLUSTER: dict[str, Any] = {
    "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
    "servers": [
        {"name": "w0", "kind": "worker",
         "capacity": {"gpu": 4, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 25}},
        {"name": "p0", "kind": "ps",
         "capacity": {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25}},
    ],
}  # fmt: skip


def config(**tables: Any) -> Config:
    """A config of ``tables`` over :data:`CLUSTER`."""
    return from_dict({"cluster": CLUSTER, **tables})


def refused(**tables: Any) -> str:
    """The message a config of ``tables`` is refused with."""
    with pytest.raises(ConfigError) as err:
        config(**tables)
    return str(err.value)


def test_the_store_timeout_is_at_most_an_hour() -> None:
    assert config(daemon={"store_timeout": 3600}).store_timeout == 3600
    assert refused(daemon={"store_timeout": 3600.5}) == (
        "daemon.store_timeout: must be <= 3600 seconds"
    )


def test_a_daemon_value_of_the_wrong_type_is_refused_naming_its_key() -> None:
    assert refused(daemon={"store_url": 5}) == "daemon.store_url: must be a string"
    assert refused(daemon={"allow_insecure_remote": "yes"}) == (
        "daemon.allow_insecure_remote: must be true or false"
    )


def test_the_default_wait_is_at_most_the_longest_wait() -> None:
    at = config(daemon={"wait_seconds": 3600}, limits={"max_wait_seconds": 3600})
    assert at.wait_seconds == 3600
    assert refused(daemon={"wait_seconds": 3600.5}, limits={"max_wait_seconds": 3600}) == (
        "daemon.wait_seconds: 3600.5 exceeds limits.max_wait_seconds = 3600"
    )


def test_a_cap_of_a_former_tenant_without_auth_is_still_an_error() -> None:
    """``former`` (a reload's running tenants) makes a left-behind cap a warning only
    when [auth] is there: without it the cap names no one, whatever ran before."""
    data = {"cluster": CLUSTER, "limits": {"max_utility_by_submitter": {"alice": 10}}}
    with pytest.raises(ConfigError) as err:
        from_dict(data, former={"alice"})
    assert str(err.value) == (
        "limits.max_utility_by_submitter.alice: names no submitter of [auth]'s tokens "
        "file (there is no [auth])"
    )


def test_slot_0_comes_from_the_store_only_when_the_file_gives_no_epoch() -> None:
    assert config().epoch_from_store
    given = config(daemon={"epoch": 1_700_000_000})
    assert not given.epoch_from_store and given.epoch == 1_700_000_000


def test_two_problems_of_a_file_are_both_said(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(
        '[daemon]\nstore_timeout = 4000\nlog_level = "loud"\n'
        '[cluster]\nresources = ["gpu", "cpu", "mem", "disk", "bandwidth"]\n'
        'servers = [{name = "w0", kind = "worker", capacity = '
        "{gpu = 4, cpu = 32, mem = 244, disk = 250, bandwidth = 25}},\n"
        '  {name = "p0", kind = "ps", capacity = '
        "{cpu = 36, mem = 60, disk = 500, bandwidth = 25}}]\n"
    )
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).splitlines() == [
        "daemon.log_level: must be one of ['debug', 'error', 'info', 'warning']",
        "daemon.store_timeout: must be <= 3600 seconds",
    ]


def test_plaintext_off_loopback_needs_allow_insecure_remote() -> None:
    assert refused(daemon={"listen": "192.0.2.1:50051"}).startswith(
        "daemon.listen: 192.0.2.1:50051 is not a loopback address and [tls] is not configured"
    )
    remote = config(daemon={"listen": "192.0.2.1:50051", "allow_insecure_remote": True})
    assert remote.allow_insecure_remote and remote.listen == "192.0.2.1:50051"
