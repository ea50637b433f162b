// The client of ringlet's public HTTP API (server-contract.md): JSON requests and SSE streams read with
// fetch, so every request, streams included, carries the API key in its Authorization header.

const KEY = "ringlet.api_key";

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.details = error.details || null;
    this.requestId = error.request_id || null;
  }
}

export class Api {
  constructor(base = "") {
    this.base = base;
    this.key = sessionStorage.getItem(KEY);
    this.onUnauthorized = null;
  }

  signIn(key) {
    this.key = key;
    sessionStorage.setItem(KEY, key);
  }

  signOut() {
    this.key = null;
    sessionStorage.removeItem(KEY);
  }

  headers(extra = {}) {
    const out = {...extra};
    if (this.key) out.Authorization = `Bearer ${this.key}`;
    return out;
  }

  async request(method, path, body, {auth = true} = {}) {
    const init = {method, headers: auth ? this.headers() : {}, cache: "no-store"};
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(this.base + path, init);
    if (response.status === 204) return null;
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const err = new ApiError(response.status, data);
      if (response.status === 401 && auth && this.onUnauthorized) this.onUnauthorized(err);
      throw err;
    }
    return data;
  }

  get(path) { return this.request("GET", path); }
  post(path, body) { return this.request("POST", path, body === undefined ? {} : body); }
  del(path) { return this.request("DELETE", path); }

  /**
   * How to get in: "open" when the server answers without a key (it runs with `auth.mode: none`, which it
   * allows only on loopback), "key" when the stored key works, "signin" when a key is needed.
   */
  async probe() {
    const bare = await fetch(this.base + "/api/v1/agents", {cache: "no-store"});
    if (bare.ok) return {mode: "open", agents: (await bare.json()).data};
    if (bare.status !== 401) throw new ApiError(bare.status, await bare.json().catch(() => null));
    if (!this.key) return {mode: "signin"};
    try {
      return {mode: "key", agents: (await this.request("GET", "/api/v1/agents", undefined, {auth: true})).data};
    } catch (err) {
      if (err.status === 401) {
        this.signOut();
        return {mode: "signin", error: err.message};
      }
      throw err;
    }
  }

  /**
   * Read an SSE response (POST …/messages or GET …/events). Calls onEvent({id, event, data}) for each
   * event with a parsed JSON payload; resolves when the server closes the stream, rejects on a network
   * error or a non-2xx answer. `lastEventId` goes in the `Last-Event-ID` header.
   */
  async stream(method, path, {body, lastEventId, signal, onEvent, onOpen} = {}) {
    const headers = this.headers({Accept: "text/event-stream"});
    if (lastEventId !== undefined && lastEventId !== null) headers["Last-Event-ID"] = String(lastEventId);
    const init = {method, headers, signal, cache: "no-store"};
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(this.base + path, init);
    if (!response.ok) {
      const err = new ApiError(response.status, await response.json().catch(() => null));
      if (response.status === 401 && this.onUnauthorized) this.onUnauthorized(err);
      throw err;
    }
    if (onOpen) onOpen(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SseParser(onEvent);
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      parser.feed(value);
    }
  }
}

/** The text/event-stream format: lines of `field: value`, events ended by a blank line. */
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.id = null;
    this.event = "message";
    this.data = [];
  }

  feed(chunk) {
    this.buffer += chunk;
    let end;
    while ((end = this.buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buffer.slice(0, end);
      const sep = this.buffer[end] === "\r" && this.buffer[end + 1] === "\n" ? 2 : 1;
      if (this.buffer[end] === "\r" && end + 1 === this.buffer.length) break; // a \r\n may be split
      this.buffer = this.buffer.slice(end + sep);
      this.line(line);
    }
  }

  line(line) {
    if (line === "") {
      if (this.data.length) {
        let data;
        try {
          data = JSON.parse(this.data.join("\n"));
        } catch {
          data = {raw: this.data.join("\n")};
        }
        this.onEvent({id: this.id === null ? null : Number(this.id), event: this.event, data});
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id") this.id = value;
  }
}
