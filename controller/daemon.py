"""``oasisd``: the admission daemon.

A short, declarative main: open the store and rebuild the ledger, start the gRPC server
(admission, cluster, health, reflection v1 and v1alpha) and the metrics endpoint, tell systemd it is
ready, then run the periodic events until SIGTERM or SIGINT. Each periodic event catches
and logs its own failures, so one bad tick never kills the daemon. SIGHUP reads the
config file again and applies its tokens (controller/reload.py).

Stopping drains: new submissions, quotes and cancels are refused with UNAVAILABLE, the
decisions in flight are decided and committed (up to ``DRAIN_SECONDS``), then the server
stops; calls it can no longer answer get UNAVAILABLE, never CANCELLED (controller/drain.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pwd
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller import hangups, logs, reflection, startup_gc
from controller.admission import AdmissionController
from controller.auth import AccessInterceptor
from controller.clock import Clock, SlotClock, SteadyClock, SystemClock
from controller.commands.common import version
from controller.config import Config, ConfigError, check_listen, demo_config, load
from controller.connections import RESERVED_FDS, raise_fd_limit
from controller.console.settings import web_from_dict
from controller.drain import StopGate
from controller.ha.leadership import Leadership
from controller.limits import RateLimiter
from controller.metrics import Metrics
from controller.reload import Reloader
from controller.reload_status import ReloadStatus
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.servicer import AdmissionServicer, ClusterServicer, HighAvailabilityServicer
from controller.startup import StartupError, open_store
from controller.statuses import DecodeInterceptor
from controller.store import Database
from controller.store.database import StoreUnavailableError
from controller.store.urls import shown
from controller.store.watch import PROBE_SECONDS, StoreWatch, WriterLockLostError
from controller.store.writer_lock import PostgresWriterLock, writer_lock
from controller.systemd import Notifier
from controller.tls import MAX_RESPONSE_BYTES, check_exposure
from controller.tls_renewal import CHECK_SECONDS, CertificateWatch
from pricing import jit
from pricing.errors import SpecError

__all__ = ["PeriodicEvent", "StartupError", "main", "serve"]

MAX_MESSAGE_BYTES = MAX_RESPONSE_BYTES  # what the daemon sends; its clients read as much
DRAIN_SECONDS = 30.0  # at most this long for decisions in flight at stop (unit: TimeoutStopSec=60)
STOP_GRACE_SECONDS = 5.0  # then for the server's calls to end (reads, held calls)
SERVICES = (
    pb.DESCRIPTOR.services_by_name["Admission"].full_name,
    pb.DESCRIPTOR.services_by_name["Cluster"].full_name,
    pb.DESCRIPTOR.services_by_name["HighAvailability"].full_name,
)
WRITE_SERVICE = SERVICES[0]
"""The service a standby reports NOT_SERVING for (its writes go to the leader)."""


@dataclass(frozen=True)
class PeriodicEvent:
    """A task run every ``interval`` seconds; failures are logged, not raised.

    ``store_trouble``: why the store is still out of reach or refusing writes ("" once
    it is neither; :attr:`~controller.store.database.Database.down_reason`,
    :attr:`~controller.store.database.Database.refusing`). A run that went through
    meanwhile (one with nothing to write) does not say the store is back: under a full
    disk or a read-only database the slot clock said "waits" and "runs again: the store
    is back" every 5 s, while the store took no write."""

    name: str
    interval: float
    run: Callable[[], Awaitable[None]]
    store_trouble: Callable[[], str] | None = None

    async def loop(self) -> None:
        log = structlog.get_logger("oasisd")
        waiting = False  # the store was unavailable at the last run
        while True:
            try:
                await self.run()
                if waiting and not (self.store_trouble is not None and self.store_trouble()):
                    log.info("periodic event runs again: the store is back", task=self.name)
                    waiting = False
            except asyncio.CancelledError:
                raise
            except StoreUnavailableError as err:
                # an outage (a PostgreSQL restart): expected, said once, not a traceback
                # at every run as if it were a bug
                if not waiting:
                    log.warning("periodic event waits: the store is unavailable",
                                task=self.name, error=(str(err).splitlines() or [""])[0][:300])  # fmt: skip
                waiting = True
            except Exception:
                # not ``event=``: structlog's first argument is the event, and a second
                # one raised TypeError here, which ended this task for good
                log.exception("periodic event failed", task=self.name)
            await asyncio.sleep(self.interval)


