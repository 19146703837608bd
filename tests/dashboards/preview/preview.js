// Draws examples/grafana/ringmaster.json's panels from Prometheus (proxied at /api/v1) the way
// the dashboard lays them out: rows, timeseries and stat panels, each query as Grafana would
// send it with the template variables set to "all". For the README's picture only.
'use strict';
const COLS = 24, ROW_PX = 28, COLOURS = ['#73bf69', '#f2cc0c', '#5794f2', '#ff9830', '#f2495c', '#b877d9', '#8ab8ff', '#ff780a'];

function substitute(expr, step) {
  return expr
    .replace(/\$__rate_interval/g, `${Math.max(4 * step, 30)}s`)
    .replace(/\$__interval/g, `${step}s`)
    .replace(/\$__range/g, '3m')
    .replace(/\$\{?(job|instance|variant|server)\}?/g, '.*');
}

async function range(expr, start, end, step) {
  const url = `/api/v1/query_range?query=${encodeURIComponent(substitute(expr, step))}&start=${start}&end=${end}&step=${step}`;
  const answer = await (await fetch(url)).json();
  if (answer.status !== 'success') throw new Error(answer.error || 'query failed');
  return answer.data.result;
}

function legend(format, metric) {
  if (!format || format === '__auto') return Object.values(metric).join(' ') || 'value';
  return format.replace(/\{\{\s*(\w+)\s*\}\}/g, (_, k) => metric[k] ?? '');
}

async function draw(panel, box, start, end, step) {
  const series = [];
  for (const target of panel.targets || []) {
    if (!target.expr) continue;
    try {
      for (const r of await range(target.expr, start, end, step)) {
        series.push({ name: legend(target.legendFormat, r.metric), values: r.values });
      }
    } catch (e) { /* an empty panel, as Grafana would show "no data" */ }
  }
  if (panel.type === 'stat' || panel.type === 'gauge') {
    const last = series.map((s) => Number(s.values[s.values.length - 1][1]));
    const unit = panel.fieldConfig?.defaults?.unit || '';
    const show = (v) => (unit.startsWith('percent') ? `${(unit === 'percentunit' ? 100 * v : v).toFixed(1)}%` : unit === 's' ? `${(1000 * v).toFixed(0)} ms` : Number.isInteger(v) ? `${v}` : v.toFixed(2));
    box.insertAdjacentHTML('beforeend', '<div class="stat"></div>');
    box.lastChild.textContent = last.length ? last.map(show).join(' / ') : 'No data';
    return;
  }
  const times = [];
  for (let t = start; t <= end; t += step) times.push(t);
  const data = [times];
  for (const s of series) {
    const byTime = new Map(s.values.map(([t, v]) => [t, Number(v)]));
    data.push(times.map((t) => (byTime.has(t) && Number.isFinite(byTime.get(t)) ? byTime.get(t) : null)));
  }
  if (series.length === 0) { box.insertAdjacentHTML('beforeend', '<div class="stat"><small>No data</small></div>'); return; }
  const width = box.clientWidth - 4, height = box.clientHeight - 26;
  new uPlot({
    width, height,
    legend: { show: series.length <= 6 },
    axes: [{ stroke: '#8e8e9b', grid: { stroke: '#2a2d33' } }, { stroke: '#8e8e9b', grid: { stroke: '#2a2d33' }, size: 48 }],
    series: [{}].concat(series.map((s, i) => ({ label: s.name.slice(0, 40), stroke: COLOURS[i % COLOURS.length], width: 1.5, spanGaps: true }))),
  }, data, box);
}

async function main() {
  const dashboard = await (await fetch('/dashboard.json')).json();
  const end = Math.floor(Date.now() / 1000), start = end - 180, step = 5;
  const grid = document.getElementById('grid');
  const width = grid.clientWidth;
  const jobs = [];
  let bottom = 0;
  for (const panel of dashboard.panels) {
    const g = panel.gridPos;
    const x = (g.x / COLS) * width, y = g.y * ROW_PX, w = (g.w / COLS) * width - 6, h = g.h * ROW_PX - 6;
    bottom = Math.max(bottom, y + h + 10);
    if (panel.type === 'row') {
      grid.insertAdjacentHTML('beforeend', `<div class="row" style="left:${x}px;top:${y}px"></div>`);
      grid.lastChild.textContent = panel.title;
      continue;
    }
    const box = document.createElement('div');
    box.className = 'panel';
    Object.assign(box.style, { left: `${x}px`, top: `${y}px`, width: `${w}px`, height: `${h}px` });
    const title = document.createElement('h3');
    title.textContent = panel.title;
    box.append(title);
    grid.append(box);
    jobs.push(draw(panel, box, start, end, step));
  }
  grid.style.height = `${bottom}px`;
  await Promise.all(jobs);
  window.previewDone = true;
}
main().catch((e) => { document.body.append(`preview failed: ${e.message}`); window.previewDone = true; });
