// Ringmaster's status page. Everything it shows comes from the admin API's server-sent
// events (`GET /admin/events`, one status document each time it changes), read with fetch so
// that the admin token travels in a header, never in a URL. Buttons call the admin API's own
// endpoints. Data is written into the page with textContent only.
'use strict';

const TOKEN_KEY = 'ringmaster.admin-token';
const $ = (selector) => document.querySelector(selector);
let token = sessionStorage.getItem(TOKEN_KEY);
let stream = null;
let chart = null;
let chartVariants = '';

function setLive(state, text) {
  const live = $('#live');
  live.dataset.state = state;
  live.textContent = text;
}

function showLogin(message) {
  if (stream) stream.abort();
  $('#app').hidden = true;
  $('#forget').hidden = true;
  $('#login').hidden = false;
  $('#login-error').textContent = message || '';
  setLive('idle', 'not connected');
  $('#token').focus();
}

$('#login-form').addEventListener('submit', (event) => {
  event.preventDefault();
  token = $('#token').value.trim();
  $('#token').value = '';
  sessionStorage.setItem(TOKEN_KEY, token);
  connect();
});

$('#forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  token = null;
  showLogin();
});

function admin(method, path) {
  return fetch(path, { method, headers: { Authorization: `Bearer ${token}` } });
}

async function connect() {
  if (!token) return showLogin();
  if (stream) stream.abort();
  stream = new AbortController();
  const signal = stream.signal;
  setLive('connecting', 'connecting…');
  try {
    const response = await fetch('/admin/events', {
      headers: { Authorization: `Bearer ${token}` },
      signal,
    });
    if (response.status === 401 || response.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      token = null;
      return showLogin('That token was refused.');
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    $('#login').hidden = true;
    $('#app').hidden = false;
    $('#forget').hidden = false;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        onEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
    throw new Error('the stream ended');
  } catch (error) {
    if (signal.aborted) return;
    setLive('reconnecting', `reconnecting (${error.message})`);
    setTimeout(connect, 2000);
  }
}

function onEvent(block) {
  let name = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (line.startsWith('event:')) name = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
  }
  if (name !== 'status' || data.length === 0) return;
  render(JSON.parse(data.join('\n')));
  setLive('live', `live · ${new Date().toLocaleTimeString()}`);
}

// ---- rendering ----------------------------------------------------------------------

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? '—' : String(text);
  if (className) td.className = className;
  return td;
}

function button(label, onClick, testId) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  if (testId) b.dataset.testid = testId;
  b.addEventListener('click', onClick);
  return b;
}

function fill(tableSelector, rows, each) {
  const body = $(`${tableSelector} tbody`);
  body.replaceChildren();
  for (const row of rows) each(body.insertRow(), row);
}

const pct = (x) => (x === null || x === undefined ? '—' : `${(100 * x).toFixed(1)} %`);
const secs = (x) => (x === null || x === undefined ? '—' : x < 1 ? `${(1000 * x).toFixed(0)} ms` : `${x.toFixed(2)} s`);
const short = (hash) => (hash ? hash.slice(0, 12) : '—');

function render(doc) {
  const g = doc.gateway;
  $('#gateway-info').textContent = `v${g.version} · up ${Math.round(g.uptime_s)} s · models ${g.models.join(', ')}`;
  renderServers(doc.servers.servers || []);
  renderPolicies(doc.policies);
  renderExperiment(doc.experiments);
  renderAutoscale(doc.autoscale);
  renderCluster(doc.cluster);
  fill('#errors', doc.errors, (row, e) => {
    cell(row, new Date(e.at_ms).toLocaleTimeString());
    cell(row, e.request_id);
    cell(row, e.route);
    cell(row, e.status, 'num');
    cell(row, e.kind);
    cell(row, e.message, 'message');
  });
}

