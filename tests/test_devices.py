"""The devices (GPUs) the reference agent hands to its workers
(controller/plane/devices.py): each worker gets devices of its own, as its task's demand
asks, and two tenants' jobs on one server never share a device while the plan fits."""

from __future__ import annotations

import itertools
import random

import pytest

from controller.plane.devices import MAX_DEVICES, Devices, parse_device_ids


def test_whole_demands_get_devices_of_their_own_lowest_first() -> None:
    devices = Devices()
    devices.resize(4)
    a, enough_a = devices.take(1)
    b, enough_b = devices.take(2)
    assert (a, enough_a) == ({"0": 1.0}, True)
    assert (b, enough_b) == ({"1": 1.0, "2": 1.0}, True)
    assert devices.environment(b) == {"CUDA_VISIBLE_DEVICES": "1,2", "OASIS_DEVICES": "1,2"}
    devices.give_back(a)
    c, _ = devices.take(2)
    assert list(c) == ["0", "3"]  # the freed one and the last free one


def test_fractions_pack_best_fit_and_leave_whole_devices_for_whole_demands() -> None:
    devices = Devices()
    devices.resize(2)
    half, _ = devices.take(0.5)
    quarter, _ = devices.take(0.25)
    assert list(half) == list(quarter) == ["0"]  # both on device 0: device 1 stays whole
    whole, enough = devices.take(1)
    assert (list(whole), enough) == (["1"], True)
    more, enough = devices.take(0.25)
    assert (list(more), enough) == (["0"], True)  # 0.25 left on device 0: it fits there
    over, enough = devices.take(0.5)
    assert not enough  # nothing holds half a device any more: shared, and said
    assert list(over) == ["0"] or list(over) == ["1"]


def test_a_worker_that_needs_none_sees_no_device_and_without_a_count_nothing_is_set() -> None:
    devices = Devices()
    assert devices.environment({}) == {}  # no plan count yet: the environment as is
    assert devices.take(1) == ({}, True)
    devices.resize(0)  # a server without GPUs: its workers see none
    assert devices.environment({}) == {"CUDA_VISIBLE_DEVICES": "", "OASIS_DEVICES": ""}
    devices.resize(2)
    none, enough = devices.take(0)
    assert (none, enough) == ({}, True)
    assert devices.environment(none) == {"CUDA_VISIBLE_DEVICES": "", "OASIS_DEVICES": ""}
    given = Devices(["0", "1"])
    given.resize(None)  # the review: ids given, a plan that counts none (an older daemon)
    assert given.environment({}) == {} and given.take(1) == ({}, True)


def test_more_demand_than_free_devices_is_said_and_still_gives_the_asked_number() -> None:
    devices = Devices(["GPU-a", "GPU-b", "GPU-c"])
    devices.resize(8)  # given ids win over the plan's count
    assert devices.ids == ["GPU-a", "GPU-b", "GPU-c"]
    first, _ = devices.take(2)
    second, enough = devices.take(2)
    assert not enough
    assert list(first) == ["GPU-a", "GPU-b"]
    assert len(second) == 2 and "GPU-c" in second
    devices.give_back(first)
    devices.give_back(second)
    assert devices.used == {}
    everything, enough = devices.take(5)  # more pieces than devices: every device, said
    assert (list(everything), enough) == (["GPU-a", "GPU-b", "GPU-c"], False)
    nothing = Devices([])
    nothing.resize(4)
    assert nothing.take(1) == ({}, False)  # none to give: said, not taken as enough


@pytest.mark.parametrize("between", [2, 0, None])
def test_what_workers_hold_stays_held_whatever_the_count_does(between: int | None) -> None:
    """The review: a count that shrank (or a plan without one) and grew back handed out
    devices that running workers still held."""
    devices = Devices()
    devices.resize(4)
    held = [devices.take(1)[0] for _ in range(4)]
    devices.resize(between)
    devices.resize(4)
    assert devices.take(1)[1] is False  # all four still held: short, and said
    for h in held:
        devices.give_back(h)
    devices.give_back({"9": 1.0})  # never held: nothing to give back
    assert devices.used == {"0": 1.0}  # the last take's
    assert devices.take(1) == ({"1": 1.0}, True)


