"""Shared fixtures: store backends (SQLite always; PostgreSQL, a real server)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    try:
        server = Postgres()
    except (FileNotFoundError, OSError) as err:
        if os.environ.get("OASIS_REQUIRE_POSTGRES") == "1":
            raise
        pytest.skip(f"PostgreSQL binaries unavailable: {err}")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store: a SQLite file, or a fresh database on the PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    server: Postgres = request.getfixturevalue("postgres")
    return server.new_database()
