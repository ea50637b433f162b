// The Evals page: the reports `ringlet eval … --json` wrote into the server's evals folder
// (GET /api/v1/evals), and one report (GET /api/v1/evals/{name}): its cases, failing ones first, with each
// failed evaluator's reason, each run's duration, tokens and cost, and its transcript one click away, drawn
// as the conversation view draws a stored transcript. Reading reports takes a key with the admin scope.

import {ConversationView} from "./conversation.js";
import {clear, fmtCost, fmtDuration, fmtInt, fmtTime, h, svg} from "./dom.js";

const pct = (rate) => `${Math.round((rate || 0) * 100)}%`;

function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString([], {dateStyle: "medium", timeStyle: "short"});
}

/** A pass rate as a bar and a percentage (an SVG bar: the page's CSP allows no inline style). */
function rateBar(rate) {
  const level = rate >= 1 ? "ok" : rate >= 0.5 ? "warn" : "bad";
  return h("span", {class: "eval-rate", dataset: {level, rate: String(rate)}},
    svg("svg", {class: "eval-bar", viewBox: "0 0 100 8", preserveAspectRatio: "none", "aria-hidden": "true"},
      svg("rect", {class: "eval-bar-track", width: 100, height: 8, rx: 4}),
      svg("rect", {class: "eval-bar-fill", width: Math.round((rate || 0) * 100), height: 8, rx: 4})),
    h("span", {class: "eval-rate-text"}, pct(rate)));
}

function failure(err, what) {
  if (err.status === 403) return `Reading evaluation reports needs an API key with the admin scope (${err.message}).`;
  if (err.status === 404) return `No report named “${what}” in the server's evals folder.`;
  return err.message;
}

/** The list of reports, newest first. */
export async function showEvalList(view, {api}) {
  const page = h("div", {class: "evals-page"}, h("h1", {}, "Evals"), h("p", {class: "muted"}, "Loading…"));
  clear(view).append(page);
  let body;
  try {
    body = await api.get("/api/v1/evals");
  } catch (err) {
    if (page.isConnected) page.lastChild.replaceWith(h("p", {class: "form-error", role: "alert"}, failure(err, "")));
    return;
  }
  if (!page.isConnected) return;
  page.lastChild.remove();
  if (!body.configured) {
    page.append(h("p", {class: "muted empty"}, body.hint || "This server has no evals folder."));
    return;
  }
  if (!body.data.length) {
    page.append(h("p", {class: "muted empty"},
      "No reports yet: write one with ringlet eval AGENT DATASET --json into the server's evals folder."));
    return;
  }
  page.append(h("div", {class: "table-wrap"}, h("table", {class: "evals-table"},
    h("thead", {}, h("tr", {}, ["Report", "Agent", "Model", "Date", "Pass rate", "Cases", "Cost"]
      .map((label) => h("th", {scope: "col"}, label)))),
    h("tbody", {}, body.data.map(reportRow)))));
}

function reportRow(entry) {
  const s = entry.summary;
  const href = `#/evals/${encodeURIComponent(entry.name)}`;
  return h("tr", {class: "eval-report", dataset: {name: entry.name}},
    h("td", {}, h("a", {href, class: "eval-link"}, entry.dataset || entry.name),
      entry.dataset ? h("div", {class: "eval-file muted"}, entry.name) : null),
    h("td", {}, entry.agent),
    h("td", {}, entry.model || "–"),
    h("td", {class: "eval-date", title: entry.started_at || entry.modified_at}, fmtTime(entry.started_at || entry.modified_at)),
    h("td", {}, rateBar(s.pass_rate)),
    h("td", {}, h("span", {class: "eval-counts"}, h("span", {class: "eval-passed"}, `${s.passed} passed`),
      s.failed ? h("span", {class: "eval-failed"}, `${s.failed} failed`) : null)),
    h("td", {}, fmtCost(s.cost_usd)));
}

