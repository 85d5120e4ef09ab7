// Service events in the console (docs/events.md): the Events page (filterable, live), a
// pipeline's timeline, and the problem badges of the pipeline list. Every value reaches the
// page as text nodes. `ui` is what app.js shares: h, api, apiKey, notice, dataTable, time,
// showIf, gen(), onLeave(fn).

const SEVERITIES = ['info', 'warning', 'error'];
const LIVE_LIMIT = 500;

/** One event as a table row. */
function row(ui, event) {
  const subject = event.pipeline_id
    ? ui.h('a', { href: `#/p/${encodeURIComponent(event.pipeline_id)}` }, event.pipeline_id.slice(0, 8))
    : event.job_id || event.chain || event.node || '—';
  return ui.h(`tr.sev-${event.severity}`, { 'data-event': String(event.id), 'data-kind': event.kind },
    ui.h('td', {}, ui.time(event.time)),
    ui.h('td', {}, ui.h(`span.sev.sev-${event.severity}`, {}, event.severity)),
    ui.h('td', {}, ui.h('code', {}, event.kind)),
    ui.h('td.hide-narrow', {}, subject),
    ui.h('td', {}, event.message));
}

function query(filters) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(filters)) if (value) params.set(name, value);
  const text = params.toString();
  return text ? `?${text}` : '';
}

/**
 * The messages of a Server-Sent Events response as they arrive, each as `{ kind, data }`:
 * its `event:` name (`message` when it has none) and its `data:` lines joined. Shared by the
 * events stream and a sink's live tail.
 */
export async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const message = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const kind = /^event: ?(.*)$/m.exec(message)?.[1] || 'message';
      const data = message.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      yield { kind, data };
    }
  }
}

/**
 * Follows `/events/stream` with `filters` (Server-Sent Events over fetch, so the key stays
 * in a header) and calls `onEvent` for each event; stops when the view is left.
 */
