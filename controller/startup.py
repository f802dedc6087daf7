"""The daemon's start-up on its store: the data directory, the writer lock, migrations and
the ledger's rebuild. Every way this can fail is one line naming the setting or the
store, and exit status 1 (``oasisd: ...``), never a traceback:

- ``daemon.data_dir`` cannot be created for want of space (a full file system); one that
  is a file, or cannot be created for its permissions or a read-only file system, exits
  2 (:func:`_data_dir`: only an operator can mend it);
- the store cannot be reached (refused, timed out after ``daemon.store_timeout``, bad
  credentials) or cannot be written (a full disk: "database or disk is full"; a role
  without a privilege, a read-only database or hot standby: the line says what the DBA
  does, ``controller/store/refusals.py``);
- another daemon holds the store (``controller/store/writer_lock.py``): the line names it
  (with ``[ha]`` on PostgreSQL the second one becomes a standby instead; ``[ha]`` on a
  SQLite store is refused: high availability needs PostgreSQL);
- the store's recorded slot 0 (meta row ``epoch``) is malformed;
- the store is new where the role's ``search_path`` looks, while another schema of its
  database holds one (a DBA moved the path: ``controller/store/search_path.py``), exit 2;
- the store's tables are not at the schema revision it records (its ``alembic_version``
  edited, or restored from another backup than its tables: a migration finds its index
  there already, or a column the revision has is missing), exit 2
  (``controller/store/schema_check.py``);
- the store's schema is at a revision this oasis does not know (a newer oasis migrated
  it: run that one, or restore a backup from before it ran); exit status 2, as for a
  config whose slot grid is not the store's: the systemd unit does not restart either,
  since only an operator can mend them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import sqlite3
import stat
import time
from pathlib import Path

import sqlalchemy
import structlog

from controller.admission import AdmissionController
from controller.admission.state import EPOCH_KEY
from controller.config import Config
from controller.errors import SlotGridChangedError, StoreEditedError
from controller.store import MetaRow, StoreUnavailableError, StoreVersionError, migrate
from controller.store.database import Database, rewrites_ahead
from controller.store.poolers import StorePoolerError, check_session, pooler_refusal
from controller.store.refusals import lock_waited, login_refusal, refusal
from controller.store.schema_check import StoreSchemaError
from controller.store.search_path import StoreHiddenError, StoreUnversionedError
from controller.store.urls import shown
from controller.store.writer_lock import PostgresWriterLock, StoreLockedError, WriterLock
from pricing.best_schedule import warm_up
from pricing.errors import SpecError

__all__ = ["START_SECONDS", "StartupError", "open_store"]

START_SECONDS = 300.0
"""Migrations and the rebuild may take this long per statement (the unit's
``TimeoutStartSec``): they grow with the store."""


class StartupError(Exception):
    """The daemon cannot start for a reason outside its config file's syntax (an address
    in use, say); the message names the setting. ``status`` is oasisd's exit status: 1,
    or 2 when only an operator can mend it (the config disagrees with the store), which
    the systemd unit does not restart."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def open_store(config: Config, controller: AdmissionController, writer: WriterLock | None) -> None:
    """Make the data directory, take the writer lock, then migrate the store and rebuild
    the ledger (blocking); StartupError on any failure, the lock let go."""
    db = controller.db
    store = f"the store {shown(db.engine.url)}"
    try:
        if not config.store_url:
            _data_dir(config.data_dir)
        else:
            _left_behind(config.data_dir, store)
        if db.engine.dialect.name == "postgresql":
            check_session(db)  # before the lock: a pooler keeps no session's lock
        if config.ha is not None:
            _open_ha(controller, writer)
            return
        if writer is not None:
            writer.acquire()
        try:
            with db.patient(START_SECONDS):
                controller.open()
            if writer is not None:
                epoch = writer.record(db)
                if isinstance(writer, PostgresWriterLock):
                    # fenced by epoch even without [ha]: after a PostgreSQL restart,
                    # another daemon may take the lock before this one's watch notices
                    controller.fence_epoch = epoch
        except BaseException:
            if writer is not None:
                writer.release()
            raise
    except StoreLockedError as err:
        raise StartupError(str(err)) from err
    except sqlalchemy.exc.DBAPIError as err:  # unreachable, refused, bad credentials, full
        lines = str(err.orig if err.orig is not None else err).strip().splitlines()
        first = lines[0] if lines else ""
        # pgbouncer's, or PostgreSQL's about the role, its password, the database or
        # pg_hba.conf: the operator's to mend, a restart would meet it again
        mend = pooler_refusal(first) or login_refusal(first, db.engine.url)
        if mend is not None:
            raise StartupError(f"cannot open {store}: {mend}", status=2) from err
        # SQLite says "disk I/O error" when the disk is full: say which, with the number
        why = (
            db.space_short()
            or refusal(err.orig, db.engine.url)  # a DBA's to mend: which setting, what to do
            or (lines[0] if lines else str(err))
        )
        raise StartupError(f"cannot open {store}: {why}") from err
    except StoreUnavailableError as err:
        cause = err.__cause__
        waited = (  # a lock wait the store's timeout ended: who holds the tables
            lock_waited(cause.orig, db.engine, db.timeout)
            if isinstance(cause, sqlalchemy.exc.DBAPIError)
            else None
        )
        raise StartupError(f"cannot open {store}: {waited or err}") from err
    except StoreVersionError as err:  # a newer oasis migrated it: a restart cannot help
        raise StartupError(f"{store} {err}", status=2) from err
    except StorePoolerError as err:  # pgbouncer before PostgreSQL: the operator's to mend
        raise StartupError(f"cannot use {store}: {err}", status=2) from err
    except StoreHiddenError as err:  # search_path moved: a restart would not move it back
        raise StartupError(f"cannot use {store}: {err}", status=2) from err
    except StoreUnversionedError as err:  # a restore in part: an operator's to mend
        raise StartupError(f"cannot use {store}: it {err}", status=2) from err
    except StoreSchemaError as err:  # tables and alembic_version apart: the same
        raise StartupError(f"cannot use {store}: it {err}", status=2) from err
    except StoreEditedError as err:  # rows no daemon writes: an operator mends them
        raise StartupError(f"cannot use {store}: {err}", status=2) from err
    except SlotGridChangedError as err:  # the config's slots are not the store's
        raise StartupError(f"cannot use {store}: {err}", status=2) from err
    except SpecError as err:  # a malformed meta row (the recorded slot 0): an operator's
        raise StartupError(  # to mend, so not restarted (it would fail again, in a loop)
            f"cannot use {store}: {err}; set daemon.epoch to the slot 0 its jobs were "
            "planned in, or mend that row",
            status=2,
        ) from err
    except OSError as err:  # the lock file: permissions, a full disk
        where = f" ({err.filename})" if err.filename else ""
        raise StartupError(f"cannot open {store}: {err.strerror or err}{where}") from err


