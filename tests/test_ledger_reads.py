"""Monitoring's reads of the ledger at scale (controller/admission/ledger_reads.py): a
scrape, a one-server ``GetPrices`` and the console's price snapshot copy arrays in the
decision thread, never a Python float per cell of the window.

At 10,000 servers x 300 slots a scrape listed every cell's price there (1.3 s of the
decision thread every 15 s, and 15 million floats), and so did a one-server
``GetPrices`` of the window (0.85 s, twice per ``oasis status``). Memory is what these
tests measure (tracemalloc's peak while the read runs, which is deterministic), on a
cluster small enough to take a second: a list per cell costs at least 32 bytes a cell,
more than the whole price array's 8 (``bench/operator_scale.py`` times the same reads at
10,000 servers).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from bench.operator_scale import open_controller
from controller import auth, servicer
from controller.admission import AdmissionController
from controller.admission.price_pages import price_page
from controller.metrics import _ControllerCollector
from controller.rpc import oasis_pb2 as pb
from controller.servicer import ClusterServicer

WORKERS, PS, WINDOW = 60, 20, 200
GPU = {"gpu": 8, "cpu": 64, "mem": 488, "disk": 500, "bandwidth": 25}
CPU = {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25}
JOB = {
    "epochs": 2, "chunks": 16, "minibatches": 50, "tau": 0.1, "grad_mb": 100,
    "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
    "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
    "utility": {"kind": "sigmoid", "priority": 80, "decay": 0.2, "target": 6},
}  # fmt: skip


def busy_controller(
    directory: Path, workers: int, ps: int, window: int, jobs: int
) -> AdmissionController:
    """An in-process controller of ``workers`` GPU servers and ``ps`` PS servers, a
    window of ``window`` slots, with ``jobs`` of :data:`JOB` admitted (the caller closes
    it)."""
    cluster = {
        "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
        "servers": [
            *({"name": f"w{i}", "kind": "worker", "capacity": GPU} for i in range(workers)),
            *({"name": f"p{i}", "kind": "ps", "capacity": CPU} for i in range(ps)),
        ],
    }
    c = open_controller(directory, cluster, window)
    for i in range(jobs):
        assert asyncio.run(c.submit({**JOB, "id": f"j{i}"})).decision.admitted
    return c


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdmissionController]:
    c = busy_controller(tmp_path_factory.mktemp("ledger-reads"), WORKERS, PS, WINDOW, 6)
    yield c
    c.close()


def _cells_bytes(c: AdmissionController) -> int:
    """Bytes of the ledger's price cells, both sides: ``(S, n, R)`` float64 each."""
    assert c.ledger is not None
    return c.ledger.worker_side.cells.nbytes + c.ledger.ps_side.cells.nbytes


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the peak of memory traced while it ran, bytes (a second call: the
    first derives the prices, which a read may, into arrays the ledger already holds)."""
    fn()
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class AbortedError(Exception):
    pass


class Context:
    """The part of a gRPC servicer context ``GetPrices`` uses."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AbortedError(code, details)

    async def abort_with_status(self, status: Any) -> None:
        raise AbortedError(status.code, status.details)


def _answer(c: AdmissionController, request: pb.GetPricesRequest) -> pb.GetPricesResponse:
    """``GetPrices`` as the servicer answers an operator without tokens."""

    async def call() -> pb.GetPricesResponse:
        auth._caller.set(auth.ANONYMOUS)  # as the access interceptor does
        return await ClusterServicer(c).GetPrices(request, cast(Any, Context()))

    return asyncio.run(call())


def _rows(c: AdmissionController, request: pb.GetPricesRequest) -> list[tuple[Any, ...]]:
    answer = _answer(c, request)
    return [(p.server, p.kind, p.resource, list(p.prices)) for p in answer.prices]


