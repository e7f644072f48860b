// The Canopy console: the subject tree, a subscribe panel, a stream view and a live
// overview, on the same /ws API and /canopy.js module any page can use. It must
// stay responsive under fast traffic: rendering happens in batches at most once per
// frame (the subscribe panel) or per half second (the tree), and every list is bounded.
import { connect, CanopyError } from "/canopy.js";

const $ = (id) => document.getElementById(id);
const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;

/** Rows the subscribe panel keeps; older ones are removed as new ones arrive. */
const MAX_ROWS = 500;
/** Rows one render adds at most: faster traffic is counted, not all drawn. */
const MAX_BATCH = 100;
/** The subscribe panel draws at most this often (ms): people read a few rows a second. */
const RENDER_EVERY = 100;
/** Subjects the tree loads; more are counted but not listed. */
const MAX_TREE_SUBJECTS = 20000;
/** Children shown under one tree node. */
const MAX_CHILDREN = 200;
/** History rows per page in the stream view. */
const HISTORY_PAGE = 50;
/** Overview samples kept per chart (one per second). */
const SAMPLES = 60;

// ---------------------------------------------------------------- formatting

function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false }) + `.${String(ms % 1000).padStart(3, "0")}`;
const number = (n) => (n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : n >= 1e4 ? `${(n / 1e3).toFixed(1)}k` : `${Math.round(n)}`);
const text = new TextDecoder("utf-8", { fatal: true });

/** A message's payload as one line for people: JSON, text, or hex for other bytes. */
function preview(data, limit = 300) {
  let shown;
  if (data instanceof Uint8Array) {
    try {
      shown = text.decode(data);
    } catch {
      shown = Array.from(data.slice(0, 64), (b) => b.toString(16).padStart(2, "0")).join(" ");
      if (data.length > 64) shown += " …";
    }
  } else {
    shown = JSON.stringify(data);
  }
  return shown.length > limit ? `${shown.slice(0, limit)}…` : shown;
}

function cell(row, value, className) {
  const td = row.insertCell();
  td.textContent = value;
  if (className) td.className = className;
  td.title = value;
  return td;
}

// ---------------------------------------------------------------- connection

let canopy = null;
const status = $("status");

/** The bearer token this tab logged in with (kept for the tab's life only). */
const token = () => sessionStorage.getItem("canopy-token") ?? undefined;

/** Whether the server requires logins, once it has said. */
let loginRequired;

/** Whether the server wants a token this tab does not have yet: then the form shows. */
/** The tab's token as HTTP headers, for the HTTP API (none before there is one). */
function authHeaders() {
  return token() === undefined ? {} : { Authorization: `Bearer ${token()}` };
}

/** GETs a JSON API path. */
async function getJson(path) {
  const response = await fetch(path, { cache: "no-store", headers: authHeaders() });
  const body = await response.json();
  if (!response.ok) throw new Error(body?.error?.description ?? `HTTP ${response.status}`);
  return body;
}

async function needsLogin() {
  try {
    const rules = await (await fetch("/api/login", { cache: "no-store" })).json();
    loginRequired = rules.required;
    return rules.required && !token();
  } catch {
    return false;
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("canopy-token", $("login-token").value.trim());
  $("login").hidden = true;
  start();
  tree.follow();
});

async function start() {
  if (await needsLogin()) {
    $("login").hidden = false;
    status.textContent = "log in with a token";
    return;
  }
  try {
    canopy = await connect(wsUrl, { token: token() });
  } catch {
    // A refused token looks like any failed connection: ask again.
    sessionStorage.removeItem("canopy-token");
    status.textContent = "cannot connect; retrying…";
    status.classList.add("down");
    setTimeout(start, 2000);
    return;
  }
  status.textContent = `connected to ${location.host}`;
  status.classList.remove("down");
  canopy.closed.then(({ code, reason }) => {
    status.textContent = `disconnected (${reason || code}); retrying…`;
    status.classList.add("down");
    canopy = null;
    subscribePanel.dropped();
    streamView.dropped();
    setTimeout(start, 2000);
  });
  await subscribePanel.resume();
  await streamView.resume();
}

// ---------------------------------------------------------------- views

const views = ["overview", "subscribe", "stream"];

