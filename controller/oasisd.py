"""The ``oasisd`` command: SIGHUP taken first (:mod:`controller.hangups`), then the
daemon imported (about a second: numba, SQLAlchemy, gRPC) and run
(:func:`controller.daemon.main`); or ``oasisd reload --pid PID``, a reload that waits for
the daemon's verdict (:mod:`controller.reload_wait`, the unit's ``ExecReload=``), which
imports none of the daemon."""

from __future__ import annotations

import sys

from controller import hangups, startup_gc

__all__ = ["run"]


def run() -> None:
    """The console entry of ``oasisd``."""
    hangups.hold()  # before the imports: a SIGHUP meanwhile ended the daemon
    startup_gc.hold()  # the imports' objects are not walked by collection after collection
    if sys.argv[1:2] == ["reload"]:  # held too: `systemctl kill -s HUP` signals the unit
        from controller import reload_wait

        sys.exit(reload_wait.main(sys.argv[2:]))
    from controller.daemon import _run

    _run()


if __name__ == "__main__":  # pragma: no cover
    run()
