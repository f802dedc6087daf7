"""Fuzz the whole submit path (issue 11): JobSpecs with extreme numbers in every numeric
field, sent over gRPC to a real daemon (a subprocess), answer OK or INVALID_ARGUMENT,
never INTERNAL or anything else, and the daemon logs no error.

Each example starts from a valid job with one of the three kinds of utility and
replaces one to four numeric fields with a value from the edges of float64 and int64
(0, subnormals, 1e308, -1.7e308, 2**63 - 1, and inf and nan as well), then quotes it and,
for some, submits it (optionally with a wait). The cap on utility is off, so the largest
utilities reach the price-bound estimate and the search. The search budget is small, so
every decision is quick; budget refusals are INVALID_ARGUMENT too. Bounded
(derandomized, 300 examples); ``OASIS_FUZZ_EXAMPLES=2000`` searches longer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import SMALL_JOB, Daemon, json_log, write_config

EXAMPLES = int(os.environ.get("OASIS_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=EXAMPLES or 300,
    derandomize=not EXAMPLES,
    deadline=timedelta(seconds=30),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

FLOATS = [
    0.0, -0.0, 5e-324, 1e-320, 1e-300, 1e-12, 0.5, 1.0, 3.0, 2.0**53, 1e15, 1e300, 1.7e308,
    -1.0, -1e-300, -1.7e308, math.inf, -math.inf, math.nan,
]  # fmt: skip
INTS = [0, 1, 2, -1, 2**31, 2**53 + 1, 2**62, 2**63 - 1, -(2**63)]
UTILITIES: list[dict[str, Any]] = [
    {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
    {"kind": "deadline", "value": 40, "deadline": 6, "half_life": 2},
    {"kind": "deadline", "value": 40, "deadline": 6},
    {"kind": "table", "values": [60, 50, 10, 1, 0]},
]
RESOURCES = ("gpu", "cpu", "mem", "disk", "bandwidth")


def _set(msg: pb.JobSpec, path: str, value: float) -> None:
    """Put ``value`` at ``path`` (``tau``, ``worker.gpu``, ``utility.priority``,
    ``utility.values[1]``) of ``msg``."""
    head, _, rest = path.partition(".")
    if head in ("worker", "ps"):
        getattr(msg, head)[rest] = value
    elif head == "utility":
        kind = msg.utility.WhichOneof("kind")
        sub = getattr(msg.utility, kind or "sigmoid")
        if rest.startswith("values"):
            if kind == "table":
                i = int(rest[7:-1])
                sub.values[min(i, len(sub.values) - 1)] = value
        elif rest in sub.DESCRIPTOR.fields_by_name:
            setattr(sub, rest, value)
    elif head in ("epochs", "chunks", "minibatches"):
        setattr(msg, head, int(value))
    else:
        setattr(msg, head, value)


PATHS = [
    "tau", "grad_mb",
    *(f"worker.{r}" for r in RESOURCES), *(f"ps.{r}" for r in RESOURCES),
    "utility.priority", "utility.decay", "utility.target", "utility.value",
    "utility.deadline", "utility.half_life", "utility.values[0]", "utility.values[3]",
]  # fmt: skip
INT_PATHS = ["epochs", "chunks", "minibatches"]


@st.composite
def specs(draw: st.DrawFn) -> tuple[pb.JobSpec, bool, float | None]:
    """(a JobSpec, whether to submit it too, the wait to ask for or None)."""
    utility = draw(st.sampled_from(UTILITIES))
    msg = spec_to_proto({**SMALL_JOB, "id": "", "utility": utility})
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            _set(msg, draw(st.sampled_from(PATHS)), draw(st.sampled_from(FLOATS)))
        else:
            _set(msg, draw(st.sampled_from(INT_PATHS)), draw(st.sampled_from(INTS)))
    submit = draw(st.integers(0, 3)) == 0
    wait = draw(st.sampled_from([None, 0.0, 7200.0, 1e300, -1.0, math.nan]))
    return msg, submit, wait


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    """The daemon on SQLite, and on PostgreSQL, which enforces its columns' types: a
    value SQLite keeps and PostgreSQL refuses would fail a whole group commit, every
    other tenant's decision in it included."""
    d = tmp_path_factory.mktemp("fuzz")
    extra = "[limits]\nmax_utility = 0\nmax_search_steps = 2e6\n"
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres").new_database()
    config = write_config(d / "oasisd.toml", d / "data", store_url=url, extra=extra)
    daemon = Daemon(config, d / "oasisd.log").start()
    yield daemon
    assert daemon.stop() == 0, (d / "oasisd.log").read_text()


_ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
_counter = iter(range(1 << 30))


