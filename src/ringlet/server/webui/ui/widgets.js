// The pieces of a transcript that are more than text: tool-call cards, approvals, questions,
// notifications and a graph run's node progress.

import {append, clear, fmtDuration, fmtTime, h, prettyJson, timeLeft} from "./dom.js";
import {GraphDiagram} from "./graphdiagram.js";
import {safeUrl} from "./markdown.js";

const LONG_CHARS = 600;
const LONG_LINES = 12;

function isLong(text) {
  return text.length > LONG_CHARS || text.split("\n").length > LONG_LINES;
}

/** Text in a <pre>, folded into a <details> when it is long. */
export function foldable(label, text, className) {
  const pre = h("pre", {class: className}, text);
  if (!isLong(text)) return pre;
  const lines = text.split("\n").length;
  return h("details", {class: "fold"}, h("summary", {}, `${label} (${lines} lines, ${text.length} characters)`), pre);
}

function resultText(value) {
  if (value === undefined || value === null) return "";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

/** One tool call: name, arguments (as they stream), a spinner while it runs, then its result or error. */
export class ToolCard {
  constructor({toolCallId, name, connector}) {
    this.toolCallId = toolCallId;
    this.name = name;
    this.rawArgs = "";
    this.children = new Map();
    this.argsPre = h("pre", {class: "tool-args"});
    this.meta = h("span", {class: "tool-meta"});
    this.status = h("span", {class: "tool-status", role: "status"}, "running");
    this.gate = h("div", {class: "tool-gate"});
    this.nested = h("div", {class: "tool-children"});
    this.result = h("div", {class: "tool-result"});
    this.el = h("div", {class: "tool-card", dataset: {toolCallId, state: "running", tool: name}},
      h("div", {class: "tool-head"},
        h("span", {class: "spinner", "aria-hidden": "true"}),
        h("span", {class: "tool-icon", "aria-hidden": "true"}, "⚙"),
        h("span", {class: "tool-name"}, connector ? `${connector} · ${name}` : name),
        this.status, this.meta),
      h("details", {class: "tool-args-wrap", open: true}, h("summary", {}, "Arguments"), this.argsPre),
      this.gate, this.nested, this.result);
  }

  setArgs(value) {
    this.rawArgs = typeof value === "string" ? value : JSON.stringify(value);
    this.argsPre.textContent = prettyJson(value);
  }

  appendArgs(delta) {
    this.rawArgs += delta;
    this.argsPre.textContent = prettyJson(this.rawArgs);
  }

  foldArgs() {
    this.argsPre.closest("details").open = false;
  }

  setState(state, label) {
    this.el.dataset.state = state;
    this.status.textContent = label || state;
  }

  /** A `tool_result` event (or a stored tool message). */
  finish({result, error, isError, durationMs, truncated, policy}) {
    clear(this.result);
    if (isError) {
      const message = error ? `${error.code || "error"}: ${error.message || ""}` : resultText(result);
      this.result.append(foldable("Error", message, "tool-error"));
      this.setState("error", "failed");
    } else {
      this.result.append(foldable("Result", resultText(result), "tool-output"));
      this.setState("ok", "done");
    }
    const meta = [];
    if (durationMs !== undefined && durationMs !== null) meta.push(fmtDuration(durationMs));
    if (truncated) meta.push("truncated");
    clear(this.meta).append(...meta.map((m) => h("span", {class: "chip"}, m)));
    if (policy && policy.decision) {
      this.meta.append(h("span", {class: `chip policy policy-${policy.decision}`, title: policy.audit_id || ""},
        `policy: ${policy.decision}`));
    }
    this.foldArgs();
  }

  /** The container for a sub-agent's activity under this call. */
  child(agent) {
    if (!this.children.has(agent)) {
      const body = h("div", {class: "subagent-body"});
      const status = h("span", {class: "subagent-status"}, "working");
      const box = h("div", {class: "subagent", dataset: {agent}},
        h("div", {class: "subagent-head"}, h("span", {"aria-hidden": "true"}, "↳ "), "sub-agent ",
          h("strong", {}, agent), " ", status),
        body);
      this.nested.append(box);
      this.children.set(agent, {box, body, status});
    }
    return this.children.get(agent);
  }
}

/** An approval request with Allow / Deny (and a note), its time left, then who decided. */
export class ApprovalBox {
  constructor(record, {decide, conversationLink} = {}) {
    this.record = record;
    this.decideFn = decide;
    this.note = h("input", {class: "approval-note", type: "text", maxlength: "4000",
      placeholder: "Note (optional)", "aria-label": "Note for the decision"});
    this.allow = h("button", {class: "btn allow", type: "button", onclick: () => this.decide(true)}, "Allow");
    this.deny = h("button", {class: "btn deny", type: "button", onclick: () => this.decide(false)}, "Deny");
    this.error = h("div", {class: "form-error", role: "alert"});
    this.expires = h("span", {class: "expires", dataset: {expires: record.expires_at || ""}});
    this.actions = h("div", {class: "approval-actions"}, this.note, this.allow, this.deny);
    this.outcome = h("div", {class: "approval-outcome", role: "status"});
    const effect = record.effect || "write";
    this.el = h("div", {class: "approval", role: "group", "aria-label": `Approval for ${record.tool}`,
      dataset: {approvalId: record.approval_id, status: record.status || "pending"}},
      h("div", {class: "approval-head"},
        this.title = h("span", {class: "approval-title"}, "Approval needed"),
        conversationLink || null,
        h("span", {class: `chip effect effect-${effect}`}, effect),
        this.expires),
      h("div", {class: "approval-tool"}, "Tool ", h("strong", {}, record.tool)),
      record.reason ? h("div", {class: "approval-reason"}, record.reason) : null,
      foldable("Arguments", prettyJson(record.args || {}), "approval-args"),
      this.actions, this.error, this.outcome);
    if (record.status && record.status !== "pending") this.showDecided(record);
    else this.tick();
  }

  tick(now = Date.now()) {
    if (this.el.dataset.status !== "pending") return;
    const left = timeLeft(this.record.expires_at, now);
    this.expires.textContent = left === "expired" ? "expired" : left ? `expires in ${left}` : "";
  }

  async decide(approved) {
    this.error.textContent = "";
    this.allow.disabled = this.deny.disabled = true;
    const note = this.note.value.trim();
    try {
      const decided = await this.decideFn(this.record, approved, note || undefined);
      this.showDecided({...this.record, ...decided, note: note || null});
    } catch (err) {
      if (err.code === "approval_already_decided" || err.code === "approval_expired") {
        const status = err.code === "approval_expired" ? "expired" : (err.details && err.details.status) || "decided";
        this.showDecided({...this.record, ...(err.details || {}), status});
      } else {
        this.error.textContent = err.message;
        this.allow.disabled = this.deny.disabled = false;
      }
    }
  }

  showDecided(record) {
    this.record = {...this.record, ...record};
    const r = this.record;
    this.el.dataset.status = r.status;
    this.actions.remove();
    this.expires.textContent = "";
    this.title.textContent = "Approval";
    const verb = {approved: "Approved", denied: "Denied", expired: "Expired", cancelled: "Cancelled",
      executing: "Approved"}[r.status] || r.status;
    append(clear(this.outcome), [
      h("span", {class: `decision decision-${r.status}`}, verb),
      r.decided_by ? [" by ", h("strong", {class: "decided-by"}, r.decided_by)] : null,
      r.decided_at ? ` · ${fmtTime(r.decided_at)}` : null,
      r.note ? [" — ", h("q", {class: "decision-note"}, r.note)] : null]);
  }
}

/** The page a question asks the human to open (an MCP server's sign-in to connect their account, a URL
 * elicitation's page), as a link that opens it in a new tab: "Connect" or "Open page"; null when none. */
function questionLink(text) {
  const found = text.match(/\bOpen (https?:\/\/\S+?)(?=[\s)]|$)/);
  const href = found ? safeUrl(found[1]) : null;
  if (!href) return null;
  const connect = /needs you to connect your account/.test(text);
  return h("a", {class: "btn primary question-link", href, target: "_blank", rel: "noopener noreferrer"},
    connect ? "Connect" : "Open page");
}

