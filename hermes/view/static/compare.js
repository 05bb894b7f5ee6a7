// hermes-batch view: the tasks page (/tasks), attempts side by side (/compare?task= | entries= | runs=).
// Loaded before app.js; uses its helpers (el, api, go, link, tag, pretty, main) when called.
// The alignment comes from the server (hermes/view/align.py); this page only lays it out.
"use strict";

const KINDS = [["unsolved", "never solved"], ["solved", "always solved"], ["flaky", "flaky"],
  ["stopped", "stopped by the attempt policy"], ["unchecked", "no check"], ["failed", "with failed attempts"]];
const SORTS = [["first", "run order"], ["task", "task"], ["pass_rate", "pass rate"], ["attempts", "attempts"],
  ["passes", "passes"], ["turns", "mean turns"], ["time", "mean time"]];
const FOLD = 600; // characters of a tool output shown before it folds

function runParam(params) { const r = params.get("run"); return r ? `run=${encodeURIComponent(r)}` : ""; }
function withRun(url, params) { const r = runParam(params); return r ? `${url}${url.includes("?") ? "&" : "?"}${r}` : url; }

function verdict(passed, status) {
  if (status === "stopped") return tag("stopped", "s-stopped");
  if (passed === null || passed === undefined) return status === "failed" ? tag("failed", "s-failed") : el("span", { class: "muted" }, "no check");
  return tag(passed ? "passed" : "failed", passed ? "r-passed" : "r-failed");
}

function marks(list, params) {
  return el("span", { class: "marks", "data-testid": "marks" }, (list || []).map((m) => {
    const cls = m.status === "stopped" ? "stopped" : m.passed === true ? "pass" : m.passed === false ? "fail" : m.status === "failed" ? "error" : "none";
    const what = m.status === "stopped" ? "stopped" : m.passed === true ? "passed" : m.passed === false ? "failed" : m.status;
    return link(withRun(`/entry/${m.prompt_index}?pos=${m.pos}`, params), "", { class: `mark ${cls}`, title: `attempt ${m.trial}: ${what}${m.reward !== null && m.reward !== undefined ? ` (reward ${m.reward})` : ""}`, "data-mark": cls });
  }));
}

function num(v, digits, unit) { return v === null || v === undefined ? "–" : `${Number(v).toFixed(digits)}${unit || ""}`; }

// ------------------------------------------------------------------ keyboard

let keys = null; // the current page's key handler
document.addEventListener("keydown", (ev) => {
  if (!keys || ev.ctrlKey || ev.metaKey || ev.altKey || /^(INPUT|SELECT|TEXTAREA)$/.test(ev.target.tagName)) return;
  if (keys(ev.key)) ev.preventDefault();
});

// ------------------------------------------------------------------ the tasks page

