"""Transport security and access control of ``oasisd``, end to end.

A CA, a server certificate for 127.0.0.1, client certificates (one from the CA, one from
a CA the daemon does not trust) and a tokens file are made in the test with
``cryptography``. The daemon runs as a subprocess on loopback with mutual TLS and three
tokens (two submitters, one operator), and again with TLS alone; clients are real gRPC
channels and the ``oasis`` CLI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.auth import Role, hash_token, load_tokens
from controller.config import ConfigError, from_dict
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import check_exposure, client_channel, is_loopback, tls_from_dict
from pricing.errors import SpecError
from tests.servers import CLUSTER_TOML, ROOT, Daemon, json_log, oasis, write_config
from tests.test_daemon_e2e import job

# -- a throwaway PKI ---------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # signed by a CA the daemon does not know
    rogue_key: Path

    def read(self, path: Path) -> bytes:
        return path.read_bytes()


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    ips: tuple[str, ...] = (),
    days: float = 1,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # key identifiers, as real CAs issue them: Python 3.13 verifies with
        # VERIFY_X509_STRICT, which refuses a certificate without its issuer's (RFC 5280)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ips:
        names: list[x509.GeneralName] = [x509.DNSName("localhost")]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def make_pki(directory: Path) -> Pki:
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in ("ca", "srv", "cli", "rca", "rcli")}
    ca = _issue("oasis test CA", keys["ca"], None, ca=True)
    rogue_ca = _issue("rogue CA", keys["rca"], None, ca=True)
    signer = (ca.subject, keys["ca"])
    server = _issue("oasisd", keys["srv"], signer, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                    ips=("127.0.0.1", "::1"))  # fmt: skip
    client = _issue("alice", keys["cli"], signer, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue = _issue("mallory", keys["rcli"], (rogue_ca.subject, keys["rca"]),
                   usage=ExtendedKeyUsageOID.CLIENT_AUTH)  # fmt: skip
    _write(directory / "ca", ca, keys["ca"])
    _write(directory / "server", server, keys["srv"])
    _write(directory / "client", client, keys["cli"])
    _write(directory / "rogue", rogue, keys["rcli"])
    return Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        rogue_cert=directory / "rogue.crt",
        rogue_key=directory / "rogue.key",
    )


TOKENS = {"alice": "alice-token-1", "bob": "bob-token-2", "ops": "ops-token-3"}
ROLES = {"alice": "submitter", "bob": "submitter", "ops": "operator"}


def write_tokens(path: Path) -> Path:
    lines = ["# name role sha256", *(f"{n} {ROLES[n]} {hash_token(t)}" for n, t in TOKENS.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _start(directory: Path, extra: str) -> Daemon:
    config = write_config(directory / "oasisd.toml", directory / "data", extra=extra)
    return Daemon(config, directory / "oasisd.log").start()


@pytest.fixture(scope="module")
def mtls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("mtls")
    tokens = write_tokens(d / "tokens")
    extra = f"""
