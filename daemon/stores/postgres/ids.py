"""Message and batch ids on PostgreSQL, allocated without a lock shared by every session.

Ids are global (one sequence of message ids, one of batch ids, across sessions) and a
batch's message ids are consecutive, as on the embedded store. What must keep an order
is one session: its appends are serialized by the session's row lock
(stores/postgres/connection.py), and its ids are allocated after that lock is taken, so within
a session ids grow in commit order (what counting on from the last count and paging by
id rely on). Across sessions only uniqueness matters: two sessions' appends may commit in
either order.

So the allocation is a fetch-and-add on one counter row (`ctxd_ids`, schema migration 5)
made in a statement of its own, on a connection of its own, committed at once: the row
is locked for that statement only, never across an append's round trips. An append that
then fails leaves a gap, as a sequence would. The allocation commits without waiting for
its WAL to reach disk (synchronous_commit off): an append using the ids commits after it,
and its own flush carries the allocation with it.
"""

from __future__ import annotations

from ctxd.daemon.stores.postgres.connection import PgConnection

ALLOCATE = (
    "UPDATE ctxd_ids SET next_message_id = next_message_id + ?, "
    "next_batch_id = next_batch_id + 1 "
    "RETURNING next_message_id - ?, next_batch_id - 1"
)

# after `ctxd copy` wrote rows with ids of their own: the counter moves past them
CATCH_UP = (
    "UPDATE ctxd_ids SET "
    "next_message_id = greatest(next_message_id, (SELECT coalesce(max(id), 0) + 1 FROM messages)), "
    "next_batch_id = greatest(next_batch_id, (SELECT coalesce(max(id), 0) + 1 FROM batches))"
)


class IdAllocator:
    def __init__(self, main: PgConnection) -> None:
        self.conn = PgConnection(
            main.dsn, main.password, lock_timeout=main.lock_timeout,
            statement_timeout=main.statement_timeout,
            settings={"synchronous_commit": "off"}, per_thread=True,
        )
        # never prepared: preparing costs a round trip of its own, once per connection,
        # and planning this one-row UPDATE costs the server microseconds
        self.conn.planned_per_call.add(ALLOCATE)

    def allocate(self, count: int) -> tuple[list[int], int]:
        """`count` consecutive message ids and one batch id, never given out again."""
        # sent again on a new connection if the server restarted since the last append
        # (ids an answer lost on the way never reached are a gap, nothing more)
        first, batch_id = self.conn.execute_again(ALLOCATE, (count, count)).fetchone()
        return list(range(first, first + count)), batch_id

    def close(self) -> None:
        self.conn.close()
