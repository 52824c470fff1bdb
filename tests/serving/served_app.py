"""A tiny OpenAI-style server from the standard library, run as a job serving on ``$IRIS_PORT_HTTP``.

``POST /v1/chat/completions`` with ``"stream": true`` answers in server-sent events, one token per
event; after the first token it waits for the file ``<$SERVING_GATE_DIR>/<gate>`` (``gate`` from the
request body) before sending the rest, so a test can prove the first token arrived while the server
was still holding the others. ``GET /redirect`` answers 302 to the root-relative ``/landed``;
``POST /echo`` reads the body in pieces and answers its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKENS = ["Hello", " from", " the", " peer", "!"]
GATE_TIMEOUT_S = 120


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        sys.stdout.write("served: " + (format % args) + "\n")
        sys.stdout.flush()

    def _send(self, status: int, body: bytes, content_type: str = "text/plain", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self._send(302, b"", Location="/landed")
        elif self.path == "/landed":
            self._send(200, b"landed")
        else:
            self._send(
                200,
                json.dumps({"path": self.path, "cookie": self.headers.get("Cookie", "")}).encode(),
                "application/json",
            )

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        if self.path == "/echo":
            digest, left = hashlib.sha256(), length
            while left:
                piece = self.rfile.read(min(left, 1 << 16))
                if not piece:
                    break
                digest.update(piece)
                left -= len(piece)
            self._send(
                200, json.dumps({"bytes": length - left, "sha256": digest.hexdigest()}).encode(), "application/json"
            )
            return
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/chat/completions" or not request.get("stream"):
            self._send(404, b"not found")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        gate = Path(os.environ.get("SERVING_GATE_DIR", ".")) / str(request.get("gate", "gate"))
        for index, token in enumerate(TOKENS):
            if index == 1:  # the first token is out: hold the rest until the test has seen it
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not gate.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            event = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": token}}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["IRIS_PORT_HTTP"])), Handler)
    print(f"serving on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