function follow(ui, filters, onEvent, onState) {
  const controller = new AbortController();
  ui.onLeave(() => controller.abort());
  (async () => {
    try {
      const response = await fetch('/api/v1/events/stream' + query(filters), {
        headers: { 'X-API-Key': ui.apiKey() || '', accept: 'text/event-stream' },
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(`${response.status}`);
      onState('live');
      for await (const { data } of serverSentEvents(response)) {
        if (data) onEvent(JSON.parse(data));
      }
      onState('ended');
    } catch (e) {
      if (e.name !== 'AbortError') onState(`stopped: ${e.message}`);
    }
  })();
}

/** The Events page: a filter form, the latest events, and new ones as they happen. */
export async function eventsView(ui) {
  const gen = ui.gen();
  const params = new URLSearchParams(location.hash.split('?')[1] || '');
  const filters = {
    kind: params.get('kind') || '',
    severity: params.get('severity') || '',
    pipeline_id: params.get('pipeline_id') || '',
  };
  ui.showIf(gen, ui.h('h1', {}, 'Events'), ui.h('p.muted', {}, 'Loading…'));
  const page = await ui.api('GET', '/events' + query({ ...filters, limit: 100 }));
  const body = ui.h('tbody', {}, page.items.map((event) => row(ui, event)));
  const state = ui.h('p.muted#events-live', { 'aria-live': 'polite' }, 'connecting…');
  const kind = ui.h('input#filter-kind', { name: 'kind', value: filters.kind, placeholder: 'e.g. pipeline.* or sink.failing' });
  const severity = ui.h('select#filter-severity', { name: 'severity' },
    ui.h('option', { value: '' }, 'any'),
    SEVERITIES.map((s) => ui.h('option', { value: s, selected: s === filters.severity }, `${s} and above`)));
  const pipeline = ui.h('input#filter-pipeline', { name: 'pipeline_id', value: filters.pipeline_id });
  const form = ui.h('form.filters', {
    'aria-label': 'Filter events',
    onsubmit: (event) => {
      event.preventDefault();
      const next = query({ kind: kind.value.trim(), severity: severity.value, pipeline_id: pipeline.value.trim() });
      location.hash = '#/events' + next;
    },
  },
  ui.h('label', { for: 'filter-kind' }, 'Kind', kind),
  ui.h('label', { for: 'filter-severity' }, 'Severity', severity),
  ui.h('label', { for: 'filter-pipeline' }, 'Pipeline id', pipeline),
  ui.h('button', { type: 'submit' }, 'Filter'));
  const more = page.cursor
    ? ui.h('button.secondary#events-more', {
      type: 'button',
      onclick: async (e) => {
        const next = await ui.api('GET', '/events' + query({ ...filters, limit: 100, cursor: e.target.dataset.cursor }));
        body.append(...next.items.map((event) => row(ui, event)));
        if (next.cursor) e.target.dataset.cursor = next.cursor;
        else e.target.remove();
      },
      'data-cursor': String(page.cursor),
    }, 'Older events')
    : null;
  ui.showIf(gen,
    ui.h('h1', {}, 'Events'),
    ui.h('p.muted', {}, 'What happened to your pipelines, backfills and chains, newest first; new events appear as they happen.'),
    form,
    state,
    ui.h('div.table-wrap', {}, ui.h('table#events', { 'aria-label': 'Events' },
      ui.h('thead', {}, ui.h('tr', {}, ['Time', 'Severity', 'Kind', 'Subject', 'Message'].map((t) => ui.h(t === 'Subject' ? 'th.hide-narrow' : 'th', {}, t)))),
      body)),
    more);
  if (gen !== ui.gen()) return;
  follow(ui, filters, (event) => {
    if (body.querySelector(`tr[data-event="${event.id}"]`)) return;
    body.prepend(row(ui, event));
    while (body.children.length > LIVE_LIMIT) body.lastChild.remove();
  }, (text) => {
    state.textContent = text === 'live' ? 'Live: new events appear at the top.' : `Live updates ${text}.`;
    state.dataset.state = text;
  });
}

/** A pipeline page's timeline: its events, newest first, live. */
export function timelineSection(ui, id) {
  const list = ui.h('ol.timeline#timeline', { 'aria-label': 'Pipeline events' });
  const item = (event) => ui.h(`li.sev-${event.severity}`, { 'data-event': String(event.id), 'data-kind': event.kind },
    ui.h('time', { datetime: event.time }, ui.time(event.time)), ' ',
    ui.h(`span.sev.sev-${event.severity}`, {}, event.severity), ' ',
    ui.h('code', {}, event.kind), ' ', event.message);
  (async () => {
    try {
      const page = await ui.api('GET', '/events' + query({ pipeline_id: id, limit: 50 }));
      list.append(...page.items.map(item));
      if (!page.items.length) list.append(ui.h('li.muted.empty', {}, 'No events yet.'));
      follow(ui, { pipeline_id: id }, (event) => {
        if (list.querySelector(`li[data-event="${event.id}"]`)) return;
        list.querySelector('li.empty')?.remove();
        list.prepend(item(event));
      }, (text) => { list.dataset.live = text; });
    } catch (e) {
      list.append(ui.h('li', {}, e.status === 503 ? 'This server records no events.' : e.message));
    }
  })();
  return list;
}

/** Adds a badge to the pipeline list's rows whose pipeline has an unresolved problem. */
export async function markProblems(ui, rows) {
  try {
    const status = await ui.api('GET', '/events/pipelines');
    for (const problem of status.items) {
      const tr = rows.find((r) => r.dataset.pipeline === problem.pipeline_id);
      if (!tr) continue;
      tr.firstChild.append(' ', ui.h(`span.problem.sev-${problem.severity}`, {
        title: `${problem.kind}: ${problem.message}`,
        'data-kind': problem.kind,
      }, problem.severity === 'error' ? 'error' : 'warning'));
    }
  } catch {
    // No events on this server: no badges.
  }
}