def numba_cache_fix(cache_dir: str) -> str:
    """What to do when numba cannot cache its kernels, given ``$NUMBA_CACHE_DIR``: set it;
    or, set to a folder this user may not write (a first start as root made it root's,
    0700 under the daemon's umask), the chown that mends it."""
    if not cache_dir:
        return ("set NUMBA_CACHE_DIR to a folder this user may write (the systemd unit "
                "sets /var/cache/oasis/numba)")  # fmt: skip
    path = Path(cache_dir).absolute()
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    if existing is None or os.access(existing, os.W_OK | os.X_OK):
        return f"NUMBA_CACHE_DIR={cache_dir}: check that this user may write every file in it"
    try:
        owner: int | str = existing.stat().st_uid
        owner = pwd.getpwuid(int(owner)).pw_name
    except (OSError, KeyError):
        pass
    me = os.geteuid()
    try:
        who = f"{pwd.getpwuid(me).pw_name}:"
    except KeyError:
        who = f"{me}:{os.getegid()}"
    return (f"NUMBA_CACHE_DIR={cache_dir}: this user (uid {me}) may not write {existing} "
            f"({owner}'s; a start as root makes it so): chown -R {who} {existing}")  # fmt: skip


def _trouble(db: Database) -> Callable[[], str]:
    """A :attr:`PeriodicEvent.store_trouble` of ``db``: why it is out of reach or
    refuses writes, "" if neither."""
    return lambda: db.down_reason or db.refusing


