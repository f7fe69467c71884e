// The report and the live dashboard in a real browser (Debian's Chromium,
// headless, driven by playwright-core). Two short real runs: a synchronous one,
// then an asynchronous one with the live dashboard, whose page is checked while
// it trains (every chart drawn with data, redrawn as steps arrive) before the
// run is stopped by SIGINT. Then `areal report` overlays both runs with one
// file of each benchmark kind the report draws, and the file is opened with
// every network request refused: no console error, every chart has data
// points and pixels on its canvas, and a screenshot is taken.
//
//   node report_page_test.mjs AREAL_BINARY CONFIG WORK_DIR
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync, readFileSync } from 'node:fs';
import { freePort } from '../support/free_port.mjs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const [areal, config, work] = process.argv.slice(2);
if (!areal || !config || !work) {
  console.error('usage: node report_page_test.mjs AREAL_BINARY CONFIG WORK_DIR');
  process.exit(2);
}
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
rmSync(work, { recursive: true, force: true });
mkdirSync(work, { recursive: true });
const run = (name, extra) => ['--config', config, '--set', `run.output_dir=${work}`, '--set', `run.name=${name}`, ...extra];

// The browser, with every request that is not the page's own refused and recorded.
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'],
  timeout: 60_000,
});
async function openPage(url, allowedPrefix) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console error: ' + m.text()); });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  await page.route('**/*', (route) => {
    const u = route.request().url();
    if (u.startsWith(allowedPrefix)) return route.continue();
    problems.push('network request refused: ' + u);
    return route.abort();
  });
  await page.goto(url, { timeout: 30_000 });
  await page.waitForFunction(() => window.arealReport && window.arealReport.renders >= 1, null, { timeout: 30_000 });
  return { page, problems };
}
// Every chart drawn: its data points, and the pixels its canvas holds.
const chartFacts = (page) => page.evaluate(() => ({
  renders: window.arealReport.renders,
  empty: window.arealReport.empty,
  errors: window.arealReport.errors,
  charts: window.arealReport.charts.map((c) => {
    const ctx = c.plot.ctx, { width, height } = ctx.canvas;
    const pixels = ctx.getImageData(0, 0, width, height).data;
    let inked = 0;
    for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) inked++;
    return { title: c.title, points: c.points, inked };
  }),
}));
function checkCharts(facts, where, minimum) {
  check(facts.charts.length >= minimum, `${where}: ${facts.charts.length} charts drawn (at least ${minimum})`);
  for (const c of facts.charts)
    check(c.points > 0 && c.inked > 1000, `${where}: "${c.title}" has ${c.points} data points, ${c.inked} inked pixels`);
  check(facts.errors.length === 0, `${where}: no script error (${facts.errors.join('; ')})`);
}

try {
  // 1. The synchronous baseline, to the end.
  const sync = spawnSync(areal, run('sync', ['--set', 'rl.mode=sync']), { stdio: 'inherit', timeout: 120_000 });
  check(sync.status === 0, `the sync run ends with exit code 0 (got ${sync.status})`);

  // 2. The asynchronous run with the live dashboard, long enough to be looked at, then stopped.
  const port = await freePort();
  const node = spawn(areal, run('async', ['--set', 'rl.steps=5000', '--set', `run.dashboard_port=${port}`]),
                     { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  node.stdout.on('data', (d) => { log += d; process.stdout.write(d); });
  node.stderr.on('data', (d) => { log += d; process.stderr.write(d); });
  let exitCode = null;
  const exited = new Promise((resolve) => node.on('exit', (code) => { exitCode = code ?? 128; resolve(); }));
  const killer = setTimeout(() => node.kill('SIGKILL'), 200_000);
  const base = `http://127.0.0.1:${port}/`;
  let steps = 0;
  for (let i = 0; i < 1200 && exitCode === null && steps < 3; ++i) {  // up to 120 s: warm start, then 3 steps
    try {
      steps = (await (await fetch(base + 'data.json')).json()).runs[0].step_count;
    } catch {}
    await sleep(100);
  }
  check(log.includes(`live dashboard at ${base}`), 'the start-up log prints the dashboard\'s address');
  check(steps >= 3, `the live data has the run's steps (${steps})`);
  if (steps >= 3) {
    const live = await openPage(base, `http://127.0.0.1:${port}/`);
    const first = await chartFacts(live.page);
    checkCharts(first, 'live page', 8);
    // Redrawn as steps arrive: the page polls data.json.
    await live.page.waitForFunction((n) => window.arealReport.renders > n, first.renders, { timeout: 30_000 })
      .catch(() => {});
    const later = await chartFacts(live.page);
    check(later.renders > first.renders, `the live page redraws as steps arrive (${first.renders} -> ${later.renders} renders)`);
    await live.page.screenshot({ path: path.join(work, 'live.png') });
    check(live.problems.length === 0, `live page: no console error or outside request (${live.problems.join('; ')})`);
  }
  node.kill('SIGINT');  // stops at the next step boundary, writes its checkpoint and the end line
  await exited;
  clearTimeout(killer);
  check(exitCode === 0, `the async run stops on SIGINT with exit code 0 (got ${exitCode})`);

  // 3. The report of both runs and of one file of each benchmark kind.
  const benches = {
    'async_vs_sync.json': { bench: 'bench_async_vs_sync', workloads: [{ name: 'short', bound: 900, runs: [
      { name: 'sync', trained_tokens_per_s: 500, ratio_to_sync: 1 }, { name: 'eta=2', trained_tokens_per_s: 800, ratio_to_sync: 1.6 }] }] },
    'simulate.json': { bench: 'bench_simulate', eta: [{ eta: '0', paper_k_tokens_per_s: 128.7, run: { steady_tokens_per_s: 1e5 } },
      { eta: 'inf', paper_k_tokens_per_s: 396.8, run: { steady_tokens_per_s: 3e5 } }],
      table1: [{ model: 'qwen2-1.5b', speedup: 1.9, paper_speedup: 2.77 }], scaling: [{ devices: 16, efficiency: 1 }, { devices: 512, efficiency: 0.98 }] },
    'staleness.json': { bench: 'bench_staleness', accuracy_before: 5, rows: [
      { objective: 'decoupled', eta: '0', accuracy_mean: 30, accuracy_sd: 1, token_staleness_mean: 0 },
      { objective: 'decoupled', eta: 'inf', accuracy_mean: 28, accuracy_sd: 2, token_staleness_mean: 3.5 },
      { objective: 'plain', eta: '0', accuracy_mean: 30, accuracy_sd: 1, token_staleness_mean: 0 },
      { objective: 'plain', eta: 'inf', accuracy_mean: 20, accuracy_sd: 4, token_staleness_mean: 3.4 }] },
    'generation.json': { bench: 'bench_generation', tiny: { decode: { 1: { efficiency: 0.1 }, 64: { efficiency: 0.6 } } } },
    'weight_sync.json': { bench: 'bench_weight_sync', rows: [{ path: 'gloo', size_mib: 16, receivers: 1, gb_per_s: 1.5 },
      { path: 'gloo', size_mib: 256, receivers: 1, gb_per_s: 2.5 }] },
  };
  const benchArgs = [];
  for (const [file, content] of Object.entries(benches)) {
    writeFileSync(path.join(work, file), JSON.stringify(content));
    benchArgs.push('--bench', path.join(work, file));
  }
  const out = path.join(work, 'report.html');
  const made = spawnSync(areal, ['report', path.join(work, 'sync'), path.join(work, 'async'), ...benchArgs, '--out', out],
                         { encoding: 'utf8', timeout: 60_000 });
  process.stdout.write(made.stdout + made.stderr);
  check(made.status === 0 && existsSync(out), `areal report writes ${out} (exit ${made.status})`);
  const html = readFileSync(out, 'utf8');
  check(!/<script[^>]+src=|<link[^>]+href=/.test(html), 'the report loads no script or style from elsewhere');
  const report = await openPage('file://' + out, 'file://');
  const facts = await chartFacts(report.page);
  // 2 runs: 4 accuracy/reward + 3 staleness + 2 throughput + 2 idle + 2 accounting; benchmarks: 1 + 3 + 2 + 1 + 1.
  checkCharts(facts, 'report', 21);
  check(facts.empty.length === 0, `report: no chart without data (${facts.empty.join('; ')})`);
  const labels = await report.page.evaluate(() => window.arealReport.charts[0].plot.series.slice(1).map((s) => s.label));
  check(labels.length === 2 && labels[0].includes('sync') && labels[1].includes('async'),
        `report: accuracy against wall-clock time overlays both runs (${labels.join(', ')})`);
  await report.page.screenshot({ path: path.join(work, 'report.png'), fullPage: true });
  check(report.problems.length === 0, `report: no console error or network request (${report.problems.join('; ')})`);

  // 4. A bad input is refused with the file named, and nothing is written.
  writeFileSync(path.join(work, 'bad.json'), '{"bench": "bench_async_vs_sync",\n "workloads": [}');
  const bad = spawnSync(areal, ['report', '--bench', path.join(work, 'bad.json'), '--out', path.join(work, 'bad.html')],
                        { encoding: 'utf8', timeout: 60_000 });
  check(bad.status === 2 && bad.stderr.includes('bad.json line 2') && !existsSync(path.join(work, 'bad.html')),
        `a damaged benchmark file: exit 2 naming its line, nothing written (${bad.stderr.trim()})`);
} finally {
  await browser.close();
}
console.log(failures.length ? `${failures.length} check(s) failed` : 'all checks passed');
process.exit(failures.length ? 1 : 0);
