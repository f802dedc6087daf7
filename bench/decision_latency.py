"""Decision latency of the online algorithm (issue: core admission engine).

What is measured
    Wall time of each admission decision (the best-schedule search plus, when admitted,
    the ledger update) while replaying seeded synthetic traces in the paper's setting
    (``pricing.workload.generate_trace``), at two scales:

    - ``paper``: 50 worker + 50 PS servers, T = 300 slots, 300 jobs per trace;
    - ``10x``: 500 + 500 servers, T = 1000 slots, 3000 jobs per trace;
    - ``10k-servers``: 5000 + 5000 servers, T = 300, 300 jobs (issue 16's goal);
    - ``T3000``: 50 + 50 servers, T = 3000, 300 jobs (issue 16's goal).

    Per scale: p50, p99 and max decision time over all decisions of all seeds, the
    admitted share, and the peak memory of a process that replays one trace of that
    scale (its peak RSS, and the same for a process that only imports everything, so
    the difference is what the replay itself needs).

    Speed-up: the straightforward transcription of the paper's Alg. 2 in
    ``bench/reference_alg2.py`` decides the first ``--reference-jobs`` jobs of the first
    paper-scale trace; the same jobs' decision times in the optimised replay of the same
    trace (same state: the decisions before them are the same, which is checked) give
    the ratio, measured in the same run.

    With ``--reasons``, each decision is also timed together with its rejection's
    explanation (``pricing.explain``, as the daemon gives it), as the time the replay
    takes to yield it; ``--hash`` prints a SHA-256 over every decision (admitted, payoff,
    cost, jct, utility, schedule arrays, reason), the same before and after a change that
    must not change any decision.

Methodology
    Kernels are compiled (or loaded from numba's cache) before timing, by the replay's
    own warm-up. Each decision is timed with ``time.perf_counter`` (``--clock wall``) or
    with the CPU time of the deciding thread, ``time.thread_time`` (``--clock thread``),
    which other load on the machine disturbs less. Memory is measured
    in separate child processes, so no tracing slows the timed runs. Traces are generated
    from fixed seeds, so every run replays the same jobs. Nothing else should run on the
    machine.

Run with
    make bench                    # or: .venv/bin/python -m bench.decision_latency
    .venv/bin/python -m bench.decision_latency --seeds 1 --reference-jobs 10   # quicker
    .venv/bin/python -m bench.decision_latency --pricing estimate   # the daemon's bounds
    .venv/bin/python -m bench.decision_latency --pricing estimate --seeds 1 \
        --scales paper,T3000,10k-servers --clock thread --reasons --hash   # issue 16
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

import numba
import numpy as np

from bench.machine import describe
from bench.reference_alg2 import replay_reference
from controller import procfs
from controller.replay import ReplayRecord, replay
from pricing import trace_from_dict
from pricing.workload import generate_trace

SCALES: dict[str, dict[str, int]] = {
    "paper": {"servers": 50, "horizon": 300, "jobs": 300},
    "10x": {"servers": 500, "horizon": 1000, "jobs": 3000},
    # issue 16's goals (300 jobs each): 10,000 servers at T = 300, 100 at T = 3,000
    "10k-servers": {"servers": 5000, "horizon": 300, "jobs": 300},
    "T3000": {"servers": 50, "horizon": 3000, "jobs": 300},
}


@dataclass
class ScaleResult:
    name: str
    decisions: int
    admitted: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    seconds: float
    peak_rss_mb: float = 0.0
    clock: str = "wall"
    p50_with_reason_ms: float = 0.0
    p99_with_reason_ms: float = 0.0
    sha256: str = ""


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def make_trace(scale: str, seed: int, pricing: str = "oracle") -> dict[str, Any]:
    cfg = SCALES[scale]
    raw = generate_trace(
        np.random.default_rng(seed),
        n_jobs=cfg["jobs"],
        n_worker_servers=cfg["servers"],
        n_ps_servers=cfg["servers"],
        horizon=cfg["horizon"],
    )
    raw["pricing"] = {"bounds": pricing}
    return raw


def digest(records: list[ReplayRecord], h: Any) -> None:
    """Fold every decision of ``records`` into the hash ``h`` (hashlib): id, admitted,
    payoff, cost, jct, utility (numbers to 12 significant digits), reason and the
    schedule's start and arrays.

    Twelve digits, not the last bit: numpy picks its ``exp`` and ``log`` kernels by the
    CPU at run time, and on a machine with AVX-512 41 of 900 paper-scale payoffs differed
    from an AVX2 machine's in their last digits, with the same admissions and schedules
    (bench/RESULTS.md, 2026-12-02), so a digest of reprs compared only on one machine."""
    for r in records:
        d, b = r.decision, r.decision.best
        numbers = (b.payoff, b.cost, b.jct, b.utility)
        h.update(repr((d.job.id, d.admitted, *map(_digits, numbers))).encode())
        h.update(r.reason.encode())
        if b.schedule is not None:
            h.update(repr(b.schedule.start).encode())
            h.update(np.ascontiguousarray(b.schedule.workers).tobytes())
            h.update(np.ascontiguousarray(b.schedule.ps).tobytes())


def _digits(x: object) -> object:
    """``x`` to 12 significant digits if it is a float (an int or None as it is)."""
    return f"{x:.12g}" if isinstance(x, float) else x


def timed_replay(
    trace: Any, clock_name: Literal["wall", "thread"]
) -> tuple[list[ReplayRecord], list[float]]:
    """The replay's records, and per record the milliseconds the replay took to yield it
    on the same clock: the decision plus, for a rejection, its explanation."""
    clock = CLOCKS[clock_name]
    records: list[ReplayRecord] = []
    with_reason: list[float] = []
    steps = replay(trace, clock=clock)
    while True:
        started = clock()
        record = next(steps, None)
        if record is None:
            break
        with_reason.append((clock() - started) * 1000.0)
        records.append(record)
    return records, with_reason


def run_scale(
    scale: str, seeds: list[int], pricing: str = "oracle", clock: Literal["wall", "thread"] = "wall"
) -> tuple[ScaleResult, list[float]]:
    times: list[float] = []
    with_reason: list[float] = []
    admitted = 0
    started = time.perf_counter()
    first_seed_times: list[float] = []
    h = hashlib.sha256()
    for seed in seeds:
        trace = trace_from_dict(make_trace(scale, seed, pricing))
        records, steps = timed_replay(trace, clock)
        with_reason.extend(steps[1:])  # the first also holds the replay's warm-up
        ms = [r.decision_ms for r in records]
        if not first_seed_times:
            first_seed_times = ms
        times.extend(ms)
        admitted += sum(r.decision.admitted for r in records)
        digest(records, h)
    arr = np.array(times)
    result = ScaleResult(
        name=scale,
        decisions=len(times),
        admitted=admitted,
        p50_ms=float(np.percentile(arr, 50)),
        p99_ms=float(np.percentile(arr, 99)),
        max_ms=float(arr.max()),
        mean_ms=float(arr.mean()),
        seconds=time.perf_counter() - started,
        clock=clock,
        p50_with_reason_ms=float(np.percentile(with_reason, 50)),
        p99_with_reason_ms=float(np.percentile(with_reason, 99)),
        sha256=h.hexdigest(),
    )
    return result, first_seed_times


def run_reference(seed: int, n_jobs: int, ours_ms: list[float]) -> dict[str, Any]:
    """Time the reference on the first ``n_jobs`` decisions and check they agree."""
    raw = make_trace("paper", seed)
    trace = trace_from_dict(raw)
    ours = list(replay(trace))[:n_jobs]
    started = time.perf_counter()
    ref = replay_reference(raw, max_jobs=n_jobs)
    ref_s = time.perf_counter() - started
    mismatches = []
    for mine, theirs in zip(ours, ref, strict=False):
        d = mine.decision
        same = d.admitted == theirs["admitted"] and (
            (d.best.payoff is None and theirs["payoff"] is None)
            or (
                d.best.payoff is not None
                and theirs["payoff"] is not None
                and abs(d.best.payoff - theirs["payoff"]) <= 1e-6 * max(1.0, abs(theirs["payoff"]))
            )
        )
        if not same:
            mismatches.append(d.job.id)
    ours_s = sum(ours_ms[:n_jobs]) / 1000.0
    return {
        "jobs": n_jobs,
        "reference_s": ref_s,
        "ours_s": ours_s,
        "speedup": ref_s / ours_s if ours_s > 0 else float("inf"),
        "mismatches": mismatches,
    }


def child_peak_rss_mb(*args: str) -> float:
    """Peak RSS, MB, of ``python -m bench.decision_latency ARGS`` run as a child."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.decision_latency", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(proc.stdout)["peak_rss_mb"])


