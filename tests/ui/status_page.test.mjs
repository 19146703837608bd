// The status page (/ui) in real headless Chromium: Debian's /usr/bin/chromium driven by
// playwright-core (no browser download). A `ringmaster serve` with two simulated servers and
// two router variants; the page shows nothing without the admin token and everything with
// it, follows the gateway live (a server added, a policy swapped), and its buttons go through
// the admin API (weight, rollback, drain). A screenshot is kept under tests/ui/artifacts/.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const target = process.env.CARGO_TARGET_DIR || join(root, 'target');
const binary = process.env.RINGMASTER_BIN || join(target, 'debug/ringmaster');
const browserPath = process.env.RINGMASTER_CHROMIUM || '/usr/bin/chromium';
const artifacts = process.env.RINGMASTER_UI_ARTIFACTS || join(root, 'tests/ui/artifacts');
const TOKEN = 'status-page-test-token-0123456789';

let gateway;
let base;
let browser;
let logs = '';

function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
    server.on('error', fail);
  });
}

async function until(what, check, ms = 15000) {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
    } catch (_) { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}\n--- gateway log ---\n${logs.slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const admin = (method, path, body, type) => fetch(`${base}${path}`, {
  method,
  headers: { authorization: `Bearer ${TOKEN}`, ...(type ? { 'content-type': type } : {}) },
  body,
});
const adminJson = async (path) => (await admin('GET', path)).json();

async function send(door, i) {
  const body = door === 'messages'
    ? { model: 'sim-llama-3-8b', max_tokens: 8, messages: [{ role: 'user', content: `hello ${i}` }] }
    : { model: 'sim-llama-3-8b', max_tokens: 8, messages: [{ role: 'user', content: `hi ${i}` }] };
  const path = door === 'messages' ? '/v1/messages' : '/v1/chat/completions';
  const response = await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-session-id': `s${i}` }, body: JSON.stringify(body),
  });
  await response.text();
  return response.status;
}

