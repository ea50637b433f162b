// A graph agent's diagram: the Mermaid flowchart text of `GET /api/v1/agents/{name}/graph` (the exact format
// `ringlet.graph.mermaid` writes, not Mermaid at large) parsed, laid out in layers and drawn as inline SVG,
// its nodes coloured by state (pending / running / done / failed) as a run's node events arrive.
// All text goes in through `svg()`, i.e. as text nodes.

import {svg} from "./dom.js";

// Shape brackets, longest first so `((` is not read as `(`.
const OPENERS = [["((", "))", "start"], ["([", "])", "end"], ["[(", ")]", "rag"], ["[[", "]]", "script"],
  ["[/", "/]", "agent"], ["{{", "}}", "map"], ["(", ")", "llm"], ["{", "}", "approval"]];
const ID = /^[A-Za-z0-9_]+/;
const LABEL = /^"([^"]*)"/;
const EDGES = [[/^-->\s*/, "solid"], [/^--\s*"([^"]*)"\s*-->\s*/, "solid"], [/^-\.\s*"([^"]*)"\s*\.->\s*/, "dotted"]];

function unquote(text) {
  return text.replace(/#quot;/g, "\"");
}

/** A node reference at the start of `rest`: its id, and its shape and label when it declares them. */
function nodeRef(rest) {
  const id = ID.exec(rest);
  if (!id) return null;
  let tail = rest.slice(id[0].length);
  for (const [open, close, shape] of OPENERS) {
    if (!tail.startsWith(open)) continue;
    const label = LABEL.exec(tail.slice(open.length));
    if (!label) continue;
    const after = tail.slice(open.length + label[0].length);
    if (!after.startsWith(close)) continue;
    tail = after.slice(close.length);
    return {id: id[0], shape, label: unquote(label[1]), rest: tail.trimStart()};
  }
  return {id: id[0], rest: tail.trimStart()};
}

/**
 * The flowchart as {nodes: Map(mermaidId → {id, nodeId, label, type, shape, missing}), edges: [{from, to,
 * label, style}], start}. A node's `nodeId` is the graph's own id (read back from its "id (type)" label),
 * the one node events carry. Lines it does not know are skipped.
 */
export function parseMermaid(text) {
  const nodes = new Map();
  const edges = [];
  const touch = (ref) => {
    if (!nodes.has(ref.id)) {
      nodes.set(ref.id, {id: ref.id, nodeId: ref.id.replace(/^n_/, ""), label: ref.id.replace(/^n_/, ""),
        type: "", shape: "plain", missing: false});
    }
    const node = nodes.get(ref.id);
    if (ref.label !== undefined) {
      node.shape = ref.shape;
      const typed = /^(.*) \(([a-z_]+)\)$/.exec(ref.label);
      if (typed) {
        node.nodeId = typed[1];
        node.label = typed[1];
        node.type = typed[2];
      } else {
        node.label = ref.label;
      }
    }
    return node;
  };
  for (const raw of String(text || "").split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("flowchart") || line.startsWith("classDef") || line.startsWith("%%")) continue;
    const from = nodeRef(line);
    if (!from) continue;
    const source = touch(from);
    let rest = from.rest;
    if (rest.startsWith(":::")) {
      if (rest.slice(3).trim() === "missing") source.missing = true;
      continue;
    }
    for (const [pattern, style] of EDGES) {
      const m = pattern.exec(rest);
      if (!m) continue;
      rest = rest.slice(m[0].length);
      const to = nodeRef(rest);
      if (to) edges.push({from: source.id, to: touch(to).id, label: m[1] === undefined ? "" : unquote(m[1]), style});
      break;
    }
  }
  const start = nodes.has("__start__") ? "__start__" : (nodes.keys().next().value ?? null);
  if (start && nodes.has(start) && start === "__start__") nodes.get(start).shape = "start";
  return {nodes, edges, start};
}

/**
 * Layers by longest path from the start, ignoring the edges that close a cycle (found by a depth-first
 * walk); nodes the start does not reach go below. Within a layer, nodes keep the order they were met in,
 * then move towards the mean position of their parents (one barycentre pass).
 */
