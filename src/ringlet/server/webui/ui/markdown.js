// A small, safe Markdown renderer. It builds DOM nodes and puts every piece of source text in as a text
// node: raw HTML in the source is shown literally, never parsed. Links keep only http(s) and mailto
// targets, and images are shown as links (nothing is fetched from elsewhere).
//
// Blocks: paragraphs, ATX headings, fenced code (highlighted), block quotes, nested lists, task items,
// GFM tables, thematic breaks. Inline: code spans, emphasis, strong, strikethrough, links, autolinks,
// backslash escapes; a newline inside a paragraph is a line break (chat text is written that way).

import {highlight} from "./highlight.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])([ \t]+(.*)|[ \t]*$)/;
/** A number and its period (or parenthesis) alone on a line: "391." is an answer, not an empty list item. */
const BARE_NUMBER = /^ {0,3}\d{1,9}[.)][ \t]*$/;
const TABLE_RULE = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
const MAX_DEPTH = 12;

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

/** The Markdown `source` as a DocumentFragment. */
export function renderMarkdown(source) {
  const frag = document.createDocumentFragment();
  blocks(String(source).replace(/\r\n?/g, "\n").split("\n"), frag, 0);
  return frag;
}

/** A list item that may start a list: not a bare number (an empty ordered item would hide the text). */
function startsList(line) {
  return ITEM.test(line) && !BARE_NUMBER.test(line);
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || startsList(line);
}

function blocks(lines, parent, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (/^\s*$/.test(line)) {
      i++;
      continue;
    }
    let m;
    if (depth < MAX_DEPTH && (m = FENCE.exec(line))) {
      i = fenced(lines, i, m, parent);
    } else if ((m = HEADING.exec(line))) {
      const heading = el(`h${m[1].length}`);
      inline(m[2] || "", heading, 0);
      parent.append(heading);
      i++;
    } else if (RULE.test(line)) {
      parent.append(el("hr"));
      i++;
    } else if (depth < MAX_DEPTH && QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        inner.push(m[1]);
        i++;
      }
      const quote = el("blockquote");
      blocks(inner, quote, depth + 1);
      parent.append(quote);
    } else if (depth < MAX_DEPTH && startsList(line)) {
      i = list(lines, i, parent, depth);
    } else if (i + 1 < lines.length && line.includes("|") && TABLE_RULE.test(lines[i + 1])) {
      i = table(lines, i, parent);
    } else {
      const para = [];
      while (i < lines.length && !/^\s*$/.test(lines[i]) && (para.length === 0 || !startsBlock(lines[i]))) {
        para.push(lines[i].trim());
        i++;
      }
      const p = el("p");
      inline(para.join("\n"), p, 0);
      parent.append(p);
    }
  }
}

function fenced(lines, i, m, parent) {
  const marker = m[1];
  const lang = m[2] || "";
  const body = [];
  i++;
  while (i < lines.length) {
    const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(lines[i]);
    if (close && close[1][0] === marker[0] && close[1].length >= marker.length) {
      i++;
      break;
    }
    body.push(lines[i]);
    i++;
  }
  const pre = el("pre", "code-block");
  const code = el("code");
  if (lang) {
    code.dataset.lang = lang;
    const label = el("span", "code-lang");
    label.textContent = lang;
    pre.append(label);
  }
  code.append(highlight(body.join("\n"), lang));
  pre.append(code);
  parent.append(pre);
  return i;
}

