// nats.js (npm `nats` 2.29, unmodified) ordered pull consumers against Canopy, as its
// README shows them: `js.consumers.get(stream)` without a name is an ordered consumer,
// which nats.js makes as consumers without acks named `<nuid>_<serial>` and pulls with
// `CONSUMER.MSG.NEXT`: consume() (history in order, then live), fetch() and next(),
// filters, a start sequence, a fetch of nothing that ends on the server's 408, and an
// ordered consumer reset when its consumer vanishes under it.
//
// Usage: node nats_js_ordered.mjs host:port. Prints "all checks passed".

import { connect, StringCodec } from "nats";

import { check, fail } from "./checks.mjs";

const sc = StringCodec();
const nc = await connect({ servers: process.argv[2], timeout: 5000 });
try {
  const jsm = await nc.jetstreamManager();
  await jsm.streams.add({ name: "EVENTS", subjects: ["events.>"] });
  const js = nc.jetstream({ timeout: 5000 });
  for (let i = 1; i <= 50; i++) {
    await js.publish(i % 2 ? "events.a" : "events.b", sc.encode(`e${i}`));
  }

  // consume(): all 50 in stream order, then what comes live.
  const oc = await js.consumers.get("EVENTS");
  const messages = await oc.consume({ max_messages: 20 });
  const seen = [];
  let last = 0;
  for await (const m of messages) {
    check(m.seq > last, `stream order: ${m.seq} after ${last}`);
    last = m.seq;
    seen.push(sc.decode(m.data));
    if (seen.length === 50) {
      for (let i = 51; i <= 55; i++) {
        await js.publish("events.a", sc.encode(`e${i}`));
      }
    }
    if (seen.length === 55) {
      break;
    }
  }
  const expected = Array.from({ length: 55 }, (_, i) => `e${i + 1}`);
  check(JSON.stringify(seen) === JSON.stringify(expected), `consume: ${seen}`);

  // fetch() with a filter, then next().
  const bs = await js.consumers.get("EVENTS", { filterSubjects: "events.b" });
  const fetched = [];
  for await (const m of await bs.fetch({ max_messages: 10, expires: 2000 })) {
    check(m.subject === "events.b", `a filtered fetch gives events.b: ${m.subject}`);
    fetched.push(sc.decode(m.data));
  }
  check(fetched.length === 10 && fetched[0] === "e2" && fetched[9] === "e20", `fetch: ${fetched}`);
  const after = await bs.next({ expires: 2000 });
  check(after !== null && sc.decode(after.data) === "e22", `next after the fetch: ${after && sc.decode(after.data)}`);

  // From a start sequence.
  const from = await js.consumers.get("EVENTS", { opt_start_seq: 40 });
  const at40 = await from.next({ expires: 2000 });
  check(at40 !== null && at40.seq === 40 && sc.decode(at40.data) === "e40", `opt_start_seq: ${at40 && at40.seq}`);
  const info = await from.info();
  check(info.config.ack_policy === "none" && info.name.endsWith("_1"), `its consumer: ${JSON.stringify(info.config)}`);

  // A fetch of nothing ends when its expires passes (the server's 408), empty.
  const fresh = await js.consumers.get("EVENTS", { deliver_policy: "new" });
  const started = Date.now();
  let none = 0;
  for await (const _ of await fresh.fetch({ max_messages: 5, expires: 1000 })) {
    none++;
  }
  check(none === 0 && Date.now() - started < 4000, `an empty fetch ended in ${Date.now() - started} ms with ${none}`);

  // The consumer deleted under a running consume(): nats.js makes a new one from
  // where it was, and nothing is lost or repeated. (It notices when its pull ends,
  // after `expires`, against nats-server as here: a short one keeps the check quick.)
  const again = await js.consumers.get("EVENTS", { filterSubjects: "events.a" });
  const iter = await again.consume({ max_messages: 5, expires: 2000 });
  const got = [];
  let deleted = false;
  for await (const m of iter) {
    got.push(sc.decode(m.data));
    if (!deleted && got.length === 3) {
      deleted = true;
      const name = (await again.info(true)).name;
      await jsm.consumers.delete("EVENTS", name);
      await js.publish("events.a", sc.encode("after-reset"));
    }
    if (got.at(-1) === "after-reset") {
      break;
    }
  }
  const wanted = [...expected.filter((_, i) => i % 2 === 0 || i >= 50), "after-reset"];
  check(JSON.stringify(got) === JSON.stringify(wanted), `across the reset: ${got}`);
  await again.delete();
} catch (error) {
  fail(`${error?.code ?? ""} ${error?.message ?? error}`);
}
await nc.close();
console.log("all checks passed");