function show(view) {
  for (const name of views) {
    $(`view-${name}`).hidden = name !== view;
    document.querySelector(`nav [data-view="${name}"]`).setAttribute("aria-selected", String(name === view));
  }
}

for (const button of document.querySelectorAll("nav button")) {
  button.addEventListener("click", () => {
    show(button.dataset.view);
    history.replaceState(null, "", `#${button.dataset.view}`);
  });
}

// ---------------------------------------------------------------- subject tree

/** A level of the subject tree; `own` counts the messages of the subject it names. */
class TreeNode {
  constructor(name, path, parent) {
    this.name = name;
    this.path = path;
    this.parent = parent;
    this.children = new Map();
    this.own = 0;
    this.isSubject = false;
    this.total = 0;
    this.last = 0;
    this.expanded = false;
  }
}

const tree = {
  root: new TreeNode("", "", null),
  subjects: 0,
  dirty: true,
  pressed: false,

  node(subject) {
    let node = this.root;
    for (const token of subject.split(".")) {
      let child = node.children.get(token);
      if (!child) {
        child = new TreeNode(token, node.path ? `${node.path}.${token}` : token, node);
        node.children.set(token, child);
      }
      node = child;
    }
    if (!node.isSubject) {
      node.isSubject = true;
      this.subjects += 1;
    }
    return node;
  },

  /** Sets a subject's message count and last activity, and its ancestors' totals. */
  set(subject, count, time) {
    const node = this.node(subject);
    const delta = count - node.own;
    node.own = count;
    for (let n = node; n; n = n.parent) {
      n.total += delta;
      if (time > n.last) n.last = time;
    }
    this.dirty = true;
  },

  /** A live message: its version is the count when stored, else one more than seen. */
  seen(msg) {
    // Request/reply inboxes are one-off conversations, not part of the tree.
    if (msg.subject.startsWith("_INBOX.")) return;
    const node = this.node(msg.subject);
    this.set(msg.subject, msg.version ?? node.own + 1, Date.now());
  },

  async load(client) {
    let after;
    let loaded = 0;
    do {
      const page = await client.subjects(">", { after, max: 1000 });
      for (const head of page.subjects) this.set(head.subject, head.version, head.time_ms);
      loaded += page.subjects.length;
      after = page.next ?? undefined;
    } while (after && loaded < MAX_TREE_SUBJECTS);
    $("tree-note").textContent = after ? `showing the first ${number(loaded)} subjects` : "";
  },

  /** Loads the stored subjects, then follows every message on its own connection. */
  async follow() {
    let client;
    try {
      if (await needsLogin()) return; // the login form starts the tree again
      client = await connect(wsUrl, { token: token() });
      await this.load(client);
      await client.subscribe(">", (msg) => this.seen(msg));
    } catch {
      setTimeout(() => this.follow(), 3000);
      return;
    }
    const { code } = await client.closed;
    if (code === 1008) {
      // Traffic faster than a browser should follow: poll the heads instead.
      $("tree-note").textContent = "traffic is too fast to follow live; refreshing every 5 s";
      setTimeout(() => this.follow(), 5000);
    } else {
      setTimeout(() => this.follow(), 2000);
    }
  },

  render() {
    // Replacing rows under a pressed button would swallow the click.
    if (!this.dirty || this.pressed) return;
    this.dirty = false;
    const filter = $("tree-filter").value.trim();
    const list = $("tree");
    const fragment = document.createDocumentFragment();
    this.renderChildren(this.root, fragment, filter);
    list.replaceChildren(fragment);
    if (this.root.children.size === 0) {
      const empty = document.createElement("li");
      empty.className = "more";
      empty.textContent = "no subjects yet";
      list.append(empty);
    }
  },

  renderChildren(node, into, filter) {
    const children = [...node.children.values()]
      .filter((c) => !filter || matchesBelow(c, filter))
      .sort((a, b) => a.name.localeCompare(b.name, undefined, { numeric: true }));
    for (const child of children.slice(0, MAX_CHILDREN)) {
      const item = document.createElement("li");
      item.setAttribute("role", "treeitem");
      const open = child.expanded || (filter && child.children.size > 0);
      const row = document.createElement("div");
      row.className = "node";
      if (Date.now() - child.last < 5000) row.classList.add("fresh");
      row.dataset.path = child.path;
      const caret = document.createElement("span");
      caret.className = "caret";
      caret.textContent = child.children.size ? (open ? "▾" : "▸") : "";
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = child.name;
      const count = document.createElement("span");
      count.className = "count";
      count.textContent = number(child.total);
      count.title = `${child.total} messages`;
      const age = document.createElement("span");
      age.className = "age";
      age.textContent = child.last ? ago(child.last) : "";
      age.title = child.last ? new Date(child.last).toLocaleString() : "";
      row.append(caret, name, count, age);
      item.append(row);
      if (open && child.children.size) {
        const sub = document.createElement("ul");
        sub.setAttribute("role", "group");
        this.renderChildren(child, sub, filter);
        item.append(sub);
      }
      into.append(item);
    }
    if (children.length > MAX_CHILDREN) {
      const more = document.createElement("li");
      more.className = "more";
      more.textContent = `… ${children.length - MAX_CHILDREN} more`;
      into.append(more);
    }
  },

  byPath(path) {
    let node = this.root;
    for (const token of path.split(".")) {
      node = node?.children.get(token);
    }
    return node;
  },
};

