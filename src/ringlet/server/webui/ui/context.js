// The context panel: the TokenBreakdown of the next prompt (`GET …/context`) as a pie chart against
// the model's context window, with the warning and danger thresholds, and the conversation's usage.
//
// The breakdown is ringlet's estimate (about four characters a token). A model's own tokenizer and prompt
// template can count far more (a small local model renders the tool schemas into a long system prompt):
// once the model has reported what its last request cost (`last_request`), the panel scales the estimate
// by that ratio, so the total, the percentage and the warnings are in the model's own tokens.

import {clear, fmtCost, fmtInt, h, svg} from "./dom.js";

export const PARTS = [
  ["system", "System"],
  ["tool_definitions", "Tools"],
  ["user", "User"],
  ["assistant", "Assistant"],
  ["tool_results", "Tool results"],
];
/** Compaction starts at 0.8 × the budget (memory-and-context.md §5): past it, the prompt is about to be
 * compacted; at 0.95 × it is close to not fitting at all. */
export const WARNING = 0.8;
export const DANGER = 0.95;

const C = 80; // the centre of the 160 × 160 chart
const R = 70; // the ring's outer radius
const HOLE = 46; // its inner radius: the percentage sits in the hole

function point(fraction, radius) {
  const angle = 2 * Math.PI * fraction - Math.PI / 2;
  return `${(C + radius * Math.cos(angle)).toFixed(3)} ${(C + radius * Math.sin(angle)).toFixed(3)}`;
}

/** The whole ring: the outer circle and the hole, as two closed loops (filled even-odd). */
function ringPath() {
  const loop = (r) => `M ${C - r} ${C} A ${r} ${r} 0 1 1 ${C + r} ${C} A ${r} ${r} 0 1 1 ${C - r} ${C} Z`;
  return `${loop(R)} ${loop(HOLE)}`;
}

/** The part of the ring from `from` to `to` (fractions of a turn, clockwise from the top): along the
 * outer edge, across the ring, back along the inner edge. Every point stays on the ring. */
function slicePath(from, to) {
  if (to - from >= 0.9999) return ringPath();
  const large = to - from > 0.5 ? 1 : 0;
  return `M ${point(from, R)} A ${R} ${R} 0 ${large} 1 ${point(to, R)} L ${point(to, HOLE)} `
    + `A ${HOLE} ${HOLE} 0 ${large} 0 ${point(from, HOLE)} Z`;
}

function slice(from, to, attrs, title) {
  return svg("path", {...attrs, d: slicePath(from, to), "fill-rule": "evenodd"}, svg("title", {}, title));
}

/** A threshold: a tick across the ring, never beyond it. */
function mark(fraction, className, title) {
  const [x1, y1] = point(fraction, HOLE).split(" ");
  const [x2, y2] = point(fraction, R).split(" ");
  return svg("line", {class: className, x1, y1, x2, y2}, svg("title", {}, title));
}

/** Whether the conversation has used anything yet: before its first run its cost is unknown, not unpriced. */
function ran(usage) {
  return Boolean(usage.in_tokens || usage.out_tokens) || (usage.cost_usd !== null && usage.cost_usd !== undefined);
}

export function level(report) {
  const budget = report.budget || report.context_window || 0;
  if (!budget) return "ok";
  const used = report.total / budget;
  return used >= DANGER ? "danger" : used >= WARNING ? "warning" : "ok";
}

/** The report in the model's own tokens when it has counted a request (`last_request`): each part scaled
 * by what it counted over what the estimator said for that request; else the report as it is. */
export function measured(report) {
  const last = report.last_request;
  if (!last || !last.in_tokens || !last.estimated) return {...report, estimate: null, ratio: 1};
  const ratio = last.in_tokens / last.estimated;
  const out = {...report, estimate: report.total, ratio};
  for (const [key] of PARTS) out[key] = Math.round((report[key] || 0) * ratio);
  out.total = Math.round(report.total * ratio);
  return out;
}

