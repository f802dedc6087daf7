"""Job specs in people's units, strict parsing, and the client's plain output (issue 13),
without a daemon: the parsers, the time resolution, addresses and JSON records."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from controller.clock import SlotTimes
from controller.commands.connection import daemon_address
from controller.commands.records import job_record, plain, state_name
from controller.convert import spec_from_proto
from controller.jobspec import (
    check_worth,
    for_display,
    has_times,
    new_id,
    prepare,
    read_json,
    spec_differences,
)
from controller.rpc import oasis_pb2 as pb
from controller.statuses import MAX_BYTES, MAX_REASON, MAX_TEXT, bounded
from pricing import SpecError, cluster_from_dict, job_from_dict
from pricing.durations import format_duration, format_time, parse_duration, parse_time
from pricing.errors import Problem
from pricing.job import fits_nowhere, max_workers_per_slot, most_on_one_server
from pricing.utility import Deadline, Sigmoid, utility_from_dict
from tests.servers import ROOT

SLOT = 3600.0
CLUSTER = cluster_from_dict(
    ["gpu", "cpu", "mem", "disk", "bandwidth"],
    [
        {
            "name": "w0",
            "kind": "worker",
            "capacity": {"gpu": 4, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 25},
        },
        {
            "name": "p0",
            "kind": "ps",
            "capacity": {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25},
        },
    ],
)
PEOPLE: dict[str, Any] = {
    "id": "p1",
    "epochs": 2,
    "chunks": 4,
    "minibatches": 50,
    "minibatch_seconds": 36,  # 0.01 slots of an hour
    "grad_mb": 100,
    "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
    "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
    "utility": {"kind": "deadline", "value": 40, "deadline": "6h", "half_life": "90m"},
}


def parse(spec: dict[str, Any], arrival: int = 10) -> Any:
    return job_from_dict(
        spec, CLUSTER, slot_seconds=SLOT, slots_available=lambda _a: 48, arrival=arrival
    )


def problems(spec: Any, arrival: int = 10) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse(spec, arrival)
    return [str(p) for p in err.value.problems]


# -- durations and times ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90m", 5400),
        ("6h", 21600),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("2.5h", 9000),
        ("1d", 86400),
        ("45s", 45),
        ("6 h", 21600),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "h",
        "5",
        "1h2h",
        "1h30",
        "x1h",
        "6 hours",
        "1" * 100,
        "١٠h",
        "１０h",
        "2h\r\n",
        "2h\u2028",
        "\x0b2h",
    ],
)
def test_not_durations(text: str) -> None:
    assert parse_duration(text) is None


def test_durations_and_times_past_64_characters_are_not_read() -> None:
    """Text from outside is bounded before a regex or a date parser sees it: 64
    characters at most, blanks included (mutation audit: either cap dropped survived)."""
    assert parse_duration("1d" + " " * 40 + "2h") == 93600
    assert parse_duration("1d" + " " * 70 + "2h") is None
    assert parse_time("2030-01-01T18:00:00Z" + " " * 20) == 1893520800.0
    assert parse_time("2030-01-01T18:00:00Z" + " " * 60) is None


def test_times_need_a_utc_offset() -> None:
    assert parse_time("2030-01-01T18:00:00Z") == 1893520800.0
    assert parse_time("2030-01-01T20:00:00+02:00") == 1893520800.0
    assert format_time(1893520800.0) == "2030-01-01T18:00:00Z"
    assert parse_time("6h") is None
    # the form the message suggests is one that reads (before: "add Z", and a date with
    # Z added, "2030-06-01Z", is no time)
    for naive, suggested in (("2030-01-01T18:00", "2030-01-01T18:00Z"),
                             ("2030-06-01", "2030-06-01T00:00:00Z")):  # fmt: skip
        with pytest.raises(ValueError, match=f"no UTC offset: give one, as in '{suggested}'"):
            parse_time(naive)
        assert parse_time(suggested) is not None


def test_rfc_3339s_lower_case_t_and_z_are_read() -> None:
    """The units audit: RFC 3339 (section 5.6) lets "T" and "Z" be written "t" and "z"
    (as some tools print them); ``"2030-01-01t18:00:00z"`` was refused as no time."""
    assert parse_time("2030-01-01t18:00:00z") == parse_time("2030-01-01T18:00:00Z")
    assert parse_time("2030-01-01t20:00:00+02:00") == 1893520800.0
    with pytest.raises(ValueError, match="no UTC offset: give one, as in '2030-01-01t18:00Z'"):
        parse_time("2030-01-01t18:00")


def test_a_half_life_is_a_length_and_is_told_so() -> None:
    """The units audit: a time given as a half-life was told to "give a duration or
    {"slot": S}" (no half-life is a slot), and "-2h" that it may be a time."""
    from pricing.utility import Deadline, utility_from_dict

    def said(half_life: object) -> str:
        raw = {"kind": "deadline", "value": 5, "deadline": 3, "half_life": half_life}
        with pytest.raises(SpecError) as refused:
            utility_from_dict(raw, "job.utility", slot_seconds=3600.0, arrival=0)
        return str(refused.value)

    assert said("2026-11-28T06:00:00Z").startswith(
        "job.utility.half_life: is a length of time, not a time: give a number of slots or "
        "a duration such as"
    )
    assert said("-2h") == "job.utility.half_life: must be > 0, got '-2h'"
    assert said("soon").endswith("; got 'soon'") and '{"slot"' not in said("soon")
    raw = {"kind": "deadline", "value": 5, "deadline": 3, "half_life": "90m"}
    assert utility_from_dict(raw, "u", slot_seconds=3600.0, arrival=0) == Deadline(5, 3, 1.5)


# -- the job parser -------------------------------------------------------------------


def test_people_units_convert_with_the_slot_length() -> None:
    job = parse(PEOPLE)
    assert job.tau == pytest.approx(0.01)
    same = parse(
        {
            **{k: v for k, v in PEOPLE.items() if k != "minibatch_seconds"},
            "tau": 0.01,
            "utility": {"kind": "deadline", "value": 40, "deadline": 6, "half_life": 1.5},
        }
    )
    assert job.work == same.work
    assert job.utility == same.utility == Deadline(40.0, 6.0, 1.5)
    sig = parse(
        {
            **PEOPLE,
            "utility": {"kind": "sigmoid", "priority": 5, "target": "3h", "decay_per_hour": 0.5},
        }
    )
    assert sig.utility == Sigmoid(5.0, 0.5, 3.0)


def test_every_problem_at_once_in_plain_words() -> None:
    spec = {
        **PEOPLE,
        "epoch": 2,
        "arrival": 3,
        "chunks": "4",
        "minibatches": 10**25,
        "tau": 0.01,
        "utility": {"kind": "deadline", "value": -1, "deadlin": "6h"},
    }
    del spec["epochs"]
    got = problems(spec)
    assert got == [
        "job.epoch: unknown key; did you mean 'epochs'?",
        "job.arrival: is not taken here: a job submitted during slot s arrives at s + 1",
        "job.epochs: is required",
        "job.chunks: must be an integer, got the string '4'",
        "job.minibatches: must be <= 2**53 = 9007199254740992, got 10000000000000000000000000",
        "job.tau: give tau or minibatch_seconds, not both",
        "job.utility.deadlin: unknown key; did you mean 'deadline'?",
        "job.utility.value: must be > 0, got -1",
        "job.utility.deadline: is required",
    ]
    assert not any("object" in p and "int" in p for p in got)  # no Python internals


