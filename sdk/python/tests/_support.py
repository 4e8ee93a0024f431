"""Shared by the tests: makes ``hostd`` importable from this checkout (no installation
needed), a scripted fake hostd for pure client logic, and the switch for integration tests."""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

SDK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if SDK_DIR not in sys.path:
    sys.path.insert(0, SDK_DIR)

REPO_ROOT = os.path.dirname(os.path.dirname(SDK_DIR))

#: The real hostd to test against, from the environment; integration tests skip without it.
LIVE_URL = os.environ.get("SERVICE_HOSTD_URL", "").strip() or None
SKIP_LIVE_REASON = "SERVICE_HOSTD_URL is not set: integration tests against a real hostd are skipped"


class Request:
    def __init__(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    @property
    def route(self) -> str:
        """The path without its query string."""
        return self.path.split("?", 1)[0]

    @property
    def params(self) -> Dict[str, str]:
        """The query string's parameters (the last value of each)."""
        from urllib.parse import parse_qsl

        return dict(parse_qsl(self.path.split("?", 1)[1] if "?" in self.path else ""))


Handler = Callable[[Request, "Responder"], None]


class Responder:
    """What a fake handler uses to answer: whole responses or an NDJSON stream."""

    def __init__(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        self._h = handler

    def json(self, status: int, body: Any, headers: Optional[Dict[str, str]] = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self._h.send_response(status)
        self._h.send_header("content-type", "application/json")
        self._h.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self._h.send_header(name, value)
        self._h.end_headers()
        self._h.wfile.write(data)

    def error(self, status: int, message: str, code: Optional[str] = None, headers: Optional[Dict[str, str]] = None) -> None:
        """``{"error": message}``, with ``code`` when given (as hostd does; without it, like a
        server or proxy that sends none)."""
        body = {"error": message} if code is None else {"error": message, "code": code}
        self.json(status, body, headers)

    def raw(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self._h.send_response(status)
        self._h.send_header("content-type", content_type)
        self._h.send_header("content-length", str(len(body)))
        self._h.end_headers()
        self._h.wfile.write(body)

    def empty(self, status: int = 204) -> None:
        self._h.send_response(status)
        self._h.send_header("content-length", "0")
        self._h.end_headers()

    def start_stream(self) -> None:
        self._h.send_response(200)
        self._h.send_header("content-type", "application/x-ndjson")
        self._h.send_header("transfer-encoding", "chunked")
        self._h.end_headers()

    def write(self, data: bytes) -> None:
        """One chunk of a chunked body, flushed at once."""
        self._h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self._h.wfile.flush()

    def event(self, kind: str, data: Any, seq: int, **extra: Any) -> None:
        line = dict(type=kind, data=data, seq=seq, ts=int(time.time() * 1000), **extra)
        self.write((json.dumps(line) + "\n").encode("utf-8"))

    def end_stream(self) -> None:
        self._h.wfile.write(b"0\r\n\r\n")
        self._h.wfile.flush()

    def drop(self) -> None:
        """Closes the connection abruptly."""
        self._h.close_connection = True
        self._h.wfile.flush()
        self._h.connection.shutdown(2)


class FakeHostd:
    """A scripted stand-in for hostd on 127.0.0.1:0 that records every request."""

    def __init__(self, handler: Optional[Handler] = None) -> None:
        self.requests: List[Request] = []
        self.handler: Handler = handler or default_handler
        fake = self

        class _Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _read_body(self) -> bytes:
                if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline().strip():
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("content-length") or 0)
                return self.rfile.read(length) if length else b""

            def _serve(self) -> None:
                body = self._read_body()
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                fake.requests.append(req)
                try:
                    fake.handler(req, Responder(self))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], OSError):  # a client that went away is normal
                    super().handle_error(request, client_address)

        self._server = _Server(("127.0.0.1", 0), _Handler)
        self.url = "http://127.0.0.1:%d" % self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


SANDBOX_ID = "sbx_" + "a" * 32


def info(sandbox_id: str) -> Dict[str, Any]:
    return {
        "id": sandbox_id,
        "state": "ready",
        "template": "python",
        "created_at": "2026-01-01T00:00:00.000Z",
        "last_used_at": "2026-01-01T00:00:00.000Z",
        "parent_id": None,
        "busy": False,
        "queued": 0,
    }


def default_handler(req: Request, res: Responder) -> None:
    if req.method == "POST" and req.path == "/v1/sandboxes":
        return res.json(200, {"id": SANDBOX_ID, "state": "ready"})
    parts = req.path.split("/")
    if req.method == "GET" and len(parts) == 4 and parts[3].startswith("sbx_"):
        return res.json(200, info(parts[3]))
    return res.error(404, "no route for %s %s" % (req.method, req.path), "route_not_found")