def own_peak_rss_mb() -> float:
    """This process's peak RSS, MB: VmHWM, which (unlike getrusage's ru_maxrss) does
    not carry the parent's peak across exec."""
    peak = procfs.status("self", ("VmHWM",)).get("VmHWM")
    if peak is not None:
        return peak / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict[str, str]:
    return describe(numpy=np.__version__, numba=numba.__version__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--seeds", type=int, default=3, help="traces per scale (seeds 1..n)")
    parser.add_argument(
        "--scales", default="paper,10x", help=f"comma-separated, of: {','.join(SCALES)}"
    )
    parser.add_argument("--reference-jobs", type=int, default=20, help="0 skips the reference")
    parser.add_argument(
        "--pricing",
        choices=("oracle", "estimate"),
        default="oracle",
        help="price bounds of the traces: oracle (default; the reference needs them) or "
        "estimate (the daemon's: each decision's time includes folding the job into the "
        "estimate and repricing the ledger; no reference run)",
    )
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="what times a decision: wall (time.perf_counter, default) or thread (the "
        "deciding thread's CPU time, time.thread_time: less disturbed by other load)",
    )
    parser.add_argument(
        "--reasons",
        action="store_true",
        help="also give p50 / p99 of each decision with its rejection's explanation",
    )
    parser.add_argument(
        "--hash", action="store_true", help="give a SHA-256 over every decision per scale"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--memory-probe", metavar="SCALE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_probe is not None:
        # child mode: replay one trace (or none, for "imports") and report peak RSS
        if args.memory_probe != "imports":
            list(replay(trace_from_dict(make_trace(args.memory_probe, 1, args.pricing))))
        print(json.dumps({"peak_rss_mb": own_peak_rss_mb()}))
        return 0

    seeds = list(range(1, args.seeds + 1))
    results = []
    reference = None
    for scale in args.scales.split(","):
        print(f"running {scale} ...", file=sys.stderr, flush=True)
        result, first_times = run_scale(scale, seeds, args.pricing, args.clock)
        results.append(result)
        if scale == "paper" and args.reference_jobs and args.pricing == "oracle":
            print("running the Alg. 2 reference ...", file=sys.stderr, flush=True)
            reference = run_reference(seeds[0], args.reference_jobs, first_times)
    print("measuring memory ...", file=sys.stderr, flush=True)
    base_mb = child_peak_rss_mb("--memory-probe", "imports")
    for r in results:
        r.peak_rss_mb = child_peak_rss_mb("--memory-probe", r.name, "--pricing", args.pricing)
    if args.json:
        out = {
            "machine": machine(),
            "scales": [r.__dict__ for r in results],
            "reference": reference,
            "imports_peak_rss_mb": base_mb,
        }
        print(json.dumps(out, indent=1))
        return 0
    m = machine()
    print(
        f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, numpy "
        f"{m['numpy']}, numba {m['numba']}"
    )
    print(f"seeds: {seeds}; {args.pricing} bounds; clock: {args.clock}\n")
    extra = " p50 / p99 ms with reason |" if args.reasons else ""
    print(
        f"| scale | decisions | admitted | p50 ms | p99 ms | max ms | mean ms |{extra} "
        "peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|" + ("---|" if args.reasons else "") + "---|")
    for r in results:
        reasons = (
            f" {r.p50_with_reason_ms:.2f} / {r.p99_with_reason_ms:.2f} |" if args.reasons else ""
        )
        print(
            f"| {r.name} | {r.decisions} | {r.admitted} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
            f"{r.max_ms:.2f} | {r.mean_ms:.2f} |{reasons} {r.peak_rss_mb:.0f} |"
        )
    if args.hash:
        print()
        for r in results:
            print(f"sha256 {r.name}: {r.sha256}")
    print(
        f"\npeak RSS is of a process replaying one trace of the scale (seed 1); a process "
        f"that only imports everything peaks at {base_mb:.0f} MB"
    )
    if reference:
        print(
            f"\nreference Alg. 2 on the first {reference['jobs']} paper-scale decisions: "
            f"{reference['reference_s']:.2f} s vs {reference['ours_s'] * 1000:.2f} ms here, "
            f"speed-up {reference['speedup']:.0f}x; decisions that differ: "
            f"{reference['mismatches'] or 'none'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
