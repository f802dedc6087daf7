"""The package as an operator installs it: a source distribution that builds its wheel on
its own, with everything the daemon opens at run time, and dependency floors the
generated gRPC code really runs on (an audit of 2026-11-29: the sdist had no proto/ and
did not build; the wheel declared ``protobuf>=5`` while its code needed 7.35)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from tests.servers import ROOT


def _floor(requirements: list[str], name: str) -> str:
    """The version after ``name>=`` (or ``name==``) in ``requirements``."""
    for requirement in requirements:
        found = re.fullmatch(rf"{re.escape(name)}(?:>=|==)([0-9.]+)", requirement)
        if found:
            return found.group(1)
    raise AssertionError(f"no floor for {name} in {requirements}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_dependency_floors_are_what_the_generated_code_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needs = project["project"]["dependencies"]
    messages = (ROOT / "controller" / "rpc" / "oasis_pb2.py").read_text()
    stubs = (ROOT / "controller" / "rpc" / "oasis_pb2_grpc.py").read_text()
    protoc = re.search(r"# Protobuf Python Version: ([0-9.]+)", messages)
    grpc = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", stubs)
    assert protoc and grpc
    assert _version(_floor(needs, "protobuf")) >= _version(protoc.group(1))
    assert _version(_floor(needs, "grpcio")) >= _version(grpc.group(1))
    # the package build and `make` generate with one and the same generator
    build = _floor(project["build-system"]["requires"], "grpcio-tools")
    assert build == _floor(project["project"]["optional-dependencies"]["dev"], "grpcio-tools")
    assert build == grpc.group(1)


def _build(kind: str, source: Path, out: Path) -> Path:
    """``source`` built by setuptools' PEP 517 backend into ``out`` (no isolation: the
    test environment's setuptools and grpcio-tools, no download)."""
    out.mkdir(exist_ok=True)
    name = subprocess.run(
        [sys.executable, "-c",
         f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"],
        cwd=source, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert name.returncode == 0, name.stderr[-3000:]
    return out / name.stdout.strip().splitlines()[-1]


def test_the_source_distribution_builds_a_wheel_with_what_the_daemon_opens(
    tmp_path: Path,
) -> None:
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    checkout = tmp_path / "checkout"
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).write_bytes((ROOT / name).read_bytes())
    for own in ("tokens", "oasisd.toml", "tokens.bak"):  # a site's files, secrets among them
        (checkout / "config" / own).write_text("not to be shipped\n")

    sdist = _build("sdist", checkout, tmp_path / "dist")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        # the "data" filter exists from Python 3.11.4 (and 3.14 makes it the default)
        if hasattr(tarfile, "data_filter"):
            archive.extractall(tmp_path / "unpacked", filter="data")
        else:  # pragma: no cover - before 3.11.4
            archive.extractall(tmp_path / "unpacked")  # our own sdist
    for needed in ("proto/generate.py", "proto/oasis/v1/oasis.proto", "setup.py",
                   "config/oasisd.example.toml", "config/oasisd.service",
                   "config/oasis-agent@.service", "config/demo-trace.json"):  # fmt: skip
        assert needed in names, needed
    assert not {"config/tokens", "config/oasisd.toml", "config/tokens.bak"} & names
    shipped = {name for name in tracked if name.startswith("config/")}
    assert shipped <= names, shipped - names  # every tracked config file, by name

    (unpacked,) = (tmp_path / "unpacked").iterdir()
    wheel = _build("wheel", unpacked, tmp_path / "wheels")
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
    for needed in ("controller/rpc/oasis_pb2.py", "controller/rpc/oasis_pb2_grpc.py",
                   "pricing/default_prior.py", "migrations/env.py",
                   "migrations/script.py.mako"):  # fmt: skip
        assert needed in files, needed
    assert any(f.startswith("migrations/versions/") and f.endswith(".py") for f in files)
    static = {p.name for p in (ROOT / "controller" / "console" / "static").iterdir()}
    assert {f"controller/console/static/{name}" for name in static} <= files