async def serve(
    config: Config,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run the daemon until ``stop`` is set (or a termination signal arrives)."""
    log = structlog.get_logger("oasisd")
    # without an epoch in the config, slot 0 is read from the store when it opens
    slots = SlotClock(SteadyClock(clock or SystemClock()), config.slot_seconds, config.epoch)
    ha = config.ha
    lease = ha.lease_seconds if ha is not None else None
    advertise = _advertise(config) if ha is not None else ""
    db = Database(
        config.database_url,
        config.store_timeout,
        config.sqlite_synchronous,
        idle_transaction=lease,
        log=log,
    )
    controller = AdmissionController(config, db, slots, log=log, commit_process=True)
    controller.advertise = advertise
    writer = writer_lock(db, lease)  # one daemon per store, or one leader (with [ha])
    notifier = Notifier()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # from the start: a SIGINT or SIGTERM while starting was lost (the daemon went on
    # to serve); now it stops the daemon as soon as it has started, through the drain
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    # a reload sent while starting must not end the daemon (SIGHUP's default action):
    # the oasisd command took SIGHUP before its imports (controller/hangups.py)

    def status_unwritten(err: OSError) -> None:
        log.warning("reload: its outcome could not be written for oasisd reload",
                    error=str(err)[:300])  # fmt: skip

    # $RUNTIME_DIRECTORY/reload.json, for `oasisd reload` (systemctl reload) to wait on
    status = ReloadStatus.from_environ(status_unwritten)

    def starting() -> None:
        log.warning("reload: still starting, nothing read; reload again once it is ready")
        status.starting()

    hangups.hold()
    if hangups.route((loop, starting)):  # sent before the loop ran
        starting()
    notifier.status("migrating the store and rebuilding the ledger")
    try:
        await asyncio.to_thread(open_store, config, controller, writer)
    except StartupError:
        controller.close()
        raise
    # Start-up leaves ~170k long-lived objects (numba, SQLAlchemy, protobuf); freezing
    # them keeps full collections (65-96 ms each, measured) from stalling the loop.
    startup_gc.release()

    metrics = Metrics(controller) if config.metrics_listen else None
    # [tls]'s files renewed in place are served to new connections without a restart
    certificates = CertificateWatch(config.tls, log) if config.tls is not None else None
    if metrics is not None and certificates is not None:
        metrics.watch_certificate(lambda: certificates.served.expires)
    plane = PlaneRunner(controller, config, metrics)  # the leader's only
    limits = config.limits
    # the metrics first, so they count the calls refused; then who may call (tokens,
    # roles, rate); then requests that do not decode (INVALID_ARGUMENT, not UNKNOWN)
    limiter = RateLimiter(limits.rate, limits.burst) if limits.rate else None
    connections = config.connections
    access = AccessInterceptor(config.tokens, limiter, connections.max_calls_per_client)
    fds, _ = raise_fd_limit(connections.max_connections + RESERVED_FDS)
    if fds < connections.max_connections + RESERVED_FDS:
        log.warning("descriptor limit below connections.max_connections + reserve",
                    limit=fds, max_connections=connections.max_connections)  # fmt: skip
    gate = StopGate()  # at stop, calls are answered UNAVAILABLE, never cut off
    server = grpc.aio.server(
        interceptors=[
            *([metrics.interceptor()] if metrics else []),
            gate,
            access,
            DecodeInterceptor(),
        ],
        options=[
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),  # a second daemon on this port fails to listen
            *connections.server_options(),
        ],
        maximum_concurrent_rpcs=connections.max_calls,
    )
    pb_grpc.add_AdmissionServicer_to_server(AdmissionServicer(controller, limiter), server)  # type: ignore[no-untyped-call]
    pb_grpc.add_ClusterServicer_to_server(ClusterServicer(controller), server)  # type: ignore[no-untyped-call]
    ha_servicer = HighAvailabilityServicer(controller)
    if config.mqtt is not None:
        ha_servicer.broker = lambda: plane.connected
    pb_grpc.add_HighAvailabilityServicer_to_server(ha_servicer, server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable((*SERVICES, health.SERVICE_NAME), server)  # v1 and v1alpha
    try:
        if certificates is not None:
            port = server.add_secure_port(config.listen, certificates.credentials())
        else:
            port = server.add_insecure_port(config.listen)
        metrics_address = metrics.serve(config.metrics_listen) if metrics is not None else ""
        console = await _console(config, controller, limiter, plane)
    except (RuntimeError, OSError) as err:
        # A busy or foreign address: say which, not a traceback (grpc raises RuntimeError).
        controller.close()  # the plane is not running yet: nothing else to stop
        if writer is not None:
            writer.release()
        what = (
            str(err)
            if isinstance(err, OSError)
            else f"daemon.listen: cannot listen on "
            f"{config.listen} (in use, or not an address of this machine)"
        )
        raise StartupError(what) from err
    host = config.listen.rpartition(":")[0]
    address = f"{host}:{port}"
    await server.start()
    health_now = _Health(health_servicer, controller)
    await health_now.set(True)

    reloader = Reloader(config, [
        lambda new: setattr(access, "tokens", new.tokens),
        *([lambda new: console.set_tokens(new.tokens)] if console is not None else []),
        *([lambda new: limiter.retune(new.limits.rate, new.limits.burst)] if limiter else []),
        controller.reconfigure,
    ], controller.restart_problems, controller.jobs_left,
        controller.restart_moves, status, controller.pending_refused)  # fmt: skip

    def hangup() -> None:
        reloader.hangup()
        if certificates is not None:  # a renewal's deploy hook reloads: served at once
            certificates.check_soon()

    hangups.route((loop, hangup))

    async def health_follows_store(up: bool) -> None:
        if not stop.is_set():  # once stopping, NOT_SERVING stays
            await health_now.set(up, bool(watch.writes_refused))

    async def role_changed(role: str) -> None:
        if role == "leader":
            await plane.start()
        else:
            await plane.stop()
        if not stop.is_set():
            await health_now.set(watch.up, bool(watch.writes_refused))

    # with [ha] the lease is kept by the election, not the watch
    watch = StoreWatch(db, writer if ha is None else None, health_follows_store, stop.set,
                       log=log, on_epoch=controller.lead_again)  # fmt: skip
    events = [PeriodicEvent("slot clock", config.tick_seconds, controller.tick, _trouble(db)),
              PeriodicEvent("store watch", PROBE_SECONDS, watch.check)]  # fmt: skip
    if certificates is not None:
        if console is not None:
            certificates.listeners.append(console.renew)
        events.append(PeriodicEvent("tls files", CHECK_SECONDS, certificates.check))
    if ha is not None:
        assert isinstance(writer, PostgresWriterLock)  # open_store refused anything else
        leadership = Leadership(controller, writer, ha, role_changed, log=log)
        events += [PeriodicEvent("leadership", ha.retry_seconds, leadership.check),
                   PeriodicEvent("follow", ha.follow_seconds, controller.follow)]  # fmt: skip
    tasks: list[asyncio.Task[None]] = []
    if notifier.watchdog_interval is not None:
        ping = _ping(notifier, tasks, log)
        events.append(PeriodicEvent("watchdog", notifier.watchdog_interval, ping))
    if metrics is not None:
        log.info("metrics listening", address=metrics_address)
    if console is not None:
        # behind a proxy, the URL users open too ([web] public_url)
        public = {"public_url": config.web.public_url + "/"} if config.web.public_url else {}
        log.info("console listening", address=console.address, **public)
    if controller.leading:  # before the slot clock's first tick
        await plane.attach()
    tasks += [asyncio.create_task(e.loop(), name=e.name) for e in events]
    if controller.leading:  # after the slot clock's task, as its review follows the tick
        plane.run()
    log.info("listening", address=address, role=controller.role, config=config.source, store=config.database_url
             if not config.store_url else "<store_url>",
             tls="mutual" if config.tls and config.tls.mutual else bool(config.tls),
             auth=config.tokens is not None, rate_limit=limits.rate or None)  # fmt: skip
    if config.tokens is None:
        log.warning("no [auth]: every caller is an operator", address=address,
                    problem="anyone who can connect (on loopback: every user of this "
                    "machine) may cancel any tenant's job and cordon servers; give [auth] "
                    "a tokens_file (oasis token NAME --role operator --add-to FILE)")  # fmt: skip
    if stop.is_set():  # SIGTERM during start-up (migrations, the kernels' compile): a
        # script or systemd waiting for "listening" / READY=1 must not see a daemon that
        # is already stopping (the CLI audit)
        log.info("stopped during start-up: not announced as ready")
    else:
        if on_ready is not None:
            on_ready(address)
        notifier.ready(f"listening on {address}")
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        controller.refuse_new()  # before anyone is told: a call sent on STOPPING is refused
        notifier.stopping("draining: finishing the decisions in flight")
        await reloader.stop()  # a reload now would apply a config to a daemon draining
        for name in ("", *SERVICES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        left = await controller.drain(DRAIN_SECONDS)
        log.info("drained", still_in_flight=left)
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=5)
        await plane.stop()  # the broker link says "offline" first
        if console is not None:
            await console.close()
        await gate.stop(server, STOP_GRACE_SECONDS)
        if metrics is not None:
            metrics.close()
        controller.close()
        if writer is not None:
            writer.release()
        log.info("stopped")
        hangups.route(None)  # the loop closes next: a SIGHUP from now on is only counted
    if watch.lost:
        raise WriterLockLostError(watch.lost)


class _Health:
    """The gRPC health of the daemon's services: all NOT_SERVING while the store is out
    of reach; otherwise SERVING, except the Admission service (the writes: submit, quote,
    cancel) on a standby, so a load balancer sends writes to the leader only, and while
    the store refuses this daemon's writes (a DBA's REVOKE, a read-only database or hot
    standby, a moved search_path: ``controller/store/refusals.py``), so it sends them
    elsewhere until a write goes through again. The Cluster service and the daemon as a
    whole ("") stay SERVING in both cases (reads are served)."""

    def __init__(
        self, servicer: health.aio.HealthServicer, controller: AdmissionController
    ) -> None:
        self.servicer = servicer
        self.c = controller

    async def set(self, store_up: bool, writes_refused: bool = False) -> None:
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        writes = self.c.leading and not writes_refused
        for name in ("", *SERVICES):
            up = store_up and (writes or name != WRITE_SERVICE)
            await self.servicer.set(name, serving if up else not_serving)


class PlaneRunner:
    """The execution plane (``[mqtt]``; none without), run while this daemon leads: its
    state is loaded from the store at each start, so a new leader republishes every plan
    under a plan epoch above the old leader's."""

    def __init__(self, controller: AdmissionController, config: Config, metrics: Metrics | None):
        self.c = controller
        self.config = config
        self.metrics = metrics
        self.tasks: list[asyncio.Task[None]] = []
        self.plane: Any = None  # the running plane's link (controller.plane.link.Plane)

    @property
    def connected(self) -> bool:
        """True while this daemon leads and its plane is connected to the broker."""
        return bool(self.tasks) and self.plane is not None and bool(self.plane.connected)

    async def attach(self) -> None:
        """Load the plane from the store and attach it to the controller, so the slot
        clock asks it about jobs past their plan (a tick without it would complete a job
        its agents reported short of its work); nothing runs yet."""
        if self.config.mqtt is None or self.plane is not None:
            return
        from controller.plane.link import start_plane

        broker_up = self.metrics.set_broker if self.metrics else None
        self.plane = await start_plane(self.c, self.config.mqtt, broker_up)
        self.c.execution = self.plane.execution
        if self.metrics is not None:
            self.metrics.set_broker(False)

    def run(self) -> None:
        """Start the attached plane's review and broker link."""
        if self.plane is None or self.tasks:
            return
        review = PeriodicEvent("execution plane", self.config.tick_seconds, self.plane.review,
                               _trouble(self.c.db))  # fmt: skip
        self.tasks = [asyncio.create_task(review.loop(), name=review.name),
                      asyncio.create_task(self.plane.run(), name="broker link")]  # fmt: skip

    async def start(self) -> None:
        await self.attach()
        self.run()

    async def stop(self) -> None:
        if self.plane is not None:  # seen by its loops if the cancel below is lost
            self.plane.stopping.ask()
        self.plane = None  # loaded again from the store at the next start
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)  # the broker link says "offline" first