def _open_ha(controller: AdmissionController, writer: WriterLock | None) -> None:
    """With ``[ha]``: open as a standby, which writes nothing (the rebuild, however long,
    holds no lease that could lapse meanwhile); the election then takes the lead at once
    if it is free (``controller/ha/leadership.py``), applying only what was committed
    since. Only a store with no slot 0 recorded yet is opened leading: the first start
    records it (and rebuilds nothing)."""
    db = controller.db
    if not isinstance(writer, PostgresWriterLock):
        raise StartupError(  # the config's to mend: not restarted (exit 2)
            "ha: high availability needs a PostgreSQL store (daemon.store_url = "
            '"postgresql+psycopg://..."); a SQLite store serves a single node',
            status=2,
        )
    try:
        with db.patient(START_SECONDS):
            held = _beside_no_leader(db, writer)
            try:
                # concurrent daemons serialise on the migration's own lock
                migrate(db, controller.log)
            finally:
                if held:
                    writer.release()
            warm_up()  # before any lease is taken: it may take longer than one
            if controller.config.epoch_from_store and writer.try_acquire():
                with db.session() as session:
                    recorded = session.get(MetaRow, EPOCH_KEY) is not None
                if recorded:
                    writer.release()
                else:
                    controller.lead(writer.record(db, controller.advertise), writer.backend_pid)
            controller.open()
    except BaseException:
        writer.release()
        raise


