// nats.js (npm `nats` 2.29, unmodified) NATS KV against Canopy, short of watching:
// a bucket made and bound (`js.views.kv`), put, get (latest, a revision, over
// DIRECT.GET, which nats.js buckets allow), create, update at a revision, delete,
// purge, status, and the bucket destroyed; a stale revision and an existing key are
// refused.
//
// Usage: node nats_js_kv.mjs host:port. Prints "all checks passed".

import { connect, StringCodec } from "nats";

import { check, fail } from "./checks.mjs";

const sc = StringCodec();
const refused = async (what, body) => {
  try {
    await body();
  } catch {
    return;
  }
  fail(`${what} succeeded`);
};

const nc = await connect({ servers: process.argv[2], timeout: 5000 });
try {
  const js = nc.jetstream({ timeout: 5000 });
  const kv = await js.views.kv("cfg", { history: 5 });
  const bound = await js.views.kv("cfg", { bindOnly: true });

  const first = await kv.put("color", sc.encode("red"));
  const got = await bound.get("color");
  check(got && sc.decode(got.value) === "red" && got.revision === first, `get: ${JSON.stringify(got)}`);
  const second = await kv.update("color", sc.encode("blue"), first);
  check(second > first, `update revision ${second} after ${first}`);
  await refused("an update at a stale revision", () => kv.update("color", sc.encode("green"), first));
  const old = await kv.get("color", { revision: first });
  check(old && sc.decode(old.value) === "red", `revision ${first}: ${JSON.stringify(old)}`);

  await kv.create("size", sc.encode("m"));
  await refused("create of an existing key", () => kv.create("size", sc.encode("l")));
  check((await kv.get("missing")) === null, "a missing key is null");

  await kv.delete("size");
  const deleted = await kv.get("size");
  check(deleted && deleted.operation === "DEL", `deleted: ${JSON.stringify(deleted)}`);

  await kv.purge("color");
  const purged = await kv.get("color");
  check(purged && purged.operation === "PURGE", `purged: ${JSON.stringify(purged)}`);
  check((await kv.get("color", { revision: first })) === null, "a revision from before the purge is gone");

  const status = await kv.status();
  check(status.bucket === "cfg" && status.history === 5, `status: ${status.bucket} ${status.history}`);
  check(await kv.destroy(), "destroy");
  // nats.js binds without asking (bindOnly); the bucket's stream is gone.
  const jsm = await nc.jetstreamManager();
  await refused("info of a destroyed bucket's stream", () => jsm.streams.info("KV_cfg"));
} catch (error) {
  fail(`${error?.code ?? ""} ${error?.message ?? error}`);
}
await nc.close();
console.log("all checks passed");
