"""``python -m bench.figures --quick``: every figure's PNG and CSV, consistent numbers."""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from bench.figures import (
    CSV_COLUMNS,
    FULL,
    POLICY_NAMES,
    QUICK,
    QUICK_CAVEAT,
    _decorate,
    _seeds,
    main,
)


def _rows(path: Path, name: str) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS[name]
        return list(reader)


def test_quick_run_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "100%" in captured.err  # the progress bar ran to its end
    assert captured.out == (tmp_path / "summary.md").read_text(encoding="utf-8")
    for heading in ("Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6"):
        assert heading in captured.out
    assert captured.out.startswith("**Quick run: ") and "1 seeds" not in captured.out

    rows = {}
    for name in CSV_COLUMNS:
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        rows[name] = _rows(tmp_path / f"{name}.csv", name)

    fig3 = rows["fig3_total_utility"]
    assert len(fig3) == len(QUICK.job_counts) * len(POLICY_NAMES)  # one seed
    assert {r["policy"] for r in fig3} == set(POLICY_NAMES)
    assert all(float(r["total_utility"]) >= 0 for r in fig3)
    at_fig4 = {r["policy"]: r for r in fig3 if int(r["jobs"]) == QUICK.fig4_jobs}

    fig4 = rows["fig4_completion_minus_target"]
    for r in fig4:
        assert int(r["jct_minus_target"]) == int(r["jct"]) - int(r["target"])
        # the plot's panels: the paper's time-sensitive and time-critical jobs only
        decay = float(r["decay"])
        assert r["kind"] == (
            "insensitive" if decay == 0 else "sensitive" if decay <= 1 else "critical"
        )
    for policy in POLICY_NAMES:
        completed = sum(r["policy"] == policy for r in fig4)
        assert completed == int(at_fig4[policy]["completed"])

    fig5 = rows["fig5_offline_ratio"]
    assert [int(r["servers"]) for r in fig5] == list(QUICK.fig5_servers)
    for r in fig5:
        assert r["status"] in ("optimal", "feasible")
        # the solve starts from the better online allocation, so never falls below it
        best_online = max(float(r["online_estimate"]), float(r["online_oracle"]))
        assert float(r["optimum"]) >= best_online - 1e-6

    quality = rows["quality_per_trace"]
    assert len(quality) == len(QUICK.job_counts)
    for r in quality:
        totals = {x["policy"]: float(x["total_utility"]) for x in fig3 if x["jobs"] == r["jobs"]}
        assert float(r["oasis"]) == totals["oasis"] and float(r["rrh_np"]) == totals["rrh-np"]
        # certified: no scheduler earns more; the paper's sum is at least as large
        for policy in POLICY_NAMES:
            assert totals[policy] <= float(r["certified_bound"]) * (1 + 1e-12), policy
        assert float(r["certified_bound"]) <= float(r["dmin_bound"]) * (1 + 1e-12)

    fig6 = rows["fig6_bound_estimates"]
    assert len(fig6) == 2 * len(QUICK.factors)
    # factor 1 is the unscaled estimate: the same replay as Fig. 3's OASiS
    unscaled = {r["total_utility"] for r in fig6 if float(r["factor"]) == 1.0}
    assert unscaled == {at_fig4["oasis"]["total_utility"]}


def test_fig5_with_small_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--fig5-max-share``: Fig. 5 on the same seeds with small jobs; its online column
    is an independent replay of ``generate_trace(..., max_share=0.1)`` (with the shipped
    prior, as ``--fig5-prior default`` asks)."""
    import math

    import numpy as np

    from bench.offline_optimum import HORIZON, N_JOBS
    from controller.replay import replay
    from pricing import trace_from_dict
    from pricing.workload import generate_trace

    args = ["--quick", "--no-progress", "--out", str(tmp_path), "--fig5-max-share", "0.1"]
    assert main([*args, "--fig5-prior", "default"]) == 0  # the prior the replay below uses
    assert "Fig. 5, offline optimum / online (2 instances of jobs within 0.1 of the cluster" in (
        capsys.readouterr().out
    )
    rows = _rows(tmp_path / "fig5_offline_ratio.csv", "fig5_offline_ratio")
    for r in rows:
        total = int(r["servers"])
        raw = generate_trace(
            np.random.default_rng(int(r["seed"])), n_jobs=N_JOBS, n_worker_servers=(total + 1) // 2,
            n_ps_servers=total // 2, horizon=HORIZON, max_share=0.1,
        )  # fmt: skip
        records = replay(trace_from_dict({**raw, "pricing": {"bounds": "estimate"}}))
        online = math.fsum(
            float(x.decision.best.utility or 0.0) for x in records if x.decision.admitted
        )
        assert float(r["online_estimate"]) == pytest.approx(online, rel=1e-9)
        assert float(r["optimum"]) >= online - 1e-6


def test_offline_sweep_on_a_process_pool_equals_the_sequential_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--workers 2`` (a spawn process pool) gives the rows ``--workers 1`` gives."""
    import json

    from bench import offline_optimum

    args = ["--seeds", "2", "--servers", "3", "--jobs", "6", "--horizon", "6", "--json"]
    assert offline_optimum.main([*args, "--workers", "1"]) == 0
    alone = json.loads(capsys.readouterr().out)["rows"]
    assert offline_optimum.main([*args, "--workers", "2"]) == 0
    pooled = json.loads(capsys.readouterr().out)["rows"]
    assert len(alone) == len(pooled) == 2
    for a, b in zip(alone, pooled, strict=True):
        assert (a["seed"], a["optimum"], a["online"], a["status"]) == (
            b["seed"], b["optimum"], b["online"], b["status"],
        )  # fmt: skip