REWRITE_WAIT_SECONDS = 30.0
"""How long an upgraded node waits for the writer lock before it refuses to migrate
across a revision that rewrites the stored jobs (another upgraded node may be doing it)."""


def _beside_no_leader(db: Database, writer: PostgresWriterLock) -> bool:
    """Take the writer lock if the upgrade would apply a migration that rewrites stored
    jobs (:data:`~controller.store.database.REWRITING_REVISIONS`), so that no other node
    leads while it runs; True if it was taken (the caller lets it go after). StartupError
    (exit 2) if another node holds it for :data:`REWRITE_WAIT_SECONDS`: one node at a
    time does not do for such an upgrade. In the upgrade audit a node of the older
    version that led again after 0008 failed every tenant's job, whose new keys it
    refuses, and took jobs under their old ids meanwhile."""
    deadline = time.monotonic() + REWRITE_WAIT_SECONDS
    while True:
        rewriting = rewrites_ahead(db)
        if not rewriting:  # none, or another upgraded node has just applied them
            return False
        if writer.try_acquire():
            if rewrites_ahead(db):
                return True
            writer.release()
            return False
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    holder = writer.holder()
    raise StartupError(
        f"this upgrade's migration {', '.join(rewriting)} rewrites the stored jobs, which an "
        "oasisd of an older version misreads (leading, it fails every tenant's job); "
        f"another node has led for {REWRITE_WAIT_SECONDS:g} s ({holder or 'holder unknown'}): "
        "stop every oasisd on this store, then start the upgraded ones (README: Upgrades)",
        status=2,
    )


def _left_behind(data_dir: Path, store: str) -> None:
    """Warn if ``data_dir`` holds a SQLite store with jobs while ``store_url`` names
    another: setting ``store_url`` moves no job, and the daemon started on an empty store
    without a word, its tenants' jobs left behind there (the restore audit). Read only,
    and any failure to read it is said as such."""
    path = (data_dir / "oasis.db").absolute()  # a file URI names an absolute path
    try:
        if not path.is_file():
            return
    except OSError:  # a folder the daemon's user may not enter: not its store's (review)
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True,
                                                timeout=1.0)) as db:  # fmt: skip
            (jobs,) = db.execute("SELECT count(*) FROM jobs").fetchone()
            (live,) = db.execute(
                "SELECT count(*) FROM jobs WHERE state IN ('admitted', 'running', 'pending')"
            ).fetchone()
    except sqlite3.Error as err:
        structlog.get_logger("oasisd").warning(
            f"daemon.data_dir holds a SQLite store this daemon does not use ({store} is "
            "daemon.store_url), and it could not be read",
            path=str(path), error=str(err)[:200],
        )  # fmt: skip
        return
    if jobs:
        structlog.get_logger("oasisd").warning(
            f"daemon.data_dir's SQLite store holds {jobs} job(s), {live} of them admitted, "
            f"running or pending, that this daemon does not use: it uses {store} "
            "(daemon.store_url). Setting store_url moves no job: stop oasisd and move them with "
            "oasis store copy (README: Moving to PostgreSQL), or move or remove that file "
            "once its jobs are not needed",
            path=str(path), jobs=jobs, live=live,
        )  # fmt: skip


