// JSON-RPC 2.0 over the daemon's WebSocket. The page's cookie authenticates the upgrade;
// `initialize` then names the client. Reconnects with backoff and tells the app to catch up.

export class RpcError extends Error {
  constructor(error) {
    super(error.message);
    this.code = error.code;
    this.data = error.data;
  }
}

export class Rpc {
  constructor({ onState, onNotification, onOpen }) {
    this.onState = onState;
    this.onNotification = onNotification;
    this.onOpen = onOpen;
    this.nextId = 1;
    this.pending = new Map();
    this.ws = null;
    this.delay = 250;
    this.waiters = [];
    this.open = false;
    this.stopped = false;
  }

  url() {
    return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
  }

  connect() {
    if (this.stopped) return;
    this.onState("connecting");
    const ws = new WebSocket(this.url());
    this.ws = ws;
    ws.addEventListener("open", async () => {
      this.delay = 250;
      try {
        await this.send("initialize", { token: "", clientName: "ctxd web page" });
      } catch (err) {
        this.onState("error", err.message);
        return;
      }
      this.open = true;
      this.onState("live");
      for (const resolve of this.waiters.splice(0)) resolve();
      try {
        await this.onOpen();
      } catch (err) {
        console.warn("catching up:", err.message); // lost again: the next open retries
      }
    });
    ws.addEventListener("message", (ev) => this.receive(ev.data));
    ws.addEventListener("close", () => this.lost());
  }

  async lost() {
    const wasOpen = this.open;
    this.open = false;
    for (const { reject } of this.pending.values()) reject(new Error("connection lost"));
    this.pending.clear();
    if (this.stopped) {
      this.onState(this.loggedOut ? "loggedOut" : "offline");
      return;
    }
    // a refused upgrade looks like any other close: ask whether the login still holds
    try {
      const res = await fetch("/auth", { cache: "no-store", credentials: "same-origin" });
      if (res.status === 401) {
        this.stopped = this.loggedOut = true;
        this.onState("loggedOut");
        return;
      }
    } catch {
      // the daemon is down: keep trying
    }
    this.onState(wasOpen ? "reconnecting" : "offline");
    setTimeout(() => this.connect(), this.delay);
    this.delay = Math.min(this.delay * 2, 2000);
  }

  receive(data) {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    for (const m of Array.isArray(msg) ? msg : [msg]) {
      if (m && m.method && m.id === undefined) {
        this.onNotification(m.method, m.params || {});
      } else if (m && this.pending.has(m.id)) {
        const { resolve, reject } = this.pending.get(m.id);
        this.pending.delete(m.id);
        if (m.error) reject(new RpcError(m.error));
        else resolve(m.result);
      }
    }
  }

  send(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  // A request; waits for the connection when it is down.
  async call(method, params = {}) {
    while (!this.open) {
      if (this.stopped) throw new Error("logged out");
      await new Promise((resolve) => this.waiters.push(resolve));
    }
    return this.send(method, params);
  }
}