def _code(call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call(request, timeout=60)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def test_extreme_numbers_are_answered_ok_or_invalid_argument(daemon: Daemon) -> None:
    codes: dict[grpc.StatusCode, int] = {}
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)

        @SETTINGS
        @given(specs())
        def check(example: tuple[pb.JobSpec, bool, float | None]) -> None:
            msg, submit, wait = example
            code, details = _code(stub.QuoteJob, pb.QuoteJobRequest(job=msg))
            codes[code] = codes.get(code, 0) + 1
            assert code in _ALLOWED, f"quote: {code}: {details}\n{msg}"
            if submit:
                job = pb.JobSpec()
                job.CopyFrom(msg)
                job.id = f"f{next(_counter)}"
                request = pb.SubmitJobRequest(job=job)
                if wait is not None:
                    request.wait_seconds = wait
                code, details = _code(stub.SubmitJob, request)
                assert code in _ALLOWED, f"submit: {code}: {details}\n{request}"

        check()
        # an extreme job that was admitted, then a quote of an ordinary one: still priced
        normal = pb.QuoteJobRequest(job=spec_to_proto({**SMALL_JOB, "id": "calm"}))
        assert math.isfinite(stub.QuoteJob(normal, timeout=60).decision.payoff)
    assert codes.get(grpc.StatusCode.OK, 0) > 0  # the examples reach the search too
    assert codes.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 0
    errors = [e for e in json_log(daemon.log_path) if e.get("level") in ("error", "critical")]
    assert errors == [], errors[:3]


def test_a_job_worth_nothing_moves_the_estimate_finitely() -> None:
    """A job whose best utility is exactly 0 (a deadline before its fewest slots: what a
    decision past a deadline sees) folds into the estimate with or without a prior, and
    the bounds stay finite; the cap on utility lets it through."""
    import tomllib

    import numpy as np

    from controller.limits import Limits
    from pricing import job_from_dict
    from pricing.bound_estimate import BoundEstimate
    from pricing.cluster import cluster_from_dict
    from pricing.default_prior import default_prior
    from tests.servers import CLUSTER_TOML

    raw = tomllib.loads(CLUSTER_TOML)["cluster"]
    cluster = cluster_from_dict(raw["resources"], raw["servers"])
    spec = {**SMALL_JOB, "id": "z", "utility": {"kind": "deadline", "value": 5, "deadline": 0.5}}
    job = job_from_dict(spec, cluster, slot_seconds=3600, slots_available=lambda _a: 24, arrival=1)
    assert job.best_utility == 0.0
    Limits().check_utility(job)
    for start in (
        BoundEstimate.start(cluster, default_prior()),
        BoundEstimate.start(cluster, None),
        BoundEstimate.empty(len(cluster.resources)),
    ):
        estimate = start
        for _ in range(3):
            estimate = estimate.observe(job)
            bounds = estimate.bounds()
            assert bounds is not None
            for x in (bounds.log_u1, bounds.log_u2, bounds.floor1, bounds.floor2):
                assert np.isfinite(x).all()


def test_extreme_pins_price_finitely(tmp_path: Path) -> None:
    """Pins at the edges of float64 (U up to 1.7e308, L down to 5e-324): a quote and a
    submission are still decided, with finite payoffs; non-finite pins are refused."""
    from controller.admission.commit import Deferred
    from controller.clock import FakeClock
    from pricing import SpecError
    from tests.test_pending import controller

    c = controller(tmp_path, FakeClock(1_000_000.0), extra="")
    spec = {**SMALL_JOB, "id": "calm"}
    try:
        for upper, lower in ((1.7e308, 5e-324), (1.7e308, 1.7e308), (5e-324, 5e-324),
                             (1e300, 1e-300)):  # fmt: skip
            table = {"U": upper, "L": lower}
            pins = {kind: {r: table for r in c.cluster.resources} for kind in ("worker", "ps")}
            c._set_bounds_sync("pin", pins, "ops")
            view, _ = c._quote_sync(spec)
            assert view.payoff is not None and math.isfinite(view.payoff), (upper, lower)
        for bad in (math.inf, math.nan, 0.0, -1.0):
            with pytest.raises(SpecError):
                c._set_bounds_sync("pin", {"worker": {"gpu": {"U": bad}}}, "ops")
        c._set_bounds_sync("unpin", None, "ops")
        submitted = c._submit_sync({**spec, "id": "after"}, None, None)
        assert isinstance(submitted, Deferred)  # its commit is queued (group commit)
        job, _events = submitted.then(submitted.future.result(10))
        assert job.decision.payoff is not None and math.isfinite(job.decision.payoff)
    finally:
        c.close()


def test_keys_that_do_not_show_as_text_are_invalid_argument(daemon: Daemon) -> None:
    """A key that is a lone surrogate (valid JSON: ``"\\ud800"``) or holds terminal
    escapes is named, escaped, in an INVALID_ARGUMENT. Before: the surrogate failed the
    UTF-8 of the status, UNKNOWN, and a 4 KB traceback in the log per request (300
    quotes wrote 1.3 MB)."""
    spec = json.dumps({**SMALL_JOB, "id": "keys"})
    bad = [
        spec[:-1] + ', "\\ud800": 1}',
        spec.replace('"worker": {', '"worker": {"\\udcff": 1, '),
        spec[:-1] + ', "x\\u001b]52;c;cm0gLXJmIH4vKgo=\\u0007\\r": 1}',
    ]
    before = len(json_log(daemon.log_path))
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        for text in bad:
            for _ in range(20):
                code, details = _code(stub.QuoteJob, pb.QuoteJobRequest(job=pb.JobSpec(json=text)))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
                assert "\\u" in details or "\\x1b" in details, details
                assert "\x1b" not in details and "\r" not in details
    grown = json_log(daemon.log_path)[before:]
    assert [e for e in grown if "exception" in e or e.get("level") == "error"] == []
