"""Several reads sent as one statement (PgConnection's reads ahead): each read a
column of one row, `ARRAY(SELECT r FROM (<read>) r)`, its rows as one array of
records.

psycopg's client work is per statement (about 55 us of Python for each one in a
pipeline, 75 us more per pipeline): seven reads as seven pipelined statements cost
some 400 us of the daemon's CPU, as one statement under 200 us. The result is asked
for in binary, where a record carries each field's type: every row comes back as the
tuple the read alone would have given (an integral DOUBLE PRECISION stays a float,
as it would not through JSON), and an array keeps the order its subselect gave it
(a read's own ORDER BY)."""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

import psycopg

from ctxd.daemon.stores.postgres.conn_state import _key


def statement(reads: Sequence[tuple[str, Sequence[Any]]]) -> tuple[str, list[Any]]:
    """One statement reading every one of `reads` (each already in psycopg's
    placeholders), and its parameters: the reads' parameters in their order."""
    sql = "SELECT " + ", ".join(f"ARRAY(SELECT r FROM ({q}) r)" for q, _ in reads)
    return sql, [p for _, params in reads for p in params]


def answers(row: Sequence[Any] | None, n: int) -> list[list[Any]]:
    """Each read's rows, in the order the reads were given, from the statement's one
    row."""
    if row is None or len(row) != n:
        raise RuntimeError(f"a bundle of {n} reads answered {row!r}")
    return [list(rows) if rows is not None else [] for rows in row]


# reads' statements a connection keeps a run count of (past it, every count starts over:
# a statement is then prepared again in a pipeline, which costs no round trip)
COUNTED = 256


def send(
    raw: psycopg.Connection, reads: Sequence[tuple[str, Sequence[Any]]], prepare: bool,
    convert: Callable[[str], str], memo: dict[Any, list[Any]],
) -> Callable[[], None]:
    """Send `reads` (`?` placeholders, `convert` makes them psycopg's) as one statement,
    several as one bundle; the call returned, once they are answered, keeps each read's
    rows in `memo` (PgConnection's)."""
    keys = [_key(sql, params) for sql, params in reads]
    single = len(reads) == 1
    if single:
        sql, params = reads[0]
        cur = raw.execute(convert(sql), params or None, prepare=prepare)
    else:
        sql, params = statement([(convert(q), p) for q, p in reads])
        cur = raw.execute(sql, params, prepare=prepare, binary=True)

    def keep() -> None:
        rows_of = [cur.fetchall()] if single else answers(cur.fetchone(), len(keys))
        for key, rows in zip(keys, rows_of, strict=True):
            if key is not None:
                memo[key] = rows

    return keep


def preparing(
    runs: dict[tuple[str, ...], int], reads: Sequence[str], planned_per_call: Container[str],
    threshold: int | None,
) -> tuple[bool, bool]:
    """How to send a read ahead (one statement or a bundle) whose reads are the
    statements `reads`: (prepare it, in a pipeline), given how often this connection
    ran it (`runs`, counted here). A read planned per call is never prepared (see
    PgConnection.planned_per_call), nor is a bundle that holds one: it is planned
    whole on every run (a `context/get`'s bundle planned each time cost the server
    some 0.2 ms, before its tail read was made safe to prepare).

    psycopg prepares a statement on its `threshold`th run, and outside a pipeline waits
    for the server's answer to the Parse before it sends the Execute: one round trip
    more. So a read runs unprepared until that run, which is sent prepared in a
    pipeline (Parse, Bind, Execute and Sync together); later runs use the prepared
    statement, without a pipeline (psycopg's own pipeline costs some 75 us of CPU).
    The count is this connection's and starts over with a new one or after a rollback
    (psycopg then forgets what it prepared)."""
    if threshold is None or any(sql in planned_per_call for sql in reads):
        return False, False
    texts = tuple(reads)
    n = runs.get(texts, 0) + 1
    if n == 1 and len(runs) >= COUNTED:
        runs.clear()
    runs[texts] = n
    if n < threshold:
        return False, False
    return True, n == threshold
