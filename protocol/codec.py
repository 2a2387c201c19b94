"""Byte codecs of the two wires: JSON-RPC 2.0 (Content-Length framed or one per
WebSocket text frame) and msgpack maps over ZeroMQ. Both carry the same messages.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgpack
import msgspec

from ctxd.protocol.envelope import check_request as check_request  # re-exported: the wires use it
from ctxd.protocol.envelope import error_reply, reply
from ctxd.protocol.errors import ParseError, PayloadTooLarge

# Requests bigger than this are refused before parsing (configurable by the daemon).
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
_HEADER_LIMIT = 8192
# an HTTP header name (RFC 9110 token): "POST http://host:1/ HTTP/1.1" is not one
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


# msgspec does the common case several times faster than the json module and msgpack (a
# context of 80 messages: 0.1 ms instead of 1.1 ms to encode as JSON, 0.3 ms instead of
# 1.2 ms to decode); whatever it refuses goes through those, so what fails, fails with
# the same message as ever.
_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.Decoder().decode


def _ext_elsewhere(code: int, data: memoryview) -> Any:
    raise ValueError("an extension type: decoded by msgpack")


_decode_msgpack = msgspec.msgpack.Decoder(ext_hook=_ext_elsewhere).decode
# msgpack's timestamp extension (type -1), which msgspec would decode as a datetime
_TIMESTAMPS = (b"\xd6\xff", b"\xd7\xff", b"\xc7\x0c\xff")


def dumps_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON; Chinese stays one character, not a six-byte escape. NaN and
    Infinity are not JSON (browsers' JSON.parse refuses them): they go out as null."""
    try:
        return _encode_json(obj)
    except Exception:
        pass
    return json.dumps(
        obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_struct_fields
    ).encode("utf-8")


def _struct_fields(obj: Any) -> Any:
    """A result or event Struct (protocol/types.py) as the builtins of its wire form (its
    camelCase keys), for the encoders that do not know Structs; anything else is refused
    as those encoders refuse it."""
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_json(data: bytes | str) -> Any:
    try:
        return _decode_json(data)
    except Exception:
        pass  # the json module decides, and words the error
    try:
        return json.loads(data, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"invalid JSON: {exc}; send one JSON-RPC object per frame") from None
    except RecursionError:
        raise ParseError("JSON nested too deeply; flatten the request") from None


def frame(body: bytes) -> bytes:
    """Content-Length framing as in LSP."""
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class FrameReader:
    """Incremental Content-Length frame parser: feed bytes, take complete bodies.

    Raises `ParseError` for a broken header (the stream cannot be resynchronised, so
    the caller closes the connection) and `PayloadTooLarge` for a frame above the limit.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._need: int | None = None

    def feed(self, data: bytes, max_bodies: int | None = None) -> list[bytes]:
        """Complete bodies so far; with `max_bodies`, at most that many (the rest of the
        bytes stay buffered until the next call)."""
        self._buf += data
        out: list[bytes] = []
        while max_bodies is None or len(out) < max_bodies:
            if self._need is None:
                # only the first _HEADER_LIMIT bytes may hold the header, whether it came
                # in one read or in many
                end = self._buf.find(b"\r\n\r\n", 0, _HEADER_LIMIT + 4)
                if end < 0:
                    if len(self._buf) > _HEADER_LIMIT:
                        raise ParseError("frame header too long; expected 'Content-Length: N'")
                    return out
                self._need = self._parse_header(bytes(self._buf[:end]))
                del self._buf[: end + 4]
            if len(self._buf) < self._need:
                return out
            out.append(bytes(self._buf[: self._need]))
            del self._buf[: self._need]
            self._need = None
        return out

    def _parse_header(self, header: bytes) -> int:
        length: int | None = None
        for line in header.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.fullmatch(name):
                raise ParseError(f"malformed header line {line[:80]!r}; expected 'Name: value'")
            if name.strip().lower() == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    raise ParseError("Content-Length is not a number") from None
        if length is None or length < 0:
            raise ParseError("missing Content-Length header")
        if length > self.max_frame:
            raise PayloadTooLarge(
                f"frame of {length} bytes exceeds the limit of {self.max_frame}; "
                "send smaller batches"
            )
        return length


def packb(obj: Any) -> bytes:
    # not msgspec: it would also encode sets, dates and the like, which msgpack refuses
    # (a reply holding one is a bug the client must hear about, on every wire alike)
    return msgpack.packb(obj, use_bin_type=True, default=_struct_fields)  # type: ignore[no-any-return]


def unpackb(data: bytes, max_size: int = DEFAULT_MAX_FRAME) -> Any:
    if len(data) > max_size:
        raise PayloadTooLarge(f"message of {len(data)} bytes exceeds the limit of {max_size}")
    # 0xff (the timestamp's type byte) never occurs in UTF-8 text: one memchr usually
    # settles it
    if b"\xff" not in data or not any(mark in data for mark in _TIMESTAMPS):
        try:
            return _decode_msgpack(data)
        except Exception:
            pass  # msgpack decides, and names the error
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ParseError(f"invalid msgpack: {type(exc).__name__}") from None


# JSON-RPC 2.0 message shapes


def request(id_: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


# replies and request checking are the envelope's, shared with the ZeroMQ wire
response = reply
error_response = error_reply
