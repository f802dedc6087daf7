"""The config file read again on SIGHUP (``systemctl reload oasisd``): who may call, and
the limits, change without a restart.

What a reload applies at once is ``[auth]``'s tokens file, read again:

- a token added may call at once (a new tenant, a new operator);
- a token removed, rotated (its name's line holds another hash) or given another role is
  refused at its next call (``UNAUTHENTICATED``), its console sessions end, and the
  streams it opened (``WatchEvents``, the console's live events) end at their next event,
  or within :data:`controller.auth.REVOKE_CHECK_SECONDS` (15 s).

and ``[limits]``, each decision reading them as it begins (:func:`limit_changes`), but
for ``max_message_bytes`` (gRPC's, set when its server starts), ``max_ledger_mb``
(checked against the window at start), turning ``rate`` on or off (the rate limiter
exists only if it was on at start; a new rate or burst retunes it) and a
``max_wait_seconds`` lowered below the running ``daemon.wait_seconds`` (the default wait,
read at start: applied alone, it would refuse every submission without a wait).

Everything else is read at start only, as before: a reload names each table of the file
that differs from what the daemon runs as waiting for a restart, at every reload until
one, and changes nothing of it. A file that would not start the daemon (any error, in any
table) changes nothing at all: the error is logged, the daemon goes on as it was, and
the operator learns of the mistake before a restart would have stopped on it; so does a
file not read within :data:`READ_SECONDS` (a FIFO, a hung mount), whose read is left to a
daemon thread that holds neither later reloads nor the daemon's exit. Turning
``[auth]`` on or off is a change of ``[auth]`` that waits for a restart too: it decides
whether calls are authenticated at all.

Each reload's verdict and what it said is written for ``oasisd reload`` to wait on
(:mod:`controller.reload_status`, :mod:`controller.reload_wait`), so ``systemctl reload``
fails when the file is refused, rather than return success while the journal alone says so.

The alternative, a restart per tenant added or token rotated, costs every tenant the
daemon's downtime (a drain, start-up, a failover with ``[ha]``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import structlog

from controller.auth import Caller
from controller.config import Config, ConfigError, load
from controller.limits import Limits
from controller.reload_status import ReloadStatus
from controller.threads import in_daemon_thread

__all__ = [
    "MAX_NAMES_CHECKED",
    "READ_SECONDS",
    "WHY_AT_START",
    "Reloader",
    "Reread",
    "TokenChanges",
    "edited_keys",
    "limit_changes",
    "reread",
    "restart_reasons",
    "token_changes",
]

READ_SECONDS = 30.0
"""The longest a reload waits for the config and tokens files to be read: one that never
returns (a FIFO, a hung network mount) is refused, and later reloads are not held
behind it."""

RESTART_CHECK_SECONDS = 30.0
"""The longest a reload waits for the store to say whether a restart with the file read
would start (it reads every live job's spec: 0.5 s at 50,000)."""


@dataclass(frozen=True)
class TokenChanges:
    """What a reload changes of who may call, by token name (each tuple sorted).

    Attributes:
        added: names that had no token.
        removed: names that have none now.
        rotated: names whose token is another (the old one no longer calls).
        roles: ``"name: old -> new"`` for names whose role changed.
    """

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rotated: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.rotated or self.roles)

    def words(self) -> str:
        """One line for the log and a status: ``"added bob; removed alice"``, or
        ``"no change"``."""
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("rotated", self.rotated),
                ("role changed", self.roles),
            )
            if names
        ]
        return "; ".join(parts) or "no change"


def token_changes(
    old: Mapping[str, Caller] | None, new: Mapping[str, Caller] | None
) -> TokenChanges:
    """The changes from ``old`` to ``new`` (``{sha256: Caller}``; None: no ``[auth]``,
    no names)."""
    before = {c.name: (digest, c.role) for digest, c in (old or {}).items()}
    after = {c.name: (digest, c.role) for digest, c in (new or {}).items()}
    both = before.keys() & after.keys()
    return TokenChanges(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        rotated=tuple(sorted(n for n in both if before[n][0] != after[n][0])),
        roles=tuple(
            sorted(
                f"{n}: {before[n][1].value} -> {after[n][1].value}"
                for n in both
                if before[n][1] is not after[n][1]
            )
        ),
    )


