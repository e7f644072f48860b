// The console on a server that requires logins, driven by tests/it/browser.rs: it
// asks for a token first, then works in the token's tenant. Prints "subscribed" once
// it follows orders.* and "seen <payload>" when the row the test published arrives,
// and what its overview read from /metrics ("metrics STATUS tenants=… server-wide=N").
//
// Usage: node console_login_check.mjs HTTP_ORIGIN TOKEN
import { withBrowser, WAIT_MS } from "./browser.mjs";

const [origin, token] = process.argv.slice(2);
await withBrowser(async (browser) => {
  const view = await browser.openPage("console-login", `${origin}/`, { viewport: { width: 1280, height: 800 } });
  const { page } = view;
  await page.locator("#login").waitFor({ state: "visible", timeout: WAIT_MS });
  console.log(`screenshot console-login ${await view.screenshot("console-login")}`);
  await page.fill("#login-token", token);
  // The overview's first read of /metrics: none goes out before there is a token.
  const metrics = page.waitForResponse((r) => new URL(r.url()).pathname === "/metrics", { timeout: WAIT_MS });
  await page.click("#login-go");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("connected"), null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  await page.click('nav [data-view="subscribe"]');
  await page.fill("#sub-pattern", "orders.*");
  await page.click("#sub-go");
  await page.waitForFunction(() => document.getElementById("sub-state").textContent === "subscribed to orders.*", null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  console.log("subscribed");
  const response = await metrics;
  const samples = (await response.text()).split("\n").filter((l) => l && !l.startsWith("#"));
  const tenants = [...new Set(samples.flatMap((l) => [...l.matchAll(/tenant="([^"]*)"/g)].map((m) => m[1])))];
  const serverWide = samples.filter((l) => !l.includes('tenant="')).length;
  console.log(`metrics ${response.status()} tenants=${tenants.join(",")} server-wide=${serverWide}`);
  const row = page.locator('#sub-list tr[data-subject="orders.7"]').first();
  await row.waitFor({ timeout: WAIT_MS });
  console.log(`seen ${await row.locator("td.payload").innerText()}`);
});
console.log("all checks passed");
process.exit(0);