function list(lines, i, parent, depth) {
  const first = ITEM.exec(lines[i]);
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.setAttribute("start", String(parseInt(first[2], 10)));
  while (i < lines.length) {
    const m = startsList(lines[i]) ? ITEM.exec(lines[i]) : null;
    if (!m || /\d/.test(m[2]) !== ordered) break;
    const indent = m[1].length + m[2].length + 1;
    const content = [m[4] || ""];
    i++;
    while (i < lines.length) {
      const line = lines[i];
      if (/^\s*$/.test(line)) {
        const next = lines[i + 1];
        if (next !== undefined && /^\s{2,}\S/.test(next)) {
          content.push("");
          i++;
          continue;
        }
        break;
      }
      if (/^\s{2,}/.test(line)) {
        content.push(line.replace(new RegExp(`^ {0,${Math.max(indent, 2)}}`), ""));
      } else if (startsBlock(line)) {
        break;
      } else {
        content.push(line); // a lazy continuation of the item's paragraph
      }
      i++;
    }
    const li = el("li");
    const task = /^\[([ xX])\][ \t]+/.exec(content[0]);
    if (task) {
      const box = el("input");
      box.type = "checkbox";
      box.disabled = true;
      box.checked = task[1] !== " ";
      li.append(box, " ");
      li.className = "task";
      content[0] = content[0].slice(task[0].length);
    }
    const holder = document.createDocumentFragment();
    blocks(content, holder, depth + 1);
    if (holder.childNodes.length === 1 && holder.firstChild.nodeName === "P") {
      li.append(...holder.firstChild.childNodes); // a tight item: its text without the paragraph
    } else {
      li.append(holder);
    }
    node.append(li);
    if (i < lines.length && /^\s*$/.test(lines[i]) && startsList(lines[i + 1] || "")) i++;
  }
  parent.append(node);
  return i;
}

function cells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  const out = [];
  let cell = "";
  for (let k = 0; k < row.length; k++) {
    if (row[k] === "\\" && row[k + 1] === "|") {
      cell += "|";
      k++;
    } else if (row[k] === "|") {
      out.push(cell.trim());
      cell = "";
    } else {
      cell += row[k];
    }
  }
  out.push(cell.trim());
  return out;
}

function table(lines, i, parent) {
  const head = cells(lines[i]);
  const align = cells(lines[i + 1]).map((c) => (c.startsWith(":") && c.endsWith(":") ? "center"
    : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : ""));
  const wrap = el("div", "table-wrap");
  const tableEl = el("table");
  const thead = el("thead");
  const tr = el("tr");
  head.forEach((text, k) => {
    const th = el("th");
    if (align[k]) th.style.textAlign = align[k];
    inline(text, th, 0);
    tr.append(th);
  });
  thead.append(tr);
  tableEl.append(thead);
  const tbody = el("tbody");
  i += 2;
  while (i < lines.length && lines[i].includes("|") && !/^\s*$/.test(lines[i])) {
    const row = el("tr");
    cells(lines[i]).slice(0, head.length).forEach((text, k) => {
      const td = el("td");
      if (align[k]) td.style.textAlign = align[k];
      inline(text, td, 0);
      row.append(td);
    });
    tbody.append(row);
    i++;
  }
  tableEl.append(tbody);
  wrap.append(tableEl);
  parent.append(wrap);
  return i;
}

/** A link target the UI will follow: http(s) or mailto only, resolved; null for anything else. */
export function safeUrl(raw) {
  const text = String(raw).trim().replace(/^<|>$/g, "");
  if (/[\u0000-\u001f\u007f]/.test(text)) return null;
  let url;
  try {
    url = new URL(text, window.location.href);
  } catch {
    return null;
  }
  return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
}

function link(href, label, depth) {
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  if (typeof label === "string") a.textContent = label;
  else inline(label.text, a, depth + 1);
  return a;
}

const ESCAPABLE = "\\`*_{}[]()#+-.!|~<>\"'";

/** Find the closing `marker` for emphasis that opens at `from`; -1 when there is none. */
function closing(text, marker, from) {
  let k = from;
  const ch = marker[0];
  while ((k = text.indexOf(marker, k)) >= 0) {
    const inRun = text[k - 1] === ch || text[k + marker.length] === ch; // part of a longer run: not this one
    if (k > from && !inRun && !/\s/.test(text[k - 1]) && text[k - 1] !== "\\") {
      if (marker[0] !== "_" || !/\w/.test(text[k + marker.length] || "")) return k;
    }
    k += 1;
  }
  return -1;
}

