// A graph run's checkpoints, and forking it from one with its state edited (issue 44). Under each ended run
// of a graph agent, "Checkpoints" lists the run's super-steps (`GET /api/v1/runs/{id}/checkpoints`); choosing
// one shows its state, one editor per key (`GET …/checkpoints/{step}`), and "Fork from step N" sends the keys
// that were changed as `state_patch` (`POST /api/v1/runs/{id}/fork`). A key that does not fit (422) shows
// the server's reason under its editor; a fork that starts opens its new conversation.

import {clear, h} from "./dom.js";

const runPath = (runId) => `/api/v1/runs/${encodeURIComponent(runId)}`;

/** The "Checkpoints" button of run block `scope` (once), when the conversation's agent is a graph agent. */
export function addCheckpoints(view, scope) {
  const runId = scope.el.dataset.runId;
  const agent = view.conversation && view.conversation.agent;
  if (!runId || runId === "_" || !agent || !view.app.kindOf || view.app.kindOf(agent) !== "graph") return;
  if (scope.el.querySelector(":scope > .checkpoints-open")) return;
  const button = h("button", {class: "btn checkpoints-open", type: "button", "aria-expanded": "false",
    title: "This run's checkpoints: fork it from any step, its state edited"}, "Checkpoints");
  button.addEventListener("click", () => toggle(view, scope.el, runId, button));
  scope.el.append(button);
}

async function toggle(view, el, runId, button) {
  const open = el.querySelector(":scope > .checkpoints");
  if (open) {
    open.remove();
    button.setAttribute("aria-expanded", "false");
    return;
  }
  const panel = h("div", {class: "checkpoints", role: "group", "aria-label": `Checkpoints of run ${runId}`});
  button.after(panel);
  button.setAttribute("aria-expanded", "true");
  let listed;
  try {
    listed = await view.api.get(`${runPath(runId)}/checkpoints`);
  } catch (err) {
    panel.append(h("div", {class: "notice notice-warning"}, err.message));
    return;
  }
  const steps = h("ol", {class: "checkpoint-steps"});
  const editor = h("div", {class: "checkpoint-editor"});
  for (const cp of listed.data) {
    const ended = !cp.frontier.length;
    const pick = h("button", {class: "checkpoint-step", type: "button", disabled: ended, dataset: {step: String(cp.step)},
      title: ended ? "The run's end: nothing is left to run from here" : `Fork from here: ${cp.frontier.join(", ")} run next`},
    `step ${cp.step}`, h("span", {class: "checkpoint-next"}, ended ? ` · ${cp.status}` : ` → ${cp.frontier.join(", ")}`));
    pick.addEventListener("click", () => {
      for (const b of steps.querySelectorAll(".checkpoint-step")) b.classList.toggle("chosen", b === pick);
      choose(view, runId, cp.step, editor, listed.graph_changed);
    });
    steps.append(h("li", {}, pick));
  }
  if (!listed.data.length) panel.append(h("div", {class: "notice notice-info"}, "No checkpoints are kept for this run."));
  panel.append(steps, editor);
}

/** A key's editor: a string as its text, anything else as JSON. */
function keyEditor(key, value, reducer) {
  const text = typeof value === "string";
  const area = h("textarea", {class: "state-value", rows: 1, spellcheck: "false", "aria-label": `State key ${key}`,
    dataset: {key, kind: text ? "string" : "json"}});
  area.value = text ? value : JSON.stringify(value, null, 2);
  area.rows = Math.min(8, Math.max(1, area.value.split("\n").length));
  const error = h("div", {class: "state-error", role: "alert"});
  const row = h("div", {class: "state-key", dataset: {key}},
    h("span", {class: "state-name"}, key), reducer ? h("span", {class: "chip", title: "Its reducer"}, reducer) : null,
    text ? null : h("span", {class: "chip", title: "Edit it as JSON"}, "JSON"), area, error);
  area.addEventListener("input", () => {
    row.classList.toggle("edited", area.value !== (text ? value : JSON.stringify(value, null, 2)));
    error.textContent = "";
  });
  return row;
}

async function choose(view, runId, step, editor, graphChanged) {
  clear(editor);
  let cp;
  try {
    cp = await view.api.get(`${runPath(runId)}/checkpoints/${step}`);
  } catch (err) {
    editor.append(h("div", {class: "notice notice-warning"}, err.message));
    return;
  }
  const rows = Object.entries(cp.state).map(([key, value]) => keyEditor(key, value, cp.reducers[key]));
  const force = h("input", {type: "checkbox", class: "checkpoint-force"});
  const go = h("button", {class: "btn primary checkpoint-fork", type: "button"}, `Fork from step ${step}`);
  const problem = h("div", {class: "checkpoint-problem", role: "alert"});
  const changed = graphChanged ? h("label", {class: "checkpoint-changed"}, force,
    " graph.yaml changed since this run: fork with the new graph") : [];
  editor.append(h("div", {class: "checkpoint-head"}, `State after step ${step} · next: ${cp.frontier.join(", ") || "(end)"}`),
    ...rows, ...[changed].flat(), h("div", {class: "checkpoint-actions"}, go), problem);
  go.addEventListener("click", () => fork(view, runId, step, cp.state, editor, {go, force, problem}));
}

/** The changed keys as a patch; null (and the reason under the key) when one is not valid JSON. */
function patchOf(editor, state) {
  const patch = {};
  let ok = true;
  for (const area of editor.querySelectorAll("textarea.state-value")) {
    const key = area.dataset.key;
    let value = area.value;
    if (area.dataset.kind === "json") {
      try {
        value = JSON.parse(area.value);
      } catch {
        area.parentElement.querySelector(".state-error").textContent = "Not valid JSON.";
        ok = false;
        continue;
      }
    }
    if (JSON.stringify(value) !== JSON.stringify(state[key])) patch[key] = value;
  }
  return ok ? patch : null;
}

async function fork(view, runId, step, state, editor, {go, force, problem}) {
  problem.textContent = "";
  const patch = patchOf(editor, state);
  if (!patch) return;
  go.disabled = true;
  try {
    const made = await view.api.post(`${runPath(runId)}/fork`, {checkpoint: step, state_patch: patch, force: force.checked});
    view.app.forked(made);
  } catch (err) {
    const errors = (err.details && err.details.errors) || [];
    let placed = false;
    for (const e of errors) {
      const key = Array.isArray(e.loc) ? e.loc[2] : null;
      const row = key === null ? null : [...editor.querySelectorAll(".state-key")].find((r) => r.dataset.key === key);
      if (row) {
        row.querySelector(".state-error").textContent = e.msg;
        placed = true;
      }
    }
    if (!placed) problem.textContent = err.message;
  } finally {
    if (go.isConnected) go.disabled = false;
  }
}
