// Times the console's pipeline list with 500 pipelines in a real browser (BENCHMARKS.md
// "Console pipeline list"). Measured, not asserted: prints the median and worst of several
// loads.
//
//   cargo build -p sluice
//   SLUICE_BIN=$CARGO_TARGET_DIR/debug/sluice \
//   PLAYWRIGHT_CORE=~/.cache/sluice-tools/console-node/node_modules/playwright-core/index.mjs \
//   node scripts/bench/console-list.mjs [PIPELINES] [LOADS]

import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const pipelines = Number(process.argv[2] || 500);
const loads = Number(process.argv[3] || 7);
const sluice = process.env.SLUICE_BIN;
const { chromium } = await import(process.env.PLAYWRIGHT_CORE);

const port = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => { const { port: p } = s.address(); s.close(() => resolve(p)); });
});
const dataDir = mkdtempSync(join(tmpdir(), 'sluice-console-bench-'));
const base = `http://127.0.0.1:${port}`;
const server = spawn(sluice, ['serve', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], { stdio: 'ignore' });
process.on('exit', () => { server.kill('SIGKILL'); rmSync(dataDir, { recursive: true, force: true }); });
for (;;) {
  try { if ((await fetch(`${base}/readyz`)).ok) break; } catch { /* not yet */ }
  await new Promise((r) => setTimeout(r, 100));
}
const key = execFileSync(sluice, ['admin', 'create-key', '--data-dir', dataDir, '--org', 'acme', '--team', 'data', '--user', 'ann']).toString().trim();
for (let i = 0; i < pipelines; i++) {
  const response = await fetch(`${base}/api/v1/beam`, {
    method: 'POST',
    headers: { 'X-API-Key': key, 'content-type': 'application/json' },
    body: JSON.stringify({
      name: `pipeline ${i}`, description: 'for the list benchmark',
      pipeline_config: { source: { chain: 'base', entity: 'erc20_token_transfer' }, transforms: [], sinks: [{ type: 'kafka', name: `out-${i}` }] },
    }),
  });
  if (!response.ok) throw new Error(await response.text());
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
await page.goto(`${base}/`);
await page.getByLabel('API key').fill(key);
await page.getByRole('button', { name: 'Sign in' }).click();
await page.locator('table[aria-label="Pipelines"] tbody tr').nth(pipelines - 1).waitFor();
const times = [];
for (let i = 0; i < loads; i++) {
  // A full page load (the key stays in the tab's sessionStorage): navigation start to the
  // last row in the document.
  await page.reload();
  await page.locator('table[aria-label="Pipelines"] tbody tr').nth(pipelines - 1).waitFor();
  times.push(await page.evaluate(() => performance.now()));
}
times.sort((a, b) => a - b);
console.log(JSON.stringify({
  bench: 'console_pipeline_list', pipelines, loads,
  median_ms: Math.round(times[Math.floor(times.length / 2)]), worst_ms: Math.round(times[times.length - 1]),
  all_ms: times.map(Math.round),
}));
await browser.close();
