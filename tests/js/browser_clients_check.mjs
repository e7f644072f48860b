// canopy.js and MQTT.js in a real headless Chromium against a running Canopy, run by
// tests/it/browser.rs, which holds a native client on the other side.
// Usage: node browser_clients_check.mjs http://HOST:PORT (the HTTP listener)
//
// Protocol with the Rust side, one line each on stdout:
//   ready                       both pages are subscribed (canopy.js to browser.canopy.in,
//                               MQTT.js to browser/mqtt/in); the Rust side then publishes
//                               two messages to browser.canopy.in and one to browser.mqtt.in
//   canopy received JSON        what the canopy.js page got: [{subject, bytes | json}]
//   mqtt received JSON          what the MQTT.js page got: [{topic, bytes}]
//   canopy published JSON       the acks of the page's two publishes to browser.canopy.out
//   mqtt published              the page's QoS 1 publish to browser/mqtt/out was acked
//   canopy consumed JSON        what the canopy.js page's consume() of group `browser`
//                               handled (the Rust side stored browser.orders.1 {"n":1} and
//                               browser.orders.2 {"fail":true} before): [{subject, version,
//                               attempt, data, outcome}], the handler throwing on the first
//                               attempt of a message that says `fail` (so it is nacked)
//   screenshot NAME PATH        one per page
//   all checks passed
import { withBrowser } from "./browser.mjs";

const [origin] = process.argv.slice(2);
if (!origin?.startsWith("http://")) {
  console.error("usage: node browser_clients_check.mjs http://HOST:PORT");
  process.exit(2);
}

// What the pages publish; tests/it/browser.rs expects the same bytes.
const CANOPY_BYTES = [0, 1, 127, 128, 254, 255, ...new TextEncoder().encode("from canopy.js")];
const CANOPY_JSON = { from: "canopy.js", n: 1 };
const MQTT_BYTES = [0, 255, ...new TextEncoder().encode("from mqtt.js ✓")];

const shell = (title, script) => `<!doctype html>
<html><head><meta charset="utf-8"><title>${title}</title><link rel="icon" href="data:,">
<style>body{font:14px monospace;margin:1em}h1{font-size:18px}#log{background:#eef;padding:.5em;white-space:pre-wrap;word-break:break-all}</style>
</head><body><h1>${title}</h1><pre id="log"></pre>
<script type="module">
const log = (line) => { document.getElementById("log").textContent += line + "\\n"; };
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
try {
${script}
} catch (error) {
  log("error: " + error);
  throw error;
}
</script></body></html>`;

const canopyPage = shell(
  "canopy.js in Chromium",
  `
const { connect } = await import("/canopy.js");
const canopy = await connect("ws://" + location.host + "/ws");
log("connected to " + location.host + "/ws");
await canopy.subscribe("browser.canopy.in", (msg) => {
  const entry = { subject: msg.subject };
  if (msg.data instanceof Uint8Array) entry.bytes = Array.from(msg.data);
  else entry.json = msg.data;
  log("received " + msg.subject + ": " + (entry.bytes ? hex(msg.data) : JSON.stringify(msg.data)));
  window.__report("message", entry);
});
log("subscribed to browser.canopy.in");
window.publishOut = async (bytes, json) => {
  const acks = [
    await canopy.publish("browser.canopy.out", new Uint8Array(bytes)),
    await canopy.publish("browser.canopy.out", json),
  ];
  log("published to browser.canopy.out: " + JSON.stringify(acks));
  return acks;
};
window.consumeGroup = async (group, handled) => {
  const seen = [];
  let enough;
  const finished = new Promise((resolve) => (enough = resolve));
  const consumer = canopy.consume(group, async (msg) => {
    const entry = { subject: msg.subject, version: msg.version, attempt: msg.attempt, data: msg.data };
    seen.push(entry);
    if (seen.length >= handled) enough();
    log("consumed " + msg.subject + " v" + msg.version + " attempt " + msg.attempt);
    if (msg.data?.fail && msg.attempt === 1) {
      entry.outcome = "threw";
      throw new Error("fails once");
    }
    entry.outcome = "acked";
  }, { batch: 10, waitMs: 1000 });
  await Promise.race([finished, consumer.done]);
  await consumer.stop();
  return seen;
};
window.__report("ready", true);
`,
);

const mqttPage = shell(
  "MQTT.js in Chromium",
  `
const { default: mqtt } = await import("/__test/mqtt.js");
const client = mqtt.connect("ws://" + location.host + "/mqtt", {
  protocolVersion: 5,
  clientId: "browser-mqttjs",
  reconnectPeriod: 0,
});
client.on("error", (error) => { log("client error: " + error.message); window.__report("error", error.message); });
client.on("message", (topic, payload) => {
  log("received " + topic + ": " + hex(payload));
  window.__report("message", { topic, bytes: Array.from(payload) });
});
await new Promise((resolve) => client.on("connect", resolve));
log("connected to " + location.host + "/mqtt");
const granted = await client.subscribeAsync("browser/mqtt/in", { qos: 1 });
log("subscribed to browser/mqtt/in: " + JSON.stringify(granted));
window.publishOut = async (bytes) => {
  await client.publishAsync("browser/mqtt/out", new Uint8Array(bytes), { qos: 1 });
  log("published to browser/mqtt/out");
};
window.__report("ready", granted.map((g) => g.qos));
`,
);

await withBrowser(async (browser) => {
  const canopy = await browser.openTestPage(origin, "canopy-js", canopyPage);
  const mqtt = await browser.openTestPage(origin, "mqtt-js", mqttPage);
  await canopy.waitForReport("ready");
  const [granted] = await mqtt.waitForReport("ready");
  if (JSON.stringify(granted) !== "[1]") throw new Error(`MQTT.js was granted ${JSON.stringify(granted)}`);
  console.log("ready");

  const [canopyGot, mqttGot] = await Promise.all([
    canopy.waitForReport("message", { count: 2 }),
    mqtt.waitForReport("message", { count: 1 }),
  ]);
  console.log(`canopy received ${JSON.stringify(canopyGot)}`);
  console.log(`mqtt received ${JSON.stringify(mqttGot)}`);

  const acks = await canopy.evaluate(([bytes, json]) => window.publishOut(bytes, json), [CANOPY_BYTES, CANOPY_JSON]);
  console.log(`canopy published ${JSON.stringify(acks)}`);
  await mqtt.evaluate((bytes) => window.publishOut(bytes), MQTT_BYTES);
  console.log("mqtt published");

  const consumed = await canopy.evaluate((group) => window.consumeGroup(group, 3), "browser");
  console.log(`canopy consumed ${JSON.stringify(consumed)}`);

  for (const page of [canopy, mqtt]) {
    page.assertNoErrors();
    console.log(`screenshot ${page.name} ${await page.screenshot()}`);
  }
});
console.log("all checks passed");
