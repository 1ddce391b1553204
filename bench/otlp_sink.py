"""A loopback OTLP/HTTP sink for the bench: it accepts every export and keeps nothing.

The pool with telemetry (`bench.contenders`, `pool2-otel`) exports its traces and metrics here,
as it would to a Collector on its host: what the bench measures is what exporting costs the
pool's processes, not what a backend does with it.
"""

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Accepting(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """Serve the sink on a free loopback port; yield its base URL; stop it after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
