"""The protocol table: the method contract, params validation and the generated docs."""

from __future__ import annotations

import timeit
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxd.protocol import gen_docs
from ctxd.protocol.errors import ErrorCode, InvalidParams, MethodNotFound
from ctxd.protocol.methods import (
    COMMON_ERRORS,
    ERROR_DOCS,
    METHODS,
    NOTIFICATIONS,
    PROTOCOL_VERSION,
    SERVER_NAME,
    TYPES,
    validate_params,
)

# The contract other clients are written against: method -> param names, in order.
EXPECTED: dict[str, tuple[str, ...]] = {
    "initialize": ("token", "clientName", "nonce", "proof", "pageLogin", "pageKey"),
    "session/create": ("sessionId", "title", "metadata", "createdAt"),
    "session/list": ("limit", "cursor", "title"),
    "session/get": ("sessionId",),
    "session/subscribe": ("sessionId",),
    "session/unsubscribe": ("sessionId",),
    "messages/append": ("sessionId", "messages", "runId", "clientBatchId", "returnContext"),
    "archive/read": ("sessionId", "afterId", "limit", "beforeId", "maxBytes"),
    "archive/search": (
        "query",
        "sessionId",
        "role",
        "limit",
        "offset",
        "advanced",
        "newestFirst",
        "since",
        "until",
    ),
    "context/get": ("sessionId", "format", "budgetTokens", "query", "includeMetadata"),
    "context/clear": ("sessionId",),
    "context/pop": ("sessionId", "count"),
    "context/status": ("sessionId",),
    "context/compact": ("sessionId", "force", "instructions"),
    "context/rebuild": ("sessionId", "dryRun"),
    "context/explain": ("sessionId",),
    "context/compactions": ("sessionId", "limit"),
    "context/pins/add": ("sessionId", "text"),
    "context/pins/list": ("sessionId",),
    "context/pins/remove": ("sessionId", "pinId"),
    "run/start": ("sessionId",),
    "run/finish": ("runId", "outcome", "messages", "clientBatchId", "returnContext"),
    "approval/request": ("sessionId", "runId", "toolCallId", "toolName", "arguments"),
    "approval/resolve": ("approvalId", "decision", "reason"),
    "approval/list": ("sessionId", "status"),
    "tools/list": (),
    "tools/call": ("sessionId", "name", "arguments"),
    "heartbeat": (),
    "shutdown": (),
}

REQUIRED: dict[str, set[str]] = {
    # `token`, or `nonce` with `proof`, or the web page's `pageLogin` or `pageKey`
    "initialize": set(),
    "session/list": set(),
    "session/create": set(),
    "messages/append": {"sessionId", "messages"},
    "archive/search": {"query"},
    "run/finish": {"runId", "outcome"},
    "approval/request": {"sessionId", "runId", "toolCallId"},
    "approval/resolve": {"approvalId", "decision"},
    "tools/call": {"sessionId", "name", "arguments"},
    "tools/list": set(),
    "heartbeat": set(),
    "shutdown": set(),
}

EXPECTED_NOTIFICATIONS = {
    "session/didAppend",
    "context/didCompact",
    "context/didChange",
    "context/compactionFailed",
    "approval/didRequest",
    "approval/didResolve",
    "run/didStart",
    "run/didFinish",
    "session/didMissEvents",
    "$/progress",
}

