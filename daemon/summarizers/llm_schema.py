"""Structured output: the summary's JSON Schema, and the `response_format` forms that
carry it.

Servers take a schema in different shapes. OpenAI, vLLM and llama.cpp's `llama-server`
take `{"type": "json_schema", "json_schema": {...}}`; llama-cpp-python's server refuses
that (HTTP 500) and takes `{"type": "json_object", "schema": {...}}`; some take neither
and get the request with the format spelt out in the prompt alone. A summarizer tries
the forms in this order and remembers, per endpoint (URL and model), the first one the
server accepted, so only the first request to a server pays for the probing.
"""

from __future__ import annotations

import threading
from typing import Any

from ctxd.daemon.summary import SECTIONS

# the forms, in the order they are tried
JSON_SCHEMA = "json_schema"
JSON_OBJECT_SCHEMA = "json_object+schema"
PROMPT_ONLY = "prompt"
FORMS = (JSON_SCHEMA, JSON_OBJECT_SCHEMA, PROMPT_ONLY)

# What the model writes when the built-in extractor runs beside it: what only a model
# writes well. Rules, corrections, artifacts, files, errors and tool activity come from
# the extractor, word for word.
MODEL_SECTIONS = ("goals", "decisions", "open_items")


def summary_schema(sections: tuple[str, ...] | None = None, *, full_items: bool = True) -> dict:
    """The schema of an answer: `{"sections": {name: [item, ...]}}`.

    Strict-mode valid (every property required, no others), so OpenAI accepts it with
    `strict: true`; optional item fields are nullable instead of absent. `full_items`
    False asks for text and sources only, which is all a model's goals, decisions and
    open items need, and saves a small model from writing nulls.
    """
    names = tuple(sections or SECTIONS)
    item_props: dict[str, Any] = {
        "text": {"type": "string"},
        "sources": {"type": "array", "items": {"type": "integer"}},
    }
    if full_items:
        item_props |= {
            "status": {"type": "string", "enum": ["current", "superseded"]},
            "unconfirmed": {"type": "boolean"},
            "subject": {"type": ["string", "null"]},
            "value": {"type": ["string", "null"]},
            "was": {"type": ["string", "null"]},
        }
    item = {
        "type": "object",
        "properties": item_props,
        "required": list(item_props),
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "sections": {
                "type": "object",
                "properties": {name: {"type": "array", "items": item} for name in names},
                "required": list(names),
                "additionalProperties": False,
            }
        },
        "required": ["sections"],
        "additionalProperties": False,
    }


def response_format(form: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The `response_format` of a form; None for the prompt alone."""
    if form == JSON_SCHEMA:
        return {
            "type": "json_schema",
            "json_schema": {"name": "summary", "schema": schema, "strict": True},
        }
    if form == JSON_OBJECT_SCHEMA:
        return {"type": "json_object", "schema": schema}
    return None


def next_form(form: str) -> str | None:
    i = FORMS.index(form)
    return FORMS[i + 1] if i + 1 < len(FORMS) else None


class FormMemory:
    """The form each endpoint accepted, shared by every summarizer in the process."""

    def __init__(self) -> None:
        self._forms: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def get(self, url: str, model: str) -> str:
        with self._lock:
            return self._forms.get((url, model), FORMS[0])

    def known(self, url: str, model: str) -> bool:
        with self._lock:
            return (url, model) in self._forms

    def set(self, url: str, model: str, form: str) -> None:
        with self._lock:
            self._forms[(url, model)] = form

    def forget(self, url: str, model: str) -> None:
        with self._lock:
            self._forms.pop((url, model), None)


ACCEPTED_FORMS = FormMemory()


def is_format_refusal(status: int, detail: str) -> bool:
    """Whether an error answer to a request with a schema may be the schema's fault.

    400/422 naming the option is the polite refusal; llama-cpp-python answers a form it
    does not know with a bare 500. Both move on to the next form; a 500 to the prompt
    alone is the model's failure and is reported as it is.
    """
    if status in (400, 422):
        low = detail.lower()
        return any(w in low for w in ("response_format", "json_schema", "schema", "format"))
    return status == 500