function matchesBelow(node, filter) {
  if (node.path.includes(filter)) return true;
  for (const child of node.children.values()) if (matchesBelow(child, filter)) return true;
  return false;
}

$("tree").addEventListener("click", (event) => {
  const row = event.target.closest(".node");
  if (!row) return;
  const node = tree.byPath(row.dataset.path);
  if (!node) return;
  const onCaret = event.target.classList.contains("caret");
  if (node.children.size && (onCaret || !node.isSubject)) node.expanded = !node.expanded;
  if (node.isSubject && !onCaret) streamView.open(node.path);
  tree.dirty = true;
  tree.render();
});
$("tree").addEventListener("pointerdown", () => (tree.pressed = true));
window.addEventListener("pointerup", () => setTimeout(() => (tree.pressed = false)));
$("tree-filter").addEventListener("input", () => {
  tree.dirty = true;
  tree.render();
});
setInterval(() => {
  tree.dirty = true; // the ages move on even when nothing arrives
  tree.render();
}, 1000);
setInterval(() => tree.dirty && tree.render(), 500);

// ---------------------------------------------------------------- subscribe panel

const subscribePanel = {
  pattern: null,
  subscription: null,
  paused: false,
  pending: [],
  received: 0,
  skipped: 0,
  lastCount: 0,
  scheduled: false,

  async subscribe(pattern) {
    await this.unsubscribe();
    this.pattern = pattern;
    this.received = 0;
    this.skipped = 0;
    this.lastCount = 0;
    this.pending = [];
    $("sub-list").replaceChildren();
    await this.resume();
  },

  /** (Re)subscribes on the current connection. */
  async resume() {
    if (!this.pattern || !canopy) return;
    try {
      this.subscription = await canopy.subscribe(this.pattern, (msg) => this.arrived(msg));
      $("sub-state").textContent = `subscribed to ${this.pattern}`;
      $("sub-state").className = "";
      $("sub-pause").disabled = false;
    } catch (error) {
      $("sub-state").textContent = error instanceof CanopyError ? error.message : String(error);
      $("sub-state").className = "error";
      this.pattern = null;
    }
  },

  dropped() {
    this.subscription = null;
    if (this.pattern) $("sub-state").textContent = `reconnecting to ${this.pattern}…`;
  },

  async unsubscribe() {
    const subscription = this.subscription;
    this.subscription = null;
    if (subscription && canopy) await subscription.unsubscribe().catch(() => {});
  },

  arrived(msg) {
    this.received += 1;
    this.pending.push({ msg, at: Date.now() });
    if (this.pending.length > MAX_ROWS) {
      this.skipped += this.pending.length - MAX_ROWS;
      this.pending.splice(0, this.pending.length - MAX_ROWS);
    }
    if (!this.paused && !this.scheduled) {
      this.scheduled = true;
      setTimeout(() => requestAnimationFrame(() => this.render()), RENDER_EVERY);
    }
  },

  /** One batch: everything that arrived since the last frame, newest on top. */
  render() {
    this.scheduled = false;
    if (this.paused || this.pending.length === 0) return;
    const body = $("sub-list");
    const fragment = document.createDocumentFragment();
    const first = Math.max(0, this.pending.length - MAX_BATCH);
    this.skipped += first;
    // Only a small batch is highlighted: animating hundreds of rows at once is what
    // makes a page stutter.
    const highlight = this.pending.length - first <= 20;
    for (let i = this.pending.length - 1; i >= first; i--) {
      const { msg, at } = this.pending[i];
      const row = document.createElement("tr");
      if (highlight) row.className = "new";
      row.dataset.subject = msg.subject;
      row.insertCell().textContent = clock(at);
      row.insertCell().textContent = msg.subject;
      row.insertCell().textContent = msg.version ?? "–";
      cell(row, preview(msg.data), "payload");
      fragment.append(row);
    }
    this.pending = [];
    body.prepend(fragment);
    const extra = body.rows.length - MAX_ROWS;
    if (extra > 0) {
      const range = document.createRange();
      range.setStartBefore(body.rows[MAX_ROWS]);
      range.setEndAfter(body.rows[body.rows.length - 1]);
      range.deleteContents();
    }
    this.counters();
  },

  counters() {
    $("sub-count").textContent = number(this.received);
    $("sub-count").dataset.count = this.received;
    $("sub-skipped").textContent = number(this.skipped);
  },

  togglePause() {
    this.paused = !this.paused;
    $("sub-pause").textContent = this.paused ? "Resume" : "Pause";
    if (!this.paused) this.render();
  },
};

