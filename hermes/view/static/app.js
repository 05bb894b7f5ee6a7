// hermes-batch view: the run's summary, its entries under filters, one entry's conversation.
// Everything shown is model-written: text goes in with textContent (via el()), never as HTML.
"use strict";

const FILTERS = ["status", "reward", "toolset", "tool", "reason", "q"];

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "style") Object.assign(e.style, v); // CSSOM, which the page's CSP allows (no inline style)
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : String(kid));
  }
  return e;
}

async function api(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.json().catch(() => ({}))).detail || ""}`);
  return r.json();
}

function go(url) {
  history.pushState(null, "", url);
  route();
}

function link(href, text, attrs) {
  return el("a", { href, ...attrs, onclick: (ev) => { if (!ev.ctrlKey && !ev.metaKey) { ev.preventDefault(); go(href); } } }, text);
}

function tag(text, cls) { return el("span", { class: `tag ${cls || ""}` }, text); }

function pretty(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

// ------------------------------------------------------------------ charts (CSS bars)

function bars(title, rows, testid) {
  const max = Math.max(1, ...rows.map((r) => r.value));
  return el("div", { class: "chart", "data-testid": testid },
    el("h2", {}, title),
    rows.length ? rows.map((r) => el("div", { class: "bar", title: r.title || "" },
      r.href ? link(r.href, r.name, { class: "name" }) : el("span", { class: "name" }, r.name),
      el("div", { class: "track" },
        el("div", { class: "fill", style: { width: `${((r.value - (r.bad || 0)) / max) * 100}%` } }),
        r.bad ? el("div", { class: "fill bad", style: { width: `${(r.bad / max) * 100}%` } }) : null),
      el("span", { class: "v" }, r.bad ? `${r.value} (${r.bad}✗)` : String(r.value))))
      : el("p", { class: "muted" }, "none"));
}

function summaryView(s) {
  document.getElementById("run").textContent = `${s.run_name} · ${s.model || ""} · ${s.distribution || ""}`;
  const card = (n, l, id) => el("div", { class: "card", "data-testid": id }, el("div", { class: "n" }, n), el("div", { class: "l" }, l));
  const cards = [
    card(`${s.done} / ${s.total_prompts}`, "prompts done", "done"),
    card(s.failed, "failed", "failed"),
    card(s.discarded, "discarded (no reasoning)", "discarded"),
    card(s.lines, "journal lines (attempts)", "lines"),
  ];
  if (s.checks.checked) cards.push(card(`${s.checks.pass_rate}%`, `checks passed (${s.checks.passed} of ${s.checks.checked})`, "pass-rate"));
  const charts = [bars("Tool calls", s.tools.map((t) => ({ name: t.tool, value: t.count, bad: t.failure, href: `/?tool=${encodeURIComponent(t.tool)}` })), "tools-chart")];
  if (s.failure_reasons.length) {
    charts.push(bars("Failure reasons", s.failure_reasons.map((r) => ({ name: r.reason, value: r.count, bad: r.count, title: r.example,
      href: `/?reason=${encodeURIComponent(r.reason)}` })), "reasons-chart"));
  }
  charts.push(bars("Journal lines by status", s.statuses.map((r) => ({ name: r.status, value: r.count, href: `/?status=${encodeURIComponent(r.status)}` })), "status-chart"));
  return el("section", {}, el("div", { class: "cards" }, cards), el("div", { class: "charts" }, charts));
}

// ------------------------------------------------------------------ the list

function select(name, label, options, current) {
  return el("label", {}, label, el("select", { name },
    el("option", { value: "" }, "any"),
    options.map(([value, text]) => el("option", { value, selected: value === current }, text))));
}

function filtersForm(s, params) {
  const form = el("form", { class: "filters", "data-testid": "filters" },
    select("status", "status", s.statuses.map((r) => [r.status, r.status]), params.get("status")),
    select("reward", "check", [["passed", "passed"], ["failed", "failed"], ["unchecked", "no check"]], params.get("reward")),
    select("toolset", "toolset", s.toolsets.map((t) => [t, t]), params.get("toolset")),
    select("tool", "tool used", s.tools.map((t) => [t.tool, t.tool]), params.get("tool")),
    select("reason", "failure reason", s.failure_reasons.map((r) => [r.reason, r.reason]), params.get("reason")),
    el("label", {}, "text", el("input", { name: "q", type: "search", value: params.get("q") || "", placeholder: "prompt or error" })),
    el("button", { type: "submit" }, "Filter"),
    link("/", "clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const name of FILTERS) { const v = form.elements[name].value; if (v) next.set(name, v); }
    go(`/?${next}`);
  });
  return form;
}

function listView(data, params) {
  const pages = Math.max(1, Math.ceil(data.total / data.size));
  const pageUrl = (p) => { const q = new URLSearchParams(params); q.set("page", p); return `/?${q}`; };
  const rows = data.entries.map((e) => el("tr", { "data-testid": "entry-row" },
    el("td", {}, link(`/entry/${e.prompt_index}?pos=${e.pos}`, String(e.prompt_index))),
    el("td", {}, tag(e.status, `s-${e.status}`), e.attempt > 1 ? el("span", { class: "muted" }, ` try ${e.attempt}`) : null),
    el("td", {}, e.passed === null ? el("span", { class: "muted" }, "–") : tag(e.passed ? "passed" : "failed", e.passed ? "r-passed" : "r-failed")),
    el("td", {}, e.toolsets.map((t) => tag(t))),
    el("td", {}, e.tools.join(", ")),
    el("td", {}, e.api_calls ?? ""),
    el("td", {}, e.elapsed === null ? "" : `${e.elapsed.toFixed(1)} s`),
    el("td", { class: "prompt" }, e.prompt, e.reason ? el("div", { class: "error" }, e.reason) : null),
    el("td", {}, e.trial > 1 ? el("span", { class: "muted" }, `attempt ${e.trial} · `) : null,
      e.task ? link(withRun(`/compare?task=${encodeURIComponent(e.task)}`, params), "attempts", { "data-testid": "compare-link", title: "this task's attempts side by side" }) : null)));
  return el("section", {},
    el("div", { class: "pager", "data-testid": "pager" },
      data.page > 1 ? link(pageUrl(data.page - 1), "‹ previous") : null,
      el("span", { "data-testid": "total" }, `page ${data.page} of ${pages} · ${data.total} entries`),
      data.page < pages ? link(pageUrl(data.page + 1), "next ›") : null),
    el("table", {}, el("thead", {}, el("tr", {}, ["prompt", "status", "check", "toolsets", "tools used", "model calls", "time", "prompt text", "task"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
}

async function showList() {
  const params = new URLSearchParams(location.search);
  const [s, data] = await Promise.all([api(withRun("/api/summary", params)), api(`/api/entries?${params}`)]);
  document.title = `${s.run_name} · hermes-batch view`;
  const others = s.runs.length > 1 ? el("p", { "data-testid": "runs-link" }, "runs served: ", s.runs.map((r) => [link(`/?run=${encodeURIComponent(r)}`, r), " "]),
    link(`/compare?runs=${s.runs.slice(0, 2).map(encodeURIComponent).join(",")}`, "compare the two runs' tasks")) : null;
  main(summaryView(s), others, el("p", {}, link(withRun("/tasks", params), "Tasks: each task's attempts, pass rate, flaky or never solved ›", { "data-testid": "tasks-link" })),
    filtersForm(s, params), listView(data, params));
}

// ------------------------------------------------------------------ one entry

function image(path) {
  // with two runs served, the entry's own run folder holds its images (the page's ?run=)
  const src = withRun(`/files/${path}`, new URLSearchParams(location.search));
  return el("a", { href: src, target: "_blank" }, el("img", { class: "shot", src, alt: path, "data-testid": "image" }));
}

function turnView(t) {
  const who = { system: "system", human: "user", gpt: "assistant", tool: "tool" }[t.from] || t.from;
  const box = el("div", { class: `turn ${t.from}`, "data-testid": `turn-${t.from}` }, el("div", { class: "who" }, who));
  if (t.from === "system") {
    box.append(el("details", {}, el("summary", {}, "the system turn (tool list)"), el("pre", {}, t.content)));
  } else if (t.from === "gpt") {
    if (t.reasoning) box.append(el("details", { "data-testid": "reasoning" }, el("summary", {}, "reasoning"), el("pre", {}, t.reasoning)));
    if (t.content) box.append(el("pre", {}, t.content));
    for (const c of t.tool_calls) {
      box.append(el("div", { class: "call", "data-testid": "tool-call" }, el("span", { class: "fn" }, `→ ${c.name}`), el("pre", {}, pretty(c.arguments))));
    }
  } else if (t.from === "tool" && t.results) {
    for (const r of t.results) {
      box.append(el("div", { class: "result", "data-testid": "tool-result" },
        el("span", { class: "fn" }, `← ${r.name}`), el("span", { class: "muted" }, ` ${r.tool_call_id || ""}`),
        el("pre", {}, pretty(r.content)), r.images.map(image)));
    }
  } else {
    box.append(el("pre", {}, t.content));
  }
  return box;
}

async function showEntry(promptIndex) {
  const pos = new URLSearchParams(location.search).get("pos");
  const params = new URLSearchParams(location.search);
  const e = await api(withRun(`/api/entry/${promptIndex}${pos ? `?pos=${pos}` : ""}`, params));
  document.title = `entry ${promptIndex} · hermes-batch view`;
  const h = e.hermes || {};
  const attempts = e.attempts.length > 1 ? el("p", {}, "attempts: ", e.attempts.map((a) =>
    a.pos === e.pos ? tag(`${a.attempt}: ${a.status}`, `s-${a.status}`) : link(withRun(`/entry/${promptIndex}?pos=${a.pos}`, params), `${a.attempt}: ${a.status} `))) : null;
  const shownImages = new Set(e.turns.flatMap((t) => (t.results || []).flatMap((r) => r.images)));
  const extra = e.images.filter((p) => !shownImages.has(p));
  main(
    el("p", {}, link(withRun("/", params), "‹ all entries"), e.task ? [" · ", link(withRun(`/compare?task=${encodeURIComponent(e.task)}`, params), "this task's attempts side by side", { "data-testid": "compare-link" })] : null),
    el("h2", { "data-testid": "entry-title" }, `Entry ${promptIndex} `, tag(h.status || "?", `s-${h.status}`)),
    attempts,
    h.error ? el("pre", { class: "error", "data-testid": "entry-error" }, h.error) : null,
    el("div", { class: "meta" },
      e.reward ? el("div", { class: "chart", "data-testid": "reward" }, el("h2", {}, "Check (reward) ", tag(e.reward.passed ? "passed" : "failed", e.reward.passed ? "r-passed" : "r-failed")), el("pre", {}, pretty(e.reward))) : null,
      el("div", { class: "chart", "data-testid": "metadata" }, el("h2", {}, "Metadata"), el("pre", {}, pretty({ ...e.fields, metadata: e.metadata }))),
      el("div", { class: "chart" }, el("details", {}, el("summary", {}, "the run's record (hermes block)"), el("pre", {}, pretty(h))))),
    extra.length ? el("div", {}, el("h2", {}, "Files"), extra.map(image)) : null,
    el("h2", {}, "Conversation"),
    el("div", { "data-testid": "conversation" }, e.turns.map(turnView)));
}

// ------------------------------------------------------------------ routing

function main(...kids) {
  const m = document.getElementById("main");
  m.replaceChildren(...kids.filter((k) => k));
}

async function route() {
  const m = location.pathname.match(/^\/entry\/(-?\d+)$/);
  const wanted = location.href;
  delete document.body.dataset.shown;
  keys = null; // compare.js: each page sets its own keys
  try {
    if (m) await showEntry(m[1]);
    else if (location.pathname === "/tasks") await showTasks();
    else if (location.pathname === "/compare") await showCompare();
    else await showList();
  } catch (err) {
    main(el("p", { class: "error", "data-testid": "load-error" }, String(err.message || err)));
  }
  if (location.href === wanted) document.body.dataset.shown = wanted; // what is on screen (tests wait for it)
}

window.addEventListener("popstate", route);
route();
