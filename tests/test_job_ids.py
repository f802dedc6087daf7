"""The stored jobs' ids as digests (controller/admission/job_ids.py): every id added is
found, every id removed is not, across the merges of the changes into the sorted array;
8 bytes an id. The decision path's use of it (a match read from the store, a new id not)
is covered by every submission and retry test."""

from __future__ import annotations

import random

from controller.admission import job_ids
from controller.admission.job_ids import JobIds


def test_ids_added_are_found_and_removed_ones_are_not_across_merges() -> None:
    rng = random.Random(7)
    stored = {f"job-{i}" for i in range(20_000)}
    ids = JobIds(stored)
    assert ids.nbytes == 8 * len(stored)  # a set of the strings held ~190 bytes an id
    new = [f"new-{i}" for i in range(10_000)]  # past _MERGE_AT: merged along the way
    for job_id in new:
        ids.add(job_id)
    stored |= set(new)
    gone = rng.sample(sorted(stored), 6_000)
    ids.difference_update(gone)
    stored -= set(gone)
    back = gone[:100]  # an id deleted, then submitted again
    for job_id in back:
        ids.add(job_id)
    stored |= set(back)
    assert all(j in ids for j in stored)
    absent = gone[100:] + [f"never-{i}" for i in range(20_000)]
    assert sum(j in ids for j in absent) == 0  # 64-bit digests: no collision here
    assert 1 not in ids and None not in ids  # not ids at all


def test_changes_are_merged_once_there_are_enough() -> None:
    ids = JobIds()
    for i in range(job_ids._MERGE_AT - 1):
        ids.add(f"a{i}")
    assert ids.nbytes == 0  # held apart so far
    ids.add("last")
    assert ids.nbytes == 8 * job_ids._MERGE_AT and "last" in ids and "a0" in ids
