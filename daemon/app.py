"""The daemon process: one per data dir, every wire, one engine.

Start-up order: take the data dir's lock, open the engine, bind every endpoint, then
write the connection file (so a client that reads it can connect). Shut-down reverses
it: remove the connection file, stop accepting, let a running compaction finish (or
abandon it: it commits atomically or not at all), close the database, drop the lock.
`Daemon.run` is that list of steps, each a method below it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from ctxd import __version__
from ctxd.daemon.config import Config, StartupError
from ctxd.daemon.data_dir import AlreadyRunning, open_data_dir, reason, store_description
from ctxd.daemon.dispatch import Dispatcher
from ctxd.daemon.engine import Engine
from ctxd.daemon.logsetup import configure_logging
from ctxd.daemon.ownership import (
    PidLock,
    Refused,
    connection_file_lock,
    ipc_endpoints,
    jsonrpc_socket_path,
    prepare_connection_dir,
    refuse_live_socket,
)
from ctxd.daemon.servers.admission import plan_budget, raise_descriptor_limit
from ctxd.daemon.servers.base import EventHub
from ctxd.daemon.servers.jsonrpc import WireLimits, start_tcp_server, start_websocket_server
from ctxd.daemon.servers.rpc_tcp import JsonRpcTcpServer, start_unix_server
from ctxd.daemon.servers.rpc_websocket import JsonRpcWebSocketServer
from ctxd.daemon.servers.web import PageServer
from ctxd.daemon.servers.zmq_server import ZmqServer
from ctxd.protocol.connection import (
    ConnectionInfo,
    UnsafePath,
    connection_file_for,
    default_runtime_dir,
    ensure_private_dir,
    write_connection_file,
)

log = logging.getLogger("ctxd.daemon")

SHUTDOWN_GRACE_SECONDS = 5.0
# sun_path holds 108 bytes on Linux, with the terminating NUL
_MAX_SOCKET_PATH = 108

__all__ = ["AlreadyRunning", "Daemon", "page_base_url", "serve"]


@dataclass
class Wires:
    """The servers started so far: shut-down closes whichever exist, so a start that
    fails half-way closes what it had bound."""

    tcp: JsonRpcTcpServer | None = None
    unix: JsonRpcTcpServer | None = None
    ws: JsonRpcWebSocketServer | None = None
    zmq: ZmqServer | None = None
    http: str = ""

    def started(self) -> list[JsonRpcTcpServer | JsonRpcWebSocketServer | ZmqServer]:
        return [s for s in (self.tcp, self.unix, self.ws, self.zmq) if s is not None]


@dataclass
class Background:
    """Tasks the daemon runs beside the wires, cancelled at shut-down."""

    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.connection_file = config.connection_file or connection_file_for(config.data_dir)
        self.token = secrets.token_urlsafe(32)
        self.stopping = asyncio.Event()
        self.info: ConnectionInfo | None = None
        self.background = Background()

    async def run(self) -> int:
        lock, engine = open_data_dir(self.config)
        conn_lock = self._claim_connection_file(engine, lock)
        hub = EventHub()
        engine.add_listener(hub.publish)
        dispatcher = self._dispatcher(engine, hub)
        self._watch_runs(engine, dispatcher, hub)
        # before anything is announced: a client may stop us as soon as it can find us
        self._handle_signals()
        wires = Wires()
        try:
            await self._start_wires(wires, dispatcher, hub)
            self._write_connection_file(wires)
            self._announce(wires)
            self._probe_summarizer()
            await self.stopping.wait()
            log.info("stopping")
        finally:
            await self._shut_down(wires, dispatcher, engine, conn_lock, lock)
        return 0

    def _claim_connection_file(self, engine: Engine, lock: PidLock) -> PidLock:
        """Lock the connection file's place (one daemon per connection file); on failure
        the engine and the data dir's lock are let go again."""
        conn_lock = connection_file_lock(self.connection_file)
        try:
            prepare_connection_dir(self.connection_file)
            conn_lock.acquire()
        except BaseException:
            engine.close()
            lock.release()
            raise
        return conn_lock

    def _dispatcher(self, engine: Engine, hub: EventHub) -> Dispatcher:
        cfg = self.config
        return Dispatcher(
            engine,
            hub,
            self.token,
            on_shutdown=self.stopping.set,
            wires=["jsonrpc-tcp", "websocket", "zmq", "stdio"],
            auth_timeout=cfg.auth_timeout_seconds,
            run_lease=cfg.run_lease_seconds,
            # the wires' reply limit (see RpcCore): a context above it is refused up front
            max_reply_bytes=max(cfg.max_request_bytes, 1 << 20),
        )

    def _watch_runs(self, engine: Engine, dispatcher: Dispatcher, hub: EventHub) -> None:
        """Runs left open by a daemon that is gone get one lease for their clients to
        come back; on a shared store, other daemons' events reach this one's subscribers."""
        if not engine.shared:
            dispatcher.lease_stale_runs(engine.runs.open_run_ids())
            return
        # read only for the sessions one watches; open runs may be other, live daemons'
        # runs, so none is leased here but the ones whose daemon is found gone
        from ctxd.daemon.stores.postgres.events import start_relay, watch_orphaned_runs

        loop = asyncio.get_running_loop()
        self.background.tasks.append(start_relay(engine, loop, hub))
        self.background.tasks.append(asyncio.create_task(watch_orphaned_runs(
            engine, dispatcher.lease_stale_runs, max(0.5, self.config.run_lease_seconds / 3)
        )))

    def _handle_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)

    async def _start_wires(self, wires: Wires, dispatcher: Dispatcher, hub: EventHub) -> None:
        """Bind every endpoint, filling `wires` as each one starts."""
        cfg = self.config
        port = cfg.port
        budget = plan_budget(
            raise_descriptor_limit(), cfg.max_connections, cfg.max_unauthenticated_connections
        )
        limits = WireLimits(
            max_frame=cfg.max_request_bytes,
            max_connections=budget.max_connections,
            require_login=True,
            login_timeout=cfg.auth_timeout_seconds,
            max_unauthenticated=budget.max_unauthenticated,
            fd_ceiling=budget.ceiling,
        )
        wires.tcp = await start_tcp_server(dispatcher, hub, cfg.host, port, limits)
        unix_path = self._unix_socket_path()
        if unix_path is not None:
            wires.unix = await start_unix_server(dispatcher, hub, unix_path, limits)
        wires.ws = await start_websocket_server(
            dispatcher, hub, cfg.host, port + 1 if port else 0, limits
        )
        wires.ws.pages = PageServer(wires.ws.port, cfg.host)
        wires.http = page_base_url(cfg.host, wires.ws.port)
        router, pub = self._zmq_endpoints()
        wires.zmq = ZmqServer(
            dispatcher,
            hub,
            router,
            pub,
            max_message_size=cfg.max_request_bytes,
            curve_token=self.token if cfg.zmq_transport == "tcp" else None,
            run_lease=cfg.run_lease_seconds,
        )
        await wires.zmq.start()

    def _zmq_endpoints(self) -> tuple[str, str]:
        if self.config.zmq_transport == "tcp":
            host = self.config.host
            if self.config.port:
                return (
                    f"tcp://{host}:{self.config.port + 2}",
                    f"tcp://{host}:{self.config.port + 3}",
                )
            return f"tcp://{host}:0", f"tcp://{host}:0"
        run_dir = ensure_private_dir(default_runtime_dir(), what="runtime dir")
        endpoints = ipc_endpoints(run_dir, self.connection_file)
        for endpoint in endpoints:
            refuse_live_socket(endpoint)
        return endpoints

    def _unix_socket_path(self) -> str | None:
        """Where the JSON-RPC Unix socket goes: the private runtime dir, named after the
        connection file like the ZeroMQ sockets; None when the path is too long for a
        socket address (clients then use TCP)."""
        run_dir = ensure_private_dir(default_runtime_dir(), what="runtime dir")
        path = jsonrpc_socket_path(run_dir, self.connection_file)
        if len(os.fsencode(path)) >= _MAX_SOCKET_PATH:
            log.warning("no JSON-RPC Unix socket: its path %s is too long", path)
            return None
        refuse_live_socket(f"ipc://{path}")
        return path

    def _write_connection_file(self, wires: Wires) -> None:
        """Announce the daemon: written only once every endpoint is bound."""
        assert wires.tcp is not None and wires.ws is not None and wires.zmq is not None
        cfg = self.config
        self.info = ConnectionInfo(
            pid=os.getpid(),
            jsonrpc_tcp=wires.tcp.endpoint,
            jsonrpc_unix=wires.unix.endpoint if wires.unix is not None else None,
            websocket=wires.ws.endpoint,
            http=wires.http,
            zmq_router=wires.zmq.router_endpoint,
            zmq_pub=wires.zmq.pub_endpoint,
            token=self.token,
            data_dir=str(cfg.data_dir),
            store=store_description(cfg),
            version=__version__,
        )
        write_connection_file(self.connection_file, self.info)

    def _announce(self, wires: Wires) -> None:
        """One log line, and the endpoints on stderr for the person who started it."""
        assert wires.tcp is not None and wires.ws is not None and wires.zmq is not None
        assert self.info is not None
        cfg = self.config
        log.info(
            "ctxd %s serving %s; connection file %s",
            __version__,
            cfg.data_dir,
            self.connection_file,
        )
        print(
            f"ctxd {__version__} serving {cfg.data_dir}\n"
            f"  store:           {self.info.store}\n"
            f"  connection file: {self.connection_file}\n"
            f"  json-rpc tcp:    {wires.tcp.endpoint}\n"
            + (f"  json-rpc unix:   {wires.unix.endpoint}\n" if wires.unix is not None else "")
            + f"  websocket:       {wires.ws.endpoint}\n"
            f"  web page:        {wires.http} (ctxd ui opens it logged in)\n"
            f"  zmq router:      {wires.zmq.router_endpoint}\n"
            f"  zmq pub:         {wires.zmq.pub_endpoint}",
            file=sys.stderr,
            flush=True,
        )

    def _probe_summarizer(self) -> None:
        if self.config.summarizer != "builtin":
            # in the background: a slow endpoint must not delay serving
            self.background.tasks.append(
                asyncio.create_task(_report_summarizer(self.config))
            )

    async def _shut_down(
        self,
        wires: Wires,
        dispatcher: Dispatcher,
        engine: Engine,
        conn_lock: PidLock,
        lock: PidLock,
    ) -> None:
        """The start in reverse: unannounce, stop accepting, let a running compaction
        finish, then close the store and let go of the locks whatever failed before."""
        try:
            if self.info is not None:
                self.connection_file.unlink(missing_ok=True)
            for server in wires.started():
                await server.close()
            await dispatcher.scheduler.drain(SHUTDOWN_GRACE_SECONDS)
        finally:
            self.background.cancel()
            engine.close()
            conn_lock.release()
            lock.release()


