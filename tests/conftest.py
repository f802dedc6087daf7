"""Shared fixtures: store backends (SQLite always; PostgreSQL, a real server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Postgres, postgres_or_skip


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    yield from postgres_or_skip()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store: a SQLite file, or a fresh database on the PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    server: Postgres = request.getfixturevalue("postgres")
    return server.new_database()
