// The web console (`/`) in headless Chromium against a running Canopy, driven by
// tests/it/browser.rs. It subscribes to devices.*.temp and sees messages published by
// the `canopy` CLI and by an MQTT client, pauses and resumes, follows a fast stream
// with a bounded list, opens a subject's history from the tree, sees a stale
// expected version answered as a conflict, shows a bound schema and the messages it
// refused, and shows the overview. Screenshots of
// each view are saved (browser.mjs says where).
//
// Usage: node console_check.mjs HTTP_ORIGIN NATS_URL MQTT_URL CANOPY_BINARY
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import mqtt from "mqtt";
import { withBrowser, WAIT_MS } from "./browser.mjs";
import { openConsole, subscribeIn } from "./console_page.mjs";

const [origin, natsUrl, mqttUrl, canopy] = process.argv.slice(2);
if (!canopy) {
  console.error("usage: node console_check.mjs HTTP_ORIGIN NATS_URL MQTT_URL CANOPY_BINARY");
  process.exit(2);
}
const run = promisify(execFile);
const cli = (...args) => run(canopy, [...args, "--server", natsUrl], { timeout: WAIT_MS });
const check = (ok, why) => {
  if (!ok) throw new Error(why);
};

const device = await mqtt.connectAsync(mqttUrl, { clientId: "console-check", protocolVersion: 5 });

