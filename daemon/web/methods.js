// The protocol's methods as the page calls them. Generated from the protocol's JSON
// Schema (docs/protocol.schema.json) by `python -m ctxd.protocol.gen_js`; edit the
// protocol table, not this file.

export const METHODS = {
  "initialize": {"required": [], "optional": ["token", "clientName", "nonce", "proof", "pageLogin", "pageKey"]},
  "session/create": {"required": [], "optional": ["sessionId", "title", "metadata", "createdAt"]},
  "session/list": {"required": [], "optional": ["limit", "cursor", "title"]},
  "session/get": {"required": ["sessionId"], "optional": []},
  "session/subscribe": {"required": ["sessionId"], "optional": []},
  "session/unsubscribe": {"required": ["sessionId"], "optional": []},
  "messages/append": {"required": ["sessionId", "messages"], "optional": ["runId", "clientBatchId", "returnContext"]},
  "archive/read": {"required": ["sessionId"], "optional": ["afterId", "limit", "beforeId", "maxBytes"]},
  "archive/search": {"required": ["query"], "optional": ["sessionId", "role", "limit", "offset", "advanced", "newestFirst", "since", "until"]},
  "context/get": {"required": ["sessionId"], "optional": ["format", "budgetTokens", "query", "includeMetadata"]},
  "context/status": {"required": ["sessionId"], "optional": []},
  "context/compact": {"required": ["sessionId"], "optional": ["force", "instructions"]},
  "context/rebuild": {"required": ["sessionId"], "optional": ["dryRun"]},
  "context/clear": {"required": ["sessionId"], "optional": []},
  "context/pop": {"required": ["sessionId"], "optional": ["count"]},
  "context/explain": {"required": ["sessionId"], "optional": []},
  "context/compactions": {"required": ["sessionId"], "optional": ["limit"]},
  "context/pins/add": {"required": ["sessionId", "text"], "optional": []},
  "context/pins/list": {"required": ["sessionId"], "optional": []},
  "context/pins/remove": {"required": ["sessionId", "pinId"], "optional": []},
  "run/start": {"required": ["sessionId"], "optional": []},
  "run/finish": {"required": ["runId", "outcome"], "optional": ["messages", "clientBatchId", "returnContext"]},
  "approval/request": {"required": ["sessionId", "runId", "toolCallId"], "optional": ["toolName", "arguments"]},
  "approval/resolve": {"required": ["approvalId", "decision"], "optional": ["reason"]},
  "approval/list": {"required": ["sessionId"], "optional": ["status"]},
  "tools/list": {"required": [], "optional": []},
  "tools/call": {"required": ["sessionId", "name", "arguments"], "optional": []},
  "heartbeat": {"required": [], "optional": []},
  "shutdown": {"required": [], "optional": []},
};

// The params object of one call: the required ones by position, the optional ones
// by name; a name the method does not declare is a bug in the page, caught here.
export function params(method, args) {
  const spec = METHODS[method];
  const out = {};
  spec.required.forEach((name, i) => {
    if (args[i] === undefined || args[i] === null) {
      throw new TypeError(`${method}: missing required parameter '${name}'`);
    }
    out[name] = args[i];
  });
  const options = args[spec.required.length] || {};
  for (const [name, value] of Object.entries(options)) {
    if (!spec.optional.includes(name)) {
      throw new TypeError(`${method}: unknown parameter '${name}'; accepted: ` +
        (spec.optional.join(", ") || "none"));
    }
    if (value !== undefined && value !== null) out[name] = value;
  }
  return out;
}

// `rpc` is the page's connection (rpc.js): its `call(method, params)` sends one
// request.
export class Methods {
  constructor(rpc) {
    this.rpc = rpc;
  }

  send(method, args) {
    return this.rpc.call(method, params(method, args));
  }

  /**
   * `initialize`: Proves the token, and with `nonce` has the daemon prove it too (mutual authentication). On JSON-RPC wires it must be the first request of a connection. On ZeroMQ it may be sent with `proof` and no token in the envelope, so the client checks the daemon before sending the token.
   * @param {{token?: string, clientName?: string, nonce?: string, proof?: string, pageLogin?: string, pageKey?: string}} [options]
   */
  initialize(options = {}) {
    return this.send("initialize", [options]);
  }

  /**
   * `session/create`: Creates an empty session.
   * @param {{sessionId?: string, title?: string, metadata?: Object, createdAt?: number}} [options]
   */
  sessionCreate(options = {}) {
    return this.send("session/create", [options]);
  }

  /**
   * `session/list`: Lists sessions, newest first, one page at a time.
   * @param {{limit?: number, cursor?: string, title?: string}} [options]
   */
  sessionList(options = {}) {
    return this.send("session/list", [options]);
  }

