// One open conversation: its transcript, the live events of its runs, and the streams that carry them.
//
// Events come from two streams: the one `POST …/messages` returns for a run this page started, and the
// conversation stream `GET …/events`, which stays open while the conversation is shown (runs started
// elsewhere, resumed runs, and reconnection after a drop with `Last-Event-ID`). Event ids are unique and
// increasing per conversation, so each event is applied once whichever stream brings it first.

import {addCheckpoints} from "./checkpoints.js";
import {clear, fmtInt, h} from "./dom.js";
import {addForkActions, forkMark} from "./forks.js";
import {GraphDiagram} from "./graphdiagram.js";
import {renderMarkdown} from "./markdown.js";
import {ApprovalBox, GraphView, QuestionBox, ToolCard, foldable, guardrailNotice, notice} from "./widgets.js";

const ACTIVE = new Set(["queued", "working", "input_required", "running"]);
/** The keys that scroll the view up. */
const UP_KEYS = new Set(["ArrowUp", "PageUp", "Home"]);
const RECONNECT_MS = [500, 1000, 2000, 3000, 5000];

/** An assistant message: its Markdown, re-rendered (once per frame) as deltas arrive. */
class Bubble {
  constructor(messageId) {
    this.text = "";
    this.body = h("div", {class: "md"});
    this.el = h("div", {class: "msg msg-assistant", dataset: {messageId}}, this.body);
    this.pending = false;
  }

  append(delta) {
    this.text += delta;
    this.el.classList.add("streaming");
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => this.render());
  }

  set(text) {
    this.text = text;
    this.render();
  }

  render() {
    this.pending = false;
    clear(this.body).append(renderMarkdown(structured(this.text) ?? this.text));
  }

  done() {
    if (this.pending) this.render();
    this.el.classList.remove("streaming");
  }
}

/** A structured answer (typed output: the whole text is a JSON object or array) as an indented JSON code
 * block; null for any other text. */
function structured(text) {
  const trimmed = text.trim();
  if (!/^[[{]/.test(trimmed) || !/[\]}]$/.test(trimmed)) return null;
  try {
    return "```json\n" + JSON.stringify(JSON.parse(trimmed), null, 2) + "\n```";
  } catch {
    return null;
  }
}

/** Where one agent's part of a run is drawn: the run's block, or a sub-agent's box under a call. */
class Scope {
  constructor(el, path) {
    this.el = el;
    this.path = path;
    this.bubbles = new Map();
    this.graph = null;
    this.notices = new Map();
  }

  bubble(messageId) {
    if (!this.bubbles.has(messageId)) {
      const bubble = new Bubble(messageId);
      this.el.append(bubble.el);
      this.bubbles.set(messageId, bubble);
    }
    return this.bubbles.get(messageId);
  }

  finishBubbles() {
    for (const bubble of this.bubbles.values()) bubble.done();
  }

  /** A `retracted` message: its bubble goes (the next attempt may stream the same id anew). */
  dropBubble(messageId) {
    const bubble = this.bubbles.get(messageId);
    if (!bubble) return;
    bubble.el.remove();
    this.bubbles.delete(messageId);
  }
}

function textOf(content) {
  if (typeof content === "string") return content;
  return (content || []).filter((p) => p.type === "text").map((p) => p.text).join("");
}

function attachmentsOf(content) {
  if (typeof content === "string") return [];
  return (content || []).filter((p) => p.type !== "text")
    .map((p) => h("span", {class: "chip"}, p.filename || p.media_type || p.type));
}