def test_fig5_on_a_dask_cluster(tmp_path: Path) -> None:
    """``--dask-scheduler``: the runs go to a Dask cluster (here a LocalCluster on
    loopback TCP) and give the same Fig. 5 rows as a run in this process."""
    from tqdm import tqdm

    from bench.figures import fig5
    from bench.pool import executor

    distributed = pytest.importorskip("distributed")
    for name in ("dask", "here"):
        (tmp_path / name).mkdir()
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://127.0.0.1:")
        with tqdm(disable=True) as bar, executor(None, address) as pool:
            assert pool is not None and type(pool).__module__.startswith("distributed")
            fig5(QUICK, [1], tmp_path / "dask", bar, None, pool)
    with tqdm(disable=True) as bar:
        fig5(QUICK, [1], tmp_path / "here", bar, None, None)
    remote = _rows(tmp_path / "dask" / "fig5_offline_ratio.csv", "fig5_offline_ratio")
    local = _rows(tmp_path / "here" / "fig5_offline_ratio.csv", "fig5_offline_ratio")
    assert [int(r["servers"]) for r in remote] == list(QUICK.fig5_servers)
    for r, h in zip(remote, local, strict=True):
        for column in ("servers", "seed", "status", "online_estimate", "online_oracle"):
            assert r[column] == h[column]
        assert float(r["optimum"]) == pytest.approx(float(h["optimum"]), abs=1e-6)


def test_legend_beside_the_axes_titles_and_the_quick_caveat() -> None:
    """The legend sits right of the plot (inside it hid the RRH line), one seed is '1
    seed', and a quick run says on the figure that it is one noisy seed."""
    assert (_seeds(1), _seeds(3)) == ("1 seed", "3 seeds")
    for settings, caveat in ((QUICK, True), (FULL, False)):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1], label="RRH")
        _decorate(fig, ax, settings)
        fig.canvas.draw()
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
        texts = [t.get_text().replace("\n", " ") for t in ax.texts]
        assert (QUICK_CAVEAT in texts) is caveat
        plt.close(fig)


def test_an_out_folder_it_cannot_make_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` under a file (or under /proc) raised NotADirectoryError from mkdir with a
    traceback, before any work; now a usage error naming it."""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["--quick", "--out", str(tmp_path / "file" / "figs")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"python -m bench.figures: error: --out {tmp_path}/file/figs: cannot write there: "
        "Not a directory"
    ), err


def test_ctrl_c_and_sigterm_end_the_figures_and_their_workers_at_once(tmp_path: Path) -> None:
    """The replay audit: Ctrl-C at 25 s of ``python -m bench.figures`` left the process
    pool's ``with`` waiting for every queued trace (147), silently, and it had not ended a
    minute later; SIGTERM (``timeout``) killed the parent alone, its workers running on.
    Now either ends the run and its workers at once, status 130 / 143, one line. Ctrl-C
    goes to the terminal's whole process group, SIGTERM to the parent alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.servers import ROOT

    for sig, group, code, word in ((signal.SIGINT, True, 130, "interrupted"),
                                   (signal.SIGTERM, False, 143, "terminated")):  # fmt: skip
        err_path = tmp_path / f"err{sig}"
        with err_path.open("w") as err:
            args = ["--quick", "--seeds", "3", "--workers", "2", "--out", str(tmp_path / "f")]
            proc = subprocess.Popen([sys.executable, "-m", "bench.figures", *args], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "2/" not in err_path.read_text():  # two traces done: the pool is busy
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.05)
            workers = [
                int(pid)
                for pid in os.listdir("/proc")
                if pid.isdigit() and _parent(int(pid)) == proc.pid
            ]
            assert workers
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            assert proc.wait(timeout=20) == code, err_path.read_text()[-2000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        said = err_path.read_text()
        assert "Traceback" not in said, said
        assert said.rstrip().endswith(f"python -m bench.figures: {word}"), said[-300:]
        time.sleep(0.5)  # the workers' exit, once their parent is gone
        assert [pid for pid in workers if _parent(pid) not in (None, 0)] == [], workers


def _parent(pid: int) -> int | None:
    """The parent of process ``pid`` (0 once a zombie's), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            after = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return 0 if after[0] == b"Z" else int(after[1])


@pytest.mark.parametrize(
    ("raised", "status", "word"),
    [(KeyboardInterrupt, 130, "interrupted"), (None, 143, "terminated")],
)
def test_every_benchmark_with_a_pool_ends_on_ctrl_c_and_sigterm_in_one_line(
    raised: type[BaseException] | None, status: int, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.offline_optimum and bench.quality ended Ctrl-C with a traceback (the replay
    audit); they now run as bench.figures does, through bench.pool.interruptible (the
    test above signals a real bench.figures)."""
    import bench.offline_optimum
    import bench.quality
    from bench.pool import interruptible
    from controller.commands.common import Terminated

    def run(argv: list[str] | None) -> int:
        assert argv == ["--x"]
        raise (raised or Terminated)()

    assert interruptible("python -m bench.x", run, ["--x"]) == status
    assert capsys.readouterr().err == f"python -m bench.x: {word}\n"
    for module in (bench.offline_optimum, bench.quality):
        assert "interruptible(" in Path(module.__file__ or "").read_text()