  /**
   * `session/get`: Reads one session.
   * @param {string} sessionId `sessionId`
   */
  sessionGet(sessionId) {
    return this.send("session/get", [sessionId, {}]);
  }

  /**
   * `session/subscribe`: Sends this connection the session's notifications (JSON-RPC wires; on ZeroMQ subscribe a SUB socket to the session's topic instead).
   * @param {string} sessionId `sessionId`
   */
  sessionSubscribe(sessionId) {
    return this.send("session/subscribe", [sessionId, {}]);
  }

  /**
   * `session/unsubscribe`: Stops the session's notifications on this connection.
   * @param {string} sessionId `sessionId`
   */
  sessionUnsubscribe(sessionId) {
    return this.send("session/unsubscribe", [sessionId, {}]);
  }

  /**
   * `messages/append`: Appends one batch to the archive and the active context. The batch is stored whole or not at all. May schedule an automatic compaction. Limits (daemon config): each message at most `max_message_bytes` of JSON (8 MiB by default), at most `max_batch_messages` messages (10,000), and the whole request at most `max_request_bytes` (64 MiB); above them `PAYLOAD_TOO_LARGE` and nothing is stored.
   * @param {string} sessionId `sessionId`
   * @param {Array} messages `messages`
   * @param {{runId?: string, clientBatchId?: string, returnContext?: boolean}} [options]
   */
  messagesAppend(sessionId, messages, options = {}) {
    return this.send("messages/append", [sessionId, messages, options]);
  }

  /**
   * `archive/read`: Reads the full archived history in order, whether or not it is still in context, one page at a time: at most `limit` messages and `maxBytes` bytes (default 8 MiB). A message is at most the daemon's `max_message_bytes` (8 MiB of JSON by default).
   * @param {string} sessionId `sessionId`
   * @param {{afterId?: number, limit?: number, beforeId?: number, maxBytes?: number}} [options]
   */
  archiveRead(sessionId, options = {}) {
    return this.send("archive/read", [sessionId, options]);
  }

  /**
   * `archive/search`: Full-text search of the archive, across all sessions unless `sessionId` is given. Plain words must all appear in a message (in any order; a quoted chunk is one word); when no message has them all, the search falls back to messages with any of them and says so with `matched: "any"`. A search that runs longer than the daemon's budget is stopped with `SEARCH_TOO_BROAD`; other requests are served while a search runs.
   * @param {string} query `query`
   * @param {{sessionId?: string, role?: "assistant" | "system" | "tool" | "user", limit?: number, offset?: number, advanced?: boolean, newestFirst?: boolean, since?: number, until?: number}} [options]
   */
  archiveSearch(query, options = {}) {
    return this.send("archive/search", [query, options]);
  }

  /**
   * `context/get`: The model context: what to send as the next request's messages. A projection never changes the stored context.
   * @param {string} sessionId `sessionId`
   * @param {{format?: "openai", budgetTokens?: number, query?: string, includeMetadata?: boolean}} [options]
   */
  contextGet(sessionId, options = {}) {
    return this.send("context/get", [sessionId, options]);
  }

  /**
   * `context/status`: Counters of the session's context and archive.
   * @param {string} sessionId `sessionId`
   */
  contextStatus(sessionId) {
    return this.send("context/status", [sessionId, {}]);
  }

  /**
   * `context/compact`: Moves the oldest messages out of the active context into the summary. The archive keeps them. Reports progress with `$/progress`. When another compaction of the session is running (an automatic one), waits for it first (progress message "waiting for the compaction already running"), then runs.
   * @param {string} sessionId `sessionId`
   * @param {{force?: boolean, instructions?: string}} [options]
   */
  contextCompact(sessionId, options = {}) {
    return this.send("context/compact", [sessionId, options]);
  }

  /**
   * `context/rebuild`: Rebuilds the summary from the archive from scratch with the current strategy, keeping pins; committed even when it does not shrink the context. Reports progress with `$/progress`.
   * @param {string} sessionId `sessionId`
   * @param {{dryRun?: boolean}} [options]
   */
  contextRebuild(sessionId, options = {}) {
    return this.send("context/rebuild", [sessionId, options]);
  }

  /**
   * `context/clear`: Starts a fresh active context: no system messages, summary or tail; pins stay. The archive keeps every message and search still finds them; messages appended from now on make up the new context.
   * @param {string} sessionId `sessionId`
   */
  contextClear(sessionId) {
    return this.send("context/clear", [sessionId, {}]);
  }