/** Find `](` link text end: the `]` matching the `[` at `start`, honouring nesting and escapes. */
function bracketEnd(text, start) {
  let level = 0;
  for (let k = start; k < text.length; k++) {
    if (text[k] === "\\") k++;
    else if (text[k] === "[") level++;
    else if (text[k] === "]" && --level === 0) return k;
  }
  return -1;
}

function inline(text, parent, depth) {
  let buffer = "";
  const flush = () => {
    if (buffer) parent.append(document.createTextNode(buffer));
    buffer = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const rest = text.slice(i);
    let m;
    if (c === "\\" && i + 1 < text.length && ESCAPABLE.includes(text[i + 1])) {
      buffer += text[i + 1];
      i += 2;
    } else if (c === "\\" && text[i + 1] === "\n") {
      flush();
      parent.append(el("br"));
      i += 2;
    } else if (c === "\n") {
      flush();
      parent.append(el("br"));
      i++;
    } else if (c === "`") {
      const ticks = /^`+/.exec(rest)[0];
      const end = text.indexOf(ticks, i + ticks.length);
      if (end < 0) {
        buffer += ticks;
        i += ticks.length;
        continue;
      }
      flush();
      const code = el("code");
      let body = text.slice(i + ticks.length, end).replace(/\n/g, " ");
      if (/^ .*[^ ].* $/.test(body)) body = body.slice(1, -1);
      code.textContent = body;
      parent.append(code);
      i = end + ticks.length;
    } else if (depth < MAX_DEPTH && (c === "[" || (c === "!" && text[i + 1] === "["))) {
      const open = c === "!" ? i + 1 : i;
      const close = bracketEnd(text, open);
      const target = close > 0 && text[close + 1] === "(" ? /^\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+("[^"]*"|'[^']*'))?\s*\)/.exec(text.slice(close + 1)) : null;
      if (!target) {
        buffer += c;
        i++;
        continue;
      }
      flush();
      const label = text.slice(open + 1, close);
      const href = safeUrl(target[1]);
      if (href && c === "!") parent.append(link(href, label ? `🖼 ${label}` : href, depth));
      else if (href) parent.append(link(href, {text: label}, depth));
      else inline(label, parent, depth + 1); // an unsafe target: the text only
      i = close + 1 + target[0].length;
    } else if (c === "<" && (m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(rest))) {
      const href = safeUrl(m[1]);
      if (!href) {
        buffer += m[0];
      } else {
        flush();
        parent.append(link(href, m[1], depth));
      }
      i += m[0].length;
    } else if ((c === "h" || c === "w") && (i === 0 || /[\s(*_~]/.test(text[i - 1]))
               && (m = /^(?:https?:\/\/|www\.)[^\s<]+/i.exec(rest))) {
      let url = m[0].replace(/[.,:;!?"')\]]+$/, "");
      if (url.endsWith(")") === false && m[0].length > url.length && m[0][url.length] === ")"
          && url.includes("(")) url += ")";
      const href = safeUrl(url.startsWith("www.") ? `https://${url}` : url);
      if (href) {
        flush();
        parent.append(link(href, url, depth));
      } else {
        buffer += url;
      }
      i += url.length;
    } else if (depth < MAX_DEPTH && (c === "*" || c === "_" || c === "~")) {
      const run = /^([*_~])\1*/.exec(rest)[0];
      const wordy = c === "_" && i > 0 && /\w/.test(text[i - 1]);
      let done = false;
      for (const size of run.length >= 2 ? [2, 1] : [1]) {
        if (wordy || (c === "~" && size !== 2)) break;
        const marker = c.repeat(size);
        const start = i + size;
        if (start >= text.length || /\s/.test(text[start])) continue;
        const end = closing(text, marker, start);
        if (end < 0) continue;
        flush();
        const node = el(c === "~" ? "del" : size === 2 ? "strong" : "em");
        inline(text.slice(start, end), node, depth + 1);
        parent.append(node);
        i = end + size;
        done = true;
        break;
      }
      if (!done) {
        buffer += run;
        i += run.length;
      }
    } else {
      buffer += c;
      i++;
    }
  }
  flush();
}
