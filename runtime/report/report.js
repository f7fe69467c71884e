// Draws the page of `areal report` and of the live dashboard with uPlot. The
// data is what runtime/src/report/ reads from run directories and benchmark
// JSON files: inlined in the page (#areal-data), or fetched from data.json
// every few seconds when the page is live. window.arealReport lists every
// chart drawn with its count of data points, for the browser test.
(function () {
  'use strict';
  const palette = ['#0969da', '#cf222e', '#1a7f37', '#8250df', '#bf8700', '#1b7c83', '#e16f24', '#6e7781'];
  const state = { charts: [], empty: [], errors: [], renders: 0 };
  window.arealReport = state;
  window.addEventListener('error', (e) => state.errors.push(String(e.message)));

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
    }
    return node;
  }
  const finite = (v) => typeof v === 'number' && isFinite(v);
  const fmt = (v, digits = 3) => (finite(v) ? (Math.abs(v) >= 1000 ? v.toFixed(0) : +v.toPrecision(digits)) : '–');
  const pct = (v) => (finite(v) ? (100 * v).toFixed(1) + '%' : '–');

  // Several (x, y) lines on one x axis: the union of their x values, each line null where it has no point.
  function joinLines(lines) {
    const xs = [...new Set(lines.flatMap((l) => l.x.filter(finite)))].sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const ys = lines.map((l) => {
      const y = new Array(xs.length).fill(null);
      l.x.forEach((x, i) => {
        if (index.has(x) && finite(l.y[i])) y[index.get(x)] = l.y[i];
      });
      return y;
    });
    return [xs, ...ys];
  }

  // One chart. spec: {title, note, xLabel, yLabel, lines: [{label, x, y, color, dash, points, bars}],
  // categories (x labels for x = 0, 1, ...), logX}. A chart without any data point is a note instead.
  function chart(parent, spec) {
    const lines = spec.lines.filter((l) => l.y.some(finite));
    const box = el('div', { class: 'chart' }, el('div', { class: 'title' }, spec.title));
    parent.appendChild(box);
    if (!lines.length) {
      box.appendChild(el('div', { class: 'note' }, spec.empty || 'no data yet'));
      state.empty.push(spec.title);
      return;
    }
    const data = joinLines(lines);
    const barLines = lines.filter((l) => l.bars);
    const points = lines.reduce((n, l) => n + l.y.filter(finite).length, 0);
    const cats = spec.categories;
    const series = [{ label: spec.xLabel }].concat(
      lines.map((l, i) => {
        const color = l.color || palette[i % palette.length];
        const s = { label: l.label, stroke: color, width: 1.6, spanGaps: true, points: { show: !!l.points || data[0].length < 40, size: 5 } };
        if (l.dash) s.dash = [6, 4];
        if (l.bars) {
          // Grouped bars: the k-th bar series takes the k-th slot of 0.8 x units around each x.
          const k = barLines.indexOf(l), w = 0.8 / barLines.length;
          s.paths = uPlot.paths.bars({ disp: {
            x0: { unit: 1, values: (u) => u.data[0].map((x) => x - 0.4 + k * w) },
            size: { unit: 1, values: (u) => u.data[0].map(() => w) } } });
          s.fill = color + '99';
          s.points = { show: false };
        }
        return s;
      })
    );
    const xAxis = { label: spec.xLabel };
    const scales = { x: { time: false }, y: {} };
    if (cats) {
      xAxis.splits = () => cats.map((_, i) => i);
      xAxis.values = (u, splits) => splits.map((v) => cats[v] ?? '');
      scales.x.range = () => [-0.5, cats.length - 0.5];
      if (cats.join('').length * 7 > 480) {  // labels that would overlap: slanted, the chart taller by as much
        const longest = Math.min(28, Math.max(...cats.map((c) => c.length)));
        xAxis.values = (u, splits) => splits.map((v) => { const c = cats[v] ?? ''; return c.length > 28 ? c.slice(0, 27) + '…' : c; });
        xAxis.rotate = -25;
        xAxis.size = 30 + 3 * longest;
      }
    }
    if (spec.logX) scales.x.distr = 3;
    if (spec.yRange) scales.y.range = spec.yRange;
    else if (barLines.length) scales.y.range = (u, min, max) => [0, max > 0 ? max * 1.1 : 1];  // bars stand on zero
    const opts = {
      width: 590, height: 200 + (xAxis.size || 50), scales, series,
      axes: [xAxis, { label: spec.yLabel, size: 60 }],
      legend: { live: false },
      cursor: { drag: { x: true, y: false } },
    };
    const plot = new uPlot(opts, data, box);
    if (spec.note) box.appendChild(el('div', { class: 'note' }, spec.note));
    state.charts.push({ title: spec.title, points, plot });
  }

  function table(parent, head, rows) {
    parent.appendChild(el('table', {}, el('tr', {}, head.map((h) => el('th', {}, h))),
      rows.map((r) => el('tr', {}, r.map((c) => el('td', {}, c === null || c === undefined ? '–' : String(c)))))));
  }

  function warnings(parent, list) {
    if (list.length) parent.appendChild(el('div', { class: 'warn' }, el('ul', {}, list.map((w) => el('li', {}, w)))));
  }

  // ---- runs ----
  const col = (run, key) => run.steps[key] || [];
  const perRun = (runs, f) => runs.map((r, i) => Object.assign({ label: r.label, color: palette[i % palette.length] }, f(r)));

  function runsSection(root, runs) {
    root.appendChild(el('h2', {}, 'Runs'));
    table(root, ['run', 'directory', 'mode', 'η', 'state', 'steps', 'wall time', 'held-out accuracy first → last', 'samples trained'],
      runs.map((r) => [r.label, r.dir, r.mode, r.eta, r.state, r.step_count, fmt(r.wall_s) + ' s',
        r.evals.accuracy.length ? pct(r.evals.accuracy[0]) + ' → ' + pct(r.evals.accuracy[r.evals.accuracy.length - 1]) : '–',
        r.accounting.trained]));
    warnings(root, runs.flatMap((r) => r.warnings.map((w) => r.label + ': ' + w)));

    root.appendChild(el('h2', {}, 'Accuracy and reward'));
    let g = root.appendChild(el('div', { class: 'grid' }));
    const evalLines = (xKey) => perRun(runs, (r) => ({ x: r.evals[xKey], y: r.evals.accuracy, points: true }));
    chart(g, { title: 'Held-out accuracy against wall-clock time', xLabel: 'wall-clock time (s)', yLabel: 'accuracy', lines: evalLines('time_s'),
      note: 'one point per evaluation (greedy decoding on the held-out prompts); the paper\'s picture: the same accuracy, sooner', empty: 'no evaluation yet' });
    chart(g, { title: 'Held-out accuracy against step', xLabel: 'training step', yLabel: 'accuracy', lines: evalLines('step'), empty: 'no evaluation yet' });
    chart(g, { title: 'Reward mean against wall-clock time', xLabel: 'wall-clock time (s)', yLabel: 'reward mean',
      lines: perRun(runs, (r) => ({ x: col(r, 'time_s'), y: col(r, 'reward_mean') })) });
    chart(g, { title: 'Reward mean against step', xLabel: 'training step', yLabel: 'reward mean',
      lines: perRun(runs, (r) => ({ x: col(r, 'step'), y: col(r, 'reward_mean') })) });

    root.appendChild(el('h2', {}, 'Staleness'));
    g = root.appendChild(el('div', { class: 'grid' }));
    chart(g, { title: 'Staleness per token: histogram over the run', xLabel: 'versions behind the trained policy', yLabel: 'share of tokens',
      lines: perRun(runs, (r) => {
        const total = r.staleness_histogram.reduce((a, b) => a + b, 0) || 1;
        return { x: r.staleness_histogram.map((_, i) => i), y: r.staleness_histogram.map((c) => c / total), bars: true };
      }), categories: Array.from({ length: Math.max(1, ...runs.map((r) => r.staleness_histogram.length)) }, (_, i) => String(i)) });
    chart(g, { title: 'Staleness per token by step (mean solid, max dashed)', xLabel: 'training step', yLabel: 'versions behind',
      lines: runs.flatMap((r, i) => [
        { label: r.label + ' mean', x: col(r, 'step'), y: col(r, 'staleness_token_mean'), color: palette[i % palette.length] },
        { label: r.label + ' max', x: col(r, 'step'), y: col(r, 'staleness_token_max'), color: palette[i % palette.length], dash: true }]) });
    chart(g, { title: 'Tokens masked by the behaviour-importance cap (w-cap)', xLabel: 'training step', yLabel: 'masked fraction',
      lines: perRun(runs, (r) => ({ x: col(r, 'step'), y: col(r, 'masked_fraction') })) });

    root.appendChild(el('h2', {}, 'Throughput, idle time and weights'));
    g = root.appendChild(el('div', { class: 'grid' }));
    chart(g, { title: 'Generation tokens/s (solid) and training tokens/s (dashed)', xLabel: 'training step', yLabel: 'tokens/s',
      lines: runs.flatMap((r, i) => [
        { label: r.label + ' generation', x: col(r, 'step'), y: col(r, 'generation_tokens_per_s'), color: palette[i % palette.length] },
        { label: r.label + ' training', x: col(r, 'step'), y: col(r, 'training_tokens_per_s'), color: palette[i % palette.length], dash: true }]) });
    chart(g, { title: 'Weight publish, sync and transfer seconds per step', xLabel: 'training step', yLabel: 'seconds',
      lines: runs.flatMap((r, i) => [['weight_publish_s', 'publish', false], ['weight_sync_s', 'sync', true], ['weight_transfer_s', 'transfer', true]]
        .map(([key, name, dash], k) => ({ label: r.label + ' ' + name, x: col(r, 'step'), y: col(r, key), color: palette[(i + 3 * k) % palette.length], dash }))) });
    for (const r of runs)
      chart(g, { title: 'Idle fraction of every actor: ' + r.label, xLabel: 'training step', yLabel: 'idle fraction', yRange: [0, 1],
        lines: Object.entries(r.idle).map(([track, y]) => ({ label: track, x: col(r, 'step'), y })) });

    root.appendChild(el('h2', {}, 'Sample accounting'));
    g = root.appendChild(el('div', { class: 'grid' }));
    for (const r of runs)
      chart(g, { title: 'Samples admitted, trained and dropped: ' + r.label, xLabel: 'training step', yLabel: 'samples (cumulative)',
        lines: [['admitted', false], ['trained', false], ['dropped', true]].map(([key, dash]) => ({ label: key, x: col(r, 'step'), y: col(r, key), dash })) });
    table(root, ['run', 'admitted', 'trained', 'dropped', 'drop reasons', 'as of'],
      runs.map((r) => [r.label, r.accounting.admitted, r.accounting.trained, r.accounting.dropped,
        Object.entries(r.accounting.drop_reasons || {}).map(([k, v]) => k + ': ' + v).join('; ') || 'none', r.accounting.from]));

    root.appendChild(el('h2', {}, 'Timeline'));
    root.appendChild(el('p', { class: 'sub' }, 'Share of each track\'s time by activity (the span of its spans as 100%). For the detail, open ',
      el('code', {}, 'trace.json'), ' of the run directory in ', el('a', { href: 'https://ui.perfetto.dev' }, 'Perfetto'), '.'));
    for (const r of runs) {
      root.appendChild(el('h3', {}, r.label));
      if (!r.timeline) {
        root.appendChild(el('p', { class: 'sub' }, r.timeline_missing || 'no trace'));
        continue;
      }
      const kinds = r.timeline.activities;
      table(root, ['track'].concat(kinds, ['busy']), Object.entries(r.timeline.tracks).map(([track, t]) =>
        [track].concat(kinds.map((k) => (t[k] ? pct(t[k] / r.timeline.span_s) : '')), [pct(Object.values(t).reduce((a, b) => a + b, 0) / r.timeline.span_s)])));
    }

    root.appendChild(el('h2', {}, 'Configuration and machine'));
    for (const r of runs) {
      root.appendChild(el('h3', {}, r.label));
      if (r.machine) table(root, ['fact', 'value'], Object.entries(r.machine).map(([k, v]) => [k, typeof v === 'object' ? JSON.stringify(v) : v]));
      else root.appendChild(el('p', { class: 'sub' }, 'no machine.json in the run directory (written by runs since the report exists)'));
      root.appendChild(el('details', {}, el('summary', {}, 'resolved configuration (config.toml)'), el('pre', {}, r.config || 'no config.toml')));
    }
  }

  // ---- benchmarks ----
  const benchViews = {
    bench_async_vs_sync(g, b) {
      for (const w of b.data.workloads || []) {
        const runs = w.runs || [];
        chart(g, { title: `Trained tokens/s by schedule (${w.name}): ${b.file}`, xLabel: 'schedule', yLabel: 'trained tokens/s', categories: runs.map((r) => r.name),
          lines: [{ label: 'measured', x: runs.map((_, i) => i), y: runs.map((r) => r.trained_tokens_per_s), bars: true },
            { label: 'bound', x: runs.map((_, i) => i), y: runs.map(() => w.bound), dash: true, color: '#6e7781' }],
          note: 'ratio to sync: ' + runs.map((r) => r.name + ' ' + fmt(r.ratio_to_sync) + '×').join(', ') });
      }
    },
    bench_simulate(g, b) {
      const eta = b.data.eta || [];
      if (eta.length) {
        const base = eta[0].run.steady_tokens_per_s || 1;
        chart(g, { title: `Effective throughput by η, relative to η = 0 (Fig. 5c): ${b.file}`, xLabel: 'η', yLabel: '× of η = 0', categories: eta.map((e) => String(e.eta)),
          lines: [{ label: 'simulated', x: eta.map((_, i) => i), y: eta.map((e) => e.run.steady_tokens_per_s / base), bars: true },
            { label: 'paper', x: eta.map((_, i) => i), y: eta.map((e) => e.paper_k_tokens_per_s / eta[0].paper_k_tokens_per_s), bars: true }] });
      }
      const t1 = b.data.table1 || [];
      if (t1.length)
        chart(g, { title: `Async vs sync speedup (Table 1): ${b.file}`, xLabel: 'model', yLabel: 'speedup (×)', categories: t1.map((r) => r.model),
          lines: [{ label: 'simulated', x: t1.map((_, i) => i), y: t1.map((r) => r.speedup), bars: true },
            { label: 'paper', x: t1.map((_, i) => i), y: t1.map((r) => r.paper_speedup), bars: true }] });
      const sc = b.data.scaling || [];
      if (sc.length)
        chart(g, { title: `Scaling efficiency at fixed work per device (Fig. 4): ${b.file}`, xLabel: 'devices', yLabel: 'of linear', logX: true, yRange: [0, 1.1],
          lines: [{ label: 'simulated', x: sc.map((r) => r.devices), y: sc.map((r) => r.efficiency), points: true }] });
    },
    bench_staleness(g, b) {
      const rows = b.data.rows;
      const etas = [...new Set(rows.map((r) => String(r.eta)))];
      const objectives = [...new Set(rows.map((r) => r.objective))];
      const of = (o, key) => etas.map((e) => (rows.find((r) => r.objective === o && String(r.eta) === e) || {})[key] ?? null);
      chart(g, { title: `Held-out accuracy by η, decoupled vs plain PPO (mean over seeds): ${b.file}`, xLabel: 'η (0: synchronous)',
        yLabel: 'accuracy %', categories: etas,
        lines: objectives.map((o) => ({ label: o, x: etas.map((_, i) => i), y: of(o, 'accuracy_mean'), bars: true })),
        note: 'spread (sd over seeds): ' + objectives.map((o) => o + ' ' + of(o, 'accuracy_sd').map((v) => fmt(v, 2)).join('/')).join('; ') +
          (finite(b.data.accuracy_before) ? '; before RL ' + fmt(b.data.accuracy_before) + '%' : '') });
      chart(g, { title: `Staleness the runs had, per token: ${b.file}`, xLabel: 'η (0: synchronous)', yLabel: 'versions behind (mean)',
        categories: etas, lines: objectives.map((o) => ({ label: o, x: etas.map((_, i) => i), y: of(o, 'token_staleness_mean'), points: true })) });
    },
    bench_generation(g, b) {
      const models = Object.entries(b.data).filter(([, v]) => v && typeof v === 'object' && v.decode);
      chart(g, { title: `Decode efficiency by batch (model GFLOP/s ÷ the faster GEMM rate): ${b.file}`, xLabel: 'batch', yLabel: 'efficiency', logX: true,
        lines: models.map(([name, v]) => {
          const batches = Object.keys(v.decode).map(Number).sort((a, c) => a - c);
          return { label: name, x: batches, y: batches.map((n) => v.decode[String(n)].efficiency), points: true };
        }) });
    },
    bench_weight_sync(g, b) {
      const rows = b.data.rows || [];
      const paths = [...new Set(rows.map((r) => r.path))];
      const keys = [...new Set(rows.map((r) => r.size_mib + ' MiB to ' + r.receivers))];
      chart(g, { title: `Weight sync rate by path: ${b.file}`, xLabel: 'path', yLabel: 'GB/s', categories: paths,
        lines: keys.map((k) => {
          const mine = rows.filter((r) => r.size_mib + ' MiB to ' + r.receivers === k);
          return { label: k, x: mine.map((r) => paths.indexOf(r.path)), y: mine.map((r) => r.gb_per_s), bars: true };
        }) });
    },
  };

  function benchSection(root, benches) {
    root.appendChild(el('h2', {}, 'Benchmarks'));
    const g = root.appendChild(el('div', { class: 'grid' }));
    for (const b of benches) benchViews[b.kind](g, b);
  }

  function render(data) {
    for (const c of state.charts) c.plot.destroy();
    state.charts = [];
    state.empty = [];
    const root = document.getElementById('areal-report');
    root.textContent = '';
    const title = data.live ? 'Live: ' + data.runs.map((r) => r.label).join(', ') : 'areal report';
    document.title = title;
    root.appendChild(el('h1', {}, title));
    root.appendChild(el('p', { class: 'sub' }, data.live ? el('span', { class: 'live' }, 'live, refreshed as steps arrive; ') : null,
      'made by areal ' + data.version + ' at ' + data.made + (data.live ? '' : ' (self-contained: this file needs no network)')));
    if (data.runs.length) runsSection(root, data.runs);
    if (data.benches.length) benchSection(root, data.benches);
    state.renders++;
  }

  let shown = document.getElementById('areal-data').textContent;
  render(JSON.parse(shown));
  if (window.AREAL_LIVE) {
    const poll = async () => {
      try {
        const text = await (await fetch('data.json', { cache: 'no-store' })).text();
        if (text !== shown) {
          shown = text;
          render(JSON.parse(text));
        }
      } catch (e) {
        // the run ended and its server with it: the page keeps what it showed
      }
      setTimeout(poll, 2000);
    };
    setTimeout(poll, 2000);
  }
})();