@dataclass(frozen=True)
class Reread:
    """What a reload found.

    Attributes:
        config: the running config with what the reload applies: the tokens and the
            limits, and ``[auth]``'s table as read now (the other tables stay as they
            were read at start, so every reload names them until a restart applies them).
        tokens: what changes of who may call (empty if ``[auth]`` waits for a restart).
        limits: the ``[limits]`` changes applied, in words (``"rate: 20 -> 40"``).
        restart: what was edited that applies only at the next restart, sorted: tables
            (``"auth"`` among them when ``[auth]`` was added or removed) and
            ``"limits.KEY"`` for the limits read only at start.
        warnings: what the file holds that is worth a warning: a removed tenant's cap
            left behind, a file with secrets that others may read.
        fresh: the file as read, whole: what the next restart would start with (None
            when built by hand).
        keys: the keys edited in the tables of ``restart``, sorted, as
            ``"table.key"`` (``"cluster.servers"``, ``"daemon.window"``); a table
            added or removed whole is named by itself.
    """

    config: Config
    tokens: TokenChanges
    limits: tuple[str, ...]
    restart: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    fresh: Config | None = None
    keys: tuple[str, ...] = ()


MAX_NAMES_CHECKED = 20
"""Of the tenants one reload removes, the most whose jobs are counted (a count each)."""

WHY_AT_START = {
    "auth": "whether calls are authenticated at all is set at start",
    "cluster": "the ledger, its prices and every plan are built over these servers at "
    "start (a restart re-places, re-plans or fails the plans that no longer fit)",
    "connections": "the gRPC server's connection options are set when it starts",
    "daemon": "the store, the listening address, the slot grid and the clock are set up at start",
    "ha": "the election of a leader starts with the daemon",
    "metrics": "the metrics endpoint starts with the daemon",
    "mqtt": "the broker link and the agents' plans start with the daemon (a new broker or "
    "topic_prefix: move each agent too, oasis agent --broker, --topic-prefix; until heard "
    "there, the jobs on its server do not run)",
    "pricing": "the price bounds and their estimate are set up at start",
    "tls": "the gRPC server's certificate and key are loaded when it starts",
    "web": "the console starts with the daemon",
    "limits.max_message_bytes": "gRPC's largest request is set when its server starts",
    "limits.max_ledger_mb": "the ledger's size is checked against the window at start",
    "limits.rate": "the rate limiter exists only if rate was on at start (a new rate or "
    "burst retunes it)",
    "limits.burst": "the rate limiter exists only if rate was on at start",
    "limits.max_wait_seconds": "lowered below the running daemon.wait_seconds (read at "
    "start), it would refuse every submission without a wait of its own until the restart "
    "that applies both",
}
"""Why each table (or ``[limits]`` key) that a reload does not apply waits for a
restart: the reload's warning says it beside the keys edited."""

_LIMITS_AT_START = ("max_message_bytes", "max_ledger_mb")
"""``[limits]`` keys read only at start: gRPC's largest request, set when its server starts,
and the ledger's size, checked against the window then."""


_JOB_LIMITS = (
    "max_utility",
    "max_utility_by_submitter",
    "max_job_work",
    "max_job_chunks",
    "max_search_steps",
    "max_search_mb",
)
"""The ``[limits]`` keys a pending job is checked against again at each slot boundary
(:meth:`controller.limits.Limits.check_job`): a reload that changes one of them checks
the pending jobs (:meth:`Reloader._check_pending`)."""


