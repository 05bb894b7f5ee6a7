"""Serving the app with uvicorn: in the foreground (`serve`) or on a background thread.

    with ServerThread(app) as server:     # binds 127.0.0.1 on a free port before returning
        server.base_url                   # http://127.0.0.1:PORT/v1

The background form is for embedding (tests, demos): the socket is bound before the thread
starts, so the port is known and there is no race for it. Both serve through uvicorn_config():
uvicorn's own answers to requests it cannot parse carry the security headers too, and idle
connections outlast Retry-After.
"""
from __future__ import annotations

import socket
import threading
import time

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from hermes.api.errors import SECURITY_HEADERS
from hermes.api.server_settings import ApiSettings


class SecureH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, whose own 400 (a malformed request that never reaches the app,
    like `Content-Length: abc`) carries the security headers every other answer has."""

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own, with our headers added (it sends this before any app code runs)
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
        self.transport.write(self.conn.send(h11.Data(data=msg.encode("ascii"))))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


def uvicorn_config(app: FastAPI, settings: ApiSettings | None = None, **kw) -> uvicorn.Config:
    settings = settings or app.state.settings
    return uvicorn.Config(app, http=SecureH11Protocol, timeout_keep_alive=settings.keep_alive_seconds(),
                          timeout_graceful_shutdown=30, **kw)


class ServerThread:
    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, log_level=log_level))
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
