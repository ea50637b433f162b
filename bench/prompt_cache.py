"""What prompt caching saves: a 10-turn tool-using conversation with Anthropic's prompt cache on and off.

    .venv/bin/python bench/prompt_cache.py [--turns 10]

The agent talks to a loopback server that speaks Anthropic's Messages API (streamed) and keeps a prompt cache
the way the API documents it: a `cache_control` breakpoint caches the prompt up to it (tools, then system,
then messages); a later request that starts with a cached prefix (found at a block boundary up to 20 blocks
before one of its breakpoints) reads it; what lies between the longest prefix read and the last breakpoint is
written. Tokens are counted as a quarter of a block's JSON characters. Each user turn makes two requests (a
tool call, then the answer). The cost is what ringlet's pricing table makes of the usage the server returns
(`anthropic:claude-sonnet-4`: $3 / M input, $0.30 cached read, $3.75 cache write, $15 output).

This measures ringlet's cache points against a model of the cache, not Anthropic's servers (none is
reachable here); the token counts are the mock's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ringlet import Agent, tool
from ringlet.models.anthropic import AnthropicModel
from ringlet.models.base import ModelSettings
from ringlet.models.pricing import DEFAULT_PRICING
from ringlet.usage import RequestUsage

LOOKBACK = 20
"""How many block boundaries before a breakpoint the API looks for a cached prefix."""


def _tokens(block: Any) -> int:
    return math.ceil(len(json.dumps(block, sort_keys=True)) / 4)


def _bare(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def blocks_of(body: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """The prompt as the cache sees it, in its order (tools, system, messages): each block without its mark,
    and whether it carried a breakpoint."""
    system = body.get("system") or []
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    out = [(_bare(t), "cache_control" in t) for t in body.get("tools") or []]
    out += [(_bare(b), "cache_control" in b) for b in system]
    for m in body["messages"]:
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        out += [({"role": m["role"], **_bare(b)}, "cache_control" in b) for b in content]
    return out


class PromptCache:
    """Anthropic's prompt cache, as documented, for one API key."""

    def __init__(self) -> None:
        self.prefixes: set[str] = set()
        self.lock = threading.Lock()

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        """The `usage` of `message_start` for a request: input, cache read and cache write tokens."""
        blocks = blocks_of(body)
        sizes = [0]
        digests = [hashlib.sha256(b"").hexdigest()]
        for block, _ in blocks:
            sizes.append(sizes[-1] + _tokens(block))
            digests.append(hashlib.sha256((digests[-1] + json.dumps(block, sort_keys=True)).encode()).hexdigest())
        marks = [i + 1 for i, (_, marked) in enumerate(blocks) if marked]
        with self.lock:
            read = max((j for m in marks for j in range(max(1, m - LOOKBACK), m + 1) if digests[j] in self.prefixes),
                       default=0)
            written = max(marks, default=0)
            self.prefixes.update(digests[m] for m in marks)
        write = sizes[written] - sizes[read] if written > read else 0
        return {"input_tokens": sizes[-1] - sizes[read] - write, "cache_read_input_tokens": sizes[read],
                "cache_creation_input_tokens": write, "output_tokens": 1}


def _events(usage: dict[str, int], body: dict[str, Any]) -> bytes:
    """A streamed answer: a `lookup` call after a user's question, a sentence after the tool's result."""
    last = body["messages"][-1]["content"]
    answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
    if answered:
        block, delta, stop = ({"type": "text", "text": ""},
                              {"type": "text_delta", "text": "Order 7 shipped on Monday and arrives Thursday."},
                              "end_turn")
    else:
        block, delta, stop = ({"type": "tool_use", "id": f"toolu_{len(body['messages'])}", "name": "lookup",
                               "input": {}}, {"type": "input_json_delta", "partial_json": '{"order": 7}'},
                              "tool_use")
    events = [{"type": "message_start", "message": {"id": "msg", "type": "message", "role": "assistant",
                                                    "content": [], "model": body["model"], "stop_reason": None,
                                                    "stop_sequence": None, "usage": usage}},
              {"type": "content_block_start", "index": 0, "content_block": block},
              {"type": "content_block_delta", "index": 0, "delta": delta},
              {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
               "usage": {"output_tokens": 24}},
              {"type": "message_stop"}]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


class CachingServer:
    """A loopback Anthropic Messages endpoint with a `PromptCache`; `bodies` records every request."""

    def __init__(self) -> None:
        self.cache = PromptCache()
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                outer.bodies.append(body)
                payload = _events(outer.cache.usage(body), body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> CachingServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


INSTRUCTIONS = "\n".join(
    f"{n}. When a customer asks about orders, look the order up first, then answer in one sentence; "
    f"policy note {n}: refunds within 30 days, exchanges within 60, shipping quotes in business days."
    for n in range(1, 61))
"""A support agent's instructions: about 2,000 tokens, as production system prompts often are."""


@tool
def lookup(order: int) -> str:
    """Look an order up by its number: its status and dates."""
    return f"order {order}: shipped Monday, arriving Thursday, carrier parcel-co, 2 items"


async def conversation(url: str, turns: int, *, cache: bool) -> list[RequestUsage]:
    """`turns` user messages to one agent, each answered after a tool call; every request's usage."""
    agent = Agent(AnthropicModel("claude-sonnet-4-5", api_key="sk-ant-bench", base_url=url),
                  instructions=INSTRUCTIONS, tools=[lookup], model_settings=ModelSettings(prompt_cache=cache))
    history: list[Any] = []
    usages: list[RequestUsage] = []
    for turn in range(turns):
        result = await agent.run(f"Where is my order? (question {turn + 1})", history=history)
        usages += [RequestUsage(**m.metadata["usage"]) for m in result.new_messages() if m.role == "assistant"]
        history = result.messages
    return usages


def totals(usages: list[RequestUsage]) -> dict[str, float]:
    cost = sum(DEFAULT_PRICING.cost(u) or 0.0 for u in usages)
    return {"requests": len(usages), "input": sum(u.in_tokens for u in usages),
            "read": sum(u.cache_read_tokens or 0 for u in usages),
            "written": sum(u.cache_write_tokens or 0 for u in usages),
            "output": sum(u.out_tokens for u in usages), "cost": cost}


async def main(turns: int) -> dict[str, dict[str, float]]:
    out = {}
    for cache in (False, True):
        with CachingServer() as server:
            out["on" if cache else "off"] = totals(await conversation(server.url, turns, cache=cache))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    result = asyncio.run(main(args.turns))
    print(f"{args.turns}-turn tool-using conversation, anthropic:claude-sonnet-4 prices")
    print(f"{'caching':8} {'requests':>8} {'input tok':>10} {'cache read':>10} {'cache write':>11} "
          f"{'output':>7} {'cost USD':>9}")
    for name, t in result.items():
        print(f"{name:8} {t['requests']:8.0f} {t['input']:10.0f} {t['read']:10.0f} {t['written']:11.0f} "
              f"{t['output']:7.0f} {t['cost']:9.4f}")
    off, on = result["off"]["cost"], result["on"]["cost"]
    print(f"caching saves {100 * (off - on) / off:.0f} % of the cost")