# One valid call of every method, with every param set.
GOOD: dict[str, dict[str, Any]] = {
    "initialize": {"token": "t" * 32, "clientName": "cli", "nonce": "n" * 32, "proof": "0" * 64,
                   "pageLogin": "1.n.m", "pageKey": "k" * 43},
    "session/create": {"sessionId": "s1", "title": "T", "metadata": {"k": [1]},
                       "createdAt": 1_700_000_000.5},
    "session/list": {"limit": 10, "cursor": "abc", "title": "demo"},
    "session/get": {"sessionId": "s1"},
    "session/subscribe": {"sessionId": "s1"},
    "session/unsubscribe": {"sessionId": "s1"},
    "messages/append": {
        "sessionId": "s1",
        "messages": [{"role": "user", "content": "你好"}],
        "runId": "r1",
        "clientBatchId": "b1",
        "returnContext": True,
    },
    "archive/read": {"sessionId": "s1", "afterId": 0, "limit": 5000, "beforeId": 9,
                     "maxBytes": 1024},
    "archive/search": {
        "query": "deploy",
        "sessionId": "s1",
        "role": "tool",
        "limit": 1000,
        "offset": 0,
        "advanced": True,
        "newestFirst": False,
        "since": 1_700_000_000,
        "until": 1_800_000_000.5,
    },
    "context/get": {
        "sessionId": "s1",
        "format": "openai",
        "budgetTokens": 500,
        "query": "q",
        "includeMetadata": True,
    },
    "context/clear": {"sessionId": "s1"},
    "context/pop": {"sessionId": "s1", "count": 2},
    "context/status": {"sessionId": "s1"},
    "context/compact": {"sessionId": "s1", "force": True, "instructions": "keep paths"},
    "context/rebuild": {"sessionId": "s1", "dryRun": True},
    "context/explain": {"sessionId": "s1"},
    "context/compactions": {"sessionId": "s1", "limit": 10},
    "context/pins/add": {"sessionId": "s1", "text": "x" * 65536},
    "context/pins/list": {"sessionId": "s1"},
    "context/pins/remove": {"sessionId": "s1", "pinId": "p1"},
    "run/start": {"sessionId": "s1"},
    "run/finish": {
        "runId": "r1",
        "outcome": "cancelled",
        "messages": [{"role": "assistant", "content": "done"}],
        "clientBatchId": "b2",
        "returnContext": True,
    },
    "approval/request": {
        "sessionId": "s1",
        "runId": "r1",
        "toolCallId": "call_1",
        "toolName": "shell",
        "arguments": '{"cmd": "ls"}',
    },
    "approval/resolve": {"approvalId": "a1", "decision": "denied", "reason": "no"},
    "approval/list": {"sessionId": "s1", "status": "pending"},
    "tools/list": {},
    "tools/call": {"sessionId": "s1", "name": "search_past_messages", "arguments": {}},
    "heartbeat": {},
    "shutdown": {},
}


def wire(params: msgspec.Struct) -> dict[str, Any]:
    """A params Struct as the dict of camelCase names the wire carries."""
    return msgspec.to_builtins(params)  # type: ignore[no-any-return]


def invalid(method: str, params: Any) -> InvalidParams:
    with pytest.raises(InvalidParams) as info:
        validate_params(method, params)
    assert info.value.code == ErrorCode.INVALID_PARAMS
    return info.value


# The contract


def test_exact_method_set_and_param_names() -> None:
    assert set(METHODS) == set(EXPECTED)
    for name, params in EXPECTED.items():
        assert METHODS[name].name == name
        assert METHODS[name].param_names == params, name


def test_required_params() -> None:
    for name, required in REQUIRED.items():
        assert {p.name for p in METHODS[name].fields if p.required} == required, name
    # every other method takes sessionId (and for context/pins/* more) as required
    for name, m in METHODS.items():
        if name not in REQUIRED and "sessionId" in m.param_names:
            assert m.param("sessionId").required, name


def test_needs_session_means_a_required_session_id() -> None:
    for m in METHODS.values():
        has = "sessionId" in m.param_names and m.param("sessionId").required
        assert m.needs_session == has, m.name


def test_table_entries_are_well_formed() -> None:
    for m in METHODS.values():
        assert m.doc and m.result
        assert len(set(m.param_names)) == len(m.fields)
        assert all(isinstance(c, ErrorCode) for c in m.errors)
        for p in m.fields:
            assert p.type in TYPES
            assert p.doc
            assert p.name[0].islower() and "_" not in p.name  # camelCase
            if p.default is not None and p.choices is not None:
                assert p.default in p.choices


def test_bounds() -> None:
    for m in METHODS.values():
        for p in m.fields:
            if p.name == "limit":
                assert p.min == 1
                assert p.max == (5000 if m.name == "archive/read" else 1000)
            if p.name.endswith("Id") and p.type == "string":
                assert (p.min, p.max) == (1, 200), (m.name, p.name)
    assert METHODS["context/pins/add"].param("text").max == 64 * 1024
    assert METHODS["context/compact"].param("instructions").max == 16 * 1024
    assert METHODS["archive/search"].param("query").max == 4 * 1024


def test_notifications() -> None:
    assert set(NOTIFICATIONS) == EXPECTED_NOTIFICATIONS
    for name, n in NOTIFICATIONS.items():
        assert n.name == name and n.doc and n.params_doc
        assert "sessionId" in n.params_doc  # PUB subscribers filter on it
    progress = NOTIFICATIONS["$/progress"].params_doc
    for word in ("token", "value", "begin", "report", "end", "percentage"):
        assert word in progress


def test_constants() -> None:
    assert PROTOCOL_VERSION == "1.0"
    assert SERVER_NAME == "ctxd"


# validate_params: accepting


@pytest.mark.parametrize("method", sorted(GOOD))
def test_good_params_pass_unchanged(method: str) -> None:
    out = validate_params(method, GOOD[method])
    assert isinstance(out, METHODS[method].params)
    assert wire(out) == GOOD[method]


