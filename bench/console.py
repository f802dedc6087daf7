"""Page weight and time to first paint of the console at 1,000 servers x 300 slots.

What is measured
    ``oasisd`` runs as a subprocess on loopback with 500 worker + 500 PS servers
    (``paper_cluster_servers``), a window of T = 299 (so the ledger spans 300 slots), a
    SQLite store and the console on a free loopback port, no ``[auth]``. ``--jobs`` jobs of
    ``generate_trace`` (seeded, scaled to that cluster) are submitted over gRPC by four
    client threads, so the window holds a realistic load of admitted jobs (the count,
    allocation rows and the cluster's mean use over the window are reported).

    Then headless Chromium (Debian's, through Selenium and /usr/bin/chromedriver, nothing
    downloaded) loads each page ``--repeat`` times: overview, prices (the costliest
    resource), plans (page 1), jobs (page 1) and an admitted job's page. Per page:

    - **first paint** and **first contentful paint**: Chromium's paint timing entries,
      ms from navigation start;
    - **drawn**: the ``oasis-drawn`` mark the page's script sets once it has drawn the
      page from its data (heatmap and Gantt included), ms from navigation start;
    - **HTML bytes**: the page as sent (``transferSize`` of the navigation: headers and
      body, gzip when the browser asks, which Chromium does), and its body decoded;
    - **JSON bytes**: the page's JSON twin under ``/api/`` fetched without compression,
      and how long the daemon took to answer it (median).

    The script and style sheet are loaded once and then cached (``immutable``), so they are
    reported apart (first load). Medians over the repeats.

Run: ``.venv/bin/python -m bench.console [--jobs 1500] [--repeat 5] [--out FILE]
[--shots DIR]`` (``--shots``: a 1280x800 screenshot of each page at that scale).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from bench.daemon_throughput import workload, write_config
from bench.machine import describe
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.browser import chromium
from tests.servers import Daemon, json_log

N_WORKER = 500
N_PS = 500
WINDOW = 299  # the ledger spans T + 1 = 300 slots
SLOT_SECONDS = 3600.0
CLIENTS = 4
PAGES = ("overview", "prices", "plans", "jobs", "job")


def load(address: str, jobs: list[dict[str, Any]]) -> tuple[list[str], float]:
    """Submit every job (four threads); the admitted ids and the seconds it took."""
    admitted: list[str] = []
    queue = list(reversed(jobs))
    lock = threading.Lock()

    def client() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            while True:
                with lock:
                    if not queue:
                        return
                    spec = queue.pop()
                answer = stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=120)
                if answer.job.state == pb.JOB_STATE_ADMITTED:
                    with lock:
                        admitted.append(answer.job.spec.id)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return admitted, time.perf_counter() - started


_TIMING = """
const nav = performance.getEntriesByType('navigation')[0];
const paint = Object.fromEntries(
  performance.getEntriesByType('paint').map(e => [e.name, e.startTime]));
const drawn = performance.getEntriesByName('oasis-drawn')[0];
const res = performance.getEntriesByType('resource').map(
  r => ({name: r.name, size: r.transferSize, body: r.decodedBodySize}));
return {fp: paint['first-paint'] ?? null, fcp: paint['first-contentful-paint'] ?? null,
        drawn: drawn ? drawn.startTime : null, transfer: nav.transferSize,
        body: nav.decodedBodySize, resources: res};
