// nats.js (npm `nats` 2.29, unmodified) against Canopy with the default config
// (every subject stored but `_INBOX.>`): core publish and subscribe, with and
// without headers; request/reply between two nats.js connections; and JetStream
// publishes. nats.js sends `js.publish(subject, data)` without options as an HPUB
// whose header block is empty (`HPUB <subject> <reply> 0 <#total>`), which
// nats-server takes as a message without headers: it must be stored, answered
// with a PubAck and delivered as a plain MSG.
//
// Usage: node nats_js_clients.mjs host:port. Prints "all checks passed".

import { connect, headers, StringCodec } from "nats";

import { check, fail } from "./checks.mjs";

const sc = StringCodec();

// Each step names itself, so a timeout says which step hung.
const step = async (name, body) => {
  try {
    await body();
  } catch (error) {
    fail(`${name}: ${error?.code ?? ""} ${error?.message ?? error}`);
  }
};

// One iterator per subscription: nats.js refuses a second while the first is open.
const iterators = new WeakMap();

// The next message of `sub`, or a failure naming `what` after five seconds.
const nextOf = async (sub, what) => {
  if (!iterators.has(sub)) {
    iterators.set(sub, sub[Symbol.asyncIterator]());
  }
  const iter = iterators.get(sub);
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no message for ${what} within 5s`)), 5000);
  });
  try {
    const next = await Promise.race([iter.next(), timeout]);
    check(!next.done, `${what}: the subscription ended`);
    return next.value;
  } finally {
    clearTimeout(timer);
  }
};

const nc = await connect({ servers: process.argv[2], reconnect: false });
const peer = await connect({ servers: process.argv[2], reconnect: false });
const js = nc.jetstream();

await step("plain publish and subscribe", async () => {
  const sub = peer.subscribe("natsjs.plain");
  await peer.flush();
  nc.publish("natsjs.plain", sc.encode("hello"));
  const msg = await nextOf(sub, "natsjs.plain");
  check(sc.decode(msg.data) === "hello", `payload: ${sc.decode(msg.data)}`);
  check(msg.headers === undefined, "a publish without headers arrives without headers");
  sub.unsubscribe();
});

await step("publish with headers", async () => {
  const sub = peer.subscribe("natsjs.headed");
  await peer.flush();
  const h = headers();
  h.set("X-Trace", "t1");
  nc.publish("natsjs.headed", sc.encode("with headers"), { headers: h });
  const msg = await nextOf(sub, "natsjs.headed");
  check(sc.decode(msg.data) === "with headers", `payload: ${sc.decode(msg.data)}`);
  check(msg.headers?.get("X-Trace") === "t1", `headers: ${msg.headers}`);
  sub.unsubscribe();
});

await step("request/reply", async () => {
  const service = peer.subscribe("svc.natsjs.echo", {
    callback: (err, msg) => {
      if (!err) {
        msg.respond(sc.encode(`echo:${sc.decode(msg.data)}`));
      }
    },
  });
  await peer.flush();
  const answer = await nc.request("svc.natsjs.echo", sc.encode("ping"), { timeout: 5000 });
  check(sc.decode(answer.data) === "echo:ping", `answer: ${sc.decode(answer.data)}`);
  service.unsubscribe();
});

// A wildcard watcher outside any queue group sees stored publishes without making
// them requests (only an exact or queue subscription answers).
const watch = peer.subscribe("natsjs.stored.>");
await peer.flush();

await step("JetStream publish without options", async () => {
  // As in NATS: no stream holds the subject, so no responders (and nothing stored).
  let refused;
  try {
    await js.publish("natsjs.nostream.x", sc.encode("nobody"));
  } catch (error) {
    refused = error;
  }
  check(refused?.code === "503", `a publish no stream holds: ${refused?.code} ${refused?.message}`);
  const jsm = await nc.jetstreamManager();
  await jsm.streams.add({ name: "NATSJS", subjects: ["natsjs.stored.>"] });
  const first = await js.publish("natsjs.stored.plain", sc.encode("one"));
  check(first.stream === "NATSJS", `stream: ${JSON.stringify(first)}`);
  check(first.seq > 0, `seq: ${JSON.stringify(first)}`);
  check(first.duplicate === false, `duplicate: ${JSON.stringify(first)}`);
  const second = await js.publish("natsjs.stored.plain", sc.encode("two"));
  check(second.seq > first.seq, `seq grows: ${first.seq} then ${second.seq}`);
  for (const expected of ["one", "two"]) {
    const msg = await nextOf(watch, `watched ${expected}`);
    check(msg.subject === "natsjs.stored.plain", `subject: ${msg.subject}`);
    check(sc.decode(msg.data) === expected, `payload: ${sc.decode(msg.data)}`);
    // nats-server delivers an empty header block as a plain MSG.
    check(msg.headers === undefined, `an empty header block arrives as none: ${msg.headers}`);
  }
});

await step("JetStream publish with headers", async () => {
  const h = headers();
  h.set("X-Trace", "t2");
  const ack = await js.publish("natsjs.stored.headed", sc.encode("headed"), { headers: h });
  check(ack.stream === "NATSJS" && ack.seq > 0, `ack: ${JSON.stringify(ack)}`);
  const msg = await nextOf(watch, "watched headed");
  check(sc.decode(msg.data) === "headed", `payload: ${sc.decode(msg.data)}`);
  check(msg.headers?.get("X-Trace") === "t2", `headers: ${msg.headers}`);
});

await step("JetStream publish with a msgID", async () => {
  const first = await js.publish("natsjs.stored.dedupe", sc.encode("once"), {
    msgID: "natsjs-dedupe-1",
  });
  const again = await js.publish("natsjs.stored.dedupe", sc.encode("once"), {
    msgID: "natsjs-dedupe-1",
  });
  check(first.duplicate === false, `first: ${JSON.stringify(first)}`);
  check(again.duplicate === true, `again: ${JSON.stringify(again)}`);
  check(again.seq === first.seq, `the duplicate names the first: ${first.seq} ${again.seq}`);
  const msg = await nextOf(watch, "watched dedupe");
  check(sc.decode(msg.data) === "once", `payload: ${sc.decode(msg.data)}`);
});

await step("JetStream publish with expect.lastSubjectSequence", async () => {
  const subject = "natsjs.stored.seq";
  const first = await js.publish(subject, sc.encode("one"), {
    expect: { lastSubjectSequence: 0 },
  });
  const second = await js.publish(subject, sc.encode("two"), {
    expect: { lastSubjectSequence: first.seq },
  });
  check(second.seq > first.seq, `seq grows: ${first.seq} then ${second.seq}`);
  let refused;
  try {
    await js.publish(subject, sc.encode("three"), {
      expect: { lastSubjectSequence: first.seq },
    });
  } catch (error) {
    refused = error;
  }
  check(refused !== undefined, "a stale last subject sequence is refused");
  check(
    refused.api_error?.err_code === 10071,
    `JetStream's wrong-last-sequence error: ${refused.code} ${refused.message}`,
  );
  for (const expected of ["one", "two"]) {
    const msg = await nextOf(watch, `watched seq ${expected}`);
    check(sc.decode(msg.data) === expected, `payload: ${sc.decode(msg.data)}`);
  }
});

await step("the connections are still open", async () => {
  await nc.flush();
  await peer.flush();
  check(!nc.isClosed() && !peer.isClosed(), "a connection closed");
});

for (const conn of [nc, peer]) {
  await conn.close();
  const closedWith = await conn.closed();
  check(!closedWith, `closed with an error: ${closedWith}`);
}
console.log("all checks passed");