def _advertise(config: Config) -> str:
    """Where clients are sent while this daemon leads: ``[ha] advertise``; else
    ``daemon.listen``, with this machine's name for a wildcard host (``0.0.0.0``, ``::``),
    so one config serves every head node."""
    assert config.ha is not None
    if config.ha.advertise:
        return config.ha.advertise
    host, _, port = config.listen.rpartition(":")
    if port == "0":
        raise StartupError(  # the config's to mend: not restarted (exit 2)
            f"ha.advertise: needed when daemon.listen is {config.listen} (clients are sent "
            "to the leader at this host:port)",
            status=2,
        )
    if host.strip("[]") in ("0.0.0.0", "::", ""):
        return f"{socket.getfqdn()}:{port}"
    return config.listen


async def _console(
    config: Config,
    controller: AdmissionController,
    limiter: RateLimiter | None,
    plane: PlaneRunner,
) -> Any:
    """The operator's console on ``[web] listen`` (None if off); aiohttp loads only then."""
    if not config.web.listen:
        return None
    from controller.console.app import start_console

    return await start_console(
        config, controller, limiter, (lambda: plane.connected) if config.mqtt is not None else None
    )


def _ping(
    notifier: Notifier, tasks: list[asyncio.Task[None]], log: Any
) -> Callable[[], Awaitable[None]]:
    """The watchdog's ping: sent while every periodic task runs. One that has ended (it
    should not: each logs its failures and goes on) stops the pings, so systemd restarts
    a daemon whose slot clock, say, no longer ticks, rather than leave it answering."""

    async def ping() -> None:
        ended = [t.get_name() for t in tasks if t.done()]
        if not ended:
            notifier.watchdog()
        elif not stopped:
            stopped.append(True)
            log.error("watchdog: not pinged any more, a periodic task has ended", tasks=ended)

    stopped: list[bool] = []
    return ping