[tls]
cert = "{pki.server_cert}"
key = "{pki.server_key}"
client_ca = "{pki.ca}"
[auth]
tokens_file = "{tokens}"
"""
    daemon = _start(d, extra)
    yield daemon
    assert daemon.stop() == 0, (d / "oasisd.log").read_text()


def mtls_channel(daemon: Daemon, pki: Pki, token: str = "") -> grpc.Channel:
    return client_channel(
        daemon.address,
        ca_pem=pki.read(pki.ca),
        cert_pem=pki.read(pki.client_cert),
        key_pem=pki.read(pki.client_key),
        token=token,
    )


def code_of(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call(*args, timeout=10, **kwargs)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def submit_request(job_id: str) -> pb.SubmitJobRequest:
    return pb.SubmitJobRequest(job=spec_to_proto(job(job_id)))


# -- transport ---------------------------------------------------------------------------


def test_mutual_tls_refuses_plaintext_and_clients_without_a_trusted_certificate(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    health = health_pb2.HealthCheckRequest(service="")
    attempts = {
        "plaintext": grpc.insecure_channel(mtls_daemon.address),
        "tls, no client certificate": client_channel(mtls_daemon.address, ca_pem=pki.read(pki.ca)),
        "tls, a client certificate of another CA": client_channel(
            mtls_daemon.address,
            ca_pem=pki.read(pki.ca),
            cert_pem=pki.read(pki.rogue_cert),
            key_pem=pki.read(pki.rogue_key),
        ),
        # the client does not trust the daemon: its own CA is the rogue one
        "tls, the daemon's certificate not trusted": client_channel(
            mtls_daemon.address,
            ca_pem=pki.read(pki.rogue_cert),
            cert_pem=pki.read(pki.client_cert),
            key_pem=pki.read(pki.client_key),
        ),
    }
    for what, channel in attempts.items():
        with channel:
            code, _ = code_of(health_pb2_grpc.HealthStub(channel).Check, health)
            assert code == grpc.StatusCode.UNAVAILABLE, what
    with mtls_channel(mtls_daemon, pki) as channel:  # no token: health stays open
        reply = health_pb2_grpc.HealthStub(channel).Check(health, timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_tls_without_client_certificates(tmp_path: Path, pki: Pki) -> None:
    extra = f'[tls]\ncert = "{pki.server_cert}"\nkey = "{pki.server_key}"\n'
    daemon = _start(tmp_path, extra)
    try:
        with client_channel(daemon.address, ca_pem=pki.read(pki.ca)) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            reply = stub.SubmitJob(submit_request("tls1"), timeout=30)
            assert reply.job.decision.admitted
        with grpc.insecure_channel(daemon.address) as channel:
            code, _ = code_of(pb_grpc.AdmissionStub(channel).GetJob, pb.GetJobRequest(id="tls1"))
            assert code == grpc.StatusCode.UNAVAILABLE
        # the CLI, trusting the CA, no token needed (no [auth])
        out = oasis("job", "tls1", "--json", "--tls-ca", str(pki.ca), server=daemon.address)
        assert json.loads(out.stdout)["id"] == "tls1"
        plain = oasis("job", "tls1", server=daemon.address, check=False)
        assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
    finally:
        assert daemon.stop() == 0, (tmp_path / "oasisd.log").read_text()


# -- tokens and roles --------------------------------------------------------------------


def test_tokens_are_required_and_checked(mtls_daemon: Daemon, pki: Pki) -> None:
    no_token = (
        "no bearer token: send metadata 'authorization: Bearer TOKEN' (oasis: set "
        "$OASIS_TOKEN, or give --token after the command: oasis jobs --token TOKEN)"
    )
    for token, why in (("", no_token), ("not-a-token", "unknown token")):
        with mtls_channel(mtls_daemon, pki, token) as channel:
            code, details = code_of(pb_grpc.AdmissionStub(channel).ListJobs, pb.ListJobsRequest())
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert why in details
            # what to do, not "unknown token" alone (a rotated tenant's token)
            assert why == no_token or "ask an operator for a new one" in details, details
    with mtls_channel(mtls_daemon, pki) as channel:  # a malformed header
        code, _ = code_of(
            pb_grpc.AdmissionStub(channel).ListJobs,
            pb.ListJobsRequest(),
            metadata=(("authorization", f"Basic {TOKENS['ops']}"),),
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED


def test_roles_and_ownership(mtls_daemon: Daemon, pki: Pki, tmp_path: Path) -> None:
    alice = mtls_channel(mtls_daemon, pki, TOKENS["alice"])
    bob = mtls_channel(mtls_daemon, pki, TOKENS["bob"])
    ops = mtls_channel(mtls_daemon, pki, TOKENS["ops"])
    try:
        a, b, o = (pb_grpc.AdmissionStub(c) for c in (alice, bob, ops))
        assert a.SubmitJob(submit_request("role-a1"), timeout=30).job.decision.admitted
        assert a.QuoteJob(pb.QuoteJobRequest(job=spec_to_proto(job("q"))), timeout=30)
        b.SubmitJob(submit_request("role-b1"), timeout=30)
        o.SubmitJob(submit_request("role-o1"), timeout=30)

        # a submitter sees its own jobs only; another's reads as missing
        listed = a.ListJobs(pb.ListJobsRequest(), timeout=10).jobs
        assert [j.spec.id for j in listed] == ["role-a1"]
        assert a.GetJob(pb.GetJobRequest(id="role-a1"), timeout=10).job.spec.id == "role-a1"
        code, _ = code_of(a.GetJob, pb.GetJobRequest(id="role-b1"))
        assert code == grpc.StatusCode.NOT_FOUND
        # a submitter cancels its own jobs, not another's (which reads as missing)
        code, details = code_of(a.CancelJob, pb.CancelJobRequest(id="role-b1"))
        assert code == grpc.StatusCode.NOT_FOUND and details == "no job 'role-b1'"
        bobs = b.GetJob(pb.GetJobRequest(id="role-b1"), timeout=10).job
        assert bobs.state == pb.JOB_STATE_ADMITTED
        b.SubmitJob(submit_request("role-b2"), timeout=30)
        mine = b.CancelJob(pb.CancelJobRequest(id="role-b2"), timeout=30)
        assert mine.job.state == pb.JOB_STATE_CANCELLED and mine.released_worker_slots > 0

        # retrying its own submission is idempotent, and a quote finds the stored job
        again = a.SubmitJob(submit_request("role-a1"), timeout=30)
        assert again.duplicate
        mine = a.QuoteJob(pb.QuoteJobRequest(job=submit_request("role-a1").job), timeout=30)
        assert mine.existing.spec.id == "role-a1"
        # ids are per submitter (before: bob's id was ALREADY_EXISTS for alice, "taken by
        # another submitter", which told her bob had such a job): a quote finds nothing,
        # and a submission is a job of alice's own, bob's untouched
        quote = a.QuoteJob(pb.QuoteJobRequest(job=submit_request("role-b1").job), timeout=30)
        assert not quote.HasField("existing")
        hers = a.SubmitJob(submit_request("role-b1"), timeout=30)
        assert not hers.duplicate and hers.job.spec.id == "role-b1"
        assert b.GetJob(pb.GetJobRequest(id="role-b1"), timeout=10).job == bobs
        listed = a.ListJobs(pb.ListJobsRequest(), timeout=10).jobs
        assert [j.spec.id for j in listed] == ["role-a1", "role-b1"]
        # a submitter names its own jobs only: another's key is no id of its
        code, details = code_of(a.GetJob, pb.GetJobRequest(id="bob:role-b1"))
        assert (
            code == grpc.StatusCode.INVALID_ARGUMENT
            and "without NAME: (got 'bob:role-b1')" in details
        )

        # operators only
        denied = [
            (pb_grpc.ClusterStub(alice).ListServers, pb.ListServersRequest()),
            (pb_grpc.ClusterStub(alice).GetPrices, pb.GetPricesRequest()),
            (pb_grpc.ClusterStub(alice).GetUtilisation, pb.GetUtilisationRequest()),
            (pb_grpc.ClusterStub(alice).CordonServer, pb.CordonServerRequest(server="w0")),
            (pb_grpc.ClusterStub(alice).UncordonServer, pb.UncordonServerRequest(server="w0")),
        ]
        for call, request in denied:
            code, details = code_of(call, request)
            assert code == grpc.StatusCode.PERMISSION_DENIED, call
            assert "operators only" in details
        stream = a.WatchEvents(pb.WatchEventsRequest(after_sequence=0), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            next(stream)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # who leads: a client of several head nodes asks it first, so a tenant may too
        # (without it, its calls waited on a hung node named first)
        leads = pb_grpc.HighAvailabilityStub(alice).GetLeadership(
            pb.GetLeadershipRequest(), timeout=10
        )
        assert leads.role == "leader" and leads.cannot_lead == ""

        # the operator sees and does everything, naming each job by its key NAME:ID
        every = {j.spec.id for j in o.ListJobs(pb.ListJobsRequest(), timeout=10).jobs}
        assert {"alice:role-a1", "alice:role-b1", "bob:role-b1", "ops:role-o1"} <= every
        got = o.GetJob(pb.GetJobRequest(id="bob:role-b1"), timeout=10).job
        assert got.spec.id == "bob:role-b1" and got.decision == bobs.decision
        code, details = code_of(o.GetJob, pb.GetJobRequest(id="role-b1"))
        assert code == grpc.StatusCode.NOT_FOUND and "NAME:ID" in details
        assert pb_grpc.ClusterStub(ops).ListServers(pb.ListServersRequest(), timeout=10).servers
        o.CancelJob(pb.CancelJobRequest(id="alice:role-a1"), timeout=30)
    finally:
        for c in (alice, bob, ops):
            c.close()

    # the store records who submitted what
    db = sqlite3.connect(Path(mtls_daemon.config).parent / "data" / "oasis.db")
    try:
        rows = dict(db.execute("SELECT id, submitter FROM jobs WHERE id LIKE '%:role-%'"))
        cancels = dict(db.execute("SELECT job_id, detail FROM events WHERE kind = 'cancelled'"))
    finally:
        db.close()
    assert rows == {"alice:role-a1": "alice", "alice:role-b1": "alice", "bob:role-b1": "bob",
                    "bob:role-b2": "bob", "ops:role-o1": "ops"}  # fmt: skip
    # ... and who cancelled what
    assert {job: json.loads(detail)["by"] for job, detail in cancels.items()} == {
        "bob:role-b2": "bob",
        "alice:role-a1": "ops",
    }


def test_cli_with_tls_and_token(mtls_daemon: Daemon, pki: Pki, tmp_path: Path) -> None:
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert),
           "--tls-key", str(pki.client_key)]  # fmt: skip
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job("cli-b1")))
    out = oasis("submit", str(spec), "--json", *tls, "--token", TOKENS["bob"],
                server=mtls_daemon.address)  # fmt: skip
    assert json.loads(out.stdout)["id"] == "cli-b1"
    # the token from the environment
    env = {**os.environ, "OASIS_TOKEN": TOKENS["bob"]}
    cmd = [sys.executable, "-m", "controller.cli", "jobs", "--json", *tls,
           "--server", mtls_daemon.address]  # fmt: skip
    listed = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False
    )
    assert listed.returncode == 0, listed.stderr
    ids = {j["spec"]["id"] for j in json.loads(listed.stdout)["jobs"]}
    assert "cli-b1" in ids and all(i.startswith(("cli-b", "role-b")) for i in ids)  # bob's
    # a submitter asking for servers: the status and message, exit 1
    denied = oasis("servers", *tls, "--token", TOKENS["bob"], server=mtls_daemon.address,
                   check=False)  # fmt: skip
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr
    # said in the user's terms, not the call's path (/oasis.v1.Cluster/ListServers)
    assert (
        "bob's token is a submitter's: this command calls ListServers, which operators "
        "alone may call"
        in denied.stderr
        and "operator's token" in denied.stderr
    ), denied.stderr
    missing = oasis("jobs", *tls, server=mtls_daemon.address, check=False)
    assert missing.returncode == 1 and "UNAUTHENTICATED" in missing.stderr
    half = oasis("jobs", "--tls-cert", str(pki.client_cert), server=mtls_daemon.address,
                 check=False)  # fmt: skip
    assert half.returncode == 2 and "--tls-cert and --tls-key go together" in half.stderr


def test_a_token_with_its_line_end_calls_and_one_with_a_stray_character_is_named(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    """Found by the README audit: a token read from a file with Windows line ends
    (``$(cat token)`` keeps the ``\\r``), or pasted with a stray character, made every
    call ``INTERNAL: Invalid metadata`` (exit 1), naming neither the token nor the
    character. The whitespace around it is dropped, as the daemon drops it; any other
    character a header cannot carry is refused before any call, naming the option."""
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert),
           "--tls-key", str(pki.client_key)]  # fmt: skip
    cmd = [sys.executable, "-m", "controller.cli", "jobs", "--json", *tls,
           "--server", mtls_daemon.address]  # fmt: skip

    def jobs(token: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "OASIS_TOKEN": token}
        return subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False
        )

    listed = jobs(TOKENS["bob"] + "\r\n")
    assert listed.returncode == 0, listed.stdout
    for token, shown in (
        (f"{TOKENS['bob']}\x01", "'\\x01' at character"),
        ("t\u00f6ken", "'\u00f6'"),
    ):
        out = jobs(token)
        message = json.loads(out.stdout)["error"]["message"]
        assert out.returncode == 2 and message.startswith("--token (or $OASIS_TOKEN): holds")
        assert shown in message, message


def test_the_cli_verifies_the_daemon_under_tls_server_name(mtls_daemon: Daemon, pki: Pki) -> None:
    """The client's mutation audit: ``--tls-server-name`` could be dropped with every
    test passing. The daemon's certificate names localhost and 127.0.0.1: called at
    127.0.0.1, it is verified under the name given, and refused under another, saying
    so in words (gRPC's "Hostname Verification Check failed" was shown raw)."""
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key",
           str(pki.client_key), "--token", TOKENS["bob"], "--timeout", "5"]  # fmt: skip
    named = oasis("jobs", "--json", *tls, "--tls-server-name", "localhost",
                  server=mtls_daemon.address, check=False)  # fmt: skip
    assert named.returncode == 0, named.stderr
    other = oasis("jobs", *tls, "--tls-server-name", "elsewhere.example",
                  server=mtls_daemon.address, check=False)  # fmt: skip
    said = "the daemon's certificate does not hold the name it was called by (the --server"
    assert other.returncode == 1 and said in other.stderr, other.stderr
    assert "Hostname Verification" not in other.stderr  # gRPC's words, said in ours


