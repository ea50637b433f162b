"""The built-in `assistant` on an embedded local model: does it answer everyday prompts, and how fast.

Runs the real built-in agent (`ringlet.agent` builtin loader, its config.yaml, tools and approval rule)
on `local:<model>` over prompts whose answers can be checked: greetings (a non-empty answer and no
error), arithmetic (the number, checked numerically), the date and time (checked against the clock),
simple facts (a substring), and pages served by a loopback HTTP server that the bench starts (through
`web_fetch`, whose approval an auto-approver grants, so the approval path runs; the only change to the
agent's config is `web_fetch.allow_private`, so the tool may reach 127.0.0.1).

Prints each answer (with -v), then the pass rate and the passes per category, the median and p90 seconds
per answer and the median time to the first streamed token (text or tool call), and the load average
before and after.

Run: `.venv/bin/python bench/assistant.py [--model smollm2|PATH.gguf] [--method grammar|native|prompt]
[--routing channel|direct] [--set main|dev|held-out|all] [--threads N] [--no-examples] [--repeat N] [-v]`

The sets:
- `main`: the 25 prompts below, in five kinds (the assistant was tuned on them);
- `dev`: `bench/assistant_dev.yaml`, everyday requests in eight categories to tune on;
- `held-out`: `bench/assistant_held_out.yaml` (issue 50), 64 everyday requests in eight categories,
  written from the categories alone and never tuned on: run it without -v and read only its totals (its
  prompts may appear nowhere in src/, tests/ or examples/: tests/test_held_out.py);
- `all`: main and dev.
The YAML sets' cases are also checked for a reply that ran to the token cap (a model message with
finish_reason "length") and for a `web_fetch` call on a prompt that names no URL.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from ringlet.agent.config import WebFetchConfig, build_agent, find
from ringlet.agent.settings import RunSettings
from ringlet.gates.approval import AutoApprove
from ringlet.models.local.model import LocalModel, _load
from ringlet.models.retry import RetryingModel

PAGES = {
    "/notice": ("Museum notice", "The city museum is closed on Mondays for cleaning."),
    "/recipe": ("Pancakes", "Mix flour, milk and two eggs, then fry the batter in butter."),
}


@dataclass(slots=True)
class Outcome:
    """One prompt's run."""

    output: str = ""
    error: str | None = None
    """The run's error, or how it ended when not with the model's own answer (e.g. `empty_response`)."""
    seconds: float = 0.0
    first_token_s: float | None = None
    """Until the first streamed output: a text delta or a tool call's start."""
    first_text_s: float | None = None
    """Until the first text delta (for a tool question: of the answer after the tool ran)."""
    tools: list[str] = field(default_factory=list)
    calls: dict[str, list[str]] = field(default_factory=dict)
    """Each call's name and arguments, by call id (for -v)."""
    approvals: int = 0
    model_finishes: list[str | None] = field(default_factory=list)
    """Each model reply's finish_reason (`length`: it ran to the token cap)."""


Check = Callable[[Outcome], bool]


@dataclass(slots=True)
class Case:
    kind: str
    prompt: str
    check: Check


def answered(o: Outcome) -> bool:
    return bool(o.output.strip()) and o.error is None