def test_unknown_utility_kind_and_keys_suggest() -> None:
    got = problems({**PEOPLE, "utility": {"kind": "deadlne", "value": 1}})
    assert got == [
        "job.utility.kind: unknown utility kind 'deadlne' (known: sigmoid, table, deadline); "
        "did you mean 'deadline'?"
    ]
    got = problems(
        {
            **PEOPLE,
            "utility": {
                "kind": "sigmoid",
                "priorty": 3,
                "decay": 1,
                "decay_per_hour": 1,
                "target": "soon",
            },
        }
    )
    assert got[0] == "job.utility.priorty: unknown key; did you mean 'priority'?"
    assert "job.utility.decay: give decay or decay_per_hour, not both" in got
    assert any(
        p.startswith("job.utility.target: must be a number of slots, a duration") for p in got
    )


def test_unknown_keys_are_bounded() -> None:
    spec = {**PEOPLE, **{f"k{i}": i for i in range(1000)}}
    got = problems(spec)
    assert len(got) == 11 and got[-1] == "job: and 990 more unknown keys"
    # a 1000-character key is named shortened in the field path (mutation audit: the
    # key shown whole survived)
    from pricing.fields import unknown_keys

    (long,) = unknown_keys({"x" * 1000: 1}, {"epochs"}, "job")
    assert long.field == f"job.{'x' * 30}...(1000 characters)", long.field
    # ten are shown; the eleventh is counted, not dropped without a word (mutation
    # audit: the count from the twelfth on survived)
    got = problems({**PEOPLE, **{f"k{i}": i for i in range(11)}})
    assert len(got) == 11 and got[-1] == "job: and 1 more unknown keys", got
    assert got[9].startswith("job.k9: unknown key")


def test_a_worker_or_ps_that_fits_on_no_server_is_refused() -> None:
    """The daemon's parser (a submission: INVALID_ARGUMENT) refuses it as a bad field,
    naming the resource; a trace rejects it instead (SPEC 6, tests/test_units.py)."""
    worker = {**PEOPLE["worker"], "gpu": 5}
    ps = {**PEOPLE["ps"], "mem": 61}
    assert problems({**PEOPLE, "worker": worker, "ps": ps}) == [
        "job.worker: one worker fits on no worker server, even empty (gpu: it needs 5, the "
        "largest has 4)",
        "job.ps: one ps fits on no ps server, even empty (mem: it needs 61, the largest has 60)",
    ]
    with pytest.raises(SpecError, match=r"job\.worker: one worker fits on no worker server"):
        check_worth({**PEOPLE, "worker": worker}, cluster=CLUSTER, slot_seconds=SLOT,
                    window=48, arrival=10)  # fmt: skip


def _rooms(capacity: np.ndarray, demand: list[float]) -> list[int]:
    """Units of ``demand`` each server of ``capacity`` takes when empty, SPEC 5's room by
    hand: the least over resources it needs of ``floor(c / d + 1e-9)``."""
    return [
        min(math.floor(c[r] / d + 1e-9) for r, d in enumerate(demand) if d > 0)
        for c in capacity.tolist()
    ]


@pytest.mark.parametrize("seed", range(40))
def test_workers_per_slot_are_the_most_y_within_n_and_both_sides_room(seed: int) -> None:
    """:func:`max_workers_per_slot` (the fits-in-time check's width) against a count over
    every ``y``: at most ``N``, at most the workers all worker servers take, with ``z(y) =
    ceil(y b / B - 1e-9)`` PS that the PS servers take; each side's room from its own
    servers and demand, also when the worker's and PS's demands are the same numbers."""
    rng = np.random.default_rng(seed)

    def pick(*values: float) -> float:
        return float(rng.choice(values))

    servers = [
        {"name": f"w{i}", "kind": "worker",
         "capacity": {"gpu": pick(0, 2, 4, 8), "cpu": pick(4, 8, 16), "bandwidth": pick(10, 25)}}
        for i in range(int(rng.integers(1, 4)))
    ]  # fmt: skip
    servers += [
        {"name": f"p{i}", "kind": "ps",
         "capacity": {"cpu": pick(0, 4, 8), "bandwidth": pick(5, 10, 25)}}
        for i in range(int(rng.integers(1, 3)))
    ]  # fmt: skip
    cluster = cluster_from_dict(["gpu", "cpu", "bandwidth"], servers)
    worker = [pick(0, 1, 2, 3), pick(1, 2.5, 4), pick(1, 2, 5)]
    same = rng.random() < 0.4  # the same numbers on both sides
    ps = list(worker) if same else [0.0, pick(0, 1, 3), worker[2] * pick(1, 2, 5)]
    spec = {"id": "y", "epochs": 1, "chunks": int(rng.integers(1, 13)), "minibatches": 5,
            "tau": 0.5, "grad_mb": 1,
            "worker": dict(zip(cluster.resources, worker, strict=True)),
            "ps": dict(zip(cluster.resources, ps, strict=True)),
            "utility": {"kind": "sigmoid", "priority": 10, "decay": 0, "target": 5}}  # fmt: skip
    job = job_from_dict(spec, cluster, slot_seconds=SLOT, slots_available=lambda _a: 10**9,
                        arrival=0, must_fit=False)  # fmt: skip
    worker_rooms = _rooms(cluster.worker_capacity, worker)
    ps_rooms = _rooms(cluster.ps_capacity, ps)
    assert most_on_one_server(cluster, "worker", job.worker) == max(worker_rooms)
    assert most_on_one_server(cluster, "ps", job.ps) == max(ps_rooms)
    ratio = worker[2] / ps[2]
    want = max(
        y
        for y in range(job.chunks + 1)
        if y <= sum(worker_rooms) and math.ceil(y * ratio - 1e-9) <= sum(ps_rooms)
    )
    assert max_workers_per_slot(job, cluster) == want
    nowhere = {kind for kind, _ in fits_nowhere(job.worker, job.ps, cluster)}
    assert nowhere == {
        k for k, rooms in (("worker", worker_rooms), ("ps", ps_rooms)) if max(rooms) < 1
    }


def test_work_that_rounds_to_no_worker_slot_is_refused() -> None:
    """``W = ceil(E N M m - 1e-9)`` of 0 (a mini-batch of a nanosecond) is no job: refused,
    not admitted with nothing to run."""
    tiny = {**PEOPLE, "minibatch_seconds": 1e-9, "grad_mb": 1e-9}
    (problem,) = problems(tiny)
    assert problem.startswith("job: work E*N*M*m = ") and problem.endswith("rounds to 0")