def test_token_command_makes_a_line_the_daemon_reads(tmp_path: Path) -> None:
    out = oasis("token", "carol", "--role", "operator", "--json")
    made = json.loads(out.stdout)
    assert made["line"].split()[:2] == ["carol", "operator"]
    path = tmp_path / "tokens"
    path.write_text(made["line"] + "\n")
    tokens = load_tokens(path)
    caller = tokens[hash_token(made["token"])]
    assert (caller.name, caller.role) == ("carol", Role.OPERATOR)
    assert made["token"] not in path.read_text()
    bad = oasis("token", "no spaces allowed", check=False)
    assert bad.returncode == 2
    # --add-to appends the line itself (a new file 0640), and refuses a name twice
    added = tmp_path / "added"
    out = oasis("token", "ops", "--role", "operator", "--add-to", str(added))
    assert "added to" in out.stdout and (added.stat().st_mode & 0o777) == 0o640
    # made by root (as the daemon's "make it: oasis token ... --add-to" has it done), the
    # file is root:root, which oasisd run as its own user cannot read: said, with the chgrp
    made_by_root = os.geteuid() == 0 and added.stat().st_gid == 0
    assert ("0640 root:root" in out.stderr and f"chgrp oasis {added}" in out.stderr) == (
        made_by_root
    ), out.stderr
    again = oasis("token", "dana", "--add-to", str(added))
    assert "root:root" not in again.stderr, again.stderr  # not new: not said again
    assert [c.name for c in load_tokens(added).values()] == ["ops", "dana"]
    again = oasis("token", "dana", "--add-to", str(added), check=False)
    assert again.returncode == 2 and "'dana' has a token there already" in again.stderr
    assert len(added.read_text().splitlines()) == 2
    # a file an editor began with a byte-order mark: its first name is still its own
    added.write_bytes(b"\xef\xbb\xbf" + added.read_bytes())
    again = oasis("token", "ops", "--add-to", str(added), check=False)
    assert again.returncode == 2 and "'ops' has a token there already" in again.stderr
    oasis("token", "erin", "--add-to", str(added))
    assert [c.name for c in load_tokens(added).values()] == ["ops", "dana", "erin"]


