"""Hosts, simulated: daemons that reach PostgreSQL as if from other machines.

- `DelayProxy`: a small TCP proxy (asyncio, in a process of its own) in front of the
  test PostgreSQL. Every chunk is held `rtt_ms / 2` in each direction, in order, so a
  round trip costs `rtt_ms` more than on loopback (the kernel here has no `netem`). What
  it holds per connection and direction is bounded (MAX_HELD_BYTES): past that it stops
  reading, and TCP pushes back on the sender. It counts round trips: a client that
  sends again after answers reached it begins one (see `_Link`), so a pipeline of
  statements sent together is one.
- `Hosts`: each daemon in a network namespace of its own (`ip netns`, as root), joined
  to the proxy's namespace by a veth pair with addresses of its own; its Unix sockets
  (the connection file's ZeroMQ ipc and JSON-RPC Unix endpoints) still reach clients,
  since a namespace does not hide the file system. Names are unique per process and
  everything made is removed on close, after a failure too. Where namespaces cannot be
  made (`Hosts.available()` is False), `mode` is "loopback": the proxy listens on
  127.0.0.1 and the daemons share the host's network stack.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import DaemonProcess

# bytes held per connection and direction before the proxy stops reading that side
MAX_HELD_BYTES = 4 << 20
CHUNK = 64 << 10


class _Link:
    """One client connection through the proxy, and its round trips: a round trip
    begins whenever the client sends after answers have reached it (as delivered, after
    the delay) since it last sent. Statements a client pipelines go out before any
    answer can come back (the added delay is longer than the gap between them), so they
    count once; on a proxy adding no delay the count is an upper bound."""

    def __init__(self, total: Any) -> None:
        self.total = total  # the proxy's shared counter
        self._answered = True  # the client's first bytes begin its first round trip

    def client_sent(self) -> None:
        if self._answered:
            with self.total.get_lock():
                self.total.value += 1
            self._answered = False

    def delivered(self) -> None:
        self._answered = True


class DelayProxy:
    """host:port -> target, `rtt_ms` added to every round trip (half each way). It runs
    in a process of its own: in a thread of the caller's, the interpreter's lock (held
    up to 5 ms by other threads) would add its own delays."""

    def __init__(self, target: tuple[str, int], rtt_ms: float, listen_host: str = "127.0.0.1",
                 ) -> None:
        self.target = target
        self.rtt_ms = rtt_ms
        self.listen_host = listen_host
        self.port = 0
        ctx = mp.get_context("spawn")
        self._round_trips = ctx.Value("q", 0)
        self._ready, child = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_serve, args=(target, rtt_ms, listen_host, child, self._round_trips),
            daemon=True, name=f"delay-proxy-{rtt_ms}ms",
        )

    def start(self) -> DelayProxy:
        self._proc.start()
        if not self._ready.poll(30):
            self.close()
            raise RuntimeError("the delaying proxy did not start")
        self.port = self._ready.recv()
        return self

    def round_trips(self) -> int:
        """Round trips taken so far, over every connection ever made."""
        return int(self._round_trips.value)

    def close(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join(10)


def _serve(target: tuple[str, int], rtt_ms: float, host: str, ready: Any, total: Any,
           ) -> None:
    """The proxy process: listen, tell the parent the port, forward until terminated."""
    asyncio.run(_Forwarder(target, rtt_ms, total).serve(host, ready))


class _Forwarder:
    def __init__(self, target: tuple[str, int], rtt_ms: float, total: Any) -> None:
        self.target = target
        self.delay = rtt_ms / 2000
        self.total = total

    async def serve(self, host: str, ready: Any) -> None:
        server = await asyncio.start_server(self._accept, host, 0)
        ready.send(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                      ) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        link = _Link(self.total)
        try:
            await asyncio.gather(
                self._pipe(client_r, server_w, link, from_client=True),
                self._pipe(server_r, client_w, link, from_client=False),
                return_exceptions=True,
            )
        finally:
            for w in (client_w, server_w):
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link, *, from_client: bool) -> None:
        """Forward reader -> writer, each chunk `rtt_ms / 2` after it was read."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_HELD_BYTES // CHUNK)
        loop = asyncio.get_running_loop()

        async def send() -> None:
            while True:
                due, data = await held.get()
                if not data:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not from_client:
                    link.delivered()
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(CHUNK)
                if from_client and data:
                    link.client_sent()
                await held.put((loop.time() + self.delay, data))  # waits while full
                if not data:
                    break
        finally:
            if not sender.done():
                await asyncio.wait([sender], timeout=5)
            sender.cancel()
            writer.close()