/** A question: option buttons (single-select), checkboxes (multi-select) or a text box. */
export class QuestionBox {
  constructor(q, {answer}) {
    this.q = q;
    this.answerFn = answer;
    this.error = h("div", {class: "form-error", role: "alert"});
    this.outcome = h("div", {class: "question-outcome", role: "status"});
    this.form = h("form", {class: "question-form", onsubmit: (e) => {
      e.preventDefault();
      this.submit();
    }});
    const type = q.input_type || "text";
    const options = q.options || [];
    const name = `q-${q.question_id}`;
    this.boxes = [];
    this.freeform = null;
    if (type === "single-select") {
      this.form.append(h("div", {class: "options", role: "group", "aria-label": q.question},
        options.map((o) => h("button", {type: "button", class: "btn option", dataset: {label: o.label},
          onclick: () => this.submit(o.label)},
        h("span", {class: "option-label"}, o.label),
        o.description ? h("span", {class: "option-desc"}, o.description) : null))));
    } else if (type === "multi-select") {
      this.form.append(h("fieldset", {class: "options multi"}, h("legend", {class: "sr-only"}, q.question),
        options.map((o) => {
          const box = h("input", {type: "checkbox", name, value: o.label});
          this.boxes.push(box);
          return h("label", {class: "check"}, box, h("span", {class: "option-label"}, o.label),
            o.description ? h("span", {class: "option-desc"}, o.description) : null);
        })));
    }
    if (type === "text" || q.allow_freeform) {
      this.freeform = h(type === "text" ? "textarea" : "input", {class: "question-text-input", rows: "2",
        type: type === "text" ? null : "text", "aria-label": type === "text" ? q.question : "Your own answer",
        placeholder: type === "text" ? (q.default !== undefined && q.default !== null
          ? `Default: ${typeof q.default === "string" ? q.default : JSON.stringify(q.default)}` : "Your answer")
          : "Or write your own answer"});
      this.form.append(this.freeform);
    }
    if (type !== "single-select" || q.allow_freeform) {
      this.form.append(h("button", {type: "submit", class: "btn primary"}, "Send answer"));
    }
    this.el = h("div", {class: "question", dataset: {questionId: q.question_id, status: q.status || "pending",
      inputType: type}},
    h("div", {class: "question-head"}, h("span", {class: "question-icon", "aria-hidden": "true"}, "?"),
      h("span", {class: "question-text"}, q.question || "")),
    questionLink(q.question || ""), this.form, this.error, this.outcome);
    if (q.status && q.status !== "pending") this.showAnswered(q.answer, q.answered_by);
  }