def test_work_must_fit_between_a_traces_arrival_and_its_horizon() -> None:
    """A trace's job has ``T - a`` slots from its arrival (SPEC 3, ``Tmax``): the check
    that its work fits at all counts them from ``a``, not from slot 0. PEOPLE's work is
    5 worker-slots, at most 4 workers a slot: 2 slots."""

    def read(arrival: int) -> Any:
        return job_from_dict({**PEOPLE, "arrival": arrival}, CLUSTER, slot_seconds=SLOT,
                             slots_available=lambda a: 48 - a)  # fmt: skip

    assert read(46).work == 5 and max_workers_per_slot(read(46), CLUSTER) == 4
    with pytest.raises(SpecError, match=r"needs at least 2 slots .* but only 1 "):
        read(47)


def test_a_cluster_naming_a_server_twice_is_refused() -> None:
    servers = [{"name": "a", "kind": "worker", "capacity": {"bandwidth": 10}},
               {"name": "a", "kind": "ps", "capacity": {"bandwidth": 10}},
               {"name": "b", "kind": "ps", "capacity": {"bandwidth": 10}}]  # fmt: skip
    with pytest.raises(SpecError) as err:
        cluster_from_dict(["bandwidth"], servers)
    assert [str(p) for p in err.value.problems] == ["servers[1].name: duplicate server name 'a'"]


@pytest.mark.parametrize("kind", ["worker", "ps"])
def test_a_cluster_needs_servers_of_both_kinds(kind: str) -> None:
    servers = [{"name": f"s{i}", "kind": kind, "capacity": {"bandwidth": 10}} for i in range(2)]
    other = "ps" if kind == "worker" else "worker"
    with pytest.raises(SpecError) as err:
        cluster_from_dict(["bandwidth"], servers)
    assert [str(p) for p in err.value.problems] == [f"servers: needs at least one {other!r} server"]


INDEPENDENT = [
    # a field that does not parse, and a bandwidth of 0 (it was checked only after)
    ({"epochs": "x", "worker": {**PEOPLE["worker"], "bandwidth": 0}},
     ["job.epochs: must be an integer, got the string 'x'",
      "job.worker.bandwidth: must be > 0 (transfer time divides by it)"]),
    # ... and b > B, which needs only the worker and the PS
    ({"grad_mb": -1, "worker": {**PEOPLE["worker"], "bandwidth": 9}},
     ["job.grad_mb: must be > 0, got -1",
      "job.worker.bandwidth: worker bandwidth b = 9 exceeds PS bandwidth B = 5 (Gbps): "
      "the job would need more PS than workers, b / B of a PS per worker (constraints 6 "
      "and 7, z >= y b / B and z <= y, cannot both hold); give ps.bandwidth at least "
      "worker.bandwidth"]),
    # a utility without its deadline, and a PS that fits nowhere with b > B
    ({"utility": {"kind": "deadline", "value": 40},
      "worker": {**PEOPLE["worker"], "bandwidth": 9}, "ps": {**PEOPLE["ps"], "gpu": 1}},
     ["job.utility.deadline: is required",
      "job.ps: one ps fits on no ps server, even empty (gpu: it needs 1, the largest has 0)",
      "job.worker.bandwidth: worker bandwidth b = 9 exceeds PS bandwidth B = 5 (Gbps): "
      "the job would need more PS than workers, b / B of a PS per worker (constraints 6 "
      "and 7, z >= y b / B and z <= y, cannot both hold); give ps.bandwidth at least "
      "worker.bandwidth"]),
    # an unknown resource, and a known one too small to count
    ({"worker": {**PEOPLE["worker"], "tpu": 1, "cpu": 1e-300}},
     ["job.worker.tpu: unknown resource (the cluster has: gpu, cpu, mem, disk, bandwidth)",
      "job.worker.cpu: must be 0 or at least 1e-09, got 1e-300"]),
]  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), INDEPENDENT)
def test_independent_problems_are_reported_together(
    change: dict[str, Any], expected: list[str]
) -> None:
    """Before: a spec's problems came in stages (its fields; then bandwidths > 0; then
    b > B; then room on a server), each stage only once the one before passed, so a
    user fixed one and heard of the next. Each stage's check of a field that parsed is
    now made with the others; what needs a field that did not parse is not."""
    assert problems({**PEOPLE, **change}) == expected


def test_the_spec3_form_still_parses_unchanged() -> None:
    spec3 = {
        "id": "s3",
        "epochs": 2,
        "chunks": 4,
        "minibatches": 50,
        "tau": 0.01,
        "grad_mb": 100,
        "worker": PEOPLE["worker"],
        "ps": PEOPLE["ps"],
        "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
    }
    job = parse(spec3)
    assert job.tau == 0.01 and job.utility == Sigmoid(50.0, 0.5, 3.0)
    trace_job = job_from_dict(
        {**spec3, "arrival": 2}, CLUSTER, slot_seconds=SLOT, slots_available=lambda a: 20 - a
    )
    assert trace_job.arrival == 2


def test_issue_12_numbers_are_clean_errors() -> None:
    tiny = {**PEOPLE, "worker": {**PEOPLE["worker"], "gpu": 5e-324}}
    assert problems(tiny) == ["job.worker.gpu: must be 0 or at least 1e-09, got 5e-324"]
    far = {**PEOPLE, "utility": {"kind": "sigmoid", "priority": 1, "decay": 1, "target": -1e308}}
    assert problems(far) == [
        "job.utility.target: must be at most 2**53 slots away, got -1e+308 slots"
    ]
    steep = {**PEOPLE, "utility": {"kind": "sigmoid", "priority": 1, "decay": 1e300, "target": 1}}
    assert problems(steep) == ["job.utility.decay: must be at most 2**53, got 1e+300"]


def test_deadline_utility_is_non_increasing_and_exact_in_logs() -> None:
    d = np.arange(1, 30)
    for u in (Deadline(10.0, 4.0), Deadline(10.0, 4.5, 2.0)):
        values = u.values(d)
        assert np.all(np.diff(values) <= 0)
        assert values[:4].tolist() == [10.0] * 4
    assert Deadline(10.0, 4.0).values(5) == 0.0
    assert float(Deadline(10.0, 4.0, 2.0).values(8)) == pytest.approx(2.5)
    far = float(Deadline(10.0, 1.0, 1.0).log_values(5000))
    assert far == pytest.approx(np.log(10.0) - 4999 * np.log(2.0))  # no underflow to -inf


# -- the daemon's edge: ids, times, worth ------------------------------------------


TIMES = SlotTimes(epoch=1_800_000_000.0, slot_seconds=SLOT)


def test_prepare_makes_ids_and_resolves_times_to_slots() -> None:
    spec = {k: v for k, v in PEOPLE.items() if k != "id"}
    spec["utility"] = {"kind": "deadline", "value": 40, "deadline": format_time(TIMES.start(30))}
    ready = prepare(spec, TIMES)
    assert ready["id"].startswith("job-") and len(ready["id"]) == 20
    assert prepare(spec, TIMES)["id"] != ready["id"]
    assert ready["utility"]["deadline"] == {"slot": 30}
    assert has_times(ready) and not has_times(PEOPLE)
    # mid-slot rounds down: done by the start of slot 30 ends by 30:59 at the latest
    later = {
        **spec,
        "utility": {**spec["utility"], "deadline": format_time(TIMES.start(30) + 1800)},
    }
    assert prepare(later, TIMES)["utility"]["deadline"] == {"slot": 30}
    # shown again as the time, which reads back to the same slot
    shown = for_display(ready, TIMES)
    assert shown["utility"]["deadline"] == format_time(TIMES.start(30))
    assert prepare(shown, TIMES)["utility"] == ready["utility"]
    # the deadline counts from the arrival: slot 30 from an arrival at 10 is 20 slots
    assert parse(ready, arrival=10).utility.deadline == 20
    # a time without an offset is left for the parser to name with the rest
    naive = {**spec, "utility": {**spec["utility"], "deadline": "2030-01-01T18:00"}}
    assert problems(prepare(naive, TIMES))[-1].startswith(
        "job.utility.deadline: the time '2030-01-01T18:00' has no UTC offset"
    )