def test_defaults_are_filled() -> None:
    out = wire(validate_params("archive/search", {"query": "x"}))
    assert out == {
        "query": "x",
        "sessionId": None,
        "role": None,
        "limit": 20,
        "offset": 0,
        "advanced": False,
        "newestFirst": False,
        "since": None,
        "until": None,
    }
    assert wire(validate_params("archive/read", {"sessionId": "s"})) == {
        "sessionId": "s",
        "afterId": 0,
        "limit": 200,
        "beforeId": None,
        "maxBytes": 8 * 1024 * 1024,
    }
    assert validate_params("context/get", {"sessionId": "s"}).format == "openai"
    assert validate_params("context/compact", {"sessionId": "s"}).force is False
    assert validate_params("session/list", {}).limit == 50


def test_null_or_missing_params_object() -> None:
    assert wire(validate_params("tools/list", None)) == {}
    assert wire(validate_params("shutdown", {})) == {}
    assert wire(validate_params("shutdown", [])) == {}


def test_null_optional_means_default() -> None:
    out = validate_params("archive/read", {"sessionId": "s", "limit": None})
    assert out.limit == 200


def test_integral_float_becomes_int() -> None:
    out = validate_params("archive/read", {"sessionId": "s", "limit": 7.0})
    assert out.limit == 7 and type(out.limit) is int


def test_tuple_array_accepted() -> None:
    # msgpack can decode arrays as tuples
    out = validate_params("messages/append", {"sessionId": "s", "messages": ({"role": "user"},)})
    assert out.messages == [{"role": "user"}]


def test_what_the_struct_cannot_judge_alone() -> None:
    # checked before the conversion: null is absent, text is valid Unicode
    out = validate_params("session/create", {"title": "标题", "sessionId": None})
    assert out.title == "标题" and out.session_id is None
    err = invalid("session/create", {"title": "ok\ud800"})
    assert "lone surrogate" in err.message and err.data["param"] == "title"
    err = invalid("archive/search", {"query": "x", "since": float("nan")})
    assert "'since' must be a finite number" in err.message
    # the same errors, word for word, as before the params were Structs
    assert invalid("archive/read", {"sessionId": "s", "limit": 0}).message == (
        "archive/read: parameter 'limit' must be between 1 and 5000, got 0")
    assert invalid("session/get", {}).message == (
        "session/get: missing required parameter 'sessionId' (a string)")
    assert invalid("run/finish", {"runId": "r", "outcome": "ok"}).message == (
        "run/finish: parameter 'outcome' must be one of 'completed', 'failed', "
        "'cancelled', got 'ok'")


# validate_params: refusing


def test_unknown_method() -> None:
    with pytest.raises(MethodNotFound) as info:
        validate_params("sesion/get", {})
    assert info.value.code == ErrorCode.METHOD_NOT_FOUND
    assert "session/get" in info.value.message  # suggestion
    assert "docs/protocol.md" in info.value.message
    assert "session/get" in info.value.data["known"]


def test_positional_array_refused() -> None:
    err = invalid("session/get", ["s1"])
    assert "positional" in err.message and "sessionId" in err.message


@pytest.mark.parametrize("params", ["s1", 5, True])
def test_non_object_params_refused(params: Any) -> None:
    assert "object" in invalid("session/get", params).message


def test_missing_required() -> None:
    err = invalid("messages/append", {"sessionId": "s"})
    assert "'messages'" in err.message and "missing" in err.message
    assert err.data["param"] == "messages"
    err = invalid("session/get", {"sessionId": None})
    assert "'sessionId'" in err.message


@pytest.mark.parametrize(
    ("method", "params", "param"),
    [
        ("session/get", {"sessionId": 5}, "sessionId"),
        ("archive/read", {"sessionId": "s", "limit": "10"}, "limit"),
        ("archive/read", {"sessionId": "s", "limit": 1.5}, "limit"),
        ("context/compact", {"sessionId": "s", "force": 1}, "force"),
        ("context/compact", {"sessionId": "s", "force": "true"}, "force"),
        ("session/create", {"metadata": []}, "metadata"),
        ("session/create", {"createdAt": -1}, "createdAt"),
        ("session/create", {"createdAt": "2025-01-01"}, "createdAt"),
        ("messages/append", {"sessionId": "s", "messages": {"role": "user"}}, "messages"),
        ("archive/search", {"query": "x", "since": "yesterday"}, "since"),
        ("archive/search", {"query": "x", "until": True}, "until"),
        ("archive/search", {"query": "x", "since": float("inf")}, "since"),
        ("tools/call", {"sessionId": "s", "name": "t", "arguments": "{}"}, "arguments"),
    ],
)
def test_wrong_type(method: str, params: dict[str, Any], param: str) -> None:
    err = invalid(method, params)
    assert f"'{param}'" in err.message and "must be" in err.message
    assert err.data["param"] == param


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_an_integer(value: bool) -> None:
    err = invalid("archive/read", {"sessionId": "s", "limit": value})
    assert "'limit'" in err.message and "integer" in err.message
    invalid("archive/search", {"query": "x", "offset": value})
    invalid("archive/search", {"query": "x", "since": value})