/** One report: its summary, then its cases, failing ones first. */
export async function showEvalReport(view, name, {api}) {
  const page = h("div", {class: "evals-page"},
    h("a", {href: "#/evals", class: "eval-back"}, "← All reports"), h("p", {class: "muted"}, "Loading…"));
  clear(view).append(page);
  let report;
  try {
    report = await api.get(`/api/v1/evals/${encodeURIComponent(name)}`);
  } catch (err) {
    if (page.isConnected) page.lastChild.replaceWith(h("p", {class: "form-error", role: "alert"}, failure(err, name)));
    return;
  }
  if (!page.isConnected) return;
  page.lastChild.remove();
  const s = report.summary;
  page.append(
    h("h1", {}, `${report.dataset || report.name} · ${report.agent}`),
    h("div", {class: "eval-summary"},
      rateBar(s.pass_rate),
      h("span", {class: "chip"}, `${s.passed}/${s.cases} cases passed`),
      s.failed ? h("span", {class: "chip eval-failed"}, `${s.failed} failed`) : null,
      report.model ? h("span", {class: "chip"}, report.model) : null,
      h("span", {class: "chip"}, when(report.started_at)),
      h("span", {class: "chip"}, `${fmtInt(s.in_tokens)} in · ${fmtInt(s.out_tokens)} out`),
      h("span", {class: "chip"}, fmtCost(s.cost_usd)),
      h("span", {class: "chip"}, fmtDuration(s.duration_s * 1000)),
      report.repeat > 1 ? h("span", {class: "chip"}, `${report.repeat} runs per case`) : null),
    h("div", {class: "eval-cases"}, [...report.cases].sort((a, b) => Number(a.passed) - Number(b.passed))
      .map((c) => caseBox(c, report.repeat > 1))));
}

function prompt(inputs) {
  if (typeof inputs === "string") return inputs;
  if (inputs && typeof inputs.prompt === "string") return inputs.prompt;
  return JSON.stringify(inputs);
}

function caseBox(c, repeated) {
  return h("section", {class: "eval-case", dataset: {case: c.name, passed: String(c.passed)}},
    h("div", {class: "eval-case-head"},
      h("h2", {}, c.name),
      h("span", {class: `chip ${c.passed ? "eval-passed" : "eval-failed"}`}, c.passed ? "passed" : "failed"),
      repeated ? rateBar(c.pass_rate) : null),
    h("p", {class: "eval-prompt"}, prompt(c.inputs)),
    c.runs.map((run) => runBox(run, c.runs.length > 1)));
}

function runBox(run, numbered) {
  const failed = run.results.filter((r) => r.error || r.value === false);
  const usage = run.usage || {};
  const tokens = (usage.in_tokens || 0) + (usage.out_tokens || 0);
  const others = run.results.filter((r) => !failed.includes(r));
  const transcript = h("details", {class: "eval-transcript"},
    h("summary", {}, `Transcript (${run.messages.length} messages)`));
  transcript.addEventListener("toggle", () => {
    if (transcript.open && !transcript.dataset.drawn) {
      transcript.dataset.drawn = "yes";
      transcript.append(drawTranscript(run.messages));
    }
  });
  return h("div", {class: "eval-run", dataset: {passed: String(run.passed), attempt: String(run.attempt)}},
    h("div", {class: "eval-run-head"},
      numbered ? h("strong", {}, `Run ${run.attempt}`) : null,
      h("span", {class: `chip ${run.passed ? "eval-passed" : "eval-failed"}`}, run.passed ? "passed" : run.status === "completed" ? "failed" : run.status),
      h("span", {class: "chip"}, fmtDuration(run.duration_s * 1000)),
      h("span", {class: "chip"}, `${fmtInt(tokens)} tokens`),
      h("span", {class: "chip"}, fmtCost(usage.cost_usd))),
    run.error ? h("div", {class: "run-error", role: "alert"},
      h("strong", {}, run.error.code || "error"), ": ", run.error.message || JSON.stringify(run.error)) : null,
    failed.length ? h("ul", {class: "eval-failures"}, failed.map((r) => h("li", {class: "eval-failure"},
      h("strong", {class: "eval-evaluator"}, r.name), ": ",
      h("span", {class: "eval-reason"}, r.error || r.reason || "failed")))) : null,
    others.length ? h("div", {class: "eval-results"}, others.map((r) => h("span", {
      class: `chip ${r.value === true ? "eval-passed" : ""}`, title: r.reason || ""},
    r.value === true ? `✓ ${r.name}` : `${r.name}: ${r.value}`))) : null,
    transcript);
}

/** A run's stored messages, drawn by the conversation view (user and assistant text, tool cards). */
function drawTranscript(messages) {
  const quiet = () => {};
  const view = new ConversationView({api: null, toast: quiet, changed: quiet, listChanged: quiet,
    approvalsChanged: quiet}, "eval");
  view.transcript.removeAttribute("aria-live");
  for (const m of messages) view.renderMessage(m);
  return view.transcript;
}
