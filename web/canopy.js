// Canopy's browser client: an ES module over the JSON WebSocket API (/ws, see
// docs/websocket.md). No build step: `import { connect } from "/canopy.js"`.
//
//   const canopy = await connect("ws://127.0.0.1:8080/ws");
//   await canopy.subscribe("devices.*.temp", (msg) => console.log(msg.subject, msg.data));
//   await canopy.publish("devices.42.temp", { t: 21.5 }, { expectVersion: 3 });
//   const consumer = canopy.consume("billing", async (msg) => bill(msg.data)); // acked when it returns

/** An error the server answered: `code` for programs, `message` for people. */
export class CanopyError extends Error {
  constructor(answer) {
    super(answer.message);
    this.code = answer.code;
    this.currentVersion = answer.current_version;
  }
}

const base64ToBytes = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
const bytesToBase64 = (bytes) => btoa(String.fromCharCode(...bytes));

/** A message as handlers receive it: `data` is parsed JSON, or bytes (Uint8Array). */
function message(raw) {
  const { op, id, data, data_b64, ...rest } = raw;
  return { ...rest, data: data_b64 === undefined ? data : base64ToBytes(data_b64) };
}

/**
 * Connects; resolves once the socket is open. `token`: a bearer token, needed when the
 * server requires logins (sent as a `bearer.<token>` subprotocol beside `canopy`, since
 * browsers cannot set headers on a WebSocket).
 */
export function connect(url, { WebSocket: Socket = globalThis.WebSocket, token } = {}) {
  return new Promise((resolve, reject) => {
    const socket = token === undefined ? new Socket(url) : new Socket(url, ["canopy", `bearer.${token}`]);
    socket.onopen = () => resolve(new Client(socket));
    socket.onerror = () => reject(new Error(`cannot connect to ${url}`));
  });
}

class Client {
  #socket;
  #nextId = 1;
  #pending = new Map();
  #handlers = new Map();

  /** Resolves with `{code, reason}` when the connection ends (1008: a slow consumer). */
  closed;

  constructor(socket) {
    this.#socket = socket;
    socket.onmessage = (event) => this.#receive(JSON.parse(event.data));
    let ended;
    this.closed = new Promise((resolve) => (ended = resolve));
    socket.onclose = (event) => {
      for (const { reject } of this.#pending.values()) {
        reject(new Error(`connection closed: ${event.reason || event.code}`));
      }
      this.#pending.clear();
      ended({ code: event.code, reason: event.reason });
    };
  }

