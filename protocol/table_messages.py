"""Protocol table entries. Appending and reading the archive: `messages/append`,
`archive/read`, `archive/search`.

Assembled in order with the other groups by `ctxd.protocol.methods`.
"""

from typing import Annotated, Literal

from msgspec import Meta

from ctxd.protocol import types
from ctxd.protocol.declare import (
    APPEND_MAX_MESSAGES,
    ID_MAX,
    JSON,
    LIMIT_MAX,
    MESSAGE_ITEMS,
    OFFSET_MAX,
    QUERY_MAX,
    READ_BYTES_DEFAULT,
    READ_BYTES_MAX,
    READ_LIMIT_MAX,
    Method,
    Params,
    SessionId,
)
from ctxd.protocol.errors import ErrorCode

_E = ErrorCode


class MessagesAppendParams(Params):
    session_id: SessionId
    messages: Annotated[
        list[JSON],
        Meta(
            min_length=1,
            max_length=APPEND_MAX_MESSAGES,
            extra_json_schema=MESSAGE_ITEMS,
            description=(
                "OpenAI-shaped chat messages (`role`, `content`, `tool_calls`, `tool_call_id`, "
                "`name`), oldest first. A message may carry `createdAt`, its own time in unix "
                "seconds (an imported transcript's), stored as its `createdAt` instead of the "
                "time of the append: a finite number, not negative, not in the future (5 "
                "minutes of clock skew allowed), else `INVALID_MESSAGE`. The archive's order "
                "stays the order of appends."
            ),
        ),
    ]
    run_id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=ID_MAX,
                description="The run these messages belong to.",
            ),
        ]
        | None
    ) = None
    client_batch_id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=ID_MAX,
                description=(
                    "Idempotency key: a retry with the same id returns the first append's result "
                    "instead of appending again."
                ),
            ),
        ]
        | None
    ) = None
    return_context: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Also return the model context after the append (`context`, as from "
                    "`context/get` without a budget or query): append and read the next model "
                    "input in one round trip."
                ),
            ),
        ]
        | None
    ) = False


class ArchiveReadParams(Params):
    session_id: SessionId
    after_id: (
        Annotated[
            int,
            Meta(
                ge=0,
                description="Return messages with an archive id greater than this.",
            ),
        ]
        | None
    ) = 0
    limit: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=READ_LIMIT_MAX,
                description="Most messages to return.",
            ),
        ]
        | None
    ) = 200
    before_id: (
        Annotated[
            int,
            Meta(
                ge=1,
                description=(
                    "Page backwards: return the latest `limit` messages with an archive id smaller"
                    " than this (still oldest first)."
                ),
            ),
        ]
        | None
    ) = None
    max_bytes: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=READ_BYTES_MAX,
                description=(
                    "Most bytes of messages (their stored JSON) in one page; the page ends before "
                    "the message that would pass it, and `nextAfterId` (`nextBeforeId`) says where"
                    " to go on. A single message larger than this still comes alone, so paging "
                    "always moves."
                ),
            ),
        ]
        | None
    ) = READ_BYTES_DEFAULT


class ArchiveSearchParams(Params):
    query: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=QUERY_MAX,
            description=(
                "Words to find: at most 64 terms (each Chinese or Japanese character counts as "
                "one); more are refused with `INVALID_PARAMS`."
            ),
        ),
    ]
    session_id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=ID_MAX,
                description="Id of the session.",
            ),
        ]
        | None
    ) = None
    role: (
        Annotated[
            Literal["system", "user", "assistant", "tool"],
            Meta(
                description="Only messages of this role.",
            ),
        ]
        | None
    ) = None
    limit: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=LIMIT_MAX,
                description="Most hits to return.",
            ),
        ]
        | None
    ) = 20
    offset: (
        Annotated[
            int,
            Meta(
                ge=0,
                le=OFFSET_MAX,
                description="Hits to skip.",
            ),
        ]
        | None
    ) = 0
    advanced: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Pass `query` through as SQLite FTS5 syntax (phrases, NEAR, AND/OR/NOT, "
                    "prefix*); otherwise it is matched as plain words."
                ),
            ),
        ]
        | None
    ) = False
    newest_first: (
        Annotated[
            bool,
            Meta(
                description="Order by time, not rank.",
            ),
        ]
        | None
    ) = False
    since: (
        Annotated[
            float,
            Meta(
                description="Only messages created at or after (unix seconds).",
            ),
        ]
        | None
    ) = None
    until: (
        Annotated[
            float,
            Meta(
                description="Only messages created at or before (unix seconds).",
            ),
        ]
        | None
    ) = None


