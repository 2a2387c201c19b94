"""Checking a request's params against the protocol table.

Everything here runs on every request, so per-method work is precomputed into plain
dicts of checker functions; a call does one dict lookup per parameter.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxd.protocol.declare import Method, Param
from ctxd.protocol.errors import InvalidParams, MethodNotFound

_Checker = Callable[[Any], Any]

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


def _fail(method: str, param: str, expected: str, value: Any) -> InvalidParams:
    return InvalidParams(
        f"{method}: parameter '{param}' must be {expected}, got {_type_name(value)}"
        + (f" {_preview(value)}" if isinstance(value, int | float | str) else ""),
        {"param": param},
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _make_checker(method: str, p: Param) -> _Checker:
    """Build one parameter's checker: returns the (possibly normalised) value or raises."""
    name, lo, hi, choices = p.name, p.min, p.max, p.choices

    def out_of_range(value: Any, size: float, unit: str) -> InvalidParams:
        if lo is not None and hi is not None:
            want = f"between {_num(lo)} and {_num(hi)}{unit}"
        elif lo is not None:
            want = f"at least {_num(lo)}{unit}"
        else:
            want = f"at most {_num(hi)}{unit}"
        what = f"{_num(size)}{unit}" if unit else _preview(value)
        return InvalidParams(
            f"{method}: parameter '{name}' must be {want}, got {what}", {"param": name}
        )

    def bounded(value: Any, size: float, unit: str) -> Any:
        if (lo is not None and size < lo) or (hi is not None and size > hi):
            raise out_of_range(value, size, unit)
        return value

    def among(value: Any) -> Any:
        if choices is not None and value not in choices:
            raise InvalidParams(
                f"{method}: parameter '{name}' must be one of "
                f"{', '.join(repr(c) for c in choices)}, got {_preview(value)}",
                {"param": name, "choices": list(choices)},
            )
        return value

    if p.type == "string":
        unit = " characters"

        def check(value: Any) -> Any:
            if type(value) is not str:
                raise _fail(method, name, "a string", value)
            bounded(value, len(value), unit)
            if not value.isascii():
                try:  # a lone surrogate (JSON "\ud800") is not text SQLite can store
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidParams(
                        f"{method}: parameter {name!r} contains a lone surrogate; "
                        "send valid Unicode text",
                        {"param": name},
                    ) from None
            return among(value)

    elif p.type == "integer":

        def check(value: Any) -> Any:
            # `type(...) is int` refuses bool (a subclass of int) without a second test.
            if type(value) is not int:
                # Some encoders cannot tell 5 from 5.0; an integral float is accepted.
                if type(value) is float and value.is_integer():
                    value = int(value)
                else:
                    raise _fail(method, name, "an integer", value)
            bounded(value, value, "")
            return among(value)

    elif p.type == "number":

        def check(value: Any) -> Any:
            if type(value) is not int and type(value) is not float:
                raise _fail(method, name, "a number", value)
            if not math.isfinite(value):
                raise _fail(method, name, "a finite number", value)
            bounded(value, value, "")
            return among(value)

    elif p.type == "boolean":

        def check(value: Any) -> Any:
            if type(value) is not bool:
                raise _fail(method, name, "a boolean (true or false)", value)
            return value

    elif p.type == "object":

        def check(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _fail(method, name, "an object", value)
            return value

    elif p.type == "array":
        unit = " items"

        def check(value: Any) -> Any:
            # msgpack decoders may hand back tuples for arrays; both are arrays on the wire.
            if not isinstance(value, list | tuple):
                raise _fail(method, name, "an array", value)
            return bounded(value, len(value), unit)

    else:  # "any"

        def check(value: Any) -> Any:
            return value

    return check


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True, slots=True)
class _Compiled:
    checkers: dict[str, _Checker]
    required: tuple[str, ...]
    defaults: dict[str, Any]


def _compile(method: Method) -> _Compiled:
    return _Compiled(
        checkers={p.name: _make_checker(method.name, p) for p in method.params},
        required=tuple(p.name for p in method.params if p.required),
        # Every declared parameter is present in the result, so handlers can index it.
        defaults={p.name: p.default for p in method.params},
    )


def make_validator(methods: dict[str, Method]) -> Callable[[str, Any], dict[str, Any]]:
    """The `validate_params` of one table: its checkers compiled once, here."""
    compiled = {name: _compile(m) for name, m in methods.items()}

    def validate_params(method: str, params: Any) -> dict[str, Any]:
        """Check `params` against `method`'s table and return a new dict of them.

        The result holds every declared parameter: absent optional ones (and optional ones
        sent as null) get their default, None when they have none. Raises `MethodNotFound`
        for an unknown method and `InvalidParams` naming the parameter for anything else.
        """
        spec = compiled.get(method)
        if spec is None:
            raise _unknown_method(methods, method)
        if type(params) is not dict:
            if params is None or (isinstance(params, list | tuple) and not params):
                # `[]` is how Lua's empty table and some clients spell "no params"
                params = {}
            elif isinstance(params, list | tuple):
                names = ", ".join(methods[method].param_names) or "none"
                raise InvalidParams(
                    f"{method}: params must be an object of named parameters, not a "
                    "positional array (by-position params are not supported); "
                    f"parameters: {names}"
                )
            elif not isinstance(params, dict):
                raise InvalidParams(f"{method}: params must be an object, got {_type_name(params)}")
        out = spec.defaults.copy()
        checkers = spec.checkers
        for key, value in params.items():
            check = checkers.get(key)
            if check is None:
                raise _unknown_param(methods[method], key)
            if value is not None:
                out[key] = check(value)
        for key in spec.required:
            if out[key] is None:
                p = methods[method].param(key)
                got = ", got null" if key in params else ""
                raise InvalidParams(
                    f"{method}: missing required parameter '{key}' "
                    f"({_TYPE_WORDS.get(p.type, p.type)}){got}",
                    {"param": key},
                )
        return out

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
