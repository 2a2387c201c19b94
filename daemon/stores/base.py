"""The store interface: everything the engine keeps, behind five small typed parts.

The engine (daemon/engine/core.py) and the pieces it drives (the Compactor, context edits)
reach their data only through a `Store`; nothing above this line writes SQL. The
embedded SQLite store (`ctxd.daemon.stores.sqlite.store.SqliteStore`, APSW + FTS5) is the
default and the reference: a new implementation (PostgreSQL, say) passes the same test
suite with the same assertions.

A `Store` has five parts and a transaction:

- `archive` (`ArchiveStore`): sessions, and the append-only record of every message
  with its batch and tool-call bookkeeping, plus full-text search.
- `contexts` (`ContextStore`): one replaceable `ContextState` row per session.
- `pins` (`PinStore`): texts a client pinned to a session's context.
- `runs` (`RunStore`): runs (at most one open per session) and tool approvals.
- `compactions` (`CompactionLogStore`): every compaction attempt.

Contract every implementation keeps (the engine relies on each point):

- **Transactions.** Writes happen only inside `with store.transaction(session_id):`, one
  explicit transaction; the block commits as a whole or not at all. A transaction that
  reads a session's context to write it names the session: a store shared by several
  daemons serializes the writes to that session (and only those); the embedded store's
  single writer serializes every write anyway. A shared store may refuse at once with
  `SessionBusy` (another connection writes the session): the caller waits with
  `wait_session` beside the event loop and runs again (daemon/busy.py).
  A storage failure (disk full, read-only, connection lost) raises
  `ctxd.protocol.errors.StorageError` and leaves nothing written. Reads may run inside or
  outside a transaction; inside, they see the transaction's own writes.
- **One thread.** A store is used from one thread (the daemon's event loop), except
  `search_async` and `read_async`, which run beside it (their own connections,
  read-only).
- **Append-only archive.** Archived rows are never updated or deleted. Message ids are
  integers, unique across the whole store and increasing in append order within a
  session (across sessions too on the embedded store); a batch's ids are
  consecutive (`ArchiveStore.append` returns them). `clientBatchId` is unique per session.
- **Records, not protocol shapes.** Sessions, runs, approvals and pins are returned as
  the small records of stores/records.py (snake_case fields named for the columns),
  which the engine turns into the protocol's Structs (daemon/views.py). Messages and
  search hits are the dicts the protocol sends (an archived message is its chat message
  plus `id`, `batchId`, `tokens`, `createdAt`). Compaction log rows are `Compaction`s
  (protocol/types.py); contexts are `ContextState`s.
- **Errors.** Bad input the store detects (a value JSON cannot store, a search query it
  cannot parse) raises `InvalidParams`; a search over its time budget raises
  `SearchTooBroad`.
- **Ordering.** Reads of messages are in id order; `list_sessions` is newest first by
  (created_at, id); approvals by creation time; pins by creation time, then id.

Everything above the store (id generation, validation, token counting, tool-pair
checks, the active-context arithmetic, events) stays in the engine, so an implementation
only stores and finds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

from ctxd.daemon.stores.records import (
    ApprovalRecord,
    PinRecord,
    RunRecord,
    SearchHitRecord,
    SessionRecord,
)
from ctxd.daemon.stores.sql.contexts import ContextState
from ctxd.protocol.types import Compaction

Message = dict[str, Any]
# (normalized chat message, its JSON body as stored, its token count)
MessageRow = tuple[dict[str, Any], str, int]


T = TypeVar("T")

class ArchiveStore(Protocol):
    # sessions

    def create_session(
        self,
        session_id: str,
        title: str | None,
        metadata: dict[str, Any] | None,
        created_at: float | None = None,
    ) -> float:
        """Insert a session; returns its createdAt (`created_at` when given, else now)."""

    def get_session(self, session_id: str) -> SessionRecord | None: ...

    def list_sessions(
        self, limit: int, after: tuple[float, str] | None, title: str | None = None
    ) -> list[SessionRecord]:
        """Newest first, after the (created_at, id) `after`; `title` keeps titles
        containing it (ASCII letters in either case)."""

    def session_ids_without_context(self) -> list[str]: ...

    def last_message_at(self, session_id: str) -> float | None: ...

    def sizes_at(
        self, session_id: str, times: list[float], start: tuple[int, int, int] = (0, 0, 0)
    ) -> tuple[list[tuple[int, int]], tuple[int, int, int]]:
        """(messages, tokens) of the session's archive at each time, and a checkpoint
        (last id, messages, tokens) a later call may start from."""

    # appending

    def find_batch(
        self, session_id: str, client_batch_id: str
    ) -> tuple[int, str, int, int] | None:
        """(batch id, digest, first message id, last message id) of an earlier batch."""

    def append(
        self,
        session_id: str,
        messages: Sequence[MessageRow],
        *,
        digest: str,
        run_id: str | None,
        client_batch_id: str | None,
        index_texts: Sequence[str] | None = None,
    ) -> tuple[int, list[int], float]:
        """Store one batch whole, indexed for search; returns (batch id, message ids,
        createdAt). Inside a transaction. `index_texts`: each message's text as the
        SQLite store indexes it (`search_text.index_text`), when computed beforehand off the
        event loop; other stores may ignore it."""

    def existing_tool_calls(self, session_id: str, call_ids: Iterable[str]) -> set[str]: ...

    def answered_tool_calls(self, session_id: str, call_ids: Iterable[str]) -> set[str]: ...

    def call_message_ids(self, session_id: str, call_ids: Iterable[str]) -> dict[str, int]:
        """The id of the archived message that made each of these tool calls."""

    def batches_of_closed_runs(self, batch_ids: set[int]) -> set[int]:
        """Which of these batches were appended in a run that is no longer open."""

    # reading

    def read(
        self, session_id: str, after_id: int, limit: int, max_bytes: int | None = None
    ) -> list[Message]: ...

    def read_before(
        self,
        session_id: str,
        before_id: int,
        after_id: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[Message]: ...

    def read_from(
        self, session_id: str, from_id: int, to_id: int | None = None
    ) -> list[Message]: ...

    def has_between(self, session_id: str, after_id: int, before_id: int | None) -> bool: ...

    def get_many(self, ids: Sequence[int]) -> dict[int, Message]: ...

    def message_count(self, session_id: str) -> int: ...

    def count_between(self, session_id: str, lo: int, hi: int) -> int:
        """Messages of the session with lo <= id <= hi."""

    def sums_from(self, session_id: str, from_id: int) -> tuple[int, int]:
        """(messages, tokens) of the session with id >= from_id."""

    def last_id(self, session_id: str) -> int | None: ...

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        role: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 20,
        offset: int = 0,
        newest_first: bool = False,
        advanced: bool = False,
        budget_seconds: float | None = None,
    ) -> tuple[list[SearchHitRecord], str]:
        """Hits (records, best first) and how they
        matched: "all" words, or "any" when no message has them all."""


class ContextStore(Protocol):
    def load(self, session_id: str) -> ContextState | None: ...

    def save(self, st: ContextState) -> None:
        """Insert or replace the whole row."""

    def bump_counts(self, st: ContextState) -> None:
        """The cheap write of an append: system ids, tail start and the two counters."""

    def set_summary_tokens(self, session_id: str, tokens: int) -> None: ...


class PinStore(Protocol):
    def list(self, session_id: str) -> list[PinRecord]:
        """Oldest first."""

    def add(self, pin_id: str, session_id: str, text: str) -> PinRecord: ...

    def remove(self, session_id: str, pin_id: str) -> PinRecord | None:
        """The removed pin, or None when the session has no such pin."""


class RunStore(Protocol):
    def start(self, run_id: str, session_id: str) -> RunRecord:
        """Open a run (status "open"); the engine has checked that the session has no
        open run (a store may also enforce it)."""

    def get(self, run_id: str) -> RunRecord | None: ...

    def open_run(self, session_id: str) -> RunRecord | None: ...

    def open_run_ids(self) -> set[str]: ...

    def finish(self, run_id: str, status: str) -> RunRecord: ...

    def request_approval(
        self,
        approval_id: str,
        session_id: str,
        run_id: str,
        tool_call_id: str,
        tool_name: str | None,
        arguments: Any,
    ) -> ApprovalRecord: ...

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def resolve_approval(
        self, approval_id: str, decision: str, reason: str | None
    ) -> ApprovalRecord:
        """The engine has checked the approval is pending, in the same transaction."""

    def list_approvals(
        self, session_id: str, status: str | None = None
    ) -> list[ApprovalRecord]: ...

    def pending_count(self, session_id: str) -> int: ...


class CompactionLogStore(Protocol):
    def record(self, session_id: str, compaction: Compaction) -> None:
        """Inside a transaction."""

    def history(self, session_id: str, limit: int = 50) -> list[Compaction]:
        """Newest first, with `archive_messages` and `archive_tokens` None."""


class Store(Protocol):
    archive: ArchiveStore
    contexts: ContextStore
    pins: PinStore
    runs: RunStore
    compactions: CompactionLogStore

    def transaction(self, session_id: str | None = None) -> AbstractContextManager[None]:
        """One write transaction (see the module docstring)."""

    async def search_async(
        self, query: str, **kw: Any
    ) -> tuple[list[SearchHitRecord], str]:
        """`archive.search` beside the event loop, within the search time budget."""

    async def read_async(self, fn: Callable[[ArchiveStore], T]) -> T:
        """`fn(archive)` beside the event loop, on a read-only connection of its own
        (committed data only): for scans too long to run on the loop."""

    def close(self) -> None: ...


@runtime_checkable
class SharedArchive(ArchiveStore, Protocol):
    """The archive of a store other daemons append to as well."""

    def preceding_id(self, session_id: str) -> int | None:
        """The id of the session's last message before the batch this store last
        appended to it (0: none), once; None when it is not known."""


@runtime_checkable
class SharedStore(Store, Protocol):
    """A store other daemons write too (PostgreSQL): what the engine asks of one beyond
    `Store`. The engine checks for it once (`shared_store`) instead of probing each
    member; the embedded store has none of these and needs none."""

    shared: bool
    # how long a write waits for another connection's lock on its session (seconds)
    lock_timeout: float

    def share_event(self, session_id: str, method: str, params: dict[str, Any]) -> None:
        """Tell the other daemons of an event this one emitted."""

    def append_transaction(
        self, session_id: str, msgs: list[dict[str, Any]], client_batch_id: str | None,
        run_id: str | None,
    ) -> AbstractContextManager[None]:
        """An append's write transaction, with the reads made under its lock sent ahead."""

    def status_reads(
        self, session_id: str, *, context: bool, open_run: bool, pending: bool,
    ) -> AbstractContextManager[None]:
        """What a status reads, in one round trip."""

    def context_reads(self, session_id: str) -> AbstractContextManager[None]:
        """What a context read needs, in one round trip."""

    def keep_view(self, view: Any) -> None:
        """Let the reads ahead ask the engine's kept contexts what they hold."""

    def in_lane(self, session_id: str, fn: Callable[[], T]) -> asyncio.Future[T]:
        """`fn()` on a worker thread, after the session's earlier calls (its place in
        their order taken when called)."""

    async def wait_session(self, session_id: str, timeout: float) -> None:
        """Wait beside the event loop until no connection holds the session's lock."""

    def try_compaction_lock(self, session_id: str) -> bool:
        """Whether this daemon may compact the session now."""

    def release_compaction_lock(self, session_id: str) -> None: ...

    def compacting_elsewhere(self, session_id: str) -> bool:
        """Whether another daemon compacts the session now."""


# store class -> whether it is a SharedStore: checking a runtime Protocol walks every one
# of its members (some 0.1 ms), and requests on a shared store ask once each
_SHARED_KINDS: dict[type, bool] = {}


def shared_store(store: object) -> SharedStore | None:
    """`store` when other daemons write it too, else None."""
    kind = type(store)
    shared = _SHARED_KINDS.get(kind)
    if shared is None:
        shared = _SHARED_KINDS[kind] = isinstance(store, SharedStore)
    return store if shared and store.shared else None  # type: ignore[attr-defined]
