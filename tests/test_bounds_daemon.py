"""Price bounds in the daemon (issue 11), end to end: oasisd as a subprocess on loopback,
a real gRPC channel and the ``oasis`` CLI.

- poisoning: one job at priority 1e6, or 1e308 (with ``limits.max_utility`` off), among
  ordinary ones costs the ordinary jobs at most 10% of the admissions they get without
  it, moves the bounds by a bounded factor, and neither a cancel nor a restart brings
  it back (the estimate is stored, not recomputed from stored jobs);
- replay of the same trace with the same prior decides exactly as the daemon;
- ``oasis bounds``: show, pin, unpin, reset, operators only, recorded in the event log
  and kept across a restart;
- ``limits.max_utility``: over it, INVALID_ARGUMENT naming the field and the cap.

The ordinary jobs all arrive in slot 1 (the daemon's epoch is now), 40 of them on the
small test cluster, so they contend: about a quarter are admitted.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from controller.auth import hash_token
from controller.commands.bounds import as_dict
from controller.convert import spec_to_proto
from controller.limits import DEFAULT_MAX_UTILITY, Limits, limits_from_dict
from controller.replay import replay
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from pricing import SpecError, job_from_dict
from pricing.bound_estimate import STEP
from pricing.cluster import cluster_from_dict
from pricing.trace import trace_from_dict
from pricing.workload import generate_trace
from tests.servers import (
    CLUSTER_TOML,
    ROOT,
    SMALL_JOB,
    Daemon,
    json_log,
    oasis,
    write_config,
)

CLUSTER_RAW = tomllib.loads(CLUSTER_TOML)["cluster"]
WINDOW = 24  # tests.servers.write_config
N_ORDINARY = 40
TRIM = 0.3


def ordinary_jobs(n: int, seed: int = 7, prefix: str = "o") -> list[dict[str, Any]]:
    """``n`` jobs of priority 50-100 (the issue's "ordinary" jobs) of assorted sizes."""
    rng = random.Random(seed)
    return [
        {
            **SMALL_JOB,
            "id": f"{prefix}{i}",
            "epochs": rng.randint(1, 3),
            "chunks": rng.randint(6, 30),
            "minibatches": rng.randint(40, 120),
            "worker": {
                "gpu": rng.choice([1, 1, 2]),
                "cpu": 4,
                "mem": 16,
                "disk": 5,
                "bandwidth": rng.choice([1, 2, 3]),
            },
            "utility": {
                "kind": "sigmoid",
                "priority": round(rng.uniform(50, 100), 2),
                "decay": 0.3,
                "target": rng.randint(3, 10),
            },
        }
        for i in range(n)
    ]


def poison(priority: float) -> dict[str, Any]:
    """One 1-GPU-worker job whose utility is ``priority`` (the issue's repro)."""
    utility = {"kind": "sigmoid", "priority": priority, "decay": 0.5, "target": 3}
    return {**SMALL_JOB, "id": "poison", "chunks": 4, "utility": utility}


ORDINARY = ordinary_jobs(N_ORDINARY)


def _start(tmp: Path, extra: str = "", epoch: float | None = None) -> Daemon:
    config = write_config(tmp / "oasisd.toml", tmp / "data", epoch=epoch, extra=extra)
    return Daemon(config, tmp / "oasisd.log").start()


def _stubs(address: str) -> tuple[grpc.Channel, Any, Any]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.AdmissionStub(channel), pb_grpc.ClusterStub(channel)


def _submit_all(address: str, jobs: list[dict[str, Any]]) -> dict[str, pb.Decision]:
    channel, admission, _ = _stubs(address)
    with channel:
        return {
            j["id"]: admission.SubmitJob(
                pb.SubmitJobRequest(job=spec_to_proto(j)), timeout=60
            ).job.decision
            for j in jobs
        }


def _bounds(address: str) -> dict[tuple[int, str], tuple[float, float, str]]:
    channel, _, cluster = _stubs(address)
    with channel:
        reply = cluster.GetBounds(pb.GetBoundsRequest(), timeout=30)
    return {(b.kind, b.resource): (b.upper, b.lower, b.how) for b in reply.bounds}


def _log_ratio(a: dict[Any, Any], b: dict[Any, Any]) -> float:
    """The largest ``|log (x / y)|`` over the U and L of every resource of both."""
    return max(abs(math.log(a[k][i] / b[k][i])) for k in a for i in (0, 1))


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, Any]]]:
    """A daemon with the default limits that decided the ordinary jobs alone (the
    decisions mix admissions, rejections priced out and ones that cannot fit)."""
    d = _start(tmp_path_factory.mktemp("clean"))
    try:
        yield d, _submit_all(d.address, ORDINARY)
    finally:
        assert d.stop() == 0, d.log_path.read_text()


# -- poisoning -----------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [1e6, 1e308])
def test_one_poisoned_job_costs_ordinary_jobs_little_and_does_not_come_back(
    tmp_path: Path, clean: tuple[Daemon, dict[str, Any]], priority: float
) -> None:
    clean_daemon, clean_decisions = clean
    clean_admitted = sum(d.admitted for d in clean_decisions.values())
    assert 5 <= clean_admitted <= N_ORDINARY - 5, "the ordinary jobs should contend"

    d = _start(tmp_path, extra="[limits]\nmax_utility = 0\n")  # the poison is let in
    try:
        stream = [*ORDINARY[:3], poison(priority), *ORDINARY[3:]]
        decisions = _submit_all(d.address, stream)
        assert decisions["poison"].admitted  # above U it pays the top price; it fits
        admitted = sum(v.admitted for k, v in decisions.items() if k != "poison")
        assert admitted >= 0.9 * clean_admitted, (admitted, clean_admitted)
        # one job moves U and L by at most e^STEP; the two histograms differ by it
        before = _bounds(d.address)
        assert _log_ratio(before, _bounds(clean_daemon.address)) <= 2 * STEP + 1e-9

        channel, admission, _ = _stubs(d.address)
        with channel:
            admission.CancelJob(pb.CancelJobRequest(id="poison"), timeout=30)
        assert _bounds(d.address) == before  # a cancel does not change the estimate
        d.stop()
        d.start()
        assert _bounds(d.address) == before  # nor does a restart: the state is stored
        # the restarted daemon still prices an ordinary job (finitely)
        late = ordinary_jobs(1, seed=99, prefix="late")[0]
        channel, admission, _ = _stubs(d.address)
        with channel:
            quote = admission.QuoteJob(pb.QuoteJobRequest(job=spec_to_proto(late)), timeout=30)
        assert math.isfinite(quote.decision.payoff)
    finally:
        assert d.stop() == 0, d.log_path.read_text()


