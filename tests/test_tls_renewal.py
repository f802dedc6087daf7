"""``[tls]``'s files renewed in place (``controller/tls_renewal.py``): the daemon serves
the new certificate to new connections of its gRPC API and console without a restart,
exports its expiry, keeps serving the old one while the files do not load, and warns of
an expiry near. The daemon runs as a subprocess on loopback; clients are real TLS
connections."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import signal
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.tls import client_channel, tls_from_dict
from controller.tls_renewal import CHECK_SECONDS, CertificateWatch
from tests.servers import Daemon, free_port, json_log, write_config
from tests.test_security import Pki, _issue, _write, make_pki

WAIT = 6 * CHECK_SECONDS  # a check comes every CHECK_SECONDS; the machine may be slow


def _served(port: int) -> x509.Certificate:
    """The certificate a new TLS connection to 127.0.0.1:``port`` is given."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _renew(pki: Pki, directory: Path, days: float) -> x509.Certificate:
    """A new key and certificate from the same CA, written over the served paths as a
    renewal tool does: each file written beside, then renamed over."""
    ca_key = _load_key(pki.ca.with_suffix(".key"))
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue("oasisd", key, (ca.subject, ca_key), usage=ExtendedKeyUsageOID.SERVER_AUTH,
                  ips=("127.0.0.1", "::1"), days=days)  # fmt: skip
    _write(directory / "new", cert, key)
    os.replace(directory / "new.key", pki.server_key)
    os.replace(directory / "new.crt", pki.server_cert)
    return cert


def _load_key(path: Path) -> Any:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return load_pem_private_key(path.read_bytes(), None)