export class ConversationView {
  /**
   * `app` gives `api`, `toast(message)`, `changed(view)` (status or usage changed: refresh the list and
   * the context panel), `listChanged()` and `approvalsChanged()`.
   */
  constructor(app, cid) {
    this.app = app;
    this.api = app.api;
    this.cid = cid;
    this.base = `/api/v1/chat/conversations/${encodeURIComponent(cid)}`;
    this.seen = new Set();
    this.maxId = null;
    this.status = "idle";
    this.conversation = null;
    this.reads = 0; // reads of the conversation sent so far (the latest one's answer wins)
    this.closed = false;
    this.abort = new AbortController();
    this.transcript = h("div", {class: "transcript", role: "log", "aria-live": "polite", "aria-relevant": "additions"});
    // answering a card (approve, deny, an option) is following the run: the view goes on down with it, even
    // when the answered card shrinks and the browser moves the view off the bottom
    this.transcript.addEventListener("click", (event) => {
      if (event.target.closest(".approval button, .question button")) this.toBottom();
    });
    this.conn = h("span", {class: "conn", dataset: {state: "connecting"}, title: "Event stream"}, "connecting");
    this.pinned = true; // the reader is at the bottom: new content keeps it in view
    this.scrolling = false;
    // whatever changes the transcript's height (an event, Markdown drawn, the fork actions added once a run is
    // stored, a card folded) is new content to follow: not only what an event draws
    this.resized = new ResizeObserver(() => this.keepInView());
    this.resized.observe(this.transcript);
    this.reset();
  }

  reset() {
    clear(this.transcript);
    this.runs = new Map();
    this.started = new Set();
    this.cards = new Map();
    this.approvals = new Map();
    this.questions = new Map();
    this.reruns = []; // a fork's "Run again": its copied calls, each group drawn once for the run that runs them
  }

  // -- opening and the transcript -------------------------------------------------------------------

  async open() {
    await this.load();
    this.follow();
  }

  async load() {
    const ticket = ++this.reads;
    const detail = await this.api.get(`${this.base}?messages_limit=1000`);
    let decided = [];
    try {
      decided = (await this.api.get(`${this.base}/approvals`)).data;
    } catch {
      decided = [];
    }
    const follow = this.pinned; // drawn anew: where the reader was (at the bottom, or up) still holds
    const top = this.scroller() ? this.scrollEl.scrollTop : 0;
    this.reset();
    this.applied = 0;
    this.renderTranscript(detail, decided);
    if (follow) this.toBottom();
    else if (this.scrollEl) this.scrollEl.scrollTop = top;
    this.loadedStatus = detail.conversation.status;
    if (ticket === this.reads) this.setConversation(detail.conversation);
    this.setStatus(detail.conversation.status);
    this.endStoredRuns(detail);
  }

  /** The stored transcript has no `message_end`: each finished run's record (`GET /api/v1/runs/{id}`) gives
   * what the live view drew at its end, its usage line and how it ended, unless its events drew them since. */
  endStoredRuns(detail) {
    const ids = new Set(detail.messages.filter((m) => m.run_id && m.role !== "user").map((m) => m.run_id));
    for (const runId of ids) {
      const scope = this.runs.get(runId);
      if (!scope) continue;
      this.api.get(`/api/v1/runs/${encodeURIComponent(runId)}`).then((run) => {
        if (this.closed || this.runs.get(runId) !== scope || this.started.has(runId) || !scope.el.isConnected) return;
        if (ACTIVE.has(run.status) || !run.ended_at || run.kind === "direct") return; // its events will end it
        this.drawEnd(scope, run.finish_reason, run.usage);
        this.keepInView();
      }, () => {});
    }
  }

  setConversation(conversation) {
    this.conversation = conversation;
    this.app.changed(this);
  }

  renderTranscript(detail, approvals) {
    const mark = forkMark(detail.conversation, (id) => (this.app.titleOf ? this.app.titleOf(id) : null));
    if (mark) this.transcript.append(mark);
    for (const m of detail.messages) this.renderMessage(m);
    for (const record of approvals) this.showApproval(record, record.run_id, [], null);
    for (const q of detail.pending.questions) this.showQuestion(q, q.run_id, [], null);
    if (!detail.messages.length) {
      const agent = detail.conversation.agent;
      const empty = h("div", {class: "empty"}, `Say something to ${agent}.`);
      this.transcript.append(empty);
      if (this.app.kindOf && this.app.kindOf(agent) === "graph") { // a preview of the graph its runs follow
        this.diagramOf(agent).then((text) => {
          if (text && empty.isConnected) empty.append(new GraphDiagram(text, {title: `The ${agent} graph`}).el);
        });
      }
    }
  }