def test_json_and_typed_fields_store_the_same_job() -> None:
    """A SPEC 3 job sent as JSON (``"gpu": 1``) and as typed fields (``gpu = 1.0``) is
    stored as one canonical spec, so a retry by either path is a duplicate."""
    from controller.admission import canonical_spec
    from controller.convert import spec_to_proto
    from tests.servers import SMALL_JOB

    job = {**SMALL_JOB, "id": "same", "tau": 1, "utility": {"kind": "table", "values": [9, 3]}}
    typed = prepare(spec_from_proto(spec_to_proto(job)), TIMES)
    sent = prepare(spec_from_proto(pb.JobSpec(json=json.dumps(job))), TIMES)
    assert canonical_spec(sent) == canonical_spec(typed)


def test_a_spec_written_otherwise_is_the_same_job() -> None:
    """What the daemon compares a retried id's spec with: the job as it reads it, so
    ``8.0`` is 8 and ``"120m"`` is ``"2h"`` (before: ALREADY_EXISTS 'another spec')."""
    stored = prepare(PEOPLE, TIMES)
    assert stored["chunks"] == 4 and isinstance(
        prepare({**PEOPLE, "chunks": 4.0}, TIMES)["chunks"], int
    )
    utility = PEOPLE["utility"]
    for same in (
        {**PEOPLE, "chunks": 4.0, "epochs": 2e0},
        {**PEOPLE, "utility": {**utility, "half_life": "1h30m", "deadline": "360m"}},
        {**PEOPLE, "utility": {**utility, "half_life": 1.5, "deadline": 6}},  # slots
        {**PEOPLE, "grad_mb": 100.0, "worker": {**PEOPLE["worker"], "gpu": 1.0}},
    ):
        assert spec_differences(stored, prepare(same, TIMES), slot_seconds=SLOT) == []
    # a spec stored before numbers were stored as floats
    assert spec_differences(PEOPLE, stored, slot_seconds=SLOT) == []
    other = {**PEOPLE, "chunks": 8, "utility": {**utility, "half_life": "3h"}, "grad_mb": None}
    del other["minibatch_seconds"]
    assert spec_differences(stored, prepare(other, TIMES), slot_seconds=SLOT) == [
        "chunks: stored 4, sent 8",
        "grad_mb: stored 100, sent null",
        "minibatch_seconds: stored 36, sent none",
        "utility.half_life: stored 1.5 slots (1h30m), sent 3 slots (3h)",
    ]
    due = {**PEOPLE, "utility": {**utility, "deadline": format_time(TIMES.start(30))}}
    later = {**PEOPLE, "utility": {**utility, "deadline": format_time(TIMES.start(31))}}
    assert spec_differences(
        prepare(due, TIMES), prepare(later, TIMES), slot_seconds=SLOT, times=TIMES
    ) == [f"utility.deadline: stored {format_time(TIMES.start(30))}, sent "
          f"{format_time(TIMES.start(31))}"]  # fmt: skip


def test_check_worth_says_how_far_a_deadline_is_too_close() -> None:
    spec = {
        **PEOPLE,
        "minibatch_seconds": 90,
        "utility": {"kind": "deadline", "value": 5, "deadline": "2h"},
    }
    with pytest.raises(SpecError) as err:
        check_worth(spec, cluster=CLUSTER, slot_seconds=SLOT, window=48, arrival=5)
    assert str(err.value).startswith(
        "job.utility.deadline: leaves 2 slots (2h) after the job's arrival, but it needs at "
        "least 3 slots (3h) even on an empty cluster, and its value after the deadline is 0: "
        "give a later deadline, or a half_life; job.work: "
    )
    assert err.value.problems[1].reason == (
        "2 x 4 x 50 mini-batches of 91.6 s (90 s compute + 1.6 s gradient transfer) = "
        "10.17777778 worker-slots, rounded up to 11"
    )
    kept = {**spec, "utility": {**spec["utility"], "half_life": "1h"}}
    check_worth(kept, cluster=CLUSTER, slot_seconds=SLOT, window=48, arrival=5)
    # a half-life too short to hold as a decay is refused as such, not read as "no
    # half_life" through 0 * inf = nan on time
    for tiny in (5e-324, 1e-310, 1e-17):
        short = {**spec, "utility": {**spec["utility"], "half_life": tiny}}
        with pytest.raises(SpecError, match=r"job.utility.half_life: must be at least 2\*\*-53"):
            check_worth(short, cluster=CLUSTER, slot_seconds=SLOT, window=48, arrival=5)
    assert (
        Deadline(40.0, 6.0, 1e-15).log_values([5.0, 6.0, 7.0]).tolist()[:2] == [math.log(40.0)] * 2
    )
    table = {**PEOPLE, "minibatch_seconds": 90, "utility": {"kind": "table", "values": [9, 9, 0]}}
    with pytest.raises(SpecError, match=r"job.utility: is 0 at 3 slots \(3h\)"):
        check_worth(table, cluster=CLUSTER, slot_seconds=SLOT, window=48, arrival=5)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (
            '{"a": 1,\n}',
            "(a comma after the last item, at line 1 column 8: JSON allows none there; remove it)",
        ),
        ("[1, 2,]", "(a comma after the last item, at line 1 column 6:"),
        ("{'a': 1}", "(JSON takes double quotes around keys and strings, not single ones)"),
        ("{a: 1}", '(a key without quotes: JSON takes "a", in double quotes)'),
        ('{"a": True}', "(JSON writes true, not True)"),
        ('{"a": None}', "(JSON writes null, not None)"),
        ('{"a": yes}', "(JSON writes true or false, not yes)"),
        ('{"a": 6h}', '(a number with a unit is text in JSON: put it in double quotes, "6h")'),
        ('{"a": 16GiB}', 'put it in double quotes, "16GiB")'),
        ('{"a": 2030-06-01T18:00:00Z}', 'put it in double quotes, "2030-06-01T18:00:00Z")'),
        ('{"a": six}', '(text without quotes: JSON takes "six", in double quotes)'),
        ('{"a": .5}', "(a JSON number begins with a digit or '-': 0.5, not .5; 1, not +1)"),
        ('{"a": 1 # hours\n}', "(JSON has no comments; remove it)"),
        ('// a job\n{"a": 1}', "(JSON has no comments; remove it)"),
        ('{"a": 1 /* hours */}', "(JSON has no comments; remove it)"),
        ('{"a": 1\n "b": 2}', "(a comma missing at the end of line 1)"),
        ('{"a": 1}\n{"b": 2}', "several jobs go in one list, [...])"),
        (
            "epochs: 10\nchunks: 8\n",
            '(this reads as YAML: a job file is JSON, {"key": value, ...})',
        ),
        # after blank lines or indentation, or after YAML's own first line: it was read
        # as text without quotes, or given no hint at all
        ("\n\nepochs: 10\n", '(this reads as YAML: a job file is JSON, {"key": value, ...})'),
        ("  epochs: 10\n", '(this reads as YAML: a job file is JSON, {"key": value, ...})'),
        ("---\nepochs: 10\n", '(this reads as YAML: a job file is JSON, {"key": value, ...})'),
        ("%YAML 1.2\n---\n", '(this reads as YAML: a job file is JSON, {"key": value, ...})'),
        ("", "(the file is empty)"),
    ],
)
def test_json_mistakes_are_named_with_what_to_change(text: str, hint: str) -> None:
    """The specs audit: a job file written with YAML's, Python's or JavaScript's habits
    got the parser's words alone (a trailing comma read "Expecting property name
    enclosed in double quotes" at the line after it)."""
    with pytest.raises(SpecError) as err:
        read_json(text)
    assert hint in str(err.value), str(err.value)


