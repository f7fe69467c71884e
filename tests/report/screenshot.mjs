// A picture of a report's top (the runs and their held-out accuracy against
// wall-clock time and step), as the README shows it, taken in Debian's
// Chromium, headless.
//
//   node tests/report/screenshot.mjs REPORT.html OUT.png
import { chromium } from 'playwright-core';
import path from 'node:path';

const [report, out] = process.argv.slice(2);
if (!report || !out) {
  console.error('usage: node screenshot.mjs REPORT.html OUT.png');
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1240, height: 900 } });
  await page.route('**/*', (route) => (route.request().url().startsWith('file://') ? route.continue() : route.abort()));
  await page.goto('file://' + path.resolve(report));
  await page.waitForFunction(() => window.arealReport && window.arealReport.renders >= 1, null, { timeout: 30_000 });
  // From the title to the first chart after the accuracy charts.
  const bottom = await page.evaluate(() => {
    const third = document.querySelectorAll('.chart')[2];
    return third ? third.getBoundingClientRect().top + window.scrollY : 900;
  });
  await page.screenshot({ path: out, clip: { x: 0, y: 0, width: 1240, height: Math.ceil(bottom) } });
  console.log(`wrote ${out}`);
} finally {
  await browser.close();
}
