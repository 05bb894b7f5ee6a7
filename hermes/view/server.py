"""`hermes-batch view RUN [RUN_B] [--port P]`: the viewer on 127.0.0.1 until Ctrl-C.

Two runs: both served, and /compare?runs=A,B sets their tasks side by side (a model against another,
a prompt before and after a change). A RUN is a run name under --output_dir, or a run folder's path.
"""
from __future__ import annotations

import argparse
import socket
import sys
from urllib.parse import quote
from pathlib import Path

from hermes.data.run_paths import RunPaths

DEFAULT_PORT = 8765


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hermes-batch view", description="Look at a run in the browser (127.0.0.1).")
    p.add_argument("run_name")
    p.add_argument("other_run", nargs="?", default=None, help="a second run to compare with the first (/compare?runs=A,B)")
    p.add_argument("--output_dir", default="data")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free port")
    a = p.parse_args(argv)
    run_dirs = []
    for name in [a.run_name] + ([a.other_run] if a.other_run else []):
        run_dir = RunPaths.of(a.output_dir, name).root
        if not run_dir.is_dir() and ("/" in name or name.startswith(".")) and Path(name).is_dir():
            run_dir = Path(name)  # a run folder's path
        if not run_dir.is_dir() or not RunPaths(run_dir).batch_files():
            print(f"error: {run_dir} holds no run (no batch_*.jsonl)", file=sys.stderr)
            return 2
        run_dirs.append(run_dir)

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
    app = create_app(run_dirs)
    for index in app.state.indexes.values():
        index.refresh()  # index the journal before saying where to look (a large run takes a moment)
    root = f"http://127.0.0.1:{sock.getsockname()[1]}"
    if len(run_dirs) == 1:
        print(f"viewing {run_dirs[0]} at {root}/  (tasks: {root}/tasks; Ctrl-C ends it)", flush=True)
    else:
        labels = ",".join(quote(label, safe="") for label in app.state.indexes)
        print(f"viewing {run_dirs[0]} and {run_dirs[1]} at {root}/  (side by side: {root}/compare?runs={labels}; "
              "Ctrl-C ends it)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        for index in app.state.indexes.values():
            index.close()
    return 0