  #receive(answer) {
    if (answer.op === "group.msg") {
      this.#pending.get(answer.id)?.messages?.push(answer);
      return;
    }
    if (answer.op === "msg") {
      this.#handlers.get(answer.sid)?.(message(answer));
      return;
    }
    if (answer.op === "snapshot" && answer.sid !== undefined) {
      this.#handlers.get(answer.sid)?.({ ...message(answer), snapshot: true });
      return;
    }
    const waiting = this.#pending.get(answer.id);
    if (!waiting) return;
    this.#pending.delete(answer.id);
    if (answer.op === "error") {
      waiting.reject(new CanopyError(answer));
      return;
    }
    // A subscription's handler is in place before the next message is read: the
    // server may send its first messages in the same read as this answer.
    if (waiting.handler && answer.sid !== undefined) this.#handlers.set(answer.sid, waiting.handler);
    waiting.resolve(waiting.messages ? waiting.messages : answer);
  }

  #request(op, fields, handler, messages) {
    const id = String(this.#nextId++);
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, handler, messages });
      this.#socket.send(JSON.stringify({ op, id, ...fields }));
    });
  }

  /**
   * One pull from consumer group `group`: up to `max` messages, waiting up to `waitMs`
   * for a first one. Each has `ack()`, `nack({delayMs})`, `inProgress()` and `term()`,
   * which resolve once the group has the answer.
   */
  async next(group, { max = 1, waitMs = 0 } = {}) {
    const raw = await this.#request("group.next", { group, max, wait_ms: waitMs }, undefined, []);
    return raw.map((answer) => this.#delivery(answer));
  }

  #delivery(raw) {
    const delivery = message(raw);
    let settled = false;
    const settle = (kind, delayMs) => {
      settled = true;
      return this.#request("group.ack", { ack: raw.ack, kind, delay_ms: delayMs });
    };
    delivery.ack = () => settle("ack");
    delivery.nack = ({ delayMs } = {}) => settle("nack", delayMs);
    delivery.inProgress = () => this.#request("group.ack", { ack: raw.ack, kind: "in_progress" });
    delivery.term = () => settle("term");
    Object.defineProperty(delivery, "settled", { get: () => settled });
    return delivery;
  }

  /**
   * Consumes group `group` until `stop()`: pulls up to `batch` messages at a time
   * (waiting up to `waitMs` when none is ready) and calls `handler` with each, in
   * order. A message the handler leaves unanswered is acked once it returns (or its
   * promise resolves), and nacked when it throws; with `manualAck` it is left to the
   * handler (unanswered, it goes again after the group's ack wait). A pull answered
   * empty before its wait was out, and a passing `busy` or `unavailable`, are retried
   * after a pause that grows to 5 s.
   * `done` resolves when it stops after `stop()`, and rejects with the error that
   * ended it otherwise (the connection closing, the group deleted, a refusal).
   */
  consume(group, handler, { batch = 10, waitMs = 5000, manualAck = false } = {}) {
    let stopping = false;
    const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
    const done = (async () => {
      let idle = 0;
      while (!stopping) {
        let deliveries;
        const asked = Date.now();
        try {
          deliveries = await this.next(group, { max: batch, waitMs });
        } catch (error) {
          if (!(error instanceof CanopyError && ["busy", "unavailable"].includes(error.code))) throw error;
          deliveries = [];
        }
        // Nothing, sooner than the wait asked for (a refusal, a group with too many
        // waiting pulls, waitMs 0): pause before asking again, longer each time.
        if (deliveries.length === 0 && Date.now() - asked < waitMs / 2 + 10) {
          idle = Math.min(Math.max(idle * 2, 50), 5000);
          if (!stopping) await pause(idle);
          continue;
        }
        idle = 0;
        for (const delivery of deliveries) {
          let failed = false;
          try {
            await handler(delivery);
          } catch {
            failed = true;
          }
          if (manualAck || delivery.settled) continue;
          try {
            await (failed ? delivery.nack() : delivery.ack());
          } catch (error) {
            // Its ack wait ran out meanwhile: it goes again, and consuming goes on.
            if (!(error instanceof CanopyError && error.code === "conflict")) throw error;
          }
        }
      }
    })();
    return {
      done,
      stop: () => {
        stopping = true;
        return done;
      },
    };
  }

  /**
   * Follows `pattern` (native or MQTT syntax); `from`: {offset}, {version}, {timeMs} or
   * "snapshot" (one subject: its latest snapshot, marked `snapshot: true`, then the
   * versions after it).
   */
  async subscribe(pattern, handler, { from } = {}) {
    const fields = { pattern };
    if (from === "snapshot") fields.from_snapshot = true;
    if (from?.offset !== undefined) fields.from_offset = from.offset;
    if (from?.version !== undefined) fields.from_version = from.version;
    if (from?.timeMs !== undefined) fields.from_time_ms = from.timeMs;
    const answer = await this.#request("sub", fields, handler);
    return { sid: answer.sid, unsubscribe: () => this.#unsubscribe(answer.sid) };
  }

  async #unsubscribe(sid) {
    this.#handlers.delete(sid);
    await this.#request("unsub", { sid });
  }

  /**
   * Publishes JSON (any value) or bytes (Uint8Array); resolves with the ack.
   * `awaitGroups`: consumer groups (names) that must ack the message before the ack
   * comes, within `awaitTimeoutMs`; the ack's `await` says which did.
   */
  publish(subject, data, { expectVersion, msgId, headers, awaitGroups, awaitTimeoutMs } = {}) {
    const fields = { subject };
    if (data instanceof Uint8Array) fields.data_b64 = bytesToBase64(data);
    else fields.data = data;
    if (expectVersion !== undefined) fields.expect_version = expectVersion;
    if (msgId !== undefined) fields.msg_id = msgId;
    if (headers !== undefined || awaitGroups !== undefined) fields.headers = { ...headers };
    if (awaitGroups !== undefined) {
      fields.headers["Canopy-Await"] = [].concat(awaitGroups).join(",");
      if (awaitTimeoutMs !== undefined) fields.headers["Canopy-Await-Timeout"] = String(awaitTimeoutMs);
    }
    return this.#request("pub", fields);
  }

  /** The latest message of `subject`, or a given `version`. */
  async get(subject, { version } = {}) {
    return message(await this.#request("get", version === undefined ? { subject } : { subject, version }));
  }

  /** The latest snapshot of `subject`, or the latest at or below `version`. */
  async snapshot(subject, { version } = {}) {
    return message(await this.#request("snapshot.get", { subject, version }));
  }

  /** Stores a snapshot of `subject` as of `version`: JSON (any value) or bytes. */
  putSnapshot(subject, version, data) {
    const fields = { subject, version };
    if (data instanceof Uint8Array) fields.data_b64 = bytesToBase64(data);
    else fields.data = data;
    return this.#request("snapshot.put", fields);
  }

  /** One page of history: `target` is {subject} or {pattern}. */
  async replay(target, { fromOffset, fromVersion, fromTimeMs, max } = {}) {
    const page = await this.#request("replay", {
      ...target,
      from_offset: fromOffset,
      from_version: fromVersion,
      from_time_ms: fromTimeMs,
      max,
    });
    return { messages: page.messages.map(message), next: page.next, caughtUp: page.caught_up };
  }

  /** One page of stored subjects matching `pattern`. */
  async subjects(pattern = ">", { after, max } = {}) {
    const page = await this.#request("subjects", { pattern, after, max });
    return { subjects: page.subjects, next: page.next };
  }

  close() {
    this.#socket.close();
  }
}
