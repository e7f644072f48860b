// web/canopy.js (the module /canopy.js serves) against a running Canopy, run by
// tests/it/js.rs. Node has no WebSocket of its own in every version, so the `ws`
// package stands in for the browser's. Usage: node canopy_js_check.mjs ws://HOST:PORT/ws
import WebSocket from "ws";
import { connect, CanopyError } from "../../web/canopy.js";

const [url] = process.argv.slice(2);
const fail = (why) => {
  console.error(`FAIL: ${why}`);
  process.exit(1);
};
setTimeout(() => fail("timed out"), 20000).unref();
const check = (ok, why) => ok || fail(why);

const canopy = await connect(url, { WebSocket });
const seen = [];
const sub = await canopy.subscribe("devices/+/temp", (msg) => seen.push(msg));
const ack = await canopy.publish("devices.1.temp", { t: 20 }, { expectVersion: 0 });
check(ack.version === 1, `first ack ${JSON.stringify(ack)}`);
try {
  await canopy.publish("devices.1.temp", { t: 21 }, { expectVersion: 0 });
  fail("a stale expected version was accepted");
} catch (error) {
  check(error instanceof CanopyError && error.code === "conflict", `got ${error}`);
  check(error.currentVersion === 1, `current version ${error.currentVersion}`);
}
await canopy.publish("devices.2.temp", new Uint8Array([0, 255]));
while (seen.length < 2) await new Promise((r) => setTimeout(r, 10));
check(seen[0].data.t === 20 && seen[0].version === 1, `first ${JSON.stringify(seen[0])}`);
check(seen[1].data instanceof Uint8Array && seen[1].data[1] === 255, "bytes arrive as bytes");
const latest = await canopy.get("devices.1.temp");
check(latest.data.t === 20, `get ${JSON.stringify(latest)}`);
const page = await canopy.replay({ pattern: "devices.>" });
check(page.messages.length === 2 && page.caughtUp, `replay ${JSON.stringify(page)}`);
const listed = await canopy.subjects("devices.*.temp");
check(listed.subjects.map((s) => s.subject).join() === "devices.1.temp,devices.2.temp", "subjects");
// From the past, then live.
const history = [];
await canopy.subscribe("devices.1.temp", (msg) => history.push(msg.version), { from: { version: 1 } });
await canopy.publish("devices.1.temp", { t: 22 }, { expectVersion: 1 });
while (history.length < 2) await new Promise((r) => setTimeout(r, 10));
check(history.join() === "1,2", `history then live: ${history}`);
// Snapshots: store one, read it, and subscribe from it.
await canopy.putSnapshot("devices.1.temp", 1, { folded: 20 });
const snap = await canopy.snapshot("devices.1.temp");
check(snap.version === 1 && snap.data.folded === 20, `snapshot ${JSON.stringify(snap)}`);
const fromSnapshot = [];
await canopy.subscribe("devices.1.temp", (msg) => fromSnapshot.push(msg), { from: "snapshot" });
while (fromSnapshot.length < 2) await new Promise((r) => setTimeout(r, 10));
check(fromSnapshot[0].snapshot === true && fromSnapshot[0].data.folded === 20, "the snapshot first");
check(fromSnapshot[1].version === 2 && !fromSnapshot[1].snapshot, "then the versions after it");
await sub.unsubscribe();
canopy.close();
console.log("all checks passed");
process.exit(0);
