"""Protocol table entries: the notifications (events) the daemon sends.

Read through `ctxd.protocol.methods.NOTIFICATIONS`.
"""

from __future__ import annotations

from ctxd.protocol.declare import Notification

NOTIFICATION_LIST: tuple[Notification, ...] = (
    Notification(
        "session/didAppend",
        "`sessionId`, `batchId`, `messageIds`, `runId` (or null).",
        "A batch was appended to the session.",
    ),
    Notification(
        "context/didCompact",
        "`sessionId`, the members of the `context/compact` result (`effective`, "
        "`compactionId`, `before` and `after` (`{messages, tokens}`), `trigger` (`auto`, "
        "`manual` or `rebuild`)...), `status` (as from `context/status`).",
        "A compaction or rebuild changed the active context.",
    ),
    Notification(
        "context/didChange",
        "`sessionId`, `change` (`clear` or `pop`), `messageIds` (the messages taken out), "
        "`status` (as from `context/status`).",
        "A client cleared the active context or popped messages from it.",
    ),
    Notification(
        "context/compactionFailed",
        "`sessionId`, `trigger` (`auto`, `manual` or `rebuild`), `compactionId` (the "
        "attempt's, as `$/progress` named it), `error` (`{code, message}`).",
        "A compaction attempt failed; the context is unchanged.",
    ),
    Notification(
        "approval/didRequest",
        "`sessionId`, `approval` (as from `approval/resolve`; `arguments` longer than 2048 "
        "characters are cut, with `argumentsTruncated: true`: `approval/list` has them whole).",
        "A tool call waits for a human decision.",
    ),
    Notification(
        "approval/didResolve",
        "`sessionId`, `approval` (as in `approval/didRequest`).",
        "A tool call was approved or denied.",
    ),
    Notification(
        "run/didStart",
        "`sessionId`, `runId`, `run` (the run object).",
        "A run started.",
    ),
    Notification(
        "run/didFinish",
        "`sessionId`, `run` (as from `run/finish`), `autoCompactionScheduled`.",
        "A run finished (or was marked interrupted when its connection closed).",
    ),
    Notification(
        "session/didMissEvents",
        "`sessionId`, `missed` (how many of the session's events this connection did not get).",
        "The connection stopped reading its output and the daemon dropped events rather than "
        "queue them; sent once it reads again, before any later event of the session. "
        "Re-read what you show (`context/status`, `archive/read`).",
    ),
    Notification(
        "$/progress",
        '`token` (string, one per operation), `sessionId`, `value`: `{kind: "begin" | '
        '"report" | "end", title?, message?, percentage? (0-100)}`.',
        "Progress of a compaction or rebuild, as in LSP: one `begin`, any `report`s, one `end`.",
    ),
)