  /** The answer the form holds, or throws a message saying what is missing. */
  collect(picked) {
    const type = this.q.input_type || "text";
    const free = this.freeform ? this.freeform.value.trim() : "";
    if (picked !== undefined) return picked;
    if (type === "multi-select") {
      const chosen = this.boxes.filter((b) => b.checked).map((b) => b.value);
      if (chosen.length && free) throw new Error("Choose options or write your own answer, not both.");
      if (chosen.length) return chosen;
      if (free) return free;
      throw new Error(this.q.allow_freeform ? "Choose at least one option or write an answer."
        : "Choose at least one option.");
    }
    if (type === "single-select") {
      if (free) return free;
      throw new Error("Choose an option or write an answer.");
    }
    if (free) return free;
    if (this.q.default !== undefined && this.q.default !== null) return "";
    throw new Error("Write an answer first.");
  }

  async submit(picked) {
    this.error.textContent = "";
    let answer;
    try {
      answer = this.collect(picked);
    } catch (err) {
      this.error.textContent = err.message;
      return;
    }
    const controls = this.form.querySelectorAll("button, input, textarea");
    controls.forEach((c) => { c.disabled = true; });
    try {
      const done = await this.answerFn(this.q, answer);
      this.showAnswered(answer, done && done.answered_by);
    } catch (err) {
      if (err.code === "question_already_answered") {
        this.showAnswered(null, null);
      } else {
        this.error.textContent = err.message;
        controls.forEach((c) => { c.disabled = false; });
      }
    }
  }

  showAnswered(answer, by) {
    this.el.dataset.status = "answered";
    this.form.remove();
    const text = Array.isArray(answer) ? answer.join(", ") : answer;
    append(clear(this.outcome), ["Answered",
      text !== null && text !== undefined ? [": ", h("strong", {}, text || "(default)")] : null,
      by ? ` by ${by}` : null]);
  }
}

/** A `notification` event at its level; progress notifications of one source and title update in place. */
export function notice(ev) {
  const level = ev.level || "info";
  const bar = ev.progress ? h("progress", {max: ev.progress.total || "", value: ev.progress.current}) : null;
  const label = ev.progress ? (ev.progress.total ? `${ev.progress.current}/${ev.progress.total}` : `${ev.progress.current}`) : "";
  return h("div", {class: `notice notice-${level}`, role: level === "error" ? "alert" : "status",
    dataset: {level, source: ev.source || ""}},
  h("span", {class: "notice-level"}, level),
  h("strong", {class: "notice-title"}, ev.title || ""),
  ev.message ? h("span", {class: "notice-message"}, ev.message) : null,
  bar, label ? h("span", {class: "notice-progress"}, label) : null,
  ev.source ? h("span", {class: "notice-source"}, ev.source) : null);
}

const GUARD_STAGES = {input: "your message", output: "the answer", tool_args: "a tool call", tool_result: "a tool result"};
const GUARD_LEVELS = {allow: "success", redact: "warning", block: "error"};

/** A `guardrail` event: which guardrail decided what on which text, what it found, why it blocked, and a
 * model-graded guardrail's own cost. */