function renderServers(servers) {
  const active = servers.filter((s) => s.state === 'active').length;
  $('#servers-summary').textContent = `${active} active of ${servers.length}`;
  fill('#servers', servers, (row, s) => {
    row.dataset.server = s.id;
    const engine = s.engine || {};
    cell(row, s.id).title = s.address;
    cell(row, s.state, `state-${s.state}`);
    // Its part in a disaggregated fleet: whole requests, or prefill or decode legs and how
    // its KV cache moves.
    cell(row, s.disaggregation ? `${s.role} (${s.disaggregation})` : s.role, `role-${s.role}`);
    const health = !s.routable ? 'unroutable' : 'ok';
    // Why, when the server says (a remote server's health reason, else its last failure).
    const why = s.health && (s.health.reason || (s.health.last_error && s.health.last_error.message));
    cell(row, health, `health-${health}`).title = why || '';
    cell(row, s.in_flight, 'num');
    cell(row, engine.waiting, 'num');
    cell(row, engine.prefill_backlog_tokens ?? s.prefill_backlog_tokens, 'num');
    // Used and cached (a prefix kept for reuse, where the hit ratio beside it comes from) of
    // all: an idle server uses none, and "used / total" alone read 0 beside a high hit ratio.
    const kv = s.kv_cache;
    cell(row, kv ? kv.summary : '—', 'num').title = kv ? `${kv.free} free` : '';
    cell(row, pct(engine.prefix_cache_hit_ratio), 'num');
    cell(row, s.cache_view);
    cell(row, pct(s.ring_share), 'num');
    cell(row, s.requests_total, 'num');
    const actions = row.insertCell();
    if (s.state === 'active') {
      actions.append(button('Drain', () => act(
        `Drain ${s.id}? It takes no new requests and leaves once its requests finish.`,
        'DELETE', `/admin/servers/${encodeURIComponent(s.id)}`), `drain-${s.id}`));
    }
  });
}

function renderPolicies(policies) {
  const rows = [];
  for (const v of policies.router.variants) rows.push({ slot: 'router', ...v });
  if (policies.router.shadow) rows.push({ slot: 'router (shadow)', ...policies.router.shadow });
  for (const slot of ['admission', 'safety_filter']) {
    const p = policies[slot] && policies[slot].policy;
    if (p) rows.push({ slot, ...p });
  }
  fill('#variants', rows, (row, v) => {
    row.dataset.variant = v.name || v.slot;
    cell(row, v.slot);
    cell(row, v.name);
    cell(row, short(v.hash)).title = v.hash || '';
    const weightCell = row.insertCell();
    if (v.slot === 'router' && v.weight !== undefined) {
      const input = document.createElement('input');
      input.type = 'number';
      input.min = '0';
      input.className = 'weight';
      input.value = v.weight;
      input.dataset.testid = `weight-${v.name}`;
      weightCell.append(input, ' ', button('Set', () => act(null, 'POST',
        `/admin/policies/router/weight?variant=${encodeURIComponent(v.name)}&weight=${encodeURIComponent(input.value)}`),
        `set-weight-${v.name}`));
    } else {
      weightCell.textContent = v.weight ?? '—';
    }
    cell(row, v.loaded_at ? new Date(v.loaded_at * 1000).toLocaleTimeString() : null);
    const faults = v.faults ? Object.values(v.faults).reduce((a, b) => a + b, 0) : null;
    cell(row, faults, 'num');
    const earlier = v.previous_versions || [];
    cell(row, earlier.length ? earlier.map((p) => short(p.hash || p)).join(', ') : 'none').title =
      earlier.map((p) => p.hash || p).join('\n');
    const actions = row.insertCell();
    if (earlier.length) {
      const path = v.slot === 'router'
        ? `/admin/policies/router/rollback?variant=${encodeURIComponent(v.name)}`
        : `/admin/policies/${v.slot.replace('_', '-')}/rollback`;
      actions.append(button('Roll back', () => act(
        `Roll ${v.name || v.slot} back to its previous version?`, 'POST', path),
        `rollback-${v.name || v.slot}`));
    }
  });
}

function renderExperiment(experiments) {
  const variants = experiments.variants || [];
  fill('#experiment', variants, (row, v) => {
    cell(row, v.name);
    cell(row, v.requests, 'num');
    cell(row, pct(v.error_rate), 'num');
    cell(row, pct(v.prefix_cache_hit_ratio), 'num');
    const reach = v.cached_tokens || {};
    cell(row, reach.reachable ? `${pct(reach.achieved_of_reachable)} (${reach.achieved} of ${reach.reachable})` : '—', 'num')
      .title = 'prompt tokens the chosen servers held / the most any server held';
    const t = v.ttft_seconds;
    cell(row, t ? secs(t.mean) : null, 'num');
    cell(row, t ? secs(t.p50) : null, 'num');
    cell(row, t ? secs(t.p99) : null, 'num');
    const vs = v.ttft_vs_control;
    const ci = vs && vs.always_valid_ci95;
    cell(row, ci ? `${secs(ci[0] ?? ci.low)} … ${secs(ci[1] ?? ci.high)}` : vs ? 'gathering samples' : 'control');
    cell(row, vs ? vs.verdict : null, vs ? `verdict-${vs.verdict}` : '');
  });
  drawTtft(variants);
}

