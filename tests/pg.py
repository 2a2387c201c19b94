"""A throwaway PostgreSQL server for the tests: a real cluster, never a mock.

`PgCluster` runs Debian's (or any installed) PostgreSQL binaries: `initdb` into a
temporary directory, `postgres` listening on a free loopback port and on a Unix socket in
that directory, stopped and removed at the end. initdb refuses to run as root, so as root
the cluster is created and run as the `postgres` system user.

TCP connections need a password (scram-sha-256), so the tests exercise the DSN plus
`password_env` path for real; the Unix socket trusts the local user.

Missing binaries are an error, not a skip: the store's tests must run against PostgreSQL.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SUPERUSER = "ctxd"
PASSWORD = "ctxd-test-password"


class PostgresMissing(RuntimeError):
    pass


def find_bindir() -> Path:
    """The directory holding initdb and postgres: $CTXD_PG_BINDIR, pg_config, then the
    newest Debian cluster version."""
    candidates: list[str] = []
    if os.environ.get("CTXD_PG_BINDIR"):
        candidates.append(os.environ["CTXD_PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
        reverse=True,
    )
    candidates.extend(debian)
    for c in candidates:
        if (Path(c) / "initdb").exists() and (Path(c) / "postgres").exists():
            return Path(c)
    raise PostgresMissing(
        "PostgreSQL server binaries (initdb, postgres) were not found: install Debian's "
        "`postgresql` package (.ci/run does) or set CTXD_PG_BINDIR"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="ctxd-pg-"))
        self.datadir = self.root / "data"
        self.sockdir = self.root / "sock"
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        if os.geteuid() == 0:
            # initdb refuses root: run the cluster as the postgres system user
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresMissing(
                    "running as root needs a `postgres` system user to own the test cluster"
                ) from None
            self._user = "postgres"
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.sockdir.mkdir()
        if self._user:
            os.chown(self.sockdir, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), user=self._user, capture_output=True, text=True, check=False, **kw
        )

    def start(self) -> PgCluster:
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        r = self._run(
            str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER,
            "--pwfile", str(pwfile), "--auth-local=trust", "--auth-host=scram-sha-256",
            "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        pwfile.unlink()
        self.launch()
        return self

    def launch(self) -> None:
        """Start (or restart) the server on the same data directory and port."""
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - kept for the process
        self.proc = subprocess.Popen(
            [
                str(self.bindir / "postgres"), "-D", str(self.datadir),
                "-p", str(self.port), "-k", str(self.sockdir),
                "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                "-c", "max_connections=200", "-c", "shared_buffers=32MB",
            ],
            user=self._user, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    "postgres exited at start:\n" + (self.root / "server.log").read_text()
                )
            r = self._run(
                str(self.bindir / "pg_isready"), "-h", str(self.sockdir), "-p", str(self.port)
            )
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("postgres did not accept connections within 30 s")

    def halt(self) -> None:
        """Stop the server (fast shutdown), keeping its data: for restart tests."""
        if self.proc and self.proc.poll() is None:
            # SIGINT is a fast shutdown (SIGTERM's smart one would wait for clients)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def socket_dsn(self, dbname: str = "postgres") -> str:
        """A DSN over the Unix socket (trusted, no password)."""
        return f"host={self.sockdir} port={self.port} user={SUPERUSER} dbname={dbname}"

    def tcp_dsn(self, dbname: str = "postgres") -> str:
        """A DSN over loopback TCP; the server asks for PASSWORD."""
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"

    def create_database(self, name: str) -> str:
        """A fresh, empty database; returns its socket DSN."""
        import psycopg

        with psycopg.connect(self.socket_dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.socket_dsn(name)