def _data_dir(path: Path) -> None:
    """Make the SQLite store's directory (0700), or check the one there: refused (exit 2)
    if another user owns it or anyone may write it (they could read, swap or delete the
    store, or plant a link where the daemon writes); a warning if others may read it."""
    # exit 2 where only an operator can mend it: a restart would fail the same way, in a
    # loop the unit's start limit never stops (a start fails in 1-3 s, then RestartSec)
    blocked = _closed_ancestor(path)
    if blocked is not None:  # Path.exists() raised PermissionError there: exit 1, looped
        who = _user(os.geteuid())
        mode = f"mode {stat.S_IMODE(blocked.stat().st_mode):04o}"
        raise StartupError(
            f"daemon.data_dir: the daemon's user ({who}) may not enter {blocked} "
            f"({_user(blocked.stat().st_uid)}'s, {mode}), on the way to {path} (a first "
            f"start as root makes missing parent folders 0700): chmod o+x {blocked}, or "
            "give another data_dir",
            status=2,
        )
    if path.exists() and not path.is_dir():
        raise StartupError(f"daemon.data_dir: {path} exists and is not a directory", status=2)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as err:
        mendable = isinstance(err, PermissionError | NotADirectoryError | FileExistsError)
        # ENOENT from mkdir -p: a file system that makes no directories there (/proc, /sys)
        raise StartupError(
            f"daemon.data_dir: cannot create {path}: {err.strerror or err}",
            status=2 if mendable or err.errno in (errno.EROFS, errno.ENOENT) else 1,
        ) from err
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise StartupError(
            f"daemon.data_dir: {path} belongs to {_user(st.st_uid)}, not to the daemon's user "
            f"({_user(me)}): that user could read, swap or delete the store; chown it to "
            "the daemon's user, or give another data_dir",
            status=2,
        )
    # the folder first: in a folder it may not enter, probing its files raises
    unwritable = [path] if not os.access(path, os.W_OK | os.X_OK) else [
        p for p in (path / f"oasis.db{s}" for s in ("", "-wal", "-shm", ".lock"))
        if os.access(p, os.F_OK) and not os.access(p, os.W_OK)
    ]  # fmt: skip
    if unwritable:  # root's (an earlier start as root), not chowned with -R
        owner = _user(unwritable[0].stat().st_uid)
        # a user with no passwd entry has no login group for "name:"
        name = _name(me)
        who = f"{name}:" if name is not None else f"{me}:{os.getegid()}"
        raise StartupError(
            f"daemon.data_dir: the daemon's user ({_user(me)}) may not write "
            f"{unwritable[0]} ({owner}'s): chown -R {who} {path}",
            status=2,
        )
    if st.st_mode & 0o002:  # sticky or not: another user could create oasis.db first
        raise StartupError(
            f"daemon.data_dir: anyone may write in {path} (mode {st.st_mode & 0o7777:04o}): "
            f"they could swap or delete the store; chmod 700 {path}",
            status=2,
        )
    if st.st_mode & 0o020 and st.st_gid != os.getegid():
        structlog.get_logger("oasisd").warning(
            "daemon.data_dir: a group other than the daemon's may write in it (and swap "
            "or delete the store)",
            data_dir=str(path), mode=f"{st.st_mode & 0o7777:04o}", fix=f"chmod g-w {path}",
        )  # fmt: skip
    if st.st_mode & 0o007:
        structlog.get_logger("oasisd").warning(
            "daemon.data_dir: others may read the store",
            data_dir=str(path), mode=f"{st.st_mode & 0o7777:04o}", fix=f"chmod 700 {path}",
        )  # fmt: skip


def _closed_ancestor(path: Path) -> Path | None:
    """The first existing folder above ``path`` (absolute, from the root down) that this
    user may not enter, or None: a data_dir under it can be neither read nor made."""
    for folder in reversed(path.absolute().parents):
        try:
            if not folder.is_dir():
                return None  # missing (made later) or a file: mkdir says so
        except OSError:
            return None
        if not os.access(folder, os.X_OK):
            return folder
    return None


def _name(uid: int) -> str | None:
    """The login name of ``uid``, or None if it has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _user(uid: int) -> str:
    """``uid`` with its name (``uid 1001 (mallory)``), or the number alone."""
    name = _name(uid)
    return f"uid {uid} ({name})" if name is not None else f"uid {uid}"