async def _report_summarizer(cfg: Config) -> None:
    """Say at start whether the model endpoint is there and serves the model."""
    from ctxd.daemon.summarizers.llm_probe import summarizer_report

    ok, line = await asyncio.to_thread(summarizer_report, cfg)
    (log.info if ok else log.warning)("%s", line)
    print(f"  {line}", file=sys.stderr, flush=True)


def page_base_url(host: str, port: int) -> str:
    """The page's address: on a loopback name, the only Host the page server accepts."""
    name = "[::1]" if host in ("::1", "[::1]") else "127.0.0.1"
    return f"http://{name}:{port}/"


def serve(config: Config) -> int:
    configure_logging(config.log_file, config.log_max_bytes, config.log_backups)
    # files and sockets the daemon creates are its user's alone, whatever the umask
    os.umask(0o077)
    try:
        daemon = Daemon(config)
    except OSError as exc:  # the runtime dir for the connection file
        raise StartupError(
            f"{exc.filename or 'the runtime directory'}: {reason(exc)}; expected a "
            "writable runtime directory (CTXD_RUNTIME_DIR) or --connection-file"
        ) from None
    try:
        return asyncio.run(daemon.run())
    except AlreadyRunning as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 3
    except (Refused, UnsafePath) as exc:
        print(f"ctxd: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # e.g. the connection file's lock or the file itself on a full disk: one line
        # naming the file and the reason, the traceback in the log for a bug report
        log.debug("start-up failed", exc_info=True)
        where = exc.filename or "start-up"
        print(f"ctxd: {where}: {reason(exc)}; expected a writable runtime directory with "
              "free space (CTXD_RUNTIME_DIR or --connection-file)", file=sys.stderr)
        return 2