async function showTasks() {
  const params = new URLSearchParams(location.search);
  if (params.get("runs")) return showRuns(params); // /tasks?runs=A,B: both runs' tasks
  const data = await api(`/api/tasks?${params}`);
  document.title = `tasks · hermes-batch view`;
  const form = el("form", { class: "filters", "data-testid": "task-filters" },
    select("kind", "tasks", KINDS, params.get("kind")),
    el("label", {}, "text", el("input", { name: "q", type: "search", value: params.get("q") || "", placeholder: "task or prompt" })),
    el("label", {}, "sort", el("select", { name: "sort" }, SORTS.map(([v, t]) => el("option", { value: v, selected: v === (params.get("sort") || "first") }, t)))),
    el("label", {}, "descending", el("input", { name: "desc", type: "checkbox", checked: params.get("desc") === "true" })),
    el("button", { type: "submit" }, "Filter"), link(withRun("/tasks", params), "clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    if (params.get("run")) next.set("run", params.get("run"));
    for (const n of ["kind", "q", "sort"]) { const v = form.elements[n].value; if (v && !(n === "sort" && v === "first")) next.set(n, v); }
    if (form.elements.desc.checked) next.set("desc", "true");
    go(`/tasks?${next}`);
  });
  const pages = Math.max(1, Math.ceil(data.total / data.size));
  const pageUrl = (p) => { const q = new URLSearchParams(params); q.set("page", p); return `/tasks?${q}`; };
  const compareUrl = (t) => { const q = new URLSearchParams({ task: t }); if (params.get("run")) q.set("run", params.get("run")); if (params.get("kind")) q.set("kind", params.get("kind")); return `/compare?${q}`; };
  const rows = data.tasks.map((t) => el("tr", { "data-testid": "task-row", "data-task": t.task },
    el("td", { class: "task" }, link(compareUrl(t.task), t.task, { "data-testid": "task-link" })),
    el("td", {}, String(t.attempts)), el("td", {}, t.checked ? `${t.passes} / ${t.checked}` : "–"),
    el("td", { "data-testid": "pass-rate" }, t.pass_rate === null ? "–" : `${t.pass_rate}%`),
    el("td", {}, marks(t.marks, params)),
    el("td", {}, num(t.turns, 1)), el("td", {}, num(t.seconds, 1, " s")),
    el("td", { class: "error" }, (t.reasons || []).join(", "), t.stopped ? el("span", { class: "muted" }, ` ${t.stopped} stopped`) : null),
    el("td", { class: "prompt" }, t.prompt)));
  let at = -1;
  const select_ = (i) => {
    const trs = document.querySelectorAll("[data-testid=task-row]");
    if (!trs.length) return;
    at = Math.max(0, Math.min(trs.length - 1, i));
    trs.forEach((tr, j) => tr.classList.toggle("selected", j === at));
    trs[at].scrollIntoView({ block: "nearest" });
  };
  keys = (k) => {
    if (k === "j" || k === "ArrowDown") { select_(at + 1); return true; }
    if (k === "k" || k === "ArrowUp") { select_(at - 1); return true; }
    if ((k === "Enter" || k === "o") && at >= 0) { go(compareUrl(data.tasks[at].task)); return true; }
    return false;
  };
  main(
    el("p", {}, link(withRun("/", params), "‹ entries"), " · ", el("span", { class: "muted" }, "keys: j/k move, Enter opens the attempts side by side")),
    el("div", { class: "cards" },
      el("div", { class: "card", "data-testid": "tasks-total" }, el("div", { class: "n" }, String(data.tasks_total)), el("div", { class: "l" }, "tasks")),
      el("div", { class: "card" }, el("div", { class: "n" }, String(data.lines)), el("div", { class: "l" }, "journal lines")),
      el("div", { class: "card" }, el("div", { class: "n" }, `${data.attempts_k} · ${data.attempt_policy}`), el("div", { class: "l" }, "attempts per task · policy"))),
    form,
    el("div", { class: "pager", "data-testid": "pager" },
      data.page > 1 ? link(pageUrl(data.page - 1), "‹ previous") : null,
      el("span", { "data-testid": "total" }, `page ${data.page} of ${pages} · ${data.total} tasks`),
      data.page < pages ? link(pageUrl(data.page + 1), "next ›") : null),
    el("table", {}, el("thead", {}, el("tr", {}, ["task", "attempts", "passes", "pass rate", "attempts' verdicts", "mean turns", "mean time", "failure reasons", "prompt"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
}

// ------------------------------------------------------------------ two runs: their tasks

const CHANGES = [["solved", "solved in B"], ["lost", "lost in B"], ["changed", "pass rate changed"], ["same", "unchanged"], ["only_a", "only in A"], ["only_b", "only in B"]];

async function showRuns(params) {
  const data = await api(`/api/runs?${params}`);
  const [a, b] = data.runs;
  document.title = `${a} vs ${b} · hermes-batch view`;
  const card = (n, l, id) => el("div", { class: "card", "data-testid": id }, el("div", { class: "n" }, n), el("div", { class: "l" }, l));
  const form = el("form", { class: "filters", "data-testid": "runs-filters" },
    select("change", "what changed", CHANGES, params.get("change")),
    el("label", {}, "text", el("input", { name: "q", type: "search", value: params.get("q") || "" })),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams({ runs: params.get("runs") });
    for (const n of ["change", "q"]) { const v = form.elements[n].value; if (v) next.set(n, v); }
    go(`/compare?${next}`);
  });
  const rows = data.tasks.map((t) => el("tr", { "data-testid": "runs-row", "data-task": t.task },
    el("td", { class: "task" }, link(`/compare?${new URLSearchParams({ runs: params.get("runs"), task: t.task })}`, t.task, { "data-testid": "task-link" })),
    el("td", { "data-testid": "a-rate" }, t.a_rate === null ? "–" : `${t.a_rate}%`, " ", marks(t.a_marks, new URLSearchParams({ run: a }))),
    el("td", { "data-testid": "b-rate" }, t.b_rate === null ? "–" : `${t.b_rate}%`, " ", marks(t.b_marks, new URLSearchParams({ run: b }))),
    el("td", { "data-testid": "change" }, tag(CHANGES.find(([c]) => c === t.change)?.[1] || t.change, `c-${t.change}`)),
    el("td", { class: "prompt" }, t.prompt)));
  main(
    el("h2", { "data-testid": "runs-title" }, `Run A: ${a} · Run B: ${b}`),
    el("div", { class: "cards" },
      card(data.a_pass_rate === null ? "–" : `${data.a_pass_rate}%`, `pass rate in A (${a})`, "a-pass-rate"),
      card(data.b_pass_rate === null ? "–" : `${data.b_pass_rate}%`, `pass rate in B (${b})`, "b-pass-rate"),
      card(String(data.solved_in_b), "solved in B", "solved-in-b"), card(String(data.lost_in_b), "lost in B", "lost-in-b"),
      card(String(data.tasks_total), "tasks in either", "runs-tasks")),
    form,
    el("p", { "data-testid": "total" }, `${data.total} tasks`),
    el("table", {}, el("thead", {}, el("tr", {}, ["task", `A: ${a}`, `B: ${b}`, "change", "prompt"].map((h) => el("th", {}, h)))), el("tbody", {}, rows)));
}

// ------------------------------------------------------------------ attempts side by side

// a terminal-like result ({"output", "exit_code", "error"}, often JSON in a string) as the text it printed
function resultText(r) {
  let c = r.content;
  if (typeof c === "string" && c.startsWith("{")) { try { c = JSON.parse(c); } catch (_) { /* plain text */ } }
  if (c && typeof c === "object" && typeof c.output === "string") {
    return c.output + (c.exit_code ? `\n[exit ${c.exit_code}]` : "") + (c.error ? `\n[error] ${c.error}` : "");
  }
  return typeof c === "string" ? c : JSON.stringify(c, null, 2);
}

function folded(text, testid) {
  if (!text) return el("pre", { class: "muted", "data-testid": testid }, "(no output)");
  if (text.length <= FOLD && text.split("\n").length <= 12) return el("pre", { "data-testid": testid }, text);
  return el("details", { class: "fold", "data-testid": testid },
    el("summary", {}, `${text.slice(0, 120).replace(/\s+/g, " ")}… (${text.length} characters)`), el("pre", {}, text));
}

// a line diff (longest common subsequence), for two tool results on demand
function lineDiff(a, b) {
  const x = a.split("\n").slice(0, 2000), y = b.split("\n").slice(0, 2000);
  const n = x.length, m = y.length, L = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] === y[j]) { out.push(["same", x[i]]); i++; j++; }
    else if (i < n && (j >= m || L[i + 1][j] >= L[i][j + 1])) { out.push(["del", x[i]]); i++; }
    else { out.push(["add", y[j]]); j++; }
  }
  return el("pre", { class: "diff", "data-testid": "result-diff" }, out.map(([op, t]) => el("div", { class: `d-${op}` }, `${op === "add" ? "+" : op === "del" ? "-" : " "} ${t}`)));
}

function stepView(s, refStep) {
  const box = el("div", { class: "step" });
  if (s.reasoning) box.append(el("details", {}, el("summary", {}, "reasoning"), el("pre", {}, s.reasoning)));
  if (s.content) box.append(el("pre", {}, s.content));
  for (const c of s.tool_calls) box.append(el("div", { class: "call", "data-testid": "tool-call" }, el("span", { class: "fn" }, `→ ${c.name}`), el("pre", {}, pretty(c.arguments))));
  s.results.forEach((r, k) => {
    const text = resultText(r);
    const other = refStep && refStep.results[k] ? resultText(refStep.results[k]) : null;
    const res = el("div", { class: "result", "data-testid": "tool-result" }, el("span", { class: "fn" }, `← ${r.name || "tool"}`), folded(text, "result-text"));
    if (other !== null && other !== text) {
      const holder = el("div");
      res.append(el("button", { type: "button", class: "small", "data-testid": "diff-button", onclick: () => holder.replaceChildren(lineDiff(other, text)) }, "diff with the reference"), holder);
    }
    box.append(res);
  });
  return box;
}

async function showCompare() {
  const params = new URLSearchParams(location.search);
  if (params.get("runs") && !params.get("task")) return showRuns(params);
  const data = await api(`/api/compare?${params}`);
  const cols = data.columns, n = cols.length;
  const task = params.get("task");
  document.title = `${task || "entries"} · compare · hermes-batch view`;
  const refUrl = (i) => { const q = new URLSearchParams(params); q.set("ref", i); return `/compare?${q}`; };
  const heads = cols.map((c, i) => el("div", { class: "cell head", "data-testid": "column-head", "data-entry": `${c.prompt_index}:${c.trial}` },
    el("div", {}, c.run ? el("b", {}, `${c.run} · `) : null, link(withRun(`/entry/${c.prompt_index}?pos=${c.pos}`, c.run ? new URLSearchParams({ run: c.run }) : params), `attempt ${c.trial}`), " ",
      verdict(c.passed, c.status), c.reward !== null ? el("span", { class: "muted" }, ` reward ${c.reward}`) : null,
      c.exit_code !== null && c.exit_code !== undefined ? el("span", { class: "muted" }, ` exit ${c.exit_code}`) : null),
    el("div", { class: "muted" }, `${c.status}${c.stop_reason ? ` (${c.stop_reason})` : ""} · ${c.steps.length} turns · ${num(c.elapsed, 1, " s")}`),
    c.error ? el("div", { class: "error" }, c.reason || "", " ", el("span", { class: "muted" }, c.error.slice(0, 200))) : null,
    c.reward_tail ? el("div", {}, el("div", { class: "muted" }, c.reward_cut ? "verifier output (its tail)" : "verifier output"), el("pre", { class: "tail", "data-testid": "reward-tail" }, c.reward_tail)) : null,
    i === 0 ? el("span", { class: "tag ref" }, "reference") : link(refUrl(i), "make this the reference", { class: "small" })));
  const grid = el("div", { class: "grid", "data-testid": "compare-grid", style: { gridTemplateColumns: `70px repeat(${n}, minmax(220px, 1fr))` } },
    el("div", { class: "cell gutter" }), heads);
  data.rows.forEach((row, r) => {
    const sigs = row.map((k, c) => (k === null ? null : cols[c].steps[k].sig));
    const same = row.every((k) => k !== null) && new Set(sigs).size === 1;
    const first = r === data.first_divergence;
    grid.append(el("div", { class: `cell gutter ${same ? "same" : "split"}`, "data-testid": "row-gutter" }, `${r + 1}`,
      first ? el("div", { class: "first-div", "data-testid": "first-divergence", title: "the first turn where the attempts differ" }, "⚑ diverge") : null));
    row.forEach((k, c) => {
      const marked = data.diverges_at[c] === r;
      const cls = `cell ${same ? "same" : "split"}${marked ? " diverges" : ""}${first ? " first" : ""}`;
      if (k === null) { grid.append(el("div", { class: `${cls} gap`, "data-testid": "gap" }, marked ? el("div", { class: "div-mark", "data-testid": "diverges-here" }, "⚑ differs from the reference here") : null, "—")); return; }
      const s = cols[c].steps[k];
      const ref = c > 0 && row[0] !== null ? cols[0].steps[row[0]] : null;
      grid.append(el("div", { class: cls, "data-testid": "step", "data-column": c, "data-row": r, "data-turn": s.turn },
        marked ? el("div", { class: "div-mark", "data-testid": "diverges-here" }, "⚑ differs from the reference here") : null,
        el("div", { class: "muted" }, `turn ${s.turn}`), stepView(s, ref)));
    });
  });
  const nav = async (kind, step) => {
    if (!task) return;
    const q = new URLSearchParams({ task, step });
    if (kind) q.set("kind", kind);
    if (params.get("run")) q.set("run", params.get("run"));
    const found = await api(`/api/tasks/next?${q}`);
    if (found.task) { const u = new URLSearchParams(params); u.set("task", found.task); u.delete("ref"); go(`/compare?${u}`); }
    else document.getElementById("nav-note").textContent = `no other ${kind || ""} task`;
  };
  keys = (k) => {
    if (params.get("runs")) return false;
    const act = { j: [null, 1], k: [null, -1], u: ["unsolved", 1], f: ["flaky", 1] }[k];
    if (act) { nav(act[0], act[1]); return true; }
    if (k === "t") { go(withRun("/tasks", params)); return true; }
    return false;
  };
  const prompts = new Set(cols.map((c) => c.prompt));
  main(
    el("p", {}, params.get("runs") ? link(`/compare?runs=${encodeURIComponent(params.get("runs"))}`, "‹ both runs' tasks") : link(withRun("/tasks", params), "‹ tasks"),
      task && !params.get("runs") ? el("span", { class: "muted" }, " · keys: j/k next/previous task, u next never solved, f next flaky, t tasks") : null,
      el("span", { id: "nav-note", class: "muted" })),
    el("h2", { "data-testid": "compare-title" }, task ? `Task ${task}` : "Entries", ` · ${n} attempts side by side`),
    el("p", { "data-testid": "divergence" }, data.first_divergence === null ? "The attempts did the same thing at every turn."
      : `They first differ at row ${data.first_divergence + 1}.`, el("span", { class: "muted" }, ` Aligned by ${data.algorithm}.`)),
    prompts.size === 1 ? el("details", {}, el("summary", {}, "the prompt"), el("pre", {}, cols[0].prompt))
      : el("details", { open: true }, el("summary", {}, "the prompts differ"), cols.map((c) => el("pre", {}, `${c.run || ""} attempt ${c.trial}: ${c.prompt}`))),
    el("div", { class: "grid-wrap" }, grid));
}