await withBrowser(async (browser) => {
  const view = await openConsole(browser, "console", origin);
  const { page } = view;
  const text = (selector) => page.locator(selector).innerText({ timeout: WAIT_MS });
  const rows = (subject) => page.locator(`#sub-list tr[data-subject="${subject}"]`);

  // Subscribe, then publish from the CLI and from MQTT: both appear; others do not.
  await subscribeIn(page, "devices.*.temp");
  await cli("pub", "devices.1.humidity", "40");
  await cli("pub", "devices.1.temp", '{"from":"cli","t":21.5}');
  await device.publishAsync("devices/2/temp", '{"from":"mqtt","t":19}', { qos: 1 });
  await rows("devices.1.temp").first().waitFor({ timeout: WAIT_MS });
  await rows("devices.2.temp").first().waitFor({ timeout: WAIT_MS });
  check((await rows("devices.1.temp").first().innerText()).includes("cli"), "the CLI's payload is shown");
  check((await rows("devices.2.temp").first().innerText()).includes("mqtt"), "the MQTT payload is shown");
  check((await rows("devices.1.humidity").count()) === 0, "a subject outside the pattern is not shown");
  console.log("subscribe panel: CLI and MQTT messages shown");
  console.log(`screenshot console-subscribe ${await view.screenshot("console-subscribe")}`);

  // Paused: counted but not shown; resumed: shown.
  await page.click("#sub-pause");
  await cli("pub", "devices.3.temp", '{"paused":true}');
  await page.waitForFunction(() => document.getElementById("sub-count").dataset.count === "3", null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  check((await rows("devices.3.temp").count()) === 0, "nothing is shown while paused");
  await page.click("#sub-pause");
  await rows("devices.3.temp").first().waitFor({ timeout: WAIT_MS });

  // A fast stream (2,000 msgs/s for a second; the rate is measured in BENCHMARKS.md):
  // every message is counted, and the list stays bounded.
  const burst = 2000;
  for (let sent = 0; sent < burst; sent += 200) {
    const started = Date.now();
    await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        device.publishAsync(`devices/burst${(sent + i) % 50}/temp`, `{"n":${sent + i}}`, { qos: 0 }),
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, 100 - (Date.now() - started))));
  }
  const total = burst + 3;
  await page.waitForFunction((total) => Number(document.getElementById("sub-count").dataset.count) === total, total, {
    timeout: 3 * WAIT_MS,
    polling: 100,
  });
  const shown = await page.locator("#sub-list tr").count();
  check(shown > 0 && shown <= 500, `the list is bounded: ${shown} rows`);
  console.log(`burst: ${total} counted, ${shown} rows shown`);
  console.log(`screenshot console-burst ${await view.screenshot("console-burst")}`);

  // The tree lists the stored subjects; a subject opens its stream view.
  await page.locator('#tree .node[data-path="devices"]').waitFor({ timeout: WAIT_MS });
  await page.click('#tree .node[data-path="devices"] .name');
  await page.click('#tree .node[data-path="devices.1"] .name');
  await page.click('#tree .node[data-path="devices.1.temp"] .name');
  await page.locator('#stream-history tr[data-version="1"]').waitFor({ timeout: WAIT_MS });
  check((await text("#stream-head")).includes("version 1"), `head: ${await text("#stream-head")}`);
  check((await text("#stream-history")).includes("cli"), "history shows the CLI's message");
  console.log("stream view opened from the tree");

  // A stale expected version is a conflict, and nothing is stored.
  await page.fill("#pub-data", '{"t":22}');
  await page.fill("#pub-expect", "0");
  await page.click("#pub-go");
  await page.locator("#pub-result.conflict").waitFor({ timeout: WAIT_MS });
  const conflict = await text("#pub-result");
  check(/Conflict: devices\.1\.temp is at version 1/.test(conflict), `conflict shown: ${conflict}`);
  console.log(`screenshot console-conflict ${await view.screenshot("console-conflict")}`);
  // Taking the current version stores it, and the history follows live.
  await page.click("#pub-result button");
  await page.click("#pub-go");
  await page.locator("#pub-result.ok").waitFor({ timeout: WAIT_MS });
  check((await text("#pub-result")).includes("stored as version 2"), `stored: ${await text("#pub-result")}`);
  await page.locator('#stream-history tr[data-version="2"]').waitFor({ timeout: WAIT_MS });
  const stored = await cli("get", "devices.1.temp");
  check(stored.stdout.includes('{"t":22}'), `the CLI reads what the console stored: ${stored.stdout}`);

  // A schema bound to the subject: the stream view shows it, a message it refuses is
  // answered invalid_message and listed under "Refused lately", and what it takes is
  // stored with the schema's version shown in the history.
  const schemaFile = join(mkdtempSync(join(tmpdir(), "console-schema-")), "t.json");
  writeFileSync(schemaFile, JSON.stringify({ type: "object", properties: { t: { type: "number" } }, required: ["t"] }));
  await cli("schema", "put", "devices.*.temp", schemaFile);
  await page.fill("#pub-expect", "");
  await page.fill("#pub-data", '{"t":"warm"}');
  await page.click("#pub-go");
  await page.locator("#pub-result.error").waitFor({ timeout: WAIT_MS });
  const refused = await text("#pub-result");
  check(refused.startsWith("invalid_message:") && refused.includes("/t"), `refusal shown: ${refused}`);
  await page.waitForFunction(() => document.getElementById("stream-errors").textContent.includes("/t"), null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  check((await text("#stream-schema")).includes("devices.*.temp version 1"), `schema: ${await text("#stream-schema")}`);
  await page.fill("#pub-data", '{"t":23}');
  await page.click("#pub-go");
  await page.waitForFunction(() => document.getElementById("pub-result").textContent.includes("stored as version 3"), null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  await page.locator('#stream-history tr[data-version="3"]').waitFor({ timeout: WAIT_MS });
  const newest = await page.locator('#stream-history tr[data-version="3"]').innerText();
  check(newest.includes("devices.*.temp@1"), `the schema version is shown: ${newest}`);
  console.log("stream view shows the schema and its refusals");
  console.log(`screenshot console-schema ${await view.screenshot("console-schema")}`);

  // The overview: connections by protocol, rates, and the facts table.
  await page.click('nav [data-view="overview"]');
  await page.waitForFunction(() => /websocket [1-9]/.test(document.getElementById("ov-connections").textContent), null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  await page.waitForFunction(() => document.getElementById("ov-facts").textContent.includes("subjects"), null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  console.log(`screenshot console-overview ${await view.screenshot("console-overview")}`);
});

await device.endAsync();
console.log("all checks passed");
process.exit(0);