/** Draw the panel for `report` (the context endpoint's body) and `conversation` (for usage). */
export function renderContext(container, raw, conversation) {
  clear(container);
  if (!raw) {
    container.append(h("p", {class: "muted"}, "Open a conversation to see its context."));
    return;
  }
  const report = measured(raw);
  const windowSize = report.context_window || report.budget || report.total || 1;
  const capacity = Math.max(windowSize, report.total);
  const state = level(report);
  const chart = svg("svg", {class: "pie", viewBox: "0 0 160 160", role: "img",
    "aria-label": `Next prompt: ${report.total} of ${windowSize} tokens`});
  chart.append(svg("path", {class: "slice slice-free", d: ringPath(), "fill-rule": "evenodd"},
    svg("title", {}, "Free")));
  let at = 0;
  for (const [key, label] of PARTS) {
    const tokens = report[key] || 0;
    if (!tokens) continue;
    const size = tokens / capacity;
    chart.append(slice(at, at + size, {class: `slice slice-${key}`, "data-key": key, "data-tokens": tokens},
      `${label}: ${fmtInt(tokens)} tokens`));
    at += size;
  }
  if (report.budget) {
    chart.append(mark(Math.min(1, (report.budget * WARNING) / capacity), "threshold threshold-warning",
      `Warning: ${fmtInt(Math.round(report.budget * WARNING))} tokens`));
    chart.append(mark(Math.min(1, (report.budget * DANGER) / capacity), "threshold threshold-danger",
      `Danger: ${fmtInt(Math.round(report.budget * DANGER))} tokens`));
  }
  const percent = Math.round((100 * report.total) / windowSize);
  const against = report.context_window ? "window" : "budget";
  chart.append(svg("text", {class: "pie-percent", x: C, y: C - 2, "text-anchor": "middle"}, `${percent}%`));
  chart.append(svg("text", {class: "pie-caption", x: C, y: C + 16, "text-anchor": "middle"}, `of ${against}`));

  const rows = PARTS.map(([key, label]) => h("tr", {class: "legend-row", dataset: {key, tokens: report[key] || 0}},
    h("td", {}, h("span", {class: `swatch slice-${key}`, "aria-hidden": "true"}), label),
    h("td", {class: "num tokens"}, fmtInt(report[key] || 0)),
    h("td", {class: "num"}, `${((100 * (report[key] || 0)) / windowSize).toFixed(1)}%`)));
  const message = {ok: "Room to spare.", warning: "Near the compaction threshold.",
    danger: "The next prompt barely fits its budget."}[state];
  container.append(
    h("div", {class: `context-state context-${state}`, dataset: {level: state}, role: "status"}, message),
    chart,
    h("p", {class: "context-total"},
      h("strong", {class: "total", dataset: {total: report.total}}, fmtInt(report.total)), " / ",
      h("span", {class: "window", dataset: {window: report.context_window ?? ""}}, fmtInt(windowSize)),
      report.context_window ? " tokens of the context window" : " tokens of the budget (the model's window is unknown)"),
    report.estimate === null ? "" : h("p", {class: "muted measured", dataset: {estimate: report.estimate}},
      `As the model counts: it reported ${fmtInt(raw.last_request.in_tokens)} tokens for its last request, which `
      + `ringlet estimated at ${fmtInt(raw.last_request.estimated)}, so this estimate of ${fmtInt(report.estimate)} `
      + `is scaled by ${report.ratio.toFixed(2)}.`),
    raw.last_request && raw.last_request.cache_read_tokens ? h("p", {class: "muted cached",
      dataset: {cached: raw.last_request.cache_read_tokens}},
      `Prompt cache: ${fmtInt(raw.last_request.cache_read_tokens)} of the last request's `
      + `${fmtInt(raw.last_request.in_tokens)} input tokens were read from the provider's cache, at its cached rate.`) : "",
    h("table", {class: "legend"}, h("tbody", {}, rows)),
    h("p", {class: "muted budget", dataset: {budget: report.budget}}, `Budget ${fmtInt(report.budget)} tokens · warning at `
      + `${Math.round(WARNING * 100)}%, danger at ${Math.round(DANGER * 100)}%`));
  if (conversation) {
    const u = conversation.usage || {};
    container.append(h("h3", {}, "Usage"), h("dl", {class: "usage"},
      h("dt", {}, "Input tokens"), h("dd", {class: "usage-in"}, fmtInt(u.in_tokens)),
      h("dt", {}, "Output tokens"), h("dd", {class: "usage-out"}, fmtInt(u.out_tokens)),
      h("dt", {}, "Cost"), h("dd", {class: "usage-cost"}, ran(u) ? fmtCost(u.cost_usd) : "–")));
  }
}
