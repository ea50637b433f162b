// Forking a conversation from the transcript (issue 44): "Fork here" on any stored message, "Edit" (edit and
// run from here) on a user message, "Replace result" and "Run again" on a tool call's result, and the mark a
// forked conversation shows, linking to its origin. Each action is `POST …/fork`; the new conversation opens.

import {h} from "./dom.js";

/** `POST …/fork` from `view`'s conversation; then the app opens the new conversation. */
async function fork(view, body, button) {
  if (button) button.disabled = true;
  try {
    const made = await view.api.post(`${view.base}/fork`, body);
    view.app.forked(made);
    return true;
  } catch (err) {
    view.app.toast(err.message);
    return false;
  } finally {
    if (button && button.isConnected) button.disabled = false;
  }
}

/** An action's button. Its label is drawn by CSS (`data-label`) and named by `aria-label`: the message's text
 * (what copying it or reading `textContent` gives) stays the message's own. */
function actionButton(label, title, onclick) {
  const button = h("button", {class: "fork-btn", type: "button", title, "aria-label": label, dataset: {label}});
  button.addEventListener("click", (event) => {
    event.stopPropagation();
    onclick(button);
  });
  return button;
}

/** The fork actions of stored message `m`, drawn under `el` (once; a message still streaming has none): inside
 * an answer or a tool card, beside a user's bubble (its text stays the message's own). */
export function addForkActions(view, el, m) {
  if (!el || !m || !m.id || !view.app.forked) return;
  const user = m.role === "user";
  const drawn = user ? el.nextElementSibling : el.querySelector(":scope > .fork-actions");
  if (drawn && drawn.classList.contains("fork-actions")) return;
  const bar = h("div", {class: `fork-actions${user ? " fork-actions-user" : ""}`, dataset: {messageId: m.id}});
  bar.append(actionButton("Fork here", "A new conversation with the transcript up to this message",
    (button) => fork(view, {at_message_id: m.id}, button)));
  if (m.role === "user") {
    bar.append(actionButton("Edit", "Edit this message and run from here, in a new conversation",
      () => editInPlace(view, bar, m)));
  }
  if (m.role === "tool") {
    bar.append(actionButton("Replace result", "A new conversation where this call returned what you write",
      () => replaceResult(view, bar, m)));
    bar.append(actionButton("Run again", "A new conversation where this call runs again (approval as for any call)",
      (button) => fork(view, {at_message_id: m.id, rerun: true}, button)));
  }
  if (user) el.after(bar);
  else el.append(bar);
}

function textOf(content) {
  if (typeof content === "string") return content;
  return (content || []).filter((p) => p.type === "text").map((p) => p.text).join("");
}

/** A box after the actions `bar` to write new text in; `send(text)` is called with it (true: done, the box goes). */
function textBox(bar, {value, label, action}, send) {
  const old = bar.nextElementSibling;
  if (old && old.classList.contains("fork-edit")) {
    old.querySelector("textarea").focus();
    return;
  }
  const area = h("textarea", {class: "fork-text", rows: 3, "aria-label": label});
  area.value = value;
  const run = h("button", {class: "btn primary", type: "button"}, action);
  const cancel = h("button", {class: "btn", type: "button"}, "Cancel");
  const box = h("div", {class: `fork-edit${bar.classList.contains("fork-actions-user") ? " fork-edit-user" : ""}`}, area, h("div", {class: "fork-edit-actions"}, cancel, run));
  const go = async () => {
    if (!area.value.trim()) return;
    run.disabled = true;
    if (await send(area.value)) box.remove();
    else run.disabled = false;
  };
  run.addEventListener("click", go);
  cancel.addEventListener("click", () => box.remove());
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) go();
    if (event.key === "Escape") box.remove();
  });
  bar.after(box);
  area.focus();
}

function editInPlace(view, bar, m) {
  textBox(bar, {value: textOf(m.content), label: "Edited message", action: "Run from here"},
    (text) => fork(view, {at_message_id: m.id, edit: {content: text}}));
}

function replaceResult(view, bar, m) {
  textBox(bar, {value: textOf(m.content), label: "Replaced result", action: "Go on with this result"},
    (text) => fork(view, {at_message_id: m.id, tool_result: {content: text}}));
}

/** A forked conversation's mark: where it came from, as a link to the origin (its title when the list has it). */
export function forkMark(conversation, titleOf) {
  const origin = conversation && conversation.forked_from;
  if (!origin) return null;
  const title = titleOf(origin.conversation_id);
  return h("div", {class: "fork-mark", role: "note"}, "Forked from ",
    h("a", {href: `#/c/${encodeURIComponent(origin.conversation_id)}`, class: "fork-origin"},
      title ? `“${title}”` : origin.conversation_id));
}
