// nats.js (npm `nats` 2.29, unmodified) Object Store against Canopy: a bucket made,
// an object of several chunks put and read back whole, listed, replaced, deleted,
// the bucket's status and its deletion. An object store is a stream over
// `$O.<bucket>.C.>` (chunks) and `$O.<bucket>.M.>` (metadata, rolled up), its reads
// an ordered push consumer over one object's chunks.
//
// Usage: node nats_js_objects.mjs host:port. Prints "all checks passed".

import { connect } from "nats";

import { check, fail } from "./checks.mjs";

const readAll = async (stream) => {
  const chunks = [];
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) {
      break;
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks);
};
const streamOf = (bytes) =>
  new ReadableStream({
    start(controller) {
      controller.enqueue(bytes);
      controller.close();
    },
  });

const nc = await connect({ servers: process.argv[2], timeout: 5000 });
try {
  const js = nc.jetstream({ timeout: 5000 });
  const os = await js.views.os("files");
  const data = new Uint8Array(300_000).map((_, i) => (i * 7) % 251);
  const info = await os.put({ name: "a/file.bin" }, streamOf(data));
  check(info.size === data.length && info.chunks > 1, `put: ${info.size} bytes in ${info.chunks} chunks`);
  const got = await os.get("a/file.bin");
  const back = await readAll(got.data);
  check(Buffer.compare(back, Buffer.from(data)) === 0, `get: ${back.length} bytes back`);
  check(!(await got.error), "the read ended cleanly");
  const listed = (await os.list()).map((o) => o.name);
  check(JSON.stringify(listed) === JSON.stringify(["a/file.bin"]), `list: ${listed}`);
  await os.put({ name: "a/file.bin" }, streamOf(new TextEncoder().encode("smaller now")));
  const replaced = await readAll((await os.get("a/file.bin")).data);
  check(replaced.toString() === "smaller now", `replaced: ${replaced}`);
  await os.delete("a/file.bin");
  check((await os.get("a/file.bin")) === null, "a deleted object is gone");
  const status = await os.status();
  check(status.bucket === "files", `status: ${status.bucket}`);
  check(await os.destroy(), "destroy");
} catch (error) {
  fail(`${error?.code ?? ""} ${error?.message ?? error}`);
}
await nc.close();
console.log("all checks passed");
