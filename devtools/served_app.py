"""A tiny OpenAI-style server from the standard library, run as a job serving on ``$IRIS_PORT_HTTP``.

``POST /v1/chat/completions`` with ``"stream": true`` answers in server-sent events, one token per
event, a few tenths of a second apart; with ``gate`` in the request body it instead waits, after
the first token, for the file ``<$SERVING_GATE_DIR>/<gate>`` before sending the rest, so a test can
prove the first token arrived while the server was still holding the others. ``POST /shutdown``
ends the job (exit 0). ``GET /redirect`` answers 302 to the root-relative ``/landed``;
``POST /ndjson`` streams the tokens as chunked JSON lines, gated the same way; ``POST /echo``
reads the body in pieces and answers its size and SHA-256; ``POST /endless`` streams chunked lines
until the caller goes away, and says so in its output; ``GET /ws`` is a WebSocket echo. ``$SERVING_LIFETIME_S``
(optional) stops the server after that many seconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKENS = ["Hello", " from", " the", " peer", "!"]
GATE_TIMEOUT_S = 120
TOKEN_INTERVAL_S = 0.3
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # a WebSocket upgrade needs it; streams end by closing the connection

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
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self._echo_websocket()
        elif self.path == "/redirect":
            self._send(302, b"", Location="/landed")
        elif self.path == "/landed":
            self._send(200, b"landed")
        else:
            self._send(
                200,
                json.dumps({"path": self.path, "cookie": self.headers.get("Cookie", "")}).encode(),
                "application/json",
            )

    def _chunked_lines(self, request: dict[str, object]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        gate = Path(os.environ.get("SERVING_GATE_DIR", ".")) / str(request.get("gate", "gate"))
        for index, token in enumerate(TOKENS):
            if index == 1:
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not gate.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            line = json.dumps({"token": token}).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _endless(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        deadline = time.monotonic() + GATE_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                line = json.dumps({"line": sent}).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                sent += 1
                time.sleep(0.05)
        except OSError:  # the connection was closed from the other end
            sys.stdout.write(f"served: /endless: the caller went away after {sent} lines\n")
            sys.stdout.flush()
        self.close_connection = True

    def _echo_websocket(self) -> None:
        """A WebSocket (RFC 6455) that echoes each text or binary message until the client closes."""
        accept = base64.b64encode(hashlib.sha1(self.headers["Sec-WebSocket-Key"].encode() + WS_GUID).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                break
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack("!H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 0x8:  # close: answer it and stop
                self.wfile.write(b"\x88\x00")
                break
            if opcode in (0x1, 0x2):
                size = len(payload)
                header = bytes([0x80 | opcode]) + (
                    bytes([size])
                    if size < 126
                    else b"\x7e" + struct.pack("!H", size)
                    if size < 65536
                    else b"\x7f" + struct.pack("!Q", size)
                )
                self.wfile.write(header + payload)
                self.wfile.flush()
        self.close_connection = True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        if self.path == "/shutdown":  # the job ends (exit 0) once this answer is out
            self._send(200, b"shutting down")
            threading.Thread(target=self.server.shutdown).start()
            return
        if self.path == "/ndjson":  # the same tokens as chunked JSON lines, gated the same way
            self._chunked_lines(json.loads(self.rfile.read(length) or b"{}"))
            return
        if self.path == "/endless":  # chunked lines until the caller goes away, which it then logs
            self._endless()
            return
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
        gate = Path(os.environ.get("SERVING_GATE_DIR", ".")) / str(request["gate"]) if "gate" in request else None
        for index, token in enumerate(TOKENS):
            if index == 1 and gate is not None:  # the first token is out: hold the rest until the test saw it
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not gate.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            elif index and gate is None:
                time.sleep(TOKEN_INTERVAL_S)  # as a model would: one token at a time
            event = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": token}}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["IRIS_PORT_HTTP"])), Handler)
    print(f"serving on {server.server_address[1]}", flush=True)
    lifetime = float(os.environ.get("SERVING_LIFETIME_S", "0"))
    if lifetime:  # a safety net: a job nobody stops still ends
        timer = threading.Timer(lifetime, server.shutdown)
        timer.daemon = True  # a server shut down sooner (POST /shutdown) exits at once
        timer.start()
    server.serve_forever()


if __name__ == "__main__":
    main()