$("sub-form").addEventListener("submit", (event) => {
  event.preventDefault();
  subscribePanel.subscribe($("sub-pattern").value.trim());
});
$("sub-pause").addEventListener("click", () => subscribePanel.togglePause());
$("sub-clear").addEventListener("click", () => {
  $("sub-list").replaceChildren();
  subscribePanel.pending = [];
});
setInterval(() => {
  const panel = subscribePanel;
  $("sub-rate").textContent = number(panel.received - panel.lastCount);
  panel.lastCount = panel.received;
  panel.counters();
}, 1000);

// ---------------------------------------------------------------- stream view

const streamView = {
  subject: null,
  follow: null,
  oldest: null,
  head: 0,

  async open(subject) {
    show("stream");
    history.replaceState(null, "", `#stream=${encodeURIComponent(subject)}`);
    $("stream-subject").value = subject;
    if (this.follow) await this.follow.unsubscribe().catch(() => {});
    this.follow = null;
    this.subject = subject;
    $("stream-history").replaceChildren();
    $("pub-result").textContent = "";
    $("pub-result").className = "";
    $("stream-body").hidden = false;
    await this.resume();
  },

  dropped() {
    this.follow = null;
  },

  /** Reads the head, the snapshot and the newest history, then follows live. */
  async resume() {
    const subject = this.subject;
    if (!subject || !canopy) return;
    $("stream-history").replaceChildren();
    let head = null;
    try {
      head = await canopy.get(subject);
    } catch (error) {
      if (!(error instanceof CanopyError && error.code === "not_found")) return this.failed(error);
    }
    this.setHead(head?.version ?? 0, head?.time_ms);
    try {
      const snapshot = await canopy.snapshot(subject);
      const box = document.createElement("div");
      box.textContent = `version ${snapshot.version}, taken ${new Date(snapshot.time_ms).toLocaleString()}`;
      const pre = document.createElement("pre");
      pre.className = "json";
      pre.textContent = preview(snapshot.data, 4000);
      $("stream-snapshot").replaceChildren(box, pre);
    } catch (error) {
      $("stream-snapshot").textContent =
        error instanceof CanopyError && error.code === "not_found" ? "none" : String(error.message);
    }
    await this.schema();
    this.oldest = this.head + 1;
    await this.older();
    try {
      this.follow = await canopy.subscribe(subject, (msg) => this.live(msg));
    } catch (error) {
      this.failed(error);
    }
  },

  /** The schema the subject falls under, and the messages it refused lately. */
  async schema() {
    const subject = encodeURIComponent(this.subject);
    try {
      const [binding] = (await getJson(`/api/schemas?subject=${subject}`)).schemas;
      if (!binding) {
        $("stream-schema").textContent = "none: payloads are not checked";
      } else {
        const box = document.createElement("div");
        const invalid = binding.on_invalid === "dead_letter" ? `kept under ${binding.dead_letter}.${this.subject}` : "refused";
        box.textContent = `${binding.pattern} version ${binding.version} (${binding.mode}; invalid messages ${invalid})`;
        const pre = document.createElement("pre");
        pre.className = "json";
        pre.textContent = JSON.stringify(binding.schema, null, 2);
        $("stream-schema").replaceChildren(box, pre);
      }
      const { errors } = await getJson(`/api/schema-errors?subject=${subject}`);
      if (!errors.length) {
        $("stream-errors").textContent = "none";
      } else {
        const list = document.createElement("ul");
        for (const error of errors.slice(-10).reverse()) {
          const item = document.createElement("li");
          item.textContent = `${clock(error.time_ms)} ${error.schema} at ${error.path || "/"}: ${error.message}${error.dead_lettered ? " (dead-lettered)" : ""}`;
          list.append(item);
        }
        $("stream-errors").replaceChildren(list);
      }
    } catch (error) {
      $("stream-schema").textContent = String(error.message ?? error);
    }
  },

  setHead(version, time) {
    this.head = version;
    $("stream-head").textContent = version
      ? `version ${version}${time ? `, ${new Date(time).toLocaleString()}` : ""}`
      : "no stored messages yet";
    $("pub-expect").placeholder = `any (head: ${version})`;
  },

  /** The page of history before the oldest row shown. */
  async older() {
    if (this.oldest <= 1) return;
    const from = Math.max(1, this.oldest - HISTORY_PAGE);
    try {
      const page = await canopy.replay({ subject: this.subject }, { fromVersion: from, max: this.oldest - from });
      const body = $("stream-history");
      for (const msg of page.messages.filter((m) => m.version < this.oldest).reverse()) {
        body.append(this.row(msg));
      }
    } catch (error) {
      return this.failed(error);
    }
    this.oldest = from;
    $("history-older").hidden = from <= 1;
  },

  row(msg) {
    const row = document.createElement("tr");
    row.dataset.version = msg.version;
    cell(row, msg.version);
    cell(row, msg.time_ms ? clock(msg.time_ms) : clock(Date.now()));
    cell(row, msg.offset ?? "–");
    cell(row, msg.headers?.["Canopy-Schema"] ?? "–");
    cell(row, preview(msg.data), "payload");
    return row;
  },

  live(msg) {
    if (msg.version !== undefined && msg.version <= this.head) return;
    if (msg.version !== undefined) this.setHead(msg.version, Date.now());
    const row = this.row(msg);
    row.className = "new";
    $("stream-history").prepend(row);
  },

  failed(error) {
    $("stream-head").textContent = error instanceof CanopyError ? error.message : String(error.message ?? error);
  },

  async publish() {
    const result = $("pub-result");
    const raw = $("pub-data").value;
    let data;
    try {
      data = JSON.parse(raw);
    } catch {
      data = new TextEncoder().encode(raw);
    }
    const expected = $("pub-expect").value.trim();
    const options = expected === "" ? {} : { expectVersion: Number(expected) };
    result.className = "";
    result.textContent = "publishing…";
    try {
      const ack = await canopy.publish(this.subject, data, options);
      result.className = "ok";
      result.textContent = ack.stored ? `stored as version ${ack.version}` : "published (this subject is not stored)";
    } catch (error) {
      if (error instanceof CanopyError && error.code === "conflict") {
        result.className = "conflict";
        result.textContent = `Conflict: ${this.subject} is at version ${error.currentVersion}, not ${expected}. Nothing was stored.`;
        const retry = document.createElement("button");
        retry.type = "button";
        retry.textContent = `expect ${error.currentVersion}`;
        retry.addEventListener("click", () => {
          $("pub-expect").value = error.currentVersion;
        });
        result.append(retry);
      } else {
        result.className = "error";
        result.textContent = error instanceof CanopyError ? `${error.code}: ${error.message}` : String(error.message);
        if (error instanceof CanopyError && error.code === "invalid_message") await this.schema();
      }
    }
  },
};

