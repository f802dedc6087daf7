"""Config values at and past their bounds, of the wrong type, or in the wrong unit are
refused naming the key, and the values at a bound are taken (the mutation audit of
config loading: each of these was a slip no test caught)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.auth import hash_token
from controller.config import Config, ConfigError, from_dict, load, load_mqtt
from controller.config_exposure import _others_may
from pricing.default_prior import default_prior
from pricing.ledger import ledger_bytes

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


def test_finished_jobs_are_kept_at_most_a_century() -> None:
    assert config(daemon={"keep_days": 36525}).keep_days == 36525
    assert refused(daemon={"keep_days": 36525.5}).startswith(
        "daemon.keep_days: must be at most 36525 (a century"
    )


def test_the_ledger_of_window_plus_one_slots_is_what_is_checked_against_its_cap() -> None:
    """The ledger holds ``window + 1`` slots: a cap between the sizes of ``window`` and
    ``window + 1`` slots is refused, the size of ``window + 1`` slots taken."""
    window = 100_000
    cluster = config().cluster
    low = ledger_bytes(cluster, window) / 2**20
    high = ledger_bytes(cluster, window + 1) / 2**20
    assert low < high
    taken = config(daemon={"window": window}, limits={"max_ledger_mb": high})
    assert taken.window == window
    message = refused(daemon={"window": window}, limits={"max_ledger_mb": (low + high) / 2})
    assert message.startswith(f"daemon.window: {window} slots x 2 servers x 5 resources")


def test_a_config_others_may_change_is_warned_of(tmp_path: Path) -> None:
    path = tmp_path / "open.toml"
    path.write_text(
        "[cluster]\n"
        + f"resources = {CLUSTER['resources']!r}\n".replace("'", '"')
        + 'servers = [{name = "w0", kind = "worker", capacity = '
        "{gpu = 4, cpu = 32, mem = 244, disk = 250, bandwidth = 25}},\n"
        '  {name = "p0", kind = "ps", capacity = '
        "{cpu = 36, mem = 60, disk = 500, bandwidth = 25}}]\n"
    )
    path.chmod(0o600)
    assert load(path).warnings == ()
    path.chmod(0o602)
    assert load(path).warnings == (
        f"the config {path}: mode 0602: another user may change it and so who may do what "
        "here; chown it to root or the daemon's user, chmod go-w",
    )


def test_listen_addresses_need_a_host_and_a_port_up_to_65535() -> None:
    assert config(metrics={"listen": "127.0.0.1:65535"}).metrics_listen == "127.0.0.1:65535"
    assert refused(metrics={"listen": "127.0.0.1:65536"}) == (
        "metrics.listen: must be host:port (or empty: off), got '127.0.0.1:65536'"
    )
    assert config(daemon={"listen": "127.0.0.1:65535"}).listen == "127.0.0.1:65535"
    assert refused(daemon={"listen": ":50051"}) == (
        "daemon.listen: must be host:port (a port 0 .. 65535), got ':50051'"
    )
    assert refused(daemon={"listen": "127.0.0.1:65536"}).startswith("daemon.listen: must be")


def test_per_server_prices_are_capped_by_a_count_of_0_or_more() -> None:
    assert config(metrics={"per_server_prices_up_to": 0}).per_server_prices_up_to == 0
    assert refused(metrics={"per_server_prices_up_to": -1}).startswith(
        "metrics.per_server_prices_up_to: "
    )


def test_a_window_given_as_a_duration_is_a_whole_positive_number_of_slots() -> None:
    assert config(daemon={"window": "48h"}).window == 48
    assert refused(daemon={"window": "0h"}) == (
        "daemon.window: '0h' is not a whole number of slots of 1h (daemon.slot_seconds)"
    )
    assert refused(daemon={"window": "90m"}).startswith("daemon.window: '90m' is not a whole")


def test_a_slot_lies_in_a_second_to_366_days() -> None:
    longest = 366 * 86400
    assert config(daemon={"slot_seconds": longest}).slot_seconds == longest
    assert config(daemon={"slot_seconds": 1, "tick_seconds": 1}).slot_seconds == 1
    for bad in (longest + 1, 0.5):
        assert refused(daemon={"slot_seconds": bad, "tick_seconds": 0.5}).startswith(
            "daemon.slot_seconds: must lie in 1 .. 31622400 seconds (366 days)"
        )


def test_a_tick_lies_in_10_ms_to_10_s_and_within_a_slot() -> None:
    assert config(daemon={"tick_seconds": 0.01}).tick_seconds == 0.01
    assert config(daemon={"tick_seconds": 10}).tick_seconds == 10
    assert refused(daemon={"tick_seconds": 10.5}).startswith(
        "daemon.tick_seconds: must lie in 0.01 .. 10 seconds (the longest: "
    )
    assert refused(daemon={"slot_seconds": 2, "tick_seconds": 3}).startswith(
        "daemon.tick_seconds: must lie in 0.01 .. 2 seconds (daemon.slot_seconds: "
    )


def test_the_estimates_margins_and_trim_are_bounded() -> None:
    taken = config(pricing={"l_margin": 1, "u_margin": 1, "trim": 0}).pricing
    assert (taken.l_margin, taken.u_margin, taken.trim) == (1, 1, 0)
    assert refused(pricing={"l_margin": 1.01}) == "pricing.l_margin: must be in (0, 1]"
    assert refused(pricing={"l_margin": -0.5}).startswith("pricing.l_margin: ")
    assert refused(pricing={"u_margin": 0.99}) == "pricing.u_margin: must be >= 1"
    assert refused(pricing={"trim": 1}) == "pricing.trim: must be in [0, 1), got 1.0"
    assert refused(pricing={"trim": -0.1}) == "pricing.trim: must be in [0, 1), got -0.1"


def test_explicit_bounds_refuse_the_estimates_keys() -> None:
    assert refused(pricing={"bounds": "explicit", "trim": 0.3}).startswith(
        'pricing.trim: only with bounds = "estimate"'
    )


def test_a_prior_none_is_none() -> None:
    assert config(pricing={"prior": "none"}).pricing.prior is None
    assert config().pricing.prior is not None


def test_metrics_off_loopback_needs_its_own_allow_insecure_remote() -> None:
    assert refused(metrics={"allow_insecure_remote": "yes"}) == (
        "metrics.allow_insecure_remote: must be true or false"
    )
    assert refused(metrics={"listen": "192.0.2.1:9464"}).startswith(
        "metrics.listen: 192.0.2.1:9464 is not a loopback address"
    )
    remote = {"listen": "192.0.2.1:9464", "allow_insecure_remote": True}
    assert config(metrics=remote).metrics_listen == "192.0.2.1:9464"


SERVERS_TOML = (
    "[cluster]\n"
    'resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]\n'
    'servers = [{name = "w0", kind = "worker", capacity = '
    "{gpu = 4, cpu = 32, mem = 244, disk = 250, bandwidth = 25}},\n"
    '  {name = "p0", kind = "ps", capacity = '
    "{cpu = 36, mem = 60, disk = 500, bandwidth = 25}}]\n"
)


def written(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + SERVERS_TOML)
    path.chmod(mode)
    return path


def test_a_broker_password_in_the_clear_off_loopback_is_warned_of(tmp_path: Path) -> None:
    clear = 'url = "mqtt://192.0.2.1:1883"\nusername = "u"\npassword = "pw"\n'
    warnings = load(written(tmp_path / "clear.toml", f"[mqtt]\n{clear}")).warnings
    assert warnings == (
        "mqtt: the broker 192.0.2.1:1883 is not on loopback and TLS is off: the broker "
        "password, and every plan, cross the network in the clear; use mqtts:// (or tls_ca)",
    )
    tls = clear.replace("mqtt://192.0.2.1:1883", "mqtts://192.0.2.1:8883")
    assert load(written(tmp_path / "tls.toml", f"[mqtt]\n{tls}")).warnings == ()


def test_a_store_password_in_a_file_others_may_read_is_warned_of(tmp_path: Path) -> None:
    daemon = '[daemon]\nstore_url = "postgresql+psycopg://oasis:pw@localhost/oasis"\n'
    assert load(written(tmp_path / "closed.toml", daemon)).warnings == ()
    path = written(tmp_path / "open.toml", daemon, 0o604)
    assert load(path).warnings == (
        f"{path} holds daemon.store_url's password and others may read it (mode 0604): "
        "chmod 600 it, or 640 with the daemon's group",
    )


def test_others_are_anyone_or_a_group_not_the_daemons() -> None:
    mine, other = os.getegid(), os.getegid() + 1
    assert not _others_may(0o640, mine) and _others_may(0o640, other)
    assert _others_may(0o604, mine) and not _others_may(0o600, other)
    assert not _others_may(0o604, mine, write=True) and _others_may(0o602, mine, write=True)
    assert not _others_may(0o660, mine, write=True) and _others_may(0o620, other, write=True)


def test_timeouts_too_may_be_durations(tmp_path: Path) -> None:
    assert config(daemon={"store_timeout": "2s"}).store_timeout == 2
    path = written(tmp_path / "agent.toml", '[mqtt]\nhost = "b"\nheartbeat_timeout = "30s"\n')
    mqtt = load_mqtt(path)
    assert mqtt is not None and mqtt.heartbeat_timeout == 30


def test_at_most_20_problems_are_said_at_once(tmp_path: Path) -> None:
    daemon = "[daemon]\n" + "".join(f"typo_{i:02d} = 1\n" for i in range(25))
    with pytest.raises(ConfigError) as err:
        load(written(tmp_path / "many.toml", daemon))
    lines = str(err.value).splitlines()
    assert len(lines) == 20 and lines[0].startswith("daemon.typo_00: unknown key")
    assert lines[-1].startswith("daemon.typo_19: unknown key")


def test_a_prior_file_is_read_next_to_the_config_and_named_by_its_path(tmp_path: Path) -> None:
    (tmp_path / "prior.json").write_text(json.dumps(replace(default_prior(), source="").to_dict()))
    prior = load(written(tmp_path / "c.toml", '[pricing]\nprior = "prior.json"\n')).pricing.prior
    assert prior is not None and prior.source == str(tmp_path / "prior.json")
    assert prior.weight == default_prior().weight


def test_an_empty_file_name_is_refused_not_read_as_the_configs_folder(tmp_path: Path) -> None:
    for table, text in (("auth.tokens_file", '[auth]\ntokens_file = ""\n'),
                        ("tls.cert", '[tls]\ncert = ""\nkey = "k"\n')):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            load(written(tmp_path / "c.toml", text))
        assert str(err.value) == f"{table}: must be a non-empty string, got the string ''"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a file to another user")
def test_a_config_owned_by_another_user_is_warned_of(tmp_path: Path) -> None:
    path = written(tmp_path / "theirs.toml", "")
    os.chown(path, 4242, -1)
    assert load(path).warnings == (
        f"the config {path}: owned by uid 4242, mode 0600: another user may change it and "
        "so who may do what here; chown it to root or the daemon's user, chmod go-w",
    )


def test_a_file_name_may_start_at_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "tokens").write_text(f"ops operator {hash_token('t-ops')}\n")
    (tmp_path / "tokens").chmod(0o600)
    (tmp_path / "etc").mkdir()
    loaded = load(written(tmp_path / "etc" / "c.toml", '[auth]\ntokens_file = "~/tokens"\n'))
    assert [c.name for c in (loaded.tokens or {}).values()] == ["ops"]


def test_the_agents_broker_ca_is_read_next_to_its_config(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    path = written(tmp_path / "etc" / "agent.toml", '[mqtt]\nhost = "b"\ntls_ca = "ca.pem"\n')
    mqtt = load_mqtt(path)
    assert mqtt is not None and mqtt.tls_ca == str(tmp_path / "etc" / "ca.pem")


def test_the_agents_device_resource_is_one_of_the_clusters() -> None:
    assert refused(mqtt={"host": "b", "device_resource": "gpus"}).startswith(
        "mqtt.device_resource: 'gpus' is not a resource of the cluster (its resources: gpu, "
    )
    no_devices = config(mqtt={"host": "b", "device_resource": ""}).mqtt
    assert no_devices is not None and no_devices.device_resource == ""
