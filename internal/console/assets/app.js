// The Handoff console: one page over the admin API's REST calls. No
// framework and no build step; every value from the API is put on the page
// as text, never as markup.
'use strict';

(() => {
  const TOKEN_KEY = 'handoff.token';
  const STATES = ['pending', 'approved', 'replaying', 'done', 'failed-replay', 'terminated', 'expired'];
  const CLOSED = ['done', 'failed-replay', 'terminated', 'expired'];
  const SERIES = [
    ['handled', 'success'],
    ['retried', 'retry'],
    ['deadLettered', 'dead-letter'],
    ['other', 'other'],
  ];
  const PAGE_SIZE = 50;
  const BODY_LIMIT = 64 * 1024;

  const $ = (id) => document.getElementById(id);
  const view = $('view');
  let timer = null; // the shown view's refresh
  let generation = 0; // bumped on each route: late answers of a left view are dropped
  let sources = null; // the sidecar's source names, from its status

  // el makes an element: attrs are properties (or attributes for aria-*,
  // data-*, for, role), children are nodes or text.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('aria-') || k.startsWith('data-') || k === 'for' || k === 'role') e.setAttribute(k, v === true ? '' : String(v));
      else if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e[k] = v;
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  // fill puts children in node instead of what it held, leaving out the
  // empty ones (null, undefined, false) and flattening lists.
  function fill(node, ...children) {
    node.replaceChildren(...children.flat(Infinity).filter((c) => c !== undefined && c !== null && c !== false));
  }
  const svg = (tag, attrs) => {
    const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  };

  // ---- the API ----

  class APIError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

  async function call(method, path, body, tok) {
    const headers = { Authorization: 'Bearer ' + (tok === undefined ? token() : tok) };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch(path, { method, headers, cache: 'no-store', body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      throw new APIError(0, 'the sidecar did not answer: ' + e.message);
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (res.ok) return data;
    // The API's own words, as it gave them.
    const msg = data && typeof data.message === 'string' ? data.message : (text || res.statusText);
    throw new APIError(res.status, msg);
  }

  // api calls with the tab's token; a 401 signs the tab out.
  async function api(method, path, body) {
    try {
      return await call(method, path, body);
    } catch (e) {
      if (e.status === 401) {
        signOut('The token was refused. Sign in again.');
      }
      throw e;
    }
  }

  const q = (params) => {
    const s = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (Array.isArray(v)) v.forEach((x) => s.append(k, x));
      else if (v !== undefined && v !== null && v !== '') s.append(k, v);
    }
    const out = s.toString();
    return out ? '?' + out : '';
  };
  // idPath keeps a dead letter's slashes (the route takes {id=**}); a
  // segment of dots is escaped, or the URL would resolve it away.
  const idPath = (id) => id.split('/').map((seg) => (/^\.+$/.test(seg) ? seg.replace(/\./g, '%2E') : encodeURIComponent(seg))).join('/');
  // go shows hash, or shows the view again when it is already there (a
  // filter applied twice, Clear on a clear list).
  function go(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  // ---- errors and confirmation ----

  function showError(e) {
    const box = $('error');
    if (!e) { box.hidden = true; box.textContent = ''; return; }
    box.textContent = e instanceof APIError && e.status
      ? 'Refused (HTTP ' + e.status + '): ' + e.message
      : String(e.message || e);
    box.hidden = false;
  }

  // confirm asks in a dialog of the page; with askReason it also takes a
  // reason. It resolves to null when cancelled.
  function confirmAction(text, askReason, reasonRequired) {
    const d = $('confirm');
    $('confirm-text').textContent = text;
    $('confirm-reason-box').hidden = !askReason;
    const reason = $('confirm-reason');
    reason.value = '';
    reason.required = !!reasonRequired;
    return new Promise((resolve) => {
      const done = (v) => {
        yes.removeEventListener('click', onYes);
        no.removeEventListener('click', onNo);
        d.removeEventListener('cancel', onNo);
        d.close();
        resolve(v);
      };
      const yes = $('confirm-yes'), no = $('confirm-no');
      const onYes = () => {
        if (askReason && reasonRequired && !reason.value.trim()) { reason.focus(); return; }
        done({ reason: reason.value.trim() });
      };
      const onNo = (ev) => { if (ev) ev.preventDefault(); done(null); };
      yes.addEventListener('click', onYes);
      no.addEventListener('click', onNo);
      d.addEventListener('cancel', onNo);
      d.showModal();
      (askReason ? reason : yes).focus();
    });
  }

  // act runs a confirmed change and shows the API's refusal verbatim.
  async function act(button, fn) {
    button.disabled = true;
    showError(null);
    try {
      return await fn();
    } catch (e) {
      showError(e);
      return undefined;
    } finally {
      button.disabled = false;
    }
  }

  // ---- formatting ----

  const num = (v) => (v === undefined || v === null || v === '' ? 0 : Number(v));
  function seconds(d) { // a protobuf Duration in JSON: "1.500s"
    if (!d) return null;
    const n = parseFloat(d);
    return Number.isFinite(n) ? n : null;
  }
  function fmtDuration(d) {
    const s = typeof d === 'number' ? d : seconds(d);
    if (s === null) return '—';
    if (s < 1) return Math.round(s * 1000) + ' ms';
    if (s < 90) return (s < 10 ? s.toFixed(1) : Math.round(s)) + ' s';
    if (s < 5400) return Math.round(s / 60) + ' min';
    if (s < 172800) return (s / 3600).toFixed(1) + ' h';
    return (s / 86400).toFixed(1) + ' d';
  }
  function fmtTime(t) {
    if (!t) return '—';
    const d = new Date(t);
    if (Number.isNaN(d.getTime()) || d.getUTCFullYear() < 1971) return '—';
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }
  const fmtRate = (r) => (r >= 10 ? Math.round(r) : r.toFixed(1)) + '/s';
  function fmtBytes(n) {
    n = num(n);
    if (n < 1024) return n + ' B';
    if (n < 1 << 20) return (n / 1024).toFixed(1) + ' KiB';
    return (n / (1 << 20)).toFixed(1) + ' MiB';
  }
  const badge = (s) => el('span', { class: 'badge ' + s }, s);
  function facts(rows) {
    return el('dl', { class: 'facts' }, rows.filter(Boolean).map(([k, v]) => [el('dt', {}, k), el('dd', {}, v === undefined || v === null || v === '' ? '—' : v)]));
  }
  function table(headers, rows, caption) {
    return el('div', { class: 'scroll' }, el('table', {},
      caption ? el('caption', { class: 'muted' }, caption) : null,
      el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col', class: h.num ? 'num' : '' }, h.label || h)))),
      el('tbody', {}, rows)));
  }

  function b64ToBytes(b) {
    const s = atob(b || '');
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  function bytesToB64(bytes) {
    let s = '';
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(s);
  }
  // asText is the bytes as UTF-8 text, or null when they are not text.
  function asText(bytes) {
    try {
      const s = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
      return /[\u0000-\u0008\u000e-\u001f]/.test(s) ? null : s;
    } catch (e) {
      return null;
    }
  }
  function hexDump(bytes) {
    const lines = [];
    for (let i = 0; i < bytes.length; i += 16) {
      const row = Array.from(bytes.subarray(i, i + 16));
      lines.push(i.toString(16).padStart(6, '0') + '  ' + row.map((b) => b.toString(16).padStart(2, '0')).join(' ').padEnd(48) +
        '  ' + row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : '.')).join(''));
    }
    return lines.join('\n');
  }

  // diffLines is a line diff of a and b (longest common subsequence), as
  // [kind, line] with kind ' ', '-' or '+'.
  function diffLines(a, b) {
    const x = a.split('\n'), y = b.split('\n');
    if (x.length * y.length > 4e6) return [['-', a], ['+', b]];
    const n = x.length, m = y.length;
    const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i][j] = x[i] === y[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (x[i] === y[j]) { out.push([' ', x[i]]); i++; j++; }
      else if (lcs[i + 1][j] >= lcs[i][j + 1]) out.push(['-', x[i++]]);
      else out.push(['+', y[j++]]);
    }
    while (i < n) out.push(['-', x[i++]]);
    while (j < m) out.push(['+', y[j++]]);
    return out;
  }
  function diffView(a, b) {
    return el('pre', { class: 'diff', 'aria-label': 'Changes from the original body' },
      diffLines(a, b).map(([k, line]) => el('span', { class: k === '+' ? 'add' : k === '-' ? 'del' : 'same' }, k + ' ' + line)));
  }

  // ---- signing in ----

  function signOut(why) {
    sessionStorage.removeItem(TOKEN_KEY);
    generation++; // what a view still has in flight is dropped
    stopTimer();
    sources = null;
    $('nav').hidden = true;
    view.hidden = true;
    fill(view);
    showError(null);
    $('login').hidden = false;
    const le = $('login-error');
    le.textContent = why || '';
    le.hidden = !why;
    $('token').value = '';
    $('token').focus();
  }

  async function signIn(ev) {
    ev.preventDefault();
    const tok = $('token').value.trim();
    const le = $('login-error');
    le.hidden = true;
    if (!tok) return;
    $('signin').disabled = true;
    try {
      // The status, asked with the token: a wrong one is refused (401)
      // even where anonymous reads are allowed.
      await call('GET', '/v1/status', undefined, tok);
      sessionStorage.setItem(TOKEN_KEY, tok);
      $('token').value = '';
      $('login').hidden = true;
      route();
    } catch (e) {
      le.textContent = e.status === 401 ? 'The token was refused.' : 'Signing in failed: ' + e.message;
      le.hidden = false;
    } finally {
      $('signin').disabled = false;
    }
  }

  // ---- routing ----

  function stopTimer() {
    if (timer) clearInterval(timer);
    timer = null;
  }
  // every runs fn now and every ms while the view of generation gen is
  // shown; a tick waits for the one before to answer, so that answers come
  // in order.
  function every(gen, ms, fn) {
    if (gen !== generation) return undefined;
    stopTimer();
    let busy = false;
    const tick = async () => {
      if (gen !== generation || busy) return;
      busy = true;
      try {
        await fn();
      } catch (e) {
        if (gen === generation && e.status !== 401) showError(e);
      } finally {
        busy = false;
      }
    };
    timer = setInterval(tick, ms);
    return tick();
  }

  function parseHash() {
    const h = location.hash.replace(/^#/, '') || '/';
    const [path, query] = h.split('?');
    const decode = (seg) => {
      try {
        return decodeURIComponent(seg);
      } catch (e) {
        return seg; // a stray % stays as it is
      }
    };
    return { parts: path.split('/').filter(Boolean).map(decode), params: new URLSearchParams(query || '') };
  }

  async function sourceNames() {
    if (!sources) {
      const st = await api('GET', '/v1/status');
      sources = (st.sources || []).map((s) => s.name);
    }
    return sources;
  }

  async function route() {
    if (!token()) { signOut(); return; }
    generation++;
    stopTimer();
    showError(null);
    $('login').hidden = true;
    $('nav').hidden = false;
    view.hidden = false;
    const { parts, params } = parseHash();
    const name = parts[0] || 'overview';
    for (const a of document.querySelectorAll('#nav a')) {
      if (a.dataset.view === (name === 'deadletter' ? 'deadletters' : name === 'replay' ? 'replays' : name)) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    const rest = parts.slice(1).join('/');
    const views = { overview, deadletters, deadletter: () => deadLetter(rest), replays, replay: () => replay(rest), events };
    const show = Object.hasOwn(views, name) ? views[name] : overview;
    const gen = generation;
    try {
      await show(params);
    } catch (e) {
      if (gen === generation && e.status !== 401) showError(e);
    }
  }

  // ---- overview ----

  async function overview() {
    const gen = generation;
    const banner = el('div', { id: 'ready', class: 'banner' });
    const cards = el('div', { class: 'grid' });
    const chart = el('div', { class: 'chart-box' });
    const srcs = el('div', { class: 'grid wide', id: 'sources' });
    fill(view, el('h1', {}, 'Overview'), banner, cards,
      el('h2', {}, 'Outcomes per second, over the last 15 minutes'), chart,
      el('h2', {}, 'Sources'), srcs);
    await every(gen, 5000, async () => {
      const [st, activity] = await Promise.all([api('GET', '/v1/status'), api('GET', '/v1/activity')]);
      if (gen !== generation) return;
      sources = (st.sources || []).map((s) => s.name);
      renderStatus(st, banner, cards, srcs);
      renderChart(activity, chart);
    });
  }

  function renderStatus(st, banner, cards, srcs) {
    banner.className = 'banner ' + (st.notReady ? 'bad' : 'ok');
    banner.textContent = st.notReady ? 'Not ready: ' + st.notReady : 'Ready: making progress';
    const c = st.calls || {};
    const holds = [];
    if (c.appUnreachable) holds.push('the app is unreachable');
    if (c.freshIntakePaused) holds.push('fresh intake paused (the retry budget is spent)');
    if (c.overloadUntil && new Date(c.overloadUntil) > new Date()) holds.push('overloaded until ' + fmtTime(c.overloadUntil));
    const b = st.budget || {}, j = st.journal || {};
    fill(cards,
      el('div', { class: 'card' }, el('h3', {}, 'Calls to the app'), facts([
        ['In flight', num(c.inFlight)],
        ['Concurrency limit', num(c.limit) + ' of ' + num(c.max)],
        ['Waiting for a slot', num(c.queued)],
        ['Held', holds.length ? holds.join('; ') : 'no'],
      ])),
      el('div', { class: 'card' }, el('h3', {}, 'Retry budget'), facts([
        ['Tokens', Number(b.tokens || 0).toFixed(1)],
        ['Re-attempts denied', num(b.denied)],
      ])),
      el('div', { class: 'card' }, el('h3', {}, 'Journal'), facts([
        ['Open hand-offs', num(j.open)],
        ['Size', fmtBytes(j.sizeBytes)],
        ['Commit p50 / max', fmtDuration(j.commitP50) + ' / ' + fmtDuration(j.commitMax)],
        ['Started', fmtTime(st.startedAt)],
      ])));
    fill(srcs, ...(st.sources || []).map(sourceCard));
  }

  function sourceCard(s) {
    const bl = s.backlog;
    let drain = 'no estimate yet';
    if (bl) drain = bl.converging ? (num(bl.messages) === 0 ? 'drained' : fmtDuration(bl.drain)) : 'not converging (μ ≤ λ)';
    const dl = s.deadLetters || {};
    const tiers = (s.retryTiers || []).map((t) => t.name + ' (' + fmtDuration(t.delay) + '): ' + (t.known ? num(t.waiting) + ' waiting' : 'unknown'));
    const sg = s.shareGroup;
    return el('div', { class: 'card', 'data-source': s.name },
      el('h3', {}, s.name, ' ', badge(s.connected ? 'connected' : 'disconnected'), ' ', badge(s.state || 'unknown')),
      facts([
        ['Broker', s.broker + ': ' + s.from],
        sg ? ['Share group', sg.name + ': archived after ' + num(sg.deliveryCountLimit) + ' deliveries, lock ' +
          fmtDuration(sg.lockDuration) + ' (read from ' + (sg.readFrom || 'defaults') + '); retries read by ' + sg.retryGroup] : null,
        s.reason ? ['Why', s.reason] : null,
        ['In flight', num(s.inFlight)],
        ['Oldest unsettled', fmtDuration(s.oldestUnsettledAge)],
        ['Backlog B', bl ? num(bl.messages) : '—'],
        ['Arrivals λ', bl ? fmtRate(Number(bl.arrivalRate || 0)) : '—'],
        ['Completions μ', bl ? fmtRate(Number(bl.completionRate || 0)) : '—'],
        ['Drain time', drain],
        ['Dead letters open', el('a', { href: '#/deadletters' + q({ source: s.name }) }, String(num(dl.open))),
          ],
        ['Oldest open', dl.oldestOpenAge ? fmtDuration(dl.oldestOpenAge) : '—'],
        ['Retry tiers', tiers.length ? tiers.join('; ') : 'none'],
      ]));
  }

  // renderChart draws every source's steps, summed, as rates per second.
  function renderChart(activity, box) {
    const step = seconds(activity.step) || 5;
    const sums = new Map();
    for (const src of activity.sources || []) {
      for (const s of src.steps || []) {
        const at = new Date(s.at).getTime();
        const row = sums.get(at) || { handled: 0, retried: 0, deadLettered: 0, other: 0 };
        for (const [k] of SERIES) row[k] += num(s[k]);
        sums.set(at, row);
      }
    }
    const times = [...sums.keys()].sort((a, b) => a - b);
    const W = 720, H = 220, L = 44, R = 8, T = 10, B = 24;
    const end = times.length ? times[times.length - 1] : Date.now();
    // The last 15 minutes, or since the first step when the sidecar has run
    // for less (at least a minute): the lines fill the chart from the start.
    const span = Math.min(15 * 60000, Math.max(times.length ? end - times[0] : 0, 60000));
    const start = end - span;
    let top = 0;
    for (const t of times) for (const [k] of SERIES) top = Math.max(top, sums.get(t)[k] / step);
    top = niceCeil(top);
    const x = (t) => L + ((t - start) / (end - start)) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const last = times.length ? sums.get(end) : null;
    const g = svg('svg', {
      id: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': 'Outcomes per second over the last 15 minutes' + (last ? ': ' + SERIES.map(([k, n]) => n + ' ' + fmtRate(last[k] / step)).join(', ') : ': no data yet'),
      'data-steps': times.length, 'data-last-at': times.length ? new Date(end).toISOString() : '',
      'data-handled': times.reduce((a, t) => a + sums.get(t).handled, 0),
    });
    g.append(svg('line', { class: 'axis', x1: L, y1: y(0), x2: W - R, y2: y(0) }));
    g.append(svg('line', { class: 'axis', x1: L, y1: y(top), x2: W - R, y2: y(top) }));
    for (const [v, label] of [[0, '0'], [top, fmtRate(top)]]) {
      const t = svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' });
      t.textContent = label;
      g.append(t);
    }
    for (const f of [1, 2 / 3, 1 / 3, 0]) {
      const t = svg('text', { x: x(end - f * span), y: H - 6, 'text-anchor': f === 1 ? 'start' : f === 0 ? 'end' : 'middle' });
      t.textContent = f ? '−' + fmtDuration((f * span) / 1000) : 'now';
      g.append(t);
    }
    for (const [k] of SERIES) {
      if (!times.length) break;
      const pts = times.map((t) => x(t).toFixed(1) + ',' + y(sums.get(t)[k] / step).toFixed(1)).join(' ');
      g.append(svg('polyline', { class: 's-' + k, points: pts, 'data-series': k }));
    }
    const legend = el('div', { class: 'legend' }, SERIES.map(([k, n]) =>
      el('span', { class: 's-' + k }, el('span', { class: 'swatch', 'aria-hidden': 'true' }),
        el('span', { class: 'muted' }, n + ' ' + (last ? fmtRate(last[k] / step) : '—')))));
    fill(box, g, legend,
      el('p', { class: 'muted' }, 'Other: dropped by the app, or a redelivery settled from the journal. One point every ' + fmtDuration(step) + '.'));
  }
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // ---- dead letters ----

  function sourceSelect(id, names, value, any) {
    return el('select', { id, name: id },
      any ? el('option', { value: '' }, any) : null,
      names.map((n) => el('option', { value: n, selected: n === value }, n)));
  }
  function toLocalInput(iso) {
    if (!iso) return '';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return '';
    const p = (n) => String(n).padStart(2, '0');
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
  }
  const fromLocalInput = (v) => (v ? new Date(v).toISOString() : '');

  async function deadletters(params) {
    const gen = generation;
    const names = await sourceNames();
    if (gen !== generation) return;
    const f = {
      source: params.get('source') || '', state: params.get('state') || '', reason: params.get('reason') || '',
      since: params.get('since') || '', until: params.get('until') || '', event: params.get('event') || '',
    };
    const form = el('form', { class: 'filters card', id: 'dl-filters', 'aria-label': 'Filter dead letters' },
      el('div', {}, el('label', { for: 'f-source' }, 'Source'), sourceSelect('f-source', names, f.source, 'Every source')),
      el('div', {}, el('label', { for: 'f-state' }, 'State'),
        el('select', { id: 'f-state' }, el('option', { value: '' }, 'Any state'), STATES.map((s) => el('option', { value: s, selected: s === f.state }, s)))),
      el('div', {}, el('label', { for: 'f-reason' }, 'Reason'), el('input', { id: 'f-reason', value: f.reason, placeholder: 'max-attempts, permanent, …' })),
      el('div', {}, el('label', { for: 'f-since' }, 'Dead-lettered from'), el('input', { id: 'f-since', type: 'datetime-local', value: toLocalInput(f.since) })),
      el('div', {}, el('label', { for: 'f-until' }, 'Dead-lettered before'), el('input', { id: 'f-until', type: 'datetime-local', value: toLocalInput(f.until) })),
      el('div', {}, el('label', { for: 'f-event' }, 'Event id'), el('input', { id: 'f-event', value: f.event })),
      el('div', { class: 'buttons' },
        el('button', { type: 'submit', class: 'primary', id: 'f-apply' }, 'Apply filters'),
        el('button', { type: 'button', onclick: () => go('#/deadletters') }, 'Clear')));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      go('#/deadletters' + q({
        source: $('f-source').value, state: $('f-state').value, reason: $('f-reason').value.trim(),
        since: fromLocalInput($('f-since').value), until: fromLocalInput($('f-until').value), event: $('f-event').value.trim(),
      }));
    });
    const counts = el('div', { class: 'counts', id: 'dl-counts' });
    const list = el('div', { id: 'dl-list' });
    const pager = el('div', { class: 'buttons' });
    const selection = new Set();
    const replayBtn = el('button', { type: 'button', id: 'replay-selected', disabled: true }, 'Replay selected');
    fill(view, el('h1', {}, 'Dead letters'), form, counts, el('div', { class: 'buttons' }, replayBtn), list, pager);
    replayBtn.addEventListener('click', () => {
      location.hash = '#/replays' + q({ ids: [...selection] });
    });
    const pages = ['']; // the page tokens of the pages seen
    const load = async () => {
      const res = await api('GET', '/v1/deadletters' + q({
        source: f.source, states: f.state ? [f.state] : [], reason: f.reason, since: f.since, until: f.until,
        event_id: f.event, page_size: PAGE_SIZE, page_token: pages[pages.length - 1],
      }));
      if (gen !== generation) return;
      fill(counts, ...(res.counts || []).map((c) => el('span', { class: 'card' },
        el('strong', {}, c.source), ': ',
        Object.entries(c.byState || {}).map(([s, n]) => [badge(s), ' ', String(num(n)), ' ']),
        ' · open ', String(num(c.open)), c.oldestOpenAge ? ', oldest ' + fmtDuration(c.oldestOpenAge) : '')));
      const letters = res.deadLetters || [];
      selection.clear();
      replayBtn.disabled = true;
      replayBtn.textContent = 'Replay selected';
      const rows = letters.map((l) => {
        const box = el('input', { type: 'checkbox', 'aria-label': 'Select ' + l.id });
        box.addEventListener('change', () => {
          if (box.checked) selection.add(l.id); else selection.delete(l.id);
          replayBtn.disabled = selection.size === 0;
          replayBtn.textContent = selection.size ? 'Replay selected (' + selection.size + ')' : 'Replay selected';
        });
        return el('tr', { 'data-id': l.id },
          el('td', {}, box),
          el('td', {}, el('a', { href: '#/deadletter/' + idPath(l.id), class: 'mono' }, l.id)),
          el('td', {}, l.source), el('td', {}, badge(l.state)), el('td', {}, l.reason),
          el('td', { class: 'num' }, String(num(l.attempts))), el('td', {}, fmtTime(l.deadLetteredAt)),
          el('td', { class: 'mono' }, l.eventId));
      });
      fill(list, letters.length
        ? table(['', 'Id', 'Source', 'State', 'Reason', { label: 'Attempts', num: true }, 'Dead-lettered', 'Event id'], rows)
        : el('p', { class: 'muted', id: 'dl-empty' }, 'No dead letter matches.'));
      const prev = el('button', { type: 'button', disabled: pages.length === 1 }, 'Previous page');
      prev.addEventListener('click', () => { pages.pop(); load().catch(showError); });
      const next = el('button', { type: 'button', disabled: !res.nextPageToken }, 'Next page');
      next.addEventListener('click', () => { pages.push(res.nextPageToken); load().catch(showError); });
      fill(pager, prev, next, el('span', { class: 'muted' }, 'Page ' + pages.length));
    };
    await load();
  }

  async function deadLetter(id) {
    const gen = generation;
    const l = await api('GET', '/v1/deadletters/' + idPath(id) + q({ body_limit: BODY_LIMIT }));
    if (gen !== generation) return;
    const body = b64ToBytes(l.body);
    const text = asText(body);
    const bodyBox = el('div', {},
      el('p', { class: 'notice' }, 'The body may hold personal data. Shown up to ' + fmtBytes(BODY_LIMIT) + (l.bodyTruncated ? '; cut at that size.' : '.')),
      l.bodyError ? el('p', { class: 'error' }, l.bodyError) : null,
      el('div', { class: 'body-box' }, el('pre', { id: 'dl-body' }, text !== null ? text : hexDump(body))),
      el('p', { class: 'muted' }, text !== null ? 'Shown as text.' : 'Shown in hex: the body is not text.'));
    const headers = Object.entries(l.headers || {}).sort(([a], [b]) => a.localeCompare(b));
    const repair = l.repair;
    const repairText = repair ? asText(b64ToBytes(repair.body)) : null;
    const history = (l.history || []).map((h) => el('tr', {},
      el('td', {}, fmtTime(h.at)), el('td', {}, h.transition), el('td', {}, badge(h.state)), el('td', {}, h.who), el('td', {}, h.why),
      el('td', { class: 'mono' }, h.replayId || '')));
    fill(view,
      el('p', {}, el('a', { href: '#/deadletters' + q({ source: l.source }) }, '← Dead letters of ' + l.source)),
      el('h1', {}, 'Dead letter ', el('span', { class: 'mono' }, l.id), ' ', badge(l.state)),
      el('div', { class: 'grid wide' },
        el('div', { class: 'card' }, el('h3', {}, 'Evidence'), facts([
          ['Reason', l.reason], ['Error class', l.errorClass], ['Last error', l.error], ['Attempts', String(num(l.attempts))],
          ['First failure', fmtTime(l.firstFailureAt)], ['Dead-lettered', fmtTime(l.deadLetteredAt)], ['Origin', l.origin],
        ])),
        el('div', { class: 'card' }, el('h3', {}, 'Message'), facts([
          ['Source', l.source],
          ['Event id', el('a', { href: '#/events' + q({ source: l.source, event: l.eventId }), class: 'mono' }, l.eventId)],
          ['Content type', l.contentType], ['Size', fmtBytes(l.bodySize)],
          l.key ? ['Key', asText(b64ToBytes(l.key)) ?? hexDump(b64ToBytes(l.key))] : null,
          l.replayId ? ['Replay id', l.replayId] : null,
          l.replayOf ? ['A failed replay of', el('a', { href: '#/deadletter/' + idPath(l.replayOf), class: 'mono' }, l.replayOf)] : null,
          l.successor ? ['Failed again as', el('a', { href: '#/deadletter/' + idPath(l.successor), class: 'mono' }, l.successor)] : null,
        ]))),
      el('h2', {}, 'Actions'), actions(l, text),
      repair ? el('div', {}, el('h2', {}, 'Approved repair'),
        facts([['Note', repair.note], ['Content type', repair.contentType || l.contentType]]),
        text !== null && repairText !== null ? diffView(text, repairText) : el('p', { class: 'muted' }, 'The repair or the original is not text: no diff.')) : null,
      el('h2', {}, 'Body'), bodyBox,
      el('h2', {}, 'Headers'),
      headers.length ? table(['Name', 'Value'], headers.map(([k, v]) => el('tr', {}, el('td', { class: 'mono' }, k), el('td', { class: 'mono' }, v))))
        : el('p', { class: 'muted' }, 'None.'),
      el('h2', {}, 'History'),
      history.length ? table(['When', 'Transition', 'State', 'Who', 'Why', 'Replay'], history) : el('p', { class: 'muted' }, 'No change recorded yet.'),
      el('h2', {}, 'Hand-offs in this replica\'s journal'), timeline(l.handoffs));
  }

  function timeline(handoffs) {
    if (!handoffs || !handoffs.length) return el('p', { class: 'muted' }, 'This replica\'s journal holds no hand-off of this event.');
    return el('div', {}, handoffs.map((h) => el('div', { class: 'card' },
      el('h3', {}, h.replayId ? 'Replay ' + h.replayId : 'Original'),
      table(['When', 'Step'], (h.steps || []).map((s) => el('tr', {}, el('td', {}, fmtTime(s.at)), el('td', { class: 'mono' }, s.text || s.kind)))))));
  }

  function actions(l, originalText) {
    if (CLOSED.includes(l.state)) return el('p', { class: 'muted' }, 'Closed: no action is left.');
    const reason = el('input', { id: 'approve-reason', autocomplete: 'off', required: true });
    const repairOn = el('input', { type: 'checkbox', id: 'repair-on' });
    const repairBody = el('textarea', { id: 'repair-body', spellcheck: false });
    repairBody.value = originalText !== null && !l.bodyTruncated ? originalText : '';
    const repairType = el('input', { id: 'repair-type', value: l.contentType || '' });
    const repairNote = el('input', { id: 'repair-note', autocomplete: 'off' });
    const diffBox = el('div', { id: 'repair-diff' });
    const repairBox = el('div', { hidden: true },
      el('label', { for: 'repair-body' }, 'Repaired body (replayed instead of the original, which stays in the DLQ)'), repairBody,
      el('label', { for: 'repair-type' }, 'Content type of the repaired body'), repairType,
      el('label', { for: 'repair-note' }, 'Repair note'), repairNote,
      el('h3', {}, 'Changes from the original'), diffBox);
    const showDiff = () => {
      fill(diffBox, originalText !== null ? diffView(originalText, repairBody.value) : el('p', { class: 'muted' }, 'The original is not text: no diff.'));
    };
    repairOn.addEventListener('change', () => { repairBox.hidden = !repairOn.checked; showDiff(); });
    repairBody.addEventListener('input', showDiff);
    const approve = el('button', { type: 'button', class: 'primary', id: 'approve' }, 'Approve');
    approve.addEventListener('click', async () => {
      if (!reason.value.trim()) { showError(new Error('Approving needs a reason.')); reason.focus(); return; }
      const withRepair = repairOn.checked;
      const ok = await confirmAction('Approve ' + l.id + ' for replay' + (withRepair ? ', with the repaired body' : '') + '?');
      if (!ok) return;
      const body = { reason: reason.value.trim() };
      if (withRepair) {
        body.repair_body = bytesToB64(new TextEncoder().encode(repairBody.value));
        body.repair_content_type = repairType.value.trim();
        body.repair_note = repairNote.value.trim();
      }
      const res = await act(approve, () => api('POST', '/v1/deadletters/' + idPath(l.id) + ':approve', body));
      if (res) route();
    });
    const termReason = el('input', { id: 'terminate-reason', autocomplete: 'off', required: true });
    const terminate = el('button', { type: 'button', class: 'danger', id: 'terminate' }, 'Terminate');
    terminate.addEventListener('click', async () => {
      if (!termReason.value.trim()) { showError(new Error('Terminating needs a reason.')); termReason.focus(); return; }
      const ok = await confirmAction('Terminate ' + l.id + '? It is closed without a replay.');
      if (!ok) return;
      const res = await act(terminate, () => api('POST', '/v1/deadletters/' + idPath(l.id) + ':terminate', { reason: termReason.value.trim() }));
      if (res) route();
    });
    const replayIt = el('button', { type: 'button', id: 'replay-this' }, 'Replay this dead letter…');
    replayIt.addEventListener('click', () => { location.hash = '#/replays' + q({ ids: [l.id] }); });
    return el('div', { class: 'grid wide' },
      el('div', { class: 'card', id: 'approve-box' }, el('h3', {}, 'Approve for replay'),
        el('label', { for: 'approve-reason' }, 'Why it may be replayed'), reason,
        el('label', { class: 'inline', for: 'repair-on' }, repairOn, 'Replay a repaired body'), repairBox,
        el('div', { class: 'buttons' }, approve)),
      el('div', { class: 'card' }, el('h3', {}, 'Terminate'),
        el('label', { for: 'terminate-reason' }, 'Why it is closed without a replay'), termReason,
        el('div', { class: 'buttons' }, terminate),
        el('h3', {}, 'Replay'), el('p', { class: 'muted' }, 'Approved dead letters are replayed; a forced replay approves on the way.'),
        el('div', { class: 'buttons' }, replayIt)));
  }

  // ---- replays ----

  async function replays(params) {
    const gen = generation;
    const names = await sourceNames();
    if (gen !== generation) return;
    const ids = params.getAll('ids').filter(Boolean);
    const form = replayForm(names, ids);
    const list = el('div', { id: 'replay-list' });
    fill(view, el('h1', {}, 'Replays'), form, el('h2', {}, 'Runs'), list);
    await every(gen, 5000, async () => {
      const res = await api('GET', '/v1/replays');
      if (gen !== generation) return;
      const runs = res.replays || [];
      fill(list, runs.length ? table(['Replay', 'Source', 'State', { label: 'Published', num: true }, { label: 'Handled', num: true }, { label: 'Failed', num: true }, 'Created'],
        runs.map((r) => {
          const p = r.progress || {};
          return el('tr', {}, el('td', {}, el('a', { href: '#/replay/' + encodeURIComponent(r.id), class: 'mono' }, r.id)),
            el('td', {}, r.source), el('td', {}, badge(r.state), r.paused ? [' ', badge('paused')] : null),
            el('td', { class: 'num' }, num(p.published) + ' of ' + num(p.selected)),
            el('td', { class: 'num' }, String(num(p.handled))), el('td', { class: 'num' }, String(num(p.failed))),
            el('td', {}, fmtTime(r.createdAt) + ' by ' + r.createdBy));
        })) : el('p', { class: 'muted' }, 'No replay yet.'));
    });
  }

  function replayForm(names, ids) {
    const field = (id, label, input) => el('div', {}, el('label', { for: id }, label), input);
    const byIds = ids.length > 0;
    const form = el('form', { class: 'filters card', id: 'replay-form', 'aria-label': 'Start a replay' },
      el('h2', { class: 'full' }, byIds ? 'Replay ' + ids.length + ' selected dead letter' + (ids.length > 1 ? 's' : '') : 'Start a replay of a selection'),
      byIds ? el('p', { class: 'mono', id: 'replay-ids' }, ids.join(', ')) : [
        field('r-source', 'Source', sourceSelect('r-source', names, names[0])),
        field('r-reason', 'Reason (empty: any)', el('input', { id: 'r-reason' })),
        field('r-state', 'State', el('select', { id: 'r-state' }, ['approved', 'pending', 'failed-replay'].map((s) => el('option', { value: s }, s)))),
        field('r-since', 'Dead-lettered from', el('input', { id: 'r-since', type: 'datetime-local' })),
        field('r-until', 'Dead-lettered before', el('input', { id: 'r-until', type: 'datetime-local' })),
      ],
      field('r-rate', 'Rate (messages a second)', el('input', { id: 'r-rate', type: 'number', min: '0.1', step: 'any', value: '10' })),
      field('r-sample', 'Sample first (0: none)', el('input', { id: 'r-sample', type: 'number', min: '0', step: '1', value: '0' })),
      field('r-stop', 'Stop above this failure share', el('input', { id: 'r-stop', type: 'number', min: '0', max: '1', step: 'any', value: '0.5' })),
      field('r-why', 'Why (recorded with the run)', el('input', { id: 'r-why', autocomplete: 'off' })),
      el('div', {}, el('label', { class: 'inline', for: 'r-force' }, el('input', { type: 'checkbox', id: 'r-force' }), 'Replay pending ones too, approving them')),
      el('div', { class: 'buttons' },
        el('button', { type: 'button', id: 'r-preview' }, 'Preview'),
        el('button', { type: 'submit', class: 'primary', id: 'r-start' }, 'Start replay')),
      el('p', { id: 'r-result', class: 'muted', role: 'status' }));
    const request = (dryRun) => {
      const r = {
        rate_per_second: Number($('r-rate').value) || 0, sample: Number($('r-sample').value) || 0,
        stop_failure_ratio: Number($('r-stop').value) || 0, force: $('r-force').checked, why: $('r-why').value.trim(), dry_run: dryRun,
      };
      if (byIds) r.ids = ids;
      else {
        r.source = $('r-source').value;
        r.reason = $('r-reason').value.trim();
        r.states = [$('r-state').value];
        const since = fromLocalInput($('r-since').value), until = fromLocalInput($('r-until').value);
        if (since) r.since = since;
        if (until) r.until = until;
      }
      return r;
    };
    form.querySelector('#r-preview').addEventListener('click', async (ev) => {
      const res = await act(ev.currentTarget, () => api('POST', '/v1/replays', request(true)));
      const out = $('r-result');
      if (res && out) out.textContent = 'Would replay ' + num((res.progress || {}).selected) + ' dead letter(s).';
    });
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const ok = await confirmAction('Start this replay? Its copies go to the app at ' + ($('r-rate').value || 10) + ' a second.');
      if (!ok) return;
      const res = await act($('r-start'), () => api('POST', '/v1/replays', request(false)));
      if (res) location.hash = '#/replay/' + encodeURIComponent(res.id);
    });
    return form;
  }

  async function replay(id) {
    const gen = generation;
    const head = el('div', {});
    const body = el('div', {});
    const controls = el('div', { class: 'buttons', id: 'replay-controls' });
    fill(view, el('p', {}, el('a', { href: '#/replays' }, '← Replays')), head, controls, body);
    let ended = false;
    let shown = ''; // the state the controls were made for: remade only when it changes, so focus stays
    await every(gen, 2000, async () => {
      if (ended) return;
      const r = await api('GET', '/v1/replays/' + encodeURIComponent(id));
      if (gen !== generation) return;
      const p = r.progress || {};
      ended = r.state !== 'running';
      fill(head, el('h1', {}, 'Replay ', el('span', { class: 'mono' }, r.id), ' ', el('span', { id: 'replay-state' }, badge(r.state)),
        r.paused ? [' ', badge('paused')] : null),
      r.detail ? el('p', { id: 'replay-detail' }, r.detail) : null);
      const selected = num(p.selected);
      fill(body,
        el('label', { for: 'replay-progress' }, 'Published ' + num(p.published) + ' of ' + selected),
        el('progress', { id: 'replay-progress', max: Math.max(selected, 1), value: num(p.published) + num(p.skipped) }),
        el('div', { class: 'grid' },
          el('div', { class: 'card' }, facts([
            ['Selected', selected], ['Published', num(p.published)], ['Handled', el('span', { id: 'replay-handled' }, String(num(p.handled)))],
            ['Failed again', num(p.failed)], ['Remaining', num(p.remaining)], ['Skipped', num(p.skipped)],
          ])),
          el('div', { class: 'card' }, facts([
            ['Rate', fmtRate(Number(p.rate || 0)) + ' (asked ' + fmtRate(Number(r.ratePerSecond || 0)) + ')'],
            ['ETA', r.state === 'running' && !r.paused && p.eta ? fmtDuration(p.eta) : '—'], ['Waited', fmtDuration(p.waited)],
            ['Runner', r.runner], ['Last heartbeat', fmtTime(r.heartbeatAt)],
            ['Created', fmtTime(r.createdAt) + ' by ' + r.createdBy], ['Why', r.why], ['Ended', fmtTime(r.endedAt)],
          ]))));
      const want = r.state === 'running' ? 'running/' + !!r.held : r.state;
      if (want === shown) return;
      shown = want;
      fill(controls);
      if (r.state !== 'running') return;
      const op = (label, verb, cls, question) => {
        const b = el('button', { type: 'button', class: cls, id: 'replay-' + verb }, label);
        b.addEventListener('click', async () => {
          const ok = await confirmAction(question, true, false);
          if (!ok) return;
          const res = await act(b, () => api('POST', '/v1/replays/' + encodeURIComponent(r.id) + ':' + verb, { reason: ok.reason }));
          if (res) route();
        });
        return b;
      };
      controls.append(r.held
        ? op('Resume', 'resume', 'primary', 'Resume replay ' + r.id + '?')
        : op('Pause', 'pause', '', 'Pause replay ' + r.id + ' before its next publish?'));
      controls.append(op('Cancel replay', 'cancel', 'danger', 'Cancel replay ' + r.id + '? What it published stays published.'));
    });
  }

  // ---- event lookup ----

  async function events(params) {
    const gen = generation;
    const names = await sourceNames();
    if (gen !== generation) return;
    const source = params.get('source') || names[0] || '';
    const event = params.get('event') || '';
    const form = el('form', { class: 'filters card', id: 'event-form', 'aria-label': 'Look up an event' },
      el('div', {}, el('label', { for: 'e-source' }, 'Source'), sourceSelect('e-source', names, source)),
      el('div', {}, el('label', { for: 'e-id' }, 'Event id'), el('input', { id: 'e-id', value: event, required: true, autocomplete: 'off' })),
      el('div', { class: 'buttons' }, el('button', { type: 'submit', class: 'primary' }, 'Look up')));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      go('#/events' + q({ source: $('e-source').value, event: $('e-id').value.trim() }));
    });
    const out = el('div', { id: 'event-out' });
    fill(view, el('h1', {}, 'Event lookup'),
      el('p', { class: 'muted' }, 'The hand-offs of one event in this replica\'s journal, as sidecar journal events shows them.'), form, out);
    if (!event) return;
    try {
      const ev = await api('GET', '/v1/events/' + encodeURIComponent(source) + '/' + idPath(event));
      if (gen !== generation) return;
      fill(out, el('h2', {}, 'Event ', el('span', { class: 'mono' }, ev.eventId), ' of ', ev.source), timeline(ev.handoffs));
    } catch (e) {
      if (e.status === 404) fill(out, el('p', { class: 'muted' }, e.message));
      else throw e;
    }
  }

  // ---- start ----

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', signIn);
    $('signout').addEventListener('click', () => signOut('Signed out.'));
    window.addEventListener('hashchange', route);
    route();
  });
})();
