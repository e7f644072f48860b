// A headless Chromium for end-to-end browser tests, on playwright-core and Debian's
// /usr/bin/chromium (scripts/test-all.sh installs both; Playwright's own browser builds
// are never downloaded). Reusable by every browser test script:
//
//   import { withBrowser } from "./browser.mjs";
//   await withBrowser(async (browser) => {
//     const page = await browser.openTestPage("http://127.0.0.1:PORT", "demo", html);
//     const [ready] = await page.waitForReport("ready");
//     await page.screenshot();
//   });
//
// A test page is HTML given by the script, served at the Canopy server's own origin
// (`ORIGIN/__test/NAME.html`, by request interception), so `import("/canopy.js")` and
// `new WebSocket("ws://" + location.host + "/ws")` are same-origin. MQTT.js's browser
// ES module is served at `/__test/mqtt.js` (`import mqtt from "/__test/mqtt.js"`).
// A page reports back with `window.__report(kind, value)`; `waitForReport` collects it.
// Console errors, uncaught exceptions, failed requests and crashes fail the test.
// Screenshots go to $CANOPY_SCREENSHOT_DIR (default: target/screenshots/ at the repo
// root); on failure every open page is shot as NAME-failure.png and its log printed.

import { existsSync, mkdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, "../..");

/** The Chromium the tests drive: $CANOPY_CHROMIUM, or Debian's. */
export const CHROMIUM = process.env.CANOPY_CHROMIUM || "/usr/bin/chromium";

/** MQTT.js 5's browser build as an ES module (package.json: exports.browser.import). */
export const MQTT_BUNDLE = path.join(here, "node_modules/mqtt/dist/mqtt.esm.js");

/** Where screenshots go: $CANOPY_SCREENSHOT_DIR, or target/screenshots/. */
export function screenshotDir() {
  return path.resolve(process.env.CANOPY_SCREENSHOT_DIR || path.join(repoRoot, "target/screenshots"));
}

/** Flags for a container, where the tests run as root with a small /dev/shm. */
export const CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"];

/** How long a wait lasts unless told: generous for a loaded 2-core CI machine. */
export const WAIT_MS = 20_000;

/**
 * Launches headless Chromium. `args` are added to CHROMIUM_ARGS. Prefer `withBrowser`,
 * which also closes it and reports failures.
 */
export async function launch({ executablePath = CHROMIUM, args = [] } = {}) {
  const major = Number(process.versions.node.split(".")[0]);
  if (major < 20) {
    throw new Error(`playwright-core needs Node.js 20 or later; this is ${process.version}`);
  }
  if (!existsSync(executablePath)) {
    throw new Error(
      `no Chromium at ${executablePath}: run ./scripts/test-all.sh, which installs it ` +
        "(apt-get install chromium), or set CANOPY_CHROMIUM",
    );
  }
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: [...CHROMIUM_ARGS, ...args],
    timeout: 60_000,
  });
  return new Browser(browser);
}

/**
 * Runs `body(browser)` with a fresh browser and closes it; resolves with `body`'s value.
 * If `body` throws, takes longer than `timeoutMs`, or any page saw an error, it prints
 * the reason and every page's log to stderr, saves failure screenshots, closes the
 * browser and exits the process with code 1.
 */
export async function withBrowser(body, { timeoutMs = 90_000, ...launchOptions } = {}) {
  let browser;
  let timer;
  let failed = false;
  try {
    browser = await launch(launchOptions);
    const timedOut = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
    });
    const value = await Promise.race([body(browser), timedOut]);
    for (const page of browser.pages) page.assertNoErrors();
    return value;
  } catch (error) {
    failed = true;
    console.error(`FAIL: ${error?.stack || error}`);
    if (browser) await browser.diagnose();
  } finally {
    clearTimeout(timer);
    await browser?.close();
  }
  if (failed) process.exit(1);
}

export class Browser {
  /** playwright-core's Browser, for anything the harness does not wrap. */
  browser;
  /** Every TestPage opened, in order. */
  pages = [];

  constructor(browser) {
    this.browser = browser;
  }

  /**
   * Opens `html` at `ORIGIN/__test/NAME.html` in a fresh browser context (its own
   * cookies and storage) and waits for it to load. `origin` is the Canopy HTTP
   * server's, e.g. "http://127.0.0.1:8080". Requests to the origin other than
   * `/__test/...` reach the server itself.
   */
  async openTestPage(origin, name, html, { viewport = { width: 900, height: 600 } } = {}) {
    const testPage = await this.#newPage(name, viewport);
    const { page } = testPage;
    const base = new URL(origin).origin;
    await serveTestFiles(page, base, { [`${name}.html`]: html });
    await page.goto(`${base}/__test/${name}.html`, { waitUntil: "load", timeout: WAIT_MS });
    return testPage;
  }

  /** Opens a page of the server itself (e.g. a web console) at `url`, with the same checks. */
  async openPage(name, url, { viewport = { width: 900, height: 600 } } = {}) {
    const testPage = await this.#newPage(name, viewport);
    const { page } = testPage;
    await serveTestFiles(page, new URL(url).origin, {});
    await page.goto(url, { waitUntil: "load", timeout: WAIT_MS });
    return testPage;
  }