def test_a_key_of_a_demand_or_of_the_utility_given_beside_epochs_is_told_where_it_goes() -> None:
    """The specs audit: a flattened spec (``"gpu": 1``, ``"deadline": "6h"`` beside
    ``epochs``, as YAML habits write it) was told "unknown key (known: arrival, chunks,
    ...)", naming neither worker nor utility."""
    assert problems({**PEOPLE, "gpu": 1, "deadline": "6h", "epoch": 3}) == [
        'job.gpu: unknown key: a demand goes under worker or ps, as in "worker": {"gpu": ...}',
        'job.deadline: unknown key: it goes under utility, as in "utility": {"kind": ..., '
        '"deadline": ...}',
        "job.epoch: unknown key; did you mean 'epochs'?",
    ]


def test_json_specs_are_read_with_clean_errors() -> None:
    assert read_json('{"a": 1}') == {"a": 1}
    for text, message in [
        ("[" * 100_000, "nested too deeply"),
        ("{", "not JSON: Expecting property name"),
        ("[1]", "must be a JSON object"),
        ('{"a": ' + "9" * 5000 + "}", "not JSON that can be read: an integer of more than"),
    ]:
        with pytest.raises(SpecError, match=message):
            read_json(text)
    # a gRPC client's 5000-digit number was told Python's remedy, as oasis submit is not
    with pytest.raises(SpecError) as err:
        read_json('{"a": ' + "9" * 5000 + "}")
    assert "sys.set_int_max_str_digits" not in str(err.value)
    both = pb.JobSpec(json="{}", epochs=3)
    with pytest.raises(SpecError, match=r"job\.epochs: give the typed fields or json"):
        spec_from_proto(both)
    assert spec_from_proto(pb.JobSpec(id="x", json='{"epochs": 1}')) == {"epochs": 1, "id": "x"}


def test_new_ids_are_in_the_safe_alphabet() -> None:
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i[4:].isalnum() and i.startswith("job-") for i in ids)


def test_error_messages_are_bounded() -> None:
    many = [
        Problem(f"job.worker.r{i}" + "x" * 500, "unknown resource " * 100) for i in range(40_000)
    ]
    out = bounded(many)
    assert out[-1].reason == f"and {40_000 - len(out) + 1} more problems"
    assert len(str(out[0])) <= MAX_TEXT + MAX_REASON + 2
    assert sum(len(str(p).encode()) + 2 for p in out) <= MAX_BYTES + 100
    few = [Problem("job.a", "bad"), Problem("job.b", "worse")]
    assert bounded(few) == few


def test_the_bounds_of_an_error_hold_at_their_edges() -> None:
    """A field of exactly MAX_TEXT characters is whole; the problems listed, joined with
    "; " as the message is, fit in MAX_BYTES; the first is listed even when it alone is
    over (200 four-byte characters in its field and its reason); and any other error's
    message is cut too (escaped, to 4 x MAX_TEXT characters)."""
    import grpc

    from controller.statuses import _status

    edge = Problem("f" * MAX_TEXT, "r" * MAX_REASON)
    assert bounded([edge]) == [edge]
    out = bounded([Problem("job.a", "b") for _ in range(1000)])
    assert len("; ".join(str(p) for p in out[:-1]).encode()) <= MAX_BYTES
    assert out[-1].reason == f"and {1000 - len(out) + 1} more problems"
    wide = Problem("\U0001f600" * MAX_TEXT, "\U0001f600" * MAX_TEXT)
    assert bounded([wide, Problem("job.b", "c")])[0] == wide
    status = _status(grpc.StatusCode.FAILED_PRECONDITION, ValueError("x\x1b" * 5000))
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert len(status.message) <= 4 * MAX_TEXT and "\x1b" not in status.message


def test_a_key_given_twice_is_refused_not_read_as_the_last(tmp_path: Any) -> None:
    """The units audit: a worker of ``{"gpu": 1, ..., "gpu": 8}`` (a line copied and
    edited, one of the two forgotten) was read as 8 GPUs without a word, by the daemon,
    ``oasis submit``/``quote`` (which sent the spec on re-written, the first value gone)
    and ``oasis replay``; JSON readers differ on which value counts (some take the
    first), so a spec reviewed with one tool was admitted as another job."""
    from controller.commands.common import InputError
    from controller.commands.common import read_json as read_file

    text = '{"epochs": 2, "worker": {"gpu": 1, "mem": 16, "gpu": 8}}'
    message = (
        "the key 'gpu' is given twice in one object (1, then 8): JSON readers differ on "
        "which one counts; give it once"
    )
    with pytest.raises(SpecError) as err:
        read_json(text)
    assert [str(p) for p in err.value.problems] == [f"job: {message}"]
    path = tmp_path / "job.json"
    path.write_text(f"[{text}]")
    with pytest.raises(InputError) as got:
        read_file(str(path))
    assert str(got.value) == f"{path}: {message}"
    assert read_json('{"a": {"b": 1}, "b": {"a": 2}}') == {"a": {"b": 1}, "b": {"a": 2}}


def test_work_too_long_for_the_window_says_it_in_time_and_how_the_work_came_to_be() -> None:
    """The units audit: ``"tau": 1.5`` written as the seconds of a mini-batch (it is
    SPEC 3's slots: 1.5 hours) was refused with "work of 601 worker-slots needs at least
    151 slots ... but only 48 remain", in slots alone and with no word of where 601
    came from. It now gives the slots as time, and the work's mini-batches in seconds,
    as the deadline's refusal does."""
    spec = {k: v for k, v in PEOPLE.items() if k != "minibatch_seconds"} | {"tau": 1.5}
    assert problems(spec) == [
        "job: work of 601 worker-slots needs at least 151 slots (6d7h) even on an empty "
        "cluster (at most 4 workers per slot: one per chunk, chunks = 4), but only 48 (2d) "
        "remain from its arrival to its window's end",
        "job.work: 2 x 4 x 50 mini-batches of 5401.6 s (5400 s compute + 1.6 s gradient "
        "transfer) = 600.1777778 worker-slots, rounded up to 601",
    ]
    # the specs audit: "(at most 4 workers per slot)" did not say what held it there
    wide = problems({**spec, "chunks": 10**6})[0]
    assert "(at most 4 workers per slot: as many as the worker servers hold)" in wide, wide


