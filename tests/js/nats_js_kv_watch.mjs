// nats.js (npm `nats` 2.29, unmodified) NATS KV watching against Canopy: keys,
// history, watch (initial values, then live updates; one key, a wildcard, with
// history, headers only, updates only), an ordered consumer over a stream, and a
// push consumer with acks. The KV calls are ordered push consumers that nats.js
// checks for gaps by consumer sequence and by idle heartbeat.
//
// Usage: node nats_js_kv_watch.mjs host:port. Prints "all checks passed".

import { connect, consumerOpts, createInbox, StringCodec } from "nats";

import { check, fail } from "./checks.mjs";

const sc = StringCodec();
const collect = async (iterator) => {
  const out = [];
  for await (const item of iterator) {
    out.push(item);
  }
  return out;
};
// The next `n` entries of a watch, failing after five seconds. A watch is iterated
// once, so its iterator is kept with it.
const iterators = new Map();
const take = async (watch, n) => {
  if (!iterators.has(watch)) {
    iterators.set(watch, watch[Symbol.asyncIterator]());
  }
  const iterator = iterators.get(watch);
  const out = [];
  const timer = setTimeout(() => fail(`a watch gave ${out.length} of ${n} entries`), 5000);
  while (out.length < n) {
    const { value, done } = await iterator.next();
    if (done) {
      break;
    }
    out.push(value);
  }
  clearTimeout(timer);
  return out;
};

const nc = await connect({ servers: process.argv[2], timeout: 5000 });
try {
  const js = nc.jetstream({ timeout: 5000 });
  const kv = await js.views.kv("watched", { history: 10 });

  check((await collect(await kv.keys())).length === 0, "an empty bucket has no keys");
  const revisions = [];
  revisions.push(await kv.put("a", sc.encode("1")));
  await kv.put("b", sc.encode("2"));
  await kv.put("c.dot", sc.encode("3"));
  revisions.push(await kv.put("a", sc.encode("4")));
  await kv.delete("b");

  const keys = (await collect(await kv.keys())).sort();
  check(JSON.stringify(keys) === JSON.stringify(["a", "c.dot"]), `keys: ${keys}`);
  const history = await collect(await kv.history({ key: "a" }));
  check(
    JSON.stringify(history.map((e) => e.revision)) === JSON.stringify(revisions),
    `history of a: ${history.map((e) => e.revision)} (put ${revisions})`,
  );

  // watch: the last value of each key, then live updates.
  let initialDone = false;
  const watch = await kv.watch({ initializedFn: () => (initialDone = true) });
  const first = await take(watch, 3);
  check(
    JSON.stringify(first.map((e) => [e.key, e.operation])) ===
      JSON.stringify([["c.dot", "PUT"], ["a", "PUT"], ["b", "DEL"]]),
    `initial values: ${JSON.stringify(first.map((e) => [e.key, e.operation]))}`,
  );
  const rev = await kv.put("a", sc.encode("5"));
  const [live] = await take(watch, 1);
  // nats.js calls it from the iterator, after the last initial value.
  check(initialDone, "the watch did not say its initial values were done");
  check(live.key === "a" && sc.decode(live.value) === "5" && live.revision === rev, `live: ${live.key}@${live.revision}`);
  watch.stop();

  // One key with its history, headers only.
  const meta = await kv.watch({ key: "a", include: "history", headers_only: true });
  const metaEntries = await take(meta, 3);
  check(
    JSON.stringify(metaEntries.map((e) => e.revision)) === JSON.stringify([...revisions, rev]),
    `history watch: ${metaEntries.map((e) => e.revision)}`,
  );
  check(metaEntries.every((e) => e.value.length === 0), "headers_only sent values");
  meta.stop();

  // Updates only, on a wildcard of keys.
  const updates = await kv.watch({ key: "c.>", include: "updates" });
  await kv.put("c.new", sc.encode("n"));
  const [update] = await take(updates, 1);
  check(update.key === "c.new", `updates only gave ${update.key}`);
  updates.stop();

  // An ordered consumer over a stream: every message, then live.
  const jsm = await nc.jetstreamManager();
  await jsm.streams.add({ name: "ORD", subjects: ["ord.>"] });
  for (let i = 0; i < 5; i++) {
    await js.publish(`ord.${i % 2}`, sc.encode(`m${i}`));
  }
  const opts = consumerOpts();
  opts.orderedConsumer();
  const messages = await js.subscribe("ord.>", opts);
  const got = [];
  for await (const m of messages) {
    got.push(sc.decode(m.data));
    if (got.length === 5) {
      await js.publish("ord.9", sc.encode("live"));
    }
    if (got.length === 6) {
      break;
    }
  }
  check(JSON.stringify(got) === JSON.stringify(["m0", "m1", "m2", "m3", "m4", "live"]), `ordered: ${got}`);

  // A push consumer with acks: what is stored, then what comes; each acked.
  const pushOpts = consumerOpts();
  pushOpts.deliverTo(createInbox());
  pushOpts.ackExplicit();
  pushOpts.manualAck();
  const pushed = await js.subscribe("ord.>", pushOpts);
  const pushedGot = [];
  for await (const m of pushed) {
    pushedGot.push(sc.decode(m.data));
    m.ack();
    if (pushedGot.length === 6) {
      break;
    }
  }
  // As a pull consumer's: in order per subject (ord.0: m0 m2 m4; ord.1: m1 m3).
  check(
    [...pushedGot].sort().join(",") === "live,m0,m1,m2,m3,m4" &&
      pushedGot.filter((m) => ["m0", "m2", "m4"].includes(m)).join(",") === "m0,m2,m4" &&
      pushedGot.filter((m) => ["m1", "m3"].includes(m)).join(",") === "m1,m3",
    `push with acks: ${pushedGot}`,
  );

  await kv.destroy();
  await jsm.streams.delete("ORD");
} catch (error) {
  fail(`${error?.code ?? ""} ${error?.message ?? error}`);
}
await nc.close();
console.log("all checks passed");
