"""The ``oasisd`` command: SIGHUP taken first (:mod:`controller.hangups`), then the
daemon imported (about a second: numba, SQLAlchemy, gRPC) and run
(:func:`controller.daemon.main`)."""

from __future__ import annotations

from controller import hangups

__all__ = ["run"]


def run() -> None:
    """The console entry of ``oasisd``."""
    hangups.hold()  # before the imports: a SIGHUP meanwhile ended the daemon
    from controller.daemon import _run

    _run()


if __name__ == "__main__":  # pragma: no cover
    run()
