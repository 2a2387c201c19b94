"""A real `ctxd serve` on the PostgreSQL store, configured as an operator would: the DSN
in the configuration, the password in an environment variable it names."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from helpers import DaemonProcess
from pg import PASSWORD, PgCluster

from ctxd.daemon.config import ConfigError, load_config
from ctxd.protocol.errors import StorageError

PW_VAR = "CTXD_TEST_PG_PASSWORD"


def pg_env(dsn: str) -> dict[str, str]:
    return {
        "CTXD_STORE": "postgres",
        "CTXD_POSTGRES_DSN": dsn,
        "CTXD_POSTGRES_PASSWORD_ENV": PW_VAR,
        PW_VAR: PASSWORD,
    }


def _dir(p: Path) -> Path:
    p.mkdir()
    return p


def test_config_keys_are_validated(tmp_path: Path) -> None:
    cfg = load_config(environ={})
    assert cfg.store == "sqlite" and cfg.postgres.dsn == ""
    with pytest.raises(ConfigError, match="store: expected one of 'sqlite', 'postgres'"):
        load_config(environ={"CTXD_STORE": "mysql"})
    with pytest.raises(ConfigError, match="postgres.dsn is empty"):
        load_config(environ={"CTXD_STORE": "postgres"})
    with pytest.raises(ConfigError, match="contains a password"):
        load_config(environ={"CTXD_STORE": "postgres",
                             "CTXD_POSTGRES_DSN": "host=db user=u password=secret"})
    with pytest.raises(ConfigError, match="contains a password"):
        load_config(environ={"CTXD_STORE": "postgres",
                             "CTXD_POSTGRES_DSN": "postgresql://u:secret@db/ctxd"})
    with pytest.raises(ConfigError, match="not a valid connection string"):
        load_config(environ={"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": "host=db ="})
    with pytest.raises(ConfigError, match="'NOPE_PW', which is not set"):
        load_config(environ={"CTXD_STORE": "postgres", "CTXD_POSTGRES_DSN": "host=db",
                             "CTXD_POSTGRES_PASSWORD_ENV": "NOPE_PW"})
    toml = tmp_path / "ctxd.toml"
    toml.write_text('store = "postgres"\n[postgres]\ndsn = "host=db dbname=ctxd"\n'
                    'password_env = "PW"\n')
    cfg = load_config(toml, environ={"PW": "x"})
    assert (cfg.store, cfg.postgres.dsn, cfg.postgres.password_env) == (
        "postgres", "host=db dbname=ctxd", "PW")
    with pytest.raises(ConfigError, match="unknown key postgres.password;"):
        toml.write_text('[postgres]\npassword = "x"\n')
        load_config(toml, environ={})


def test_daemon_serves_from_postgres(tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    env = pg_env(pg_cluster.tcp_dsn(dbname))
    d = DaemonProcess(_dir(tmp_path / "a"), env=env).start()
    try:
        with d.client() as c:
            sid = c.create_session(title="pg")["sessionId"]
            c.append(sid, [{"role": "user", "content": "我们讨论了上下文压缩策略"},
                           {"role": "assistant", "content": "noted"}])
            hits = c.search("压缩")["hits"]
            assert [h["snippet"] for h in hits] == ["我们讨论了上下文**压缩**策略"]
            assert hits[0]["inActiveContext"] is True
    finally:
        d.stop()
    assert not (d.data_dir / "ctxd.db").exists()  # nothing went to an embedded file
    # another daemon, with a data dir of its own, finds the same archive
    other = DaemonProcess(_dir(tmp_path / "b"), env=env).start()
    try:
        with other.client() as c:
            msgs = c.read(sid)["messages"]
            assert [m["content"] for m in msgs] == ["我们讨论了上下文压缩策略", "noted"]
            ctx = c.context_get(sid)
            assert [m["content"] for m in ctx["messages"]][-1] == "noted"
    finally:
        other.stop()


def test_wrong_password_is_a_clear_startup_error(tmp_path: Path, pg_cluster: PgCluster) -> None:
    env = {**pg_env(pg_cluster.tcp_dsn()), PW_VAR: "wrong"}
    with pytest.raises(RuntimeError, match="postgres.dsn: the PostgreSQL server cannot be"):
        DaemonProcess(tmp_path, env=env).start()


def test_server_restart_gives_typed_errors_then_recovers(tmp_path: Path) -> None:
    cluster = PgCluster().start()
    try:
        from ctxd.daemon.stores.postgres.store import PostgresStore

        store = PostgresStore(cluster.socket_dsn())
        with store.transaction():
            store.archive.create_session("s1", "t", None)
        cluster.halt()
        with pytest.raises(StorageError, match="cannot be reached"):
            store.archive.get_session("s1")
        with pytest.raises(StorageError):
            with store.transaction():
                store.archive.create_session("s2", None, None)
        cluster.launch()
        assert store.archive.get_session("s1").title == "t"  # reconnected by itself
        with store.transaction():
            store.archive.create_session("s2", None, None)
        assert store.archive.get_session("s2") is not None
        store.close()
    finally:
        cluster.stop()


def test_daemon_survives_a_postgres_restart(tmp_path: Path) -> None:
    cluster = PgCluster().start()
    d = DaemonProcess(_dir(tmp_path / "d"), env=pg_env(cluster.tcp_dsn())).start()
    try:
        with d.client("jsonrpc") as c:
            sid = c.create_session()["sessionId"]
            c.append(sid, [{"role": "user", "content": "before"}])
            cluster.halt()
            with pytest.raises(StorageError):
                c.append(sid, [{"role": "user", "content": "while down"}])
            cluster.launch()
            # the same daemon, the same client connection: served again
            c.append(sid, [{"role": "user", "content": "after"}])
            assert [m["content"] for m in c.read(sid)["messages"]] == ["before", "after"]
    finally:
        d.stop()
        cluster.stop()
