"""The daemon process: one per data dir, every wire, one engine.

Start-up order: take the data dir's lock, open the engine, bind every endpoint, then
write the connection file (so a client that reads it can connect). Shut-down reverses
it: remove the connection file, stop accepting, let a running compaction finish (or
abandon it: it commits atomically or not at all), close the database, drop the lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import apsw

from ctxd import __version__
from ctxd.daemon.config import Config, StartupError
from ctxd.daemon.dispatch import Dispatcher
from ctxd.daemon.engine import Engine
from ctxd.daemon.logsetup import configure_logging
from ctxd.daemon.ownership import (
    PidLock,
    Refused,
    check_data_dir,
    connection_file_lock,
    ipc_endpoints,
    jsonrpc_socket_path,
    prepare_connection_dir,
    refuse_live_socket,
)
from ctxd.daemon.servers.admission import plan_budget, raise_descriptor_limit
from ctxd.daemon.servers.base import EventHub
from ctxd.daemon.servers.jsonrpc import start_tcp_server, start_websocket_server
from ctxd.daemon.servers.rpc_tcp import start_unix_server
from ctxd.daemon.servers.web import PageServer
from ctxd.daemon.servers.zmq_server import ZmqServer
from ctxd.protocol.connection import (
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


class AlreadyRunning(RuntimeError):
    pass


def data_dir_lock(data_dir: Path) -> PidLock:
    """An flock on `<data dir>/daemon.lock` holding the owner's pid."""
    return PidLock(
        data_dir / "daemon.lock",
        lambda owner: AlreadyRunning(
            f"another ctxd daemon (pid {owner}) serves {data_dir}; use it, or stop it first"
        ),
    )


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.connection_file = config.connection_file or connection_file_for(config.data_dir)
        self.token = secrets.token_urlsafe(32)
        self.stopping = asyncio.Event()
        self.info: dict[str, Any] = {}

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

    async def run(self) -> int:
        cfg = self.config
        lock, engine = open_data_dir(cfg)
        conn_lock = connection_file_lock(self.connection_file)
        try:
            prepare_connection_dir(self.connection_file)
            conn_lock.acquire()
        except BaseException:
            engine.close()
            lock.release()
            raise
        hub = EventHub()
        engine.add_listener(hub.publish)
        dispatcher = Dispatcher(
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
        if engine.shared:
            # other daemons' appends reach this one's subscribers (read only for the
            # sessions one watches); open runs may be other, live daemons' runs, so none
            # is leased here
            from ctxd.daemon.stores.postgres.events import start_relay, watch_orphaned_runs

            self.listener_watch = start_relay(engine, asyncio.get_running_loop(), hub.watched)
            self.orphan_watch = asyncio.create_task(watch_orphaned_runs(
                engine, dispatcher.lease_stale_runs, max(0.5, cfg.run_lease_seconds / 3)
            ))
        else:
            # runs a dead daemon left open: their clients get one lease to come back
            dispatcher.lease_stale_runs(engine.runs.open_run_ids())
        port = cfg.port
        tcp = ws = zmq_server = unix = None
        budget = plan_budget(
            raise_descriptor_limit(), cfg.max_connections, cfg.max_unauthenticated_connections
        )
        wire_limits: dict[str, Any] = {
            "max_frame": cfg.max_request_bytes,
            "max_connections": budget.max_connections,
            "require_login": True,
            "login_timeout": cfg.auth_timeout_seconds,
            "max_unauthenticated": budget.max_unauthenticated,
            "fd_ceiling": budget.ceiling,
        }
        # before anything is announced: a client may stop us as soon as it can find us
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        try:
            tcp = await start_tcp_server(dispatcher, hub, cfg.host, port, **wire_limits)
            unix_path = self._unix_socket_path()
            if unix_path is not None:
                unix = await start_unix_server(dispatcher, hub, unix_path, **wire_limits)
            ws = await start_websocket_server(
                dispatcher, hub, cfg.host, port + 1 if port else 0, **wire_limits
            )
            ws.pages = PageServer(ws.port, cfg.host)
            http = page_base_url(cfg.host, ws.port)
            router, pub = self._zmq_endpoints()
            zmq_server = ZmqServer(
                dispatcher,
                hub,
                router,
                pub,
                max_message_size=cfg.max_request_bytes,
                curve_token=self.token if cfg.zmq_transport == "tcp" else None,
                run_lease=cfg.run_lease_seconds,
            )
            await zmq_server.start()
            self.info = {
                "pid": os.getpid(),
                "jsonrpc_tcp": tcp.endpoint,
                "jsonrpc_unix": unix.endpoint if unix is not None else None,
                "websocket": ws.endpoint,
                "http": http,
                "zmq_router": zmq_server.router_endpoint,
                "zmq_pub": zmq_server.pub_endpoint,
                "token": self.token,
                "data_dir": str(cfg.data_dir),
                "store": store_description(cfg),
                "version": __version__,
            }
            write_connection_file(self.connection_file, self.info)
            log.info(
                "ctxd %s serving %s; connection file %s",
                __version__,
                cfg.data_dir,
                self.connection_file,
            )
            print(
                f"ctxd {__version__} serving {cfg.data_dir}\n"
                f"  store:           {self.info['store']}\n"
                f"  connection file: {self.connection_file}\n"
                f"  json-rpc tcp:    {tcp.endpoint}\n"
                + (f"  json-rpc unix:   {unix.endpoint}\n" if unix is not None else "")
                + f"  websocket:       {ws.endpoint}\n"
                f"  web page:        {http} (ctxd ui opens it logged in)\n"
                f"  zmq router:      {zmq_server.router_endpoint}\n"
                f"  zmq pub:         {zmq_server.pub_endpoint}",
                file=sys.stderr,
                flush=True,
            )
            if cfg.summarizer != "builtin":
                # in the background: a slow endpoint must not delay serving
                self._probe_task = asyncio.create_task(_report_summarizer(cfg))
            await self.stopping.wait()
            log.info("stopping")
        finally:
            try:
                if self.info:
                    self.connection_file.unlink(missing_ok=True)
                for server in (tcp, unix, ws, zmq_server):
                    if server is not None:
                        await server.close()
                await dispatcher.scheduler.drain(SHUTDOWN_GRACE_SECONDS)
            finally:
                for name in ("orphan_watch", "listener_watch"):
                    watch = getattr(self, name, None)
                    if watch is not None:
                        watch.cancel()
                engine.close()
                conn_lock.release()
                lock.release()
        return 0


def store_description(cfg: Config) -> str:
    """Where the archive lives, for people: the SQLite file, or the PostgreSQL database
    (its dsn never holds a password: config refuses one)."""
    if cfg.store == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(cfg.postgres.dsn)
        where = params.get("host") or "local socket"
        port = f":{params['port']}" if params.get("port") else ""
        return f"postgresql database {params.get('dbname') or '(default)'} on {where}{port}"
    return f"sqlite {cfg.db_path}"


def _open_postgres(cfg: Config, lock: PidLock) -> Engine:
    """The engine on the PostgreSQL store (the data dir still holds this daemon's own
    connection file and log); a server that cannot be reached is a StartupError."""
    import psycopg

    from ctxd.daemon.stores.postgres.factory import store_from_config
    from ctxd.protocol.errors import StorageError

    try:
        return Engine(cfg, store=store_from_config(cfg))
    except StorageError as exc:
        lock.release()
        raise StartupError(f"postgres.dsn: {exc.message}") from None
    except (psycopg.Error, RuntimeError) as exc:  # e.g. no right to create the tables
        lock.release()
        raise StartupError(f"postgres.dsn: cannot prepare the database ({exc})") from None


def open_data_dir(cfg: Config) -> tuple[PidLock, Engine]:
    """Take the data dir's lock and open the engine; what stops either (a path that is
    not a directory, no permission, a full disk, a database that is not ctxd's) becomes
    one `StartupError` line naming the path."""
    where = cfg.data_dir
    try:
        if cfg.data_dir.exists() and not cfg.data_dir.is_dir():
            raise NotADirectoryError(20, "it is a file, not a directory")
        # refuses a data dir, database or lock file another user owns or may write to
        check_data_dir(cfg.data_dir)
        lock = data_dir_lock(cfg.data_dir)
        where = lock.path
        lock.acquire()
    except OSError as exc:
        raise StartupError(
            f"{where}: {_reason(exc)}; expected a writable data directory of yours with free "
            "space (data_dir, --data-dir or CTXD_DATA_DIR)"
        ) from None
    if cfg.store == "postgres":
        return lock, _open_postgres(cfg, lock)
    try:
        return lock, Engine(cfg)
    except (OSError, apsw.Error) as exc:
        lock.release()
        raise StartupError(
            f"{cfg.db_path}: cannot open the database ({_reason(exc)}); expected a ctxd "
            "database on a writable disk with free space"
        ) from None


async def _report_summarizer(cfg: Config) -> None:
    """Say at start whether the model endpoint is there and serves the model."""
    from ctxd.daemon.summarizers.llm_probe import summarizer_report

    ok, line = await asyncio.to_thread(summarizer_report, cfg)
    (log.info if ok else log.warning)("%s", line)
    print(f"  {line}", file=sys.stderr, flush=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, apsw.FullError):
        return "the disk is full"
    if isinstance(exc, apsw.IOError):
        return f"I/O error, is the disk full? {exc}"
    return str(exc) or type(exc).__name__


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
            f"{exc.filename or 'the runtime directory'}: {_reason(exc)}; expected a "
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
        print(f"ctxd: {where}: {_reason(exc)}; expected a writable runtime directory with "
              "free space (CTXD_RUNTIME_DIR or --connection-file)", file=sys.stderr)
        return 2