# -- replay equals the daemon --------------------------------------------------------------


def test_replay_with_the_prior_decides_as_the_daemon(
    clean: tuple[Daemon, dict[str, Any]],
) -> None:
    _, decisions = clean
    trace = trace_from_dict(
        {
            "version": 1,
            "horizon": WINDOW + 1,  # slot 0 now; arrival 1; planned up to slot 24
            "slot_seconds": 3600,
            **CLUSTER_RAW,
            "pricing": {"bounds": "estimate", "trim": TRIM, "prior": "default"},
            "jobs": [{**j, "arrival": 1} for j in ORDINARY],
        }
    )
    for record in replay(trace):
        mine = record.decision
        theirs = decisions[mine.job.id]
        # bit for bit: the same bounds before each decision, so the same prices
        assert theirs.admitted == mine.admitted, mine.job.id
        assert (theirs.payoff if theirs.HasField("payoff") else None) == mine.best.payoff
        assert theirs.reason == record.reason
        if mine.admitted:
            assert theirs.completion_slot == mine.best.completion_slot


# -- oasis bounds: show, pin, unpin, reset -------------------------------------------------

TOKENS = {"ops": ("operator", "ops-token-1"), "sam": ("submitter", "sam-token-2")}


def _cli(daemon: Daemon, *args: str, check: bool = True) -> Any:
    out = oasis("bounds", *args, "--token", TOKENS["ops"][1], server=daemon.address, check=check)
    return out if not check else json.loads(out.stdout) if "--json" in args else out.stdout


