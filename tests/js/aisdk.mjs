// AI SDK conformance driver: runs one scenario against a ringlet server with the `ai` package's own chat
// client: `AbstractChat` (what `useChat` wraps) over `DefaultChatTransport`, which parses the stream with the
// package's chunk schema (`uiMessageChunkSchema`) and builds the assistant message with its stream processor.
// It prints a JSON summary for tests/test_conformance_aisdk.py to assert on.
//
//   node tests/js/aisdk.mjs '{"url": "http://127.0.0.1:PORT", "key": "rk_…", "scenario": "text"}'
import { input, load, recordConsole, report } from "./modules.mjs";

const said = recordConsole();
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } = await load("ai");
const args = input();
const headers = { Authorization: `Bearer ${args.key}` };

/** The chat's state, as a UI framework keeps it (`@ai-sdk/react` keeps it in React state). */
class State {
  constructor() { this.status = "ready"; this.error = undefined; this.messages = []; }
  pushMessage(m) { this.messages = [...this.messages, m]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; }
  snapshot(thing) { return structuredClone(thing); }
}

/** Every chunk the transport parsed (and validated), and each response's status and stream header. */
class Recording extends DefaultChatTransport {
  constructor(options, log) {
    super({ ...options, fetch: async (url, init) => {
      const response = await fetch(url, init);
      log.responses.push({ status: response.status, stream: response.headers.get("x-vercel-ai-ui-message-stream") });
      return response;
    } });
    this.log = log;
  }
  processResponseStream(stream) {
    const chunks = this.log.chunks;
    return super.processResponseStream(stream).pipeThrough(new TransformStream({
      transform: (chunk, controller) => { chunks.push(chunk); this.log.onChunk?.(chunk); controller.enqueue(chunk); },
    }));
  }
}

class Chat extends AbstractChat {
  constructor(agent, id, options = {}) {
    const log = { chunks: [], responses: [] };
    const transport = new Recording({ api: `${args.url}/ai-sdk/${agent}`, headers }, log);
    super({ id, transport, state: new State(), onFinish: (e) => this.finished?.(e), onError: () => {}, ...options });
    this.log = log;
  }
  /** Do `action`, and wait for the request it sends (or one it triggers automatically) to finish. */
  async turn(action) {
    const done = new Promise((resolve) => { this.finished = resolve; });
    const before = this.log.chunks.length;
    await action();
    const finish = await done;
    return { types: this.log.chunks.slice(before).map((c) => c.type), finishReason: finish.finishReason ?? null,
             isError: finish.isError, isAbort: finish.isAbort };
  }
  summary(turns) {
    const last = this.messages.at(-1);
    return {
      turns, status: this.status, error: this.error?.message ?? null, responses: this.log.responses,
      roles: this.messages.map((m) => m.role), metadata: last?.metadata ?? null,
      text: (last?.parts ?? []).filter((p) => p.type === "text").map((p) => p.text).join(""),
      tools: (last?.parts ?? []).filter((p) => p.type.startsWith("tool-") || p.type === "dynamic-tool").map((p) => ({
        type: p.type, toolCallId: p.toolCallId, state: p.state, input: p.input ?? null, output: p.output ?? null,
        errorText: p.errorText ?? null, approval: p.approval ?? null })),
      steps: (last?.parts ?? []).filter((p) => p.type === "step-start").length,
    };
  }
}

function say(chat, text) {
  return chat.turn(() => chat.sendMessage({ text }));
}

/** The first pending approval of the last message, answered; the chat sends itself when all are answered. */
function respond(chat, approved, reason) {
  const part = chat.messages.at(-1).parts.find((p) => p.state === "approval-requested");
  return chat.turn(() => chat.addToolApprovalResponse({ id: part.approval.id, approved, reason }));
}

async function native(method, path) {
  const response = await fetch(`${args.url}${path}`, { method, headers });
  return { status: response.status, body: await response.json() };
}

const auto = { sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses };

const scenarios = {
  async text() {
    const chat = new Chat("talker", "s-text");
    return chat.summary([await say(chat, "hi"), await say(chat, "again")]);
  },

  async tools() {
    const chat = new Chat("adder", "s-tools");
    return chat.summary([await say(chat, "add")]);
  },

  async approval() {
    const chat = new Chat("ops", "s-approval", auto);
    const first = await say(chat, "deploy web");
    const asked = chat.summary([]);
    return { asked, ...chat.summary([first, await respond(chat, true, "go")]) };
  },

  async denial() {
    const chat = new Chat("ops", "s-denial", auto);
    const first = await say(chat, "deploy web");
    return chat.summary([first, await respond(chat, false, "not today")]);
  },

  async question() {
    const chat = new Chat("painter", "s-question", auto);
    const first = await say(chat, "paint");
    const asked = chat.summary([]);
    return { asked, ...chat.summary([first, await respond(chat, true, "blue")]) };
  },

  async error() {
    const chat = new Chat("broken", "s-error");
    return chat.summary([await say(chat, "hi")]);
  },

  /** The client stops while the tool call streams: its fetch is aborted, and the run is cancelled. */
  async cancel() {
    const chat = new Chat("waiter", "s-cancel");
    const seen = new Promise((resolve) => {
      chat.log.onChunk = (chunk) => { if (chunk.type === "tool-input-available") resolve(); };
    });
    const turn = chat.turn(() => chat.sendMessage({ text: "wait" }));
    await seen;
    await chat.stop();
    const only = await turn;
    const runId = chat.messages.at(-1).metadata.ringlet.run_id;
    let run = null;
    for (let i = 0; i < 300; i++) {  // bounded: the cancelled run ends within seconds
      run = (await native("GET", `/api/v1/runs/${runId}`)).body;
      if (run.status !== "working") break;
      await new Promise((r) => setTimeout(r, 100));
    }
    return { ...chat.summary([only]), run: { id: runId, status: run.status } };
  },
};

const summary = await scenarios[args.scenario]();
report({ ...summary, console: said });
