// AG-UI conformance driver: runs one scenario against a ringlet server with @ag-ui/client's HttpAgent, whose
// runAgent applies the package's event verifier (verifyEvents) and schema to every event, and prints a JSON
// summary of each run for tests/test_conformance_agui.py to assert on.
//
//   node tests/js/agui.mjs '{"url": "http://127.0.0.1:PORT", "key": "rk_…", "scenario": "text", …}'
import { input, load, recordConsole, report } from "./modules.mjs";

const said = recordConsole();
const { HttpAgent } = await load("@ag-ui/client");
const args = input();
const headers = { Authorization: `Bearer ${args.key}` };
const THEME = {
  name: "set_theme", description: "Change the page's colour theme.",
  parameters: { type: "object", properties: { color: { type: "string" } }, required: ["color"] },
};

function agent(name, thread, messages) {
  return new HttpAgent({ url: `${args.url}/ag-ui/${name}`, headers, threadId: thread, initialMessages: messages });
}

function user(id, content) {
  return { id, role: "user", content };
}

/** One runAgent: every event it applied, and the error it failed with (a verifier's AGUIError among them). */
async function run(client, params, subscriber = {}) {
  const events = [];
  let error = null;
  try {
    await client.runAgent(params, { ...subscriber, onEvent: ({ event }) => { events.push(event); } });
  } catch (exc) {
    error = `${exc?.name ?? "Error"}: ${exc?.message ?? exc}`;
  }
  const end = events.at(-1);
  return {
    error,
    types: events.map((e) => e.type),
    text: events.filter((e) => e.type === "TEXT_MESSAGE_CONTENT").map((e) => e.delta).join(""),
    steps: events.filter((e) => e.type.startsWith("STEP_")).map((e) => [e.type, e.stepName]),
    outcome: end?.type === "RUN_FINISHED" ? (end.outcome?.type ?? "success") : end?.type ?? null,
    interrupts: (end?.outcome?.interrupts ?? []).map((i) => ({ id: i.id, reason: i.reason })),
    runId: events[0]?.runId ?? null,
    ringletRun: events[0]?.metadata?.ringlet?.run_id ?? null,
    toolResults: events.filter((e) => e.type === "TOOL_CALL_RESULT").map((e) => [e.toolCallId, e.content]),
    runError: events.filter((e) => e.type === "RUN_ERROR").map((e) => e.message),
    state: client.state,
    messages: client.messages.map((m) => m.role),
  };
}

async function native(method, path) {
  const response = await fetch(`${args.url}${path}`, { method, headers });
  return { status: response.status, body: await response.json() };
}

/** A run that is handed back (interrupt), then resumed with `answer(interrupt)` on the same agent. */
async function interrupted(name, thread, text, answer) {
  const client = agent(name, thread, [user("u0", text)]);
  const first = await run(client, { runId: `${thread}-1` });
  const pending = client.pendingInterrupts.map((i) => ({ id: i.id, reason: i.reason }));
  const second = await run(client, { runId: `${thread}-2`, resume: client.pendingInterrupts.map(answer) });
  return { runs: [first, second], pending, after: client.pendingInterrupts.length };
}

const scenarios = {
  async text() {
    return { runs: [await run(agent("talker", "c-text", [user("u0", "hi")]), { runId: "c-text-1" })] };
  },

  async tools() {
    return { runs: [await run(agent("adder", "c-tools", [user("u0", "add")]), { runId: "c-tools-1" })] };
  },

  /** A front-end tool handed back; its result sent the moment RUN_FINISHED arrives, `repeat` times. */
  async frontEnd() {
    const runs = [];
    for (let i = 0; i < args.repeat; i++) {
      const thread = `c-fe-${i}`;
      let continuation = null;
      const first = await run(agent("stylist", thread, [user("u0", "go dark")]), { runId: `${thread}-1`, tools: [THEME] }, {
        onRunFinishedEvent: ({ messages }) => {  // not awaited: the next request goes out before this stream ends
          const call = messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === "set_theme");
          const next = agent("stylist", thread, [...messages, { id: `t${i}`, role: "tool", toolCallId: call?.id, content: "ok" }]);
          continuation = run(next, { runId: `${thread}-2`, tools: [THEME] });
        },
      });
      runs.push(first, continuation === null ? { error: "no RUN_FINISHED to continue from" } : await continuation);
    }
    return { runs };
  },

  async approval() {
    return interrupted("ops", "c-approval", "deploy web",
      (i) => ({ interruptId: i.id, status: "resolved", payload: { approved: true, note: "go" } }));
  },

  async question() {
    return interrupted("painter", "c-question", "paint",
      (i) => ({ interruptId: i.id, status: "resolved", payload: { answer: "blue" } }));
  },

  async questionCancelled() {
    return interrupted("painter", "c-question-x", "paint", (i) => ({ interruptId: i.id, status: "cancelled" }));
  },

  async error() {
    return { runs: [await run(agent("broken", "c-error", [user("u0", "hi")]), { runId: "c-error-1" })] };
  },

  /** Cancelled through the native API while its tool call streams: the stream ends RUN_FINISHED cancelled. */
  async cancel() {
    let ringletRun = null;
    let cancelled = null;
    const client = agent("waiter", "c-cancel", [user("u0", "wait")]);
    const only = await run(client, { runId: "c-cancel-1" }, {
      onRunStartedEvent: ({ event }) => { ringletRun = event.metadata.ringlet.run_id; },
      onToolCallStartEvent: async () => {
        const record = (await native("GET", `/api/v1/runs/${ringletRun}`)).body;
        cancelled = (await native("POST", `/api/v1/chat/conversations/${record.conversation_id}/cancel`)).status;
      },
    });
    return { runs: [only], cancelled };
  },

  /** The client aborts mid-run (a disconnect never cancels the run); the run is then cancelled through the
   * native API, and the same agent reconnects to the thread. */
  async abort() {
    const client = agent("waiter", "c-abort", [user("u0", "wait")]);
    let ringletRun = null;
    const aborted = await run(client, { runId: "c-abort-1" }, {
      onRunStartedEvent: ({ event }) => { ringletRun = event.metadata.ringlet.run_id; },
      onToolCallStartEvent: () => { client.abortRun(); },
    });
    const record = (await native("GET", `/api/v1/runs/${ringletRun}`)).body;
    const cancelled = await native("POST", `/api/v1/chat/conversations/${record.conversation_id}/cancel`);
    for (let i = 0; i < 300; i++) {  // bounded: the cancelled run ends within seconds
      const status = (await native("GET", `/api/v1/runs/${ringletRun}`)).body.status;
      if (status !== "working") break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const again = await run(client, { runId: "c-abort-2" });
    return { runs: [aborted, again], cancelled: cancelled.status };
  },

  async graph() {
    return { runs: [await run(agent("counter", "c-graph", [user("u0", "count")]), { runId: "c-graph-1" })] };
  },

  async graphApproval() {
    return interrupted("gate", "c-gate", "books",
      (i) => ({ interruptId: i.id, status: "resolved", payload: { answer: "ship" } }));
  },

  async graphApprovalCancelled() {
    return interrupted("gate", "c-gate-x", "books", (i) => ({ interruptId: i.id, status: "cancelled" }));
  },

  async graphError() {
    return { runs: [await run(agent("failing", "c-graph-error", [user("u0", "go")]), { runId: "c-graph-error-1" })] };
  },
};

const summary = await scenarios[args.scenario]();
report({ ...summary, console: said });
