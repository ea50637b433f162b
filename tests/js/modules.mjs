// The npm packages the conformance drivers use, loaded from the venv's node_modules (the Makefile installs
// them there: .venv/node/node_modules), or from RINGLET_NODE_MODULES.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const NODE_MODULES = process.env.RINGLET_NODE_MODULES ?? resolve(here, "../../.venv/node/node_modules");

/** A package's ES module entry (`sub` is an entry of its `exports`, "." by default). */
export async function load(name, sub = ".") {
  const root = join(NODE_MODULES, name);
  const entry = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).exports[sub];
  const file = typeof entry === "string" ? entry : entry.import?.default ?? entry.import;
  return import(pathToFileURL(join(root, file)).href);
}

/** What the client library said on the console (its warnings are protocol problems it worked around). */
export function recordConsole() {
  const said = [];
  for (const level of ["warn", "error"]) {
    console[level] = (...args) => said.push(`${level}: ${args.map((a) => (a instanceof Error ? a.message : String(a))).join(" ")}`);
  }
  return said;
}

/** The driver's input: one JSON argument. */
export function input() {
  return JSON.parse(process.argv[2]);
}

/** Print the summary (one JSON line on stdout) and exit. */
export function report(summary) {
  process.stdout.write(JSON.stringify(summary) + "\n");
  process.exit(0);
}