export function guardrailNotice(ev) {
  const verb = {allow: "allowed", redact: "redacted", block: "blocked"}[ev.decision] || ev.decision;
  const where = GUARD_STAGES[ev.stage] || ev.stage;
  const cost = ev.usage && ev.usage.cost_usd != null ? `$${Number(ev.usage.cost_usd).toFixed(6)}` : null;
  return h("div", {class: `notice guardrail notice-${GUARD_LEVELS[ev.decision] || "info"}`,
    role: ev.decision === "block" ? "alert" : "status",
    dataset: {guardrail: ev.guardrail, stage: ev.stage, decision: ev.decision}},
  h("span", {class: "notice-level"}, "guardrail"),
  h("strong", {class: "notice-title"}, `${ev.guardrail} ${verb} ${where}${ev.tool ? ` (${ev.tool})` : ""}`),
  ev.kinds && ev.kinds.length ? h("span", {class: "guardrail-kinds"}, ev.kinds.join(", ")) : null,
  ev.reason ? h("span", {class: "notice-message"}, ev.reason) : null,
  ev.usage ? h("span", {class: "notice-source guardrail-usage"},
    `${fmtTokens(ev.usage.in_tokens)} in · ${fmtTokens(ev.usage.out_tokens)} out${cost ? ` · ${cost}` : ""}`) : null);
}

function fmtTokens(n) {
  return `${Number(n || 0).toLocaleString("en")} tok`;
}

/** A graph run's nodes as they start and end: the graph's diagram (once `diagram`, a promise of its Mermaid
 * text or null, resolves) coloured by node state, and a row per node run. */
export class GraphView {
  constructor(diagram = null) {
    this.nodes = new Map();
    this.states = new Map(); // node id → {running, state}: what the diagram shows
    this.diagram = null;
    this.list = h("ol", {class: "graph-nodes"});
    this.figure = h("div", {class: "graph-figure"});
    this.el = h("div", {class: "graph", role: "group", "aria-label": "Graph progress"},
      h("div", {class: "graph-head"}, "Graph run"), this.figure, this.list);
    if (diagram) {
      diagram.then((text) => {
        if (!text) return;
        this.diagram = new GraphDiagram(text, {title: "Graph diagram"});
        this.figure.append(this.diagram.el);
        for (const [nodeId, s] of this.states) this.diagram.setState(nodeId, s.running > 0 ? "running" : s.state);
      }).catch(() => {});
    }
  }

  mark(nodeId, change) {
    const s = this.states.get(nodeId) || {running: 0, state: "pending"};
    change(s);
    this.states.set(nodeId, s);
    if (this.diagram) this.diagram.setState(nodeId, s.running > 0 ? "running" : s.state);
  }

  row(ev) {
    const key = `${ev.node_id}#${ev.item_index ?? ""}`;
    if (!this.nodes.has(key)) {
      const state = h("span", {class: "node-state"});
      const info = h("span", {class: "node-info"});
      const li = h("li", {class: "graph-node", dataset: {nodeId: ev.node_id, state: "running"}},
        h("span", {class: "spinner", "aria-hidden": "true"}),
        h("span", {class: "node-id"}, ev.node_id + (ev.item_index !== undefined && ev.item_index !== null ? ` [${ev.item_index}]` : "")),
        h("span", {class: "node-type chip"}, ev.node_type || ""), state, info);
      this.list.append(li);
      this.nodes.set(key, {li, state, info});
    }
    return this.nodes.get(key);
  }

  start(ev) {
    const r = this.row(ev);
    r.li.dataset.state = "running";
    r.state.textContent = "running";
    r.info.textContent = `step ${ev.step}${ev.visit > 1 ? ` · visit ${ev.visit}` : ""}`;
    this.mark(ev.node_id, (s) => { s.running += 1; });
  }

  end(ev) {
    const r = this.row(ev);
    r.li.dataset.state = ev.outcome;
    r.state.textContent = ev.outcome;
    const next = ev.next && ev.next.length ? ` → ${ev.next.join(", ")}` : "";
    const err = ev.error ? ` · ${typeof ev.error === "string" ? ev.error : JSON.stringify(ev.error)}` : "";
    r.info.textContent = `step ${ev.step} · ${fmtDuration(ev.duration_ms)}${next}${err}`;
    const outcome = {ok: "done", failed: "failed", fallback: "fallback"}[ev.outcome] || "done";
    this.mark(ev.node_id, (s) => {
      s.running = Math.max(0, s.running - 1);
      if (s.state !== "failed") s.state = outcome; // a failed map item keeps its node failed
    });
  }
}
