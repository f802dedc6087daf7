"""numba's on-disk cache of the kernels follows every file of ``pricing``, not only the
file that defines the kernel (:mod:`pricing.jit`): a fix to a helper another file's kernel
calls takes effect at the next start, and an unchanged package still loads the cache."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_HELPER = """\
from pricing.jit import kernel


@kernel
def step(x: int) -> int:
    return x + {increment}
"""

_KERNEL = """\
from pricing._probe_helper import step
from pricing.jit import kernel


@kernel
def twice(x: int) -> int:
    return 10 * step(x)
"""

_RUN = (
    "from pricing._probe_kernel import twice\n"
    "print(twice(1), sum(twice.stats.cache_hits.values()))\n"
)


def _start(tree: Path, env: dict[str, str]) -> tuple[int, int]:
    """A new process's result of the kernel and its count of cache hits."""
    out = subprocess.run(
        [sys.executable, "-c", _RUN],
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
        check=True,
        timeout=120,
    )
    result, hits = out.stdout.split()
    return int(result), int(hits)


@pytest.mark.parametrize("where", ["NUMBA_CACHE_DIR", "__pycache__"])
def test_a_change_to_a_callee_in_another_file_recompiles(tmp_path: Path, where: str) -> None:
    """A kernel calling a kernel of another file, in a copy of ``pricing``: when only the
    callee's file changes, the next process runs the new code (numba's own stamp, of the
    caller's file alone, kept the old result: 20), and a start with nothing changed
    loads it from the cache. Under the systemd unit's ``NUMBA_CACHE_DIR`` and in the
    editable checkout's ``__pycache__``."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "pricing", tree / "pricing", ignore=shutil.ignore_patterns("__pycache__")
    )
    helper = tree / "pricing" / "_probe_helper.py"
    helper.write_text(_HELPER.format(increment=1))
    (tree / "pricing" / "_probe_kernel.py").write_text(_KERNEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = str(tree)
    if where == "NUMBA_CACHE_DIR":
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "cache")

    assert _start(tree, env) == (20, 0)  # compiled and cached
    helper.write_text(_HELPER.format(increment=2))
    assert _start(tree, env) == (30, 0)  # the callee's change is seen: compiled again
    assert _start(tree, env) == (30, 1)  # and cached
    cached = tmp_path / "cache" if where == "NUMBA_CACHE_DIR" else tree / "pricing" / "__pycache__"
    assert list(cached.rglob("_probe_kernel.twice-*.nbi"))


def test_every_kernel_is_cached_through_pricing_jit() -> None:
    """No module of ``pricing`` asks numba for its own cache (``cache=True``), whose stamp
    would cover only that module's file."""
    for path in sorted((ROOT / "pricing").rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"cache\s*=\s*True", text) or path.name == "jit.py", path


def test_a_damaged_cache_file_is_compiled_again_not_an_error(tmp_path: Path) -> None:
    """Cache files left empty or cut short (a power loss, a full disk): numba raised
    ``UnpicklingError`` at every import, so the daemon failed at every start and systemd
    restarted it into the same failure. Now the kernel compiles, and the cache is whole
    again for the start after."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "pricing", tree / "pricing", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tree / "pricing" / "_probe_helper.py").write_text(_HELPER.format(increment=1))
    (tree / "pricing" / "_probe_kernel.py").write_text(_KERNEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env |= {"PYTHONPATH": str(tree), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    assert _start(tree, env) == (20, 0)
    damaged = 0
    for index in (tmp_path / "cache").rglob("_probe_*.nbi"):
        index.write_bytes(index.read_bytes()[:20])  # cut short
        damaged += 1
    for data in (tmp_path / "cache").rglob("_probe_*.nbc"):
        data.write_bytes(b"")  # empty
    assert damaged == 2
    assert _start(tree, env) == (20, 0)  # compiled again, not an error
    assert _start(tree, env) == (20, 1)  # and cached again


def test_no_folder_for_the_cache_compiles_uncached_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user who may write neither the package's folder nor a home of its own (the
    oasis user run by hand, without the unit's NUMBA_CACHE_DIR): numba found no
    locator, and oasisd died at import with a 30-line traceback."""
    from pricing import jit

    def no_locator(function: object) -> None:
        raise RuntimeError(f"cannot cache function {function!r}: no locator available")

    monkeypatch.setattr(jit, "_PackageCache", no_locator)
    monkeypatch.setattr(jit, "UNCACHED", [])

    def double(x: int) -> int:
        return 2 * x

    compiled = jit.kernel(double)
    assert compiled(21) == 42
    assert len(jit.UNCACHED) == 1 and "no locator available" in jit.UNCACHED[0]