def limit_changes(
    running: Limits, fresh: Limits, wait_seconds: float = 0.0
) -> tuple[Limits, tuple[str, ...], tuple[str, ...]]:
    """What a reload does with ``[limits]``: the limits to run with (``running`` with every
    key of ``fresh`` that applies now), those changes in words (``"rate: 20 -> 40"``) and
    the keys that wait for a restart: :data:`_LIMITS_AT_START`, ``rate``/``burst`` when
    the rate is turned on or off (the rate limiter exists only if it is on at start), and
    ``max_wait_seconds`` lowered below ``wait_seconds``, the running ``daemon.wait_seconds``
    (read at start only): applied alone, every submission without a wait of its own would
    be refused (``wait_seconds: 2h exceeds limits.max_wait_seconds = 1h``) until a restart,
    though the file, edited in both, starts the daemon."""
    toggled = (running.rate > 0) != (fresh.rate > 0)
    applied: dict[str, object] = {}
    changed: list[str] = []
    restart: list[str] = []
    for f in fields(Limits):
        old, new = getattr(running, f.name), getattr(fresh, f.name)
        if old == new:
            continue
        below_wait = f.name == "max_wait_seconds" and new < wait_seconds
        if f.name in _LIMITS_AT_START or (toggled and f.name in ("rate", "burst")) or below_wait:
            restart.append(f"limits.{f.name}")
            continue
        applied[f.name] = new
        if isinstance(old, Mapping) or isinstance(new, Mapping):
            changed.append(f"{f.name}: {dict(old)} -> {dict(new)}")
        else:
            changed.append(f"{f.name}: {old:g} -> {new:g}")
    return replace(running, **applied), tuple(changed), tuple(restart)  # type: ignore[arg-type]


def reread(running: Config, path: Path) -> Reread:
    """Read the config file at ``path`` again against the ``running`` config.

    Raises:
        ConfigError: the file would not start the daemon (nothing applies then).
    """
    former = {caller.name for caller in (running.tokens or {}).values()}
    fresh = load(path, former)  # a removed tenant's cap left behind: a warning
    if running.keys.get("daemon.data_dir") == fresh.keys.get("daemon.data_dir"):
        # not edited: a restart keeps the running one (oasisd --data-dir's, if given)
        fresh = replace(fresh, data_dir=running.data_dir)
    edited = {
        table
        for table in running.tables.keys() | fresh.tables.keys()
        if running.tables.get(table) != fresh.tables.get(table)
    }
    restart = edited - {"auth", "limits"}
    limits, changed, at_start = limit_changes(running.limits, fresh.limits, running.wait_seconds)
    restart.update(at_start)
    tables = dict(running.tables)
    if (running.tokens is None) != (fresh.tokens is None):
        restart.add("auth")  # authentication itself turned on or off
        tokens = running.tokens
    else:
        tokens = fresh.tokens
        tables.pop("auth", None)
        if "auth" in fresh.tables:
            tables["auth"] = fresh.tables["auth"]
    applied = replace(running, tokens=tokens, limits=limits, tables=tables)
    return Reread(
        applied, token_changes(running.tokens, tokens), changed, tuple(sorted(restart)),
        fresh.warnings, fresh, edited_keys(running, fresh, restart),
    )  # fmt: skip


def edited_keys(running: Config, fresh: Config, restart: set[str]) -> tuple[str, ...]:
    """The ``"table.key"`` edited from ``running`` to ``fresh`` in each table of
    ``restart`` (its ``"limits.KEY"`` entries as they are); a table that only one of
    them has is named whole."""
    out: set[str] = set()
    for name in restart:
        if "." in name or (name in running.tables) != (name in fresh.tables):
            out.add(name)
            continue
        prefix = f"{name}."
        keys = {k for k in running.keys.keys() | fresh.keys.keys() if k.startswith(prefix)}
        out.update(k for k in keys if running.keys.get(k) != fresh.keys.get(k))
    return tuple(sorted(out))


def _shown(name: str) -> str:
    """An entry of a reload's ``restart`` as the log shows it: ``"[table]"``, or
    ``"limits.KEY"`` as it is."""
    return name if "." in name else f"[{name}]"


def restart_reasons(restart: Sequence[str]) -> list[str]:
    """``"[table]: why"`` (or ``"limits.KEY: why"``) for each entry of a reload's
    ``restart``, from :data:`WHY_AT_START`."""
    return [f"{_shown(name)}: {WHY_AT_START.get(name, 'read at start')}" for name in restart]


