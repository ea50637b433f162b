// Runs one exported function of a JavaScript or TypeScript tool file for ringlet (`ringlet.tools.node`):
//   node js_runner.mjs FILE FUNCTION ARGS_JSON PARAM_NAMES_JSON
// The arguments are passed by parameter name, in the function's order; the result (a string as it is,
// anything else as JSON) is appended to $LLM_OUTPUT, as Loki's runner does.
import { appendFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [file, name, argsJson, namesJson] = process.argv.slice(2);
const module = await import(pathToFileURL(file).href);
const fn = module[name] ?? module.default?.[name];
if (typeof fn !== "function") {
  console.error(`${file} exports no function ${name}`);
  process.exit(2);
}
const args = JSON.parse(argsJson);
const result = await fn(...JSON.parse(namesJson).map((n) => args[n]));
if (result !== undefined && result !== null) {
  appendFileSync(process.env.LLM_OUTPUT, typeof result === "string" ? result : JSON.stringify(result));
}
