// A2A conformance driver: runs one scenario against a ringlet server with @a2a-js/sdk's client (JSON-RPC,
// from the agent's card) and prints a JSON summary for tests/test_conformance_a2a.py to assert on. Every
// stream's events are kept in order, so the test can hold them to A2A 1.0's rule: a stream opens with the
// Task (or a Message), which the client itself does not check.
//
//   node tests/js/a2a.mjs '{"url": "http://127.0.0.1:PORT", "key": "rk_…", "scenario": "stream", …}'
import { input, load, recordConsole, report } from "./modules.mjs";

const said = recordConsole();
const sdk = await load("@a2a-js/sdk");
const { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } =
  await load("@a2a-js/sdk", "./client");
const { Role, TaskState } = sdk;
const args = input();

/** fetch with the key on every request (the card's and the calls'). */
function fetchImpl(url, init = {}) {
  const headers = new Headers(init.headers);
  headers.set("Authorization", `Bearer ${args.key}`);
  return fetch(url, { ...init, headers });
}

const options = ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
  transports: [new JsonRpcTransportFactory({ fetchImpl })],
  cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
});
const factory = new ClientFactory(options);

function client(agent) {
  return factory.createFromUrl(`${args.url}/a2a/${agent}/`);  // the card is relative to it
}

function message(text, { taskId = "", contextId = "", data } = {}) {
  const parts = text ? [{ content: { $case: "text", value: text }, metadata: undefined, filename: "", mediaType: "" }] : [];
  if (data !== undefined) parts.push({ content: { $case: "data", value: data }, metadata: undefined, filename: "", mediaType: "" });
  return {
    message: {
      messageId: crypto.randomUUID(), contextId, taskId, role: Role.ROLE_USER, parts,
      metadata: undefined, extensions: [], referenceTaskIds: [],
    },
    configuration: undefined, metadata: undefined, tenant: "",
  };
}

const state = (s) => TaskState[s] ?? String(s);
const textOf = (parts) => (parts ?? []).filter((p) => p.content?.$case === "text").map((p) => p.content.value).join("");
const dataOf = (parts) => (parts ?? []).filter((p) => p.content?.$case === "data").map((p) => p.content.value);

function task(t) {
  return {
    id: t.id, contextId: t.contextId, state: state(t.status?.state),
    status: textOf(t.status?.message?.parts), asks: dataOf(t.status?.message?.parts),
    artifacts: (t.artifacts ?? []).map((a) => textOf(a.parts)), history: (t.history ?? []).map((m) => textOf(m.parts)),
  };
}

function event(e) {
  const { $case: kind, value } = e.payload ?? {};
  if (kind === "task") return { kind, ...task(value) };
  if (kind === "statusUpdate") {
    return { kind, taskId: value.taskId, state: state(value.status?.state), status: textOf(value.status?.message?.parts),
             asks: dataOf(value.status?.message?.parts) };
  }
  if (kind === "artifactUpdate") return { kind, taskId: value.taskId, text: textOf(value.artifact?.parts), append: value.append };
  return { kind: kind ?? "none", text: textOf(value?.parts) };
}

/** A stream's events, in order; `each(event)` may act on one as it arrives. */
async function streamed(agentClient, request, each = async () => {}) {
  const events = [];
  let error = null;
  try {
    for await (const e of agentClient.sendMessageStream(request)) {
      events.push(event(e));
      await each(events.at(-1));
    }
  } catch (exc) {
    error = `${exc?.name ?? "Error"}: ${exc?.message ?? exc}`;
  }
  return { events, error };
}

const scenarios = {
  /** Send (not streamed), then get and list the task, then continue its context. */
  async send() {
    const echo = await client("echo");
    const sent = await echo.sendMessage(message("hello"));
    const first = task(sent);
    const got = task(await echo.getTask({ id: sent.id, historyLength: undefined, tenant: "" }));
    const again = task(await echo.sendMessage(message("again", { contextId: sent.contextId })));
    const listed = await echo.listTasks({ contextId: sent.contextId, tenant: "", status: 0, pageSize: undefined,
                                          pageToken: "", historyLength: undefined, statusTimestampAfter: undefined,
                                          includeArtifacts: undefined });
    return { first, got, again, listed: (listed.tasks ?? []).map((t) => t.id) };
  },

  async stream() {
    return streamed(await client("echo"), message("streams"));
  },

  /** Cancelled once the stream has said the task is there: the stream ends canceled. */
  async cancel() {
    const waiter = await client("waiter");
    let cancelled = null;
    const stream = await streamed(waiter, message("wait"), async (e) => {
      if (cancelled === null && e.kind === "task") cancelled = task(await waiter.cancelTask({ id: e.id, tenant: "", metadata: undefined }));
    });
    return { ...stream, cancelled };
  },

  /** A question: the stream pauses input-required; the next message of the task answers it. */
  async inputRequired() {
    const painter = await client("painter");
    const asked = await streamed(painter, message("paint"));
    const opening = asked.events[0];
    const answered = await streamed(painter, message("", { taskId: opening.id, contextId: opening.contextId,
                                                           data: { answer: ["red", "blue"] } }));
    const got = task(await painter.getTask({ id: opening.id, historyLength: undefined, tenant: "" }));
    return { asked, answered, got };
  },

  /** The card's endpoint with a trailing slash (`/a2a/{agent}/`): a POST is answered there, not redirected. */
  async trailingSlash() {
    const card = await new DefaultAgentCardResolver({ fetchImpl }).resolve(`${args.url}/a2a/echo/`);
    for (const i of card.supportedInterfaces) i.url = `${i.url.replace(/\/$/, "")}/`;
    const echo = await factory.createFromAgentCard(card);
    return { url: card.supportedInterfaces[0].url, sent: task(await echo.sendMessage(message("slash"))),
             ...(await streamed(echo, message("slash stream"))) };
  },
};

const summary = await scenarios[args.scenario]();
report({ ...summary, console: said });