@pytest.mark.parametrize(
    ("method", "params", "param"),
    [
        ("session/list", {"limit": 0}, "limit"),
        ("session/list", {"limit": 1001}, "limit"),
        ("archive/read", {"sessionId": "s", "limit": 5001}, "limit"),
        ("archive/read", {"sessionId": "s", "afterId": -1}, "afterId"),
        ("archive/search", {"query": "x", "offset": -1}, "offset"),
        ("session/get", {"sessionId": ""}, "sessionId"),
        ("session/get", {"sessionId": "x" * 201}, "sessionId"),
        ("archive/search", {"query": ""}, "query"),
        ("archive/search", {"query": "q" * 4097}, "query"),
        ("context/pins/add", {"sessionId": "s", "text": "t" * 65537}, "text"),
        ("context/compact", {"sessionId": "s", "instructions": "i" * 16385}, "instructions"),
        ("messages/append", {"sessionId": "s", "messages": []}, "messages"),
    ],
)
def test_out_of_range(method: str, params: dict[str, Any], param: str) -> None:
    err = invalid(method, params)
    assert f"'{param}'" in err.message
    assert "between" in err.message or "at least" in err.message or "at most" in err.message


@pytest.mark.parametrize(
    ("method", "params", "param"),
    [
        ("run/finish", {"runId": "r", "outcome": "done"}, "outcome"),
        ("approval/resolve", {"approvalId": "a", "decision": "yes"}, "decision"),
        ("approval/list", {"sessionId": "s", "status": "rejected"}, "status"),
        ("archive/search", {"query": "x", "role": "developer"}, "role"),
        ("context/get", {"sessionId": "s", "format": "anthropic"}, "format"),
    ],
)
def test_not_among_choices(method: str, params: dict[str, Any], param: str) -> None:
    err = invalid(method, params)
    assert f"'{param}'" in err.message and "one of" in err.message


def test_unknown_param_refused() -> None:
    err = invalid("session/get", {"sessionId": "s", "sesionId": "s"})
    assert "'sesionId'" in err.message and "did you mean 'sessionId'" in err.message
    assert err.data["param"] == "sesionId"
    err = invalid("tools/list", {"verbose": True})
    assert "'verbose'" in err.message
    # sent as null it is still a param the method does not have
    err = invalid("context/status", {"sessionId": "s", "pinId": None})
    assert err.data["param"] == "pinId" and "unknown parameter" in err.message


@given(st.dictionaries(st.text(max_size=12), st.none() | st.booleans() | st.integers()))
def test_never_raises_anything_but_invalid_params(params: dict[str, Any]) -> None:
    for method in ("archive/read", "tools/list", "archive/search"):
        try:
            out = validate_params(method, params)
        except InvalidParams:
            continue
        assert set(wire(out)) == set(METHODS[method].param_names)


def test_fast_enough() -> None:
    params = GOOD["messages/append"]
    n = 20_000
    per_call = timeit.timeit(lambda: validate_params("messages/append", params), number=n) / n
    # a few microseconds expected; generous so a slow CI machine does not flake
    assert per_call < 50e-6


# Docs


def test_docs_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert gen_docs.DEFAULT_OUTPUT.is_file()
    assert gen_docs.main(["--check"]) == 0, "run `python -m ctxd.protocol.gen_docs`"


def test_check_detects_stale_file(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "protocol.md"
    assert gen_docs.main(["--check", "--output", str(out)]) == 1  # missing
    assert gen_docs.main(["--output", str(out)]) == 0
    assert gen_docs.main(["--check", "--output", str(out)]) == 0
    out.write_text(out.read_text() + "\nedited\n")
    assert gen_docs.main(["--check", "--output", str(out)]) == 1
    assert "stale" in capsys.readouterr().err


def test_doc_covers_every_method_error_and_notification() -> None:
    text = gen_docs.render()
    for code in ErrorCode:
        assert f"| {int(code)} | `{code.name}` |" in text
        assert code in ERROR_DOCS
    for name, m in METHODS.items():
        assert f"### `{name}`" in text
        for p in m.fields:
            assert f"| `{p.name}` |" in text
    for name in NOTIFICATIONS:
        assert f"| `{name}` |" in text
    for code in COMMON_ERRORS:
        assert code.name in text
    for word in ("Content-Length", "WebSocket", "ctxd stdio", "ROUTER", "PUB", "token"):
        assert word in text
