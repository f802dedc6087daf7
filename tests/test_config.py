"""Config files: the example loads; mistakes are refused with the key named."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from controller.config import ConfigError, demo_config, from_dict, load
from pricing.ledger import Ledger, ledger_bytes
from pricing.prices import PriceBounds
from tests.servers import example_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = (ROOT / "config" / "oasisd.example.toml").read_text()


@pytest.fixture(autouse=True)
def _tokens(tmp_path: Path) -> None:
    """The tokens file the example's [auth] names, next to every config written here."""
    example_config(tmp_path)


def test_example_config_loads(tmp_path: Path) -> None:
    config = load(example_config(tmp_path))
    assert config.window == 300 and config.slot_seconds == 3600
    assert len(config.cluster.worker_names) == 6 and len(config.cluster.ps_names) == 3
    assert config.pricing.mode == "estimate" and config.pricing.trim == 0.3
    assert config.database_url == "sqlite:////var/lib/oasis/oasis.db"
    assert config.sqlite_synchronous == "full"


def test_demo_defaults() -> None:
    config = demo_config(Path("/tmp/x"))
    assert config.listen.startswith("127.0.0.1:")
    assert config.database_url.startswith("sqlite:///")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("window = 300", "window = 0", "daemon.window: must be >= 1"),
        ("slot_seconds = 3600", "slot_seconds = -1", "daemon.slot_seconds: must be > 0"),
        ("slot_seconds = 3600", "slot_seconds = 1e-12",
         "daemon.slot_seconds: must lie in 1 .. 31622400 seconds (366 days), got 1e-12"),
        ("slot_seconds = 3600", "slot_seconds = 1e300", "daemon.slot_seconds: must lie in"),
        ('listen = "127.0.0.1:50051"', 'listen = "nowhere"', "daemon.listen: must be host:port"),
        ('log_level = "info"', 'log_level = "loud"', "daemon.log_level"),
        ("tick_seconds = 1.0", "tick_seconds = 1.0\nspeed = 3", "daemon.speed: unknown key"),
        ('bounds = "estimate"', 'bounds = "guess"', "pricing.bounds: must be 'estimate'"),
        ("l_margin = 1.0", "l_margin = 2", "pricing.l_margin: must be in (0, 1]"),
        ("trim = 0.3", "trim = 1", "pricing.trim: must be in [0, 1), got 1"),
        ('kind = "ps",     capacity = {cpu = 16', 'kind = "pss",     capacity = {cpu = 16',
         "cluster.servers[8].kind"),
        ("gpu = 16, cpu = 64", "gpu = -16, cpu = 64",
         "cluster.servers[2].capacity.gpu: must be >= 0"),
        ('"bandwidth"]', '"bw"]', "cluster.resources: must include 'bandwidth'"),
        ('"c4-4x-0",  kind = "ps",     capacity', '"c4-4x-0",  kind = "ps",     capacty',
         "cluster.servers[8].capacty: unknown key; did you mean 'capacity'?"),
        ("max_message_bytes = 1048576", "max_message_bytes = 2147483648",
         "limits.max_message_bytes: must be at most 2147483647 (2 GiB - 1): gRPC keeps"),
        ("max_search_steps = 3e8", "max_search_steps = 1e12",
         "limits.max_search_steps: must be at most 1e+10: the decision thread"),
        ('sqlite_synchronous = "full"', 'sqlite_synchronous = "off"',
         "daemon.sqlite_synchronous: must be one of ['full', 'normal'], got 'off'"),
    ],
)  # fmt: skip
def test_bad_config_names_the_key(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in EXAMPLE
    path = tmp_path / "bad.toml"
    path.write_text(EXAMPLE.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("[metrics]", "[metric]", "config.metric: unknown key; did you mean 'metrics'?"),
        ("slot_seconds = 3600", "slot_second = 3600",
         "daemon.slot_second: unknown key; did you mean 'slot_seconds'?"),
        ("trim = 0.3", "trims = 0.3", "pricing.trims: unknown key; did you mean 'trim'?"),
        ("max_pending = 1000", "max_pendng = 1000",
         "limits.max_pendng: unknown key; did you mean 'max_pending'?"),
        ("max_streams = 100", "max_stream = 100",
         "connections.max_stream: unknown key; did you mean 'max_streams'?"),
        ('tokens_file = "tokens"', 'token_file = "tokens"',
         "auth.token_file: unknown key; did you mean 'tokens_file'?"),
        ('listen = "127.0.0.1:9464"', 'listn = "127.0.0.1:9464"',
         "metrics.listn: unknown key; did you mean 'listen'?"),
        ("[metrics]", '[tls]\ncrt = "c"\nkey = "k"\n[metrics]',
         "tls.crt: unknown key; did you mean 'cert'?"),
        ("[metrics]", '[mqtt]\nhots = "b"\n[metrics]',
         "mqtt.hots: unknown key; did you mean 'host'?"),
        ("[metrics]", '[web]\nlisten_on = "127.0.0.1:0"\n[metrics]',
         "web.listen_on: unknown key; did you mean 'listen'?"),
        ("[metrics]", "[ha]\nlease_second = 5\n[metrics]",
         "ha.lease_second: unknown key; did you mean 'lease_seconds'?"),
        ("[metrics]", "[ha]\ncolour = 5\n[metrics]", "ha.colour: unknown key (known: "),
    ],
)  # fmt: skip
def test_an_unknown_config_key_names_the_closest_known_one(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    """As job specs and traces do: ``[metric]`` was told the eleven tables, and
    ``limits.max_pendng`` the thirty keys of [limits], without a word of which was meant."""
    assert old in EXAMPLE
    path = tmp_path / "bad.toml"
    path.write_text(EXAMPLE.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value), str(err.value)


def test_every_problem_of_a_config_file_is_said_at_once(tmp_path: Path) -> None:
    """The CLI audit: a config with an unknown key, a window of 0 and a negative tick
    took three starts to mend, one problem each. ``oasisd`` says a line per problem."""
    import subprocess
    import sys

    from tests.servers import ROOT

    (tmp_path / "tokens").write_text("")  # holds no token: a fourth problem, in [auth]
    text = (
        EXAMPLE.replace("window = 300", "window = 0", 1)
        .replace("tick_seconds = 1.0", "tick_seconds = -1", 1)
        .replace("[daemon]", "[daemon]\nbogus_key = 1", 1)
    )
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    said = str(err.value).splitlines()
    assert [line.split(":", 1)[0] for line in said] == [
        "daemon.bogus_key", "daemon.window", "auth.tokens_file", "daemon.tick_seconds"
    ], said  # fmt: skip
    assert "auth.tokens_file: is required" not in str(err.value)  # no problem of its own
    out = subprocess.run([sys.executable, "-m", "controller.daemon", "--config", str(path)],
                         cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 2 and out.stderr.splitlines() == [f"oasisd: {x}" for x in said]


def test_the_epoch_may_be_a_toml_date_time(tmp_path: Path) -> None:
    """Before: ``epoch = 2026-01-01T00:00:00Z`` was 'must be a number, got
    datetime.datetime(2026, 1, 1, 0, 0, tzin'."""
    path = tmp_path / "epoch.toml"
    for given in ("2026-01-01T00:00:00Z", "2026-01-01T01:00:00+01:00", '"2026-01-01T00:00:00Z"'):
        path.write_text(EXAMPLE.replace("epoch = 1767225600", f"epoch = {given}", 1))
        assert load(path).epoch == 1767225600.0
    for given, why in (
        ("2026-01-01T00:00:00", "the date-time 2026-01-01T00:00:00 has no UTC offset"),
        ("2026-01-01", "got 2026-01-01"),
        ('"soon"', "got 'soon'"),
    ):
        path.write_text(EXAMPLE.replace("epoch = 1767225600", f"epoch = {given}", 1))
        with pytest.raises(ConfigError) as err:
            load(path)
        message = str(err.value)
        assert message.startswith("daemon.epoch: ") and why in message
        assert "such as 2026-01-01T00:00:00Z" in message


def test_explicit_bounds(tmp_path: Path) -> None:
    text = EXAMPLE.replace(
        'bounds = "estimate"\ntrim = 0.3\nl_margin = 1.0\nu_margin = 1.0',
        'bounds = "explicit"\nL1 = 1e-4\nL2 = 1e-4\nU1 = {gpu = 50.0}\nU2 = {cpu = 25.0}',
    )
    path = tmp_path / "explicit.toml"
    path.write_text(text)
    config = load(path)
    assert config.pricing.mode == "explicit" and config.pricing.bounds is not None
    path.write_text(text.replace("U1 = {gpu = 50.0}", "U1 = {gpu = 1e-6}"))
    with pytest.raises(ConfigError, match=r"pricing.U1.gpu: must be >= L1"):
        load(path)
    # as the example's comment says, with the estimate's trim left in (before: "unknown
    # key", though the key is documented)
    path.write_text(EXAMPLE.replace('bounds = "estimate"',
                                    'bounds = "explicit"\nL1 = 1e-4\nL2 = 1e-4\nU1 = {gpu = 50.0}'
                                    '\nU2 = {cpu = 25.0}'))  # fmt: skip
    with pytest.raises(ConfigError, match=r'pricing.trim: only with bounds = "estimate"'):
        load(path)


def test_unreadable_and_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    with pytest.raises(ConfigError, match="not TOML"):
        load(bad)
    bad.write_bytes(b'[daemon]\nlisten = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8 text: invalid start byte at byte 19"):
        load(bad)
    bad.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load(bad)


def test_a_byte_order_mark_is_no_error(tmp_path: Path) -> None:
    """A config or tokens file saved by an editor that begins it with a byte-order mark
    (Windows' Notepad, others on request) stopped oasisd with exit 2 on "not TOML:
    Invalid statement (at line 1, column 1)" or "line 1: name '\\ufeffops' must be
    ...", pointing at a character no editor shows. Each is read as the file without
    it, as ``oasis submit`` reads a job file."""
    example = example_config(tmp_path)
    plain = load(example)
    bom = b"\xef\xbb\xbf"
    for path in (example, tmp_path / "tokens"):
        path.write_bytes(bom + path.read_bytes())
    read = load(example)
    assert repr(read) == repr(plain) and read.tokens == plain.tokens  # as without it
    assert read.tokens is not None and [c.name for c in read.tokens.values()] == ["ops"]


def test_window_whose_ledger_is_too_large_is_refused(tmp_path: Path) -> None:
    """A window the head node cannot hold is a config error with the numbers, not a
    daemon the kernel kills when the ledger's pages are first touched."""
    path = tmp_path / "wide.toml"
    path.write_text(EXAMPLE.replace("window = 300", "window = 100000000", 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    message = str(err.value)
    assert message.startswith("daemon.window: 100000000 slots x 9 servers x 5 resources")
    assert "78,773 MiB, over limits.max_ledger_mb = 8192" in message
    # the same window passes once the operator raises the limit knowingly
    path.write_text(
        EXAMPLE.replace("window = 300", "window = 100000000", 1).replace(
            "max_ledger_mb = 8192", "max_ledger_mb = 80000", 1
        )
    )
    assert load(path).window == 100_000_000


def test_ledger_bytes_is_what_a_ledger_holds(tmp_path: Path) -> None:
    """The size the window check uses is the arrays a ledger really allocates."""
    config = load(example_config(tmp_path))
    r = len(config.cluster.resources)
    bounds = PriceBounds(np.zeros(r), np.zeros(r), -5.0, -5.0, 1.0, 1.0)
    ledger = Ledger(config.cluster, bounds, 37)
    held = ledger.touched.nbytes
    for side in (ledger.worker_side, ledger.ps_side):
        held += sum(
            a.nbytes
            for a in vars(side).values()
            if isinstance(a, np.ndarray) and a.shape[:1] == (37,) and a is not ledger.touched
        )
    assert ledger_bytes(config.cluster, 37) == held


def test_files_named_by_mistake_are_refused_not_read_without_end(tmp_path: Path) -> None:
    """A config, tokens file or certificate path that names a device, a FIFO or a huge
    file: refused in words, at once (before: ``tokens_file = "/dev/zero"`` was read on a
    reload until the daemon ran out of memory, and a FIFO blocked the read)."""
    import os

    from controller.auth import load_tokens
    from controller.config import ConfigError, load
    from controller.files import read_bounded
    from controller.tls import read_pem
    from pricing.errors import SpecError

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"#" * 2048)
    for path in (Path("/dev/zero"), fifo):
        with pytest.raises(ConfigError, match=f"{path}: cannot read: not a regular file"):
            load(path)
        with pytest.raises(SpecError, match=r"auth.tokens_file: cannot read .*not a regular"):
            load_tokens(path)
        with pytest.raises(SpecError, match=r"tls.cert: cannot read .*not a regular file"):
            read_pem(path, "CERTIFICATE", "tls.cert")
    with pytest.raises(OSError, match="larger than 1024 bytes"):
        read_bounded(big, 1024)
    assert read_bounded(big, 2048) == b"#" * 2048


def test_a_server_without_bandwidth_is_warned_of() -> None:
    """Every worker and PS needs bandwidth (SPEC 3): a server listed without it takes
    no job, ever; before, only every submission's refusal said so."""
    import tomllib

    from tests.servers import CLUSTER_TOML

    base = tomllib.loads(CLUSTER_TOML)
    assert from_dict(base).warnings == ()
    base["cluster"]["servers"][1]["capacity"].pop("bandwidth")
    (warning,) = from_dict(base).warnings
    assert warning == ("cluster.servers: worker server 'w1' has no bandwidth capacity: no "
                       "worker can run there (every one needs bandwidth)")  # fmt: skip


def test_a_client_reads_a_pem_from_a_pipe(tmp_path: Path) -> None:
    """``oasis ... --tls-ca <(vault read ...)``: a pipe, which the daemon's files may
    not be, is read by the client's flags (bounded all the same)."""
    import os
    import threading

    from controller.files import read_bounded
    from controller.tls import read_pem

    pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(pem)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert read_pem(fifo, "CERTIFICATE", "--tls-ca", pipes=True) == pem
    finally:
        writer.join(10)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        with pytest.raises(OSError, match="larger than 10 bytes"):
            read_bounded(fifo, 10, pipes=True)
    finally:
        writer.join(10)


def test_files_a_config_names_are_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The units audit: ``[auth] tokens_file = "tokens"`` next to the config was read from
    the working directory ("cannot read tokens: No such file"), unlike data_dir and the
    prior; under systemd the working directory is /. The tokens file, the TLS files and
    the broker's CA are now read relative to the config's folder, as those are."""
    from controller.auth import hash_token
    from controller.config import ConfigError, load
    from tests.servers import write_config

    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "tokens").write_text(f"alice submitter {hash_token('a' * 43)}\n")
    path = write_config(folder / "oasisd.toml", tmp_path / "data",
                        extra='[auth]\ntokens_file = "tokens"\n')  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load(path)
    assert config.tokens is not None
    assert [c.name for c in config.tokens.values()] == ["alice"]
    text = path.read_text() + '\n[tls]\ncert = "server.pem"\nkey = "server.key"\n'
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(str(folder / "server.pem"))):
        load(path)


def test_seconds_in_a_config_may_be_durations(tmp_path: Path) -> None:
    """The units audit: ``oasis submit --wait 2h`` worked, ``daemon.wait_seconds = "2h"``
    was "must be a number, got the string '2h'". Every key ending in ``_seconds`` or
    ``_timeout`` also takes a duration; other text is still refused, naming the key."""
    from controller.config import ConfigError, load
    from tests.servers import write_config

    path = write_config(tmp_path / "c.toml", tmp_path / "data", extra=(
        '[mqtt]\nurl = "mqtt://127.0.0.1:1883"\nheartbeat_timeout = "1m"\n'
        'flap_seconds = "2h"\n'))  # fmt: skip
    text = path.read_text().replace("slot_seconds = 3600", 'slot_seconds = "1h"')
    path.write_text(text.replace("[daemon]\n", '[daemon]\nwait_seconds = "1h30m"\n'))
    config = load(path)
    assert (config.slot_seconds, config.wait_seconds) == (3600.0, 5400.0)
    assert config.mqtt is not None
    assert (config.mqtt.heartbeat_timeout, config.mqtt.flap_seconds) == (60.0, 7200.0)
    # and so does the agent given the same file (before: it exited 2, "oasis agent:
    # mqtt.heartbeat_timeout: must be a number, got the string '1m'")
    from controller.cli import build_parser
    from controller.commands.agent import broker_settings

    args = build_parser().parse_args(["agent", "--node", "w0", "--config", str(path)])
    assert broker_settings(args).heartbeat_timeout == 60.0
    # the window counts slots: a duration that is a whole number of them, or refused
    path.write_text(path.read_text().replace("window = 24", 'window = "2d"'))
    assert load(path).window == 48
    path.write_text(path.read_text().replace('window = "2d"', 'window = "90m"'))
    with pytest.raises(ConfigError, match=r"daemon\.window: '90m' is not a whole number of slots"):
        load(path)
    path.write_text(path.read_text().replace('window = "90m"', "window = 24"))
    path.write_text(path.read_text().replace('"1h30m"', '"soon"'))
    # not "must be a number", where "90m" is taken: what is, and the text given
    with pytest.raises(ConfigError, match=r"daemon\.wait_seconds: must be seconds or a "
                       r"duration such as \"90m\".* got 'soon'"):  # fmt: skip
        load(path)
    path.write_text(path.read_text().replace('"soon"', '"1h30m"'))
    path.write_text(path.read_text().replace('"1m"', '"1 minute"'))
    with pytest.raises(ConfigError, match=r"mqtt\.heartbeat_timeout: must be seconds or a "
                       r"duration .*got '1 minute'"):  # fmt: skip
        load(path)


def test_a_file_without_a_cluster_is_told_the_demos_is_not_its_default(tmp_path: Path) -> None:
    """``oasisd`` alone runs the embedded demo cluster, so a first config file of a few
    ``[daemon]`` keys was told only ``cluster: is required``, as if a key were missing
    from a table: it now says a file gives its own ``[cluster]``, and where one is."""
    path = tmp_path / "oasisd.toml"
    path.write_text('[daemon]\nlisten = "127.0.0.1:50052"\n')
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == (
        "cluster: is required: a config file gives its own [cluster] (resources and servers, "
        "as config/oasisd.example.toml does); only oasisd without --config runs the embedded "
        "demo cluster"
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("tls", "tls: the table is empty: give cert and key (and client_ca for mutual TLS), "
                "or leave [tls] out to serve plaintext on loopback"),
        ("mqtt", 'mqtt: the table is empty: give the broker\'s url (e.g. '
                 '"mqtt://127.0.0.1:1883"), or leave [mqtt] out to run without a broker'),
    ],
)  # fmt: skip
def test_an_empty_table_is_refused_not_read_as_none(
    tmp_path: Path, table: str, message: str
) -> None:
    """The example config's ``# [tls]`` or ``# [mqtt]`` with its header uncommented and
    its keys not: an empty table read as no table, so the daemon served plaintext (and
    an address off loopback was then refused as "[tls] is not configured" beside a
    [tls]), or ran without a broker and no plan reached an agent, and said nothing. As
    an empty ``[auth]``, it is refused."""
    path = example_config(tmp_path)
    text = path.read_text()
    path.write_text(text.replace(f"# [{table}]\n", f"[{table}]\n", 1))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == message
    path.write_text(text)
    assert getattr(load(path), table) is None  # no table: plaintext on loopback, no broker


def test_a_tick_that_would_spin_or_sleep_through_slots_is_refused(tmp_path: Path) -> None:
    """Before: ``tick_seconds = 1e-9`` started a daemon that held a core at 96% reading the
    store in a loop, and ``tick_seconds = "1h"`` one that saw slot boundaries and silent
    agents up to an hour late; now each is refused (exit 2) naming the key and its range."""
    import subprocess
    import sys

    for given, top in (("1e-9", "10"), ('"1h"', "10"), ("11", "10"), ("2", "1")):
        text = EXAMPLE.replace("tick_seconds = 1.0", f"tick_seconds = {given}", 1)
        if top == "1":
            text = text.replace("slot_seconds = 3600", "slot_seconds = 1", 1)
            text = text.replace("window = 300", "window = 30", 1)
        path = tmp_path / "tick.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load(path)
        assert str(err.value).startswith(f"daemon.tick_seconds: must lie in 0.01 .. {top} "), str(
            err.value
        )
    path.write_text(EXAMPLE.replace("tick_seconds = 1.0", "tick_seconds = 1e-9", 1))
    out = subprocess.run([sys.executable, "-m", "controller.daemon", "--config", str(path)],
                         cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("oasisd: daemon.tick_seconds: must lie in 0.01 .. 10 seconds")
    for fine in ("0.02", "10", "0.5"):
        path.write_text(EXAMPLE.replace("tick_seconds = 1.0", f"tick_seconds = {fine}", 1))
        assert load(path).tick_seconds == float(fine)


def test_an_unreadable_tls_key_is_said_once_not_as_tls_missing(tmp_path: Path) -> None:
    """The first-day audit: a [tls] key the daemon's user could not read (root's 0600)
    stopped the start with its own line, then 'tls: needs both cert and key' and
    'daemon.listen: 0.0.0.0:50051 is not a loopback address and [tls] is not configured'
    of a file that set both and [tls]: the consequences of taking the key out."""
    cert = tmp_path / "server.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key = tmp_path / "server.key"  # missing: unreadable as 'Permission denied' is
    config = tmp_path / "oasisd.toml"
    text = (ROOT / "config" / "oasisd.example.toml").read_text()
    text = text.replace('listen = "127.0.0.1:50051"', 'listen = "0.0.0.0:50051"', 1)
    text = text.replace("[auth]\n", f'[tls]\ncert = "{cert}"\nkey = "{key}"\n\n[auth]\n', 1)
    config.write_text(text)
    (tmp_path / "tokens").write_text("")
    with pytest.raises(ConfigError) as err:
        load(config)
    lines = [line for line in str(err.value).splitlines() if line.startswith("tls")]
    assert lines and lines[0].startswith(f"tls.key: cannot read {key}"), str(err.value)
    assert "needs both cert and key" not in str(err.value), str(err.value)
    assert "[tls] is not configured" not in str(err.value), str(err.value)


def test_a_store_url_naming_a_parameter_libpq_lacks_is_a_config_error() -> None:
    """``?sslmod=require``: before, the config was taken and every connect failed with
    psycopg's "invalid connection option", exit 1, which systemd's unit restarted every
    2 s for ever. libpq's own parameters (several hosts, options) are taken."""
    import tomllib

    from tests.servers import CLUSTER_TOML

    base = tomllib.loads(CLUSTER_TOML)
    url = "postgresql+psycopg://oasis@db/oasis"
    with pytest.raises(ConfigError) as refused:
        from_dict({**base, "daemon": {"store_url": f"{url}?sslmod=require"}})
    assert str(refused.value) == (
        "daemon.store_url: ?sslmod=...: not a connection parameter libpq knows; did you mean "
        "'sslmode'? (the URL's query holds libpq's: sslmode, sslrootcert, options, ...)"
    )
    for fine in ("?sslmode=require&host=a&host=b&target_session_attrs=read-write",
                 "?options=-csearch_path%3Dpublic&application_name=x"):  # fmt: skip
        assert from_dict({**base, "daemon": {"store_url": url + fine}}).store_url == url + fine
