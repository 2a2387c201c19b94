"""The connection file as one typed record: written and read in protocol/connection.py
only, with exactly its documented keys, on a real file in a private directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ctxd.protocol.connection import (
    CONNECTION_KEYS,
    ConnectionInfo,
    daemon_gone,
    format_hostport,
    read_connection_file,
    split_endpoint,
    write_connection_file,
)

KEYS = ("pid", "jsonrpc_tcp", "jsonrpc_unix", "websocket", "http", "zmq_router", "zmq_pub",
        "token", "data_dir", "store", "version")


def record(**over: object) -> ConnectionInfo:
    values: dict[str, object] = {
        "pid": os.getpid(), "jsonrpc_tcp": "127.0.0.1:4100", "jsonrpc_unix": None,
        "websocket": "ws://127.0.0.1:4101", "http": "http://127.0.0.1:4101/",
        "zmq_router": "ipc:///run/r.sock", "zmq_pub": "ipc:///run/p.sock", "token": "tok",
        "data_dir": "/data/数据", "store": "sqlite /data/ctxd.db", "version": "1.2.3"}
    values.update(over)
    return ConnectionInfo(**values)  # type: ignore[arg-type]


def private_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


def test_written_and_read_back_with_exactly_its_keys(tmp_path: Path) -> None:
    path = private_dir(tmp_path) / "ctxd.json"
    info = record()
    write_connection_file(path, info)
    on_disk = json.loads(path.read_text(encoding="utf-8"))
    assert tuple(on_disk) == KEYS == CONNECTION_KEYS
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert read_connection_file(path) == info
    assert read_connection_file(path).to_dict() == on_disk


def test_a_file_with_fewer_or_more_keys_reads(tmp_path: Path) -> None:
    # an older daemon's file (no jsonrpc_unix, no http) and a newer one's extra key
    path = private_dir(tmp_path) / "ctxd.json"
    old = {k: v for k, v in record().to_dict().items() if k not in ("jsonrpc_unix", "http")}
    path.write_text(json.dumps({**old, "later_key": 1}))
    path.chmod(0o600)
    got = read_connection_file(path)
    assert got.jsonrpc_unix is None and got.http is None
    assert got.token == "tok" and got.pid == os.getpid()


@pytest.mark.parametrize("bad", [
    {"pid": "12"}, {"pid": True}, {"token": 5}, {"token": None}, {"websocket": ["x"]},
])
def test_a_value_of_the_wrong_type_is_refused_on_write_and_read(
        tmp_path: Path, bad: dict[str, object]) -> None:
    path = private_dir(tmp_path) / "ctxd.json"
    raw = {**record().to_dict(), **bad}
    with pytest.raises(ValueError, match="not a ctxd connection file"):
        write_connection_file(path, raw)
    assert not path.exists()  # nothing written
    path.write_text(json.dumps(raw))
    path.chmod(0o600)
    with pytest.raises(ValueError, match=f"its {next(iter(bad))} is"):
        read_connection_file(path)


def test_a_file_without_a_token_is_not_a_connection_file(tmp_path: Path) -> None:
    path = private_dir(tmp_path) / "ctxd.json"
    for text in ('{"pid": 1}', "[1, 2]"):
        path.write_text(text)
        path.chmod(0o600)
        with pytest.raises(ValueError, match="not a ctxd connection file"):
            read_connection_file(path)


def test_daemon_gone_reads_the_record_and_a_mapping() -> None:
    assert not daemon_gone(record())
    assert not daemon_gone(record(pid=None))
    assert not daemon_gone({"pid": os.getpid()})


@pytest.mark.parametrize(("host", "port", "written"), [
    ("127.0.0.1", 4100, "127.0.0.1:4100"), ("::1", 4100, "[::1]:4100")])
def test_endpoints_are_written_and_parsed_in_one_place(host: str, port: int,
                                                       written: str) -> None:
    assert format_hostport(host, port) == written
    for endpoint in (written, f"tcp://{written}", f"ws://{written}"):
        assert split_endpoint(endpoint) == (host, port)
    with pytest.raises(ValueError, match="bad jsonrpc_tcp"):
        split_endpoint("127.0.0.1", "jsonrpc_tcp")