  /**
   * `context/pop`: Takes the newest messages of the tail out of the active context (the archive keeps them). The cut is widened so that a tool result never stays without its call: popping a result also pops the assistant message that made the call and all after.
   * @param {string} sessionId `sessionId`
   * @param {{count?: number}} [options]
   */
  contextPop(sessionId, options = {}) {
    return this.send("context/pop", [sessionId, options]);
  }

  /**
   * `context/explain`: Shows where every line of the summary came from.
   * @param {string} sessionId `sessionId`
   */
  contextExplain(sessionId) {
    return this.send("context/explain", [sessionId, {}]);
  }

  /**
   * `context/compactions`: The session's compaction attempts, effective or not: what each one saved.
   * @param {string} sessionId `sessionId`
   * @param {{limit?: number}} [options]
   */
  contextCompactions(sessionId, options = {}) {
    return this.send("context/compactions", [sessionId, options]);
  }

  /**
   * `context/pins/add`: Pins a text to the context; a text the session has pinned already returns that pin, unchanged.
   * @param {string} sessionId `sessionId`
   * @param {string} text `text`
   */
  contextPinsAdd(sessionId, text) {
    return this.send("context/pins/add", [sessionId, text, {}]);
  }

  /**
   * `context/pins/list`: Lists the session's pins.
   * @param {string} sessionId `sessionId`
   */
  contextPinsList(sessionId) {
    return this.send("context/pins/list", [sessionId, {}]);
  }

  /**
   * `context/pins/remove`: Unpins a text.
   * @param {string} sessionId `sessionId`
   * @param {string} pinId `pinId`
   */
  contextPinsRemove(sessionId, pinId) {
    return this.send("context/pins/remove", [sessionId, pinId, {}]);
  }

  /**
   * `run/start`: Starts a run (one agent turn). A session has at most one run at a time; a run left open by a connection that closes is marked interrupted.
   * @param {string} sessionId `sessionId`
   */
  runStart(sessionId) {
    return this.send("run/start", [sessionId, {}]);
  }

  /**
   * `run/finish`: Finishes a run. The daemon may then compact the context in the background. With `messages`, appends them first: when the append is refused, the run stays open.
   * @param {string} runId `runId`
   * @param {"cancelled" | "completed" | "failed"} outcome `outcome`
   * @param {{messages?: Array, clientBatchId?: string, returnContext?: boolean}} [options]
   */
  runFinish(runId, outcome, options = {}) {
    return this.send("run/finish", [runId, outcome, options]);
  }

  /**
   * `approval/request`: Asks a human to approve a tool call; clients see `approval/didRequest`.
   * @param {string} sessionId `sessionId`
   * @param {string} runId `runId`
   * @param {string} toolCallId `toolCallId`
   * @param {{toolName?: string, arguments?: *}} [options]
   */
  approvalRequest(sessionId, runId, toolCallId, options = {}) {
    return this.send("approval/request", [sessionId, runId, toolCallId, options]);
  }

  /**
   * `approval/resolve`: Approves or denies a pending tool call; clients see `approval/didResolve`. When it was the session's last pending approval and no run is open, a compaction held back by the approval runs now if the context is over its limits.
   * @param {string} approvalId `approvalId`
   * @param {"approved" | "denied"} decision `decision`
   * @param {{reason?: string}} [options]
   */
  approvalResolve(approvalId, decision, options = {}) {
    return this.send("approval/resolve", [approvalId, decision, options]);
  }

  /**
   * `approval/list`: Lists the session's approvals.
   * @param {string} sessionId `sessionId`
   * @param {{status?: "approved" | "denied" | "pending"}} [options]
   */
  approvalList(sessionId, options = {}) {
    return this.send("approval/list", [sessionId, options]);
  }

  /**
   * `tools/list`: Tools the agent can offer its model so it can read its own past.
   */
  toolsList() {
    return this.send("tools/list", [{}]);
  }

  /**
   * `tools/call`: Runs one of the tools of `tools/list` for the session's agent. `search_past_messages` takes the same query limits as `archive/search`.
   * @param {string} sessionId `sessionId`
   * @param {string} name `name`
   * @param {Object} argumentsValue `arguments`
   */
  toolsCall(sessionId, name, argumentsValue) {
    return this.send("tools/call", [sessionId, name, argumentsValue, {}]);
  }

  /**
   * `heartbeat`: Tells the daemon the client is alive. ZeroMQ has no disconnect signal: a ZeroMQ client holding an open run must send a request (any, or this one) at least every `leaseSeconds`, or its runs are marked interrupted.
   */
  heartbeat() {
    return this.send("heartbeat", [{}]);
  }

  /**
   * `shutdown`: Asks the daemon to stop: it answers, finishes writing, removes its connection file and exits.
   */
  shutdown() {
    return this.send("shutdown", [{}]);
  }
}