def test_a_scrape_copies_arrays_not_a_float_per_cell(controller: AdmissionController) -> None:
    c = controller
    metrics = _ControllerCollector(c)
    _, peak = _peak(lambda: c.between_decisions(metrics._snapshot))
    assert peak < _cells_bytes(c), f"a scrape's ledger read took {peak:,} bytes"

    # the same values as a read of every cell gives
    everything = _rows(c, pb.GetPricesRequest(slots=WINDOW + 1))
    assert len(everything) == WORKERS * 5 + PS * 4  # a PS server has no GPU: no price
    scraped: dict[tuple[str, ...], float] = {}
    for metric in metrics._read_ledger():
        for s in metric.samples:
            if s.name in ("oasis_unit_price", "oasis_unit_price_peak"):
                scraped[(s.name, *s.labels.values())] = s.value
    kind = {pb.SERVER_KIND_WORKER: "worker", pb.SERVER_KIND_PS: "ps"}
    peaks: dict[tuple[str, str], float] = {}
    for server, k, resource, prices in everything:
        assert scraped["oasis_unit_price", server, kind[k], resource] == prices[0]
        peaks[kind[k], resource] = max(peaks.get((kind[k], resource), 0.0), *prices)
    assert peaks[("worker", "gpu")] > min(p[3][0] for p in everything if p[2] == "gpu")
    for (k, resource), top in peaks.items():
        assert scraped["oasis_unit_price_peak", k, resource] == top
    assert len(scraped) == len(everything) + len(peaks)


def test_one_servers_window_of_prices_copies_that_server_only(
    controller: AdmissionController,
) -> None:
    c = controller
    window = pb.GetPricesRequest(slots=1 << 20, server="w7")  # oasis status asks so
    rows, peak = _peak(lambda: _rows(c, window))
    # its own 5 resources x 201 slots; before, every server's rows were listed, then
    # all but its own dropped
    assert peak < _cells_bytes(c) / 4, f"one server's prices took {peak:,} bytes"
    everything = _rows(c, pb.GetPricesRequest(slots=WINDOW + 1))
    assert rows == [r for r in everything if r[0] == "w7"]
    assert len(rows) == 5 and all(len(r[3]) == WINDOW + 1 for r in rows)
    ps_rows = _rows(c, pb.GetPricesRequest(slots=3, server="p2"))
    assert [r[2] for r in ps_rows] == ["cpu", "mem", "disk", "bandwidth"]


def test_prices_come_in_pages_that_add_up_to_the_whole(controller: AdmissionController) -> None:
    # at 10,000 servers every server's prices over more than 40 slots passed gRPC's
    # 16 MiB cap on one message: oasis prices --slots 48 and oasis status --slots 48
    # failed with "Sent message larger than max"; they now page
    c = controller
    whole = _rows(c, pb.GetPricesRequest(slots=30))
    paged: list[tuple[Any, ...]] = []
    token, pages = "", 0
    while True:
        answer = _answer(c, pb.GetPricesRequest(slots=30, page_size=7, page_token=token))
        paged += [(p.server, p.kind, p.resource, list(p.prices)) for p in answer.prices]
        pages += 1
        token = answer.next_page_token
        if not token:
            break
    assert paged == whole
    assert pages == -(-(WORKERS + PS) // 7)  # a page of 7 servers each, the last shorter
    assert not _answer(c, pb.GetPricesRequest(slots=30)).next_page_token  # asked whole
    # a page also ends by bytes: limits.max_page_bytes over servers' rows of slots
    assert price_page(1000, 300, 5, 1 << 20) == (1 << 20) // (5 * (8 * 300 + 64))
    assert price_page(1000, 12, 5, 1 << 20) == 1000
    assert price_page(3, 10**6, 5, 1 << 20) == 1  # never none
    with pytest.raises(AbortedError, match="page_token"):
        _answer(c, pb.GetPricesRequest(page_size=5, page_token="x"))


def test_prices_too_large_for_one_answer_are_refused_naming_the_way_out(
    controller: AdmissionController, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gRPC refused such an answer only once the daemon had built it, saying "SERVER:
    # Sent message larger than max (18240010 vs. 16777216)"; the cap is made smaller
    # here so that 80 servers pass it
    monkeypatch.setattr(servicer, "MAX_RESPONSE_BYTES", 100_000)
    with pytest.raises(AbortedError) as refused:
        _answer(controller, pb.GetPricesRequest(slots=100))
    code, details = refused.value.args
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the prices of 80 servers are about" in details and "page_size" in details
    paged = _answer(controller, pb.GetPricesRequest(slots=100, page_size=1000))
    assert paged.prices and not paged.next_page_token  # one page of 1 MiB holds them
