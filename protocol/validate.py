"""Params converted into each method's Struct, with the error texts clients read.

A well-formed request takes one pass over its values (null means absent; text must be
valid Unicode) and one `msgspec.convert` into the method's params Struct, whose types
hold the bounds, the choices and the refusal of unknown fields. Whatever that refuses,
and what it cannot judge alone (integral floats for integers, lone surrogates, non-finite
numbers), goes through `_explain`, which names the parameter the way clients have always
been told (`data.param`, did-you-mean, the bound broken).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.protocol.declare import Field, Method, Params
from ctxd.protocol.errors import InvalidParams, MethodNotFound

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _fail(method: str, param: str, expected: str, value: Any) -> InvalidParams:
    return InvalidParams(
        f"{method}: parameter '{param}' must be {expected}, got {_type_name(value)}"
        + (f" {_preview(value)}" if isinstance(value, int | float | str) else ""),
        {"param": param},
    )


def _bounded(method: str, f: Field, value: Any, size: float, unit: str) -> None:
    lo, hi = f.min, f.max
    if (lo is None or size >= lo) and (hi is None or size <= hi):
        return
    if lo is not None and hi is not None:
        want = f"between {_num(lo)} and {_num(hi)}{unit}"
    elif lo is not None:
        want = f"at least {_num(lo)}{unit}"
    else:
        want = f"at most {_num(hi)}{unit}"  # type: ignore[arg-type]
    what = f"{_num(size)}{unit}" if unit else _preview(value)
    raise InvalidParams(
        f"{method}: parameter '{f.name}' must be {want}, got {what}", {"param": f.name}
    )


def _check(method: str, f: Field, value: Any) -> Any:
    """One value against its field: the (possibly normalised) value, or the error."""
    kind = f.type
    if kind == "string":
        if type(value) is not str:
            raise _fail(method, f.name, "a string", value)
        _bounded(method, f, value, len(value), " characters")
        if not value.isascii():
            try:  # a lone surrogate (JSON "\ud800") is not text SQLite can store
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidParams(
                    f"{method}: parameter {f.name!r} contains a lone surrogate; "
                    "send valid Unicode text",
                    {"param": f.name},
                ) from None
    elif kind == "integer":
        # `type(...) is int` refuses bool (a subclass of int) without a second test.
        if type(value) is not int:
            # Some encoders cannot tell 5 from 5.0; an integral float is accepted.
            if type(value) is float and value.is_integer():
                value = int(value)
            else:
                raise _fail(method, f.name, "an integer", value)
        _bounded(method, f, value, value, "")
    elif kind == "number":
        if type(value) is not int and type(value) is not float:
            raise _fail(method, f.name, "a number", value)
        if not math.isfinite(value):
            raise _fail(method, f.name, "a finite number", value)
        _bounded(method, f, value, value, "")
    elif kind == "boolean":
        if type(value) is not bool:
            raise _fail(method, f.name, "a boolean (true or false)", value)
        return value
    elif kind == "object":
        if not isinstance(value, dict):
            raise _fail(method, f.name, "an object", value)
        return value
    elif kind == "array":
        # msgpack decoders may hand back tuples for arrays; both are arrays on the wire.
        if not isinstance(value, list | tuple):
            raise _fail(method, f.name, "an array", value)
        _bounded(method, f, value, len(value), " items")
        return list(value)
    else:
        return value
    if f.choices is not None and value not in f.choices:
        raise InvalidParams(
            f"{method}: parameter '{f.name}' must be one of "
            f"{', '.join(repr(c) for c in f.choices)}, got {_preview(value)}",
            {"param": f.name, "choices": list(f.choices)},
        )
    return value


def _explain(m: Method, params: dict[str, Any]) -> Params:
    """The slow path: every parameter checked one by one, for the exact error."""
    by_name = {f.name: f for f in m.fields}
    clean: dict[str, Any] = {}
    for key, value in params.items():
        f = by_name.get(key)
        if f is None:
            raise _unknown_param(m, key)
        if value is not None:  # null counts as absent
            clean[key] = _check(m.name, f, value)
    for f in m.fields:
        if f.required and f.name not in clean:
            got = ", got null" if f.name in params else ""
            raise InvalidParams(
                f"{m.name}: missing required parameter '{f.name}' "
                f"({_TYPE_WORDS.get(f.type, f.type)}){got}",
                {"param": f.name},
            )
    try:
        return msgspec.convert(clean, m.params)
    except msgspec.ValidationError as e:  # a shape the checks above do not name
        raise InvalidParams(f"{m.name}: {e}") from None



def make_validator(methods: dict[str, Method]) -> Callable[[str, Any], Params]:
    """The `validate_params` of one table."""
    convert = msgspec.convert
    error = msgspec.ValidationError
    known = {name: frozenset(m.param_names) for name, m in methods.items()}

    def validate_params(method: str, params: Any) -> Params:
        """Check `params` against `method`'s table and return its params Struct.

        Absent optional params (and optional ones sent as null) get their default, None
        when they have none. Raises `MethodNotFound` for an unknown method and
        `InvalidParams` naming the parameter for anything else.
        """
        m = methods.get(method)
        if m is None:
            raise _unknown_method(methods, method)
        if type(params) is not dict:
            if params is None or (isinstance(params, list | tuple) and not params):
                # `[]` is how Lua's empty table and some clients spell "no params"
                params = {}
            elif isinstance(params, list | tuple):
                names = ", ".join(m.param_names) or "none"
                raise InvalidParams(
                    f"{method}: params must be an object of named parameters, not a "
                    "positional array (by-position params are not supported); "
                    f"parameters: {names}"
                )
            elif not isinstance(params, dict):
                raise InvalidParams(f"{method}: params must be an object, got {_type_name(params)}")
        given = params
        for value in params.values():
            # what the Struct cannot judge alone: checked here, or left to the slow path
            kind = type(value)
            if kind is str:
                if not value.isascii():
                    try:  # a lone surrogate (JSON "\ud800") is not text SQLite can store
                        value.encode("utf-8")
                    except UnicodeEncodeError:
                        return _explain(m, params)
            elif value is None:
                if given is params:  # null counts as absent: the field's default
                    given = {k: v for k, v in params.items() if v is not None}
            elif (kind is float and not math.isfinite(value)) or kind is tuple:
                return _explain(m, params)
        if given is not params and not known[method].issuperset(params):
            return _explain(m, params)  # an unknown param sent as null is still unknown
        try:
            return convert(given, m.params)  # type: ignore[no-any-return]
        except error:
            # an integral float for an integer is accepted there; the rest is explained
            return _explain(m, params)

    return validate_params


def _unknown_method(methods: dict[str, Method], method: Any) -> MethodNotFound:
    name = method if isinstance(method, str) else repr(method)
    close = difflib.get_close_matches(name, list(methods), n=1) if isinstance(method, str) else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return MethodNotFound(
        f"unknown method '{name}'{hint}; the methods are listed in docs/protocol.md "
        "and in ctxd.protocol.methods.METHODS, and error.data.known has their names",
        {"method": name, "known": list(methods)},
    )


def _unknown_param(method: Method, key: Any) -> InvalidParams:
    names = method.param_names
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    accepted = ", ".join(names) if names else "none"
    return InvalidParams(
        f"{method.name}: unknown parameter '{key}'; {hint}accepted parameters: {accepted}",
        {"param": str(key)},
    )
