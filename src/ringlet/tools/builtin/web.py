"""`web_fetch` (`builtin-tools-and-subagents.md` §5): a page as readable text, and never an internal address.

Every address the host resolves to is checked (loopback, private, link-local and metadata, carrier-grade
NAT, unspecified, multicast are refused): first before the call is run, or anyone asked to approve it (the
tool's `check`), then again as it connects, and the connection is made to the checked address itself, so a
second DNS answer cannot point it elsewhere (DNS rebinding). Redirects are followed by hand, at most 5, each
checked again. HTML becomes text through a real parser (BeautifulSoup): scripts, styles and navigation
dropped, headings, list items and link text kept, whitespace collapsed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

from ringlet.errors import ToolFailure
from ringlet.tools.base import ArgumentsInvalid, Tool

MAX_CHARS = 50_000
MAX_BYTES = 5 * 1024 * 1024
MAX_REDIRECTS = 5
TIMEOUT_S = 20.0
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_TEXTUAL = ("text/", "application/json", "application/xml", "application/xhtml+xml", "application/ld+json")


@dataclass(frozen=True, slots=True)
class WebFetchSettings:
    """`web_fetch:` in config: reach private addresses anyway, or only some hosts."""

    allow_private: bool = False
    allow_hosts: frozenset[str] = field(default_factory=frozenset)


def blocked(address: str) -> bool:
    """Whether an IP address is one `web_fetch` must not reach."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified or ip.is_multicast
            or ip.is_reserved or (isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT))


async def resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def readable(html: str) -> tuple[str | None, str]:
    """The title and the readable text of an HTML page."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else None
    for tag in soup(["script", "style", "nav", "noscript", "template", "head"]):
        tag.decompose()
    lines = (" ".join(line.split()) for line in soup.get_text("\n").splitlines())
    return title, "\n".join(line for line in lines if line)


def _validate(args: dict[str, Any]) -> dict[str, Any]:
    errors = []
    if not isinstance(args.get("url"), str) or not args["url"].strip():
        errors.append("url: Field required (a string)")
    if not isinstance(args.get("extract_text", True), bool):
        errors.append("extract_text: a boolean")
    max_chars = args.get("max_chars", MAX_CHARS)
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or not 1 <= max_chars <= MAX_CHARS:
        errors.append(f"max_chars: an integer from 1 to {MAX_CHARS}")
    if errors:
        raise ArgumentsInvalid(errors)
    scheme = urlsplit(args["url"]).scheme.lower()
    if scheme not in ("http", "https"):
        raise ArgumentsInvalid([f"url: unsupported scheme {scheme!r}; only http and https"])
    return {"url": args["url"].strip(), "extract_text": args.get("extract_text", True), "max_chars": max_chars}


async def fetch(url: str, *, extract_text: bool = True, max_chars: int = MAX_CHARS,
                settings: WebFetchSettings | None = None) -> dict[str, Any]:
    """GET `url` with the address checks, the redirect limit, the size cap and text extraction."""
    import httpx

    settings = settings or WebFetchSettings()
    current = url
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(current)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ToolFailure("invalid_arguments", f"unsupported URL {current!r}; only http and https")
            host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
            address = await _checked(host, port, settings)
            target = parts._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
            request = client.build_request("GET", target.geturl(), headers={
                "Host": parts.netloc.rsplit("@", 1)[-1], "User-Agent": "ringlet-web-fetch/1",
                "Accept": "text/html, text/*, application/json, application/xml;q=0.9, */*;q=0.1"},
                extensions={"sni_hostname": host} if parts.scheme == "https" else {})
            response = await client.send(request, stream=True)
            try:
                if response.is_redirect and "location" in response.headers:
                    current = urljoin(current, response.headers["location"])
                    continue
                body = await _read(response)
            finally:
                await response.aclose()
            return _result(url, current, response, body, extract_text=extract_text, max_chars=max_chars)
    raise ToolFailure("tool_error", f"more than {MAX_REDIRECTS} redirects from {url}")


async def _checked(host: str, port: int, settings: WebFetchSettings) -> str:
    """The address to connect to: the first one the host resolves to, after checking all of them."""
    try:
        addresses = await resolve(host, port)
    except OSError as exc:
        raise ToolFailure("tool_error", f"cannot resolve {host}: {exc}") from None
    if not (settings.allow_private or host.lower() in settings.allow_hosts):
        bad = [a for a in addresses if blocked(a)]
        if bad:
            raise ToolFailure("blocked_address", f"{host} resolves to a private address ({bad[0]}); web_fetch "
                              "reaches only public addresses")
    return addresses[0]


async def _read(response: Any) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_BYTES:
            raise ToolFailure("tool_error", f"the response is larger than {MAX_BYTES // (1024 * 1024)} MB")
        chunks.append(chunk)
    return b"".join(chunks)


def _result(url: str, final: str, response: Any, body: bytes, *, extract_text: bool,
            max_chars: int) -> dict[str, Any]:
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type and not content_type.startswith(_TEXTUAL):
        raise ToolFailure("unsupported_content_type", f"{content_type} is not text, HTML, JSON or XML")
    text = body.decode(response.encoding or "utf-8", errors="replace")
    title = None
    if extract_text and content_type in ("text/html", "application/xhtml+xml", ""):
        title, text = readable(text)
    out: dict[str, Any] = {"url": url, "final_url": final, "status": response.status_code,
                           "content_type": content_type or None}
    if title:
        out["title"] = title
    return {**out, "content": text[:max_chars], "length": len(text), "truncated": len(text) > max_chars}


async def refused(url: str, settings: WebFetchSettings | None = None) -> None:
    """Raise `blocked_address` (or why the host cannot be resolved) for a URL `fetch` would refuse to reach:
    the tool's `check`, so a call to an internal address is refused before anyone is asked to approve it."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ToolFailure("invalid_arguments", f"url: {exc}") from None
    if parts.hostname:
        await _checked(parts.hostname, port, settings or WebFetchSettings())


def web_fetch_tool(settings: WebFetchSettings | None = None) -> Tool:
    """The `web_fetch` tool (read, 20 s), with its settings."""

    async def check(args: dict[str, Any]) -> None:
        await refused(args["url"], settings)

    async def run(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return await fetch(args["url"], extract_text=args["extract_text"], max_chars=args["max_chars"],
                           settings=settings)

    return Tool(name="web_fetch", run=run, validate=_validate, check=check, effect="read", approval="auto",
                timeout_s=TIMEOUT_S, max_chars=MAX_CHARS + 2_000, takes_context=False,
                description="Fetch a web page (http/https) and return its readable text.",
                parameters={"type": "object", "properties": {
                    "url": {"type": "string", "description": "An http or https URL."},
                    "extract_text": {"type": "boolean", "default": True,
                                     "description": "HTML as readable text (default) or as it is."},
                    "max_chars": {"type": "integer", "minimum": 1, "maximum": MAX_CHARS, "default": MAX_CHARS}},
                    "required": ["url"]})
