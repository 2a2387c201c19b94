"""Search text for PostgreSQL, split by ctxd's own tokenizer (stores/sql/search_text.py).

PostgreSQL's text-search parser classifies characters by the server's locale: under `C`
a run of Han characters is one word or none, so `压缩` would not be found inside
`上下文压缩策略`. ctxd therefore builds the `tsvector` itself, as a literal, from the same
token stream the SQLite index sees (`search_text.index_text`: every CJK character its own token),
lowercased and without diacritics like unicode61's `remove_diacritics 2`; a query chunk of
several tokens becomes a phrase (`'压' <-> '缩'`), so a two-character word matches only
where its characters stand side by side. No text-search configuration is involved (the
lexemes are final), which is the `simple` configuration's behaviour, made locale-proof.

The tsvector type holds at most 16383 positions and 1 MB: a longer message is indexed as
several overlapping parts (rows of `messages_search`), so all of it stays searchable.
Within a part at most 256 positions are kept per lexeme (a phrase made of a word's 257th
and later occurrences is missed) and lexemes over 2046 bytes are not indexed.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from ctxd.daemon.stores.sql import search_text
from ctxd.protocol.errors import InvalidParams

_TOKEN = re.compile(r"[^\W_]+")
MAX_POSITION = 16383
MAX_POSITIONS_PER_LEXEME = 256
MAX_LEXEME_BYTES = 2046
MAX_VECTOR_BYTES = 900_000
OVERLAP = 64


def normalize(token: str) -> str:
    """Lowercase, diacritics removed (as unicode61 remove_diacritics 2)."""
    token = token.lower()
    if token.isascii():
        return token
    return _normalize_wide(token)


@functools.lru_cache(maxsize=1 << 16)
def _normalize_wide(token: str) -> str:
    # kept per token: most non-ASCII tokens are single CJK characters, repeated often
    decomposed = unicodedata.normalize("NFD", token)
    stripped = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
    return unicodedata.normalize("NFC", stripped)


def tokens(text: str) -> list[str]:
    """The lexemes of a text, in order."""
    if text.isascii():
        # every append indexes its messages here: lowercasing ASCII moves no token
        # boundary, so the whole text is lowercased at once instead of token by token
        return _TOKEN.findall(text.replace("\x00", " ").lower())
    return [normalize(t) for t in _TOKEN.findall(search_text.index_text(text))]


def _quote(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _literal(lexemes: list[str]) -> str:
    positions: dict[str, list[int]] = {}
    for pos, lex in enumerate(lexemes, start=1):
        plist = positions.get(lex)
        if plist is None:
            positions[lex] = [pos]
        elif len(plist) < MAX_POSITIONS_PER_LEXEME:
            plist.append(pos)
    # a lexeme is a run of word characters (_TOKEN): it holds no quote or backslash to
    # escape, so it is quoted as it is
    return " ".join(
        f"'{lex}':{','.join(map(str, plist))}" for lex, plist in positions.items()
    )


def tsvector_parts(text: str) -> list[str]:
    """`tsvector` literals (cast with ::tsvector) for a message's searchable text: one
    for most messages; a long one is cut into parts that each stay within the type's
    limits, overlapping by OVERLAP tokens so a phrase across a cut is still found."""
    toks = tokens(text)
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size <= MAX_LEXEME_BYTES and len(toks) <= MAX_POSITION and (
            size + 8 * len(toks) <= MAX_VECTOR_BYTES):
        # no token can be too long and the whole fits one part (most messages): the
        # bounds below need not be checked token by token
        return [_literal(toks)]
    toks = [t for t in toks if len(t.encode("utf-8")) <= MAX_LEXEME_BYTES]
    parts: list[str] = []
    start = 0
    while True:
        end = start
        size = 0
        seen: set[str] = set()
        while end < len(toks) and end - start < MAX_POSITION:
            if toks[end] not in seen:
                size += len(toks[end].encode("utf-8")) + 8
                if size > MAX_VECTOR_BYTES:
                    break
                seen.add(toks[end])
            end += 1
        parts.append(_literal(toks[start:end]))
        if end >= len(toks):
            return parts
        start = max(start + 1, end - OVERLAP)


def tsvector_literal(text: str) -> str:
    """The first part's literal (the whole text for all but very long messages)."""
    return tsvector_parts(text)[0]


def _phrase(chunk: str) -> str | None:
    toks = [t for t in tokens(chunk) if len(t.encode("utf-8")) <= MAX_LEXEME_BYTES]
    if not toks:
        return None
    if len(toks) == 1:
        return _quote(toks[0])
    return "(" + " <-> ".join(_quote(t) for t in toks) + ")"


def plain_query(text: str) -> str | None:
    """A `tsquery` literal: each whitespace-separated chunk a phrase, chunks ANDed;
    None when nothing searchable remains. Nothing in the text is read as syntax."""
    search_text.check_terms(text)
    phrases = [p for chunk in text.split() if (p := _phrase(chunk))]
    return " & ".join(phrases) if phrases else None


