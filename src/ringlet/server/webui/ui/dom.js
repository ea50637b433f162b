// Building DOM nodes without HTML strings: text always goes in as text nodes, so nothing a model, a
// tool or a user writes can become markup. No module of the UI uses innerHTML.

/**
 * h("button", {class: "x", onclick: fn, disabled: true}, "text", child) → an element.
 * Attribute values are strings set with setAttribute; functions under `on…` become listeners;
 * `false`/null/undefined leave the attribute out; children are nodes, strings (as text), arrays or null.
 */
export function h(tag, attrs, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith("on")) {
      if (typeof value !== "function") throw new TypeError(`${name} must be a function`);
      el.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function svg(tag, attrs, ...children) {
  return h(`svg:${tag}`, attrs, ...children);
}

const NUMBER = new Intl.NumberFormat();

export function fmtInt(n) {
  return n === null || n === undefined ? "–" : NUMBER.format(n);
}

export function fmtCost(usd) {
  if (usd === null || usd === undefined) return "no price";
  return usd < 0.01 ? `$${usd.toFixed(4)}` : `$${usd.toFixed(2)}`;
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

/** "4:05" until `iso` (an RFC 3339 time), "expired" once past it, "" without one. */
export function timeLeft(iso, now = Date.now()) {
  if (!iso) return "";
  const left = Math.floor((Date.parse(iso) - now) / 1000);
  if (left <= 0) return "expired";
  const h_ = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
  const pad = (v) => String(v).padStart(2, "0");
  return h_ ? `${h_}:${pad(m)}:${pad(s)}` : `${m}:${pad(s)}`;
}

export function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const today = new Date();
  return d.toDateString() === today.toDateString()
    ? d.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"})
    : d.toLocaleDateString([], {month: "short", day: "numeric"});
}

/** Pretty JSON when `text` parses, else the text as it is (arguments still streaming). */
export function prettyJson(value) {
  if (typeof value !== "string") return JSON.stringify(value, null, 2);
  try {
    return JSON.stringify(JSON.parse(value), null, 2);
  } catch {
    return value;
  }
}
