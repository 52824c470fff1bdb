"""Run the fake Kubernetes API server: ``python -m devtools.fake_kube --config cluster.json --ready-file F``.

It binds to a free loopback port (``--port 0``) and writes ``{"port": ..., "pid": ...}`` to the ready
file once it answers; SIGTERM stops it and kills every pod process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
from pathlib import Path

from aiohttp import web

from devtools.fake_kube.controllers import Controllers
from devtools.fake_kube.server import FakeApiServer


async def serve(config: dict, host: str, port: int, ready_file: Path | None, root: Path) -> None:
    server = FakeApiServer(config)
    controllers = Controllers(server, root)
    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = loop.create_task(controllers.run())
    if ready_file is not None:
        temporary = ready_file.with_suffix(".tmp")
        temporary.write_text(json.dumps({"port": bound, "pid": os.getpid()}))
        temporary.replace(ready_file)
    print(f"fake-kube: serving on http://{host}:{bound}", flush=True)
    await stop.wait()
    task.cancel()
    await controllers.shutdown()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.fake_kube")
    parser.add_argument(
        "--config", type=Path, required=True, help="JSON: namespaces, nodes, priority_classes, kueue, tokens"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--root", type=Path, help="where pods' files go (default: a temporary directory)")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    root = args.root or Path(tempfile.mkdtemp(prefix="fake-kube-"))
    asyncio.run(serve(config, args.host, args.port, args.ready_file, root))


if __name__ == "__main__":
    main()
