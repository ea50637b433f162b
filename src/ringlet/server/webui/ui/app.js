// ringlet's web UI: sign-in, the agents, the conversation list, one open conversation with its composer,
// the pending approvals of every conversation, the evaluation reports (evals.js), and the context panel.
// It uses only the public API of server-contract.md, through api.js.

import {Api, ApiError} from "./api.js";
import {renderContext} from "./context.js";
import {ConversationView} from "./conversation.js";
import {clear, fmtTime, h, timeLeft} from "./dom.js";
import {showEvalList, showEvalReport} from "./evals.js";
import {GraphDiagram} from "./graphdiagram.js";
import {ApprovalBox} from "./widgets.js";

const api = new Api();
const $ = (id) => document.getElementById(id);
const state = {
  mode: null, agents: [], conversations: [], nextCursor: null, view: null, selectedAgent: null, page: "home",
  listTimer: null, listTicket: 0, contextTimer: null, contextTicket: 0,
};
/** While a listed conversation has a run going, the list is read again this often: its run may end in
 * another tab or after the page left it, and no event of an unopened conversation reaches this page. */
const LIST_POLL_MS = 3000;

// -- messages to the user -------------------------------------------------------------------------------

function toast(message, kind = "error") {
  const el = h("div", {class: `toast toast-${kind}`, role: kind === "error" ? "alert" : "status"}, message,
    h("button", {class: "icon-btn", type: "button", "aria-label": "Dismiss", onclick: () => el.remove()}, "×"));
  $("toasts").append(el);
  setTimeout(() => el.remove(), 8000);
}

function describe(err) {
  if (err instanceof ApiError) return `${err.message}${err.requestId ? ` (${err.requestId})` : ""}`;
  return `Cannot reach the server: ${err.message}`;
}

// -- signing in -----------------------------------------------------------------------------------------

async function boot() {
  api.onUnauthorized = () => {
    api.signOut();
    showSignIn("Your API key is no longer accepted; sign in again.");
  };
  let probe;
  try {
    probe = await api.probe();
  } catch (err) {
    showSignIn(describe(err));
    return;
  }
  if (probe.mode === "signin") showSignIn(probe.error);
  else enter(probe);
}

function showSignIn(error) {
  if (state.view) state.view.close();
  state.view = null;
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = error || "";
  $("signin-key").value = "";
  $("signin-key").focus();
}

async function signIn(event) {
  event.preventDefault();
  const key = $("signin-key").value.trim();
  if (!key) {
    $("signin-error").textContent = "Enter an API key (ringlet keys create prints one).";
    return;
  }
  api.signIn(key);
  let probe;
  try {
    probe = await api.probe();
  } catch (err) {
    $("signin-error").textContent = describe(err);
    return;
  }
  if (probe.mode === "signin") {
    $("signin-error").textContent = "That API key was not accepted.";
    return;
  }
  enter(probe);
}

function signOut() {
  api.signOut();
  if (state.view) state.view.close();
  state.view = null;
  location.hash = "#/";
  showSignIn("");
}

function enter(probe) {
  state.mode = probe.mode;
  state.agents = probe.agents || [];
  $("signin").hidden = true;
  $("app").hidden = false;
  $("who").textContent = probe.mode === "open" ? "local · no sign-in" : "signed in with an API key";
  $("sign-out").hidden = probe.mode === "open";
  if (state.agents.length === 1) state.selectedAgent = state.agents[0].name;
  loadConversations();
  refreshApprovalCount();
  route();
}

// -- the conversation list ------------------------------------------------------------------------------

async function loadConversations(more = false) {
  const ticket = ++state.listTicket; // only the latest read counts: an older answer may come back last
  try {
    const query = more && state.nextCursor ? `?limit=50&cursor=${encodeURIComponent(state.nextCursor)}` : "?limit=50";
    const page = await api.get(`/api/v1/chat/conversations${query}`);
    if (ticket !== state.listTicket) return;
    state.conversations = more ? [...state.conversations, ...page.data] : page.data;
    state.nextCursor = page.next_cursor;
  } catch (err) {
    if (ticket === state.listTicket) toast(describe(err));
    return;
  }
  renderConversations();
  if (state.conversations.some((c) => c.status === "running")) scheduleListRefresh(LIST_POLL_MS);
}

function scheduleListRefresh(delay = 250) {
  clearTimeout(state.listTimer);
  state.listTimer = setTimeout(() => loadConversations(), delay);
}

