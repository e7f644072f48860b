// The console of one node of a cluster, driven by tests/it/cluster/seeing.rs: its
// overview shows the cluster's nodes. Prints "nodes ID,ID,…" (the rows' first
// cells, sorted) and "shards N" (the shard counts' sum), then a screenshot's path.
//
// Usage: node console_cluster_check.mjs HTTP_ORIGIN
import { withBrowser, WAIT_MS } from "./browser.mjs";

const [origin] = process.argv.slice(2);
await withBrowser(async (browser) => {
  const view = await browser.openPage("console-cluster", `${origin}/`, { viewport: { width: 1280, height: 900 } });
  const { page } = view;
  await page.locator("#ov-cluster").waitFor({ state: "visible", timeout: WAIT_MS });
  await page.waitForFunction(() => document.querySelectorAll("#ov-nodes tr").length >= 3, null, {
    timeout: WAIT_MS,
    polling: 100,
  });
  const rows = await page.locator("#ov-nodes tr").evaluateAll((trs) =>
    trs.map((tr) => [...tr.cells].map((td) => td.textContent)),
  );
  console.log(`nodes ${rows.map((r) => r[0]).sort().join(",")}`);
  console.log(`shards ${rows.reduce((sum, r) => sum + Number(r[4]), 0)}`);
  console.log(`screenshot console-cluster ${await view.screenshot("console-cluster")}`);
});
console.log("all checks passed");
process.exit(0);