  async #newPage(name, viewport) {
    // A page fulfilled by interception has no server address, so Chromium's Local
    // Network Access checks treat it as public and block its WebSockets to 127.0.0.1
    // (net::ERR_BLOCKED_BY_LOCAL_NETWORK_ACCESS_CHECKS). A page the server serves
    // itself is loopback and needs no grant; granting keeps both the same.
    const context = await this.browser.newContext({ viewport, permissions: ["local-network-access"] });
    const testPage = await TestPage.create(name, await context.newPage());
    this.pages.push(testPage);
    return testPage;
  }

  /** Prints every page's log to stderr and screenshots it as NAME-failure.png. */
  async diagnose() {
    for (const page of this.pages) {
      console.error(page.describe());
      try {
        const file = await page.screenshot(`${page.name}-failure`);
        console.error(`failure screenshot of ${page.name}: ${file}`);
      } catch (error) {
        console.error(`no failure screenshot of ${page.name}: ${error.message}`);
      }
    }
  }

  async close() {
    await this.browser.close().catch(() => {});
  }
}

/** Serves `files` (name -> HTML) and MQTT.js at `base/__test/`, and installs `__report`. */
async function serveTestFiles(page, base, files) {
  await page.route(`${base}/__test/**`, async (route) => {
    const name = new URL(route.request().url()).pathname.slice("/__test/".length);
    if (name === "mqtt.js") {
      await route.fulfill({
        contentType: "text/javascript; charset=utf-8",
        body: await readFile(MQTT_BUNDLE),
      });
    } else if (Object.hasOwn(files, name)) {
      await route.fulfill({ contentType: "text/html; charset=utf-8", body: files[name] });
    } else {
      await route.fulfill({ status: 404, contentType: "text/plain", body: `no test file ${name}` });
    }
  });
}

export class TestPage {
  /** The name in messages and screenshot file names. */
  name;
  /** playwright-core's Page. */
  page;
  /** Console errors, uncaught exceptions, failed requests, crashes: each fails the test. */
  errors = [];
  /** Every console message, error and report, in order, for failure output. */
  log = [];
  /** Reports from `window.__report(kind, value)`, in order. */
  reports = [];
  #waiters = new Set();

  constructor(name, page) {
    this.name = name;
    this.page = page;
    page.on("console", (message) => {
      const line = `console.${message.type()}: ${message.text()}`;
      this.log.push(line);
      if (message.type() === "error") this.#error(line);
    });
    page.on("pageerror", (error) => this.#error(`uncaught: ${error.stack || error.message}`));
    page.on("requestfailed", (request) =>
      this.#error(`request failed: ${request.method()} ${request.url()}: ${request.failure()?.errorText}`),
    );
    page.on("crash", () => this.#error("the page crashed"));
    page.on("websocket", (socket) => {
      this.log.push(`websocket open: ${socket.url()}`);
      socket.on("socketerror", (error) => this.#error(`websocket ${socket.url()}: ${error}`));
      socket.on("close", () => this.log.push(`websocket closed: ${socket.url()}`));
    });
  }

  /** Wraps `page` before it loads anything: listeners, and `window.__report`. */
  static async create(name, page) {
    const testPage = new TestPage(name, page);
    await page.exposeFunction("__report", (kind, value) => testPage.#report(kind, value));
    return testPage;
  }

  #report(kind, value) {
    this.reports.push({ kind, value });
    this.log.push(`report ${kind}: ${JSON.stringify(value)}`);
    this.#wake();
  }

  #error(line) {
    this.errors.push(line);
    this.log.push(`ERROR ${line}`);
    this.#wake();
  }

  #wake() {
    for (const wake of this.#waiters) wake();
  }

  /** The values of the first `count` reports of `kind`; rejects on a page error or timeout. */
  waitForReport(kind, { count = 1, timeoutMs = WAIT_MS } = {}) {
    return new Promise((resolve, reject) => {
      const done = (settle) => {
        clearTimeout(timer);
        this.#waiters.delete(check);
        settle();
      };
      const check = () => {
        if (this.errors.length > 0) {
          done(() => reject(new Error(`${this.name} saw an error waiting for ${kind}: ${this.errors[0]}`)));
          return;
        }
        const values = this.reports.filter((r) => r.kind === kind).map((r) => r.value);
        if (values.length >= count) done(() => resolve(values.slice(0, count)));
      };
      const timer = setTimeout(
        () =>
          done(() =>
            reject(
              new Error(
                `${this.name}: ${count} report(s) of ${kind} not seen in ${timeoutMs} ms ` +
                  `(saw ${JSON.stringify(this.reports)})`,
              ),
            ),
          ),
        timeoutMs,
      );
      this.#waiters.add(check);
      check();
    });
  }

  /** Runs `fn(arg)` in the page (playwright's page.evaluate), bounded by `timeoutMs`. */
  async evaluate(fn, arg, { timeoutMs = WAIT_MS } = {}) {
    let timer;
    const timedOut = new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`${this.name}: evaluate took over ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      return await Promise.race([this.page.evaluate(fn, arg), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Throws, with the page's log, if the page saw any error. */
  assertNoErrors() {
    if (this.errors.length > 0) {
      throw new Error(`${this.name} saw ${this.errors.length} error(s): ${this.errors.join("; ")}`);
    }
  }

  /** Saves a full-page PNG as DIR/FILE.png (default: the page's name); returns its path. */
  async screenshot(file = this.name) {
    const dir = screenshotDir();
    mkdirSync(dir, { recursive: true });
    const target = path.join(dir, `${file}.png`);
    await this.page.screenshot({ path: target, fullPage: true, timeout: WAIT_MS });
    return target;
  }

  /** The page's URL, errors and log, for failure messages. */
  describe() {
    const lines = [`--- page ${this.name} (${this.page.url()})`];
    lines.push(`errors: ${this.errors.length === 0 ? "none" : ""}`);
    for (const error of this.errors) lines.push(`  ${error}`);
    lines.push("log:");
    for (const line of this.log) lines.push(`  ${line}`);
    return lines.join("\n");
  }
}
