// The Sluice console: plain ES module, no build step, talking only to the public API
// (/api/v1/...). The API key lives in sessionStorage and goes in the X-API-Key header, never
// in a URL. Every value from the API reaches the page as text nodes, never parsed as HTML.

import * as events from '/console/events.js';

const KEY_STORE = 'sluice.apiKey';
const main = document.getElementById('main');
const nav = document.getElementById('nav');
let leaving = []; // cleanups of the current view (live tails)

// ---------------------------------------------------------------------------
// API

class ApiError extends Error {
  constructor(status, body) {
    super(describe(status, body));
    this.status = status;
    this.body = body;
  }
  /** The 422 `detail` entries, if any. */
  get violations() {
    return this.status === 422 && Array.isArray(this.body?.detail) ? this.body.detail : [];
  }
}

function describe(status, body) {
  if (body && typeof body.detail === 'string') return `${status}: ${body.detail}`;
  if (body && Array.isArray(body.detail)) {
    return `${status}: ` + body.detail.map((d) => `${(d.loc || []).join('.')}: ${d.msg}`).join('\n');
  }
  if (body == null || body === '') return `${status}`;
  return `${status}: ${typeof body === 'string' ? body : JSON.stringify(body)}`;
}

function apiKey() {
  return sessionStorage.getItem(KEY_STORE);
}

async function api(method, path, body) {
  return (await apiResponse(method, path, body)).data;
}