@pytest.mark.parametrize("seed", range(20))
def test_while_the_plan_fits_no_two_workers_share_a_device(seed: int) -> None:
    """Random starts and exits of workers with whole demands (what the daemon plans never
    exceeds the count) and with fractions of a common size: never short, never shared
    beyond a whole device."""
    rng = random.Random(seed)
    count = rng.randint(1, 8)
    devices = Devices()
    devices.resize(count)
    unit = rng.choice([u for u in (1.0, 0.5, 0.25, 2.0) if u <= count])
    running: list[dict[str, float]] = []
    for _ in range(200):
        used = sum(sum(h.values()) for h in running)
        if running and (rng.random() < 0.45 or used + unit > count):
            devices.give_back(running.pop(rng.randrange(len(running))))
            continue
        held, enough = devices.take(unit)
        assert enough, (seed, unit, used, devices.used)
        assert abs(sum(held.values()) - unit) < 1e-9
        running.append(held)
        for one in devices.ids:  # every device's shares add up to at most one device
            assert sum(h.get(one, 0.0) for h in running) <= 1.0 + 1e-9
        if unit >= 1:  # whole demands: pairwise disjoint
            for x, y in itertools.combinations(running, 2):
                assert not set(x) & set(y)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,,1", "id 2 is empty"),
        ("0,1,0", "0 listed twice"),
        ("0, 1 x", "'1 x' is not a device index"),
        ("NoDevFiles", "'NoDevFiles' is not a device index"),
        (",".join(str(i) for i in range(MAX_DEVICES + 1)), "over 1024"),
    ],
)
def test_device_ids_that_cannot_be_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_device_ids(text)


def test_device_ids_parse() -> None:
    assert parse_device_ids("") == []
    assert parse_device_ids("0, 2,GPU-8f1c") == ["0", "2", "GPU-8f1c"]


def test_the_agents_devices_come_from_the_flag_else_its_own_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from controller.commands.agent import _device_ids
    from controller.commands.common import InputError

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _device_ids(None) == (None, "the plan")  # the plan's count decides
    assert _device_ids("2,3") == (["2", "3"], "--devices")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert _device_ids(None) == (["4", "5"], "$CUDA_VISIBLE_DEVICES")
    assert _device_ids("1")[0] == ["1"]  # the flag wins
    # as CUDA reads it (the review): up to the first id that is none
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,-1,2")
    assert _device_ids(None)[0] == ["0", "1"]
    # an id there twice ends the list too: handed out twice, one GPU would go to two
    # workers as two devices
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,0,2")
    assert _device_ids(None)[0] == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " MIG-4f1e/1/0 ,GPU-8f1c")
    assert _device_ids(None)[0] == ["MIG-4f1e/1/0", "GPU-8f1c"]
    for none in ("", "-1", "NoDevFiles"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", none)
        assert _device_ids(None)[0] == []  # the agent may use none: neither may its workers
        assert "lets this agent use no device" in capsys.readouterr().err
    with pytest.raises(InputError, match=r"^--devices: id 2 is empty"):
        _device_ids("0,")
    with pytest.raises(InputError, match=r"^--devices: id '-1' is not a device index"):
        _device_ids("0,-1")
    with pytest.raises(InputError, match=r"^--devices: is empty"):
        _device_ids("")


def test_a_worker_is_short_while_others_share_its_device_past_a_whole_or_it_holds_none() -> None:
    """What the agent's heartbeat counts as workers short of devices
    (:meth:`Devices.short`): three quarters and a half on one device are short both, not
    only a device held twice over; a worker needing a device and holding none (no ids
    to give) is short too. Before, no test told a share past a whole from one of two."""
    devices = Devices(["0"])
    devices.resize(1)
    a, enough_a = devices.take(0.75)
    assert (enough_a, devices.short(a, 0.75)) == (True, False)
    b, enough_b = devices.take(0.5)  # 1.25 of device 0 now
    assert list(b) == ["0"] and not enough_b
    assert devices.short(a, 0.75) and devices.short(b, 0.5)
    devices.give_back(b)
    assert not devices.short(a, 0.75)
    nothing = Devices([])
    nothing.resize(1)
    held, enough = nothing.take(1)
    assert (held, enough) == ({}, False)
    assert nothing.short(held, 1) and not nothing.short({}, 0)
