"""Fuzzing the engine in-process: search text and append batches.

Search: any text, FTS5 syntax included, is plain words in plain mode (it never raises)
and in advanced mode fails only with `InvalidParams`. Append: a generated batch, valid
and invalid messages mixed, is either stored whole or refused whole with a typed error,
and the context counters always equal a recount of the archive.

`CTXD_FUZZ_SCALE` multiplies every example count; `CTXD_FUZZ_STATS` names a file that
receives one JSON line per (test, outcome) count (see bench/fuzz_report.py).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outcomes import OutcomeCounts

from ctxd.daemon.engine import Engine
from ctxd.daemon.stores.sql import contexts as cs
from ctxd.protocol.errors import (
    ApprovalPending,
    CtxdError,
    InvalidMessage,
    InvalidParams,
    PayloadTooLarge,
)

MAX_MESSAGE_BYTES = 2048
MAX_BATCH_MESSAGES = 8
SCALE = float(os.environ.get("CTXD_FUZZ_SCALE", "1"))


def fuzz(n: int) -> settings:
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


STATS = OutcomeCounts()
note = STATS.note


@pytest.fixture(scope="module", autouse=True)
def _write_stats() -> Iterator[None]:
    yield
    STATS.write()


# one engine for the module, with a corpus to search and sessions to append to

CORPUS = [
    "alpha beta gamma", "the quick brown fox", "上下文压缩策略", "压缩 and compaction",
    'he said "AND" OR NOT', "NEAR(a b) is syntax", "col:value and body:text", "prefix* stars",
    "café naïve résumé", "emoji 🎉 party", "tabs\tand\nnewlines", "x'; DROP TABLE messages; --",
    "ʻokina and ÅngstrÖm", "1234 5678", "-minus +plus ^caret", "{braces} (parens) [brackets]",
]


@dataclass
class Bench:
    engine: Engine
    corpus_session: str
    shared: str
    pending: str
    fresh: int = 0
    seen: set[str] = field(default_factory=set)

    def new_session(self) -> str:
        self.fresh += 1
        return self.engine.create_session(f"fresh-{self.fresh}").session_id

    def total(self) -> int:
        return int(self.engine.conn.execute("SELECT count(*) FROM messages").fetchone()[0])


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    engine = Engine(make_config(tmp_path_factory.mktemp("fuzzengine") / "data",
                                max_message_bytes=MAX_MESSAGE_BYTES,
                                max_batch_messages=MAX_BATCH_MESSAGES))
    corpus = engine.create_session("corpus").session_id
    for i in range(0, len(CORPUS), MAX_BATCH_MESSAGES):
        engine.append(corpus, [{"role": "user", "content": t}
                               for t in CORPUS[i:i + MAX_BATCH_MESSAGES]])
    shared = engine.create_session("shared").session_id
    # a session whose tool call `pending_call` waits for a human
    pending = engine.create_session("pending").session_id
    run = engine.start_run(pending).run_id
    engine.append(pending, [{"role": "user", "content": "edit hosts"}, {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "pending_call", "type": "function",
             "function": {"name": "edit", "arguments": "{}"}}]}], run_id=run)
    engine.request_approval(pending, run, "pending_call", "edit", {})
    yield Bench(engine, corpus, shared, pending)
    engine.close()


# search

FTS_FRAGMENTS = st.sampled_from([
    '"', '""', "*", "^", "-", "+", ":", "(", ")", "{", "}", "[", "]", ",", "'", "\\", "\x00",
    "AND", "OR", "NOT", "NEAR", "NEAR(", "NEAR/2", "body:", "rank:", "messages_fts:", "{body}:",
    "alpha", "beta", "压缩", "上下文", "café", "🎉", " ", "\t", "\n", "\u200b", "\ufeff",
])
CORPUS_WORDS = st.sampled_from(sorted({w for t in CORPUS for w in t.split()}))
SEARCH_TEXT = st.one_of(
    st.lists(FTS_FRAGMENTS | st.text(max_size=12), max_size=12).map("".join),
    # words of the corpus mixed with syntax, so that many queries find something
    st.lists(CORPUS_WORDS | FTS_FRAGMENTS, min_size=1, max_size=6).map(" ".join),
)


def plain_words(text: str) -> set[str]:
    return {w.casefold() for w in text.split()}


@fuzz(300)
@given(query=SEARCH_TEXT, limit=st.integers(1, 50), offset=st.sampled_from([0, 0, 0, 1, 3, 20]),
       newest_first=st.booleans(), scoped=st.booleans())
def test_plain_search_never_raises(bench: Bench, query: str, limit: int, offset: int,
                                   newest_first: bool, scoped: bool) -> None:
    hits = bench.engine.search(query, session_id=bench.corpus_session if scoped else None,
                               limit=limit, offset=offset, newest_first=newest_first)
    assert isinstance(hits, list) and len(hits) <= limit
    for h in hits:
        assert isinstance(h.message_id, int) and isinstance(h.snippet, str)
        if scoped:
            assert h.session_id == bench.corpus_session
    note("hits" if hits else "no hits")


# well-formed FTS5 queries over words of the corpus: these must run
FTS_WORDS = st.sampled_from(sorted(
    w for t in CORPUS for w in t.split()
    if re.fullmatch(r"\w+", w) and w.upper() not in ("AND", "OR", "NOT", "NEAR")))
FTS_TERMS = st.one_of(
    FTS_WORDS,
    FTS_WORDS.map(lambda w: w + "*"),
    st.lists(FTS_WORDS, min_size=1, max_size=3).map(lambda ws: '"' + " ".join(ws) + '"'),
    st.lists(FTS_WORDS, min_size=2, max_size=3).map(lambda ws: "NEAR(" + " ".join(ws) + ")"),
)
VALID_FTS = st.recursive(
    FTS_TERMS,
    lambda kids: st.builds(lambda a, op, b: f"({a} {op} {b})", kids,
                           st.sampled_from(["AND", "OR", "NOT"]), kids),
    max_leaves=5,
)


@fuzz(300)
@given(query=SEARCH_TEXT.filter(lambda q: q.strip()))
def test_advanced_search_fails_only_with_invalid_params(bench: Bench, query: str) -> None:
    try:
        hits = bench.engine.search(query, advanced=True, limit=20)
    except InvalidParams as exc:
        assert exc.code == -32602 and exc.message
        note("InvalidParams")
        return
    assert isinstance(hits, list)
    note("hits" if hits else "no hits")


@fuzz(200)
@given(query=VALID_FTS)
def test_advanced_search_runs_every_well_formed_query(bench: Bench, query: str) -> None:
    hits = bench.engine.search(query, advanced=True, limit=50)
    assert all(h.session_id == bench.corpus_session for h in hits)
    note("hits" if hits else "no hits")


def test_plain_search_of_syntax_matches_the_words_literally(bench: Bench) -> None:
    # the operators are words here: this text is in the corpus as written
    hits = bench.engine.search('he said "AND" OR NOT', session_id=bench.corpus_session)
    texts = [bench.engine.archive.get_many([h.message_id])[h.message_id]["content"]
             for h in hits]
    assert texts == ['he said "AND" OR NOT']
    # whereas advanced mode reads them as syntax
    with pytest.raises(InvalidParams):
        bench.engine.search('he said "AND" OR NOT', advanced=True)


SURROGATE_TEXT = st.builds(lambda a, s, b: a + s + b, st.text(max_size=5),
                           st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]),
                           st.text(max_size=5))


SURROGATE_QUERIES = ["a\udfffb c", "x\ud800", "\udc00abc def", "alpha \ud83c", "上下文\udfff"]


@pytest.mark.parametrize("advanced", [False, True])
def test_search_text_with_lone_surrogates_gets_a_typed_answer(
    bench: Bench, advanced: bool
) -> None:
    # SQLite cannot bind text that is not valid UTF-8: the engine must say so with a type
    for query in SURROGATE_QUERIES:
        try:
            hits = bench.engine.search(query, advanced=advanced)
        except InvalidParams:
            continue
        assert isinstance(hits, list)


# append


@dataclass(frozen=True)
class Msg:
    """A generated message. `refused_with` is empty when the message itself is valid (the
    session may still refuse it), else the errors any session must refuse it with.

    `depth` > 0 adds metadata nested that deep when the message is built (kept out of
    `raw` so that a failing example still prints).
    """

    raw: Any
    refused_with: tuple[type[CtxdError], ...] = ()
    depth: int = 0

    def build(self) -> Any:
        if not self.depth:
            return self.raw
        return {**self.raw, "metadata": deep(self.depth)}


CALL_IDS = st.sampled_from(["c1", "c2", "c3", "c4", "pending_call"]) | st.text(min_size=1,
                                                                               max_size=6)
TEXT = st.text(max_size=40)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                              max_size=3),
    max_leaves=6,
)


def call(cid: str, name: str = "f", args: Any = "{}") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def deep(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return out


@st.composite
def valid_messages(draw: st.DrawFn) -> Msg:
    kind = draw(st.sampled_from(["user", "system", "assistant", "parts", "call", "result"]))
    if kind in ("user", "system", "assistant"):
        raw: dict[str, Any] = {"role": kind, "content": draw(TEXT)}
    elif kind == "parts":
        raw = {"role": "user", "content": [{"type": "text", "text": draw(TEXT)},
                                           {"type": "image_url", "image_url": {"url": "x"}}]}
    elif kind == "call":
        ids = draw(st.lists(CALL_IDS, min_size=1, max_size=3))
        raw = {"role": "assistant", "content": draw(st.none() | TEXT),
               "tool_calls": [call(i) for i in ids]}
    else:
        raw = {"role": "tool", "tool_call_id": draw(CALL_IDS), "content": draw(TEXT)}
    if draw(st.integers(0, 4)) == 0:
        raw["metadata"] = draw(st.dictionaries(st.text(max_size=5), JSONISH, max_size=3))
    if draw(st.integers(0, 6)) == 0:
        raw["name"] = draw(TEXT)
    return Msg(raw)


BAD: tuple[type[CtxdError], ...] = (InvalidMessage,)


@st.composite
def bad_messages(draw: st.DrawFn) -> Msg:
    """Messages no session accepts: the validator must refuse each of them."""
    kind = draw(st.sampled_from([
        "not_object", "role", "content_type", "null_content", "part", "calls_on_user",
        "calls_empty", "calls_type", "call_id", "call_type", "call_name", "call_args",
        "result_without_id", "id_on_non_tool", "name_type", "metadata_type", "unencodable",
        "surrogate", "deep", "too_big",
    ]))
    if kind == "not_object":
        return Msg(draw(st.none() | st.integers() | TEXT | st.lists(TEXT, max_size=2)), BAD)
    base: dict[str, Any] = {"role": "user", "content": "x"}
    if kind == "role":
        base["role"] = draw(st.text(max_size=10).filter(
            lambda r: r not in ("system", "user", "assistant", "tool"))
            | st.integers() | st.none())
    elif kind == "content_type":
        base["content"] = draw(st.integers() | st.booleans() | st.floats()
                               | st.dictionaries(st.text(max_size=3), TEXT, max_size=2))
    elif kind == "null_content":
        base["role"] = draw(st.sampled_from(["user", "system", "tool", "assistant"]))
        base["content"] = None
        if base["role"] == "tool":
            base["tool_call_id"] = "c1"
    elif kind == "part":
        base["content"] = [draw(st.sampled_from([
            {"type": "text"}, {"type": "text", "text": 5}, {"text": "no type"}, "a string", 7,
            {"type": None}]))]
    elif kind == "calls_on_user":
        base["role"] = draw(st.sampled_from(["user", "system", "tool"]))
        base["tool_call_id"] = "c1" if base["role"] == "tool" else None
        base["tool_calls"] = [call("c9")]
    elif kind == "calls_empty":
        base.update(role="assistant", content=None, tool_calls=[])
    elif kind == "calls_type":
        base.update(role="assistant", tool_calls=draw(TEXT.filter(bool) | st.integers(1)
                                                      | st.dictionaries(TEXT, TEXT, min_size=1)))
    elif kind == "call_id":
        c = call("c1")
        c["id"] = draw(st.none() | st.integers() | st.just(""))
        base.update(role="assistant", tool_calls=[c])
    elif kind == "call_type":
        c = call("c1")
        c["type"] = draw(st.text(max_size=8).filter(lambda t: t != "function"))
        base.update(role="assistant", tool_calls=[c])
    elif kind == "call_name":
        c = call("c1", name=draw(st.none() | st.just("") | st.integers()))
        base.update(role="assistant", tool_calls=[c])
    elif kind == "call_args":
        c = call("c1", args=draw(st.dictionaries(TEXT, TEXT, max_size=2) | st.integers()))
        base.update(role="assistant", tool_calls=[c])
    elif kind == "result_without_id":
        base.update(role="tool", tool_call_id=draw(st.none() | st.just("") | st.integers()))
    elif kind == "id_on_non_tool":
        base.update(role=draw(st.sampled_from(["user", "system", "assistant"])),
                    tool_call_id=draw(TEXT.filter(bool)))
    elif kind == "name_type":
        base["name"] = draw(st.integers() | st.lists(TEXT, max_size=2) | st.booleans())
    elif kind == "metadata_type":
        base["metadata"] = draw(st.integers() | TEXT | st.lists(TEXT, max_size=2)
                                | st.booleans() | st.floats())
    elif kind == "unencodable":
        base["extra"] = draw(st.sampled_from([b"bytes", {1, 2}, object(), (1, 2j)]))
    elif kind == "surrogate":
        base["content"] = draw(SURROGATE_TEXT)
    elif kind == "deep":
        # too deep to encode, or so long once encoded that it is over the size limit
        return Msg(base, (InvalidMessage, PayloadTooLarge), depth=draw(st.integers(1200, 3000)))
    else:
        base["content"] = "é" * (MAX_MESSAGE_BYTES // 2 + draw(st.integers(1, 100)))
        return Msg(base, (PayloadTooLarge,))
    return Msg(base, BAD)


# mostly valid messages, so that whole batches are stored often enough to check them
BATCHES = st.lists(st.one_of(valid_messages(), valid_messages(), valid_messages(), bad_messages()),
                   min_size=1, max_size=MAX_BATCH_MESSAGES + 1)


def recount(engine: Engine, sid: str) -> tuple[int, int]:
    n, tokens = engine.conn.execute(
        "SELECT count(*), coalesce(sum(tokens), 0) FROM messages WHERE session_id = ?", (sid,)
    ).fetchone()
    return int(n), int(tokens)


def check_counters(engine: Engine, sid: str) -> None:
    """Every counter the engine keeps equals a recount from the archive rows."""
    n, tokens = recount(engine, sid)
    status = engine.status(sid)
    assert status.archive_messages == n
    # no compaction ran: every archived message is in the active context
    assert status.active_messages == n
    assert status.estimated_tokens == tokens
    stored = cs.load_context(engine.conn, sid)
    assert stored is not None
    assert (stored.active_messages, stored.active_tokens) == (n, tokens)
    assert len(engine.context_messages(sid)) == n


@fuzz(250)
@given(batch=BATCHES, where=st.sampled_from(["fresh", "shared", "pending"]))
def test_append_stores_a_batch_whole_or_refuses_it_whole(
    bench: Bench, batch: list[Msg], where: str
) -> None:
    engine = bench.engine
    sid = {"fresh": bench.new_session, "shared": lambda: bench.shared,
           "pending": lambda: bench.pending}[where]()
    before_session = recount(engine, sid)[0]
    before_total = bench.total()
    raws = [m.build() for m in batch]
    try:
        result = engine.append(sid, raws)
    except (InvalidMessage, PayloadTooLarge, ApprovalPending) as exc:
        assert exc.message  # says what to change
        assert bench.total() == before_total, "a refused batch left rows behind"
        outcome = type(exc).__name__
    else:
        assert not any(m.refused_with for m in batch), "an invalid message was stored"
        assert len(batch) <= MAX_BATCH_MESSAGES
        ids = result.message_ids
        assert len(ids) == len(batch) and ids == list(range(ids[0], ids[0] + len(batch)))
        assert bench.total() == before_total + len(batch)
        stored = engine.read_archive(sid, after_id=ids[0] - 1, limit=len(batch)).messages
        assert [m["id"] for m in stored] == ids
        assert [m["role"] for m in stored] == [m.raw["role"] for m in batch]
        outcome = "stored"
    if len(batch) > MAX_BATCH_MESSAGES:
        assert outcome == "PayloadTooLarge"
    after_session = recount(engine, sid)[0]
    assert after_session - before_session in (0, len(batch))
    check_counters(engine, sid)
    note(outcome)


@fuzz(100)
@given(bad=bad_messages(), before=st.lists(valid_messages(), max_size=3))
def test_one_invalid_message_refuses_the_batch_and_names_it(
    bench: Bench, bad: Msg, before: list[Msg]
) -> None:
    sid = bench.new_session()
    # plain user messages first: nothing about them can be refused in a fresh session
    batch = [{"role": "user", "content": f"ok {i}"} for i in range(len(before))] + [bad.build()]
    with pytest.raises(CtxdError) as err:
        bench.engine.append(sid, batch)
    assert isinstance(err.value, bad.refused_with), err.value
    assert err.value.data.get("index") == len(batch) - 1, err.value.data
    assert recount(bench.engine, sid) == (0, 0)
    check_counters(bench.engine, sid)
    note(type(err.value).__name__)


def test_metadata_of_odd_json_values_round_trips(bench: Bench) -> None:
    sid = bench.new_session()
    meta = {"n": None, "b": False, "i": -(2**62), "f": 1.5e-300, "s": "上下文 🎉", "l": [[], {}],
            "d": {"nested": {"deeper": [1, "2", 3.0]}}}
    ids = bench.engine.append(sid, [{"role": "user", "content": "m", "metadata": meta}])
    got = bench.engine.read_archive(sid).messages[0]
    assert got["id"] == ids.message_ids[0] and got["metadata"] == meta
    # NaN and Infinity are not JSON: refused, so every JSON client can read the archive
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(InvalidMessage):
            bench.engine.append(sid, [{"role": "user", "content": "m", "metadata": {"v": value}}])
    check_counters(bench.engine, sid)
