"""A loopback HTTP server that answers each request with the next scripted response.

It speaks real HTTP, so every SDK's own transport (httpx or httpx2) is exercised; `broken=True` sends
the first part of a body, then drops the connection; `dropped=True` drops it without an answer.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Canned:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    broken: bool = False
    delay_s: float = 0.0
    dropped: bool = False
    """Close the connection without an answer (as a server that closed a kept-alive connection)."""


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Replay:
    def __init__(self) -> None:
        self.responses: deque[Canned] = deque()
        self.requests: list[Seen] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                replay.requests.append(Seen(self.path, dict(self.headers), self.rfile.read(length)))
                canned = replay.responses.popleft() if replay.responses else Canned(599, b'{"error":"no reply left"}')
                if canned.delay_s:  # a slow server
                    time.sleep(canned.delay_s)
                if canned.dropped:
                    self.close_connection = True
                    return
                self.send_response(canned.status)
                headers = {"content-type": "application/json", **canned.headers}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(canned.body) + (4096 if canned.broken else 0)))
                self.end_headers()
                self.wfile.write(canned.body)
                self.wfile.flush()
                if canned.broken:
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up (timeout tests) is expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, status: int = 200, body: bytes | dict[str, Any] = b"", headers: dict[str, str] | None = None,
            *, broken: bool = False, delay_s: float = 0.0, dropped: bool = False) -> None:
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        self.responses.append(Canned(status, raw, headers or {}, broken, delay_s, dropped))

    def __enter__(self) -> Replay:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
