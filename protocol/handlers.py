"""Handlers registered where they are written, against the method object they serve.

    @serves(SESSION_CREATE)
    def create_session(self, session_id, title, metadata): ...

A handler is a method of the engine (called with the params as keyword arguments, their
snake_case names), a function given the engine first and then the same keywords, or,
with `connection=True`, a method of the dispatcher called with the connection and the
params Struct (what needs the connection: login, subscriptions, runs held).

`serves` refuses a method object that is not in the table, or one served twice, when the
handler's module is imported; the dispatcher imports every handler module and then calls
`HANDLERS.check_complete()`, so a method left without a handler fails at import too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from ctxd.protocol.declare import Method
from ctxd.protocol.methods import METHODS

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Handler:
    method: Method
    function: Callable[..., Any]
    # called with (connection, params Struct) rather than with keyword arguments
    connection: bool

    @property
    def owner(self) -> str | None:
        """The name of the class the function is written in; None for a module function."""
        head, dot, _ = self.function.__qualname__.rpartition(".")
        return head.rpartition(".")[2] if dot and "<locals>" not in head else None


class HandlerTable:
    """Which function serves each method of one protocol table."""

    def __init__(self, methods: dict[str, Method]) -> None:
        self._methods = methods
        self._handlers: dict[str, Handler] = {}

    def serves(self, method: Method, *, connection: bool = False) -> Callable[[F], F]:
        if self._methods.get(method.name) is not method:
            raise LookupError(
                f"a handler for {method.name!r}, which is not a method of the protocol table"
            )

        def register(fn: F) -> F:
            held = self._handlers.get(method.name)
            if held is not None:
                raise ValueError(
                    f"{method.name!r} has two handlers: {held.function.__qualname__} and "
                    f"{fn.__qualname__}"
                )
            self._handlers[method.name] = Handler(method, fn, connection)
            return fn

        return register

    def check_complete(self) -> None:
        """Every method of the table has its handler (raises naming those without)."""
        missing = [name for name in self._methods if name not in self._handlers]
        if missing:
            raise LookupError(f"methods without a handler: {', '.join(missing)}")

    def __getitem__(self, name: str) -> Handler:
        return self._handlers[name]

    def __iter__(self) -> Iterator[Handler]:
        return iter(self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)


# the daemon's handlers
HANDLERS = HandlerTable(METHODS)
serves = HANDLERS.serves