def _expiry_metric(port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    name = "oasis_tls_certificate_expiry_timestamp_seconds "
    lines = [line for line in text.splitlines() if line.startswith(name)]
    return float(lines[0].split()[1]) if lines else None


@pytest.fixture(scope="module")
def renewed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Daemon, Pki, Path, int, int]]:
    d = tmp_path_factory.mktemp("renewal")
    pki = make_pki(d)
    web, metrics = free_port(), free_port()
    extra = f"""
[tls]
cert = "{pki.server_cert}"
key = "{pki.server_key}"
[web]
listen = "127.0.0.1:{web}"
[metrics]
listen = "127.0.0.1:{metrics}"
"""
    config = write_config(d / "oasisd.toml", d / "data", extra=extra)
    daemon = Daemon(config, d / "oasisd.log").start()
    yield daemon, pki, d, web, metrics
    assert daemon.stop() == 0, (d / "oasisd.log").read_text()


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(
    renewed: tuple[Daemon, Pki, Path, int, int],
) -> None:
    daemon, pki, d, web, metrics = renewed
    grpc_port = int(daemon.address.rpartition(":")[2])
    first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    assert _served(grpc_port) == first and _served(web) == first
    assert _expiry_metric(metrics) == first.not_valid_after_utc.timestamp()
    health = health_pb2.HealthCheckRequest(service="")
    old = client_channel(daemon.address, ca_pem=pki.ca.read_bytes())
    health_pb2_grpc.HealthStub(old).Check(health, timeout=10)

    second = _renew(pki, d, days=30)
    _until(lambda: _served(grpc_port) == second, "the gRPC API serves the renewed certificate")
    _until(lambda: _served(web) == second, "the console serves the renewed certificate")
    assert _expiry_metric(metrics) == second.not_valid_after_utc.timestamp()
    with client_channel(daemon.address, ca_pem=pki.ca.read_bytes()) as new:
        reply = health_pb2_grpc.HealthStub(new).Check(health, timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    # the connection open before the renewal goes on
    health_pb2_grpc.HealthStub(old).Check(health, timeout=10)
    old.close()
    renewals = [
        e for e in json_log(daemon.log_path) if e.get("event", "").startswith("tls: renewed")
    ]
    assert renewals and renewals[-1]["cert"] == str(pki.server_cert)


def test_files_that_do_not_load_leave_the_served_certificate(
    renewed: tuple[Daemon, Pki, Path, int, int],
) -> None:
    """A renewal caught half written (another key beside the certificate): the daemon
    keeps serving the certificate it serves, says why once, and takes the files once they
    load."""
    daemon, pki, d, web, _ = renewed
    grpc_port = int(daemon.address.rpartition(":")[2])
    serving = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    _write(d / "other", _issue("x", ec.generate_private_key(ec.SECP256R1()), None),
           ec.generate_private_key(ec.SECP256R1()))  # fmt: skip
    os.replace(d / "other.key", pki.server_key)  # not the certificate's key

    def refused() -> list[dict[str, Any]]:
        return [e for e in json_log(daemon.log_path) if "do not load" in e.get("event", "")]

    _until(lambda: bool(refused()), "the daemon says the files do not load")
    assert "tls.key" in refused()[-1]["event"] and str(pki.server_key) in refused()[-1]["event"]
    assert _served(grpc_port) == serving and _served(web) == serving
    with client_channel(daemon.address, ca_pem=pki.ca.read_bytes()) as channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    third = _renew(pki, d, days=40)
    _until(lambda: _served(grpc_port) == third, "the files served once they load")
    assert len(refused()) == 1  # said once, not at every check (also: the unit test below)


class _Said:
    """A structlog logger that keeps (level, event) of each line."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        return lambda event, **_: self.lines.append((level, event))


def test_an_expiry_near_or_past_is_warned_of_once_a_day(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    expires = x509.load_pem_x509_certificate(tls.cert_pem).not_valid_after_utc.timestamp()
    now = [expires - 20 * 86400.0]
    said = _Said()
    watch = CertificateWatch(tls, said, now=lambda: now[0])
    assert watch.served.expires == expires
    asyncio.run(watch.check())
    assert said.lines == []  # 20 days left
    now[0] = expires - 3 * 86400.0
    asyncio.run(watch.check())
    asyncio.run(watch.check())
    assert [level for level, _ in said.lines] == ["warning"], said.lines
    assert "expires in 3.0 days" in said.lines[0][1]
    now[0] += 86400.0
    asyncio.run(watch.check())
    assert len(said.lines) == 2 and "expires in 2.0 days" in said.lines[1][1]
    now[0] = expires + 3600.0
    asyncio.run(watch.check())
    assert said.lines[-1][0] == "error" and "has expired" in said.lines[-1][1]


def test_a_certificate_whose_expiry_does_not_parse_is_served_with_none_said(
    tmp_path: Path,
) -> None:
    """OpenSSL loads some certificates ``cryptography`` refuses (a negative serial
    number, say): such a one is served all the same, its expiry unknown (NaN), not a
    daemon that fails to start."""
    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    odd = dataclasses.replace(
        tls, cert_pem=b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"
    )
    said = _Said()
    watch = CertificateWatch(odd, said)
    assert math.isnan(watch.served.expires)
    asyncio.run(watch.check())
    assert said.lines == []


def test_a_reload_serves_renewed_files_at_once(tmp_path: Path) -> None:
    """``check_soon`` (the daemon's SIGHUP: a renewal tool's deploy hook runs ``systemctl
    reload``) reads renewed files without waiting for the periodic check, and checks at
    once (the periodic one, SIGHUPs) serve them once. The mutation audit: checks run side
    by side (no lock) passed the daemon's tests, and this one with two checks 2 runs of
    13; with eight, none of 10."""
    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    said = _Said()
    watch = CertificateWatch(tls, said)
    renewed = _renew(pki, tmp_path, days=30)

    async def scenario() -> None:
        for _ in range(8):
            watch.check_soon()
        while watch._soon:
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert watch.served.generation == 1
    assert x509.load_pem_x509_certificate(watch.served.tls.cert_pem) == renewed
    assert [e for _, e in said.lines] == ["tls: renewed certificate served to new connections"]


def test_files_that_do_not_load_are_said_once_however_many_checks(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    said = _Said()
    watch = CertificateWatch(tls, said)
    _write(tmp_path / "other", _issue("x", ec.generate_private_key(ec.SECP256R1()), None),
           ec.generate_private_key(ec.SECP256R1()))  # fmt: skip
    os.replace(tmp_path / "other.key", pki.server_key)  # not the certificate's key
    for _ in range(3):
        asyncio.run(watch.check())
    refused = [(level, e) for level, e in said.lines if "do not load" in e]
    assert [level for level, _ in refused] == ["warning"], said.lines  # once, of 3 checks
    assert watch.served.generation == 0


def _handshake_served(port: int, ca: Path, cert: Path, key: Path) -> bool:
    """Whether the console at 127.0.0.1:``port`` answers a request made with the client
    certificate ``cert`` (False: the handshake or the first read failed)."""
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(
                f"GET /static/console.css HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
            )
            return tls.recv(16).split(b" ")[1:2] == [b"200"]
    except (ssl.SSLError, ConnectionError):
        return False


def _grpc_served(daemon: Daemon, ca: Path, cert: Path, key: Path) -> bool:
    channel = client_channel(daemon.address, ca_pem=ca.read_bytes(), cert_pem=cert.read_bytes(),
                             key_pem=key.read_bytes())  # fmt: skip
    with channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return False
    return True


def test_a_replaced_client_ca_alone_is_trusted_once_renewed(tmp_path: Path) -> None:
    """An operator replaces ``client_ca`` (the old CA's key leaked, or it expires):
    from the renewal on, new connections with a client certificate of the old CA are
    refused, on the gRPC API and on the console, and the new CA's are served."""
    pki = make_pki(tmp_path)
    trusted = tmp_path / "clients-ca.crt"
    trusted.write_bytes(pki.ca.read_bytes())
    web = free_port()
    extra = f"""
[tls]
cert = "{pki.server_cert}"
key = "{pki.server_key}"
client_ca = "{trusted}"
[web]
listen = "127.0.0.1:{web}"
"""
    daemon = Daemon(write_config(tmp_path / "oasisd.toml", tmp_path / "data", extra=extra),
                    tmp_path / "oasisd.log").start()  # fmt: skip
    try:
        old = (pki.ca, pki.client_cert, pki.client_key)
        assert _grpc_served(daemon, *old) and _handshake_served(web, *old)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _issue("new clients' CA", ca_key, None, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        _write(tmp_path / "new-ca", ca, ca_key)
        _write(tmp_path / "bob", _issue("bob", key, (ca.subject, ca_key),
                                        usage=ExtendedKeyUsageOID.CLIENT_AUTH), key)  # fmt: skip
        os.replace(tmp_path / "new-ca.crt", trusted)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)  # checked at once, not within CHECK_SECONDS
        new = (pki.ca, tmp_path / "bob.crt", tmp_path / "bob.key")
        _until(lambda: _grpc_served(daemon, *new), "the gRPC API trusts the new CA")
        _until(lambda: _handshake_served(web, *new), "the console trusts the new CA")
        assert not _grpc_served(daemon, *old) and not _handshake_served(web, *old)
    finally:
        assert daemon.stop() == 0, (tmp_path / "oasisd.log").read_text()


def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip


def test_files_renewed_in_place_at_the_same_size_are_served(tmp_path: Path) -> None:
    """A renewal tool that writes over the served files (``cp``, ``cat >``, Ansible's
    ``copy``) keeps their inode, and a new certificate of the same CA and shape is often
    of the very size of the old: their modification time alone says they changed. The
    mutation audit: the time left out of the files' identity passed every test."""
    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    watch = CertificateWatch(tls, _Said())
    ca_key = _load_key(pki.ca.with_suffix(".key"))
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    files = (pki.server_cert, pki.server_key)
    before = [os.stat(p) for p in files]
    for _ in range(200):  # an ECDSA signature is 70 to 72 bytes: the size varies a little
        key = ec.generate_private_key(ec.SECP256R1())
        renewed = _issue("oasisd", key, (ca.subject, ca_key), ips=("127.0.0.1", "::1"), days=30,
                         usage=ExtendedKeyUsageOID.SERVER_AUTH)  # fmt: skip
        pems = _pem(renewed, key)
        if [len(pem) for pem in pems] == [st.st_size for st in before]:
            break
    else:
        raise AssertionError("no renewal of the certificate's size in 200")
    for path, pem, st in zip(files, pems, before, strict=True):
        path.write_bytes(pem)  # over the old: the same inode
        # a renewal comes long after: its time is later than the coarse clock may say
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 60 * 10**9))
    after = [os.stat(p) for p in files]
    assert [(s.st_ino, s.st_size) for s in after] == [(s.st_ino, s.st_size) for s in before]
    asyncio.run(watch.check())
    assert watch.served.generation == 1
    assert x509.load_pem_x509_certificate(watch.served.tls.cert_pem) == renewed