def test_the_daemons_own_long_reasons_reach_the_client_whole() -> None:
    """The cut to 200 characters was made for hostile input (keys of 10 kB), but it also
    cut the daemon's own reasons: a worker too large in four resources lost the fourth
    (`...; disk:...(206 characters)`), a deadline before the arrival lost its remedy
    (`give a later deadline, or a half_life`), so the user fixed three and met the next."""
    worker = {"gpu": 16, "cpu": 64, "mem": 1024, "disk": 1000, "bandwidth": 1}
    with pytest.raises(SpecError) as err:
        parse({**PEOPLE, "worker": worker})
    assert len(err.value.problems[0].reason) > 200  # the case at hand
    assert bounded(err.value.problems) == list(err.value.problems)
    past = {**PEOPLE["utility"], "deadline": {"slot": 2}}
    del past["half_life"]
    with pytest.raises(SpecError) as err:
        check_worth({**PEOPLE, "utility": past}, cluster=CLUSTER, slot_seconds=SLOT,
                    window=48, arrival=30)  # fmt: skip
    shown = bounded(err.value.problems)
    assert shown == list(err.value.problems)
    assert shown[0].reason.endswith("give a later deadline, or a half_life")
    # a reason of wide characters is still cut to the bytes the trailers hold
    (wide,) = bounded([Problem("job.x", "\u4e00" * 1000)])
    assert len(str(wide).encode()) <= MAX_BYTES


# -- the client's side ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("127.0.0.1", "127.0.0.1:50051"),
        ("head", "head:50051"),
        ("head:7000", "head:7000"),
        ("head:", "head:50051"),
        ("::1", "[::1]:50051"),
        ("[::1]", "[::1]:50051"),
        ("[::1]:7000", "[::1]:7000"),
        ("dns:///head:7000", "dns:///head:7000"),
        ("unix:/run/oasis.sock", "unix:/run/oasis.sock"),
    ],
)
def test_a_server_without_a_port_means_50051(given: str, address: str) -> None:
    assert daemon_address(given) == address


def test_records_are_plain_json() -> None:
    job = pb.Job(
        spec=pb.JobSpec(id="a", json=json.dumps({"id": "a", "epochs": 2})),
        state=pb.JOB_STATE_ADMITTED,
        decision=pb.Decision(
            admitted=True, payoff=1.5, arrival_slot=3, completion_slot=4, work=2**40
        ),
        sequence=7,
    )
    job.decision.allocations.add(slot=3, server="w0", workers=2)
    job.decision.allocations.add(slot=3, server="p0", ps=1)
    record = job_record(job, SlotTimes(0.0, SLOT))
    assert record["state"] == "admitted" and record["spec"] == {"id": "a", "epochs": 2}
    d = record["decision"]
    assert d["work"] == 2**40 and d["cost"] is None and d["payoff"] == 1.5
    assert d["allocations"] == [
        {"slot": 3, "server": "w0", "workers": 2},
        {"slot": 3, "server": "p0", "ps": 1},
    ]
    assert d["arrives_at"] == "1970-01-01T03:00:00Z" and d["completes_by"] == "1970-01-01T05:00:00Z"
    assert plain(pb.Server(name="w0", kind=pb.SERVER_KIND_PS))["kind"] == "ps"
    assert state_name(pb.JOB_STATE_CANCELLED) == "cancelled"
    # an enum left at 0 is no word: an event that names no job state (the mutation
    # audit: "unspecified" printed for it survived every test)
    event = plain(pb.Event(sequence=3, kind="cordoned"))
    assert event["state"] is None and event["kind"] == "cordoned"
    assert plain(pb.Server(name="x"))["kind"] is None


def _ended(state: pb.JobState, ran_until: int | None) -> pb.Job:
    """A job admitted to run in slots 3..7 (jct 5, utility 100), now in ``state``."""
    d = pb.Decision(admitted=True, payoff=99.5, cost=0.5, arrival_slot=3, jct=5, utility=100.0)
    if ran_until is not None:
        d.completion_slot = ran_until
    return pb.Job(spec=pb.JobSpec(id="c", json=json.dumps({"id": "c"})), state=state, decision=d)


def test_a_cancelled_or_failed_jobs_plan_is_not_shown_as_earned() -> None:
    """Before: ``oasis cancel X --json`` gave ``"completion_slot": null, "jct": 5,
    "utility": 100.0`` and ``oasis jobs`` a jct, payoff and utility as if earned."""
    from controller.commands.client import _decision_lines, _job_row

    times = SlotTimes(0.0, SLOT)
    planned = {"completion_slot": 7, "jct": 5, "utility": 100.0}
    for state, ran_until in ((pb.JOB_STATE_CANCELLED, 4), (pb.JOB_STATE_FAILED, 7)):
        job = _ended(state, ran_until)
        record = job_record(job, times)
        d = record["decision"]
        assert (d["jct"], d["utility"], d["completes_by"]) == (None, None, None)
        assert d["completion_slot"] == ran_until and d["payoff"] == 99.5
        assert record["planned"] == planned
        assert _job_row(job, None)[4:] == ["-", "-", "-", "-"]
        line = next(_decision_lines("c", job.decision, None, state_name(state), job=job))
        assert line.startswith(f"c: {state_name(state)}")
        assert "payoff 99.5 (planned: completion in slot 7, jct 5, utility 100)" in line
    failed = _ended(pb.JOB_STATE_FAILED, 7)
    failed.decision.reason = "failed from slot 8: its server w0 failed"
    line = next(_decision_lines("c", failed.decision, None, "failed", job=failed))
    assert line.startswith("c: failed from slot 8: its server w0 failed; it had been admitted")
    assert "event says why" not in line  # a submitter may not read the events
    never = _ended(pb.JOB_STATE_CANCELLED, None)
    assert job_record(never, times)["decision"]["completion_slot"] is None
    assert "cancelled (never ran)" in next(_decision_lines("c", never.decision, None, "cancelled"))
    done = job_record(_ended(pb.JOB_STATE_COMPLETED, 7), times)
    assert done["decision"]["jct"] == 5 and done["planned"] == planned
    rejected = pb.Job(state=pb.JOB_STATE_REJECTED, decision=pb.Decision(payoff=-1.0))
    assert job_record(rejected, times)["planned"] is None


def test_a_jobs_lines_name_its_state() -> None:
    """Before: a completed job's detail line (``oasis job``, a duplicate ``submit``) said
    'admitted', the table and --json 'completed'."""
    from controller.commands.client import _decision_lines

    for state, words in (
        ("", "c: admitted, arrives in slot 3, completes in slot 7 (jct 5)"),
        ("admitted", "c: admitted, arrives in slot 3, completes in slot 7 (jct 5)"),
        ("running", "c: running (admitted), arrived in slot 3, completes in slot 7 (jct 5)"),
        ("completed", "c: completed (admitted), arrived in slot 3, completed in slot 7 (jct 5)"),
    ):
        job = _ended(pb.JOB_STATE_COMPLETED, 7)
        assert next(_decision_lines("c", job.decision, None, state)).startswith(words)