def number(expected: float, tolerance: float = 1e-6) -> Check:
    """Any number in the answer equals `expected` to within `tolerance` (relative)."""

    def check(o: Outcome) -> bool:
        values = [float(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", o.output)]
        return answered(o) and any(abs(v - expected) <= tolerance * max(1.0, abs(expected)) for v in values)

    return check


def clock(zone: str) -> Check:
    """The answer names the time in `zone` to within two minutes (24-hour or am/pm)."""

    def check(o: Outcome) -> bool:
        now = datetime.now(ZoneInfo(zone))
        for hh, mm, half in re.findall(r"\b(\d{1,2}):(\d{2})(?::\d{2})?\s*([ap]\.?m\.?)?", o.output, re.I):
            hour = int(hh) % 12 + (12 if half.lower().startswith("p") else 0) if half else int(hh)
            said = hour * 60 + int(mm)
            if min(abs(said - (now.hour * 60 + now.minute + d)) % 1440 for d in (-2, -1, 0, 1, 2)) == 0:
                return answered(o)
        return False

    return check


def today(o: Outcome) -> bool:
    """The answer names today's date (UTC, or the day before or after across midnight)."""
    text = o.output.lower()
    for day in (datetime.now(UTC) + timedelta(days=d) for d in (0, -1, 1)):
        month = day.strftime("%B").lower()
        if day.strftime("%Y-%m-%d") in text or re.search(
                rf"\b{month} {day.day}\b|\b{day.day}(st|nd|rd|th)? (of )?{month}\b", text):
            return answered(o)
    return False


def weekday(o: Outcome) -> bool:
    days = {(datetime.now(UTC) + timedelta(days=d)).strftime("%A").lower() for d in (0, -1, 1)}
    return answered(o) and any(d in o.output.lower() for d in days)


def contains(*words: str, fetched: bool = False) -> Check:
    """Any of `words` (case-insensitive, at the start of a word: "Monday" matches "Mondays")."""

    def check(o: Outcome) -> bool:
        ok = answered(o) and any(re.search(rf"\b{re.escape(w)}", o.output, re.I) for w in words)
        return ok and (not fetched or ("web_fetch" in o.tools and o.approvals > 0))

    return check


def either(*checks: Check) -> Check:
    return lambda o: any(c(o) for c in checks)


def year(o: Outcome) -> bool:
    years = {str((datetime.now(UTC) + timedelta(days=d)).year) for d in (0, -1, 1)}
    return answered(o) and any(y in o.output for y in years)


HELD_OUT_FILE = Path(__file__).with_name("assistant_held_out.yaml")
"""Never tuned on (`--set held-out`): only its totals are read."""
DEV_FILE = Path(__file__).with_name("assistant_dev.yaml")
"""Cases of the held-out file's categories to tune on (`--set dev`)."""


def _spec_check(spec: dict[str, Any]) -> Check:
    """A case of the YAML file as a check: its content checks (`number` or `contains` when both are
    given; every other one given), and for every case an answer, no run to the token cap, no `web_fetch`
    without a URL in the prompt, and `no_tools` / `max_chars` when given."""
    content: list[Check] = []
    if "number" in spec and "contains" in spec:
        content.append(either(number(spec["number"], spec.get("tolerance", 1e-6)), contains(*spec["contains"])))
    elif "number" in spec:
        content.append(number(spec["number"], spec.get("tolerance", 1e-6)))
    elif "contains" in spec:
        content.append(contains(*spec["contains"], fetched=bool(spec.get("fetched"))))
    if "clock" in spec:
        content.append(clock(spec["clock"]))
    for key, check in (("today", today), ("weekday", weekday), ("year", year)):
        if spec.get(key):
            content.append(check)
    url = "{base}" in spec["prompt"] or "http" in spec["prompt"]

    def check(o: Outcome) -> bool:
        if not answered(o) or "length" in o.model_finishes or (not url and "web_fetch" in o.tools):
            return False
        if spec.get("no_tools") and o.tools:
            return False
        if len(o.output) > spec.get("max_chars", 10**9):
            return False
        return all(c(o) for c in content)

    return check


def from_file(path: Path) -> Callable[[str], list[Case]]:
    def load(base: str) -> list[Case]:
        data = yaml.safe_load(path.read_text())
        return [Case(spec["kind"], spec["prompt"].replace("{base}", base), _spec_check(spec)) for spec in data["cases"]]

    return load


held_out = from_file(HELD_OUT_FILE)
dev = from_file(DEV_FILE)


def cases(base: str) -> list[Case]:
    return [
        Case("greeting", "Say hello.", answered),
        Case("greeting", "Hello! Who are you?", answered),
        Case("greeting", "Hi!", answered),
        Case("greeting", "Good morning!", answered),
        Case("greeting", "How are you today?", answered),
        Case("greeting", "Thanks for your help!", answered),
        Case("arithmetic", "What is 17 * 23?", number(391)),
        Case("arithmetic", "What is 144 / 12?", number(12)),
        Case("arithmetic", "Calculate 1234 + 5678.", number(6912)),
        Case("arithmetic", "What is 2 to the power of 10?", number(1024)),
        Case("arithmetic", "What is 999 - 123?", number(876)),
        Case("arithmetic", "What is the square root of 169?", number(13)),
        Case("arithmetic", "What is 15% of 80?", number(12)),
        Case("time", "What time is it?", clock("UTC")),
        Case("time", "What is today's date?", today),
        Case("time", "What day of the week is it today?", weekday),
        Case("time", "What time is it in Tokyo?", clock("Asia/Tokyo")),
        Case("fact", "What is the capital of France?", contains("Paris")),
        Case("fact", "What is the capital of Japan?", contains("Tokyo")),
        Case("fact", "What is the capital of Germany?", contains("Berlin")),
        Case("fact", "What is the capital of Spain?", contains("Madrid")),
        Case("fact", "What is the largest planet in the solar system?", contains("Jupiter")),
        Case("fact", "How many days are there in a week?", either(number(7), contains("seven"))),
        Case("web", f"Read {base}/notice and tell me what it says.", contains("Monday", fetched=True)),
        Case("web", f"What does the page {base}/recipe say?", contains("flour", "eggs", fetched=True)),
    ]


SETS: dict[str, Callable[[str], list[Case]]] = {
    "main": cases, "dev": dev, "held-out": held_out, "all": lambda base: cases(base) + dev(base)}


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        page = PAGES.get(self.path)
        if page is None:
            self.send_error(404)
            return
        body = f"<html><head><title>{page[0]}</title></head><body><h1>{page[0]}</h1><p>{page[1]}</p></body></html>"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _yaml_pages() -> dict[str, tuple[str, str]]:
    return {path: (title, text) for file in (HELD_OUT_FILE, DEV_FILE)
            for path, (title, text) in yaml.safe_load(file.read_text())["pages"].items()}


def serve() -> tuple[ThreadingHTTPServer, str]:
    PAGES.update(_yaml_pages())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def assistant(model: LocalModel) -> object:
    """The built-in assistant as its loader builds it, allowed to fetch from loopback."""
    spec = find("assistant")
    if not spec.builtin or spec.config is None:
        raise SystemExit(f"the assistant found is not the built-in one: {spec.directory}")
    config = spec.config.model_copy(update={"web_fetch": WebFetchConfig(allow_private=True)})
    return build_agent(dataclasses.replace(spec, config=config), model=RetryingModel(model))


async def run_one(agent: object, prompt: str) -> Outcome:
    out = Outcome()
    started = time.perf_counter()
    stream = agent.stream(prompt, settings=RunSettings(approver=AutoApprove()))  # type: ignore[attr-defined]
    async for event in stream:
        if event.type in ("content_delta", "tool_call_start") and out.first_token_s is None:
            out.first_token_s = time.perf_counter() - started
        if event.type == "content_delta" and out.first_text_s is None:
            out.first_text_s = time.perf_counter() - started
        if event.type == "tool_call_start":
            out.tools.append(event.name)
            out.calls[event.tool_call_id] = [event.name]
        elif event.type == "tool_call_delta":
            out.calls[event.tool_call_id].append(event.args_delta)
        elif event.type == "approval_required":
            out.approvals += 1
    out.seconds = time.perf_counter() - started
    result = stream.result
    if result is None:
        out.error = "the run did not end"
    else:
        out.output = result.output
        out.model_finishes = [m.metadata.get("finish_reason") for m in result.new_messages()
                              if m.role == "assistant" and "finish_reason" in m.metadata]
        if result.error:
            out.error = f"{result.error['code']}: {result.error['message']}"
        elif result.finish_reason not in ("end_turn", "max_iterations"):
            out.error = f"finish_reason {result.finish_reason}"  # e.g. empty_response: the loop's fixed answer
    return out


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> None:
    server, base = serve()
    model = LocalModel(args.model, tool_protocol=args.method, routing=args.routing, n_threads=args.threads,
                       examples=not args.examples_off, copy_bias=args.copy_bias)
    load_started = time.perf_counter()
    _load(model.path, model.n_ctx, model.chat_format, model.n_threads)
    load_s = time.perf_counter() - load_started
    agent = assistant(model)
    load_before = os.getloadavg()
    results: list[tuple[Case, Outcome, bool]] = []
    for _ in range(args.repeat):
        for case in SETS[args.set](base):
            if args.only and case.kind not in args.only:
                continue
            outcome = await run_one(agent, case.prompt)
            ok = case.check(outcome)
            results.append((case, outcome, ok))
            if args.verbose:
                mark = "ok  " if ok else "FAIL"
                first = f"{outcome.first_token_s:5.2f}" if outcome.first_token_s is not None else "  -  "
                calls = " ".join(f"{c[0]}({''.join(c[1:])})" for c in outcome.calls.values())
                cut = " LENGTH" if "length" in outcome.model_finishes else ""
                print(f"{mark}{cut} {outcome.seconds:6.2f}s first {first}s {case.prompt!r} {calls} "
                      f"-> {outcome.output.strip()[:110]!r}" + (f" ERROR {outcome.error}" if outcome.error else ""))
    server.shutdown()
    seconds = [o.seconds for _, o, _ in results]
    firsts = [o.first_token_s for _, o, _ in results if o.first_token_s is not None]
    texts = [o.first_text_s for _, o, _ in results if o.first_text_s is not None]
    passed = sum(ok for *_, ok in results)
    greeting_errors = sum(1 for c, o, _ in results if c.kind == "greeting" and (o.error or not o.output.strip()))
    by_kind: dict[str, list[bool]] = {}
    for c, _, ok in results:
        by_kind.setdefault(c.kind, []).append(ok)
    print(f"model {model.name} ({model.path.name}) · method {args.method} · routing {args.routing} · "
          f"threads {args.threads} · examples {'off' if args.examples_off else 'on'} · prompts {args.set} · "
          f"load {load_s:.2f} s")
    print(f"  pass {passed}/{len(results)} ({100 * passed / len(results):.0f} %); by category:")
    for kind, oks in by_kind.items():
        print(f"    {kind:<12} {sum(oks):>3}/{len(oks):<3} ({100 * sum(oks) / len(oks):.0f} %)")
    print(f"  seconds per answer: median {statistics.median(seconds):.2f} · p90 {p90(seconds):.2f} · "
          f"first token median {statistics.median(firsts) if firsts else float('nan'):.2f} "
          f"({len(firsts)}/{len(results)} streamed) · first text median "
          f"{statistics.median(texts) if texts else float('nan'):.2f}")
    print(f"  greetings with an error or blank: {greeting_errors}")
    print(f"  load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (2 cores, shared)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default=None, help="embedded model name or .gguf path (default smollm2)")
    parser.add_argument("--method", default="grammar", choices=["grammar", "native", "prompt"])
    parser.add_argument("--routing", default="channel", choices=["channel", "direct"],
                        help="grammar method: route by the noisy channel, or let the model choose in its reply")
    parser.add_argument("--set", default="main", choices=list(SETS),
                        help="the 25 main prompts, the dev set (tune on it), the held-out set (never tune on "
                             "it; run it without -v) or main and dev (all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--copy-bias", action="store_true", help="favour copying the user's text into arguments")
    parser.add_argument("--no-examples", dest="examples_off", action="store_true", help="no worked turns")
    parser.add_argument("--repeat", type=int, default=1, help="run the prompt set this many times")
    parser.add_argument("--only", nargs="*", help="only prompts of these kinds (main: greeting arithmetic time "
                        "fact web; dev: small-talk arithmetic percentages conversions dates facts rewrites web)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every answer")
    asyncio.run(main(parser.parse_args()))
