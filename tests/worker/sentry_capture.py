"""A Sentry server for tests: it takes the envelopes real processes send to a loopback DSN.

`SentryCapture` listens on a free loopback port and answers every `POST /api/<project>/envelope/`
with 200, keeping the body as it came over the wire (gunzipped when the sender compressed it) and
its items parsed by Sentry's envelope format: a JSON header line, then for each item a JSON header
line and its payload (`length` bytes when the header says, else up to the next newline). Point a
process at `capture.dsn`; what the capture holds is exactly what left it.
"""

import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


@dataclass(frozen=True)
class Item:
    """One item of an envelope: its type (`event`, `session`, `client_report`…) and payload."""

    type: str
    headers: dict[str, Any]
    payload: bytes

    def json(self) -> Any:
        """The payload as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.payload)
        except ValueError:
            return None


@dataclass(frozen=True)
class Envelope:
    """One envelope as it arrived: its raw (decompressed) body, header and items."""

    body: bytes
    headers: dict[str, Any]
    items: list[Item]


class SentryCapture:
    """A loopback HTTP server that keeps every Sentry envelope sent to `dsn`."""

    def __init__(self, key: str = "leakkey") -> None:
        self.envelopes: list[Envelope] = []
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                capture._keep(
                    bytes(self.requestline, "latin-1") + b"\n" + bytes(self.headers), body
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.dsn = f"http://{key}@127.0.0.1:{self._server.server_address[1]}/1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def events(self) -> list[dict[str, Any]]:
        """The error and message events received so far."""
        with self._lock:
            envelopes = list(self.envelopes)
        return [
            payload
            for envelope in envelopes
            for item in envelope.items
            if item.type == "event" and isinstance(payload := item.json(), dict)
        ]

    def received(self) -> bytes:
        """Everything received: each request's line and headers, then its decompressed body."""
        with self._lock:
            return b"\n".join(self.requests)

    def wait_for(
        self, condition: Callable[[list[dict[str, Any]]], bool], what: str, timeout_s: float = 30
    ) -> list[dict[str, Any]]:
        """Wait until `condition(events)` holds, and return the events."""
        deadline = time.monotonic() + timeout_s
        while not condition(events := self.events()):
            assert time.monotonic() < deadline, f"no {what} in {timeout_s}s; got {events}"
            time.sleep(0.1)
        return events

    def _keep(self, head: bytes, body: bytes) -> None:
        envelope = parse_envelope(body)
        with self._lock:
            self.requests.append(head + b"\n" + body)
            self.envelopes.append(envelope)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


def parse_envelope(body: bytes) -> Envelope:
    """Parse Sentry's envelope format: a header line, then items of a header line and payload."""
    header_line, _, rest = body.partition(b"\n")
    items = []
    while rest.strip():
        item_line, _, rest = rest.partition(b"\n")
        item_headers = json.loads(item_line)
        if "length" in item_headers:
            length = int(item_headers["length"])
            payload, rest = rest[:length], rest[length:]
            rest = rest.removeprefix(b"\n")
        else:
            payload, _, rest = rest.partition(b"\n")
        items.append(Item(str(item_headers.get("type")), item_headers, payload))
    return Envelope(body, json.loads(header_line), items)