def test_token_add_to_a_link_or_a_file_without_its_last_newline(tmp_path: Path) -> None:
    """``--add-to`` never writes through a symbolic link (a link planted where the
    tokens file goes would have the line land elsewhere), and a file whose last line has
    no newline (an editor's) gets the new line on a line of its own, not glued to it."""
    real = tmp_path / "elsewhere"
    real.write_text("")
    link = tmp_path / "tokens"
    link.symlink_to(real)
    out = oasis("token", "eve", "--add-to", str(link), check=False)
    assert out.returncode == 2 and f"--add-to {link}: " in out.stderr, out.stderr
    assert real.read_text() == ""
    first = oasis("token", "ann", "--json").stdout
    plain = tmp_path / "plain"
    plain.write_text(json.loads(first)["line"])  # no newline at its end
    oasis("token", "bob", "--add-to", str(plain))
    assert [c.name for c in load_tokens(plain).values()] == ["ann", "bob"]


def test_token_add_to_a_file_oasisd_would_refuse_adds_nothing(tmp_path: Path) -> None:
    """Found by the README audit: ``oasis token eve --add-to oasisd.toml`` (the config
    file named for its tokens file) appended a token line to the TOML, and the next
    start or restart of oasisd stopped on it, for every tenant. A file whose lines the
    daemon would not read as a tokens file is refused, naming the line; nothing added."""
    config = tmp_path / "oasisd.toml"
    config.write_text((ROOT / "config" / "oasisd.example.toml").read_text())
    before = config.read_bytes()
    out = oasis("token", "eve", "--add-to", str(config), check=False)
    assert out.returncode == 2, out.stderr
    assert f"--add-to {config}: line 7: expected 'NAME ROLE SHA256'" in out.stderr
    assert "not a tokens file oasisd reads; nothing added" in out.stderr
    assert config.read_bytes() == before
    broken = tmp_path / "tokens"
    broken.write_text("alice submitter abc\n")  # a hash cut short: the daemon refuses it
    out = oasis("token", "eve", "--add-to", str(broken), check=False)
    assert out.returncode == 2 and "line 1: the token's SHA-256 must be" in out.stderr
    assert broken.read_text() == "alice submitter abc\n"


