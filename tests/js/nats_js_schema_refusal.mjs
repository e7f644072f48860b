// nats.js (npm `nats`, unmodified) publishing a message its subject's schema
// refuses: it hears why as a permissions violation (an error status naming the
// subject; a pending request to that subject is rejected at once), and its
// connection goes on publishing, subscribing and requesting.
//
// Usage: node nats_js_schema_refusal.mjs host:port, with a schema that wants
// {"temp": <number>} bound to devices.*.temp (stored) and live.* (not stored).
// Prints "all checks passed".

import { connect, StringCodec, ErrorCode } from "nats";

const sc = StringCodec();
const fail = (what) => {
  console.error(what);
  process.exit(1);
};

const nc = await connect({ servers: process.argv[2], reconnect: false });
// Status events arrive on their own loop: the first error is awaited (the Rust
// test bounds how long the script may take).
const statuses = [];
let heard;
const firstError = new Promise((resolve) => {
  heard = resolve;
});
(async () => {
  for await (const status of nc.status()) {
    statuses.push(status);
    if (status.type === "error") {
      heard(status);
    }
  }
})();
const sub = nc.subscribe("devices.>");
nc.subscribe("svc.echo", { callback: (_, msg) => msg.respond(msg.data) });

nc.publish("devices.d1.temp", sc.encode('{"temp":"hot"}'));
const error = await firstError;
if (error.data !== ErrorCode.PermissionsViolation) {
  fail(`expected a permissions violation, got ${JSON.stringify(statuses)}`);
}
if (error.permissionContext?.subject !== "devices.d1.temp") {
  fail(`the error names the subject: ${JSON.stringify(error)}`);
}
await nc.flush();
if (nc.isClosed()) {
  fail("the connection closed");
}

// A request to a bound subject the store does not keep, with an invalid payload,
// is rejected with the refusal at once (with a timeout of a minute, a timeout
// error would mean it was not).
try {
  await nc.request("live.d2", sc.encode("not json"), { timeout: 60000 });
  fail("an invalid request was answered");
} catch (error) {
  if (error.code !== ErrorCode.PermissionsViolation) {
    fail(`expected a permissions violation, got ${error.code}: ${error.message}`);
  }
  if (!error.message.includes("live.*@1")) {
    fail(`the error says which schema: ${error.message}`);
  }
}

nc.publish("devices.d1.temp", sc.encode('{"temp":21.5}'));
const iter = sub[Symbol.asyncIterator]();
const next = await iter.next();
if (sc.decode(next.value.data) !== '{"temp":21.5}') {
  fail(`expected the valid message first, got ${sc.decode(next.value.data)}`);
}
const answer = await nc.request("svc.echo", sc.encode("still here"), { timeout: 5000 });
if (sc.decode(answer.data) !== "still here") {
  fail(`echo answered ${sc.decode(answer.data)}`);
}
if (nc.isClosed()) {
  fail("the connection closed");
}
await nc.close();
const closedWith = await nc.closed();
if (closedWith) {
  fail(`closed with an error: ${closedWith}`);
}
console.log("all checks passed");