"""


def measure(driver: Any, url: str, repeat: int) -> dict[str, Any]:
    from selenium.webdriver.support.ui import WebDriverWait

    runs = []
    for _ in range(repeat):
        driver.get(url)
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script(
                "return performance.getEntriesByName('oasis-drawn').length > 0 && "
                "performance.getEntriesByName('first-contentful-paint').length > 0"
            ),
            message=f"{url} drawn",
        )
        runs.append(driver.execute_script(_TIMING))
    return {
        "fp": statistics.median(r["fp"] for r in runs),
        "fcp": statistics.median(r["fcp"] for r in runs),
        "drawn": statistics.median(r["drawn"] for r in runs),
        "transfer": statistics.median(r["transfer"] for r in runs),
        "body": statistics.median(r["body"] for r in runs),
        "resources": runs[0]["resources"],
    }


def twin(url: str, repeat: int) -> tuple[int, float]:
    """The JSON twin's size (no compression) and the median time to fetch it, ms."""
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as response:
            size = len(response.read())
        times.append((time.perf_counter() - started) * 1000)
    return size, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the markdown table here too")
    parser.add_argument("--shots", type=Path, help="save a screenshot of each page here")
    args = parser.parse_args(argv)

    servers, jobs = workload(args.seed, args.jobs, N_WORKER, N_PS, WINDOW)
    work = Path(tempfile.mkdtemp(prefix="oasis-bench-console-"))
    config = write_config(
        work / "oasisd.toml", work / "data", "", servers, time.time(), window=WINDOW,
        extra='[web]\nlisten = "127.0.0.1:0"\n',
    )  # fmt: skip
    daemon = Daemon(config, work / "oasisd.log").start(timeout=300)
    profile = tempfile.mkdtemp(prefix="oasis-bench-chromium-")
    driver = None
    try:
        log = json_log(work / "oasisd.log")
        web = next(e["address"] for e in log if e.get("event") == "console listening")
        base = f"http://{web}"
        admitted, seconds = load(daemon.address, jobs)
        with urllib.request.urlopen(base + "/api/overview", timeout=60) as r:
            overview = json.loads(r.read())
        mean_use = {
            f"{u['kind']} {u['resource']}": (u["window_mean"], u["window_peak"])
            for u in overview["use"]
        }
        rows = subprocess.run(
            ["sqlite3", str(work / "data" / "oasis.db"), "select count(*) from allocations"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        paths = {"overview": "/", "prices": "/prices", "plans": "/plans", "jobs": "/jobs",
                 "job": f"/jobs/{admitted[len(admitted) // 2]}"}  # fmt: skip
        driver = chromium(profile)
        results = {}
        for name in PAGES:
            page = measure(driver, base + paths[name], args.repeat)
            if args.shots:
                args.shots.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(args.shots / f"{name}.png"))
            api = "/api" + (paths[name] if paths[name] != "/" else "/overview")
            page["json"], page["json_ms"] = twin(base + api, args.repeat)
            results[name] = page
        statics = {
            Path(r["name"].split("?")[0]).name: (r["size"], r["body"])
            for r in results["overview"]["resources"]
            if "/static/" in r["name"]
        }
    finally:
        if driver is not None:
            driver.quit()
        daemon.stop()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    machine = describe()
    lines = [
        f"- **Command:** `.venv/bin/python -m bench.console --jobs {args.jobs} "
        f"--repeat {args.repeat} --seed {args.seed}`",
        f"- **Machine:** {machine['cpu']}, {machine['cores']} cores; Python "
        f"{machine['python']}; Chromium {driver.capabilities.get('browserVersion', '?')}",
        f"- **Load:** {len(jobs)} jobs submitted in {seconds:.1f} s, {len(admitted)} admitted, "
        f"{rows} allocation rows; use over the window, mean (peak slot): "
        + ", ".join(f"{k} {m:.0%} ({p:.0%})" for k, (m, p) in mean_use.items()),
        f"- **Load average** at the end: {os.getloadavg()[0]:.2f}",
        "",
        "| page | first paint ms | first contentful paint ms | drawn ms | HTML sent bytes "
        "| HTML decoded bytes | JSON twin bytes | JSON twin ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in PAGES:
        r = results[name]
        lines.append(
            f"| {name} | {r['fp']:.0f} | {r['fcp']:.0f} | {r['drawn']:.0f} | {r['transfer']:,} "
            f"| {r['body']:,} | {r['json']:,} | {r['json_ms']:.0f} |"
        )
    lines.append("")
    lines.append(
        "Static files, first load (then cached): "
        + ", ".join(f"{n} {s:,} bytes sent ({b:,} decoded)" for n, (s, b) in statics.items())
    )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