_counter = itertools.count()


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Host:
    """One simulated host: a namespace and the veth pair to it (or, on loopback, none)."""

    def __init__(self, index: int, netns: bool) -> None:
        self.index = index
        n = next(_counter)
        tag = f"{os.getpid() % 100000}x{n}"
        self.netns = f"ctxd{tag}" if netns else None
        self.veth = f"cx{tag}"[:15]  # interface names are at most 15 bytes
        # a /30 per host out of 10.213.0.0/16: host side .1, namespace side .2
        a, b = divmod(4 * ((os.getpid() * 7 + n) % 16384), 256)
        self.outer_ip = f"10.213.{a}.{b + 1}" if netns else "127.0.0.1"
        self.inner_ip = f"10.213.{a}.{b + 2}"
        self.made: list[str] = []

    def create(self) -> None:
        if self.netns is None:
            return
        _ip("netns", "add", self.netns)
        self.made.append("netns")
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", self.veth + "p")
        self.made.append("veth")
        _ip("link", "set", self.veth + "p", "netns", self.netns)
        _ip("addr", "add", f"{self.outer_ip}/30", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        inside = ("netns", "exec", self.netns, "ip")
        _ip(*inside, "addr", "add", f"{self.inner_ip}/30", "dev", self.veth + "p")
        _ip(*inside, "link", "set", self.veth + "p", "up")
        _ip(*inside, "link", "set", "lo", "up")  # the daemon's own loopback endpoints

    def remove(self) -> None:
        if "veth" in self.made:
            subprocess.run(["ip", "link", "del", self.veth], capture_output=True, check=False)
        if "netns" in self.made:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True,
                           check=False)
        self.made.clear()

    def prefix(self) -> list[str]:
        """What a command is run under to run on this host."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []


class HostDaemon(DaemonProcess):
    """A `ctxd serve` run on a simulated host, its store reached through a DelayProxy."""

    def __init__(self, root: Path, host: Host, *extra: str, env: dict[str, str] | None = None,
                 ) -> None:
        super().__init__(root, *extra, env=env)
        self.host = host

    def command(self) -> list[str]:
        return [*self.host.prefix(), *super().command()]


class Hosts:
    """Simulated hosts for daemons, each with a DelayProxy of its own in front of
    PostgreSQL at `target`; "netns" or "loopback" in `mode`."""

    def __init__(self, target: tuple[str, int], rtt_ms: float, *, netns: bool | None = None,
                 ) -> None:
        self.target = target
        self.rtt_ms = rtt_ms
        self.mode = "netns" if (self.available() if netns is None else netns) else "loopback"
        self.hosts: list[Host] = []
        self.proxies: list[DelayProxy] = []
        atexit.register(self.close)

    @staticmethod
    def available() -> bool:
        """Whether network namespaces can be made here (root, `ip`, netns support)."""
        if os.geteuid() != 0 or shutil.which("ip") is None:
            return False
        probe = Host(0, True)
        try:
            probe.create()
            return True
        except RuntimeError:
            return False
        finally:
            probe.remove()

    def add(self) -> tuple[Host, DelayProxy]:
        """A new host and its proxy; the DSN host and port are `host.outer_ip` (as seen
        from inside) and `proxy.port`."""
        host = Host(len(self.hosts), self.mode == "netns")
        self.hosts.append(host)
        host.create()
        proxy = DelayProxy(self.target, self.rtt_ms, listen_host=host.outer_ip).start()
        self.proxies.append(proxy)
        return host, proxy

    def dsn(self, host: Host, proxy: DelayProxy, dbname: str, user: str) -> str:
        return f"host={host.outer_ip} port={proxy.port} user={user} dbname={dbname}"

    def round_trips(self) -> int:
        return sum(p.round_trips() for p in self.proxies)

    def close(self) -> None:
        for p in self.proxies:
            try:
                p.close()
            except Exception as exc:  # noqa: BLE001 - the hosts must still be removed
                print(f"delay proxy did not close: {exc}", file=sys.stderr)
        self.proxies.clear()
        for h in self.hosts:
            h.remove()
        self.hosts.clear()


def describe(mode: str, rtt_ms: float) -> str:
    where = ("each daemon in a network namespace of its own, over a veth pair"
             if mode == "netns" else "daemons on the host's loopback (no namespaces here)")
    return f"{where}; {rtt_ms:g} ms added per round trip by a delaying TCP proxy"


def _selftest(argv: list[str]) -> int:  # pragma: no cover - a manual check
    hosts = Hosts(("127.0.0.1", int(argv[0])), float(argv[1]) if len(argv) > 1 else 5)
    try:
        host, proxy = hosts.add()
        print(hosts.mode, host.netns, host.outer_ip, proxy.port)
    finally:
        hosts.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_selftest(sys.argv[1:]))