def test_refusals_a_client_repeats_are_logged_once_in_a_while(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    """Before: one line per refusal, 400 KiB/s of log from one submitter calling an
    operator's method in a loop (and those calls drew on no rate at all)."""
    before = len(json_log(mtls_daemon.log_path))
    with mtls_channel(mtls_daemon, pki, TOKENS["alice"]) as channel:
        cluster = pb_grpc.ClusterStub(channel)
        for _ in range(200):
            code, _ = code_of(cluster.ListServers, pb.ListServersRequest())
            assert code == grpc.StatusCode.PERMISSION_DENIED
    with mtls_channel(mtls_daemon, pki, "not-a-token") as channel:
        for _ in range(200):
            code, _ = code_of(pb_grpc.AdmissionStub(channel).ListJobs, pb.ListJobsRequest())
            assert code == grpc.StatusCode.UNAUTHENTICATED
    lines = json_log(mtls_daemon.log_path)[before:]
    denied = [e for e in lines if e.get("event") == "permission denied"]
    unknown = [e for e in lines if e.get("why") == "bad token"]
    # at most one line per 10 s for each (caller or peer, reason): two if the run
    # crossed such a boundary; none if another test's refusal of the same kind was
    # logged within the 10 s (this module shares one daemon)
    assert len(denied) <= 2 and len(unknown) <= 2, (len(denied), len(unknown))
    logged = [e for e in json_log(mtls_daemon.log_path) if e.get("event") == "permission denied"]
    assert any(e["peer"] == "alice" and "suppressed" in e for e in logged), logged


# -- configuration -------------------------------------------------------------------------


def test_plaintext_on_a_non_loopback_address_is_refused_at_start(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", tmp_path / "d")
    config.write_text(config.read_text().replace('listen = "127.0.0.1:0"', 'listen = "0.0.0.0:0"'))
    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "daemon.listen: 0.0.0.0:0 is not a loopback address" in out.stderr
    assert "allow_insecure_remote" in out.stderr
    # the same through --listen over a loopback config (never bound: refused before)
    loopback = write_config(tmp_path / "l.toml", tmp_path / "d")
    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(loopback), "--listen",
         "192.0.2.1:0"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "192.0.2.1:0 is not a loopback address" in out.stderr


def test_metrics_off_loopback_are_refused_at_start_unless_allowed(tmp_path: Path) -> None:
    """/metrics is plain HTTP without tokens: off loopback only when the config says so
    (accepted then: tests/test_metrics.py; never bound here, tests stay on loopback)."""
    metrics = '\n[metrics]\nlisten = "0.0.0.0:0"\n'
    config = write_config(tmp_path / "c.toml", tmp_path / "d", extra=metrics)
    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (
        "oasisd: metrics.listen: 0.0.0.0:0 is not a loopback address: the metrics endpoint "
        "is plain HTTP without authentication; set metrics.allow_insecure_remote = true to "
        "serve it to the network"
    )


def _config(daemon: str = "", extra: str = "") -> dict[str, Any]:
    import tomllib

    return tomllib.loads(f"[daemon]\n{daemon}\n{extra}\n{CLUSTER_TOML}")


def test_exposure_rules(pki: Pki) -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "[2001:db8::1]", "oasis.example.com",
                 "::ffff:203.0.113.7", "::ffff:0.0.0.0"):  # fmt: skip
        assert not is_loopback(host), host
    with pytest.raises(SpecError, match="not a loopback address"):
        check_exposure("[::]:50051", None, allow_insecure_remote=False)
    check_exposure("[::]:50051", None, allow_insecure_remote=True)
    tls = tls_from_dict({"cert": str(pki.server_cert), "key": str(pki.server_key)})
    assert tls is not None and not tls.mutual
    check_exposure("0.0.0.0:50051", tls, allow_insecure_remote=False)
    assert "PRIVATE" not in repr(tls)  # the key stays out of logs
    # through the config file
    allowed = from_dict(_config('listen = "0.0.0.0:1"\nallow_insecure_remote = true'))
    assert allowed.allow_insecure_remote and allowed.tls is None
    with pytest.raises(ConfigError, match=r"daemon.listen: 0\.0\.0\.0:1 is not a loopback"):
        from_dict(_config('listen = "0.0.0.0:1"'))
    with pytest.raises(ConfigError, match="allow_insecure_remote: must be true or false"):
        from_dict(_config("allow_insecure_remote = 1"))
    tls_table = f'[tls]\ncert = "{pki.server_cert}"\nkey = "{pki.server_key}"'
    assert from_dict(_config('listen = "0.0.0.0:1"', tls_table)).tls is not None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[tls]\ncert = "x.crt"', "tls: needs both cert and key"),
        ('[tls]\ncert = "/nonexistent.crt"\nkey = "/nonexistent.key"', "tls.cert: cannot read"),
        ('[tls]\ncert = "{key}"\nkey = "{key}"', "tls.cert: .* holds no PEM CERTIFICATE"),
        ('[tls]\ncert = "{cert}"\nkey = "{cert}"', "tls.key: .* holds no PEM PRIVATE KEY"),
        ('[tls]\ncert = "{cert}"\nkey = "{key}"\nca = "x"', "tls.ca: unknown key"),
        ('[tls]\ncert = "{cert}"\nkey = "{other_key}"', "tls.key: .* is not the key of"),
        ('[auth]\ntokens_file = "/nonexistent"', "auth.tokens_file: cannot read"),
        ("[auth]\nusers = 1", "auth.users: unknown key"),
        ("[auth]\n# tokens_file commented out", "auth.tokens_file: is required"),
    ],
)
def test_bad_security_config_names_the_key(pki: Pki, table: str, message: str) -> None:
    table = table.format(cert=pki.server_cert, key=pki.server_key, other_key=pki.client_key)
    with pytest.raises(ConfigError, match=message):
        from_dict(_config("", table))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no token"),
        ("alice submitter", "line 1: expected 'NAME ROLE SHA256'"),
        ("alice admin " + "0" * 64, "line 1: role must be 'submitter' or 'operator'"),
        ("alice submitter abc", "line 1: the token's SHA-256 must be 64 hex digits"),
        ("al ice submitter " + "0" * 64, "line 1: expected"),
        (f"a operator {'0' * 64}\na submitter {'1' * 64}", "line 2: name 'a' appears twice"),
        (f"a operator {'0' * 64}\nb submitter {'0' * 64}", "line 2: the same token appears"),
    ],
)
def test_bad_tokens_file_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_tokens(path)