MESSAGES_APPEND = Method(
    "messages/append",
    MessagesAppendParams,
    "`batchId` (integer), `messageIds` (archive ids, integers, in order), `status` (as from "
    "`context/status`); with `returnContext`, `context` (as from `context/get`).",
    "Appends one batch to the archive and the active context. The batch is stored whole "
    "or not at all. May schedule an automatic compaction. Limits (daemon config): each "
    "message at most `max_message_bytes` of JSON (8 MiB by default), at most "
    "`max_batch_messages` messages (10,000), and the whole request at most "
    "`max_request_bytes` (64 MiB); above them `PAYLOAD_TOO_LARGE` and nothing is stored.",
    (
        _E.SESSION_NOT_FOUND,
        _E.INVALID_MESSAGE,
        _E.PAYLOAD_TOO_LARGE,
        _E.APPROVAL_PENDING,
        _E.NOT_FOUND,
        _E.CONFLICT,
    ),
    True,
    returns=types.AppendResult,
    client="append",
)

ARCHIVE_READ = Method(
    "archive/read",
    ArchiveReadParams,
    "`messages` (each with `id`, `batchId`, `createdAt`, `tokens` and its chat fields), "
    "`nextAfterId` (pass as `afterId` for the next page; null when there is no more). "
    "With `beforeId`: `nextAfterId` is null and `nextBeforeId` (pass as `beforeId` for "
    "the page of older messages; null when there is none) is added. `firstOrdinal`: "
    "the `#N` of the first message (its position in the session, from 1; the others "
    "follow one by one); an empty page has none.",
    "Reads the full archived history in order, whether or not it is still in context, "
    f"one page at a time: at most `limit` messages and `maxBytes` bytes (default "
    f"{READ_BYTES_DEFAULT // (1024 * 1024)} MiB). A message is at most the daemon's "
    "`max_message_bytes` (8 MiB of JSON by default).",
    (_E.SESSION_NOT_FOUND,),
    True,
    returns=types.ArchiveReadResult,
    client="read",
)

ARCHIVE_SEARCH = Method(
    "archive/search",
    ArchiveSearchParams,
    "`hits`: each `messageId`, `sessionId`, `role`, `snippet`, `createdAt`, `score`, "
    "`inActiveContext` (boolean), `ordinal` (the message's `#N`: its position in its "
    "session), and `supersededBy` (the archive id of the statement "
    "now current) when a later statement of the same subject superseded this one; "
    "the newer statement then ranks directly above it. "
    '`matched`: `"all"` when the hits have every word '
    '(or match the advanced query), `"any"` when no message has every word and the '
    "hits are the messages with some of them, best first.",
    "Full-text search of the archive, across all sessions unless `sessionId` is given. "
    "Plain words must all appear in a message (in any order; a quoted chunk is one "
    "word); when no message has them all, the search falls back to messages with any "
    'of them and says so with `matched: "any"`. A search that runs longer than the '
    "daemon's budget is stopped with `SEARCH_TOO_BROAD`; other requests are served "
    "while a search runs.",
    (_E.SESSION_NOT_FOUND, _E.SEARCH_TOO_BROAD),
    False,
    returns=types.ArchiveSearchResult,
    client="search",
)


MESSAGE_METHODS: tuple[Method, ...] = (
    MESSAGES_APPEND,
    ARCHIVE_READ,
    ARCHIVE_SEARCH,
)
