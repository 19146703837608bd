// Opens the dashboard preview in headless Chromium and keeps a full-page screenshot.
//   node shoot.mjs URL OUT.png   (playwright-core from tests/ui/node_modules)
import { createRequire } from 'node:module';
const require = createRequire(new URL('../../ui/package.json', import.meta.url));
const { chromium } = require('playwright-core');
const [url, out] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.RINGMASTER_CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox', '--disable-gpu'] });
const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
await page.goto(url);
await page.waitForFunction(() => window.previewDone === true, null, { timeout: 60000 });
await page.screenshot({ path: out, fullPage: true });
await browser.close();
