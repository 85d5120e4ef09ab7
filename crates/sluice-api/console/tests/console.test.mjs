// Browser tests of the console: headless Chromium (Debian's) driven by playwright-core,
// against a real `sluice serve` this script starts on a free port with a new data dir.
//
// Environment (scripts/test sets them):
//   SLUICE_BIN        the `sluice` binary
//   PLAYWRIGHT_CORE   playwright-core's entry module (index.mjs), installed outside the clone
//   CONSOLE_TEST_OUT  where screenshots go (made when missing)
//   CHROMIUM          the browser (default /usr/bin/chromium)
//
// Run: node --test crates/sluice-api/console/tests/console.test.mjs

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const need = (name) => {
  const value = process.env[name];
  assert.ok(value, `${name} must be set (scripts/test sets it)`);
  return value;
};
const sluice = need('SLUICE_BIN');
const { chromium } = await import(need('PLAYWRIGHT_CORE'));
const out = need('CONSOLE_TEST_OUT');
mkdirSync(out, { recursive: true });

const freePort = () => new Promise((resolve, reject) => {
  const server = createServer();
  server.on('error', reject);
  server.listen(0, '127.0.0.1', () => {
    const { port } = server.address();
    server.close(() => resolve(port));
  });
});

const dataDir = mkdtempSync(join(tmpdir(), 'sluice-console-'));
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
// The archiver flushes every second, so records reach the warehouse (and backfills) at once.
const server = spawn(sluice, ['serve', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`, '--warehouse-flush-secs', '1'], {
  stdio: ['ignore', 'ignore', 'pipe'],
  env: { ...process.env, SLUICE_LOG: 'warn' },
});
let serverLog = '';
server.stderr.on('data', (chunk) => { serverLog += chunk; });
for (let i = 0; ; i++) {
  try {
    if ((await fetch(`${base}/readyz`)).ok) break;
  } catch { /* not yet */ }
  assert.ok(i < 300, `sluice serve did not become ready:\n${serverLog}`);
  await new Promise((r) => setTimeout(r, 100));
}

// Keys made on the running server's store: the owner is an operator (stream ingest needs
// one); the reader is a member of the same team, who reads the team's pipelines and may not
// change them.
const key = (user, ...flags) => execFileSync(sluice, [
  'admin', 'create-key', '--data-dir', dataDir, '--org', 'acme', '--team', 'data', '--user', user, ...flags,
]).toString().trim();
const ownerKey = key('ann', '--operator');
const readerKey = key('rita');

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});

process.on('exit', () => {
  server.kill('SIGKILL');
  rmSync(dataDir, { recursive: true, force: true });
});

const shot = (page, name) => page.screenshot({ path: join(out, `${name}.png`), fullPage: true });

async function signIn(page, apiKey) {
  await page.goto(`${base}/`);
  await page.getByLabel('API key').fill(apiKey);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Pipelines' }).waitFor();
}

/** Transfers `from..to` of USDC on Base, ingested through the API. */
async function ingest(from, to) {
  const lines = [];
  for (let n = from; n < to; n++) {
    lines.push(JSON.stringify({
      n, block_number: 1000 + n, block_timestamp: new Date().toISOString(),
      transaction_hash: '0x' + n.toString(16).padStart(64, '0'), log_index: 0,
      token_address: '0x833589fcd6edb6e08f4c7c32d4f71b54bda02913',
      from_address: '0x' + '1'.repeat(40), to_address: '0x' + '2'.repeat(40), amount_str: '1.5',
    }));
  }
  const response = await fetch(`${base}/api/v1/streams/base/erc20_token_transfer/records`, {
    method: 'POST', headers: { 'X-API-Key': ownerKey }, body: lines.join('\n') + '\n',
  });
  assert.equal(response.status, 200, await response.text());
}

let pipelineUrl = null;

/** `GET /api/v1<path>` as the owner. */
async function apiGet(path) {
  const response = await fetch(`${base}/api/v1${path}`, { headers: { 'X-API-Key': ownerKey } });
  const text = await response.text();
  assert.equal(response.status, 200, text);
  return JSON.parse(text);
}

/** The points of `metric` of pipeline `configId` over the last hour, once they count `total`. */
async function pointsOnceCounted(configId, metric, total) {
  for (let i = 0; ; i++) {
    const body = await apiGet(`/beam/${configId}/deploy/metrics?time_range=1h&metrics=${metric}`);
    const points = body.metrics[0].points;
    const counted = points.reduce((sum, p) => sum + p.value, 0);
    if (counted >= total) return points;
    assert.ok(i < 100, `${metric} counted ${counted} of ${total}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** What each chart must show, by metric type: its title and an API value as drawn. */
const CHARTS = {
  messages_received: { title: 'Records read per second', scale: (value, step) => value / step },
  messages_sent: { title: 'Records delivered per second', scale: (value, step) => value / step },
  total_latency: { title: 'Ingest-to-sink latency, mean (ms)', scale: (value) => value },
  processing_latency: { title: 'Processing latency, mean (ms)', scale: (value) => value },
  processor_error: { title: 'Transform errors per second', scale: (value, step) => value / step },
  output_error: { title: 'Sink errors per second', scale: (value, step) => value / step },
  data_age: { title: 'Data age (s)', scale: (value) => value / 1000 },
};
const STEP = { '1h': 60, '1d': 900, '1w': 3600 };

/** What the charts on `page` drew: per metric its caption, points, x scale and painted pixels. */
const drawnCharts = (page) => page.evaluate(() => [...document.querySelectorAll('#metric-charts figure.chart')].map((figure) => {
  const plot = figure.plot;
  const [xs, ys] = [plot.data[0], plot.data[1]];
  // A point is painted when a pixel of the 5×5 box around it, within the plotting area (a
  // zero sits on its bottom edge), is not transparent.
  const box = plot.bbox;
  const clamp = (v, lo, hi) => Math.min(Math.max(v, lo), hi);
  const painted = xs.map((x, i) => {
    const cx = Math.round(plot.valToPos(x, 'x', true));
    const cy = Math.round(plot.valToPos(ys[i], 'y', true));
    if (!Number.isFinite(cx) || !Number.isFinite(cy)) return false;
    const left = clamp(cx - 2, box.left, box.left + box.width - 5);
    const top = clamp(cy - 2, box.top, box.top + box.height - 5);
    const pixels = plot.ctx.getImageData(left, top, 5, 5).data;
    for (let alpha = 3; alpha < pixels.length; alpha += 4) if (pixels[alpha] > 0) return true;
    return false;
  });
  return {
    metric: figure.dataset.metric, caption: figure.querySelector('figcaption').textContent,
    xs: [...xs], ys: [...ys], min: plot.scales.x.min, max: plot.scales.x.max, painted,
  };
}));

/**
 * Draws `range` on the pipeline page and checks every chart against the metrics API: the
 * title, each drawn point equal to the API's point of the same time (scaled as the title
 * says), every point of the deployment drawn and painted, and the time axis starting at the
 * deployment. Redrawn until both agree (a minute may turn between the page's read and ours).
 */
async function checkCharts(page, configId, range) {
  const step = STEP[range];
  let problem = 'never compared';
  for (let attempt = 0; attempt < 20; attempt++) {
    await page.getByRole('button', { name: range, exact: true }).click();
    await page.locator(`button[data-range="${range}"][aria-pressed="true"]`).waitFor();
    await page.locator('#metric-charts figure.chart .uplot').nth(6).waitFor();
    const drawn = await drawnCharts(page);
    const api = await apiGet(`/beam/${configId}/deploy/metrics?time_range=${range}`);
    const { deployed_at: deployedAt } = await apiGet(`/beam/${configId}/deploy/stats`);
    const deployed = Math.floor(Date.parse(deployedAt) / 1000 / step) * step;
    problem = null;
    assert.equal(drawn.length, 7);
    for (const chart of drawn) {
      const want = CHARTS[chart.metric];
      assert.ok(chart.caption.startsWith(want.title), `${chart.metric}: caption "${chart.caption}"`);
      assert.equal(chart.min, deployed, `${chart.metric} (${range}): the axis starts at the deployment`);
      const series = api.metrics.find((m) => m.metric_type === chart.metric);
      const byTime = new Map(series.points.map((p) => [Date.parse(p.timestamp) / 1000, p.value]));
      const expected = [...byTime].filter(([t]) => t >= deployed && t + step / 2 <= chart.max);
      if (chart.xs.length !== expected.length) problem = `${chart.metric}: ${chart.xs.length} points drawn, the API has ${expected.length}`;
      chart.xs.forEach((x, i) => {
        const value = byTime.get(x - step / 2);
        if (value === undefined) problem = `${chart.metric}: drawn at ${x}, no such API point`;
        else if (Math.abs(chart.ys[i] - want.scale(value, step)) > 1e-9 * Math.max(1, Math.abs(chart.ys[i]))) {
          problem = `${chart.metric}: drawn ${chart.ys[i]} at ${x}, the API says ${value} (${want.scale(value, step)} as drawn)`;
        }
        assert.ok(chart.painted[i], `${chart.metric} (${range}): the point at ${x} is painted`);
        assert.ok(x > chart.min && x < chart.max, `${chart.metric} (${range}): the point at ${x} is inside the axis`);
      });
    }
    if (!problem) return drawn;
    await new Promise((r) => setTimeout(r, 500));
  }
  assert.fail(`the charts never matched the metrics API: ${problem}`);
}

// The list's rate check waits for a minute to end (up to 60 s).
test('the console at work', { timeout: 300_000 }, async (t) => {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push(error.message));
  // Chromium logs every non-2xx response as "Failed to load resource"; the 401 and 422 below
  // are meant. Anything else logged as an error, or thrown, is a problem.
  page.on('console', (message) => {
    if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) {
      problems.push(message.text());
    }
  });

  await t.test('a wrong key is refused next to the field, the right one signs in', async () => {
    await page.goto(`${base}/`);
    await page.getByLabel('API key').fill('sk_not_a_key');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('#key-error', { hasText: 'That API key is not valid.' }).waitFor();
    assert.equal(await page.getByLabel('API key').getAttribute('aria-invalid'), 'true');
    await shot(page, '01-sign-in-refused');
    await signIn(page, ownerKey);
    assert.equal(await page.evaluate(() => location.href.includes('sk_')), false, 'no key in the URL');
    await shot(page, '02-pipelines-empty');
  });

  await t.test('a pipeline with a mistake shows the 422 next to the field; fixed, it is created', async () => {
    await page.getByRole('link', { name: 'New pipeline' }).first().click();
    await page.getByLabel('Name', { exact: true }).fill('usdc watch');
    await page.getByLabel('Description').fill('USDC transfers on Base');
    // A sink name with a space: the server refuses it at pipeline_config.sinks[0].name.
    await page.getByLabel('Managed sink name').fill('usdc out');
    await page.getByRole('button', { name: 'Create pipeline' }).click();
    await page.locator('#sink-name-error', { hasText: 'usable as a topic name' }).waitFor();
    assert.equal(await page.locator('#sink-name').getAttribute('aria-invalid'), 'true');
    assert.equal(await page.locator('#name').getAttribute('aria-invalid'), null, 'only the field named');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'sink-name', 'focus on the field');
    await shot(page, '03-create-422');
    await page.getByLabel('Managed sink name').fill('usdc-out');
    await page.getByRole('button', { name: 'Create pipeline' }).click();
    await page.getByRole('heading', { name: 'usdc watch' }).waitFor();
    pipelineUrl = page.url();
    assert.match(pipelineUrl, /#\/p\//);
  });

  await t.test('deploy, see records arrive live, pause and resume', async () => {
    await page.getByRole('button', { name: 'Deploy' }).click();
    await page.locator('.badge.running').waitFor();
    // The tail follows from its start: ingest once it is connected.
    await page.locator('#tail[data-live="true"]').waitFor();
    await ingest(0, 25);
    await page.locator('#tail li').nth(24).waitFor({ timeout: 30_000 });
    const shown = await page.locator('#tail li').allTextContents();
    for (let n = 0; n < 25; n++) assert.ok(shown.some((line) => line.includes(`"n":${n},`)), `record ${n}`);
    assert.equal(await page.getByText('null', { exact: true }).count(), 0, 'no stray text');
    await shot(page, '04-pipeline-live');
    await page.getByRole('button', { name: 'Pause' }).click();
    await page.locator('#action-result', { hasText: 'successfully paused' }).waitFor();
    assert.equal(await page.locator('.badge.running').count(), 0);
    await page.getByRole('button', { name: 'Deploy' }).click();
    await page.locator('.badge.running').waitFor();
    await page.locator('#tail[data-live="true"]').waitFor();
    await ingest(25, 30);
    await page.locator('#tail li', { hasText: '"n":29' }).waitFor({ timeout: 30_000 });
    await shot(page, '05-resumed');
    // The seven metrics as charts, over each range, drawing what the metrics API says.
    await page.locator('#metric-charts figure.chart .uplot').nth(6).waitFor();
    assert.equal(await page.locator('#metric-charts figure.chart').count(), 7);
    const configId = decodeURIComponent(pipelineUrl.split('#/p/')[1]);
    await pointsOnceCounted(configId, 'messages_received', 30);
    for (const range of ['1h', '1d', '1w']) {
      const drawn = await checkCharts(page, configId, range);
      const read = drawn.find((chart) => chart.metric === 'messages_received');
      const total = read.ys.reduce((sum, y) => sum + y, 0) * STEP[range];
      assert.ok(Math.abs(total - 30) < 1e-6, `${range}: the 30 records read, as rates per second × ${STEP[range]} s, add up to ${total}`);
      // Latencies exist only where batches were delivered: within the hour it was deployed
      // in, a deployment has one latency point at 1w, which must be drawn all the same
      // (checkCharts checks that every point is painted).
      const latency = drawn.find((chart) => chart.metric === 'total_latency');
      if (range === '1w' && latency.min + 3600 > Date.now() / 1000) {
        assert.equal(latency.xs.length, 1, '1w: one latency point');
      }
    }
    await page.locator('#metric-charts').scrollIntoViewIfNeeded();
    await shot(page, '05b-metrics');
    // The README's picture: the top of the pipeline page, as a 1280×800 screen shows it.
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: join(out, 'readme-pipeline.png') });
  });

  await t.test('an edit with a mistake shows the 422 under the JSON; fixed, it saves', async () => {
    await page.goto(pipelineUrl);
    await page.getByLabel('Pipeline (JSON)').waitFor();
    const spec = JSON.parse(await page.getByLabel('Pipeline (JSON)').inputValue());
    await page.getByLabel('Pipeline (JSON)').fill(JSON.stringify({ ...spec, pod_size: 'XXL' }));
    await page.getByRole('button', { name: 'Save changes' }).click();
    await page.locator('#edit-json-error', { hasText: 'pod_size' }).waitFor();
    await shot(page, '05c-edit-422');
    await page.getByLabel('Pipeline (JSON)').fill(JSON.stringify({ ...spec, description: 'USDC transfers on Base, edited' }));
    await page.getByRole('button', { name: 'Save changes' }).click();
    await page.locator('#edit-result', { hasText: 'Saved.' }).waitFor();
    await page.reload();
    await page.getByText('USDC transfers on Base, edited', { exact: true }).waitFor();
  });

  await t.test('the form edits a pipeline too, with its 422s next to the fields', async () => {
    await page.goto(pipelineUrl);
    await page.getByRole('link', { name: 'Edit with the form' }).click();
    await page.getByRole('heading', { name: 'Edit pipeline' }).waitFor();
    assert.equal(await page.getByLabel('Name', { exact: true }).inputValue(), 'usdc watch', 'prefilled');
    assert.equal(await page.getByLabel('Managed sink name').inputValue(), 'usdc-out');
    await page.getByLabel('Description').fill('edited with the form');
    await page.getByLabel('Managed sink name').fill('usdc out');
    await page.getByRole('button', { name: 'Save pipeline' }).click();
    await page.locator('#sink-name-error', { hasText: 'usable as a topic name' }).waitFor();
    await page.getByLabel('Managed sink name').fill('usdc-out');
    await page.getByRole('button', { name: 'Save pipeline' }).click();
    await page.getByText('edited with the form', { exact: true }).waitFor();
    assert.equal(page.url(), pipelineUrl);
  });

  await t.test('a set filter made through the JSON body takes 100,000 values from a file', async () => {
    await page.goto(`${base}/#/new`);
    await page.getByRole('heading', { name: 'New pipeline' }).waitFor();
    await page.getByText('JSON body').click();
    await page.getByLabel('send this JSON instead of the form').check();
    const body = {
      name: 'watched wallets', description: 'transfers to 100,000 wallets',
      pipeline_config: {
        source: { chain: 'base', entity: 'erc20_token_transfer' },
        transforms: [{ type: 'redis_set_filter', uid: 'wallets', filter_expr: 'root = this.to_address' }],
        sinks: [{ type: 'kafka', name: 'watched' }],
      },
    };
    await page.getByLabel('Request body').fill(JSON.stringify(body));
    await page.getByRole('button', { name: 'Create pipeline' }).click();
    await page.getByRole('heading', { name: 'watched wallets' }).waitFor();
    await page.getByRole('link', { name: 'filter values' }).click();
    await page.getByRole('heading', { name: 'Filter values of wallets' }).waitFor();
    const file = join(out, 'wallets.txt');
    const wallets = Array.from({ length: 100_000 }, (_, i) => '0x' + (i + 1).toString(16).padStart(40, '0'));
    writeFileSync(file, wallets.join('\n') + '\n');
    await page.locator('#values-file').setInputFiles(file);
    await page.getByRole('button', { name: 'Upload' }).click();
    await page.locator('#upload-status', { hasText: 'Done: 100,000 values sent, 100,000 new.' }).waitFor({ timeout: 60_000 });
    assert.equal(await page.locator('#upload-progress').evaluate((p) => p.value === p.max && p.max === 100000), true);
    await page.locator('#value-count', { hasText: '100,000 values' }).waitFor();
    await shot(page, '06-values-uploaded');
    await page.getByLabel('Look up a value').fill(wallets[4242].toUpperCase().replace('0X', '0x'));
    await page.getByRole('button', { name: 'Look up' }).click();
    await page.locator('#search-result', { hasText: `${wallets[4242]} is in the set.` }).waitFor();
    await page.getByLabel('Look up a value').fill('0x' + 'f'.repeat(40));
    await page.getByRole('button', { name: 'Look up' }).click();
    await page.locator('#search-result', { hasText: 'is not in the set.' }).waitFor();
    assert.equal(await page.locator('#values-page li').count(), 100);
    const first = await page.locator('#values-page li').first().textContent();
    await page.getByRole('button', { name: 'Next page' }).click();
    await page.waitForFunction((before) => document.querySelector('#values-page li')?.textContent !== before, first);
    assert.equal(await page.locator('#values-page li').count(), 100);
  });

  await t.test('a backfill refused, fixed, started and followed until it completes', async () => {
    // The 30 transfers ingested above, archived.
    for (let i = 0; ; i++) {
      const tables = await (await fetch(`${base}/api/v1/beam/backfills/tables`, { headers: { 'X-API-Key': ownerKey } })).json();
      if (tables.find((table) => table.name === 'base.assets.erc20_token_transfers')?.row_count >= 30) break;
      assert.ok(i < 100, 'the transfers never reached the warehouse');
      await new Promise((r) => setTimeout(r, 100));
    }
    await page.getByRole('link', { name: 'Backfills' }).click();
    await page.getByRole('heading', { name: 'Backfills' }).waitFor();
    await page.getByRole('link', { name: 'New backfill' }).click();
    await page.getByLabel('Table').selectOption('base.assets.erc20_token_transfers');
    const hour = 3600e3;
    const local = (date) => date.toISOString().slice(0, 16);
    // The window backwards: the server refuses it at backfill_window.end.
    await page.getByLabel('From (UTC, included)').fill(local(new Date(Date.now() + hour)));
    await page.getByLabel('To (UTC, excluded)').fill(local(new Date(Date.now() - hour)));
    await page.getByLabel('Job name').fill('usdc today');
    await page.getByRole('button', { name: 'Start backfill' }).click();
    await page.locator('#end-error', { hasText: 'start must be before end' }).waitFor();
    assert.equal(await page.locator('#end').getAttribute('aria-invalid'), 'true');
    await shot(page, '06-backfill-422');
    await page.getByLabel('From (UTC, included)').fill(local(new Date(Date.now() - hour)));
    await page.getByLabel('To (UTC, excluded)').fill(local(new Date(Date.now() + hour)));
    await page.getByLabel('Filter column').selectOption('token_address');
    await page.getByLabel('Filter values (one per line)').fill('0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913');
    await page.getByRole('button', { name: 'Start backfill' }).click();
    await page.getByRole('heading', { name: 'Backfills' }).waitFor();
    const row = page.locator('tr', { hasText: 'usdc today' });
    await row.locator('[data-status="completed"]').waitFor({ timeout: 60_000 });
    assert.equal(await row.locator('progress').evaluate((p) => p.value === p.max), true);
    assert.match(await row.textContent(), /30 of 30 rows/);
    await shot(page, '06-backfill-completed');
    // Through the JSON body: a script transform keeps the even transfers only.
    await page.getByRole('link', { name: 'New backfill' }).click();
    await page.getByLabel('Job name').fill('evens');
    await page.getByLabel('Table').selectOption('base.assets.erc20_token_transfers');
    await page.getByLabel('From (UTC, included)').fill(local(new Date(Date.now() - hour)));
    await page.getByLabel('To (UTC, excluded)').fill(local(new Date(Date.now() + hour)));
    await page.getByText('JSON body (transforms, other destinations)').click();
    const body = JSON.parse(await page.getByLabel('Backfill request body').inputValue());
    body.transforms = [{ type: 'v8', script: 'function transform(r) { return r.n % 2 === 0 ? r : null; }' }];
    await page.getByLabel('send this JSON instead of the form').check();
    await page.getByLabel('Backfill request body').fill(JSON.stringify(body));
    await page.getByRole('button', { name: 'Start backfill' }).click();
    const evens = page.locator('tr', { hasText: 'evens' });
    await evens.locator('[data-status="completed"]').waitFor({ timeout: 60_000 });
    assert.match(await evens.textContent(), /15 of 15 rows/);
  });

  await t.test('a script that fails shows its dead letters and logs, and a replay answers', async () => {
    const created = await (await fetch(`${base}/api/v1/beam`, {
      method: 'POST', headers: { 'X-API-Key': ownerKey, 'content-type': 'application/json' },
      body: JSON.stringify({
        name: 'picky', description: 'fails on every fifth record',
        pipeline_config: {
          source: { chain: 'base', entity: 'erc20_token_transfer' },
          transforms: [{ type: 'v8', uid: 'picky', script: "function transform(r) { console.log('seen ' + r.n); if (r.n % 5 === 0) { throw new Error('no fives'); } return r; }" }],
          sinks: [{ type: 'kafka', name: 'picked' }],
        },
      }),
    })).json();
    await page.goto(`${base}/#/p/${created.id}`);
    await page.getByRole('button', { name: 'Deploy' }).click();
    await page.locator('.badge.running').waitFor();
    await page.locator('#tail[data-live="true"]').waitFor();
    await ingest(100, 110);
    for (let i = 0; ; i++) {
      await page.getByRole('button', { name: 'Refresh dead letters' }).click();
      if (await page.locator('table[aria-label="Dead letters"] tbody tr').count() === 2) break;
      assert.ok(i < 100, 'the two dead letters never showed');
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.match(await page.locator('table[aria-label="Dead letters"]').textContent(), /no fives/);
    // The error gets the room: the widest column, its text whole; the long record key is cut.
    const room = await page.locator('table[aria-label="Dead letters"]').evaluate((table) => {
      const cells = [...table.querySelector('tbody tr').cells];
      const error = cells[3];
      return {
        table: table.getBoundingClientRect().width,
        widths: cells.map((cell) => cell.getBoundingClientRect().width),
        clipped: error.scrollWidth > error.clientWidth,
      };
    });
    assert.equal(Math.max(...room.widths), room.widths[3], `the error is the widest column: ${room.widths}`);
    assert.ok(room.widths[3] >= 0.4 * room.table, `the error has ${room.widths[3]} of ${room.table} px`);
    assert.equal(room.clipped, false, 'the error text is whole');
    await page.getByRole('button', { name: 'Refresh logs' }).click();
    await page.locator('#script-logs li', { hasText: 'seen 105' }).waitFor();
    await shot(page, '07-dead-letters-and-logs');
    await page.getByRole('button', { name: 'Replay through the current transforms' }).click();
    await page.locator('#replay-result', { hasText: '2 replayed, 0 delivered, 2 failed again' }).waitFor();
  });

  await t.test('a dataset is created, filled from a file, paged and deleted', async () => {
    await page.getByRole('link', { name: 'Datasets', exact: true }).click();
    await page.getByRole('heading', { name: 'Datasets' }).waitFor();
    await page.getByLabel('Name').fill('vips');
    await page.getByRole('button', { name: 'Create dataset' }).click();
    await page.getByRole('heading', { name: 'vips' }).waitFor();
    const file = join(out, 'vips.csv');
    writeFileSync(file, Array.from({ length: 250 }, (_, i) => `0xVIP${String(i).padStart(3, '0')}`).join(','));
    await page.locator('#entries-file').setInputFiles(file);
    await page.getByRole('button', { name: 'Add entries' }).click();
    await page.locator('#entries-status', { hasText: 'Done: 250 values sent.' }).waitFor();
    await page.locator('#entry-count', { hasText: '250 entries' }).waitFor();
    assert.equal(await page.locator('#entries li').first().textContent(), '0xvip000', 'lowercased');
    await page.getByRole('button', { name: 'Next page' }).click();
    await page.locator('#entries li', { hasText: '0xvip100' }).first().waitFor();
    await shot(page, '08-dataset');
    // A second one with the same name is refused next to the field.
    await page.getByRole('link', { name: 'Datasets', exact: true }).click();
    await page.getByLabel('Name').fill('vips');
    await page.getByRole('button', { name: 'Create dataset' }).click();
    await page.locator('#dataset-name-error').filter({ hasText: /./ }).waitFor();
    await page.getByRole('link', { name: 'vips' }).click();
    page.once('dialog', (dialog) => dialog.accept());
    await page.getByRole('button', { name: 'Delete dataset' }).click();
    await page.getByText('No datasets yet.').waitFor();
  });

  await t.test("a token's price and its candles", async () => {
    // Trades of a token over the last ten minutes, one a minute, the price rising.
    const token = '0x' + 'c'.repeat(40);
    const minute = 60e3;
    const start = Math.floor(Date.now() / minute) * minute - 10 * minute;
    const lines = [];
    for (let i = 0; i < 10; i++) {
      lines.push(JSON.stringify({
        chain: 'base', token_address: token, token_decimals: 6, token_amount: '100', usd_amount: String(100 * (1 + i / 10)),
        pool_address: '0x' + 'a'.repeat(40), token_reserve: '1000', block_number: 50_000_000 + i,
        block_timestamp: new Date(start + i * minute + 5e3).toISOString(), transaction_hash: '0x' + (7000 + i).toString(16).padStart(64, '0'), log_index: 1,
      }));
    }
    const response = await fetch(`${base}/api/v1/streams/base/dex_trade/records`, {
      method: 'POST', headers: { 'X-API-Key': ownerKey }, body: lines.join('\n') + '\n',
    });
    assert.equal(response.status, 200, await response.text());
    await page.getByRole('link', { name: 'Prices' }).click();
    await page.getByLabel('Token address').fill(token);
    for (let i = 0; ; i++) {
      await page.getByRole('button', { name: 'Look up' }).click();
      // Each look-up answers with a price (or says there is none) or an error.
      await page.waitForFunction(() => document.querySelector('#latest-price')?.childElementCount
        || document.querySelector('#price-error')?.textContent);
      if (await page.locator('#candle-chart[data-candles="10"]').count()) break;
      assert.ok(i < 100, `the candles never showed: ${await page.locator('main').textContent()}`);
      await new Promise((r) => setTimeout(r, 300));
    }
    await page.locator('#latest-price', { hasText: '$1.90000' }).waitFor();
    await shot(page, '10-prices');
  });

  await t.test('a secret is stored, listed without its value, and deleted; members only read', async () => {
    await page.getByRole('link', { name: 'Secrets' }).click();
    await page.getByRole('heading', { name: 'Secrets' }).waitFor();
    await page.getByLabel('Name').fill('bad name!');
    await page.getByLabel('Value').fill('s3cr3t-value');
    await page.getByRole('button', { name: 'Store secret' }).click();
    await page.locator('#secret-name-error').filter({ hasText: /./ }).waitFor();
    await page.getByLabel('Name').fill('HOOK_KEY');
    await page.getByRole('button', { name: 'Store secret' }).click();
    await page.locator('#secret-result', { hasText: 'Secret HOOK_KEY stored.' }).waitFor();
    await page.locator('table[aria-label="Secrets"]', { hasText: 'HOOK_KEY' }).waitFor();
    assert.equal(await page.getByText('s3cr3t-value').count(), 0, 'the value is never shown');
    assert.equal(await page.getByLabel('Value').inputValue(), '', 'nor kept in the form');
    const readerContext = await browser.newContext();
    const reader = await readerContext.newPage();
    await signIn(reader, readerKey);
    await reader.goto(`${base}/#/secrets`);
    await reader.locator('#secrets-read-only').waitFor();
    assert.equal(await reader.getByRole('button', { name: 'Delete HOOK_KEY' }).count(), 0);
    await readerContext.close();
    page.once('dialog', (dialog) => dialog.accept());
    await page.getByRole('button', { name: 'Delete HOOK_KEY' }).click();
    await page.getByText('No secrets yet.').waitFor();
  });

  await t.test('keyboard alone reaches the lifecycle buttons', async () => {
    await page.goto(`${base}/#/`);
    await page.getByRole('link', { name: 'usdc watch' }).waitFor();
    const reached = [];
    for (let i = 0; i < 12; i++) {
      await page.keyboard.press('Tab');
      reached.push(await page.evaluate(() => document.activeElement?.textContent?.trim()));
    }
    assert.ok(reached.includes('usdc watch'), `tab order: ${reached.join(' | ')}`);
  });

  await t.test('a reader sees the pipeline but no button that changes it', async () => {
    const readerContext = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const reader = await readerContext.newPage();
    await signIn(reader, readerKey);
    await reader.getByRole('link', { name: 'usdc watch' }).click();
    await reader.getByRole('heading', { name: 'usdc watch' }).waitFor();
    await reader.locator('#read-only').waitFor();
    for (const name of ['Deploy', 'Redeploy', 'Pause', 'Tear down', 'Delete']) {
      assert.equal(await reader.getByRole('button', { name, exact: true }).count(), 0, name);
    }
    await shot(reader, '08-reader');
    await readerContext.close();
  });

  await t.test('sharing the pipeline with the reader as an editor gives them the buttons', async () => {
    const rita = await (await fetch(`${base}/api/v1/me`, { headers: { 'X-API-Key': readerKey } })).json();
    // The current grants answer late (as on a loaded server): what is typed meanwhile must
    // not be overwritten by them.
    await page.route('**/permissions', async (route) => {
      if (route.request().method() === 'GET') await new Promise((r) => setTimeout(r, 1500));
      await route.continue();
    });
    await page.goto(pipelineUrl);
    await page.getByLabel('Editors (user ids)').fill(rita.user_id);
    await page.unroute('**/permissions');
    await page.getByRole('button', { name: 'Save sharing' }).click();
    await page.locator('#share-result', { hasText: 'Sharing saved.' }).waitFor();
    const readerContext = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const reader = await readerContext.newPage();
    await signIn(reader, readerKey);
    await reader.goto(pipelineUrl);
    await reader.getByRole('button', { name: 'Pause' }).waitFor();
    assert.equal(await reader.getByRole('button', { name: 'Save sharing' }).count(), 0, 'editors do not manage');
    await readerContext.close();
  });

  await t.test('at a phone width the list fits the screen', async () => {
    const phone = await browser.newContext({ viewport: { width: 390, height: 844 } });
    const small = await phone.newPage();
    await signIn(small, ownerKey);
    await small.getByRole('link', { name: 'usdc watch' }).waitFor();
    const overflow = await small.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the page is ${overflow}px wider than the screen`);
    await shot(small, '09-phone');
    await phone.close();
  });

  await t.test("the pipeline list shows each pipeline's state and its current rate", async () => {
    const pipelines = await apiGet('/beam');
    const id = (name) => pipelines.find((p) => p.name === name).id;
    const pause = await fetch(`${base}/api/v1/beam/${id('picky')}/pause`, { method: 'POST', headers: { 'X-API-Key': ownerKey } });
    assert.equal(pause.status, 200, await pause.text());
    // 120 more records read: once the (last) minute they were counted in is over, it is the
    // last complete one, and the list shows its rate.
    const before = (await pointsOnceCounted(id('usdc watch'), 'messages_received', 0)).reduce((sum, p) => sum + p.value, 0);
    await ingest(1000, 1120);
    const counted = await pointsOnceCounted(id('usdc watch'), 'messages_received', before + 120);
    const minute = Date.parse(counted.findLast((p) => p.value > 0).timestamp);
    const row = (name) => page.locator(`tr[data-pipeline="${id(name)}"]`);
    let shown = null;
    await page.goto(`${base}/#/`);
    for (let i = 0; ; i++) {
      // A reload reads every pipeline's state and rate again.
      await page.reload();
      await page.getByRole('heading', { name: 'Pipelines' }).waitFor();
      await row('usdc watch').locator('td.rate[data-minute], td.rate:text("—")').waitFor();
      shown = await row('usdc watch').locator('td.rate').getAttribute('data-minute');
      if (shown && Date.parse(shown) >= minute) break;
      assert.ok(i < 80, `the minute of the ingest never became the last complete one (shown: ${shown})`);
      await new Promise((r) => setTimeout(r, 1000));
    }
    assert.equal(await row('usdc watch').locator('td.state').textContent(), 'running · 1/1 workers healthy');
    assert.equal(await row('picky').locator('td.state').textContent(), 'paused');
    assert.equal(await row('watched wallets').locator('td.state').textContent(), 'not deployed');
    assert.equal(await row('picky').locator('td.rate').textContent(), '—');
    const series = (await apiGet(`/beam/${id('usdc watch')}/deploy/metrics?time_range=1h&metrics=messages_received`)).metrics[0];
    const count = series.points.find((p) => p.timestamp === shown).value;
    assert.ok(count >= 1, `records read in the minute from ${shown}: ${count}`);
    const rate = Number.parseFloat(await row('usdc watch').locator('td.rate').textContent());
    assert.ok(Math.abs(rate - count / 60) <= 0.005 * (count / 60), `shown ${rate}/s; the API counts ${count} in that minute`);
    await shot(page, '09b-pipeline-list');
  });

  await t.test('events: the pipeline timeline and the Events page follow live; a failed deploy gets a badge', async () => {
    const call = async (method, path, body) => {
      const response = await fetch(`${base}/api/v1${path}`, {
        method, headers: { 'X-API-Key': ownerKey }, body: body === undefined ? undefined : JSON.stringify(body),
      });
      return { status: response.status, body: await response.json().catch(() => null) };
    };
    await page.goto(pipelineUrl);
    const timeline = page.locator('#timeline');
    await timeline.locator('li[data-kind="pipeline.deployed"]').first().waitFor();
    await page.locator('#timeline[data-live="live"]').waitFor();
    const configId = decodeURIComponent(pipelineUrl.split('#/p/')[1]);
    const paused = await call('POST', `/beam/${configId}/pause`);
    assert.equal(paused.status, 200);
    // Appears without a reload, newest first.
    await timeline.locator('li').first().locator('code', { hasText: 'pipeline.paused' }).waitFor({ timeout: 30_000 });
    assert.equal((await call('POST', `/beam/${configId}/deploy`)).status, 200);
    await shot(page, '10-pipeline-timeline');

    await page.getByRole('link', { name: 'Events' }).click();
    await page.getByRole('heading', { name: 'Events' }).waitFor();
    await page.locator('#events tr[data-kind="pipeline.created"]').first().waitFor();
    await page.locator('#events-live[data-state="live"]').waitFor();
    assert.equal((await call('PUT', '/beam/secrets/soon-gone', { value: 'x' })).status, 200);
    const created = await call('POST', '/beam', {
      name: 'no secret', description: 'its deploy fails',
      pipeline_config: {
        source: { chain: 'base', entity: 'erc20_token_transfer' }, transforms: [],
        sinks: [{ type: 'webhook', name: 'hook', url: 'http://127.0.0.1:9/x', hash_key: 'soon-gone' }],
      },
    });
    assert.equal(created.status, 200, JSON.stringify(created.body));
    assert.ok([200, 204].includes((await call('DELETE', '/beam/secrets/soon-gone')).status));
    assert.equal((await call('POST', `/beam/${created.body.id}/deploy`)).status, 422);
    const failed = page.locator('#events tr[data-kind="pipeline.deploy_failed"]');
    await failed.first().waitFor({ timeout: 30_000 });
    assert.match(await failed.first().textContent(), /soon-gone/);
    await shot(page, '11-events-live');
    // Filtered to one kind: only that kind is listed.
    await page.getByLabel('Kind').fill('pipeline.paused');
    await page.getByRole('button', { name: 'Filter' }).click();
    // The page renders anew for the filter: until it has, the old table (or none, while it
    // loads) is there, and so is the old live marker.
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#events tbody tr')];
      return rows.length >= 1 && rows.every((r) => r.dataset.kind === 'pipeline.paused');
    }, null, { timeout: 30_000 });
    await page.locator('#events-live[data-state="live"]').waitFor();
    const kinds = await page.locator('#events tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.kind));
    assert.ok(kinds.length >= 1 && kinds.every((k) => k === 'pipeline.paused'), kinds.join(','));

    // The pipeline list: a badge on the pipeline whose deploy failed, none on the running one.
    await page.goto(`${base}/#/`);
    const badge = page.locator(`tr[data-pipeline="${created.body.id}"] .problem`);
    await badge.waitFor();
    assert.equal(await badge.textContent(), 'error');
    assert.equal(await page.locator(`tr[data-pipeline="${configId}"] .problem[data-kind="pipeline.deploy_failed"]`).count(), 0);
    await shot(page, '12-pipeline-badges');
  });

  await t.test('sign out forgets the key', async () => {
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('API key').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  });

  assert.deepEqual(problems, [], 'no script errors in the page');
  await context.close();
});

test.after(async () => {
  await browser.close();
  server.kill('SIGTERM');
});