def any_terms_query(text: str) -> str | None:
    """The same phrases ORed: the looser retry when every term together finds nothing."""
    search_text.check_terms(text)
    phrases = [p for chunk in text.split() if (p := _phrase(chunk))]
    return " | ".join(phrases) if phrases else None


_ADV = re.compile(r'\s*(?:(")((?:[^"]|"")*)"|(\()|(\))|([^\s()"]+))')


def advanced_query(text: str) -> str:
    """The FTS5 query syntax ctxd documents, as a `tsquery`: quoted phrases, AND, OR,
    NOT, parentheses, a trailing `*` for a prefix; words side by side are ANDed."""
    if not text.strip():
        raise InvalidParams("the search query is empty")
    search_text.check_terms(text)
    out: list[str] = []
    pos = 0
    need_op = False
    while pos < len(text):
        m = _ADV.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip():
                raise InvalidParams(
                    f"search query not understood near {text[pos:pos + 20]!r}: check the "
                    "FTS5 query syntax ctxd's advanced search takes, or search without "
                    "advanced mode"
                )
            break
        pos = m.end()
        quote, phrase, lpar, rpar, word = m.groups()
        if word in ("AND", "OR", "NOT"):
            out.append({"AND": "&", "OR": "|", "NOT": "& !"}[word])
            need_op = False
            continue
        if rpar:
            out.append(")")
            need_op = True
            continue
        if need_op:
            out.append("&")
        if lpar:
            out.append("(")
            need_op = False
            continue
        if quote:
            term = _phrase(phrase.replace('""', '"'))
        else:
            prefix = word.endswith("*")
            term = _phrase(word.rstrip("*"))
            if term and prefix and not term.startswith("("):
                term += ":*"
        if term is None:
            raise InvalidParams(f"search query not understood: nothing searchable in {word!r}")
        out.append(term)
        need_op = True
    return " ".join(out)


def snippet(text: str, query_lexemes: set[str], width: int = 24) -> str:
    """About `width` tokens of the text around the first matched token, matches in
    **bold**, cut ends marked with `…` (what FTS5's snippet() gives on SQLite).

    Only the window of the text (stores/sql/search_text.py's windows) holding the
    first match is tokenized: a 3 MB tool output costs what its first 16,000 characters do."""
    first = None
    for start, end in search_text.windows(text):
        window = search_text.index_text(text[start:end])
        cuts = (start > 0, end < len(text))
        out = _window_snippet(window, cuts, query_lexemes, width, need_hit=True)
        if out is not None:
            return out
        if first is None:
            first = (window, cuts)
    if first is None:
        return text[:200]
    return _window_snippet(*first, query_lexemes, width, need_hit=False) or text[:200]


def _window_snippet(
    indexed: str, cuts: tuple[bool, bool], query_lexemes: set[str], width: int, need_hit: bool
) -> str | None:
    """The snippet of one window of the text (as indexed); `cuts`: whether text was cut
    off before and after it. None when it has no token, or no hit and `need_hit`."""
    spans = [(m.start(), m.end()) for m in _TOKEN.finditer(indexed)]
    if not spans:
        return None
    hits = [
        i for i, (a, b) in enumerate(spans)
        if normalize(indexed[a:b]) in query_lexemes
        or any(normalize(indexed[a:b]).startswith(q[:-2]) for q in query_lexemes
               if q.endswith(":*"))
    ]
    if need_hit and not hits:
        return None
    first = hits[0] if hits else 0
    start = max(0, min(first - width // 4, len(spans) - width))
    end = min(len(spans), start + width)
    hitset = set(hits)
    parts: list[str] = []
    cursor = spans[start][0]
    for i in range(start, end):
        a, b = spans[i]
        parts.append(indexed[cursor:a])
        parts.append(f"**{indexed[a:b]}**" if i in hitset else indexed[a:b])
        cursor = b
    body = "".join(parts)
    if end == len(spans):
        body += indexed[cursor:]
    cut_before = start > 0 or cuts[0]
    cut_after = end < len(spans) or cuts[1]
    out = ("…" if cut_before else "") + body + ("…" if cut_after else "")
    # adjacent marked CJK characters are one highlighted word, as FTS5 marks a phrase
    return search_text.clean_snippet(out.replace(f"**{search_text.SEP}**", ""))


def query_lexemes(tsquery: str) -> set[str]:
    """The lexemes a tsquery literal names (for snippets); prefixes keep their `:*`."""
    found = set()
    for m in re.finditer(r"'((?:[^'\\]|''|\\.)*)'(:\*)?", tsquery):
        lex = m.group(1).replace("''", "'").replace("\\\\", "\\")
        found.add(lex + (":*" if m.group(2) else ""))
    return found
