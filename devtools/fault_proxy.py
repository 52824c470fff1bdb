"""A small HTTP reverse proxy on loopback that can lose one answer, or hold one request, on purpose.

Put between two deployments, it forwards every request unchanged. Armed with ``lose_next(path,
action)``, it forwards the next request for ``path`` to the upstream (so the upstream really
acts on it), runs ``action`` (e.g. stop the upstream's api-server), and then drops the client's
connection without an answer: the caller cannot tell whether its request was applied, which is
exactly the case an idempotent delivery must survive. Armed with ``hold_next(path)``, it keeps the
next request for ``path`` until the test releases it (other requests pass meanwhile): a call in
flight, for as long as the test needs to act while it is.

Given several upstreams (the api-servers of one highly available deployment), it takes turns
between them as a round-robin load balancer does (in turn for each path, so successive calls of one
kind alternate), passing over one that refuses connections (stopped or killed); ``served`` records
which upstream answered each request, and ``lost_upstreams`` which one acted on each lost answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


class Hold:
    """One request kept by the proxy: ``arrived`` once it is held, forwarded on ``release()``."""

    def __init__(self, path_prefix: str, timeout: float) -> None:
        self.path_prefix, self.timeout = path_prefix, timeout
        self.arrived, self.released = threading.Event(), threading.Event()

    def release(self) -> None:
        self.released.set()


class FaultProxy:
    def __init__(self, upstream: str, *more_upstreams: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.upstreams = [self.upstream, *(u.rstrip("/") for u in more_upstreams)]
        self._turns: dict[str, int] = {}
        self.lost_upstreams: list[str] = []
        self.served: list[tuple[str, str]] = []  # (path, upstream) of every request forwarded
        self._armed: tuple[str, Callable[[], None]] | None = None
        self._holds: list[Hold] = []  # armed, not yet taken
        self._made: list[Hold] = []
        self._lock = threading.Lock()
        self.lost: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                hold = proxy._take_hold(self.path)
                if hold is not None:
                    hold.arrived.set()
                    hold.released.wait(hold.timeout)
                action = proxy._take(self.path)
                response, served_by, refused = None, "", 0
                for upstream in proxy._in_turn(self.path):
                    try:
                        response = httpx.request(
                            self.command, upstream + self.path, headers=headers, content=body, timeout=60
                        )
                    except httpx.ConnectError:
                        refused += 1
                        continue  # not listening (stopped or killed): the next one, as a load balancer would
                    except httpx.HTTPError:
                        break
                    served_by = upstream
                    proxy.served.append((self.path, upstream))
                    break
                if response is None and refused == len(proxy.upstreams):
                    # Nothing listens yet (or any more): the caller sees what it would see without
                    # the proxy, a connection closed unanswered, and retries as it would then.
                    self.close_connection = True
                    return
                if response is None:
                    self.close_connection = True
                    self.send_error(502, "upstream unavailable")
                    return
                if action is not None:
                    proxy.lost.append(self.path)
                    proxy.lost_upstreams.append(served_by)
                    action()
                    self.close_connection = True  # drop the connection: the answer is lost
                    return
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-encoding":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                try:
                    self.wfile.write(response.content)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up waiting (a timeout, a killed worker)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fault-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        for hold in self._made:  # nothing held outlives the proxy
            hold.release()
        self.server.shutdown()
        self.server.server_close()

    def lose_next(self, path_prefix: str, action: Callable[[], None]) -> None:
        with self._lock:
            self._armed = (path_prefix, action)

    def hold_next(self, path_prefix: str, timeout: float = 120) -> Hold:
        """Keep the next request for ``path_prefix`` until ``release()`` (at most ``timeout`` s)."""
        hold = Hold(path_prefix, timeout)
        with self._lock:
            self._holds.append(hold)
            self._made.append(hold)
        return hold

    def _in_turn(self, path: str) -> list[str]:
        """The upstreams, starting with the one whose turn it is for ``path`` (its query left out)."""
        key = path.split("?", 1)[0]
        with self._lock:
            start = self._turns.get(key, 0) % len(self.upstreams)
            self._turns[key] = start + 1
        return self.upstreams[start:] + self.upstreams[:start]

    def _take_hold(self, path: str) -> Hold | None:
        with self._lock:
            for hold in self._holds:
                if path.startswith(hold.path_prefix):
                    self._holds.remove(hold)
                    return hold
            return None

    def _take(self, path: str) -> Callable[[], None] | None:
        with self._lock:
            if self._armed is not None and path.startswith(self._armed[0]):
                action = self._armed[1]
                self._armed = None
                return action
            return None