before(async () => {
  assert.ok(existsSync(binary), `${binary} is missing: build it first (cargo build -p ringmaster)`);
  assert.ok(existsSync(browserPath), `${browserPath} is missing: apt-get install chromium (tests/run does)`);
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const dir = mkdtempSync(join(tmpdir(), 'ringmaster-ui-'));
  const config = join(dir, 'gateway.toml');
  writeFileSync(config, `listen = "127.0.0.1:${port}"
admin_token = "${TOKEN}"
[simulator]
time_scale = 0.3
[[servers]]
address = "sim://gpu-0"
[[servers]]
address = "sim://gpu-1"
role = "decode"
[[servers]]
address = "sim://gpu-p"
role = "prefill"
[[policies.router]]
name = "control"
source = "builtin:prefix-affinity"
[[policies.router]]
name = "candidate"
source = "builtin:least-loaded"
weight = 50
`);
  gateway = spawn(binary, ['serve', '--config', config], { env: { ...process.env, RUST_LOG: 'warn' } });
  gateway.stdout.on('data', (d) => { logs += d; });
  gateway.stderr.on('data', (d) => { logs += d; });
  await until('the gateway', async () => (await fetch(`${base}/healthz`)).ok);
  // Traffic for the experiment's figures, on both doors; one refused request for the errors.
  // Eight at a time, so that some wait behind others and the TTFT chart has a spread.
  for (let batch = 0; batch < 6; batch++) {
    const sent = [];
    for (let i = batch * 8; i < batch * 8 + 8; i++) sent.push(send(i % 2 ? 'messages' : 'openai', i));
    for (const status of await Promise.all(sent)) assert.equal(status, 200);
  }
  const bad = await fetch(`${base}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model": 7}' });
  assert.equal(bad.status, 400);
  browser = await chromium.launch({ executablePath: browserPath, args: ['--no-sandbox', '--disable-gpu'] });
});

after(async () => {
  if (browser) await browser.close();
  if (gateway) gateway.kill('SIGTERM');
});

test('without the token the page and the admin API show nothing', async () => {
  for (const path of ['/admin/status', '/admin/events']) {
    const response = await fetch(`${base}${path}`);
    assert.equal(response.status, 401, path);
  }
  const page = await browser.newPage();
  await page.goto(`${base}/ui`);
  await page.waitForSelector('#login-form', { state: 'visible' });
  assert.equal(await page.isHidden('#app'), true);
  // Nothing from the gateway on the page (innerText: what is rendered), nor in its markup.
  const text = await page.innerText('body');
  const markup = await page.content();
  for (const secret of ['gpu-0', 'candidate', 'sim-llama-3-8b', 'prefix-affinity']) {
    assert.ok(!text.includes(secret) && !markup.includes(secret), `shows ${secret}`);
  }
  // A wrong token is refused and nothing appears.
  await page.fill('#token', 'not-the-token-at-all-000000');
  await page.click('button[type=submit]');
  await page.waitForSelector('#login-error:has-text("refused")');
  assert.equal(await page.isHidden('#app'), true);
  await page.close();
});

test('with the token it shows the servers, the variants and the experiment, live, and its buttons work', async () => {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
  page.on('dialog', (dialog) => dialog.accept());
  await page.goto(`${base}/ui`);
  await page.fill('#token', TOKEN);
  await page.click('button[type=submit]');
  await page.waitForSelector('#live[data-state="live"]');
  // The servers and the variants of the started gateway.
  await page.waitForSelector('#servers tr[data-server="gpu-0"]');
  await page.waitForSelector('#servers tr[data-server="gpu-1"]');
  // Each server's part in a disaggregated fleet.
  const roles = await page.$$eval('#servers tbody tr', (rows) => rows.map((r) => [r.dataset.server, r.cells[2].textContent]));
  assert.deepEqual(roles, [['gpu-0', 'both'], ['gpu-1', 'decode (ringmaster)'], ['gpu-p', 'prefill (ringmaster)']]);
  // Each server's KV cache: the blocks in use and those holding reusable prefixes, of all (an
  // idle server uses none; its cached blocks are where its hit ratio comes from).
  const kv = await page.$$eval('#servers tbody tr', (rows) => rows.map((r) => r.cells[7].textContent));
  assert.ok(kv.every((t) => /^[\d,]+ used, [\d,]+ cached \/ [\d,]+ blocks$/.test(t)), kv.join(' | '));
  const variants = await page.$$eval('#variants tbody tr', (rows) => rows.map((r) => r.dataset.variant));
  assert.deepEqual(variants, ['control', 'candidate']);
  const experiment = await page.$$eval('#experiment tbody tr', (rows) => rows.map((r) => r.cells[0].textContent));
  assert.deepEqual(experiment, ['control', 'candidate']);
  // Each variant's cache taken of the cache reachable, as /admin/experiments counts it.
  const counted = (await adminJson('/admin/experiments')).variants;
  assert.ok(counted.every((v) => v.cached_tokens && 'reachable' in v.cached_tokens && 'achieved' in v.cached_tokens));
  // In the prompt's own unit: never more taken than there was prompt.
  assert.ok(counted.every((v) => v.cached_tokens.achieved <= v.cached_tokens.reachable
    && v.cached_tokens.reachable <= v.cached_tokens.prompt), JSON.stringify(counted.map((v) => v.cached_tokens)));
  const reach = await page.$$eval('#experiment tbody tr', (rows) => rows.map((r) => r.cells[4].textContent));
  assert.ok(reach.every((t) => t === '—' || /% \(\d+ of \d+\)$/.test(t)), reach.join(' | '));
  assert.ok(await page.$('#ttft-chart canvas'), 'the TTFT chart is drawn');
  await page.waitForSelector('#errors tbody tr:has-text("invalid_request_error")');
  assert.ok(['scale_up', 'scale_down', 'hold'].includes(await page.textContent('#autoscale-recommendation')));

  // Live: a server added through the admin API appears without a reload.
  const added = await admin('POST', '/admin/servers', JSON.stringify({ address: 'sim://gpu-2' }), 'application/json');
  assert.equal(added.status, 201, await added.text());
  await page.waitForSelector('#servers tr[data-server="gpu-2"]', { timeout: 10000 });

  // Live: a policy swap shows the new version, with the old one as an earlier version.
  const before = (await adminJson('/admin/policies')).router.variants.find((v) => v.name === 'candidate').hash;
  const wasm = readFileSync(join(root, 'policies/dist/round-robin.wasm'));
  const swapped = await admin('PUT', '/admin/policies/router?variant=candidate', wasm, 'application/wasm');
  assert.ok(swapped.ok, await swapped.text());
  const after = (await adminJson('/admin/policies')).router.variants.find((v) => v.name === 'candidate').hash;
  assert.notEqual(after, before);
  await page.waitForSelector(`#variants tr[data-variant="candidate"] td:has-text("${after.slice(0, 12)}")`, { timeout: 10000 });
  await page.waitForSelector(`#variants tr[data-variant="candidate"] td:has-text("${before.slice(0, 12)}")`);

  // The weight box sets the variant's weight through the admin API.
  await page.fill('[data-testid="weight-candidate"]', '30');
  await page.click('[data-testid="set-weight-candidate"]');
  await until('the weight', async () => (await adminJson('/admin/policies')).router.variants.find((v) => v.name === 'candidate').weight === 30);

  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: join(artifacts, 'status-page.png'), fullPage: true });

  // Roll back: the earlier version is running again.
  await page.click('[data-testid="rollback-candidate"]');
  await until('the rollback', async () => (await adminJson('/admin/policies')).router.variants.find((v) => v.name === 'candidate').hash === before);
  await page.waitForSelector(`#variants tr[data-variant="candidate"] td:nth-child(3):has-text("${before.slice(0, 12)}")`, { timeout: 10000 });

  // Drain: the server takes no new requests and leaves the pool.
  await page.click('[data-testid="drain-gpu-1"]');
  await until('gpu-1 drained', async () => {
    const servers = (await adminJson('/admin/servers')).servers;
    const gpu1 = servers.find((s) => s.id === 'gpu-1');
    return !gpu1 || gpu1.state === 'draining';
  });
  await page.waitForSelector('#servers tr[data-server="gpu-1"]', { state: 'detached', timeout: 10000 });
  await page.close();
});
