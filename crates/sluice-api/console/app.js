// The Sluice console: plain ES module, no build step, talking only to the public API
// (/api/v1/...). The API key lives in sessionStorage and goes in the X-API-Key header, never
// in a URL. Every value from the API reaches the page as text nodes, never parsed as HTML.

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
  return data;
}

// ---------------------------------------------------------------------------
// DOM

/** h('tag.class#id', {attr: value, onclick: fn}, ...children) */
function h(spec, attrs = {}, ...children) {
  const [tagAndClasses, id] = spec.split('#');
  const [tag, ...classes] = tagAndClasses.split('.');
  const el = document.createElement(tag || 'div');
  if (id) el.id = id;
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

function show(...nodes) {
  for (const cleanup of leaving) cleanup();
  leaving = [];
  main.replaceChildren(...nodes.filter((node) => node !== null && node !== undefined && node !== false));
}

function notice(text, kind = '') {
  return h(`div.notice${kind ? '.' + kind : ''}`, { role: kind === 'error' ? 'alert' : 'status' }, text);
}

function time(text) {
  return text ? new Date(text).toLocaleString() : '—';
}

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
    h('span.who', {}, me.is_operator ? 'operator' : 'member', ' · ', me.organization_id.slice(0, 8)),
    h('button.secondary', { type: 'button', onclick: () => signOut('Signed out.') }, 'Sign out'),
  );
}

// ---------------------------------------------------------------------------
// Views