def test_tokens_file_comments_and_case(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    digest = hash_token("t0k3n").upper()
    path.write_text(f"# operators\n\n  ops   operator  {digest}   # the on-call\n")
    assert load_tokens(path) == {digest.lower(): load_tokens(path)[digest.lower()]}
    assert load_tokens(path)[hash_token("t0k3n")].name == "ops"


def test_a_token_demoted_or_renamed_by_a_reload_no_longer_holds() -> None:
    """What an open stream (WatchEvents, the console) checks after a reload
    (:func:`controller.auth.holds`): the same token, now a submitter's, or another
    name's, ends what the operator it was opened; only the same name and role go on
    (the mutation audit: the role's part of the check could be dropped, every test
    passing, and a demoted operator's open event stream kept every tenant's events
    flowing to it)."""
    from controller.auth import Caller, holds

    digest = hash_token("t0k3n")
    ops = Caller("ops", Role.OPERATOR, token=digest)
    assert holds(None, ops)  # no authentication: everyone may
    assert holds({digest: Caller("ops", Role.OPERATOR, token=digest)}, ops)
    assert not holds({digest: Caller("ops", Role.SUBMITTER, token=digest)}, ops)
    assert not holds({digest: Caller("eve", Role.OPERATOR, token=digest)}, ops)
    assert not holds({}, ops)


def test_each_token_is_its_own_client_and_turn_whatever_host_it_calls_from() -> None:
    """The caller the interceptor admits: a token's name keys its rate limit
    (``client``) and its turns and ``limits.max_in_flight`` cap (``turn``), so two
    tenants calling from one host (every client on the head node is 127.0.0.1) never
    share a bucket or a cap. The mutation audit: ``turn`` left empty (every tenant
    uncapped, first come first served) or ``client`` the peer's host passed every test;
    the daemon tests leave the cap to timing."""
    import asyncio

    from controller.auth import AccessInterceptor, Caller

    alice, bob = hash_token("alice-token"), hash_token("bob-token")
    tokens = {alice: Caller("alice", Role.SUBMITTER, token=alice, client="alice", turn="alice"),
              bob: Caller("bob", Role.SUBMITTER, token=bob, client="bob", turn="bob")}  # fmt: skip

    class Context:
        def __init__(self, token: str) -> None:
            self.token = token

        def invocation_metadata(self) -> Any:
            return (("authorization", f"Bearer {self.token}"),)

        def peer(self) -> str:
            return "ipv4:127.0.0.1:50000"

        async def abort(self, code: Any, details: str) -> None:
            raise AssertionError(f"refused: {code} {details}")

    access = AccessInterceptor(tokens, None)
    submit = "/oasis.v1.Admission/SubmitJob"
    a = asyncio.run(access._admit(submit, Context("alice-token")))
    b = asyncio.run(access._admit(submit, Context("bob-token")))
    assert (a.client, a.turn, a.owner) == ("alice", "alice", "alice")
    assert (b.client, b.turn, b.owner) == ("bob", "bob", "bob")


def test_why_the_store_refuses_writes_is_an_operators_to_read() -> None:
    """GetLeadership's ``writes_refused`` (and the console's): the store's words name
    roles, settings and paths, so a tenant (who may ask who leads) reads only that
    writes are refused; the same for why it is down and which lock its writes wait for."""
    from types import SimpleNamespace

    from controller.auth import Caller
    from controller.store.lock_waits import LOCK_HELP
    from controller.store_trouble import StoreTrouble, store_trouble

    why = "permission denied for table jobs: GRANT INSERT ON jobs TO oasis"
    down = "connection to server at 10.0.0.5, port 5432 failed: timeout expired"
    db: Any = SimpleNamespace(down_reason=down, refusing=why, writes_locked="database is locked")
    ops, alice = Caller("ops", Role.OPERATOR), Caller("alice", Role.SUBMITTER)
    assert store_trouble(db, ops) == StoreTrouble(down, why, f"database is locked: {LOCK_HELP}")
    assert store_trouble(db, alice) == StoreTrouble(
        "the store is unavailable", "the store refuses writes", "the store's writes wait for a lock"
    )
    well: Any = SimpleNamespace(down_reason="", refusing="", writes_locked="")
    assert store_trouble(well, alice) == store_trouble(well, ops) == StoreTrouble("", "", "")


def test_get_leadership_says_the_stores_trouble_as_its_caller_may_read_it() -> None:
    """GetLeadership (``oasis status``, which a submitter may call) passes its caller to
    :func:`store_trouble`: a submitter reads that the store is out, refuses writes or
    waits for a lock, never the host, role or setting it names; an operator reads them.
    The mutation audit: the store's own words put in the answer passed every test."""
    import asyncio
    from types import SimpleNamespace

    from controller.auth import Caller, _caller
    from controller.servicer import HighAvailabilityServicer

    down = "connection to server at 10.0.0.5, port 5432 failed: password authentication"
    why = "permission denied for table jobs: GRANT INSERT ON jobs TO oasis"
    ha = SimpleNamespace(role="standalone", epoch=1, lease_age=0.0, leader="", applied=0)
    controller: Any = SimpleNamespace(
        ha_status=lambda: ha, draining=False, config=SimpleNamespace(ha=None), advertise="",
        cannot_lead="", leading=True,
        db=SimpleNamespace(down_reason=down, refusing=why, writes_locked="database is locked"),
    )  # fmt: skip
    servicer = HighAvailabilityServicer(controller)

    def leadership(caller: Caller) -> tuple[str, str, str]:
        async def call() -> pb.GetLeadershipResponse:
            _caller.set(caller)
            return await servicer.GetLeadership(pb.GetLeadershipRequest(), None)

        got = asyncio.run(call())
        return got.store_down, got.writes_refused, got.writes_locked

    assert leadership(Caller("alice", Role.SUBMITTER)) == (
        "the store is unavailable", "the store refuses writes", "the store's writes wait for a lock"
    )  # fmt: skip
    operator = leadership(Caller("ops", Role.OPERATOR))
    assert operator[:2] == (down, why) and operator[2].startswith("database is locked: ")