def test_the_client_imports_no_server_side_code() -> None:
    """``oasis`` client commands start without SQLAlchemy, Alembic, numba or numpy."""
    code = (
        "import sys\n"
        "from controller.cli import build_parser\n"
        "for c in ('submit', 'jobs', 'status', 'progress', 'watch', ''):\n"
        "    build_parser(c)\n"
        "import controller.commands.connection, controller.commands.records\n"
        "heavy = ('sqlalchemy', 'alembic', 'numba', 'numpy', 'scipy', 'structlog')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_every_command_has_one_summary() -> None:
    """``oasis --help`` lists each command from controller.commands.COMMANDS without
    loading it; the loaded modules say the same."""
    from controller.cli import build_parser
    from controller.commands import COMMANDS

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    shown = {a.dest: a.help for a in sub._choices_actions}
    assert shown == {name: c.summary for name, c in COMMANDS.items()}


def test_a_suggestion_prefers_the_name_that_differs_only_by_lookalike_characters() -> None:
    """``p2-8x-O`` (the letter O) among ``p2-8x-0`` and ``p2-8x-1``: difflib rates both
    alike and suggested ``p2-8x-1`` (seen by the README audit); the name that differs
    only in a character that looks alike, or in case, comes first."""
    from controller.plane.agent import UnknownServerError
    from pricing.fields import closest

    known = ["p0", "p2-8x-1", "p2-8x-0", "w0"]
    assert closest("p2-8x-O", known) == "p2-8x-0"
    assert closest("P2-8X-l", known) == "p2-8x-1"
    assert closest("epoch", ["epochs", "chunks"]) == "epochs"  # else difflib's best
    assert closest("zzz", known) is None
    # a far name is suggested nothing, not the least unlike one ("disk" is 0.31 like
    # "bandwidth"; mutation audit: a cutoff of 0.3 survived)
    assert closest("disk", ["bandwidth", "cpu", "gpu"]) is None
    assert str(UnknownServerError("p2-8x-O", known)).endswith("did you mean 'p2-8x-0'?")


def test_a_time_with_seconds_keeps_them_in_tables() -> None:
    """The units audit: with slots of 90 s, "done by Sat 01:28" while --json said
    01:28:30; a whole minute is still shown without seconds."""
    import os
    import time

    from controller.commands.records import local_time

    zone = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        at = 1764293310.0  # 2025-11-28T01:28:30Z, a Friday
        assert local_time(at, now=at) == "Fri 01:28:30"
        assert local_time(at + 30, now=at) == "Fri 01:29"
        assert local_time(at, now=0.0) == "2025-11-28 01:28:30"
        # the store audit: a slot an edit set 2**63 out raised OverflowError in every
        # table that showed it (oasis jobs, status): shown as format_time shows it
        assert (
            local_time(2.0**63 * 3600, now=at)
            == f"{2.0**63 * 3600:.6g} s after 1970-01-01T00:00:00Z"
        )
        # across a clock change, a time in the other offset names its zone (the caption
        # names the zone in force now): DST from 03:00 on the last Saturday of November
        os.environ["TZ"] = "STD0DST-1,M11.5.6/3,M12.1.0"
        time.tzset()
        now = 1795827600.0  # 2026-11-28T01:00:00Z, a Saturday
        shown = [local_time(now + k * 3600, now=now) for k in range(4)]
        assert shown == ["Sat 01:00", "Sat 02:00", "Sat 04:00 DST", "Sat 05:00 DST"]
    finally:
        if zone is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = zone
        time.tzset()


def test_an_amount_in_a_users_unit_is_told_the_clusters() -> None:
    """The units audit: "16GiB" for a worker's mem read "must be a number, got the
    string '16GiB'", with no word on the unit expected. The cluster's capacities have
    the unit; the message gives the largest, as a scale."""
    got = problems({**PEOPLE, "worker": {**PEOPLE["worker"], "mem": "16GiB"}})
    assert got == [
        "job.worker.mem: must be a number, in the unit of the cluster's capacities (its "
        "largest server has mem 244), got '16GiB'"
    ], got


def test_a_bandwidth_in_a_unit_is_told_gbps_and_a_list_is_told_no_infinite_server() -> None:
    """The units audit, again: ``"bandwidth": "10Gbps"`` was told the unit of "the
    cluster's capacities", though SPEC 2 fixes it (Gbps, which b and B divide); a list
    given to ``oasis submit`` is read first against a cluster of unbounded servers, and
    its items were told "its largest server has mem inf"; ``"GPU"`` was an unknown
    resource with no word of ``gpu``."""
    from controller.commands.precheck import item_problems

    got = problems({**PEOPLE, "worker": {**PEOPLE["worker"], "bandwidth": "10Gbps"}})
    assert got == [
        "job.worker.bandwidth: must be a number of Gbps (gigabits per second: 10 Gb/s is "
        "10, 1 GB/s is 8), got '10Gbps'"
    ], got
    spec = {**PEOPLE, "worker": {**PEOPLE["worker"], "mem": "16GiB"}}
    _, found = item_problems(spec, SlotTimes(0.0, SLOT), 48, 10)
    assert [str(p) for p in found] == [
        "job.worker.mem: must be a number, in the unit of the cluster's capacities, got '16GiB'"
    ]
    worker = {**PEOPLE["worker"], "GPU": 1, "Tpu": 1}
    assert problems({**PEOPLE, "worker": worker}) == [
        "job.worker.GPU: unknown resource; did you mean 'gpu'? (the cluster has: gpu, cpu, "
        "mem, disk, bandwidth)",
        "job.worker.Tpu: unknown resource (the cluster has: gpu, cpu, mem, disk, bandwidth)",
    ]


def test_a_capacity_in_a_unit_is_refused_naming_the_key() -> None:
    """The store audit: a capacity of "488GiB" in ``[cluster]`` (or a stored server row)
    raised IndexError while the message was built (the cluster being read had no
    servers to name a unit by): oasisd exited 1 with a traceback, which systemd restarts,
    where a bad config exits 2 naming the key."""
    servers = [{"name": "w0", "kind": "worker", "capacity": {"gpu": 8, "mem": "488GiB",
                                                             "bandwidth": 10}},
               {"name": "p0", "kind": "ps", "capacity": {"mem": 64, "bandwidth": 10}}]  # fmt: skip
    with pytest.raises(SpecError) as err:
        cluster_from_dict(["gpu", "mem", "bandwidth"], servers, "cluster.")
    assert [str(p) for p in err.value.problems] == [
        "cluster.servers[0].capacity.mem: must be a number (amounts have no unit: give "
        "every server's and job's mem in one unit), got '488GiB'"
    ]


def test_a_minibatch_time_may_be_a_duration() -> None:
    """The units audit: ``"minibatch_seconds": "1.5s"`` was "must be a number" while a
    deadline took "2 h". It takes a duration now, is the same job as 1.5 (a retry in
    either form is one job), and other text names what it takes."""
    from controller.jobspec import spec_differences

    as_number = parse({**PEOPLE, "minibatch_seconds": 36})
    as_text = parse({**PEOPLE, "minibatch_seconds": "36s"})
    assert (as_text.tau, as_text.work) == (as_number.tau, as_number.work) == (0.01, as_number.work)
    text, number = {**PEOPLE, "minibatch_seconds": "36s"}, {**PEOPLE, "minibatch_seconds": 36}
    assert spec_differences(text, number, slot_seconds=3600.0) == []
    assert problems({**PEOPLE, "minibatch_seconds": "fast"}) == [
        'job.minibatch_seconds: must be a number of seconds or a duration such as "1.5s" or '
        "\"2m\"; got 'fast'"
    ]


def test_a_bandwidth_left_out_is_told_required_not_must_be_positive() -> None:
    """Every other demand left out is 0, but a bandwidth must be given (b and B divide
    the transfer time). A worker written ``{"gpu": 1}`` was told ``bandwidth: must be >
    0``, of a field the tenant never wrote; now it is told the field is required and in
    which unit. A bandwidth of 0 is still told it must be > 0."""
    ps = {k: v for k, v in PEOPLE["ps"].items() if k != "bandwidth"}
    assert problems({**PEOPLE, "worker": {"gpu": 1}, "ps": ps}) == [
        "job.worker.bandwidth: is required: the network bandwidth of one worker, in Gbps, > 0 "
        "(transfer time divides by it)",
        "job.ps.bandwidth: is required: the network bandwidth of one ps, in Gbps, > 0 "
        "(transfer time divides by it)",
    ]
    assert problems({**PEOPLE, "worker": {**PEOPLE["worker"], "bandwidth": 0}}) == [
        "job.worker.bandwidth: must be > 0 (transfer time divides by it)"
    ]


@pytest.mark.parametrize("slot_seconds", [900.0, 3600.0, 7200.0])
def test_decay_per_hour_is_converted_with_the_slot_length(slot_seconds: float) -> None:
    """``decay_per_hour`` is a decay per hour: per slot it is that times the slot's hours
    (a quarter of it for 15-minute slots, twice it for 2-hour ones), like ``decay``
    given per slot; ``target`` in hours likewise becomes slots."""
    hours = slot_seconds / 3600.0
    got = utility_from_dict(
        {"kind": "sigmoid", "priority": 5, "target": "6h", "decay_per_hour": 2.0},
        "u",
        slot_seconds=slot_seconds,
    )
    assert got == Sigmoid(5.0, 2.0 * hours, 6.0 / hours)


@pytest.mark.parametrize("deadline", [0, 0.0, -2, "0h"])
def test_a_deadline_at_or_before_the_arrival_is_refused(deadline: Any) -> None:
    """A completion time is at least 1 slot, so a deadline of 0 slots (or a duration of
    none) would be worth nothing at any end: it is refused naming the field, as a
    negative one is; a deadline just after the arrival is fine."""
    raw = {"kind": "deadline", "value": 3, "deadline": deadline}
    with pytest.raises(SpecError) as err:
        utility_from_dict(raw, "u", slot_seconds=3600.0)
    assert err.value.field == "u.deadline" and "must be after the arrival" in str(err.value)
    ok = utility_from_dict({**raw, "deadline": 0.5}, "u", slot_seconds=3600.0)
    assert ok == Deadline(3.0, 0.5)


READS = [
    # (reader, value, the reason the field is refused with); JSON's true is no count
    ("integer", True, "must be an integer, got a boolean"),
    ("integer", 4.5, "must be an integer, got 4.5"),
    ("integer", 0, "must be >= 1, got 0"),
    ("integer", 2**53 + 1, "must be <= 2**53"),
    ("number", False, "must be a number, got a boolean"),
    ("number", float("-inf"), "must be finite, got -inf"),
    ("number", 10**400, "must be finite, got 10000000000000000000...(401 characters)"),
    ("positive", 0, "must be > 0, got 0"),
    ("non_negative", -1e-9, "must be >= 0, got -1e-09"),
    ("text", " \t", "must be a non-empty string, got the string ' \\t'"),
    ("text", "x" * 1000, None),
    ("name", "w0\x1b[2J", "must not hold control or invisible format characters, found "
     "'\\x1b' at character 3"),
    ("job_id", "j" * 129, "must be 1-128 characters long, got 129"),
    ("job_id", "a/b", "must be characters of A-Z a-z 0-9 . _ - only (it names an MQTT "
     "topic), got '/' at position 1"),
    ("job_key", ":j0", "must be NAME:ID with NAME 1-200 characters"),
    ("job_key", "ann bob:j0", "must be NAME:ID with NAME 1-200 characters"),
    ("mapping", [], "must be an object, got a list"),
    ("mapping", "x" * 100, f"must be an object, got the string '{'x' * 40}'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("reader", "value", "reason"), READS, ids=[f"{r[0]}-{i}" for i, r in enumerate(READS)]
)
def test_typed_reads_refuse_with_the_field_and_why(
    reader: str, value: Any, reason: str | None
) -> None:
    """pricing.fields' reads of untrusted values: each refusal is a SpecError naming the
    field, its reason bounded (mutation audit: bool as int, 4.5 truncated, the 2**53 and
    job-id length bounds, blank text, a key's owner part matched only as a prefix survived)."""
    from pricing import fields

    read = getattr(fields, reader)
    args = {"minimum": 1} if reader == "integer" else {}
    if reason is None:
        assert read(value, "jobs[3].x", **args) == value
        return
    with pytest.raises(SpecError) as caught:
        read(value, "jobs[3].x", **args)
    assert [p.field for p in caught.value.problems] == ["jobs[3].x"]
    assert str(caught.value).startswith(f"jobs[3].x: {reason}"), str(caught.value)
    assert len(str(caught.value)) < 200


def test_is_integer_and_is_number_take_no_boolean() -> None:
    from pricing.fields import is_integer, is_number

    assert not is_integer(True) and not is_number(False)
    assert is_integer(3) and is_number(3) and is_number(0.5) and not is_integer(3.0)


def test_a_count_past_2_53_is_kept_as_given_and_refused_as_written() -> None:
    """prepare makes an integral float count an int only within 2**53: ``1e300`` chunks
    stays the float, and the refusal shows it as the user wrote it, not as 301 digits
    (mutation audit: the bound in _count dropped survived)."""
    ready = prepare({**PEOPLE, "chunks": 1e300, "epochs": 8.0}, TIMES)
    assert ready["epochs"] == 8 and type(ready["epochs"]) is int
    assert ready["chunks"] == 1e300 and type(ready["chunks"]) is float
    assert problems(ready) == [f"job.chunks: must be <= 2**53 = {2**53}, got 1e+300"]


def test_a_config_table_names_its_first_unknown_key_alone() -> None:
    """check_known_keys names one unknown key at a time, as a config's other mistakes
    are (mutation audit: every unknown key listed survived)."""
    from pricing.fields import check_known_keys

    with pytest.raises(SpecError) as caught:
        check_known_keys({"tokens_fil": "t", "extra": 1}, {"tokens_file"}, "auth")
    assert [str(p) for p in caught.value.problems] == [
        "auth.tokens_fil: unknown key; did you mean 'tokens_file'?"
    ]