  runBlock(runId) {
    if (!this.runs.has(runId)) {
      const el = h("div", {class: "run", dataset: {runId}});
      this.transcript.append(el);
      this.runs.set(runId, new Scope(el, []));
    }
    return this.runs.get(runId);
  }

  renderMessage(m) {
    if (m.role === "user") {
      this.transcript.querySelector(".empty")?.remove();
      const source = m.metadata && m.metadata.source;
      const el = h("div", {class: "msg msg-user", dataset: {messageId: m.id}},
        source && source !== "chat" ? h("span", {class: "chip source"}, source) : null,
        h("div", {class: "user-text"}, textOf(m.content)), attachmentsOf(m.content));
      const steered = m.metadata && m.metadata.steer_id && m.run_id; // taken by a working run: inside it
      (steered ? this.runBlock(m.run_id).el : this.transcript).append(el);
      addForkActions(this, el, m);
      return;
    }
    if (m.role === "system") return;
    const scope = this.runBlock(m.run_id || "_");
    if (m.role === "assistant") {
      const text = textOf(m.content);
      if (text) {
        scope.bubble(m.id).set(text);
        addForkActions(this, scope.bubble(m.id).el, m);
      }
      if (m.metadata && m.metadata.interrupted) {
        scope.el.append(h("div", {class: "notice notice-warning"}, "This answer was interrupted."));
      }
      for (const call of m.tool_calls || []) {
        const card = this.card(m.run_id, [], call.id, call.name, null, scope);
        card.setArgs(call.raw_arguments || call.arguments);
        card.setState("waiting", "not run yet");
      }
      if (!m.run_id && m.metadata && Array.isArray(m.metadata.rerun_calls)) this.rerunsOf(m);
    } else if (m.role === "tool") {
      const card = this.card(m.run_id, [], m.tool_call_id, m.name, null, scope);
      const meta = m.metadata || {};
      let error = null;
      if (meta.is_error) {
        try {
          error = JSON.parse(textOf(m.content)).error || null;
        } catch {
          error = null;
        }
      }
      card.finish({result: textOf(m.content), error, isError: Boolean(meta.is_error), durationMs: meta.duration_ms,
        truncated: meta.truncated, policy: meta.policy});
      addForkActions(this, card.el, m);
    } else if (m.role === "error") {
      scope.el.append(h("div", {class: "run-error", role: "alert"}, textOf(m.content)));
    }
  }

  key(runId, path, toolCallId) {
    if (runId && runId !== "_" && !path.length) { // the run that runs a fork's copied call again: that call's card
      const group = this.reruns.find((g) => g.keys.has(toolCallId) && (g.run === runId || (!g.run && !g.before.has(runId))));
      if (group) {
        group.run = runId;
        return group.keys.get(toolCallId);
      }
    }
    return `${runId}|${path.join("/")}|${toolCallId}`;
  }

  /** A fork's copy of a call to run again (`rerun_calls`) is stored outside any run; the first run drawn after it
   * runs it. That run's events and its stored result land on the copy's card: one card, not a "not run yet" card
   * above the result. */
  rerunsOf(m) {
    const keys = new Map(m.metadata.rerun_calls.map((id) => [id, this.key(m.run_id, [], id)]));
    this.reruns.push({keys, run: null, before: new Set(this.runs.keys())});
  }

  card(runId, path, toolCallId, name, connector, scope) {
    const key = this.key(runId, path, toolCallId);
    if (!this.cards.has(key)) {
      const card = new ToolCard({toolCallId, name: name || "tool", connector});
      (scope || this.runBlock(runId)).el.append(card.el);
      this.cards.set(key, card);
    }
    return this.cards.get(key);
  }

  /** A graph agent's diagram (its Mermaid text), fetched once; null when it has none. */
  diagramOf(agent) {
    if (!this.diagrams) this.diagrams = new Map();
    if (!this.diagrams.has(agent)) {
      this.diagrams.set(agent, this.api.get(`/api/v1/agents/${encodeURIComponent(agent)}/graph`)
        .then((body) => (body && typeof body.mermaid === "string" ? body.mermaid : null), () => null));
    }
    return this.diagrams.get(agent);
  }