const COLOURS = ['#2457c5', '#d0641b', '#1f7a3a', '#8e44ad', '#b3261e', '#00838f'];

function drawTtft(variants) {
  const withSamples = variants.filter((v) => v.ttft_histogram);
  if (withSamples.length === 0) return;
  const edges = withSamples[0].ttft_histogram.le;
  const x = edges.concat([edges[edges.length - 1] * 2]).map((_, i) => i);
  const series = withSamples.map((v) => {
    const { counts, samples } = v.ttft_histogram;
    return counts.map((c) => (samples ? (100 * c) / samples : 0));
  });
  const names = withSamples.map((v) => v.name).join('|');
  const labels = edges.map((e) => (e < 1 ? `${Math.round(e * 1000)}ms` : `${e}s`)).concat(['more']);
  const container = $('#ttft-chart');
  const width = Math.max(320, container.clientWidth || 800);
  if (!chart || names !== chartVariants) {
    if (chart) chart.destroy();
    chartVariants = names;
    chart = new uPlot({
      width, height: 220,
      scales: { x: { time: false } },
      axes: [
        { values: (_, ticks) => ticks.map((t) => labels[t] ?? '') },
        { label: '% of requests', values: (_, ticks) => ticks.map((t) => `${t}`) },
      ],
      series: [{ label: 'TTFT ≤' , value: (_, i) => (i === null ? '—' : labels[i]) }].concat(withSamples.map((v, i) => ({
        label: v.name,
        stroke: COLOURS[i % COLOURS.length],
        width: 2,
        paths: uPlot.paths.stepped({ align: 1 }),
        value: (_, y) => (y === null ? '—' : `${y.toFixed(1)} %`),
      }))),
    }, [x, ...series], container);
  } else {
    chart.setData([x, ...series]);
  }
}

function renderAutoscale(a) {
  const dl = $('#autoscale');
  dl.replaceChildren();
  const rows = [
    ['recommendation', a.recommendation],
    ['recommended servers', a.recommended_servers],
    ['servers', a.servers],
    ['utilisation', pct(a.utilisation)],
    ['queued tokens', a.queued_tokens],
    ['thresholds', `${pct(a.scale_down_threshold)} … ${pct(a.scale_up_threshold)}`],
  ];
  for (const [k, v] of rows) {
    const dt = document.createElement('dt');
    dt.textContent = k;
    const dd = document.createElement('dd');
    dd.textContent = v ?? '—';
    if (k === 'recommendation') dd.id = 'autoscale-recommendation';
    dl.append(dt, dd);
  }
}

function renderCluster(c) {
  $('#cluster-note').textContent = c.cluster
    ? `replica ${c.cluster.replica} · revision ${c.cluster.applied_revision} of ${c.cluster.head_revision} · Redis ${c.cluster.redis_up ? 'up' : 'DOWN'}`
    : (c.note || c.error || '');
  fill('#replicas', c.replicas || [], (row, r) => {
    cell(row, r.this ? `${r.replica} (this)` : r.replica);
    cell(row, r.applied_revision, 'num');
    cell(row, r.behind, 'num');
    cell(row, `${r.lease_age_ms} ms`, 'num');
    cell(row, r.servers, 'num');
  });
}

async function act(question, method, path) {
  if (question && !window.confirm(question)) return;
  const result = $('#action-result');
  try {
    const response = await admin(method, path);
    const text = await response.text();
    let message = response.ok ? 'done' : text.slice(0, 300);
    try {
      const answer = JSON.parse(text);
      if (answer.error) message = answer.error.message || answer.error.type;
    } catch (_) { /* not JSON: the text as it came */ }
    result.textContent = `${method} ${path} → ${response.status}: ${message}`;
    result.className = response.ok ? 'action-result' : 'action-result error';
  } catch (error) {
    result.textContent = `${method} ${path}: ${error.message}`;
    result.className = 'action-result error';
  }
}

connect();
