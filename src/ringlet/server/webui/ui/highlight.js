// A small code highlighter: comments, strings, numbers, keywords and literals of the common languages,
// as spans with text content (never markup), so highlighting cannot inject anything either.

const HASH = new Set(["python", "py", "sh", "bash", "shell", "zsh", "console", "yaml", "yml", "toml", "ruby", "rb",
  "r", "perl", "dockerfile", "makefile", "make", "ini", "conf"]);
const SLASH = new Set(["js", "javascript", "mjs", "ts", "typescript", "tsx", "jsx", "json", "jsonc", "java", "c",
  "h", "cpp", "c++", "cc", "hpp", "go", "golang", "rust", "rs", "cs", "csharp", "swift", "kotlin", "kt", "scala",
  "php", "css", "scss", "dart", "zig", "proto", "graphql", "rego"]);
const DASH = new Set(["sql", "lua", "haskell", "hs", "psql", "sqlite"]);

const KEYWORDS = new Set(`
and as assert async await break case catch class const continue def default del do elif else enum except export
extends finally fn for from func function global go if impl import in interface is lambda let loop match mod move
mut new nonlocal not of or package pass pub raise return select self static struct super switch this throw trait
try type typeof use var void where while with yield chan defer fallthrough goto map range unsafe dyn crate ref
public private protected final abstract implements instanceof native synchronized throws transient volatile
echo then fi esac done local readonly unset begin end elsif unless until module require
SELECT FROM WHERE INSERT INTO VALUES UPDATE SET DELETE CREATE TABLE DROP ALTER JOIN LEFT RIGHT INNER OUTER ON GROUP
BY ORDER HAVING LIMIT OFFSET AS AND OR NOT NULL PRIMARY KEY INDEX UNION DISTINCT CASE WHEN THEN ELSE END IS IN
select from where insert into values update set delete create table drop alter join left right inner outer on
group by order having limit offset union distinct when
`.trim().split(/\s+/));
const LITERALS = new Set(["true", "false", "null", "None", "True", "False", "nil", "undefined", "NaN", "Infinity",
  "TRUE", "FALSE"]);

function family(lang) {
  const l = (lang || "").toLowerCase();
  if (HASH.has(l)) return "hash";
  if (SLASH.has(l)) return "slash";
  if (DASH.has(l)) return "dash";
  return l ? "plain" : "guess";
}

const COMMENT = {
  hash: String.raw`#[^\n]*`,
  slash: String.raw`\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)`,
  dash: String.raw`--[^\n]*|\/\*[\s\S]*?(?:\*\/|$)`,
  plain: null,
  guess: String.raw`\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)|(?<![\w$])#(?![\w!])[^\n]*`,
};
const STRING = String.raw`"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\[\s\S]|[^"\\\n])*"?|'(?:\\[\s\S]|[^'\\\n])*'?|\x60(?:\\[\s\S]|[^\x60\\])*\x60?`;
const NUMBER = String.raw`\b(?:0[xX][\da-fA-F_]+|0[bB][01_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?)\b`;
const WORD = String.raw`[A-Za-z_$][\w$]*`;

function tokenizer(kind) {
  const parts = [COMMENT[kind] && `(${COMMENT[kind]})`, `(${STRING})`, `(${NUMBER})`, `(${WORD})`].filter(Boolean);
  return new RegExp(parts.join("|"), "g");
}

const CACHE = new Map();

/** `code` as a fragment of text nodes and <span class="hl-…"> elements. */
export function highlight(code, lang) {
  const kind = family(lang);
  const frag = document.createDocumentFragment();
  if (kind === "plain") {
    frag.append(document.createTextNode(code));
    return frag;
  }
  if (!CACHE.has(kind)) CACHE.set(kind, tokenizer(kind));
  const re = CACHE.get(kind);
  re.lastIndex = 0;
  const hasComment = Boolean(COMMENT[kind]);
  let last = 0;
  for (let m = re.exec(code); m; m = re.exec(code)) {
    if (m[0] === "") {
      re.lastIndex++;
      continue;
    }
    const [comment, string, number, word] = hasComment ? m.slice(1) : [undefined, ...m.slice(1)];
    let cls = null;
    if (comment !== undefined) cls = "hl-com";
    else if (string !== undefined) cls = "hl-str";
    else if (number !== undefined) cls = "hl-num";
    else if (word !== undefined) cls = LITERALS.has(word) ? "hl-lit" : KEYWORDS.has(word) ? "hl-kw" : null;
    if (!cls) continue;
    if (m.index > last) frag.append(document.createTextNode(code.slice(last, m.index)));
    const span = document.createElement("span");
    span.className = cls;
    span.textContent = m[0];
    frag.append(span);
    last = m.index + m[0].length;
  }
  if (last < code.length) frag.append(document.createTextNode(code.slice(last)));
  return frag;
}