$("stream-form").addEventListener("submit", (event) => {
  event.preventDefault();
  streamView.open($("stream-subject").value.trim());
});
$("pub-form").addEventListener("submit", (event) => {
  event.preventDefault();
  streamView.publish();
});
$("history-older").addEventListener("click", () => streamView.older());

// ---------------------------------------------------------------- overview

/** Parses Prometheus text into `name{labels}` → value. */
function parseMetrics(body) {
  const values = new Map();
  for (const line of body.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    values.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return values;
}

/** The p99 (seconds, a bucket's upper bound) of what a histogram saw between two samples. */
function p99(now, before, name) {
  const buckets = [];
  for (const [key, value] of now) {
    const match = key.match(new RegExp(`^${name}_bucket\\{le="([^"]+)"\\}$`));
    if (match) buckets.push([match[1] === "+Inf" ? Infinity : Number(match[1]), value - (before.get(key) ?? 0)]);
  }
  buckets.sort((a, b) => a[0] - b[0]);
  const total = buckets.at(-1)?.[1] ?? 0;
  if (total <= 0) return null;
  for (const [bound, count] of buckets) if (count >= total * 0.99) return bound;
  return null;
}

const charts = {
  connections: { series: {}, colors: { native: "#2f6fdf", mqtt: "#2f9f6f", websocket: "#b7791f" } },
  rates: { series: { in: [], out: [] }, colors: { in: "#2f6fdf", out: "#2f9f6f" } },
  drops: { series: { drops: [] }, colors: { drops: "#c43c3c" } },
  latency: { series: { write: [], durable: [] }, colors: { write: "#2f6fdf", durable: "#b7791f" }, unit: "ms" },
};

function push(series, value) {
  series.push(value);
  if (series.length > SAMPLES) series.shift();
}

function draw(name) {
  const { series, colors, unit } = charts[name];
  const canvas = $(`chart-${name}`);
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 320;
  const height = canvas.clientHeight || 90;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  const all = Object.values(series).flat().filter((v) => v !== null);
  const top = Math.max(1e-9, ...all) * 1.15;
  g.strokeStyle = "#e2e5eb";
  g.beginPath();
  g.moveTo(0, height - 0.5);
  g.lineTo(width, height - 0.5);
  g.stroke();
  g.fillStyle = "#6b7385";
  g.font = "10px system-ui, sans-serif";
  g.fillText(all.length ? `${number(top / 1.15)}${unit ? ` ${unit}` : ""}` : "", 2, 10);
  for (const [key, values] of Object.entries(series)) {
    g.strokeStyle = colors[key] ?? "#444";
    g.lineWidth = 1.5;
    g.beginPath();
    let drawing = false;
    values.forEach((v, i) => {
      const x = width - (values.length - 1 - i) * (width / (SAMPLES - 1));
      if (v === null) {
        drawing = false;
        return;
      }
      const y = height - 2 - (v / top) * (height - 14);
      if (drawing) g.lineTo(x, y);
      else g.moveTo(x, y);
      drawing = true;
    });
    g.stroke();
  }
}

const overview = {
  before: null,
  beforeAt: 0,

  async sample() {
    let now;
    try {
      // With logins required, /metrics wants the token too (a tenant's user sees
      // only its tenant's lines); until there is one, there is nothing to ask.
      if (loginRequired === undefined) await needsLogin();
      if (loginRequired && token() === undefined) return;
      const response = await fetch("/metrics", { cache: "no-store", headers: authHeaders() });
      if (!response.ok) return;
      now = parseMetrics(await response.text());
    } catch {
      return;
    }
    const at = performance.now();
    const protocols = [...now.keys()]
      .map((k) => k.match(/^canopy_connections\{protocol="([^"]+)"\}$/)?.[1])
      .filter(Boolean);
    const connections = charts.connections.series;
    for (const protocol of protocols) {
      push((connections[protocol] ??= []), now.get(`canopy_connections{protocol="${protocol}"}`));
    }
    $("ov-connections").textContent = protocols
      .map((p) => `${p} ${now.get(`canopy_connections{protocol="${p}"}`)}`)
      .join(" · ");
    $("legend-connections").replaceChildren(
      ...protocols.map((p) => Object.assign(document.createElement("span"), { className: `key ${p}`, textContent: p })),
    );
    const drops = () =>
      (now.get("canopy_slow_consumers_total") ?? 0) +
      (now.get("canopy_dropped_total") ?? 0) +
      (now.get("canopy_stale_connections_total") ?? 0);
    if (this.before) {
      const seconds = (at - this.beforeAt) / 1000;
      const rate = (name) => Math.max(0, (now.get(name) - (this.before.get(name) ?? 0)) / seconds);
      const rateIn = rate("canopy_messages_in_total");
      const rateOut = rate("canopy_messages_out_total");
      push(charts.rates.series.in, rateIn);
      push(charts.rates.series.out, rateOut);
      $("ov-rates").textContent = `in ${number(rateIn)} · out ${number(rateOut)}`;
      const before = this.before;
      const dropRate =
        Math.max(0, drops() - ((before.get("canopy_slow_consumers_total") ?? 0) + (before.get("canopy_dropped_total") ?? 0) + (before.get("canopy_stale_connections_total") ?? 0))) /
        seconds;
      push(charts.drops.series.drops, dropRate);
      const write = p99(now, before, "canopy_store_write_seconds");
      const durable = p99(now, before, "canopy_store_durable_seconds");
      push(charts.latency.series.write, write === null || write === Infinity ? null : write * 1000);
      push(charts.latency.series.durable, durable === null || durable === Infinity ? null : durable * 1000);
      const ms = (v) => (v === null ? "idle" : v === Infinity ? "> 10 s" : `≤ ${v * 1000} ms`);
      $("ov-latency").textContent = `write ${ms(write)} · durable ${ms(durable)}`;
    }
    cluster.on = now.has("canopy_cluster_nodes");
    $("ov-drops").textContent = `${number(now.get("canopy_slow_consumers_total") ?? 0)} slow · ${number(now.get("canopy_dropped_total") ?? 0)} dropped`;
    const facts = [
      // The default tenant's, or to a tenant's user that tenant's.
      ["subjects", [...now].find(([key]) => key.startsWith("canopy_subjects{"))?.[1]],
      ["subscriptions", now.get("canopy_subscriptions")],
      ["MQTT sessions", now.get("canopy_mqtt_sessions")],
      ["connections since start", now.get("canopy_connections_total")],
      ["messages in", now.get("canopy_messages_in_total")],
      ["messages out", now.get("canopy_messages_out_total")],
    ];
    $("ov-facts").replaceChildren(
      ...facts
        .filter(([, v]) => v !== undefined)
        .map(([label, value]) => {
          const row = document.createElement("tr");
          cell(row, label);
          cell(row, value.toLocaleString());
          return row;
        }),
    );
    this.before = now;
    this.beforeAt = at;
    if (!$("view-overview").hidden) for (const name of Object.keys(charts)) draw(name);
  },
};

// ---------------------------------------------------------------- cluster

/** The cluster's nodes, when this server is one node of several (`/api/cluster`). */
const cluster = {
  /** Set by the overview when /metrics shows cluster lines (to the operator only). */
  on: false,

  async sample() {
    if (!this.on) return;
    let status;
    try {
      const response = await fetch("/api/cluster", { cache: "no-store", headers: authHeaders() });
      if (!response.ok) return; // alone (404), or not the operator's to see
      status = await response.json();
    } catch {
      return;
    }
    const owned = status.owners.filter((s) => s.owner).length;
    $("ov-cluster-title").textContent =
      `Cluster ${status.cluster}: ${status.nodes.length} nodes, ${owned} of ${status.shards} shards owned`;
    const offsets = (id) =>
      status.owners
        .filter((s) => s.owner === id)
        .map((s) => `${s.shard}: ${s.offset ?? "–"}`)
        .join(" · ");
    $("ov-nodes").replaceChildren(
      ...status.nodes.map((node) => {
        const row = document.createElement("tr");
        cell(row, node.id);
        cell(row, node.native);
        cell(row, node.mqtt ?? "–");
        cell(row, node.http ?? "–");
        cell(row, String(node.shards));
        cell(row, offsets(node.id));
        return row;
      }),
    );
    $("ov-cluster").hidden = false;
  },
};

// ---------------------------------------------------------------- start

function route() {
  const hash = decodeURIComponent(location.hash.slice(1));
  if (hash.startsWith("stream=")) return streamView.open(hash.slice("stream=".length));
  if (views.includes(hash)) show(hash);
}

overview.sample();
setInterval(() => overview.sample(), 1000);
cluster.sample();
setInterval(() => cluster.sample(), 3000);
tree.follow();
await start();
route();
