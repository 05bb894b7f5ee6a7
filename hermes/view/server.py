"""`hermes-batch view RUN [--port P]`: the viewer on 127.0.0.1 until Ctrl-C."""
from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from hermes.data.run_paths import RunPaths

DEFAULT_PORT = 8765


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hermes-batch view", description="Look at a run in the browser (127.0.0.1).")
    p.add_argument("run_name")
    p.add_argument("--output_dir", default="data")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free port")
    a = p.parse_args(argv)
    run_dir = RunPaths.of(a.output_dir, a.run_name).root
    if not run_dir.is_dir() or not RunPaths(run_dir).batch_files():
        print(f"error: {run_dir} holds no run (no batch_*.jsonl)", file=sys.stderr)
        return 2

    import uvicorn

    from hermes.view.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", a.port))
        sock.listen(128)  # connections wait in the backlog from now on, until uvicorn takes them
    except OSError as e:
        print(f"error: cannot listen on 127.0.0.1:{a.port} ({e.strerror}); choose another with --port", file=sys.stderr)
        return 2
    app = create_app(run_dir)
    app.state.index.refresh()  # index the journal before saying where to look (a large run takes a moment)
    print(f"viewing {run_dir} at http://127.0.0.1:{sock.getsockname()[1]}/  (Ctrl-C ends it)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        app.state.index.close()
    return 0
