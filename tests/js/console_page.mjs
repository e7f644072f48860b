// Steps on the web console shared by its test (console_check.mjs) and its load run
// (console_load.mjs), on the harness in browser.mjs.
import { WAIT_MS } from "./browser.mjs";

/** Opens the console at `origin` as page `name` and waits until it is connected. */
export async function openConsole(browser, name, origin) {
  const view = await browser.openPage(name, `${origin}/`, { viewport: { width: 1280, height: 800 } });
  await view.page.waitForFunction(() => document.getElementById("status").textContent.startsWith("connected"), null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  return view;
}

/** Subscribes to `pattern` in the subscribe panel and waits for the server's yes. */
export async function subscribeIn(page, pattern) {
  await page.click('nav [data-view="subscribe"]');
  await page.fill("#sub-pattern", pattern);
  await page.click("#sub-go");
  await page.waitForFunction(
    (pattern) => document.getElementById("sub-state").textContent === `subscribed to ${pattern}`,
    pattern,
    { timeout: WAIT_MS, polling: 100 },
  );
}