def main(argv: Sequence[str] | None = None) -> int:
    args_given = sys.argv[1:] if argv is None else list(argv)
    if args_given[:1] == ["reload"]:  # `oasisd reload --pid PID`: wait for a reload's verdict
        from controller import reload_wait

        return reload_wait.main(args_given[1:])
    parser = argparse.ArgumentParser(
        prog="oasisd",
        description="The oasis admission daemon. `oasisd reload --pid PID` reloads a "
        "running one's config file and waits for its verdict (systemctl reload).",
    )
    parser.add_argument("--version", action="version", version=f"oasisd {version()}")
    parser.add_argument("--config", metavar="FILE", help="TOML config (default: embedded demo)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="override daemon.listen")
    parser.add_argument("--data-dir", metavar="DIR", help="override daemon.data_dir")
    parser.add_argument(
        "--web-listen", metavar="HOST:PORT", help='override web.listen ("": no console)'
    )
    args = parser.parse_args(argv)
    hangups.hold()  # the oasisd command took it already; python -m controller.daemon not
    startup_gc.hold()  # as hangups: after the imports here, before them with oasisd
    # the store, its write-ahead log and the lock are the daemon's alone (under a umask
    # of 022 every local user could read every tenant's jobs); systemd's unit sets it too
    umask = os.umask(0o077)
    os.umask(umask | 0o077)
    try:
        return _main(args)
    finally:
        os.umask(umask)


def _main(args: argparse.Namespace) -> int:
    try:
        config = load(args.config) if args.config else demo_config()
    except ConfigError as err:  # a line per problem (controller.config.load)
        for line in str(err).splitlines():
            print(f"oasisd: {line}", file=sys.stderr)
        return 2
    if args.listen:
        try:
            config = replace(config, listen=check_listen(args.listen, "--listen"))
        except ConfigError as err:
            print(f"oasisd: {err}", file=sys.stderr)
            return 2
    if args.data_dir:
        config = replace(config, data_dir=Path(args.data_dir))
    if args.web_listen is not None:
        web = {**config.web.to_dict(), "listen": args.web_listen}
        try:
            config = replace(config, web=web_from_dict(web, config.tls))
        except SpecError as err:
            print(f"oasisd: --web-listen: {err}", file=sys.stderr)
            return 2
    try:
        check_exposure(config.listen, config.tls, config.allow_insecure_remote)
    except SpecError as err:
        print(f"oasisd: {err}", file=sys.stderr)
        return 2
    logs.configure(config.log_level)
    for warning in config.warnings:
        structlog.get_logger("oasisd").warning("config problem", problem=warning)
    if jit.UNCACHED:
        structlog.get_logger("oasisd").warning(
            "numba cannot cache the compiled kernels: they are compiled at each start",
            error=jit.UNCACHED[0][:300],
            fix=numba_cache_fix(os.environ.get("NUMBA_CACHE_DIR", "")),
        )

    def ready(address: str) -> None:
        store = shown(config.database_url)
        web = config.web.listen
        scheme = "https" if config.tls else "http"
        console = f"; console: {scheme}://{web}/" if web and not web.endswith(":0") else ""
        logs.sync(0.5)  # a reader of this line finds the log lines before it written
        print(f"oasisd listening on {address} (store: {store}{console})", flush=True)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config, on_ready=ready))
    except (StartupError, WriterLockLostError) as err:
        logs.flush()  # the log lines that led to it first
        print(f"oasisd: {err}", file=sys.stderr)
        return err.status if isinstance(err, StartupError) else 1
    except BaseException:
        logs.flush()  # as above, before the traceback
        raise
    finally:
        hangups.ignore()  # Python's exit gives its handler's signals their default action
    return 0


def _run() -> None:  # pragma: no cover - console entry
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _run()