function renderConversations() {
  const list = clear($("conversations"));
  if (!state.conversations.length) list.append(h("li", {class: "muted empty-list"}, "No conversations yet."));
  for (const c of state.conversations) {
    const current = state.view && state.view.cid === c.id;
    const title = c.title || "New conversation";
    const del = h("button", {class: "icon-btn conv-delete", type: "button", "aria-label": `Delete conversation ${title}`,
      title: "Delete", onclick: () => deleteConversation(c, del)}, "✕");
    list.append(h("li", {class: "conv-item", dataset: {id: c.id, status: c.status}},
      h("a", {class: "conv-link", href: `#/c/${encodeURIComponent(c.id)}`, "aria-current": current ? "page" : false},
        h("span", {class: "conv-title"}, title),
        h("span", {class: "conv-meta"}, `${c.agent} · ${fmtTime(c.updated_at)}`,
          c.forked_from ? h("span", {class: "chip fork-chip", title: "A fork of another conversation"}, "fork") : null,
          c.status !== "idle" ? h("span", {class: `chip status-${c.status}`}, c.status.replace("_", " ")) : null)),
      del));
  }
  $("more").hidden = !state.nextCursor;
}

async function deleteConversation(c, button) {
  if (button.dataset.confirm !== "yes") { // a second press confirms
    button.dataset.confirm = "yes";
    button.textContent = "Delete?";
    button.classList.add("confirm");
    setTimeout(() => {
      if (!button.isConnected) return;
      button.dataset.confirm = "";
      button.textContent = "✕";
      button.classList.remove("confirm");
    }, 4000);
    return;
  }
  try {
    await api.del(`/api/v1/chat/conversations/${encodeURIComponent(c.id)}`);
  } catch (err) {
    toast(describe(err));
    return;
  }
  state.conversations = state.conversations.filter((x) => x.id !== c.id);
  renderConversations();
  toast(`Deleted “${c.title || "New conversation"}”.`, "info");
  if (state.view && state.view.cid === c.id) location.hash = "#/";
}

// -- pages ----------------------------------------------------------------------------------------------