def _rpc(daemon: Daemon, action: str = "") -> dict[str, Any]:
    """GetBounds, or SetBounds with ``action`` and no pins, as ``oasis bounds --json``."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.ClusterStub(channel)
        meta = (("authorization", f"Bearer {TOKENS['ops'][1]}"),)
        if not action:
            return as_dict(stub.GetBounds(pb.GetBoundsRequest(), metadata=meta, timeout=30))
        request = pb.SetBoundsRequest(action=action)
        return as_dict(stub.SetBounds(request, metadata=meta, timeout=30).bounds)


def _price(daemon: Daemon, server: str, resource: str, slot: int) -> float:
    channel = grpc.insecure_channel(daemon.address)
    with channel:
        stub = pb_grpc.ClusterStub(channel)
        meta = (("authorization", f"Bearer {TOKENS['ops'][1]}"),)
        reply = stub.GetPrices(
            pb.GetPricesRequest(first_slot=slot, slots=1, server=server), metadata=meta, timeout=30
        )
    return float(next(p.prices[0] for p in reply.prices if p.resource == resource))


def test_bounds_show_pin_unpin_reset_recorded_and_kept(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {r} {hash_token(t)}\n" for n, (r, t) in TOKENS.items()))
    d = _start(tmp_path, extra=f'[auth]\ntokens_file = "{tokens}"\n')
    try:
        shown = _cli(d, "--json")
        assert (shown["mode"], shown["jobs"], shown["prior_share"]) == ("estimate", 0, 1.0)
        assert shown["prior"].startswith("oasis gen")  # the shipped default prior
        assert {b["how"] for b in shown["bounds"]} == {"prior"}
        assert "prior" in _cli(d)  # the table
        # no row for a resource no server of the kind has (PS servers have no gpu)
        listed = {(b["kind"], b["resource"]) for b in shown["bounds"]}
        assert ("worker", "gpu") in listed and ("ps", "gpu") not in listed

        # a submitter may neither read nor change them
        sam = grpc.insecure_channel(d.address)
        with sam:
            stub = pb_grpc.ClusterStub(sam)
            meta = (("authorization", f"Bearer {TOKENS['sam'][1]}"),)
            calls = [
                (stub.GetBounds, pb.GetBoundsRequest()),
                (stub.SetBounds, pb.SetBoundsRequest(action="reset")),
            ]
            for call, request in calls:
                with pytest.raises(grpc.RpcError) as err:
                    call(request, metadata=meta, timeout=30)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

        pinned = _cli(d, "pin", "--upper", "gpu=1000", "--lower", "worker.gpu=0.5", "--json")
        rows = {(b["kind"], b["resource"]): b for b in pinned["bounds"]}
        assert rows["worker", "gpu"]["how"] == "pinned"
        assert (
            rows["worker", "gpu"]["U"] == pytest.approx(1000) and rows["worker", "gpu"]["L"] == 0.5
        )
        assert rows["ps", "gpu"]["how"] == "pinned U" and rows["ps", "cpu"]["how"] == "prior"
        # the ledger prices with them: an empty slot costs L
        assert _price(d, "w2", "gpu", 20) == pytest.approx(0.5)

        bad = _cli(d, "pin", "--upper", "gpu=0.1", "--lower", "gpu=1", check=False)
        assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr and "below L" in bad.stderr

        channel, admission, _ = _stubs(d.address)
        with channel:
            meta = (("authorization", f"Bearer {TOKENS['ops'][1]}"),)
            request = pb.SubmitJobRequest(job=spec_to_proto(ORDINARY[0]))
            admission.SubmitJob(request, metadata=meta, timeout=60)
        d.stop()
        d.start()  # pins and the estimate survive a restart
        kept = _rpc(d)
        assert kept["jobs"] == 1 and kept["pins"] == pinned["pins"]
        assert 0.9 < kept["prior_share"] < 1  # 40 jobs' worth of prior, one job
        assert _price(d, "w2", "gpu", 20) == pytest.approx(0.5)

        unpinned = _rpc(d, "unpin")
        assert unpinned["pins"] == {} and {b["how"] for b in unpinned["bounds"]} == {"observed"}
        # nothing pinned there: said, and no "unpin" event of nothing (the events below)
        assert _cli(d, "unpin", "cpu").startswith("cpu: not pinned; nothing changed\n\n")
        assert _cli(d, "unpin").startswith("nothing is pinned; nothing changed\n")
        assert _cli(d, "unpin", "cpu", "--json")["pins"] == {}
        typo = _cli(d, "unpin", "GPU", check=False)  # still the daemon's to refuse
        assert typo.returncode == 2 and "unknown resource 'GPU'" in typo.stderr
        assert _price(d, "w2", "gpu", 20) != pytest.approx(0.5)
        reset = _rpc(d, "reset")
        assert reset["jobs"] == 0 and {b["how"] for b in reset["bounds"]} == {"prior"}
        assert [(b["U"], b["L"]) for b in reset["bounds"]] == [
            (b["U"], b["L"]) for b in shown["bounds"]
        ]

        channel, admission, _ = _stubs(d.address)
        with channel:
            meta = (("authorization", f"Bearer {TOKENS['ops'][1]}"),)
            events = admission.WatchEvents(
                pb.WatchEventsRequest(after_sequence=0), metadata=meta, timeout=30
            )
            seen = []
            for e in events:  # the stored events first: stop at the last change
                if e.kind == "bounds":
                    seen.append(json.loads(e.detail))
                    if seen[-1]["action"] == "reset":
                        events.cancel()
                        break
        assert [(e["action"], e["by"]) for e in seen] == [
            ("pin", "ops"),
            ("unpin", "ops"),
            ("reset", "ops"),
        ]
        assert seen[0]["pins"]["worker"]["gpu"] == {"U": 1000, "L": 0.5}
    finally:
        assert d.stop() == 0, d.log_path.read_text()


# -- limits.max_utility --------------------------------------------------------------------


def test_a_job_over_max_utility_is_refused_naming_the_field(
    clean: tuple[Daemon, dict[str, Any]],
) -> None:
    daemon, _ = clean
    cases = [
        ({"kind": "sigmoid", "priority": 2e9, "decay": 0.1, "target": 10}, "job.utility.priority"),
        ({"kind": "deadline", "value": 1e300, "deadline": 10}, "job.utility.value"),
        ({"kind": "table", "values": [1e10, 5e9]}, "job.utility.values"),
    ]
    channel, admission, _ = _stubs(daemon.address)
    with channel:
        for utility, field in cases:
            spec = {**SMALL_JOB, "id": "rich", "utility": utility}
            for call, request in (
                (admission.QuoteJob, pb.QuoteJobRequest(job=spec_to_proto(spec))),
                (admission.SubmitJob, pb.SubmitJobRequest(job=spec_to_proto(spec))),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    call(request, timeout=30)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in (err.value.details() or "")
                assert "limits.max_utility = 1e+09" in (err.value.details() or "")
        # just under the cap is decided
        spec = {**SMALL_JOB, "id": "rich", "utility": {"kind": "deadline", "value": 9e8,
                                                       "deadline": 10}}  # fmt: skip
        admission.QuoteJob(pb.QuoteJobRequest(job=spec_to_proto(spec)), timeout=30)


def test_the_default_cap_refuses_no_generated_job() -> None:
    """``oasis gen`` traces (the paper's setting) pass the default cap by far."""
    assert Limits().max_utility == DEFAULT_MAX_UTILITY
    trace = generate_trace(
        np.random.default_rng(5), n_jobs=300, n_worker_servers=10, n_ps_servers=10, horizon=300
    )
    cluster = cluster_from_dict(trace["resources"], trace["servers"])
    best = 0.0
    for raw in trace["jobs"]:  # type: ignore[attr-defined]
        job = job_from_dict(raw, cluster, slot_seconds=3600, slots_available=lambda _a: 1 << 20)
        Limits().check_utility(job)
        best = max(best, job.best_utility)
    assert best < DEFAULT_MAX_UTILITY / 1e6


def test_limits_max_utility_config() -> None:
    assert limits_from_dict({"max_utility": 0}).max_utility == 0
    with pytest.raises(SpecError, match=r"limits\.max_utility: must be >= 0"):
        limits_from_dict({"max_utility": -1})


# -- a pending job decided again past its deadline ------------------------------------------


def test_a_pending_job_past_its_deadline_expires_cleanly(tmp_path: Path) -> None:
    """One-second slots; a valuable job takes every GPU for the next slots, so a job with
    a deadline waits, and is decided again at every boundary until its utility is 0 at
    every completion time (the case that could overflow a bound): then it expires with
    the reason, and nothing fails."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data")
    config.write_text(config.read_text().replace("slot_seconds = 3600", "slot_seconds = 1"))
    d = Daemon(config, tmp_path / "oasisd.log").start()
    small = {"epochs": 1, "chunks": 2, "minibatches": 4, "tau": 0.5, "grad_mb": 0.001}
    try:
        with grpc.insecure_channel(d.address) as channel:
            admission = pb_grpc.AdmissionStub(channel)
            filler = {**SMALL_JOB, **small, "id": "filler", "chunks": 16, "minibatches": 16,
                      "utility": {"kind": "sigmoid", "priority": 1e4, "decay": 0.1,
                                  "target": 8}}  # fmt: skip
            request = pb.SubmitJobRequest(job=spec_to_proto(filler))
            assert admission.SubmitJob(request, timeout=30).job.decision.admitted
            utility = {"kind": "deadline", "value": 40, "deadline": 4}
            spec = {**SMALL_JOB, **small, "id": "late", "utility": utility}
            request = pb.SubmitJobRequest(job=spec_to_proto(spec), wait_seconds=30)
            job = admission.SubmitJob(request, timeout=30).job
            assert job.state == pb.JOB_STATE_PENDING, job.decision.reason
            deadline = time.monotonic() + 30
            while job.state == pb.JOB_STATE_PENDING and time.monotonic() < deadline:
                time.sleep(0.5)
                job = admission.GetJob(pb.GetJobRequest(id="late"), timeout=30).job
            assert job.state == pb.JOB_STATE_EXPIRED, job
            assert "no longer pay off" in job.decision.reason
            # the daemon still decides
            quote = admission.QuoteJob(
                pb.QuoteJobRequest(job=spec_to_proto({**spec, "id": "q", "utility": {
                    "kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3}})),
                timeout=30,
            )  # fmt: skip
            assert math.isfinite(quote.decision.payoff)
    finally:
        assert d.stop() == 0, d.log_path.read_text()
    errors = [e for e in json_log(d.log_path) if e.get("level") in ("error", "critical")]
    assert errors == [], errors[:3]


# -- [pricing] prior -----------------------------------------------------------------------


def test_pricing_prior_config(tmp_path: Path) -> None:
    """``default`` (also when absent), ``none``, or a calibrate file relative to the
    config's folder; a bad file is one clear line at start, naming the key and file."""
    from controller.config import ConfigError, load
    from pricing.bound_estimate import calibrate
    from pricing.default_prior import default_prior

    def config(prior: str) -> Path:
        path = write_config(tmp_path / "oasisd.toml", tmp_path / "data")
        text = path.read_text()
        if prior:
            text = text.replace("[cluster]", f"[pricing]\nprior = {prior}\n\n[cluster]")
        path.write_text(text)
        return path

    assert load(config("")).pricing.prior is default_prior()
    assert load(config('"default"')).pricing.prior is default_prior()
    assert load(config('"none"')).pricing.prior is None
    cluster = load(config("")).cluster
    jobs = [
        job_from_dict(j, cluster, slot_seconds=3600, slots_available=lambda _a: 24, arrival=1)
        for j in ORDINARY
    ]
    (tmp_path / "priors").mkdir()
    mine = calibrate(jobs, cluster, source="ordinary jobs")
    (tmp_path / "priors" / "p.json").write_text(json.dumps(mine.to_dict()))
    assert load(config('"priors/p.json"')).pricing.prior == mine

    (tmp_path / "priors" / "bad.json").write_text('{"kind": "oasis-bound-prior"}')
    for name, message in (
        ("priors/bad.json", "is not a prior of oasis calibrate: prior.version: must be 1"),
        ("priors/missing.json", "cannot read"),
    ):
        with pytest.raises(ConfigError, match=r"pricing\.prior: ") as err:
            load(config(f'"{name}"'))
        assert message in str(err.value) and str(tmp_path / name) in str(err.value)
        if name != "priors/bad.json":
            continue  # one start of the daemon shows how the error reaches the operator
        out = subprocess.run(
            [sys.executable, "-m", "controller.daemon", "--config", str(config(f'"{name}"'))],
            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        )  # fmt: skip
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("oasisd: pricing.prior: ") and message in out.stderr


# -- pins and explicit bounds, in process -----------------------------------------------------


def test_pins_are_validated_and_put_over_the_bounds() -> None:
    from controller.pins import Pins, pins_from_dict
    from pricing.prices import PriceBounds

    resources = ("gpu", "cpu")
    estimated = PriceBounds(np.log([5.0, 5.0]), np.log([2.0, 2.0]), math.log(0.1), 0.0, 1, 1)
    assert Pins().apply(estimated, resources) is estimated
    pins = pins_from_dict({"worker": {"gpu": {"U": 10, "L": 1}}, "ps": {"cpu": {"L": 7}}},
                          resources)  # fmt: skip
    got = pins.apply(estimated, resources)
    assert np.allclose(np.exp(got.log_u1), [10, 5]) and np.allclose(np.exp(got.floor1), [1, 0.1])
    # L pinned above the estimated U raises U to it
    assert np.allclose(np.exp(got.log_u2), [2, 7]) and np.allclose(np.exp(got.floor2), [1, 7])
    assert (
        pins.merged(pins_from_dict({"worker": {"gpu": {"U": 20}}}, resources)).get(
            "worker", "gpu", "U"
        )
        == 20
    )
    assert not pins.without(None, "gpu").without("ps", "cpu")
    for raw, message in (
        ({"gpus": {}}, "pins.gpus: must be one of"),
        ({"worker": {"tpu": {"U": 1}}}, "pins.worker.tpu: unknown resource"),
        ({"worker": {"gpu": {"U": 0}}}, "pins.worker.gpu.U: must be > 0"),
        ({"worker": {"gpu": {"U": math.inf}}}, "pins.worker.gpu.U"),
        ({"worker": {"gpu": {"L": math.nan}}}, "pins.worker.gpu.L"),
        ({"worker": {"gpu": {"X": 1}}}, 'must be an object with "U" and/or "L"'),
        ({"worker": {"gpu": {"U": 1, "L": 2}}}, "worker.gpu: U = 1 is below L = 2"),
        ([1], "pins"),
    ):
        with pytest.raises(SpecError) as err:
            pins_from_dict(raw, resources)
        assert message in str(err.value), (raw, str(err.value))
    with pytest.raises(SpecError, match="below L"):
        pins.merged(pins_from_dict({"worker": {"gpu": {"U": 0.5}}}, resources))


def test_explicit_bounds_show_as_explicit_and_have_no_estimate_to_reset(tmp_path: Path) -> None:
    from controller.clock import FakeClock
    from controller.errors import PreconditionError
    from tests.test_pending import controller

    explicit = (
        '[pricing]\nbounds = "explicit"\nL1 = 0.01\nL2 = 0.01\n'
        "U1 = {gpu = 50.0}\nU2 = {cpu = 5.0}\n"
    )
    c = controller(tmp_path, FakeClock(1_000_000.0), extra=explicit)
    try:
        view = c._bounds_view()
        assert view["mode"] == "explicit" and view["prior"] == "none"
        rows = {(b["kind"], b["resource"]): b for b in view["bounds"]}
        assert rows["worker", "gpu"]["how"] == "explicit"
        assert rows["worker", "gpu"]["U"] == pytest.approx(50)
        with pytest.raises(PreconditionError, match="explicit"):
            c._set_bounds_sync("reset", None, "ops")
        after, events = c._set_bounds_sync("pin", {"worker": {"gpu": {"U": 60}}}, "ops")
        assert next(b["how"] for b in after["bounds"]) == "pinned U"
        assert events[0].kind == "bounds" and events[0].detail["action"] == "pin"
        with pytest.raises(SpecError, match="action: must be one of"):
            c._set_bounds_sync("forget", None, "ops")
    finally:
        c.close()


def test_a_stored_estimate_of_other_servers_or_units_starts_afresh(tmp_path: Path) -> None:
    """A store from before the prior (an estimate in raw units, BoundEstimate.empty) or
    of other servers: the estimate starts again from the prior; one that fits is kept."""
    from controller.admission.state import ESTIMATE_KEY
    from controller.clock import FakeClock
    from controller.store import MetaRow
    from pricing.bound_estimate import BoundEstimate
    from tests.test_pending import controller

    c = controller(tmp_path, FakeClock(1_000_000.0), extra="")
    try:
        job = c._parse({**ORDINARY[0]}, 1)
        fitting = c._fresh_estimate().observe(job)
        for stored, kept in (
            (BoundEstimate.empty(len(c.cluster.resources)).observe(job), False),
            ({"version": 2, "anything": 1}, False),
            (fitting, True),
        ):
            value = stored if isinstance(stored, dict) else stored.to_dict()
            with c.db.session() as session:
                session.merge(MetaRow(key=ESTIMATE_KEY, value=value))
            c._reload()
            assert (c._estimate.jobs == 1) is kept
            assert c._estimate.fits(c.cluster)
            assert c._estimate.prior.startswith("oasis gen")
    finally:
        c.close()


def test_one_tenants_flood_of_inflated_jobs_leaves_others_priced_as_before(
    tmp_path: Path,
) -> None:
    """A submitter that sends 150 jobs worth 1e9 (the default max_utility), cancelling
    each at once, walked the one estimate up to its values: L rose a thousandfold and
    another tenant's ordinary jobs were priced out on an idle cluster until an operator
    reset it. With one estimate per submitter the bounds are the median of alice's, bob's
    and the prior, so they stay between alice's and the prior's."""
    tokens = tmp_path / "tokens"
    names = {"alice": "alice-tok-1", "bob": "bob-tok-2", "ops": "ops-tok-3"}
    tokens.write_text("".join(
        f"{n} {'operator' if n == 'ops' else 'submitter'} {hash_token(t)}\n"
        for n, t in names.items()
    ))  # fmt: skip
    d = _start(tmp_path, extra=f'[auth]\ntokens_file = "{tokens}"\n')

    def meta(name: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {names[name]}"),)

    late = ordinary_jobs(1, seed=99, prefix="late")[0]
    try:
        channel, admission, cluster = _stubs(d.address)
        with channel:

            def bounds() -> dict[tuple[int, str], tuple[float, float]]:
                reply = cluster.GetBounds(pb.GetBoundsRequest(), metadata=meta("ops"))
                return {(b.kind, b.resource): (b.upper, b.lower) for b in reply.bounds}

            def quote() -> pb.Decision:
                req = pb.QuoteJobRequest(job=spec_to_proto(late))
                decision: pb.Decision = admission.QuoteJob(
                    req, timeout=30, metadata=meta("alice")
                ).decision
                return decision

            prior = bounds()
            for spec in ORDINARY:
                admission.SubmitJob(
                    pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60,
                    metadata=meta("alice"),
                )  # fmt: skip
            alices, before = bounds(), quote()
            for i in range(150):
                spec = {**poison(1e9), "id": f"bob-{i}"}
                admission.SubmitJob(
                    pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60, metadata=meta("bob")
                )
                admission.CancelJob(pb.CancelJobRequest(id=f"bob-{i}"), metadata=meta("bob"))
            after, flooded = bounds(), quote()
            reply = cluster.GetBounds(pb.GetBoundsRequest(), metadata=meta("ops"))
        for key, values in after.items():
            for i in (0, 1):  # U, L
                lo = min(prior[key][i], alices[key][i])
                hi = max(prior[key][i], alices[key][i])
                assert lo * (1 - 1e-9) <= values[i] <= hi * (1 + 1e-9), (key, i, values)
        # alice's quote (on her full cluster) sees the prices it saw before the flood
        assert flooded.admitted == before.admitted
        assert flooded.payoff == pytest.approx(before.payoff, rel=0.05)
        assert [(v.name, v.jobs) for v in reply.submitters] == [("alice", 40), ("bob", 150)]
        shown = _cli_as(d, names["ops"]).stdout
        assert "median of 3 in use (2 submitters and the prior)" in shown, shown
        assert "per submitter" in shown and "bob " in shown
        # each one's own bounds, so an operator can tell whose went astray: bob's far
        # from those in use (his floods moved his own), alice's near them
        own = {
            v.name: {(b.kind, b.resource): (b.upper, b.lower) for b in v.bounds}
            for v in reply.submitters
        }
        assert set(own["bob"]) == set(own["alice"]) == set(after)
        apart = {
            name: max(abs(math.log(mine[k][i] / after[k][i])) for k in after for i in (0, 1))
            for name, mine in own.items()
        }
        assert apart["bob"] > math.log(10) > apart["alice"], apart
        rows = {
            line.split()[0]: line for line in shown.splitlines() if line[:4] in ("bob ", "alic")
        }
        assert re.search(r"(worker|ps) \w+ [UL] x[0-9.e+]+$", rows["bob"]), shown
        # each submitter's estimate is a row of its own (a decision rewrites one), and a
        # restarted daemon reads them all back
        with contextlib.closing(sqlite3.connect(tmp_path / "data" / "oasis.db")) as db:
            keys = [k for (k,) in db.execute("SELECT key FROM meta") if k.startswith("bound_")]
            head = json.loads(db.execute(
                "SELECT value FROM meta WHERE key = 'bound_estimate'").fetchone()[0])  # fmt: skip
        assert len([k for k in keys if k.startswith("bound_estimate/")]) == 2
        assert head["submitters"] == ["alice", "bob"] and "states" not in head
        d.stop()
        d.start()
        channel, _, cluster = _stubs(d.address)
        with channel:
            again = cluster.GetBounds(pb.GetBoundsRequest(), metadata=meta("ops"))
            assert again == reply
            # an operator drops bob's estimate alone: alice's prices are hers again
            dropped = cluster.SetBounds(
                pb.SetBoundsRequest(action="reset", submitter="bob"), metadata=meta("ops")
            ).bounds
            assert [(v.name, v.jobs) for v in dropped.submitters] == [("alice", 40)]
            assert {(b.kind, b.resource): (b.upper, b.lower) for b in dropped.bounds} == alices
            with pytest.raises(grpc.RpcError) as unknown:
                cluster.SetBounds(
                    pb.SetBoundsRequest(action="reset", submitter="carol"), metadata=meta("ops")
                )
            assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "no estimate of 'carol' (submitters: alice)" in str(unknown.value.details())
        out = oasis("bounds", "pin", "--submitter", "bob", server=d.address, check=False)
        assert out.returncode == 2 and "--submitter goes with reset" in out.stderr
        d.stop()
        d.start()  # the drop is stored: bob's row is gone
        assert [v.name for v in _bounds_reply(d, names["ops"]).submitters] == ["alice"]
    finally:
        assert d.stop() == 0, d.log_path.read_text()


def _bounds_reply(daemon: Daemon, token: str) -> pb.GetBoundsResponse:
    channel, _, cluster = _stubs(daemon.address)
    with channel:
        reply: pb.GetBoundsResponse = cluster.GetBounds(
            pb.GetBoundsRequest(), metadata=(("authorization", f"Bearer {token}"),)
        )
        return reply


def _cli_as(daemon: Daemon, token: str) -> Any:
    return oasis("bounds", "--token", token, server=daemon.address)


def test_an_operator_caps_one_submitters_declared_utility(tmp_path: Path) -> None:
    """``[limits.max_utility_by_submitter]`` puts a tenant's own cap in place of
    max_utility: a tenant that declares priorities of 1e9 on everything (a slip of
    units) gets INVALID_ARGUMENT naming its cap, for submissions and quotes alike; the
    others keep the default. A name that no token has is refused at start."""
    tokens = tmp_path / "tokens"
    names = {"alice": "alice-tok-1", "bob": "bob-tok-2"}
    tokens.write_text("".join(f"{n} submitter {hash_token(t)}\n" for n, t in names.items()))
    auth = f'[auth]\ntokens_file = "{tokens}"\n'
    d = _start(tmp_path, extra=auth + "[limits.max_utility_by_submitter]\nbob = 1000\n")
    try:
        channel, admission, _ = _stubs(d.address)
        with channel:
            for who, priority, ok in (("alice", 1e6, True), ("bob", 1e6, False),
                                      ("bob", 900.0, True)):  # fmt: skip
                spec = {**poison(priority), "id": f"{who}-{int(priority)}"}
                meta = (("authorization", f"Bearer {names[who]}"),)
                for call, request in (
                    (admission.QuoteJob, pb.QuoteJobRequest(job=spec_to_proto(spec))),
                    (admission.SubmitJob, pb.SubmitJobRequest(job=spec_to_proto(spec))),
                ):
                    if ok:
                        call(request, timeout=60, metadata=meta)
                        continue
                    with pytest.raises(grpc.RpcError) as refused:
                        call(request, timeout=60, metadata=meta)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    details = str(refused.value.details())
                    assert "job.utility.priority" in details, details
                    assert "limits.max_utility_by_submitter.bob = 1000" in details, details
    finally:
        assert d.stop() == 0, d.log_path.read_text()
    config = write_config(
        tmp_path / "typo.toml", tmp_path / "data2",
        extra=auth + "[limits.max_utility_by_submitter]\nbobb = 1000\n",
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "limits.max_utility_by_submitter.bobb: names no submitter" in out.stderr


def test_an_unpin_drops_that_resource_alone_and_u_may_equal_l() -> None:
    """``oasis bounds unpin gpu`` drops gpu's pins, of one kind or of both, and keeps the
    other resources' (as U = L, "U not below L", is a valid pin). Stored pins are read as
    untrusted: a kind that is not an object, or a resource with no side, is named, and
    the pins of the cluster's resources set nothing aside. The mutation audit: an unpin
    that dropped every pin of the kind, U = L refused, an empty side accepted, a kind of
    the wrong shape crashing the split, and empty set-asides (a warning of nothing set
    aside at every rebuild) passed every test."""
    from controller.pins import pins_from_dict, split_pins

    resources = ("gpu", "cpu")
    pins = pins_from_dict({"worker": {"gpu": {"U": 3, "L": 3}, "cpu": {"L": 0.5}},
                           "ps": {"gpu": {"U": 4}, "cpu": {"U": 2}}}, resources)  # fmt: skip
    assert pins.without("worker", "gpu").to_dict() == {
        "worker": {"cpu": {"L": 0.5}}, "ps": {"gpu": {"U": 4}, "cpu": {"U": 2}}
    }  # fmt: skip
    assert pins.without(None, "gpu").to_dict() == {
        "worker": {"cpu": {"L": 0.5}}, "ps": {"cpu": {"U": 2}}
    }  # fmt: skip
    for raw, message in (
        ({"worker": {"gpu": {}}}, 'pins.worker.gpu: must be an object with "U" and/or "L"'),
        ({"ps": [1]}, "pins.ps: must be an object of resources"),
    ):
        with pytest.raises(SpecError) as err:
            pins_from_dict(split_pins(raw, resources)[0], resources)
        assert message in str(err.value), (raw, str(err.value))
    stored = {"worker": {"gpu": {"U": 3}}, "ps": {"cpu": {"L": 1}}}
    assert split_pins(stored, resources) == (stored, {})
    assert split_pins({**stored, "ps": {"ib": {"U": 9}}}, resources) == (
        {**stored, "ps": {}},
        {"ps": {"ib": {"U": 9}}},
    )


def test_an_unpin_of_what_is_not_pinned_is_told_so() -> None:
    from controller.commands.bounds import _not_pinned

    pinned = {"worker": {"gpu": {"U": 50.0}}, "ps": {"cpu": {"L": 0.1}, "mem": {}}}
    both, worker, ps = pb.SERVER_KIND_UNSPECIFIED, pb.SERVER_KIND_WORKER, pb.SERVER_KIND_PS
    assert _not_pinned(pinned, []) is None  # all: something is pinned
    assert _not_pinned({"worker": {}, "ps": {"mem": {}}}, []) == (
        "nothing is pinned; nothing changed"
    )
    assert _not_pinned(pinned, [pb.BoundPin(kind=both, resource="gpu")]) is None
    assert _not_pinned(pinned, [pb.BoundPin(kind=ps, resource="cpu")]) is None
    assert _not_pinned(pinned, [pb.BoundPin(kind=worker, resource="cpu"),
                                pb.BoundPin(kind=ps, resource="gpu"),
                                pb.BoundPin(kind=both, resource="mem")]) == (
        "worker.cpu, ps.gpu, mem: not pinned; nothing changed"
    )  # fmt: skip


def test_a_submitter_is_measured_against_the_bounds_estimated_not_those_pinned() -> None:
    """``oasis bounds`` ranks the submitters by how far their own bounds lie from those
    in use; a pinned bound is no estimate of theirs to lie far from (an operator's pin
    of gpu at 1e6 made every submitter look a million times off)."""
    from controller.commands.bounds import farthest

    used = [
        {"kind": "worker", "resource": "gpu", "U": 1e6, "L": 1.0, "how": "pinned U"},
        {"kind": "worker", "resource": "cpu", "U": 2.0, "L": 0.01, "how": "observed"},
    ]
    voter = {"bounds": [
        {"kind": "worker", "resource": "gpu", "U": 10.0, "L": 1.0},
        {"kind": "worker", "resource": "cpu", "U": 2.5, "L": 0.01},
    ]}  # fmt: skip
    assert farthest(voter, used) == "within 2x"
    far = {"bounds": [{**voter["bounds"][0]}, {**voter["bounds"][1], "L": 0.0001}]}
    assert farthest(far, used) == "worker cpu L /1e+02"
    assert farthest({"bounds": voter["bounds"][:1]}, used) == "-"


def test_a_pinned_resource_taken_out_of_the_cluster_sets_aside_its_pins_alone(
    tmp_path: Path,
) -> None:
    """The operator pins U of gpu and of an extra resource ``ib``, then takes ``ib`` out
    of ``[cluster] resources`` (no job names it) and restarts. Before, the stored pins
    did not read against the new resources, and all of them were ignored: gpu's U went
    back to the estimate's, every tenant's gpu prices with it; the next pin wrote over
    the row, so putting ``ib`` back brought none back. Now gpu's pin holds, ``ib``'s is
    set aside (said once), kept through a later pin, and back with the resource."""
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {r} {hash_token(t)}\n" for n, (r, t) in TOKENS.items()))
    auth = f'[auth]\ntokens_file = "{tokens}"\n'
    d = _start(tmp_path, extra=auth)
    d.stop()
    config = tmp_path / "oasisd.toml"
    plain = config.read_text()
    with_ib = (
        plain.replace('"bandwidth"]', '"bandwidth", "ib"]')
        .replace("bandwidth=25}", "bandwidth=25, ib=4}")
        .replace("bandwidth=40}", "bandwidth=40, ib=4}")
        .replace("bandwidth=20}", "bandwidth=20, ib=4}")
    )
    assert with_ib.count("ib=4") == 5
    config.write_text(with_ib)
    d.start()
    try:
        _cli(d, "pin", "--upper", "gpu=1000", "--upper", "worker.ib=7", "--json")
        d.stop()
        config.write_text(plain)  # ib taken out
        d.start()
        kept = _rpc(d)
        rows = {(b["kind"], b["resource"]): b for b in kept["bounds"]}
        # before the fix: "observed"/"prior", the pin of gpu ignored with ib's
        assert rows["worker", "gpu"]["how"] == "pinned U"
        assert rows["worker", "gpu"]["U"] == pytest.approx(1000)
        assert kept["pins"] == {"worker": {"gpu": {"U": 1000.0}}, "ps": {"gpu": {"U": 1000.0}}}
        _cli(d, "pin", "--upper", "cpu=9", "--json")  # writes the row again
        d.stop()
        config.write_text(with_ib)
        d.start()
        back = _rpc(d)["pins"]
        assert back["worker"] == {
            "gpu": {"U": 1000.0},
            "cpu": {"U": 9.0},
            "ib": {"U": 7.0},
        }
    finally:
        d.stop()
    aside = [e for e in json_log(tmp_path / "oasisd.log") if "set aside" in e.get("event", "")]
    assert len(aside) == 1 and aside[0]["resources"] == ["ib"]


def test_oasis_bounds_lists_the_submitters_farthest_from_the_bounds_first(
    tmp_path: Path,
) -> None:
    """With many submitters, ``oasis bounds`` listed every one in name order (2,000
    lines at 2,000 tenants), and the tenant whose estimate went astray was somewhere in
    them. Now those farthest from the bounds in use come first, SHOWN_SUBMITTERS of
    them, and a line says how many more (``--json`` has every one): 30 tenants with an
    ordinary job each and ``zed``, last by name, who floods jobs worth 1e9."""
    from controller.commands.bounds import SHOWN_SUBMITTERS

    many = 30
    names = {f"t{i:02d}": f"tok-{i}" for i in range(many)} | {"zed": "tok-z", "ops": "tok-o"}
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(
        f"{n} {'operator' if n == 'ops' else 'submitter'} {hash_token(t)}\n"
        for n, t in names.items()
    ))  # fmt: skip
    d = _start(tmp_path, extra=f'[auth]\ntokens_file = "{tokens}"\n')
    try:
        channel, admission, _ = _stubs(d.address)
        with channel:

            def submit(who: str, spec: dict[str, Any]) -> None:
                meta = (("authorization", f"Bearer {names[who]}"),)
                request = pb.SubmitJobRequest(job=spec_to_proto(spec))
                if admission.SubmitJob(request, timeout=60, metadata=meta).job.decision.admitted:
                    admission.CancelJob(pb.CancelJobRequest(id=spec["id"]), metadata=meta)

            for i, spec in enumerate(ordinary_jobs(many, seed=5, prefix="o")):
                submit(f"t{i:02d}", spec)
            for i in range(40):
                submit("zed", {**poison(1e9), "id": f"z{i}"})
        shown = _cli_as(d, names["ops"]).stdout
        # --json: each submitter's own jobs and prior's weight, not the estimate's whole
        every = json.loads(oasis("bounds", "--json", "--token", names["ops"],
                                 server=d.address).stdout)  # fmt: skip
        own = {v["name"]: (v["jobs"], v["prior_share"]) for v in every["submitters"]}
        assert every["jobs"] == many + 40 and own["t00"][0] == 1 and own["zed"][0] == 40
        assert own["zed"][1] < own["t00"][1] < 1, own
        # retired tokens are dropped in one command, once every name is found (a typo
        # among them resets none)
        reset = ("bounds", "reset", "--token", names["ops"], "--json")
        typo = oasis(*reset, "--submitter", "t00", "--submitter", "t0l", server=d.address,
                     check=False)  # fmt: skip
        said = typo.stdout + typo.stderr  # with --json, the error is JSON on stdout
        assert typo.returncode == 2 and "no estimate of 't0l'" in said, said
        assert "nothing was reset" in said
        assert len(_bounds_reply(d, names["ops"]).submitters) == many + 1
        # a name given twice is dropped once (not refused the second time, after the first)
        dropped = oasis(*reset, "--submitter", "t00", "--submitter", "zed", "--submitter",
                        "t00", server=d.address)  # fmt: skip
        after = json.loads(dropped.stdout)
        left = {v["name"] for v in after["submitters"]}
        assert len(left) == many - 1 and not left & {"t00", "zed"}
    finally:
        d.stop()
    table = shown.split("per submitter", 1)[1].splitlines()
    rows = [line for line in table if line.startswith(("t", "zed"))]
    assert len(rows) == SHOWN_SUBMITTERS, shown
    assert rows[0].startswith("zed ") and re.search(r"[UL] x[0-9.e+]+$", rows[0]), shown
    assert f"... and {many + 1 - SHOWN_SUBMITTERS} more submitters" in shown, shown


def test_the_view_of_the_bounds_is_made_off_the_decision_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``oasis bounds`` walks every submitter's estimate (30-100 ms at 2,000 submitters,
    bench/many_tenants.py), and did so in the decision thread, so every tenant's
    decisions waited for it. Now the state is taken there and the view made in a read
    thread: a tenant's submission is decided while a view is being made (here, held)."""
    import asyncio
    import threading

    from controller.config import from_dict
    from pricing.shared_estimate import SharedEstimate
    from tests.stores import in_process

    config = from_dict({
        "daemon": {"data_dir": str(tmp_path), "window": WINDOW, "epoch": 0},
        "cluster": CLUSTER_RAW,
    })  # fmt: skip
    c = in_process(config)
    c.open()
    held, entered = threading.Event(), threading.Event()
    describe = SharedEstimate.describe

    def slow(self: SharedEstimate, resources: Any) -> dict[str, Any]:
        entered.set()
        held.wait(30)
        return describe(self, resources)

    monkeypatch.setattr(SharedEstimate, "describe", slow)

    async def run() -> tuple[bool, dict[str, Any]]:
        for who in ("alice", "bob", "carol"):
            await c.submit({**SMALL_JOB, "id": f"{who}-1"}, by=who)
        view = asyncio.ensure_future(c.bounds("ops"))
        await asyncio.to_thread(entered.wait, 30)
        try:
            job = await asyncio.wait_for(c.submit({**SMALL_JOB, "id": "d-1"}, by="dave"), 10)
        except TimeoutError:
            job = None
        held.set()
        return job is not None and job.decision.admitted, await view

    try:
        decided, view = asyncio.run(run())
    finally:
        held.set()
        c.close()
    assert decided, "a submission waited for the view of the bounds"
    assert [v["name"] for v in view["submitters"]] == ["alice", "bob", "carol"]
