"""The small HTTP client a model summarizer posts with (asyncio streams; http and https)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ctxd.daemon.messages import content_text


class SummarizerError(Exception):
    """The endpoint failed, or answered twice with an unusable summary.

    The message names the endpoint and the cause; it never contains the API key.
    """


# ---------------------------------------------------------------------------- HTTP


@dataclass
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes


class _HTTPError(Exception):
    pass


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(200):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return headers
        key, sep, value = line.decode("latin-1").partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    raise _HTTPError("too many response headers")


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[str, str], max_bytes: int
) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        size_total = 0
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise _HTTPError("the connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await _read_headers(reader)  # trailers
                return b"".join(chunks)
            size_total += size
            if size_total > max_bytes:
                raise _HTTPError(f"the response is larger than {max_bytes} bytes")
            chunks.append(await reader.readexactly(size))
            await reader.readline()
    length = headers.get("content-length")
    if length is not None:
        n = int(length)
        if n > max_bytes:
            raise _HTTPError(f"the response is larger than {max_bytes} bytes")
        return await reader.readexactly(n)
    body = await reader.read(max_bytes + 1)
    while body and len(body) <= max_bytes:
        more = await reader.read(max_bytes + 1 - len(body))
        if not more:
            break
        body += more
    if len(body) > max_bytes:
        raise _HTTPError(f"the response is larger than {max_bytes} bytes")
    return body


async def post_json(
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_bytes: int = 32 * 1024 * 1024,
) -> _Response:
    """One HTTP/1.1 POST of a JSON body; the caller bounds it with a timeout."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise _HTTPError(f"unsupported URL {url!r}: expected http:// or https://")
    host = parts.hostname
    port = parts.port or (443 if scheme == "https" else 80)
    host_header = f"[{host}]" if ":" in host else host
    if parts.port and parts.port != (443 if scheme == "https" else 80):
        host_header += f":{parts.port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = json.dumps(payload, ensure_ascii=False).encode()
    head = {
        "Host": host_header,
        "User-Agent": "ctxd",
        "Content-Type": "application/json",
        "Accept": "application/json",
        # Ask for an unencoded body; gzip and deflate are still decoded below.
        "Accept-Encoding": "identity",
        "Content-Length": str(len(body)),
        "Connection": "close",
        **headers,
    }
    request = f"POST {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
    ctx: ssl.SSLContext | None = None
    if scheme == "https":
        ctx = ssl_context or ssl.create_default_context()
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ctx, server_hostname=host if ctx else None, limit=1 << 20
    )
    try:
        writer.write(request.encode("latin-1") + b"\r\n" + body)
        await writer.drain()
        while True:
            status_line = await reader.readline()
            if not status_line:
                raise _HTTPError("the server closed the connection without answering")
            fields = status_line.decode("latin-1").split(None, 2)
            if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
                raise _HTTPError(f"not an HTTP response: {status_line[:80]!r}")
            status = int(fields[1])
            response_headers = await _read_headers(reader)
            if status >= 200:
                break
            # 100 Continue and other interim responses precede the real one.
        data = b""
        if status not in (204, 304):
            data = await _read_body(reader, response_headers, max_bytes)
        encoding = response_headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            # wbits 47: zlib detects a gzip or zlib header by itself
            data = zlib.decompress(data, 47)
        return _Response(status, response_headers, data)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            # TLS close_notify can hang on a server that already went away.
            await asyncio.wait_for(writer.wait_closed(), 1.0)


def _error_detail(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict):
            err = data.get("error", data.get("detail", data.get("message")))
            if isinstance(err, dict):
                err = err.get("message") or err
            if err:
                text = err if isinstance(err, str) else json.dumps(err)
    return text[:300]


def _redact(text: str, key: str) -> str:
    if key and len(key) >= 4:
        text = text.replace(key, "[redacted]")
    return text


def _read_choice(body: bytes, endpoint: str, key: str) -> tuple[str, str | None]:
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        content = content_text(message.get("content"), mark_other_parts=True)
        return content, choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        snippet = _redact(body[:200].decode("utf-8", "replace"), key)
        raise SummarizerError(
            f"{endpoint}: not a chat completion response: {snippet!r}"
        ) from None
