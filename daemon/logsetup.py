"""The daemon's log: where it goes, how large it may grow, and who may read it.

A local process without the token can make the daemon refuse it as fast as it can
connect, and every refusal is worth a log line. So repeated lines are rate-limited per
message template (`RateLimitFilter`), a log file is rotated at `log_max_bytes` keeping
`log_backups` old files, and every log file is created 0600: it names sessions, peers
and paths, which are nobody else's business.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time
from pathlib import Path
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# per message template: this many lines per window, then one summary
RATE_BURST = 20
RATE_WINDOW_SECONDS = 10.0
_MAX_TEMPLATES = 1000


class RateLimitFilter(logging.Filter):
    """Lets through at most `burst` records of one template (logger and unformatted
    message) per `window` seconds; the next record after a window with suppressed ones
    says how many were dropped. CRITICAL records always pass."""

    def __init__(self, burst: int = RATE_BURST, window: float = RATE_WINDOW_SECONDS) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        # template -> [window start, records let through, records suppressed]
        self._seen: dict[tuple[str, str], list[Any]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL:
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        state = self._seen.get(key)
        if state is None or now - state[0] >= self.window:
            suppressed = state[2] if state is not None else 0
            if len(self._seen) >= _MAX_TEMPLATES:
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if suppressed:
                record.msg = (
                    f"{record.msg} ({suppressed} more like this were not logged in the "
                    f"last {self.window:.0f} s)"
                )
            return True
        if state[1] < self.burst:
            state[1] += 1
            return True
        state[2] += 1
        return False


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log file created 0600 (an existing file is made 0600 too). With
    `capture_stderr`, the process's stdout and stderr follow the current file, so
    tracebacks and C-level messages land in the log and rotate with it."""

    def __init__(
        self, path: Path, max_bytes: int, backups: int, capture_stderr: bool = False
    ) -> None:
        self.capture_stderr = capture_stderr
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        stream = open(fd, "a", encoding=self.encoding, errors=self.errors)  # noqa: SIM115
        if self.capture_stderr:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        return stream


def configure_logging(
    log_file: Path | None = None,
    max_bytes: int = 10 * 1024 * 1024,
    backups: int = 3,
    level: str | None = None,
) -> logging.Handler:
    """Send the daemon's log to `log_file` (rotated, 0600, with stdout and stderr) or to
    stderr; repeated lines are rate-limited either way."""
    handler: logging.Handler
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handler = PrivateRotatingFileHandler(log_file, max_bytes, backups, capture_stderr=True)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RateLimitFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or os.environ.get("CTXD_LOG_LEVEL", "INFO")).upper())
    return handler
