// Load on the web console (benches/console.sh runs it): headless Chromium subscribes
// to `devices.*.temp` in the console while an MQTT client publishes RATE msgs/s for
// SECONDS. Measured in the page: frames per second, the longest gap between frames,
// main-thread long tasks (over 50 ms), and how many messages the panel counted. Prints
// one JSON line. Not a test: no pass/fail on timing.
//
// Usage: node console_load.mjs HTTP_ORIGIN MQTT_URL [RATE] [SECONDS]
import mqtt from "mqtt";
import { withBrowser, WAIT_MS } from "./browser.mjs";
import { openConsole, subscribeIn } from "./console_page.mjs";

const [origin, mqttUrl, rateArg = "2000", secondsArg = "10"] = process.argv.slice(2);
const rate = Number(rateArg);
const seconds = Number(secondsArg);
const device = await mqtt.connectAsync(mqttUrl, { clientId: "console-load" });

await withBrowser(
  async (browser) => {
    const view = await openConsole(browser, "console-load", origin);
    const { page } = view;
    await subscribeIn(page, "devices.*.temp");
    // Frame and long-task recorders, in the page.
    await page.evaluate(() => {
      const stats = { frames: 0, maxGap: 0, longTasks: 0, longTaskMs: 0, last: performance.now() };
      window.__load = stats;
      const frame = (now) => {
        stats.frames += 1;
        stats.maxGap = Math.max(stats.maxGap, now - stats.last);
        stats.last = now;
        requestAnimationFrame(frame);
      };
      requestAnimationFrame(frame);
      new PerformanceObserver((list) => {
        for (const entry of list.getEntries()) {
          stats.longTasks += 1;
          stats.longTaskMs += entry.duration;
        }
      }).observe({ type: "longtask" });
    });
    const start = performance.now();
    const tick = 10;
    const perTick = Math.max(1, Math.round((rate * tick) / 1000));
    let sent = 0;
    while (performance.now() - start < seconds * 1000) {
      const due = Math.floor((performance.now() - start) / tick) * perTick + perTick;
      const batch = [];
      while (sent < due) {
        batch.push(device.publishAsync(`devices/${sent % 100}/temp`, `{"n":${sent},"t":21.5}`, { qos: 0 }));
        sent += 1;
      }
      await Promise.all(batch);
      await new Promise((resolve) => setTimeout(resolve, tick));
    }
    const publishSeconds = (performance.now() - start) / 1000;
    await page.waitForFunction((total) => Number(document.getElementById("sub-count").dataset.count) >= total, sent, {
      timeout: 6 * WAIT_MS,
      polling: 100,
    });
    const drainedSeconds = (performance.now() - start) / 1000;
    const stats = await page.evaluate(() => ({ ...window.__load, rows: document.querySelectorAll("#sub-list tr").length }));
    await view.screenshot("console-load");
    console.log(
      JSON.stringify({
        rate_asked: rate,
        sent,
        publish_rate: Math.round(sent / publishSeconds),
        all_counted_after_s: Number(drainedSeconds.toFixed(2)),
        fps: Math.round(stats.frames / drainedSeconds),
        max_frame_gap_ms: Math.round(stats.maxGap),
        long_tasks: stats.longTasks,
        long_task_ms: Math.round(stats.longTaskMs),
        rows_shown: stats.rows,
      }),
    );
  },
  { timeoutMs: (seconds + 180) * 1000 },
);
await device.endAsync();
process.exit(0);