  // -- streams ---------------------------------------------------------------------------------------

  /** Keep the conversation stream open until the view closes, reconnecting after the last event seen. */
  async follow() {
    let failures = 0;
    while (!this.closed) {
      try {
        await this.api.stream("GET", `${this.base}/events`, {
          lastEventId: this.maxId, signal: this.abort.signal,
          onOpen: () => {
            failures = 0;
            this.setConn("live");
            this.verify();
          },
          onEvent: (e) => this.handle(e),
        });
      } catch (err) {
        if (this.closed) return;
        if (err.status && [401, 403, 404].includes(err.status)) {
          this.setConn("closed");
          if (err.status !== 401) this.app.toast(err.message);
          return;
        }
      }
      if (this.closed) return;
      this.setConn("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS[Math.min(failures++, RECONNECT_MS.length - 1)]));
    }
  }

  /** After (re)connecting: if the run the transcript showed as active ended while no stream was open,
   * no event will tell; the stored transcript has what was missed. */
  async verify() {
    if (!ACTIVE.has(this.loadedStatus) || this.applied || this.sending) return;
    try {
      const detail = await this.api.get(`${this.base}?messages_limit=1`);
      if (!ACTIVE.has(detail.conversation.status) && !this.applied) await this.load();
    } catch {
      // the next event or reconnection tries again
    }
  }

  setConn(state) {
    this.conn.dataset.state = state;
    this.conn.textContent = state;
  }

  close() {
    this.closed = true;
    this.abort.abort();
    this.resized.disconnect();
  }

  /** Send a user message and follow the run it starts. */
  async send(content) {
    this.transcript.querySelector(".empty")?.remove();
    const mine = h("div", {class: "msg msg-user sending"}, h("div", {class: "user-text"}, content));
    this.transcript.append(mine);
    this.toBottom();
    this.setStatus("queued"); // until the run starts (message_start): a limit may hold it in its queue
    this.sending = true;
    try {
      await this.api.stream("POST", `${this.base}/messages`, {body: {content}, signal: this.abort.signal,
        onOpen: () => {
          mine.classList.remove("sending");
          this.app.listChanged(); // the first message gives the conversation its title
          this.refreshConversation();
        },
        onEvent: (e) => this.handle(e)});
    } catch (err) {
      if (this.closed || !err.status) return; // a dropped stream: the conversation stream carries on
      mine.classList.add("failed");
      mine.append(h("div", {class: "form-error", role: "alert"}, err.message));
      this.setStatus(this.conversation ? this.conversation.status : "idle");
      throw err;
    } finally {
      this.sending = false;
    }
  }

  /** While a run works: send it a message it takes at its next step (`mode: "steer"`), or one that runs
   * after it (`"queue"`). Answered at once; its events (`steer_queued`, `steer_taken`, the next run's
   * `message_start`) say what became of it. With no run working any more, it starts one as usual. */
  async steer(content, mode) {
    const mine = this.steerBubble(null, content, mode);
    this.toBottom();
    try {
      const sent = await this.api.post(`${this.base}/messages`, {content, mode});
      if (!sent || !sent.message_id) { // no run worked: it started one, which the conversation stream shows
        mine.querySelector(".steer-state")?.remove();
        mine.classList.remove("steer");
        return;
      }
      const known = this.transcript.querySelector(`.msg-user[data-message-id="${CSS.escape(sent.message_id)}"]`);
      if (known && known !== mine) { // its event was here first
        mine.remove();
        if (known.dataset.state !== "taken") known.dataset.nextRun = sent.next_run_id;
        return;
      }
      mine.dataset.messageId = sent.message_id;
      this.markSteer(mine, sent.mode === "queue" ? "next" : "queued", sent.next_run_id);
    } catch (err) {
      mine.classList.add("failed");
      mine.append(h("div", {class: "form-error", role: "alert"}, err.message));
      throw err;
    }
  }

  /** A message sent while a run worked, shown with what became of it (`data-state`). */
  steerBubble(messageId, content, mode) {
    this.transcript.querySelector(".empty")?.remove();
    const el = h("div", {class: "msg msg-user steer", dataset: messageId ? {messageId} : {}},
      h("div", {class: "user-text"}, content), h("span", {class: "steer-state"}));
    this.markSteer(el, mode === "queue" ? "next" : "queued");
    this.transcript.append(el);
    return el;
  }

  markSteer(el, state, runId) {
    el.dataset.state = state;
    if (runId) el.dataset.nextRun = runId; // a steer the run does not take starts that run: it is then its prompt
    if (state === "taken") delete el.dataset.nextRun;
    const label = {queued: "steer queued: the run takes it at its next step", taken: "taken by the run",
      next: "queued: runs once this run ends"}[state];
    const chip = el.querySelector(".steer-state");
    if (chip) chip.textContent = label;
  }

  async cancel() {
    try {
      await this.api.post(`${this.base}/cancel`);
    } catch (err) {
      if (err.code !== "run_not_active") this.app.toast(err.message);
    }
  }

  // -- events ----------------------------------------------------------------------------------------

  handle({id, event, data}) {
    if (event === "ping" || this.closed) return;
    if (id !== null && id !== undefined) {
      if (this.seen.has(id)) return;
      this.seen.add(id);
      this.maxId = this.maxId === null ? id : Math.max(this.maxId, id);
    }
    this.applied++;
    try {
      this.apply(event, data);
    } catch (err) {
      console.error("ringlet: could not show event", event, data, err);
    }
    this.keepInView();
  }

  // -- following the conversation down ---------------------------------------------------------------

  /** The element that scrolls the transcript (the page's view), once it is on the page. */
  scroller() {
    if (!this.scrollEl && this.transcript.isConnected) {
      this.scrollEl = this.transcript.closest(".view");
      if (this.scrollEl) this.watchReader(this.scrollEl);
    }
    return this.scrollEl;
  }

  /** Only the reader stops the view following: a wheel, a key, a finger or the scroll bar moving it up. A scroll
   * event alone cannot say whose it was: it is sent a frame after the move, when a card that shrank (the browser
   * moved the view up) may have been followed by new content already, and the view would look scrolled up. */
  watchReader(el) {
    const options = {passive: true, signal: this.abort.signal}; // removed when the view closes
    const up = () => {
      this.pinned = false;
    };
    let touchY = null;
    let dragging = false;
    el.addEventListener("wheel", (event) => event.deltaY < 0 && up(), options);
    el.addEventListener("touchstart", (event) => {
      touchY = event.touches[0].clientY;
    }, options);
    el.addEventListener("touchmove", (event) => event.touches[0].clientY > touchY && up(), options);
    el.addEventListener("pointerdown", (event) => {
      dragging = event.target === el; // on the scroll bar (or the view's margin), not on its content
    }, options);
    window.addEventListener("pointerup", () => {
      dragging = false;
    }, options);
    document.addEventListener("keydown", (event) => {
      const mine = event.target === document.body || el.contains(event.target);
      if (mine && !event.target.isContentEditable && !/^(INPUT|TEXTAREA|SELECT)$/.test(event.target.tagName)
        && (UP_KEYS.has(event.key) || (event.key === " " && event.shiftKey))) up();
    }, options);
    el.addEventListener("scroll", () => {
      const bottom = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
      if (bottom) this.pinned = true; // back at the bottom (or nearly): the view follows again
      else if (dragging) up();
    }, options);
  }

  /** After new content: back to the bottom (once per frame, after the answer's Markdown is drawn), and a
   * pending approval or question in view, unless the reader has scrolled up. */
  keepInView() {
    if (!this.pinned || !this.scroller()) return;
    this.asked = true; // content came after a scroll already on its way: that one looks again
    if (this.scrolling) return;
    this.scrolling = true;
    this.asked = false;
    requestAnimationFrame(() => requestAnimationFrame(() => {
      this.scrolling = false;
      if (this.asked) this.keepInView();
      const el = this.scroller();
      if (!el || !this.pinned || this.closed) return;
      el.scrollTop = el.scrollHeight;
      const waiting = this.status === "input_required" // the run waits: its first open card in view
        && this.transcript.querySelector(".approval[data-status=pending], .question[data-status=pending]");
      if (waiting) waiting.scrollIntoView({block: "nearest"});
    }));
  }

  /** To the bottom now (the reader sent a message, or opened the conversation). */
  toBottom() {
    this.pinned = true;
    const el = this.scroller();
    if (el) el.scrollTop = el.scrollHeight;
    this.keepInView();
  }

  /** The scope an event is drawn in: its run's block, or the box of the sub-agent under its call. */
  scopeOf(ev) {
    const run = this.runBlock(ev.run_id);
    if (!ev.agent_path) return run;
    const path = ev.agent_path.slice(1);
    const parent = this.cards.get(this.key(ev.run_id, path.slice(0, -1), ev.parent_tool_call_id));
    const agent = ev.agent_path[ev.agent_path.length - 1];
    const key = `${ev.run_id}|${path.join("/")}|${ev.parent_tool_call_id}`;
    if (!run.nested) run.nested = new Map();
    if (!run.nested.has(key)) {
      let body;
      let status;
      if (parent) {
        ({body, status} = parent.child(agent));
      } else { // its call is not on the page (joined mid-run): a box of its own
        status = h("span", {class: "subagent-status"}, "working");
        body = h("div", {class: "subagent-body"});
        run.el.append(h("div", {class: "subagent", dataset: {agent}},
          h("div", {class: "subagent-head"}, "↳ sub-agent ", h("strong", {}, agent), " ", status), body));
      }
      const scope = new Scope(body, path);
      scope.status = status;
      run.nested.set(key, scope);
    }
    return run.nested.get(key);
  }

  apply(event, ev) {
    const nested = Boolean(ev.agent_path);
    if (event === "message_start" && !nested) {
      for (const el of this.transcript.querySelectorAll(`.msg-user.steer[data-next-run="${CSS.escape(ev.run_id)}"]`)) {
        el.classList.remove("steer"); // the queued message started its run
        el.querySelector(".steer-state")?.remove();
      }
      this.startRun(ev.run_id);
      this.setStatus("working");
      return;
    }
    if (event === "error" && ev.code === "replay_unavailable") {
      this.app.toast("Some events are past retention: the transcript was reloaded.");
      this.load();
      return;
    }
    const scope = this.scopeOf(ev);
    const path = nested ? ev.agent_path.slice(1) : [];
    switch (event) {
      case "message_start":
        break;
      case "content_delta":
        scope.bubble(ev.message_id).append(ev.delta);
        break;
      case "tool_call_start": {
        scope.finishBubbles();
        const card = this.card(ev.run_id, path, ev.tool_call_id, ev.name, ev.connector, scope);
        card.setArgs(""); // its arguments follow (a fork's call run again had them drawn already)
        card.setState("running", "running");
        break;
      }
      case "tool_call_delta":
        this.card(ev.run_id, path, ev.tool_call_id, null, null, scope).appendArgs(ev.args_delta);
        break;
      case "tool_result":
        this.card(ev.run_id, path, ev.tool_call_id, ev.name, null, scope).finish({
          result: ev.result, error: ev.error, isError: ev.is_error, durationMs: ev.duration_ms,
          truncated: ev.truncated, policy: ev.policy});
        break;
      case "retracted": // an abandoned model attempt: its text and its (settled) calls are withdrawn
        if (ev.message_id) scope.dropBubble(ev.message_id);
        for (const callId of ev.tool_call_ids || []) {
          const key = this.key(ev.run_id, path, callId);
          const card = this.cards.get(key);
          if (card) card.el.remove();
          this.cards.delete(key);
        }
        break;
      case "approval_required":
        this.showApproval({...ev, status: "pending"}, ev.run_id, path, scope);
        this.app.approvalsChanged();
        break;
      case "question":
        this.showQuestion({...ev, status: "pending"}, ev.run_id, path, scope);
        break;
      case "notification":
        this.showNotice(ev, scope);
        break;
      case "status":
        if (nested) {
          if (scope.status) scope.status.textContent = ev.state;
        } else {
          this.setStatus(ev.state);
          if (ev.state === "input_required") this.refreshConversation(); // usage so far, the list's status
        }
        break;
      case "guardrail": // a decision on a text of the run; a block's error follows
        scope.finishBubbles();
        scope.el.append(guardrailNotice(ev));
        break;
      case "steer_queued":
        if (!this.transcript.querySelector(`.msg-user[data-message-id="${CSS.escape(ev.message_id)}"]`)) {
          this.steerBubble(ev.message_id, ev.text, "steer"); // sent from elsewhere
        }
        break;
      case "steer_taken": { // it joins the run where the run took it
        const el = this.transcript.querySelector(`.msg-user[data-message-id="${CSS.escape(ev.message_id)}"]`);
        if (el) {
          scope.finishBubbles();
          scope.el.append(el);
          this.markSteer(el, "taken");
        }
        break;
      }
      case "compaction":
        scope.el.append(h("div", {class: "notice notice-info compaction"},
          h("span", {class: "notice-level"}, "context"),
          `Compacted ${ev.removed_messages} messages (${ev.method}): ${fmtInt(ev.tokens_before)} → ${fmtInt(ev.tokens_after)} tokens`));
        this.app.changed(this);
        break;
      case "node_start":
      case "node_end": {
        if (!scope.graph) {
          const agent = nested ? ev.agent_path[ev.agent_path.length - 1] : this.conversation && this.conversation.agent;
          scope.graph = new GraphView(agent ? this.diagramOf(agent) : null);
          scope.el.append(scope.graph.el);
        }
        if (event === "node_start") scope.graph.start(ev);
        else scope.graph.end(ev);
        break;
      }
      case "error":
        scope.el.append(h("div", {class: "run-error", role: "alert", dataset: {code: ev.code}},
          h("strong", {}, ev.code), ": ", ev.message));
        break;
      case "message_end":
        scope.finishBubbles();
        if (nested) {
          if (scope.status) scope.status.textContent = ev.finish_reason === "end_turn" ? "done" : ev.finish_reason;
        } else {
          this.endRun(ev, scope);
        }
        break;
      default:
        break;
    }
  }

  /** A run's start: when its block came from the stored transcript, its events now draw it anew. */
  startRun(runId) {
    if (this.started.has(runId)) return;
    this.started.add(runId);
    const scope = this.runs.get(runId);
    if (scope) {
      for (const [key] of this.cards) if (key.startsWith(`${runId}|`)) this.cards.delete(key);
      clear(scope.el);
      scope.bubbles.clear();
      scope.nested = null;
      scope.graph = null;
    } else {
      this.runBlock(runId);
    }
  }

  endRun(ev, scope) {
    for (const card of this.cards.values()) {
      if (card.el.dataset.state === "running" && scope.el.contains(card.el)) card.setState("error", "not finished");
    }
    this.drawEnd(scope, ev.finish_reason, ev.usage);
    this.setStatus("idle");
    if (!this.started.has(ev.run_id)) {
      this.load(); // joined mid-run (a resumed run): the stored transcript has all of it
      return;
    }
    this.refreshConversation();
    this.nameDrawn();
  }

  /** After a run drawn live: what it drew gets its stored message's fork actions (the stored ids of the
   * answers are the ids their events carried; the user messages sent from here are the last ones stored). */
  async nameDrawn() {
    let detail;
    try {
      detail = await this.api.get(`${this.base}?messages_limit=1000`);
    } catch {
      return;
    }
    if (this.closed) return;
    const named = new Set([...this.transcript.querySelectorAll(".msg-user[data-message-id]")]
      .map((el) => el.dataset.messageId));
    const unnamed = [...this.transcript.querySelectorAll(".msg-user:not([data-message-id]):not(.failed)")];
    const users = detail.messages.filter((m) => m.role === "user" && !named.has(m.id));
    unnamed.forEach((el, i) => {
      const m = users[users.length - unnamed.length + i];
      if (!m) return;
      el.dataset.messageId = m.id;
      addForkActions(this, el, m);
    });
    for (const m of detail.messages) {
      if (m.role === "assistant" && textOf(m.content)) {
        addForkActions(this, this.transcript.querySelector(`.msg-assistant[data-message-id="${CSS.escape(m.id)}"]`), m);
      } else if (m.role === "tool") {
        const card = this.cards.get(this.key(m.run_id, [], m.tool_call_id));
        if (card) addForkActions(this, card.el, m);
      }
    }
  }

  /** How a run ended (unless with its answer) and what it used: under its block, live or reloaded. */
  drawEnd(scope, finishReason, usage) {
    if (finishReason && finishReason !== "end_turn") {
      const text = {cancelled: "Stopped.", max_iterations: "Stopped: the iteration limit was reached.",
        empty_response: "The model gave no answer.", length: "The answer was cut at the model's token limit.",
        error: "The run failed."}[finishReason] || finishReason;
      scope.el.append(h("div", {class: `run-end run-end-${finishReason}`, role: "status"}, text));
    }
    if (usage) {
      const cached = usage.cache_read_tokens ? ` (${fmtInt(usage.cache_read_tokens)} cached)` : "";
      scope.el.append(h("div", {class: "run-usage"},
        `${fmtInt(usage.in_tokens)} in${cached} · ${fmtInt(usage.out_tokens)} out`));
    }
    addCheckpoints(this, scope); // a graph run's: fork it from a checkpoint, its state edited
  }

  /** Read the conversation (status, usage) again. Only the latest read counts: an answer to one sent
   * while a run was going can arrive after the one sent when it ended, and must not undo it. */
  async refreshConversation() {
    const ticket = ++this.reads;
    try {
      const detail = await this.api.get(`${this.base}?messages_limit=1`);
      if (ticket === this.reads) this.setConversation(detail.conversation);
    } catch {
      // shown again on the next change
    }
  }

  setStatus(state) {
    this.status = state === "completed" || state === "failed" || state === "canceled" ? "idle" : state;
    if (this.onStatus) this.onStatus(this.status);
  }

  // -- approvals, questions, notices -----------------------------------------------------------------

  showApproval(record, runId, path, scope) {
    if (this.approvals.has(record.approval_id)) {
      if (record.status !== "pending") this.approvals.get(record.approval_id).showDecided(record);
      return;
    }
    if (record.status !== "pending" && !this.cards.has(this.key(runId, path, record.tool_call_id))) return;
    const box = new ApprovalBox(record, {decide: (r, approved, note) => this.decide(r, approved, note)});
    this.approvals.set(record.approval_id, box);
    const card = this.cards.get(this.key(runId, path, record.tool_call_id));
    if (card) {
      card.gate.append(box.el);
      card.foldArgs(); // the approval shows them
      if (record.status === "pending") card.setState("waiting", "waiting for approval");
    } else {
      (scope || this.runBlock(runId)).el.append(box.el);
    }
  }

  async decide(record, approved, note) {
    const result = await this.api.post(`${this.base}/approvals/${encodeURIComponent(record.approval_id)}`,
      {approved, note});
    this.app.approvalsChanged();
    return result;
  }

  showQuestion(q, runId, path, scope) {
    if (this.questions.has(q.question_id)) return;
    const box = new QuestionBox(q, {answer: (question, answer) => this.api.post(
      `${this.base}/questions/${encodeURIComponent(question.question_id)}`, {answer})});
    this.questions.set(q.question_id, box);
    const card = q.tool_call_id ? this.cards.get(this.key(runId, path, q.tool_call_id)) : null;
    if (card) {
      card.gate.append(box.el);
      card.foldArgs();
      card.setState("waiting", "waiting for an answer");
    } else {
      (scope || this.runBlock(runId)).el.append(box.el);
    }
  }

  showNotice(ev, scope) {
    const el = notice(ev);
    const key = `${ev.source}|${ev.title}`;
    const prior = ev.level === "progress" ? scope.notices.get(key) : null;
    if (prior && prior.isConnected) prior.replaceWith(el);
    else scope.el.append(el);
    if (ev.level === "progress") scope.notices.set(key, el);
  }
}

export {foldable};
