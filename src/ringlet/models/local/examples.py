"""What a small local model is shown about ringlet's built-in tools: worked turns and routing contexts.

- Worked turns (`example_turns`): short exchanges that show how a call is written and how a result is
  turned into an answer. One is shown when every tool it uses is offered under that name (the built-ins
  keep their names), the plain ones whenever any tool is. They go between the system turn and the
  conversation, the same for every request, so the model keeps them evaluated in its KV cache.
- Routing contexts (`route_contexts`): for the noisy-channel router (`route.py`), a line saying
  what each route is for and a few requests that take it. A tool without examples here gets a context
  made from its description.

The questions differ from those `bench/assistant.py` asks: they teach the form, not the answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ringlet.messages import ToolDefinition
from ringlet.models.local.prompt import call_text, result_text


@dataclass(frozen=True, slots=True)
class Example:
    tools: frozenset[str]
    turns: tuple[tuple[str, str], ...]


def _call(name: str, arguments: str) -> tuple[str, str]:
    return ("assistant", call_text(name, arguments))


def _result(text: str) -> tuple[str, str]:
    return ("user", result_text(text))


def _page(url: str, title: str, text: str) -> str:
    """A `web_fetch` result, in the shape the tool returns."""
    content = f"{title}\n{text}"
    return json.dumps({"url": url, "final_url": url, "status": 200, "content_type": "text/html", "title": title,
                       "content": content, "length": len(content), "truncated": False}, separators=(",", ":"))


EXAMPLES = (
    Example(frozenset(), (("user", "Hi there!"), ("assistant", "Hello! How can I help you today?"))),
    Example(frozenset({"web_fetch"}), (
        ("user", "What does https://example.org/hours say?"),
        _call("web_fetch", '{"url": "https://example.org/hours"}'),
        _result(_page("https://example.org/hours", "Opening hours", "The library opens at 10 am on Sundays.")),
        ("assistant", "Opening hours: The library opens at 10 am on Sundays."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "What is 12 * 9?"),
        _call("calculate", '{"expression": "12 * 9"}'),
        _result("108"),
        ("assistant", "12 * 9 = 108."),
    )),
    Example(frozenset(), (("user", "What is the capital of Italy?"),
                          ("assistant", "The capital of Italy is Rome."))),
    Example(frozenset({"current_time"}), (
        ("user", "What time is it in Paris?"),
        _call("current_time", '{"timezone": "Europe/Paris"}'),
        _result("Monday 2025-06-02 11:15:42 CEST"),
        ("assistant", "In Paris it is Monday 2025-06-02 11:15:42 CEST."),
    )),
    Example(frozenset({"web_fetch"}), (
        ("user", "Read http://status.example.net/today and tell me what it says."),
        _call("web_fetch", '{"url": "http://status.example.net/today"}'),
        _result(_page("http://status.example.net/today", "Status", "All systems are running.")),
        ("assistant", "Status: All systems are running."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "What is 3 to the power of 4?"),
        _call("calculate", '{"expression": "3 ** 4"}'),
        _result("81"),
        ("assistant", "3 ** 4 = 81."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "What is 6 cubed?"),
        _call("calculate", '{"expression": "6 ** 3"}'),
        _result("216"),
        ("assistant", "6 ** 3 = 216."),
    )),
    Example(frozenset(), (("user", "How are you?"),
                          ("assistant", "I'm doing well, thank you! How can I help you?"))),
    Example(frozenset({"current_time"}), (
        ("user", "Which day is it?"),
        _call("current_time", "{}"),
        _result("Friday 2025-03-14 08:02:10 UTC"),
        ("assistant", "It is Friday 2025-03-14 08:02:10 UTC."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "What is the square root of 81?"),
        _call("calculate", '{"expression": "sqrt(81)"}'),
        _result("9"),
        ("assistant", "sqrt(81) = 9."),
    )),
    Example(frozenset({"current_time"}), (
        ("user", "Tell me the current time."),
        _call("current_time", "{}"),
        _result("Tuesday 2024-10-08 17:30:05 UTC"),
        ("assistant", "It is Tuesday 2024-10-08 17:30:05 UTC."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "What is 20% of 50?"),
        _call("calculate", '{"expression": "20% of 50"}'),
        _result("20% of 50 = 10"),
        ("assistant", "20% of 50 = 10."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "How many centimeters is 4 inches?"),
        _call("calculate", '{"expression": "4 inches to cm"}'),
        _result("4 in = 10.16 cm"),
        ("assistant", "4 in = 10.16 cm."),
    )),
    Example(frozenset({"calculate"}), (
        ("user", "What is 50 degrees Fahrenheit in Celsius?"),
        _call("calculate", '{"expression": "50 f to c"}'),
        _result("50 °F = 10 °C"),
        ("assistant", "50 °F = 10 °C."),
    )),
    Example(frozenset(), (("user", "How many legs does a spider have?"),
                          ("assistant", "A spider has eight legs."))),
)


CHARSETS = {
    "calculate": {"expression": r"[0-9a-z+*/%()., \-]"},
    "current_time": {"timezone": r"[A-Za-z0-9_/+\-]"},
    "web_fetch": {"url": r'[^"\\\x00-\x20]'},
}
"""The characters each built-in tool's string argument can be written in (GBNF classes): what
`calculate` evaluates (`^` is not a power there, though small models write it), an IANA zone name, a URL."""

ANSWER = "(answer)"
"""The route that answers without a tool (not a valid tool name)."""
ROUTES = {
    ANSWER: ("Greetings, small talk, general knowledge questions, rewrites and translations:", (
        "Hi there!", "Hello, how are you?", "What is the capital of Italy?", "Thank you so much!",
        "Who painted the Mona Lisa?", "Good night!", "How many legs does a spider have?", "What is your name?",
        "How many minutes are in an hour?", "Translate 'water' into French.", "Say this more politely: Sit down.")),
    "calculate": ("Arithmetic, percentages and unit conversions:", (
        "What is 12 * 9?", "How much is 250 divided by 8?", "What is 3 to the power of 4?", "What is 20% of 50?",
        "Compute 45 + 67.", "How many centimeters is 4 inches?", "What is 50 degrees Fahrenheit in Celsius?",
        "Convert 3 ounces to grams.", "What percent of 40 is 10?", "How many miles is 10 km?")),
    "current_time": ("Questions about the date or the time:", (
        "What time is it in Paris?", "What is the date today?", "What day is it?", "What is the time now?")),
    "web_fetch": ("Requests to read a web page:", (
        "What does https://example.org/hours say?", "Read http://status.example.net/today and tell me what it says.",
        "Summarize https://example.com/blog/post for me.")),
}
ANSWER_PRIOR = 2.0
"""The answer route's head start, in nats: calling a tool for small talk is the worse mistake."""


def route_contexts(tools: Sequence[ToolDefinition]) -> dict[str, str]:
    """The router's context for answering and for each tool offered: a heading and example requests
    when every tool has examples here; otherwise headings alone for every route, a tool's made from its
    description (the answer route's examples would outweigh a tool that has none: weather questions
    went to a plain answer), which routes 11 of 13 requests to made-up tools right."""
    if all(t.name in ROUTES for t in tools):
        names = (ANSWER, *(t.name for t in tools))
        return {name: "\n".join((ROUTES[name][0], *ROUTES[name][1])) + "\n" for name in names}
    out = {ANSWER: ROUTES[ANSWER][0] + "\n"}
    for tool in tools:
        summary = (tool.description.strip().splitlines() or [tool.name])[0]
        out[tool.name] = f"{summary}\nRequests for that ({tool.name.replace('_', ' ')}):\n"
    return out


def example_turns(tools: set[str]) -> list[dict[str, str]]:
    """The example turns for a request offering `tools` (none without tools)."""
    if not tools:
        return []
    return [{"role": role, "content": content} for ex in EXAMPLES if ex.tools <= tools for role, content in ex.turns]