/** `api`, with the response's headers. */
async function apiResponse(method, path, body) {
  const headers = { 'X-API-Key': apiKey() || '' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const response = await fetch('/api/v1' + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    if (response.status === 401 && path !== '/me') signOut('Your API key was refused; sign in again.');
    throw new ApiError(response.status, data);
  }
  return { data, headers: response.headers };
}

// ---------------------------------------------------------------------------
// DOM

/** h('tag.class#id', {attr: value, onclick: fn}, ...children) */
function h(spec, attrs = {}, ...children) {
  // 'tag', then any of '#id' and '.class' in any order.
  const [tag] = spec.match(/^[a-z0-9]*/);
  const el = document.createElement(tag || 'div');
  const classes = [];
  for (const [, kind, name] of spec.slice(tag.length).matchAll(/([#.])([^#.]+)/g)) {
    if (kind === '#') el.id = name;
    else classes.push(name);
  }
  if (classes.length) el.className = classes.join(' ');
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'value') el.value = value;
    else el.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/**
 * Bumped by every route: a view's late answers (it awaited the API while the user moved on)
 * must not replace the newer view's page.
 */
let generation = 0;

/** `show`, unless a newer route started since `gen`. */
function showIf(gen, ...nodes) {
  if (gen === generation) show(...nodes);
}

function show(...nodes) {
  for (const cleanup of leaving) cleanup();
  leaving = [];
  main.replaceChildren(...nodes.filter((node) => node !== null && node !== undefined && node !== false));
}

function notice(text, kind = '') {
  return h(`div.notice${kind ? '.' + kind : ''}`, { role: kind === 'error' ? 'alert' : 'status' }, text);
}

/** A labelled control with its hint and the slot its 422 message goes to (`<id>-error`). */
function field(id, label, control, hint) {
  return h('div', {},
    h('label', { for: id }, label, control),
    hint ? h('p.muted', {}, hint) : null,
    h('p.field-error', { id: `${id}-error`, role: 'alert' }));
}

/** Empties every field's error slot and unmarks the fields. */
function clearFieldErrors() {
  for (const el of main.querySelectorAll('.field-error')) el.textContent = '';
  for (const el of main.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
}

/** The JSON in `textarea`; `undefined`, with the reason at `errorId`, when it does not parse. */
function parseJsonField(textarea, errorId) {
  try {
    return JSON.parse(textarea.value);
  } catch (e) {
    document.getElementById(errorId).textContent = `Not JSON: ${e.message}`;
    textarea.setAttribute('aria-invalid', 'true');
    return undefined;
  }
}

/**
 * Sends the values of the file chosen in `file` (split on new lines and commas) in batches
 * of `batchSize` through `send(batch)`, moving `progress` and saying how far it got in
 * `status`; `send` answers how many values were new, or null when the API does not say.
 */
async function uploadValues(file, batchSize, send, progress, status) {
  if (!file.files.length) return false;
  const values = (await file.files[0].text()).split(/[\r\n,]+/).map((v) => v.trim()).filter(Boolean);
  progress.max = Math.max(values.length, 1);
  progress.value = 0;
  let added = 0;
  const total = values.length.toLocaleString('en');
  const news = (n) => (n === null ? '' : `, ${n.toLocaleString('en')} new`);
  try {
    for (let at = 0; at < values.length; at += batchSize) {
      const batch = values.slice(at, at + batchSize);
      const fresh = await send(batch);
      added = fresh === null || added === null ? null : added + fresh;
      progress.value = at + batch.length;
      status.textContent = `${(at + batch.length).toLocaleString('en')} of ${total} values sent${news(added)}`;
    }
    status.textContent = `Done: ${total} values sent${news(added)}.`;
    return true;
  } catch (e) {
    status.textContent = `Stopped at ${progress.value.toLocaleString('en')} of ${total}: ${e.message}`;
    return false;
  }
}

/**
 * A table in its scrolling wrapper: `headers` are the column titles, `narrow` those of them
 * hidden on a phone-width screen (their cells carry `.hide-narrow` too).
 */
function dataTable(label, headers, rows, narrow = []) {
  return h('div.table-wrap', {}, h('table', { 'aria-label': label },
    h('thead', {}, h('tr', {}, headers.map((title) => h(narrow.includes(title) ? 'th.hide-narrow' : 'th', {}, title)))),
    h('tbody', {}, rows)));
}

function time(text) {
  return text ? new Date(text).toLocaleString() : '—';
}

/** What the events module (events.js) uses of this one. */
const ui = {
  h, api, apiKey, notice, dataTable, time, showIf,
  gen: () => generation,
  onLeave: (cleanup) => leaving.push(cleanup),
};

// ---------------------------------------------------------------------------
// Session

let me = null;

function signOut(message) {
  sessionStorage.removeItem(KEY_STORE);
  me = null;
  location.hash = '#/';
  signIn(message);
}

function signIn(message) {
  nav.replaceChildren();
  const error = h('p.field-error#key-error', { role: 'alert' }, message || '');
  const input = h('input#api-key', {
    type: 'password', name: 'api-key', autocomplete: 'off', required: true,
    'aria-describedby': 'key-error',
  });
  const form = h('form.stack', {
    'aria-label': 'Sign in',
    onsubmit: async (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_STORE, input.value.trim());
      try {
        me = await api('GET', '/me');
        route();
      } catch (e) {
        sessionStorage.removeItem(KEY_STORE);
        error.textContent = e.status === 401 ? 'That API key is not valid.' : e.message;
        input.setAttribute('aria-invalid', 'true');
        input.focus();
      }
    },
  },
  h('label', { for: 'api-key' }, 'API key', input),
  error,
  h('div', {}, h('button', { type: 'submit' }, 'Sign in')));
  show(h('h1', {}, 'Sign in'), h('p.muted', {}, 'Use an API key of your organization. It is kept in this tab only.'), form);
  input.focus();
}

function renderNav() {
  nav.replaceChildren(
    h('a', { href: '#/' }, 'Pipelines'),
    h('a', { href: '#/new' }, 'New pipeline'),
    h('a', { href: '#/events' }, 'Events'),
    h('a', { href: '#/backfills' }, 'Backfills'),
    h('a', { href: '#/datasets' }, 'Datasets'),
    h('a', { href: '#/prices' }, 'Prices'),
    h('a', { href: '#/secrets' }, 'Secrets'),
    h('span.who', {}, me.is_operator ? 'operator' : 'member', ' · ', me.organization_id.slice(0, 8)),
    h('button.secondary', { type: 'button', onclick: () => signOut('Signed out.') }, 'Sign out'),
  );
}

// ---------------------------------------------------------------------------
// Views

async function pipelinesView() {
  const gen = generation;
  showIf(gen, h('h1', {}, 'Pipelines'), h('p.muted', {}, 'Loading…'));
  const pipelines = await api('GET', '/beam');
  const rows = pipelines.map((p) => {
    const source = p.pipeline_config.source;
    const sinks = p.pipeline_config.sinks.map((s) => `${s.type}:${s.name}`).join(', ');
    const state = h('td.state', {}, '…');
    const rate = h('td.rate', {}, '…');
    // Filled in once the list shows: one pipeline's state and rate at a time need not
    // hold the whole list back.
    pipelineStateInto(p.id, state, rate);
    return h('tr', { 'data-pipeline': p.id },
      h('td', {}, h('a', { href: `#/p/${encodeURIComponent(p.id)}` }, p.name)),
      h('td', {}, `${source.chain}.${source.entity}${source.is_zerolag ? '.zerolag' : ''}`),
      state, rate,
      h('td.hide-narrow', {}, sinks),
      h('td.hide-narrow', {}, time(p.created_at)));
  });
  showIf(gen, 
    h('h1', {}, 'Pipelines'),
    h('div.actions', {}, h('a', { href: '#/new' }, 'New pipeline')),
    pipelines.length === 0
      ? h('p.muted', {}, 'No pipelines yet.')
      : dataTable('Pipelines', ['Name', 'Source', 'State', 'Records read', 'Sinks', 'Created'], rows, ['Sinks', 'Created']),
  );
  if (gen === generation) events.markProblems(ui, rows);
}

/** How a deployment's state reads: `running · 1/1 workers healthy`, `paused`, `not deployed`. */
function stateText(stats) {
  const health = stats.workers_health;
  if (stats.status === 'deployed') return `running · ${health.healthy_workers}/${health.total_workers} workers healthy`;
  return stats.status === 'paused' ? 'paused' : 'not deployed';
}

/**
 * A pipeline's state (`…/deploy/stats`) and its current rate: records read per second in the
 * last complete minute (the 1h series' point before the current, still-counting one).
 */
async function pipelineStateInto(id, stateCell, rateCell) {
  const path = `/beam/${encodeURIComponent(id)}`;
  try {
    const [stats, metrics] = await Promise.all([
      api('GET', `${path}/deploy/stats`),
      api('GET', `${path}/deploy/metrics?time_range=1h&metrics=messages_received`),
    ]);
    stateCell.textContent = stateText(stats);
    stateCell.dataset.state = stats.status;
    const points = metrics.metrics[0]?.points || [];
    const last = points[points.length - 2];
    if (stats.status !== 'deployed' || !last) {
      rateCell.textContent = '—';
      return;
    }
    const perSecond = last.value / RANGE_STEP_SECONDS['1h'];
    rateCell.textContent = `${formatRate(perSecond)}/s`;
    rateCell.dataset.minute = last.timestamp;
    rateCell.title = `records read per second in the minute from ${time(last.timestamp)}`;
  } catch (e) {
    stateCell.textContent = e.status === 503 ? '—' : e.message;
    rateCell.textContent = '—';
  }
}

/** A rate with three significant digits (`0.0167`, `12.5`, `1,240`). */
function formatRate(value) {
  if (value === 0) return '0';
  return value >= 100 ? Math.round(value).toLocaleString('en-US') : String(Number(value.toPrecision(3)));
}

/** Form fields a 422 `loc` can point at; anything else is shown under the JSON editor. */
const FIELD_OF_LOC = [
  [['body', 'name'], 'name'],
  [['body', 'description'], 'description'],
  [['body', 'pipeline_config', 'source'], 'source'],
  [['body', 'pipeline_config', 'sinks', 0, 'name'], 'sink-name'],
  [['body', 'pipeline_config', 'sinks'], 'sink-name'],
];

function fieldOf(loc) {
  for (const [prefix, field] of FIELD_OF_LOC) {
    if (prefix.every((part, i) => loc[i] === part)) return field;
  }
  return 'json';
}

/** The pipeline form: a new pipeline, or (with `id`) the form's fields of an existing one. */
async function pipelineFormView(id = null) {
  const gen = generation;
  const title = id ? 'Edit pipeline' : 'New pipeline';
  showIf(gen, h('h1', {}, title), h('p.muted', {}, 'Loading…'));
  const [{ sources }, existing] = await Promise.all([
    api('GET', '/beam/sources'),
    id ? pipelineWithAccess(id).then((found) => found.pipeline) : Promise.resolve(null),
  ]);
  const name = h('input#name', { name: 'name', 'aria-describedby': 'name-error' });
  const description = h('input#description', { name: 'description', 'aria-describedby': 'description-error' });
  const source = h('select#source', { name: 'source', 'aria-describedby': 'source-error' },
    sources.map((s) => h('option', { value: `${s.chain}/${s.entity}` }, `${s.chain}.${s.entity}`)));
  const zerolag = h('input#zerolag', { type: 'checkbox', name: 'zerolag' });
  const sinkName = h('input#sink-name', { name: 'sink-name', value: 'out', 'aria-describedby': 'sink-name-error' });
  const json = h('textarea#json', { name: 'json', spellcheck: 'false', 'aria-describedby': 'json-error' });
  const useJson = h('input#use-json', { type: 'checkbox' });
  const status = h('div#form-status');

  // Editing keeps what the form has no field for (transforms, other sinks, sizes), and the
  // first managed sink's uid.
  const managedIndex = existing ? existing.pipeline_config.sinks.findIndex((s) => s.type === 'kafka') : -1;
  const body = () => {
    const [chain, entity] = source.value.split('/');
    const sinks = existing ? existing.pipeline_config.sinks.map((s) => ({ ...s })) : [{ type: 'kafka', name: '' }];
    sinks[Math.max(managedIndex, 0)].name = sinkName.value;
    return {
      ...(existing ? {
        tags: existing.tags, static_egress_ip: existing.static_egress_ip,
        pod_size: existing.pod_size, delivery_guarantee: existing.delivery_guarantee,
      } : {}),
      name: name.value,
      description: description.value,
      pipeline_config: {
        source: { chain, entity, is_zerolag: zerolag.checked },
        transforms: existing ? existing.pipeline_config.transforms : [],
        sinks,
      },
    };
  };
  const sync = () => {
    if (!useJson.checked) json.value = JSON.stringify(body(), null, 2);
  };
  for (const control of [name, description, source, zerolag, sinkName]) control.addEventListener('input', sync);
  useJson.addEventListener('change', sync);
  if (existing) {
    const from = existing.pipeline_config.source;
    name.value = existing.name;
    description.value = existing.description || '';
    source.value = `${from.chain}/${from.entity}`;
    zerolag.checked = from.is_zerolag;
    sinkName.value = existing.pipeline_config.sinks[Math.max(managedIndex, 0)]?.name || '';
  } else {
    const preferred = sources.find((s) => s.chain === 'base' && s.entity === 'erc20_token_transfer');
    if (preferred) source.value = `${preferred.chain}/${preferred.entity}`;
  }
  sync();

  const form = h('form.stack', {
    'aria-label': title,
    onsubmit: async (event) => {
      event.preventDefault();
      clearFieldErrors();
      status.replaceChildren();
      const request = useJson.checked ? parseJsonField(json, 'json-error') : body();
      if (request === undefined) return;
      try {
        const saved = id
          ? await api('PUT', `/beam/${encodeURIComponent(id)}`, request)
          : await api('POST', '/beam', request);
        location.hash = `#/p/${encodeURIComponent(saved.id)}`;
      } catch (e) {
        if (!e.violations.length) {
          status.replaceChildren(notice(e.message, 'error'));
          return;
        }
        let first = null;
        for (const violation of e.violations) {
          const id = fieldOf(violation.loc || []);
          const error = document.getElementById(`${id}-error`);
          const where = id === 'json' ? `${(violation.loc || []).join('.')}: ` : '';
          error.textContent = (error.textContent ? error.textContent + '\n' : '') + where + violation.msg;
          const control = document.getElementById(id);
          control.setAttribute('aria-invalid', 'true');
          first = first || control;
        }
        status.replaceChildren(notice(`The server refused the pipeline (${e.violations.length} problem${e.violations.length > 1 ? 's' : ''}); see the fields marked.`, 'error'));
        first?.focus();
      }
    },
  },
  field('name', 'Name', name),
  field('description', 'Description', description),
  field('source', 'Source stream', source),
  h('label.check', { for: 'zerolag' }, zerolag, 'zerolag (the tip of the chain, before finality: may reorg)'),
  field('sink-name', 'Managed sink name', sinkName, 'Records land in a managed topic you read through the API.'),
  h('details', {},
    h('summary', {}, 'JSON body'),
    h('label.check', { for: 'use-json' }, useJson, 'send this JSON instead of the form'),
    field('json', 'Request body', json)),
  status,
  h('div', {}, h('button', { type: 'submit' }, id ? 'Save pipeline' : 'Create pipeline')));
  showIf(gen, id ? h('p', {}, h('a', { href: `#/p/${encodeURIComponent(id)}` }, `← ${existing.name}`)) : null, h('h1', {}, title), form);
  name.focus();
}

/** What the signed-in key may do to a pipeline: `GET /beam/{id}`'s `X-Sluice-Access`. */
async function pipelineWithAccess(id) {
  const { data, headers } = await apiResponse('GET', `/beam/${encodeURIComponent(id)}`);
  const access = headers.get('x-sluice-access') || 'read';
  return { pipeline: data, editable: access === 'edit' || access === 'manage', manages: access === 'manage' };
}

async function pipelineView(id) {
  const gen = generation;
  showIf(gen, h('h1', {}, 'Pipeline'), h('p.muted', {}, 'Loading…'));
  const path = `/beam/${encodeURIComponent(id)}`;
  const [{ pipeline, editable, manages }, stats] = await Promise.all([
    pipelineWithAccess(id),
    api('GET', `${path}/deploy/stats`),
  ]);
  const result = h('div#action-result', { 'aria-live': 'polite' });
  const act = (label, method, suffix, kind = '', confirmText = null) => h(`button${kind ? '.' + kind : ''}`, {
    type: 'button',
    onclick: async () => {
      if (confirmText && !confirm(confirmText)) return;
      try {
        const answer = await api(method, path + suffix);
        if (method === 'DELETE') {
          location.hash = '#/';
          return;
        }
        await pipelineView(id);
        document.getElementById('action-result').replaceChildren(notice(answer?.message || `${label}: done`, 'ok'));
      } catch (e) {
        result.replaceChildren(notice(e.message, 'error'));
      }
    },
  }, label);
  const health = stats.workers_health;
  const running = health.total_workers > 0;
  const source = pipeline.pipeline_config.source;
  const workers = health.workers.map((w) => h('tr', {},
    h('td', {}, w.name), h('td', {}, w.status), h('td', {}, w.is_ready ? 'yes' : 'no'),
    h('td.hide-narrow', {}, String(w.restart_count)), h('td', {}, w.last_error || '—')));
  const managed = pipeline.pipeline_config.sinks.filter((s) => s.type === 'kafka');
  const transforms = pipeline.pipeline_config.transforms.map((t) => h('li', {},
    h('code', {}, t.uid), ' ',
    t.type === 'redis_set_filter'
      ? [`set filter on ${t.filter_expr.replace(/^root = this\./, '')} · `,
        h('a', { href: `#/p/${encodeURIComponent(id)}/values/${encodeURIComponent(t.uid)}` }, 'filter values')]
      : 'v8 script'));
  const tail = h('ol.tail#tail', { 'aria-label': 'Records arriving in the sink' });
  showIf(gen, 
    h('h1', {}, pipeline.name),
    h('p', {}, h('span.badge' + (running ? '.running' : ''), { 'data-state': stats.status }, running ? stateText(stats) : stats.status === 'paused' ? 'paused' : 'not running'),
      ' ', h('span.muted', {}, `${source.chain}.${source.entity}${source.is_zerolag ? '.zerolag' : ''} · ${pipeline.pod_size} · ${pipeline.delivery_guarantee}`)),
    pipeline.description ? h('p', {}, pipeline.description) : null,
    editable
      ? h('div.actions', { role: 'group', 'aria-label': 'Lifecycle' },
        act(running ? 'Redeploy' : 'Deploy', 'POST', '/deploy'),
        act('Pause', 'POST', '/pause', 'secondary'),
        act('Tear down', 'POST', '/teardown', 'secondary', 'Tear the deployment down? Its sink records go.'),
        act('Delete', 'DELETE', '', 'danger', 'Delete this pipeline?'))
      : h('p.muted#read-only', {}, 'You can read this pipeline but not change it.'),
    result,
    stats.stale_sinks?.length ? notice(`Redeploy to use changed secrets of: ${stats.stale_sinks.join(', ')}`) : null,
    h('h2', {}, 'Transforms'),
    transforms.length ? h('ul', {}, transforms) : h('p.muted', {}, 'None: every record of the stream goes to the sink.'),
    h('h2', {}, 'Workers'),
    workers.length
      ? dataTable('Workers', ['Worker', 'Status', 'Ready', 'Restarts', 'Last error'], workers, ['Restarts'])
      : h('p.muted', {}, 'No workers: deploy the pipeline to start them.'),
    h('h2', {}, 'Events'),
    events.timelineSection(ui, id),
    h('h2', {}, 'Metrics'),
    metricsSection(path, stats.deployed_at),
    h('h2', {}, 'Dead letters'),
    deadLettersSection(path, editable),
    h('h2', {}, 'Script logs'),
    logsSection(path),
    h('h2', {}, 'Live records'),
    managed.length && running
      ? tail
      : h('p.muted', {}, managed.length ? 'Deploy the pipeline to watch its records arrive.' : 'This pipeline has no managed sink to watch.'),
    h('h2', {}, 'Configuration'),
    editable ? h('p', {}, h('a', { href: `#/p/${encodeURIComponent(id)}/edit` }, 'Edit with the form')) : null,
    editable ? editSection(path, pipeline) : h('pre', {}, JSON.stringify(pipeline.pipeline_config, null, 2)),
    manages ? h('h2', {}, 'Sharing') : null,
    manages ? sharingSection(path) : null,
  );
  if (managed.length && running) startTail(`${path}/sinks/${encodeURIComponent(managed[0].uid)}/records/stream`, tail);
}

/** Width of one point of each time range, in seconds (docs/metrics.md). */
const RANGE_STEP_SECONDS = { '1h': 60, '1d': 900, '1w': 3600 };

/**
 * Each metric type's chart: its title and how an API point's value becomes what is drawn.
 * Counts are per point, so they are divided by the point's width into a rate per second;
 * latencies are the mean of the point's batches, in ms; data age comes in ms and is drawn
 * in seconds.
 */
const METRIC_CHARTS = {
  messages_received: { title: 'Records read per second', scale: (value, step) => value / step },
  messages_sent: { title: 'Records delivered per second', scale: (value, step) => value / step },
  total_latency: { title: 'Ingest-to-sink latency, mean (ms)', scale: (value) => value },
  processing_latency: { title: 'Processing latency, mean (ms)', scale: (value) => value },
  processor_error: { title: 'Transform errors per second', scale: (value, step) => value / step },
  output_error: { title: 'Sink errors per second', scale: (value, step) => value / step },
  data_age: { title: 'Data age (s)', scale: (value) => value / 1000 },
};

/** What one point of a range stands for, for the charts' captions. */
const RANGE_POINT = { '1h': 'per minute', '1d': 'per 15 minutes', '1w': 'per hour' };

/**
 * The seven metrics of a deployment as charts over 1h, 1d or 1w. The time axis starts at
 * the deployment (`deployedAt`, from `…/deploy/stats`) when that is within the range, and
 * ends where the current point ends; each point is drawn in the middle of its interval.
 */
function metricsSection(path, deployedAt) {
  const charts = h('div#metric-charts.charts');
  const buttons = ['1h', '1d', '1w'].map((range) => h('button.secondary', {
    type: 'button', 'data-range': range, 'aria-pressed': range === '1h' ? 'true' : 'false',
    onclick: () => draw(range),
  }, range));
  const draw = async (range) => {
    for (const button of buttons) button.setAttribute('aria-pressed', String(button.dataset.range === range));
    charts.replaceChildren(h('p.muted', {}, 'Loading…'));
    try {
      const body = await api('GET', `${path}/deploy/metrics?time_range=${range}`);
      charts.replaceChildren();
      const step = RANGE_STEP_SECONDS[range];
      // Count series have every point of the range: they give its start and its end.
      const stamps = body.metrics.flatMap((series) => series.points.map((p) => Date.parse(p.timestamp) / 1000));
      if (!stamps.length) {
        charts.replaceChildren(h('p.muted', {}, 'No metrics in this range.'));
        return;
      }
      const rangeStart = Math.min(...stamps);
      const rangeEnd = Math.max(...stamps) + step;
      const deployed = deployedAt ? Math.floor(Date.parse(deployedAt) / 1000 / step) * step : null;
      const from = deployed !== null && deployed > rangeStart && deployed < rangeEnd ? deployed : rangeStart;
      charts.dataset.from = String(from);
      charts.dataset.to = String(rangeEnd);
      const width = Math.max(260, Math.min(charts.clientWidth || main.clientWidth, 1060) / (main.clientWidth > 700 ? 2 : 1) - 40);
      for (const series of body.metrics) {
        const chart = METRIC_CHARTS[series.metric_type] || { title: series.metric_type, scale: (value) => value };
        const figure = h('figure.chart', { 'data-metric': series.metric_type },
          h('figcaption', {}, chart.title, h('span.muted', {}, ` · ${RANGE_POINT[range]}`)));
        charts.append(figure);
        const points = series.points.filter((p) => Date.parse(p.timestamp) / 1000 >= from);
        const xs = points.map((p) => Date.parse(p.timestamp) / 1000 + step / 2);
        const ys = points.map((p) => chart.scale(p.value, step));
        const top = Math.max(0, ...ys);
        // eslint-disable-next-line no-undef
        const plot = new uPlot({
          width, height: 150,
          legend: { show: false },
          scales: {
            x: { time: true, range: () => [from, rangeEnd] },
            y: { range: () => [0, top > 0 ? top * 1.1 : 1] },
          },
          series: [{}, { label: chart.title, stroke: '#0b5fff', width: 1.5, fill: 'rgba(11,95,255,.08)', points: { show: true, size: 5 } }],
          axes: [{ size: 30 }, { size: 56 }],
        }, [xs, ys], figure);
        // The browser tests read what was drawn from here.
        figure.plot = plot;
      }
    } catch (e) {
      charts.replaceChildren(notice(e.message, 'error'));
    }
  };
  setTimeout(() => draw('1h'), 0);
  return h('section', { 'aria-label': 'Metrics' },
    h('div.actions', { role: 'group', 'aria-label': 'Time range' }, buttons), charts);
}

/** The pipeline's editable fields as JSON, saved with `PUT /beam/{id}`. */
function editSection(path, pipeline) {
  const spec = {
    name: pipeline.name, description: pipeline.description, tags: pipeline.tags,
    static_egress_ip: pipeline.static_egress_ip, pod_size: pipeline.pod_size,
    delivery_guarantee: pipeline.delivery_guarantee, pipeline_config: pipeline.pipeline_config,
  };
  const editor = h('textarea#edit-json', { spellcheck: 'false', 'aria-describedby': 'edit-json-error' });
  editor.value = JSON.stringify(spec, null, 2);
  const error = h('p.field-error#edit-json-error', { role: 'alert' });
  const result = h('div#edit-result', { 'aria-live': 'polite' });
  const save = async () => {
    error.textContent = '';
    editor.removeAttribute('aria-invalid');
    const body = parseJsonField(editor, 'edit-json-error');
    if (body === undefined) return;
    try {
      await api('PUT', path, body);
      result.replaceChildren(notice('Saved. Deploy again to apply the change to the running pipeline.', 'ok'));
    } catch (e) {
      if (e.violations.length) {
        error.textContent = e.violations.map((v) => `${(v.loc || []).join('.')}: ${v.msg}`).join('\n');
        editor.setAttribute('aria-invalid', 'true');
        editor.focus();
      } else {
        result.replaceChildren(notice(e.message, 'error'));
      }
    }
  };
  return h('section', { 'aria-label': 'Edit' },
    h('label', { for: 'edit-json' }, 'Pipeline (JSON)', editor), error,
    h('div.actions', {}, h('button', { type: 'button', onclick: save }, 'Save changes')), result);
}

/** Who the pipeline is shared with (`…/permissions`; the owner and operators manage it). */
function sharingSection(path) {
  // The boxes and the button stay disabled until the current grants are in them: typed
  // before that, a change would be overwritten by the load and lost on save.
  const box = (id, label) => h('div', {}, h('label', { for: id }, label,
    h(`textarea#${id}`, { rows: 3, spellcheck: 'false', disabled: true, 'aria-describedby': `${id}-error` })),
  h('p.field-error', { id: `${id}-error`, role: 'alert' }));
  const section = h('section', { 'aria-label': 'Sharing', 'aria-busy': 'true' },
    h('p.muted', {}, 'User ids and team ids, one per line (GET /api/v1/me shows a user their ids).'),
    box('share-editors', 'Editors (user ids)'), box('share-readers', 'Readers (user ids)'),
    box('share-teams', 'Viewer teams (team ids)'));
  const result = h('div#share-result', { 'aria-live': 'polite' });
  const fields = { editors: 'share-editors', readers: 'share-readers', viewer_teams: 'share-teams' };
  const lines = (id) => section.querySelector(`#${id}`).value.split(/\s+/).filter(Boolean);
  const save = h('button', {
    type: 'button',
    disabled: true,
    onclick: async () => {
      for (const id of Object.values(fields)) section.querySelector(`#${id}-error`).textContent = '';
      try {
        await api('PUT', `${path}/permissions`, Object.fromEntries(Object.entries(fields).map(([name, id]) => [name, lines(id)])));
        result.replaceChildren(notice('Sharing saved.', 'ok'));
      } catch (e) {
        for (const v of e.violations) {
          const id = fields[(v.loc || [])[1]] || 'share-editors';
          section.querySelector(`#${id}-error`).textContent += `${v.msg}\n`;
        }
        result.replaceChildren(notice(e.message, 'error'));
      }
    },
  }, 'Save sharing');
  api('GET', `${path}/permissions`).then((grants) => {
    for (const [name, id] of Object.entries(fields)) {
      const field = section.querySelector(`#${id}`);
      field.value = (grants[name] || []).join('\n');
      field.disabled = false;
    }
    save.disabled = false;
    section.removeAttribute('aria-busy');
  }).catch((e) => result.replaceChildren(notice(e.message, 'error')));
  section.append(h('div.actions', {}, save), result);
  return section;
}

/** Records the transforms failed on (or a sink refused for good), with a replay button. */
function deadLettersSection(path, editable) {
  const body = h('div#dead-letters');
  const result = h('div#replay-result', { 'aria-live': 'polite' });
  const load = async () => {
    try {
      const page = await api('GET', `${path}/dead-letters?limit=100`);
      if (!page.dead_letters.length) {
        body.replaceChildren(h('p.muted', {}, 'None waiting to be replayed.'));
        return;
      }
      // The error is what a reader needs: it gets the room, the key is cut short (whole in
      // its tooltip).
      body.replaceChildren(dataTable('Dead letters', ['Offset', 'Key', 'Where', 'Error', 'At'],
        page.dead_letters.map((d) => h('tr', {},
          h('td.nowrap', {}, String(d.offset)), h('td.key', { title: d.key }, d.key),
          h('td.nowrap', {}, d.transform_uid ? `transform ${d.transform_uid}` : `sink ${d.sink_uid}`),
          h('td.error-text', {}, d.error), h('td.hide-narrow.nowrap', {}, time(d.timestamp)))), ['At']));
    } catch (e) {
      body.replaceChildren(h('p.muted', {}, e.status === 404 ? 'Deploy the pipeline to see its dead letters.' : e.message));
    }
  };
  const replay = h('button', {
    type: 'button',
    onclick: async () => {
      try {
        const answer = await api('POST', `${path}/dead-letters/replay`);
        result.replaceChildren(notice(`${answer.message}: ${answer.replayed} replayed, ${answer.delivered} delivered, ${answer.dead_lettered} failed again.`, 'ok'));
      } catch (e) {
        result.replaceChildren(notice(e.message, 'error'));
      }
      await load();
    },
  }, 'Replay through the current transforms');
  load();
  return h('section', { 'aria-label': 'Dead letters' },
    h('div.actions', {}, h('button.secondary', { type: 'button', onclick: load }, 'Refresh dead letters'), editable ? replay : null),
    result, body);
}

/** The latest `console.*` lines of the pipeline's scripts. */
function logsSection(path) {
  const list = h('ol.tail#script-logs', { 'aria-label': 'Script log lines' });
  const load = async () => {
    try {
      const { logs } = await api('GET', `${path}/logs?limit=200`);
      list.replaceChildren(...(logs.length
        ? logs.slice().reverse().map((l) => h('li', { 'data-level': l.level }, `${time(l.timestamp)}  ${l.level}  ${l.transform_uid}  ${l.message}`))
        : [h('li.muted', {}, 'No lines yet.')]));
    } catch (e) {
      list.replaceChildren(h('li', {}, e.message));
    }
  };
  load();
  return h('section', { 'aria-label': 'Script logs' },
    h('div.actions', {}, h('button.secondary', { type: 'button', onclick: load }, 'Refresh logs')), list);
}

/** Values sent per request when a file is uploaded (well under the body limit). */
const UPLOAD_BATCH = 20000;

async function valuesView(id, uid) {
  const gen = generation;
  const path = `/beam/${encodeURIComponent(id)}/transforms/${encodeURIComponent(uid)}/filter-values`;
  const [{ pipeline, editable }, counted] = await Promise.all([
    pipelineWithAccess(id),
    api('GET', `${path}/count`),
  ]);
  const count = h('p#value-count', { 'aria-live': 'polite' }, `${counted.count.toLocaleString('en')} values`);
  const refreshCount = async () => {
    const { count: n } = await api('GET', `${path}/count`);
    count.textContent = `${n.toLocaleString('en')} values`;
  };

  // Upload: a text or CSV file, values split on new lines and commas, sent in batches.
  const file = h('input#values-file', { type: 'file', accept: '.txt,.csv,text/plain,text/csv' });
  const progress = h('progress#upload-progress', { max: 1, value: 0, 'aria-label': 'Upload progress' });
  const uploadStatus = h('p#upload-status', { 'aria-live': 'polite' });
  const upload = async () => {
    const send = async (values) => (await api('POST', path, { values })).added;
    if (await uploadValues(file, UPLOAD_BATCH, send, progress, uploadStatus)) {
      await refreshCount();
      await page(null);
    }
  };

  // Search: one value, looked up exactly (lowercased, as the filter matches).
  const query = h('input#value-search', { type: 'search', name: 'value' });
  const found = h('p#search-result', { 'aria-live': 'polite' });
  const search = h('form.stack', {
    role: 'search',
    onsubmit: async (event) => {
      event.preventDefault();
      if (!query.value.trim()) return;
      try {
        const answer = await api('GET', `${path}/check?value=${encodeURIComponent(query.value.trim())}`);
        found.textContent = answer.is_member ? `${answer.value} is in the set.` : `${answer.value} is not in the set.`;
      } catch (e) {
        found.textContent = e.message;
      }
    },
  }, h('label', { for: 'value-search' }, 'Look up a value', query), h('div', {}, h('button', { type: 'submit' }, 'Look up')));

  // Pages of 100, in the set's order.
  const list = h('ol.tail#values-page', { 'aria-label': 'Filter values' });
  const next = h('button.secondary#next-page', { type: 'button', disabled: true }, 'Next page');
  let nextCursor = null;
  const page = async (cursor) => {
    const answer = await api('GET', `${path}?count=100${cursor === null ? '' : `&cursor=${cursor}`}`);
    list.replaceChildren(...answer.values.map((v) => h('li', {}, v)));
    nextCursor = answer.cursor;
    next.disabled = nextCursor === null;
  };
  next.addEventListener('click', () => page(nextCursor));

  showIf(gen, 
    h('p', {}, h('a', { href: `#/p/${encodeURIComponent(id)}` }, `← ${pipeline.name}`)),
    h('h1', {}, `Filter values of ${uid}`),
    count,
    editable
      ? h('section', { 'aria-label': 'Upload values' },
        h('h2', {}, 'Add values from a file'),
        h('p.muted', {}, 'One value per line (or separated by commas); values already there count once.'),
        h('div.actions', {}, h('label', { for: 'values-file' }, 'File', file),
          h('button#upload', { type: 'button', onclick: upload }, 'Upload')),
        progress, uploadStatus)
      : null,
    h('h2', {}, 'Search'),
    search, found,
    h('h2', {}, 'Values'),
    h('div.actions', {}, h('button.secondary', { type: 'button', onclick: () => page(null) }, 'First page'), next),
    list,
  );
  await page(null);
}

// ---------------------------------------------------------------------------
// Datasets (the caller's own; scripts read them with beam.contains)

/** Values sent per request when a file is added to a dataset (the API takes 250,000). */
const DATASET_BATCH = 50000;

async function datasetsView() {
  const gen = generation;
  const datasets = await api('GET', '/beam/datasets');
  const name = h('input#dataset-name', { 'aria-describedby': 'dataset-name-error' });
  const error = h('p.field-error#dataset-name-error', { role: 'alert' });
  const create = h('form.stack', {
    'aria-label': 'New dataset',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      try {
        const created = await api('POST', '/beam/datasets', { name: name.value });
        location.hash = `#/datasets/${encodeURIComponent(created.id)}`;
      } catch (e) {
        error.textContent = e.violations.length ? e.violations.map((v) => v.msg).join('\n') : e.message;
        name.setAttribute('aria-invalid', 'true');
      }
    },
  }, h('label', { for: 'dataset-name' }, 'Name', name), error, h('div', {}, h('button', { type: 'submit' }, 'Create dataset')));
  showIf(gen, 
    h('h1', {}, 'Datasets'),
    h('p.muted', {}, 'Sets of values your scripts look up with beam.contains(name, value).'),
    datasets.length === 0
      ? h('p.muted', {}, 'No datasets yet.')
      : dataTable('Datasets', ['Name', 'Created', 'Changed'], datasets.map((d) => h('tr', {},
        h('td', {}, h('a', { href: `#/datasets/${encodeURIComponent(d.id)}` }, d.name)),
        h('td.hide-narrow', {}, time(d.created_at)), h('td', {}, time(d.updated_at)))), ['Created']),
    h('h2', {}, 'New dataset'),
    create,
  );
}

async function datasetView(id) {
  const gen = generation;
  const path = `/beam/datasets/${encodeURIComponent(id)}`;
  const datasets = await api('GET', '/beam/datasets');
  const dataset = datasets.find((d) => d.id === id);
  if (!dataset) throw new ApiError(404, { detail: `Dataset ${id} not found` });
  const total = h('p#entry-count', { 'aria-live': 'polite' });
  const list = h('ol.tail#entries', { 'aria-label': 'Entries' });
  const next = h('button.secondary', { type: 'button', disabled: true }, 'Next page');
  let cursor = null;
  const page = async (from) => {
    const answer = await api('GET', `${path}/entries?limit=100${from ? `&cursor=${encodeURIComponent(from)}` : ''}`);
    total.textContent = `${answer.total_count.toLocaleString('en')} entries`;
    list.replaceChildren(...answer.values.map((v) => h('li', {}, v)));
    cursor = answer.cursor;
    next.disabled = cursor === null;
  };
  next.addEventListener('click', () => page(cursor));
  const file = h('input#entries-file', { type: 'file', accept: '.txt,.csv,text/plain,text/csv' });
  const progress = h('progress#entries-progress', { max: 1, value: 0, 'aria-label': 'Upload progress' });
  const status = h('p#entries-status', { 'aria-live': 'polite' });
  const upload = async () => {
    const send = async (values) => {
      await api('POST', `${path}/entries`, { values });
      return null;
    };
    if (await uploadValues(file, DATASET_BATCH, send, progress, status)) await page(null);
  };
  const remove = h('button.danger', {
    type: 'button',
    onclick: async () => {
      if (!confirm(`Delete the dataset ${dataset.name} and every entry of it?`)) return;
      await api('DELETE', path);
      location.hash = '#/datasets';
    },
  }, 'Delete dataset');
  showIf(gen, 
    h('p', {}, h('a', { href: '#/datasets' }, '← Datasets')),
    h('h1', {}, dataset.name),
    total,
    h('h2', {}, 'Add entries from a file'),
    h('div.actions', {}, h('label', { for: 'entries-file' }, 'File', file), h('button', { type: 'button', onclick: upload }, 'Add entries')),
    progress, status,
    h('h2', {}, 'Entries'),
    h('div.actions', {}, h('button.secondary', { type: 'button', onclick: () => page(null) }, 'First page'), next),
    list,
    h('div.actions', {}, remove),
  );
  await page(null);
}

// ---------------------------------------------------------------------------
// Organization secrets (sinks name them; values are never shown again)

async function secretsView() {
  const gen = generation;
  const secrets = await api('GET', '/beam/secrets');
  const manager = me.is_operator || me.is_org_admin;
  const name = h('input#secret-name', { autocomplete: 'off', 'aria-describedby': 'secret-name-error' });
  const value = h('input#secret-value', { type: 'password', autocomplete: 'new-password', 'aria-describedby': 'secret-value-error' });
  const result = h('div#secret-result', { 'aria-live': 'polite' });
  const form = h('form.stack', {
    'aria-label': 'Set a secret',
    onsubmit: async (event) => {
      event.preventDefault();
      clearFieldErrors();
      try {
        await api('PUT', `/beam/secrets/${encodeURIComponent(name.value)}`, { value: value.value });
        value.value = '';
        await secretsView();
        document.getElementById('secret-result').replaceChildren(notice(`Secret ${name.value} stored.`, 'ok'));
      } catch (e) {
        for (const v of e.violations) {
          const id = (v.loc || []).includes('value') ? 'secret-value' : 'secret-name';
          document.getElementById(`${id}-error`).textContent = v.msg;
        }
        if (!e.violations.length) result.replaceChildren(notice(e.message, 'error'));
      }
    },
  },
  field('secret-name', 'Name', name, 'Letters, digits, ".", "_" and "-".'),
  field('secret-value', 'Value', value, 'Stored encrypted; nobody can read it back, only replace or delete it.'),
  h('div', {}, h('button', { type: 'submit' }, 'Store secret')));
  const remove = (secret) => h('button.danger', {
    type: 'button',
    onclick: async () => {
      if (!confirm(`Delete the secret ${secret}? Sinks naming it stop working at their next deploy.`)) return;
      try {
        await api('DELETE', `/beam/secrets/${encodeURIComponent(secret)}`);
        await secretsView();
      } catch (e) {
        result.replaceChildren(notice(e.message, 'error'));
      }
    },
  }, `Delete ${secret}`);
  showIf(gen,
    h('h1', {}, 'Secrets'),
    h('p.muted', {}, 'Credentials and signing keys that sinks name (webhook hash_key, Kafka, NATS and SNS credentials).'),
    secrets.length === 0
      ? h('p.muted', {}, 'No secrets yet.')
      : dataTable('Secrets', ['Name', 'Changed', ''], secrets.map((secret) => h('tr', {},
        h('td', {}, secret.name), h('td', {}, time(secret.updated_at)),
        h('td', {}, manager ? remove(secret.name) : null)))),
    manager ? h('h2', {}, 'Set a secret') : h('p.muted#secrets-read-only', {}, 'Organization admins and operators manage secrets.'),
    manager ? form : null,
    result);
}

// ---------------------------------------------------------------------------
// Token prices (the developer price API)

const RANGES = { '1h': 3600e3, '1d': 86400e3, '1w': 7 * 86400e3 };

async function pricesView() {
  const gen = generation;
  const chain = h('input#price-chain', { value: 'base', 'aria-describedby': 'price-error' });
  const token = h('input#price-token', { placeholder: '0x…', 'aria-describedby': 'price-error' });
  const granularity = h('select#price-granularity', {}, ['15s', '1m', '5m', '1h', '1d'].map((g) => h('option', { value: g }, g)));
  granularity.value = '1m';
  const range = h('select#price-range', {}, Object.keys(RANGES).map((r) => h('option', { value: r }, `last ${r}`)));
  const error = h('p.field-error#price-error', { role: 'alert' });
  const latest = h('div#latest-price', { 'aria-live': 'polite' });
  const chart = h('div#candles');
  const form = h('form.stack', {
    'aria-label': 'Token price',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      latest.replaceChildren();
      chart.replaceChildren();
      const address = { chain: chain.value.trim(), token_address: token.value.trim() };
      try {
        const now = Date.now();
        const [current, history] = await Promise.all([
          api('POST', '/developer/prices', [address]),
          api('POST', '/developer/prices/history', {
            addresses: [address], time_granularity: granularity.value,
            start_timestamp: new Date(now - RANGES[range.value]).toISOString(), end_timestamp: new Date(now).toISOString(),
          }),
        ]);
        const item = current.items[0];
        latest.replaceChildren(item
          ? h('p', {}, h('strong', {}, `$${item.price.toPrecision(6)}`), ` · open ${item.open} · high ${item.high} · low ${item.low} · close ${item.close} · at ${time(item.timestamp)}`)
          : h('p.muted', {}, 'No trade of this token in the retained minutes.'));
        const points = history.items[0]?.prices || [];
        if (!points.length) {
          chart.replaceChildren(h('p.muted', {}, 'No candles in this range.'));
          return;
        }
        drawCandles(chart, points);
      } catch (e) {
        error.textContent = e.violations.length ? e.violations.map((v) => `${(v.loc || []).join('.')}: ${v.msg}`).join('\n') : e.message;
      }
    },
  },
  h('label', { for: 'price-chain' }, 'Chain', chain),
  h('label', { for: 'price-token' }, 'Token address', token),
  h('label', { for: 'price-granularity' }, 'Candle', granularity),
  h('label', { for: 'price-range' }, 'Range', range),
  error,
  h('div', {}, h('button', { type: 'submit' }, 'Look up')));
  showIf(gen, h('h1', {}, 'Token prices'), form, latest, chart);
  token.focus();
}

/** Candlesticks of `points` (`{timestamp, open, high, low, close}`), drawn on a uPlot chart. */
function drawCandles(into, points) {
  const xs = points.map((p) => Date.parse(p.timestamp) / 1000);
  const column = (key) => points.map((p) => p[key]);
  const [open, high, low, close] = ['open', 'high', 'low', 'close'].map(column);
  const candles = (u) => {
    const { ctx } = u;
    const step = xs.length > 1 ? (u.valToPos(xs[1], 'x', true) - u.valToPos(xs[0], 'x', true)) : 12;
    const half = Math.max(1, Math.min(8, step * 0.35));
    ctx.save();
    for (let i = 0; i < xs.length; i++) {
      const x = u.valToPos(xs[i], 'x', true);
      const [o, h2, l, c] = [open[i], high[i], low[i], close[i]].map((v) => u.valToPos(v, 'y', true));
      ctx.strokeStyle = ctx.fillStyle = close[i] >= open[i] ? '#067647' : '#b42318';
      ctx.beginPath();
      ctx.moveTo(x, h2);
      ctx.lineTo(x, l);
      ctx.stroke();
      ctx.fillRect(x - half, Math.min(o, c), half * 2, Math.max(1, Math.abs(c - o)));
    }
    ctx.restore();
  };
  const width = Math.max(300, Math.min(main.clientWidth - 40, 1060));
  into.replaceChildren();
  const figure = h('figure.chart#candle-chart', { 'data-candles': String(points.length) }, h('figcaption', {}, `${points.length} candles, USD`));
  into.append(figure);
  // eslint-disable-next-line no-undef
  new uPlot({
    width, height: 260, legend: { show: false },
    scales: { x: { time: true }, y: { range: () => [Math.min(...low) * 0.995, Math.max(...high) * 1.005] } },
    series: [{}, { label: 'close', stroke: 'transparent', points: { show: false } }],
    axes: [{}, { size: 70 }],
    hooks: { draw: [candles] },
  }, [xs, close], figure);
}

// ---------------------------------------------------------------------------
// Backfills

/** `<input type="datetime-local">` value, read as UTC, to RFC 3339. */
const utc = (local) => (local ? `${local.length === 16 ? local + ':00' : local}Z` : '');
const localValue = (date) => date.toISOString().slice(0, 16);

async function backfillsView() {
  const gen = generation;
  const jobs = await api('GET', '/beam/backfills');
  const rows = jobs.slice().reverse().map((job) => {
    const total = job.num_chunks;
    const done = total === null ? 0 : total - job.chunks_left;
    const bar = h('progress', { max: Math.max(total ?? 1, 1), value: total === null ? 0 : done, 'aria-label': `Progress of ${job.job_name}` });
    const active = job.status === 'staging' || job.status === 'transporting';
    return h('tr', { 'data-job': job.job_id },
      h('td', {}, job.job_name, h('div.muted', {}, job.table)),
      h('td', {}, h('span.badge' + (job.status === 'completed' ? '.running' : ''), { 'data-status': job.status }, job.status),
        job.error_message ? h('div.field-error', {}, job.error_message) : null),
      h('td', {}, bar, h('div.muted', {}, total === null ? 'staging…' : `${done}/${total} chunks`)),
      h('td.hide-narrow', {}, `${job.rows_delivered.toLocaleString('en')} of ${job.rows_staged.toLocaleString('en')} rows`),
      h('td', {}, active ? h('button.danger', {
        type: 'button',
        onclick: async () => {
          try {
            await api('POST', `/beam/backfills/${encodeURIComponent(job.job_id)}/cancel`, {});
          } catch (e) {
            alert(e.message);
          }
          await backfillsView();
        },
      }, 'Cancel') : time(job.time_completed)));
  });
  showIf(gen, 
    h('h1', {}, 'Backfills'),
    h('div.actions', {}, h('a', { href: '#/backfills/new' }, 'New backfill')),
    jobs.length === 0
      ? h('p.muted', {}, 'No backfill jobs yet.')
      : dataTable('Backfill jobs', ['Job', 'Status', 'Progress', 'Rows', ''], rows, ['Rows']),
  );
  // While a job runs, the page follows it.
  if (jobs.some((job) => job.status === 'staging' || job.status === 'transporting')) {
    const timer = setTimeout(() => { if (location.hash === '#/backfills') backfillsView().catch(() => {}); }, 1000);
    leaving.push(() => clearTimeout(timer));
  }
}

const BACKFILL_FIELDS = [
  [['body', 'job_name'], 'job-name'],
  [['body', 'table'], 'table'],
  [['body', 'backfill_window', 'start'], 'start'],
  [['body', 'backfill_window', 'end'], 'end'],
  [['body', 'backfill_window'], 'start'],
  [['body', 'filter', 'column'], 'filter-column'],
  [['body', 'filter', 'values'], 'filter-values'],
  [['body', 'filter'], 'filter-column'],
  [['body', 'destinations'], 'destination'],
];

async function newBackfillView() {
  const gen = generation;
  const tables = (await api('GET', '/beam/backfills/tables')).filter((t) => t.backfillable);
  const jobName = h('input#job-name', { 'aria-describedby': 'job-name-error' });
  const table = h('select#table', { 'aria-describedby': 'table-error' },
    tables.map((t) => h('option', { value: t.name }, `${t.name} (${t.row_count.toLocaleString('en')} rows)`)));
  const now = new Date();
  const start = h('input#start', { type: 'datetime-local', value: localValue(new Date(now - 90 * 86400e3)), 'aria-describedby': 'start-error' });
  const end = h('input#end', { type: 'datetime-local', value: localValue(now), 'aria-describedby': 'end-error' });
  const column = h('select#filter-column', { 'aria-describedby': 'filter-column-error' });
  const fillColumns = () => {
    const chosen = tables.find((t) => t.name === table.value);
    column.replaceChildren(h('option', { value: '' }, '(no filter)'),
      ...(chosen?.columns || []).map((c) => h('option', { value: c.name }, c.name)));
  };
  table.addEventListener('change', fillColumns);
  fillColumns();
  const values = h('textarea#filter-values', { rows: 4, 'aria-describedby': 'filter-values-error' });
  const destination = h('input#destination', { value: 'backfill', 'aria-describedby': 'destination-error' });
  const status = h('div');
  // The whole body as JSON: transforms, external destinations (webhook, Kafka, NATS, SNS)
  // and static_egress_ip have no form fields.
  const json = h('textarea#backfill-json', { spellcheck: 'false', 'aria-describedby': 'backfill-json-error' });
  const useJson = h('input#backfill-use-json', { type: 'checkbox' });
  const formBody = () => {
    const body = {
      job_name: jobName.value,
      table: table.value,
      backfill_window: { partition_key: 'block_timestamp', start: utc(start.value), end: utc(end.value) },
      destinations: [{ type: 'kafka', name: destination.value }],
    };
    const chosenValues = values.value.split(/[\r\n,]+/).map((v) => v.trim()).filter(Boolean);
    if (column.value) body.filter = { column: column.value, values: chosenValues };
    return body;
  };
  const sync = () => {
    if (!useJson.checked) json.value = JSON.stringify(formBody(), null, 2);
  };
  for (const control of [jobName, table, start, end, column, values, destination]) control.addEventListener('input', sync);
  table.addEventListener('change', sync);
  useJson.addEventListener('change', sync);
  sync();
  const form = h('form.stack', {
    'aria-label': 'New backfill',
    onsubmit: async (event) => {
      event.preventDefault();
      clearFieldErrors();
      status.replaceChildren();
      const body = useJson.checked ? parseJsonField(json, 'backfill-json-error') : formBody();
      if (body === undefined) return;
      try {
        await api('POST', '/beam/backfills', body);
        location.hash = '#/backfills';
      } catch (e) {
        if (!e.violations.length) {
          status.replaceChildren(notice(e.message, 'error'));
          return;
        }
        for (const violation of e.violations) {
          const loc = violation.loc || [];
          const id = (useJson.checked && 'backfill-json')
            || BACKFILL_FIELDS.find(([prefix]) => prefix.every((part, i) => loc[i] === part))?.[1] || 'backfill-json';
          const error = document.getElementById(`${id}-error`);
          const where = id === 'backfill-json' ? `${loc.join('.')}: ` : '';
          error.textContent = (error.textContent ? error.textContent + '\n' : '') + where + violation.msg;
          document.getElementById(id).setAttribute('aria-invalid', 'true');
        }
        status.replaceChildren(notice('The server refused the backfill; see the fields marked.', 'error'));
      }
    },
  },
  field('job-name', 'Job name', jobName),
  field('table', 'Table', table, 'Only base-chain tables can be backfilled.'),
  field('start', 'From (UTC, included)', start),
  field('end', 'To (UTC, excluded)', end),
  field('filter-column', 'Filter column', column),
  field('filter-values', 'Filter values (one per line)', values),
  field('destination', 'Managed sink name', destination, 'Rows go to a managed topic, one message per row.'),
  h('details', {},
    h('summary', {}, 'JSON body (transforms, other destinations)'),
    h('label.check', { for: 'backfill-use-json' }, useJson, 'send this JSON instead of the form'),
    field('backfill-json', 'Backfill request body', json)),
  status,
  h('div', {}, h('button', { type: 'submit' }, 'Start backfill')));
  showIf(gen, h('p', {}, h('a', { href: '#/backfills' }, '← Backfills')), h('h1', {}, 'New backfill'), form);
  jobName.focus();
}

/** Follows a sink's live tail (Server-Sent Events over fetch, so the key stays in a header). */
function startTail(path, list) {
  const controller = new AbortController();
  leaving.push(() => controller.abort());
  (async () => {
    try {
      const response = await fetch('/api/v1' + path, {
        headers: { 'X-API-Key': apiKey() || '', accept: 'text/event-stream' },
        signal: controller.signal,
      });
      if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
      // Following from here on: records delivered from now appear.
      list.dataset.live = 'true';
      for await (const { kind, data } of events.serverSentEvents(response)) {
        if (kind === 'record') {
          let text = data;
          try {
            const record = JSON.parse(data);
            text = `${record.key}  ${JSON.stringify(record.value)}`;
          } catch { /* shown as it came */ }
          list.prepend(h('li', {}, text));
          while (list.children.length > 200) list.lastChild.remove();
        } else if (kind === 'end') {
          list.prepend(h('li', {}, `(the tail ended: ${data})`));
        }
      }
    } catch (e) {
      if (e.name !== 'AbortError') list.prepend(h('li', {}, `(the tail stopped: ${e.message})`));
    }
  })();
}

// ---------------------------------------------------------------------------
// Routing

async function route() {
  generation += 1;
  const gen = generation;
  if (!apiKey()) return signIn();
  try {
    if (!me) me = await api('GET', '/me');
    renderNav();
    const hash = location.hash || '#/';
    const pipeline = /^#\/p\/([^/]+)$/.exec(hash);
    const values = /^#\/p\/([^/]+)\/values\/([^/]+)$/.exec(hash);
    const edit = /^#\/p\/([^/]+)\/edit$/.exec(hash);
    if (hash === '#/new') await pipelineFormView();
    else if (edit) await pipelineFormView(decodeURIComponent(edit[1]));
    else if (hash === '#/backfills') await backfillsView();
    else if (hash === '#/events' || hash.startsWith('#/events?')) await events.eventsView(ui);
    else if (hash === '#/datasets') await datasetsView();
    else if (hash === '#/prices') await pricesView();
    else if (hash === '#/secrets') await secretsView();
    else if (/^#\/datasets\/[^/]+$/.test(hash)) await datasetView(decodeURIComponent(hash.slice('#/datasets/'.length)));
    else if (hash === '#/backfills/new') await newBackfillView();
    else if (values) await valuesView(decodeURIComponent(values[1]), decodeURIComponent(values[2]));
    else if (pipeline) await pipelineView(decodeURIComponent(pipeline[1]));
    else await pipelinesView();
    if (document.activeElement === document.body) main.focus({ preventScroll: true });
  } catch (e) {
    if (e.status === 401) return;
    showIf(gen, h('h1', {}, 'Something went wrong'), notice(e.message, 'error'));
  }
}

window.addEventListener('hashchange', route);
route();
