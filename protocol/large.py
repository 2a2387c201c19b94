"""Large results encoded beside the event loop, in the bytes the wires would send.

One encoder call on a 40 MB context holds the GIL from start to end (0.1-0.3 s): in a
worker thread it would stall the event loop just the same. `encode_sliced` walks the
result and encodes it in small pieces, so a worker thread lets the loop run between
them. The daemon hands the wire the bytes as a `msgspec.Raw`: the JSON encoder
(`codec.dumps_json`) inserts it as it is, and so does `pack_reply` on ZeroMQ.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec

from ctxd.protocol.codec import dumps_json, packb

_encode_msgpack = msgspec.msgpack.Encoder().encode

# strings longer than this are JSON-encoded in slices
_SLICE = 1 << 18
# the wires that carry JSON, and the one that carries msgpack
JSON_WIRES = frozenset({"jsonrpc-tcp", "websocket"})
MSGPACK_WIRES = frozenset({"zmq"})


def _json(obj: Any, out: list[bytes]) -> None:
    if isinstance(obj, msgspec.Struct):
        # its wire form: camelCase keys, the fields it omits left out
        obj = msgspec.to_builtins(obj)
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        out.append(b"{")
        for i, (key, value) in enumerate(obj.items()):
            if i:
                out.append(b",")
            out.append(dumps_json(key) + b":")
            _json(value, out)
        out.append(b"}")
    elif isinstance(obj, list | tuple):
        out.append(b"[")
        for i, item in enumerate(obj):
            if i:
                out.append(b",")
            _json(item, out)
        out.append(b"]")
    elif isinstance(obj, str) and len(obj) > _SLICE:
        # JSON escapes each character on its own: the slices join to the same text
        out.append(b'"')
        for i in range(0, len(obj), _SLICE):
            out.append(dumps_json(obj[i : i + _SLICE])[1:-1])
        out.append(b'"')
    else:
        out.append(dumps_json(obj))


def _pack(obj: Any, packer: msgpack.Packer, out: list[bytes]) -> None:
    if isinstance(obj, msgspec.Struct):
        obj = msgspec.to_builtins(obj)
    if isinstance(obj, dict):
        out.append(packer.pack_map_header(len(obj)))
        for key, value in obj.items():
            out.append(packer.pack(key))
            _pack(value, packer, out)
    elif isinstance(obj, list | tuple):
        out.append(packer.pack_array_header(len(obj)))
        for item in obj:
            _pack(item, packer, out)
    else:
        out.append(packer.pack(obj))


def encode_sliced(obj: Any, wire: str) -> msgspec.Raw:
    """`obj` as the wire's encoder would encode it (`codec.dumps_json`, `codec.packb`),
    piece by piece: for a worker thread."""
    out: list[bytes] = []
    if wire in MSGPACK_WIRES:
        _pack(obj, msgpack.Packer(use_bin_type=True), out)
    else:
        _json(obj, out)
    return msgspec.Raw(b"".join(out))


def pack_reply(req_id: Any, result: Any) -> bytes:
    """`packb({"id": req_id, "result": result})`; a result packed beforehand (a
    `msgspec.Raw` from `encode_sliced`) goes in as it is, and so does a result Struct
    encoded by msgspec (the same bytes msgpack writes for its wire form, without
    building that form first)."""
    if isinstance(result, msgspec.Struct):
        try:
            return _encode_msgpack({"id": req_id, "result": result})
        except (TypeError, ValueError):  # an id only msgpack knows (an extension type)
            result = msgspec.Raw(_encode_msgpack(result))
    if isinstance(result, msgspec.Raw):
        # a map of two entries (0x82), in the order packb writes them
        return b"".join([b"\x82", packb("id"), packb(req_id), packb("result"), result])
    return packb({"id": req_id, "result": result})
