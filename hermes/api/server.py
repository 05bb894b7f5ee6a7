"""Serving the app with uvicorn: in the foreground (`serve`) or on a background thread.

    with ServerThread(app) as server:     # binds 127.0.0.1 on a free port before returning
        server.base_url                   # http://127.0.0.1:PORT/v1

The background form is for embedding (tests, demos): the socket is bound before the thread
starts, so the port is known and there is no race for it.
"""
from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


class ServerThread:
    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=30))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name=f"api-server:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 60) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        # uvicorn offers no start event: its `started` flag flips once the lifespan startup is done
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self.server.started:
            self.stop()
            raise RuntimeError("the API server did not start (see its log)")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