export function layout(graph) {
  const out = new Map();
  for (const id of graph.nodes.keys()) out.set(id, []);
  for (const e of graph.edges) out.get(e.from).push(e);
  const back = new Set();
  const state = new Map(); // 1 on the walk's stack, 2 finished
  const order = []; // reverse post-order: a topological order of the forward edges
  const walk = (root) => {
    const stack = [[root, 0]];
    state.set(root, 1);
    while (stack.length) {
      const top = stack[stack.length - 1];
      const edges = out.get(top[0]);
      if (top[1] < edges.length) {
        const e = edges[top[1]++];
        const s = state.get(e.to);
        if (s === 1) back.add(e);
        else if (!s) {
          state.set(e.to, 1);
          stack.push([e.to, 0]);
        }
      } else {
        state.set(top[0], 2);
        order.push(top[0]);
        stack.pop();
      }
    }
  };
  if (graph.start) walk(graph.start);
  const reached = new Set(order);
  for (const id of graph.nodes.keys()) if (!state.has(id)) walk(id);
  order.reverse();
  const layer = new Map();
  for (const id of order) if (!layer.has(id)) layer.set(id, 0);
  for (const id of order) {
    for (const e of out.get(id)) {
      if (back.has(e)) continue;
      layer.set(e.to, Math.max(layer.get(e.to) ?? 0, layer.get(id) + 1));
    }
  }
  const depth = Math.max(0, ...[...reached].map((id) => layer.get(id)));
  for (const id of order) if (!reached.has(id)) layer.set(id, layer.get(id) + depth + 1);
  const rows = [];
  const seen = [...graph.nodes.keys()];
  for (const id of seen) {
    const l = layer.get(id);
    (rows[l] ||= []).push(id);
  }
  const rank = new Map();
  rows.forEach((row) => row.forEach((id, i) => rank.set(id, i)));
  const parents = new Map();
  for (const e of graph.edges) {
    if (back.has(e)) continue;
    if (!parents.has(e.to)) parents.set(e.to, []);
    parents.get(e.to).push(e.from);
  }
  for (const row of rows) {
    if (!row) continue;
    const centre = (id) => {
      const ps = parents.get(id) || [];
      return ps.length ? ps.reduce((a, p) => a + rank.get(p), 0) / ps.length : rank.get(id);
    };
    const keyed = row.map((id, i) => [centre(id), i, id]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    keyed.forEach(([, , id], i) => {
      row[i] = id;
      rank.set(id, i);
    });
  }
  return {rows: rows.filter(Boolean), back, layer};
}

const NODE_H = 36;
const ROW_GAP = 64;
const COL_GAP = 28;
const CHAR_W = 7.4;
let diagrams = 0;

/** The point at `t` on the cubic Bézier curve through `pts` (four [x, y]). */
function bezier(pts, t) {
  const u = 1 - t;
  const w = [u * u * u, 3 * u * u * t, 3 * u * t * t, t * t * t];
  return [0, 1].map((k) => pts.reduce((sum, p, j) => sum + w[j] * p[k], 0));
}

function nodeWidth(node) {
  if (node.shape === "start") return NODE_H;
  const extra = {approval: 44, map: 36, agent: 30, rag: 20, script: 28}[node.shape] || 24;
  return Math.max(72, Math.round(node.label.length * CHAR_W + extra));
}

function outline(node, w) {
  const hh = NODE_H / 2;
  const hw = w / 2;
  switch (node.shape) {
    case "start":
      return [svg("circle", {class: "gshape", cx: 0, cy: 0, r: hh - 4})];
    case "end":
      return [svg("rect", {class: "gshape", x: -hw, y: -hh, width: w, height: NODE_H, rx: hh})];
    case "approval":
      return [svg("polygon", {class: "gshape", points: `${-hw},0 0,${-hh} ${hw},0 0,${hh}`})];
    case "map":
      return [svg("polygon", {class: "gshape",
        points: `${-hw},0 ${-hw + 14},${-hh} ${hw - 14},${-hh} ${hw},0 ${hw - 14},${hh} ${-hw + 14},${hh}`})];
    case "agent":
      return [svg("polygon", {class: "gshape",
        points: `${-hw + 10},${-hh} ${hw},${-hh} ${hw - 10},${hh} ${-hw},${hh}`})];
    case "script":
      return [svg("rect", {class: "gshape", x: -hw, y: -hh, width: w, height: NODE_H, rx: 2}),
        svg("line", {class: "gline", x1: -hw + 8, y1: -hh, x2: -hw + 8, y2: hh}),
        svg("line", {class: "gline", x1: hw - 8, y1: -hh, x2: hw - 8, y2: hh})];
    case "rag":
      return [svg("path", {class: "gshape",
        d: `M${-hw},${-hh + 5} A${hw},5 0 0 1 ${hw},${-hh + 5} V${hh - 5} A${hw},5 0 0 1 ${-hw},${hh - 5} Z`}),
      svg("path", {class: "gline", d: `M${-hw},${-hh + 5} A${hw},5 0 0 0 ${hw},${-hh + 5}`})];
    case "llm":
      return [svg("rect", {class: "gshape", x: -hw, y: -hh, width: w, height: NODE_H, rx: 10})];
    default:
      return [svg("rect", {class: "gshape", x: -hw, y: -hh, width: w, height: NODE_H, rx: 2})];
  }
}

const STATE_TEXT = {pending: "pending", running: "running", done: "done", failed: "failed", fallback: "fell back"};

/** The diagram of one graph: `el` is the SVG; `setState(nodeId, state)` colours a node. */
export class GraphDiagram {
  constructor(mermaid, {title = "Graph"} = {}) {
    const graph = parseMermaid(mermaid);
    const {rows, back} = layout(graph);
    const marker = `garrow-${++diagrams}`;
    const widths = new Map([...graph.nodes.values()].map((n) => [n.id, nodeWidth(n)]));
    const rowWidth = (row) => row.reduce((a, id) => a + widths.get(id), 0) + COL_GAP * (row.length - 1);
    const hasBack = back.size > 0;
    const margin = 16;
    const inner = Math.max(...rows.map(rowWidth), 80);
    const side = hasBack ? 28 : 0; // room for the edges that loop back
    const width = inner + margin * 2 + side * 2;
    const height = rows.length * NODE_H + (rows.length - 1) * ROW_GAP + margin * 2;
    const at = new Map();
    rows.forEach((row, r) => {
      let x = side + margin + (inner - rowWidth(row)) / 2;
      const y = margin + r * (NODE_H + ROW_GAP) + NODE_H / 2;
      for (const id of row) {
        at.set(id, {x: x + widths.get(id) / 2, y, w: widths.get(id)});
        x += widths.get(id) + COL_GAP;
      }
    });
    this.el = svg("svg", {class: "graph-diagram", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
      "aria-label": title, preserveAspectRatio: "xMidYMin meet"},
    svg("title", {}, title),
    svg("defs", {}, svg("marker", {id: marker, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse"}, svg("path", {class: "garrow", d: "M0,0 L10,5 L0,10 z"}))));
    const edgeLayer = svg("g", {class: "gedges"});
    const nodeLayer = svg("g", {class: "gnodes"});
    this.el.append(edgeLayer, nodeLayer);
    const leftmost = side + margin;
    const rightmost = side + margin + inner;
    const placed = []; // [x, y, half width] of the edge labels drawn so far
    graph.edges.forEach((e, i) => {
      const a = at.get(e.from);
      const b = at.get(e.to);
      let pts;
      if (back.has(e) || b.y <= a.y) { // back to an earlier layer: out on the nearer side, into its top
        const left = b.x < leftmost + inner / 2;
        const side = left ? -1 : 1;
        const x1 = a.x + side * a.w / 2;
        const bend = left ? leftmost - 10 - (i % 3) * 6 : rightmost + 10 + (i % 3) * 6;
        const top = b.y - NODE_H / 2;
        pts = [[x1, a.y], [bend, a.y], [bend, top - ROW_GAP * 0.6], [b.x + side * b.w / 4, top - 1]];
      } else {
        const y1 = a.y + NODE_H / 2;
        const y2 = b.y - NODE_H / 2 - 1;
        const bend = (y2 - y1) / 2;
        pts = [[a.x, y1], [a.x, y1 + bend], [b.x, y2 - bend], [b.x, y2]];
      }
      const d = `M${pts[0]} C${pts[1]} ${pts[2]} ${pts[3]}`;
      const [lx, ly] = bezier(pts, back.has(e) ? 0.5 : 0.62);
      const g = svg("g", {class: `gedge gedge-${e.style}`, dataset: {from: graph.nodes.get(e.from).nodeId,
        to: graph.nodes.get(e.to).nodeId}},
      svg("path", {class: "gpath", d, "marker-end": `url(#${marker})`}));
      if (e.label) {
        const short = e.label.length > 24 ? `${e.label.slice(0, 23)}…` : e.label;
        g.prepend(svg("title", {}, e.label));
        const half = (short.length * 6.2) / 2 + 3;
        let y = ly;
        while (placed.some(([px, py, ph]) => Math.abs(px - lx) < half + ph && Math.abs(py - y) < 13)) y += 13;
        placed.push([lx, y, half]); // labels of edges leaving one node would sit on each other: stack them
        g.append(svg("text", {class: "glabel", x: lx, y: y + 4, "text-anchor": "middle"}, short));
      }
      edgeLayer.append(g);
    });
    this.nodes = new Map();
    for (const node of graph.nodes.values()) {
      const p = at.get(node.id);
      const tip = svg("title", {}, "");
      const g = svg("g", {class: `gnode gnode-${node.shape}${node.missing ? " gnode-missing" : ""}`,
        transform: `translate(${p.x},${p.y})`,
        dataset: {nodeId: node.shape === "start" ? "" : node.nodeId, type: node.type, state: "pending"}},
      tip, ...outline(node, p.w));
      if (node.shape === "start") {
        g.dataset.start = "";
      } else {
        g.append(svg("text", {class: "gtext", x: 0, y: 4, "text-anchor": "middle"}, node.label));
        this.nodes.set(node.nodeId, {g, tip, node});
        tip.textContent = `${node.label}${node.type ? ` (${node.type})` : ""}: pending`;
      }
      nodeLayer.append(g);
    }
    if (!graph.nodes.size) this.el.append(svg("text", {x: margin, y: margin + 12}, "No graph to draw."));
  }

  /** `state`: pending, running, done, failed or fallback. Unknown node ids are ignored. */
  setState(nodeId, state) {
    const entry = this.nodes.get(nodeId);
    if (!entry || entry.g.dataset.state === state) return;
    entry.g.dataset.state = state;
    const {node} = entry;
    entry.tip.textContent = `${node.label}${node.type ? ` (${node.type})` : ""}: ${STATE_TEXT[state] || state}`;
  }
}