def test_files_behind_a_swapped_folder_link_are_served(tmp_path: Path) -> None:
    """Kubernetes mounts a secret as links through a folder link, ``tls.crt ->
    ..data/tls.crt`` and ``..data -> ..2026_12_03...``, and renews it by pointing
    ``..data`` at a new folder: the links named in ``[tls]`` never change, their targets
    do. The files are looked at through their links. The mutation audit: the links
    themselves looked at (``lstat``) passed every test."""
    pki = make_pki(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    ca_key = _load_key(pki.ca.with_suffix(".key"))
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())

    def version(name: str) -> x509.Certificate:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue("oasisd", key, (ca.subject, ca_key), ips=("127.0.0.1",), days=30,
                      usage=ExtendedKeyUsageOID.SERVER_AUTH)  # fmt: skip
        folder = secret / name
        folder.mkdir()
        for file, pem in zip(("tls.crt", "tls.key"), _pem(cert, key), strict=True):
            (folder / file).write_bytes(pem)
        (secret / "..data_tmp").symlink_to(name)
        os.replace(secret / "..data_tmp", secret / "..data")  # as the kubelet swaps it
        return cert

    version("..v1")
    for file in ("tls.crt", "tls.key"):
        (secret / file).symlink_to(Path("..data") / file)
    tls = tls_from_dict({"cert": str(secret / "tls.crt"), "key": str(secret / "tls.key")})
    assert tls is not None
    watch = CertificateWatch(tls, _Said())
    renewed = version("..v2")
    asyncio.run(watch.check())
    assert watch.served.generation == 1
    assert x509.load_pem_x509_certificate(watch.served.tls.cert_pem) == renewed