async function pipelinesView() {
  show(h('h1', {}, 'Pipelines'), h('p.muted', {}, 'Loading…'));
  const pipelines = await api('GET', '/beam');
  const rows = pipelines.map((p) => {
    const source = p.pipeline_config.source;
    const sinks = p.pipeline_config.sinks.map((s) => `${s.type}:${s.name}`).join(', ');
    return h('tr', {},
      h('td', {}, h('a', { href: `#/p/${encodeURIComponent(p.id)}` }, p.name)),
      h('td', {}, `${source.chain}.${source.entity}${source.is_zerolag ? '.zerolag' : ''}`),
      h('td.hide-narrow', {}, sinks),
      h('td.hide-narrow', {}, time(p.created_at)));
  });
  show(
    h('h1', {}, 'Pipelines'),
    h('div.actions', {}, h('a', { href: '#/new' }, 'New pipeline')),
    pipelines.length === 0
      ? h('p.muted', {}, 'No pipelines yet.')
      : h('div.table-wrap', {}, h('table', { 'aria-label': 'Pipelines' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Source'), h('th.hide-narrow', {}, 'Sinks'), h('th.hide-narrow', {}, 'Created'))),
        h('tbody', {}, rows))),
  );
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

async function newPipelineView() {
  show(h('h1', {}, 'New pipeline'), h('p.muted', {}, 'Loading sources…'));
  const { sources } = await api('GET', '/beam/sources');
  const field = (id, label, control, hint) => h('div', {},
    h('label', { for: id }, label, control),
    hint ? h('p.muted', {}, hint) : null,
    h('p.field-error', { id: `${id}-error`, role: 'alert' }));
  const name = h('input#name', { name: 'name', 'aria-describedby': 'name-error' });
  const description = h('input#description', { name: 'description', 'aria-describedby': 'description-error' });
  const source = h('select#source', { name: 'source', 'aria-describedby': 'source-error' },
    sources.map((s) => h('option', { value: `${s.chain}/${s.entity}` }, `${s.chain}.${s.entity}`)));
  const zerolag = h('input#zerolag', { type: 'checkbox', name: 'zerolag' });
  const sinkName = h('input#sink-name', { name: 'sink-name', value: 'out', 'aria-describedby': 'sink-name-error' });
  const json = h('textarea#json', { name: 'json', spellcheck: 'false', 'aria-describedby': 'json-error' });
  const useJson = h('input#use-json', { type: 'checkbox' });
  const status = h('div#form-status');

  const body = () => {
    const [chain, entity] = source.value.split('/');
    return {
      name: name.value,
      description: description.value,
      pipeline_config: {
        source: { chain, entity, is_zerolag: zerolag.checked },
        transforms: [],
        sinks: [{ type: 'kafka', name: sinkName.value }],
      },
    };
  };
  const sync = () => {
    if (!useJson.checked) json.value = JSON.stringify(body(), null, 2);
  };
  for (const control of [name, description, source, zerolag, sinkName]) control.addEventListener('input', sync);
  useJson.addEventListener('change', sync);
  const preferred = sources.find((s) => s.chain === 'base' && s.entity === 'erc20_token_transfer');
  if (preferred) source.value = `${preferred.chain}/${preferred.entity}`;
  sync();

  const clearErrors = () => {
    for (const el of main.querySelectorAll('.field-error')) el.textContent = '';
    for (const el of main.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
    status.replaceChildren();
  };
  const form = h('form.stack', {
    'aria-label': 'New pipeline',
    onsubmit: async (event) => {
      event.preventDefault();
      clearErrors();
      let request;
      try {
        request = useJson.checked ? JSON.parse(json.value) : body();
      } catch (e) {
        document.getElementById('json-error').textContent = `Not JSON: ${e.message}`;
        json.setAttribute('aria-invalid', 'true');
        return;
      }
      try {
        const created = await api('POST', '/beam', request);
        location.hash = `#/p/${encodeURIComponent(created.id)}`;
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
  h('div', {}, h('button', { type: 'submit' }, 'Create pipeline')));
  show(h('h1', {}, 'New pipeline'), form);
  name.focus();
}

/** Whether the signed-in key may edit the pipeline (SPEC: owners and editors). */
function canEdit(permissions) {
  if (me.is_operator) return true;
  return permissions.owner === me.user_id || (permissions.editors || []).includes(me.user_id);
}

async function pipelineView(id) {
  show(h('h1', {}, 'Pipeline'), h('p.muted', {}, 'Loading…'));
  const path = `/beam/${encodeURIComponent(id)}`;
  const [pipeline, stats, permissions] = await Promise.all([
    api('GET', path),
    api('GET', `${path}/deploy/stats`),
    api('GET', `${path}/permissions`).catch(() => ({ owner: null, editors: [] })),
  ]);
  const editable = canEdit(permissions);
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
  const tail = h('ol.tail#tail', { 'aria-label': 'Records arriving in the sink' });
  show(
    h('h1', {}, pipeline.name),
    h('p', {}, h('span.badge' + (running ? '.running' : ''), {}, running ? `running · ${health.healthy_workers}/${health.total_workers} workers healthy` : 'not running'),
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
    h('h2', {}, 'Workers'),
    workers.length
      ? h('div.table-wrap', {}, h('table', { 'aria-label': 'Workers' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Worker'), h('th', {}, 'Status'), h('th', {}, 'Ready'), h('th.hide-narrow', {}, 'Restarts'), h('th', {}, 'Last error'))),
        h('tbody', {}, workers)))
      : h('p.muted', {}, 'No workers: deploy the pipeline to start them.'),
    h('h2', {}, 'Live records'),
    managed.length && running
      ? tail
      : h('p.muted', {}, managed.length ? 'Deploy the pipeline to watch its records arrive.' : 'This pipeline has no managed sink to watch.'),
    h('h2', {}, 'Configuration'),
    h('pre', {}, JSON.stringify(pipeline.pipeline_config, null, 2)),
  );
  if (managed.length && running) startTail(`${path}/sinks/${encodeURIComponent(managed[0].uid)}/records/stream`, tail);
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
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const kind = /^event: ?(.*)$/m.exec(event)?.[1] || 'message';
          const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
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
      }
    } catch (e) {
      if (e.name !== 'AbortError') list.prepend(h('li', {}, `(the tail stopped: ${e.message})`));
    }
  })();
}

// ---------------------------------------------------------------------------
// Routing

async function route() {
  if (!apiKey()) return signIn();
  try {
    if (!me) me = await api('GET', '/me');
    renderNav();
    const hash = location.hash || '#/';
    const pipeline = /^#\/p\/(.+)$/.exec(hash);
    if (hash === '#/new') await newPipelineView();
    else if (pipeline) await pipelineView(decodeURIComponent(pipeline[1]));
    else await pipelinesView();
    if (document.activeElement === document.body) main.focus({ preventScroll: true });
  } catch (e) {
    if (e.status === 401) return;
    show(h('h1', {}, 'Something went wrong'), notice(e.message, 'error'));
  }
}

window.addEventListener('hashchange', route);
route();