function route() {
  if ($("app").hidden) return;
  closeDrawers();
  const hash = location.hash || "#/";
  const match = /^#\/c\/([^/]+)$/.exec(hash);
  const report = /^#\/evals\/([^/]+)$/.exec(hash);
  for (const link of [$("evals-link"), $("evals-side-link")]) { // the top bar's, or the drawer's on a phone
    if (hash === "#/evals" || report) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (match) openConversation(decodeURIComponent(match[1]));
  else if (hash === "#/approvals") showApprovals();
  else if (hash === "#/evals") showEvals();
  else if (report) showEvals(decodeURIComponent(report[1]));
  else showHome();
}

function leaveConversation() {
  if (state.view) state.view.close();
  state.view = null;
  $("conv-title").textContent = "";
  renderContext($("context-body"), null, null);
}

function showHome() {
  leaveConversation();
  state.page = "home";
  const view = clear($("view"));
  view.append(h("div", {class: "home"},
    h("h1", {}, "Start a conversation"),
    state.agents.length ? null : h("p", {class: "muted"}, "This server hosts no agent you may use."),
    h("div", {class: "agents"}, state.agents.map(agentCard))));
  updateComposer();
  renderConversations();
}

function agentCard(agent) {
  const selected = state.selectedAgent === agent.name;
  return h("div", {class: `agent-card${selected ? " selected" : ""}`, dataset: {agent: agent.name}},
    h("div", {class: "agent-head"}, h("h2", {}, agent.name), h("span", {class: "chip"}, agent.kind)),
    h("p", {class: "agent-desc"}, agent.description || "No description."),
    agent.conversation_starters.length ? h("div", {class: "starters", role: "group",
      "aria-label": `Conversation starters for ${agent.name}`},
    agent.conversation_starters.map((text) => h("button", {class: "btn starter", type: "button",
      onclick: () => startConversation(agent.name, text)}, text))) : null,
    h("button", {class: "btn choose", type: "button", "aria-pressed": selected ? "true" : "false",
      onclick: () => selectAgent(agent.name)}, selected ? `Chatting with ${agent.name}` : `Chat with ${agent.name}`),
    selected && agent.kind === "graph" ? graphPreview(agent.name) : null);
}

const graphTexts = new Map();

/** The chosen graph agent's diagram, drawn once `GET /api/v1/agents/{name}/graph` answers. */
function graphPreview(name) {
  const box = h("div", {class: "graph-figure graph-preview"});
  if (!graphTexts.has(name)) {
    graphTexts.set(name, api.get(`/api/v1/agents/${encodeURIComponent(name)}/graph`)
      .then((body) => body.mermaid, () => null));
  }
  graphTexts.get(name).then((text) => {
    if (text) box.append(new GraphDiagram(text, {title: `The ${name} graph`}).el);
  });
  return box;
}

function selectAgent(name) {
  state.selectedAgent = name;
  showHome();
  $("composer-input").focus();
}

async function startConversation(agent, text) {
  let conversation;
  try {
    conversation = await api.post("/api/v1/chat/conversations", {agent});
  } catch (err) {
    toast(describe(err));
    return;
  }
  state.conversations = [conversation, ...state.conversations];
  const view = await openConversation(conversation.id, {navigate: true});
  if (view) await sendTo(view, text);
}

async function openConversation(cid, {navigate = false} = {}) {
  if (state.view && state.view.cid === cid) return state.view;
  leaveConversation();
  state.page = "conversation";
  const view = new ConversationView({api, toast, changed: conversationChanged, listChanged: scheduleListRefresh,
    approvalsChanged: refreshApprovalCount,
    kindOf: (name) => state.agents.find((a) => a.name === name)?.kind ?? null,
    titleOf: (id) => state.conversations.find((c) => c.id === id)?.title || null, forked}, cid);
  state.view = view;
  view.onStatus = () => updateComposer();
  if (navigate) history.pushState(null, "", `#/c/${encodeURIComponent(cid)}`);
  clear($("view")).append(h("div", {class: "conversation"},
    h("div", {class: "conversation-bar"}, h("span", {class: "conv-agent"}), view.conn), view.transcript));
  updateComposer();
  renderConversations();
  try {
    await view.load();
  } catch (err) {
    if (state.view === view) {
      toast(describe(err));
      location.hash = "#/";
    }
    return null;
  }
  view.toBottom();
  view.follow();
  $("composer-input").focus();
  return view;
}

/** A fork was made (`POST …/fork`): it joins the list and opens; a run it started is followed there. */
function forked(made) {
  const c = made.conversation;
  state.conversations = [c, ...state.conversations.filter((x) => x.id !== c.id)];
  renderConversations();
  toast(made.run_id ? "Forked: running from there." : "Forked.", "info");
  openConversation(c.id, {navigate: true});
}

function conversationChanged(view) {
  if (state.view !== view || !view.conversation) return;
  const c = view.conversation;
  $("conv-title").textContent = c.title || "New conversation";
  const agent = $("view").querySelector(".conv-agent");
  if (agent) agent.textContent = c.agent;
  const known = state.conversations.find((x) => x.id === c.id);
  if (!known || known.title !== c.title || known.status !== c.status || known.updated_at !== c.updated_at) {
    if (known) { // drawn at once as the page now knows it; the list's next read confirms (and reorders)
      Object.assign(known, c);
      renderConversations();
    }
    scheduleListRefresh();
  }
  refreshContext();
}

/** Draw the context panel anew, shortly. Only the answer to the latest request is drawn: one sent while
 * a run was still going may come back after the one sent when it ended, and must not undo it. */
function refreshContext() {
  clearTimeout(state.contextTimer);
  state.contextTimer = setTimeout(async () => {
    const view = state.view;
    if (!view) return;
    const ticket = ++state.contextTicket;
    const current = () => state.view === view && ticket === state.contextTicket;
    try {
      const report = await api.get(`${view.base}/context`);
      if (current()) renderContext($("context-body"), report, view.conversation);
    } catch (err) {
      if (current()) renderContext($("context-body"), null, null);
    }
  }, 150);
}

// -- approvals of every conversation --------------------------------------------------------------------

async function refreshApprovalCount() {
  try {
    const pending = (await api.get("/api/v1/approvals?status=pending")).data;
    $("approvals-count").textContent = String(pending.length);
    $("approvals-count").dataset.count = String(pending.length);
    if (state.page === "approvals") renderApprovals(pending);
  } catch {
    // shown on the next refresh
  }
}

async function showApprovals() {
  leaveConversation();
  state.page = "approvals";
  clear($("view")).append(h("div", {class: "approvals-page"}, h("h1", {}, "Pending approvals"),
    h("div", {id: "approval-list", class: "approval-list"}, h("p", {class: "muted"}, "Loading…"))));
  updateComposer();
  await loadConversations(); // the approvals name their conversations
  await refreshApprovalCount();
}

function renderApprovals(pending) {
  const list = $("approval-list");
  if (!list) return;
  const shown = new Set([...list.querySelectorAll(".approval")].map((el) => el.dataset.approvalId));
  if (!pending.length && !shown.size) {
    clear(list).append(h("p", {class: "muted empty"}, "Nothing is waiting for a decision."));
    return;
  }
  list.querySelector(".empty, p.muted")?.remove();
  for (const record of pending) {
    if (shown.has(record.approval_id)) continue;
    const conv = state.conversations.find((c) => c.id === record.conversation_id);
    const link = record.conversation_id
      ? h("a", {class: "approval-conv", href: `#/c/${encodeURIComponent(record.conversation_id)}`},
        `${record.agent || ""}: ${conv ? conv.title || "New conversation" : record.conversation_id}`)
      : h("span", {class: "approval-conv"}, `${record.agent || ""} (no conversation: decide through the API)`);
    const box = new ApprovalBox(record, {conversationLink: link, decide: async (r, approved, note) => {
      if (!r.conversation_id) throw new Error("This approval has no conversation; decide it through the API.");
      const result = await api.post(`/api/v1/chat/conversations/${encodeURIComponent(r.conversation_id)}/approvals/`
        + `${encodeURIComponent(r.approval_id)}`, {approved, note});
      setTimeout(refreshApprovalCount, 0);
      return result;
    }});
    list.append(box.el);
  }
}

// -- evaluation reports ---------------------------------------------------------------------------------

function showEvals(name) {
  leaveConversation();
  state.page = "evals";
  updateComposer();
  renderConversations();
  if (name === undefined) showEvalList($("view"), {api});
  else showEvalReport($("view"), name, {api});
}

// -- the composer ---------------------------------------------------------------------------------------

function updateComposer() {
  const input = $("composer-input");
  const send = $("send");
  const stop = $("stop");
  const view = state.view;
  $("composer").hidden = state.page === "approvals" || state.page === "evals";
  const working = Boolean(view) && (view.status === "working" || view.status === "running");
  const agent = view && view.conversation ? state.agents.find((a) => a.name === view.conversation.agent) : null;
  const steerable = working && agent?.kind !== "graph"; // a graph run takes no steers: queue only
  $("steer").hidden = !steerable; // while a run works: steer it, or queue a message for after it
  $("queue").hidden = !working;
  send.hidden = working;
  if (view) {
    const busy = view.status === "queued" || working;
    stop.hidden = view.status === "idle";
    send.disabled = busy;
    input.placeholder = view.status === "input_required" ? "The run is waiting: answer above, or reply here"
      : view.status === "queued" ? "Queued: the run starts when a limit allows it"
      : steerable ? "Working… steer it (Enter), or queue a message for after it"
      : busy ? "Working… queue a message for after it" : `Message ${view.conversation ? view.conversation.agent : ""}`;
    $("composer").dataset.status = view.status;
  } else {
    stop.hidden = true;
    send.disabled = !state.selectedAgent;
    input.placeholder = state.selectedAgent ? `Message ${state.selectedAgent} (a new conversation)`
      : "Choose an agent to start";
    $("composer").dataset.status = "idle";
  }
}

async function sendTo(view, text) {
  try {
    await view.send(text);
  } catch (err) {
    toast(describe(err));
  }
  scheduleListRefresh();
}

/** While a run works: the composer's message is steered into it (`mode: "steer"`) or queued after it. */
async function steerWith(mode) {
  const input = $("composer-input");
  const text = input.value.trim();
  if (!text || !state.view || $(mode).hidden) return;
  input.value = "";
  try {
    await state.view.steer(text, mode);
  } catch (err) {
    toast(describe(err));
  }
}

async function submit(event) {
  event.preventDefault();
  if (!$("steer").hidden || !$("queue").hidden) return steerWith($("steer").hidden ? "queue" : "steer");
  const input = $("composer-input");
  const text = input.value.trim();
  if (!text || $("send").disabled) return;
  input.value = "";
  if (state.view) await sendTo(state.view, text);
  else if (state.selectedAgent) await startConversation(state.selectedAgent, text);
}

// -- layout on small screens ----------------------------------------------------------------------------

function toggle(panel, button) {
  const open = !$(panel).classList.contains("open");
  closeDrawers();
  $(panel).classList.toggle("open", open);
  $(button).setAttribute("aria-expanded", String(open));
  if (open) $(panel).querySelector("a, button, [tabindex]")?.focus();
}

function closeDrawers() {
  for (const [panel, button] of [["sidebar", "menu-toggle"], ["context", "context-toggle"]]) {
    $(panel).classList.remove("open");
    $(button).setAttribute("aria-expanded", "false");
  }
}

function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll(".approval[data-status=pending] .expires[data-expires]")) {
    const left = timeLeft(el.dataset.expires, now);
    el.textContent = left === "expired" ? "expired" : left ? `expires in ${left}` : "";
  }
}

function wire() {
  $("signin-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("composer").addEventListener("submit", submit);
  $("composer-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.view && state.view.cancel());
  $("steer").addEventListener("click", () => steerWith("steer"));
  $("queue").addEventListener("click", () => steerWith("queue"));
  $("new-conv").addEventListener("click", () => {
    location.hash = "#/";
    if (location.hash === "#/") route();
  });
  $("more").addEventListener("click", () => loadConversations(true));
  $("menu-toggle").addEventListener("click", () => toggle("sidebar", "menu-toggle"));
  $("context-toggle").addEventListener("click", () => toggle("context", "context-toggle"));
  $("refresh-context").addEventListener("click", refreshContext);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape") closeDrawers();
  });
  window.addEventListener("hashchange", route);
  setInterval(tick, 1000);
  setInterval(refreshApprovalCount, 15000);
}

wire();
boot();