class Reloader:
    """SIGHUP's handler: reads the config file again off the event loop, one reload at a
    time, and hands what applies to each of ``targets``.

    Args:
        running: the config the daemon runs (its ``source`` is the file read again;
            without ``tables`` it was not read from a file: the embedded defaults).
        targets: called on the event loop, in order, with the config to run from now
            on (the gRPC interceptor's and the console's tokens, the rate limiter, the
            controller's config); one that returns an awaitable is awaited.
        restart_problems: given the file as read, why a restart with it would be
            refused (:meth:`AdmissionController.restart_problems`: the store's jobs
            planned in another slot grid, or demanding a resource it lacks); each is
            logged as an error when the file has changes that wait for a restart, so the
            operator mends the file before a restart (a reboot) leaves the daemon down.
        jobs_left: given the names a reload removed from the tokens file, the jobs each
            still has in the store that may yet run (:meth:`AdmissionController.jobs_left`:
            ``{name: {"pending": n, "admitted": n, "running": n}}``, names without any
            left out); logged as a warning, so removing a tenant is not taken for
            stopping its work.
        restart_moves: given the file as read, which admitted plans a restart with it
            would re-place, re-plan or fail (:meth:`AdmissionController.restart_moves`:
            a server left out, renamed, of another kind or smaller, a shorter window);
            each logged as a warning, so an edit (a typo in a name) does not move
            tenants' jobs unannounced at the next restart.
        status: where each reload's outcome is written for ``oasisd reload`` to wait
            on (:mod:`controller.reload_status`); None: nowhere.
        pending_refused: given the config applied, the pending jobs its limits refuse
            (:meth:`AdmissionController.pending_refused`: one line per submitter), which
            the next slot boundary expires for good; logged as a warning when a reload
            changes ``[limits]``, so a cap lowered by a slip is mended before then.
    """

    def __init__(
        self,
        running: Config,
        targets: Sequence[Callable[[Config], object]],
        restart_problems: Callable[[Config], Awaitable[Sequence[str]]] | None = None,
        jobs_left: Callable[[Sequence[str]], Awaitable[Mapping[str, Mapping[str, int]]]]
        | None = None,
        restart_moves: Callable[[Config], Awaitable[Sequence[str]]] | None = None,
        status: ReloadStatus | None = None,
        pending_refused: Callable[[Config], Awaitable[Sequence[str]]] | None = None,
    ) -> None:
        self.running = running
        self.targets = targets
        self.restart_problems = restart_problems
        self.jobs_left = jobs_left
        self.restart_moves = restart_moves
        self.pending_refused = pending_refused
        self.status = status or ReloadStatus(None)
        self._said: list[str] = []  # what the reload running said, for its waiters
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Reread | None]] = set()
        self._waiting: asyncio.Task[Reread | None] | None = None
        self._stopping = False
        self._told_stopping = False
        self.log = structlog.get_logger("oasisd")

    def hangup(self) -> None:
        """The signal handler (on the event loop): start a reload, unless one waits for
        its turn already (it reads the file after this signal anyway: a storm of
        SIGHUPs is one reload more, not one per signal), or the daemon is stopping
        (said once; nothing read)."""
        if self._stopping:
            if not self._told_stopping:
                self._told_stopping = True
                self.log.warning("reload: the daemon is stopping; nothing read")
            return
        if self._waiting is not None:
            return
        task = asyncio.get_running_loop().create_task(self._signalled(), name="reload")
        self._waiting = task
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """At the daemon's stop: later SIGHUPs read nothing, and the reloads running or
        waiting are cancelled and awaited (a reload applied during the drain had its
        config's marks refused, and one left waiting was destroyed pending when the
        loop closed)."""
        self._stopping = True
        self.status.stopping()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _signalled(self) -> Reread | None:
        async with self._lock:
            self._waiting = None  # a SIGHUP from now on reads the file again after this
            return await self._answered()

    async def reload(self) -> Reread | None:
        """Read the file again and apply its tokens; None if nothing could be read (the
        reason logged)."""
        async with self._lock:
            return await self._answered()

    async def _answered(self) -> Reread | None:
        """:meth:`_reread`, numbered as it begins and its outcome written for the waiters
        (:mod:`controller.reload_status`)."""
        number = self.status.begin()
        self._said = []
        found = await self._reread(number)
        if found is None:
            self.status.answer(number, "refused", self._said)
        else:
            self.status.answer(number, "applied", self._said)
        return found

    def _say(self, line: str) -> None:
        """A line for the waiters of the reload running (``oasisd reload``)."""
        self._said.append(line)

    async def _reread(self, number: int) -> Reread | None:
        """:meth:`reload`, the lock held; ``number``: the reload's, for its answer."""
        if not self.running.tables:
            self.log.warning(
                "reload: no config file to read again (the embedded defaults; start "
                "oasisd --config FILE)"
            )
            self._say("reload refused: no config file to read again (the embedded defaults; "
                      "start oasisd --config FILE)")  # fmt: skip
            return None
        path = Path(self.running.source)
        try:
            read = in_daemon_thread(reread, self.running, path, name="reload")
            async with asyncio.timeout(READ_SECONDS):
                found = await read
        except TimeoutError:
            self.log.error(
                "reload refused: the config or tokens file was not read within "
                f"{READ_SECONDS:g} s (a FIFO, a hung mount?); nothing changed",
                config=str(path),
            )  # fmt: skip
            self._say(f"reload refused: the config or tokens file was not read within "
                      f"{READ_SECONDS:g} s (a FIFO, a hung mount?); nothing changed")  # fmt: skip
            return None
        except ConfigError as err:
            self.log.error(
                "reload refused: the config file would not start oasisd; nothing "
                "changed", config=str(path), error=str(err),
            )  # fmt: skip
            self._say(f"reload refused: {path} would not start oasisd; nothing changed:")
            self._said.extend(f"  {line}" for line in str(err).splitlines())
            return None
        except Exception as err:  # MemoryError, a bug: the daemon serves on as it was
            self.log.exception(
                "reload refused: reading the config failed; nothing changed",
                config=str(path), error=f"{type(err).__name__}: {str(err)[:300]}",
            )  # fmt: skip
            self._say(f"reload refused: reading the config failed ({type(err).__name__}: "
                      f"{str(err)[:300]}); nothing changed")  # fmt: skip
            return None
        before, self.running = self.running.limits, found.config
        for target in self.targets:
            done = target(found.config)
            if inspect.isawaitable(done):
                await done
        self.log.info(
            "config reloaded", config=str(path), tokens=found.tokens.words(),
            limits=list(found.limits), restart_needed=list(found.restart),
        )  # fmt: skip
        self._say(f"config reloaded: {path}")
        self._say(f"tokens: {found.tokens.words()}")
        self._say(f"limits: {'; '.join(found.limits) or 'no change'}")
        for problem in found.warnings:
            self.log.warning("config reloaded with a problem", problem=problem)
            self._say(f"warning: {problem}")
        if found.tokens.removed:
            await self._check_left(found.tokens.removed)
        if any(getattr(before, k) != getattr(found.config.limits, k) for k in _JOB_LIMITS):
            await self._check_pending(found.config)
        if found.restart:
            self.log.warning(
                "config changes that apply only at a restart",
                changed=[_shown(t) for t in found.restart],
                keys=list(found.keys), why=restart_reasons(found.restart),
                hint="systemctl restart oasisd",
            )  # fmt: skip
            self._say(f"waits for a restart (systemctl restart oasisd): {', '.join(found.keys)}")
            self._said.extend(f"  {why}" for why in restart_reasons(found.restart))
            self.status.answer(number, "applied", self._said, final=False)  # before the checks
            await self._check_restart(found)
        return found

    async def _check_left(self, removed: Sequence[str]) -> None:
        """Warn of the jobs that the tenants ``removed`` from the tokens file still have
        waiting, admitted or running: their calls are refused from now on, but their
        pending jobs are still searched at every slot boundary and may be admitted, and
        their admitted jobs run on (a token removed by mistake and put back loses
        nothing). ``oasis cancel NAME:ID`` ends one."""
        if self.jobs_left is None:
            return
        names = list(removed[:MAX_NAMES_CHECKED])
        try:
            left = await self.jobs_left(names)
        except Exception as err:  # the store out of reach: the reload stands
            self.log.warning("reload: the removed tenants' jobs could not be counted",
                             error=str(err)[:300])  # fmt: skip
            self._say(f"warning: the removed tenants' jobs could not be counted: {str(err)[:300]}")
            return
        if left:
            self.log.warning(
                "tenants removed from the tokens file still have jobs that may run: "
                "pending ones are still admitted when they fit, admitted ones run on; "
                "oasis cancel NAME:ID ends one",
                jobs={name: dict(counts) for name, counts in left.items()},
                **({"not_checked": len(removed) - len(names)} if len(removed) > len(names) else {}),
            )  # fmt: skip
            jobs = ", ".join(f"{name}: {dict(counts)}" for name, counts in left.items())
            self._say("warning: tenants removed from the tokens file still have jobs that may "
                      f"run (oasis cancel NAME:ID ends one): {jobs}")  # fmt: skip

    async def _checked(self, what: str, check: Awaitable[Sequence[str]]) -> Sequence[str] | None:
        """``check``'s lines, within :data:`RESTART_CHECK_SECONDS`; None, logged and said
        ("could not check WHAT"), if it fails: the store out of reach, a timeout."""
        try:
            async with asyncio.timeout(RESTART_CHECK_SECONDS):
                return await check
        except Exception as err:  # said, not fatal
            error = f"{type(err).__name__}: {str(err)[:300]}"
            self.log.warning(f"reload: could not check {what}", error=error)
            self._say(f"warning: could not check {what}: {error}")
            return None

    async def _check_pending(self, applied: Config) -> None:
        """Warn of the pending jobs the limits just applied refuse: the next slot
        boundary expires them ("no longer valid"), for good, unless ``[limits]`` is
        mended and reloaded before it."""
        if self.pending_refused is None:
            return
        refused = await self._checked(
            "the pending jobs against the new limits", self.pending_refused(applied)
        )
        for line in refused or ():
            self.log.warning(
                "reload: pending jobs over the new [limits] expire at the next slot "
                "boundary, for good; if that is not meant, mend [limits] and reload again "
                "before it", config=self.running.source, jobs=line,
            )  # fmt: skip
            self._say(f"warning: pending jobs over the new [limits] expire at the next slot "
                      f"boundary: {line}")  # fmt: skip

    async def _check_moves(self, found: Reread) -> None:
        """Warn of the admitted plans a restart with the file just read would move."""
        if self.restart_moves is None or found.fresh is None:
            return
        moves = await self._checked(
            "which plans a restart would move", self.restart_moves(found.fresh)
        )
        for move in moves or ():
            self.log.warning(
                "reload: a restart with this config file would move admitted jobs; if that "
                "is not meant (a server renamed by mistake), mend the file and reload again; "
                "to free a server first, oasis cordon it",
                config=self.running.source, moves=move,
            )  # fmt: skip
            self._say(f"warning: a restart with this config file would move admitted jobs: {move}")

    async def _check_restart(self, found: Reread) -> None:
        """Log, as errors, why a restart with the file just read would be refused."""
        if self.restart_problems is None or found.fresh is None:
            return
        try:
            async with asyncio.timeout(RESTART_CHECK_SECONDS):
                problems = await self.restart_problems(found.fresh)
        except Exception as err:  # the store out of reach, a timeout: said, not fatal
            self.log.warning(
                "reload: could not check that a restart with this config would start",
                error=f"{type(err).__name__}: {str(err)[:300]}",
            )
            self._say("warning: could not check that a restart with this config would start: "
                      f"{type(err).__name__}: {str(err)[:300]}")  # fmt: skip
            return
        await self._check_moves(found)
        for problem in problems:
            self.log.error(
                "reload: a restart with this config file would be refused (exit 2), and "
                "the daemon would stay down; mend the file, then reload again",
                config=self.running.source, problem=problem,
            )  # fmt: skip
            self._say(
                "error: a restart with this config file would be refused (exit 2), and "
                f"the daemon would stay down; mend the file, then reload again: {problem}"
            )