def test_a_renewal_the_console_refuses_is_said_once_and_not_served(tmp_path: Path) -> None:
    """A listener (the console's ``renew``) that cannot load the renewed files leaves them
    unserved, as files that do not load: said once, as a warning naming why, and not
    offered to it again until they change. The mutation audit: the refusal left unsaid
    (the renewal silently unserved, the console asked again at every check) passed."""
    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    said = _Said()
    watch = CertificateWatch(tls, said)
    offered: list[Path] = []

    def console(renewed: Any) -> None:
        offered.append(renewed.cert)
        raise ValueError("a test's console refuses it")

    watch.listeners.append(console)
    _renew(pki, tmp_path, days=30)
    for _ in range(3):
        asyncio.run(watch.check())
    assert offered == [pki.server_cert] and watch.served.generation == 0
    refused = [(level, e) for level, e in said.lines if "do not load" in e]
    assert [level for level, _ in refused] == ["warning"], said.lines
    assert "the console cannot load them: a test's console refuses it" in refused[0][1]


def test_the_expiry_is_warned_of_from_fourteen_days_before_it(tmp_path: Path) -> None:
    """:data:`WARN_SECONDS` is the first moment warned of: at 14 days left, not only
    under. The mutation audit: ``left >= WARN_SECONDS`` passed."""
    from controller.tls_renewal import WARN_SECONDS

    pki = make_pki(tmp_path)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None
    now = [0.0]
    said = _Said()
    watch = CertificateWatch(tls, said, now=lambda: now[0])
    now[0] = watch.served.expires - WARN_SECONDS - 1
    asyncio.run(watch.check())
    assert said.lines == []
    now[0] += 1
    asyncio.run(watch.check())
    assert [level for level, _ in said.lines] == ["warning"], said.lines
    assert "expires in 14.0 days" in said.lines[0][1]
