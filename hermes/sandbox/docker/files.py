"""Files of a sandbox whose init or exec runs the command channel (channel.SERVER): the docker
and runc backends share it. A read or write goes over the channel when the sandbox has one
free, else through a plain exec of the same script texts (channel.READ, channel.WRITE); the
exit codes of those texts (3, 4, 5) become Python's own errors."""
from __future__ import annotations

import base64
import errno
from typing import Callable

from hermes.sandbox.base import SandboxError
from hermes.sandbox.docker import channel
from hermes.sandbox.docker.channel import request

#: builds a request's bytes from its nonce
Request = Callable[[str], bytes]


class ChannelFiles:
    """read_file/write_file for a sandbox that provides, beside `cwd` and `settings`:
    `_file_request(make, timeout)`: (exit code, payload) over the channel, None when it has none;
    `_plain(argv, data, timeout)`: (stdout, stderr, exit code) of an exec of its own."""

    def _file_timeout(self, size: int = 0) -> float:
        return max(self.settings.command_timeout, 30.0) + size / (5 << 20)

    def _read_file(self, path: str) -> bytes:
        answer = self._file_request(lambda n: request(n, "r", args=(self.cwd, path)), self._file_timeout())
        if answer is not None:
            code, payload = answer
            if code == 0:
                try:
                    return base64.b64decode(payload)
                except ValueError as e:
                    raise SandboxError(f"{path}: unreadable answer from the sandbox: {e}") from e
            raise_file_error(code, payload, path)
        out, err, code = self._plain(["sh", "-c", channel.READ, "hermes-read", self.cwd, path], None, self._file_timeout())
        if code != 0:
            raise_file_error(code, err, path)
        return out

    def _write_file(self, path: str, data: bytes) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        data = bytes(data)
        answer = self._file_request(lambda n: request(n, "w", str(len(data)), args=(self.cwd, path)) + data,
                                    self._file_timeout(len(data)))
        if answer is not None:
            if answer[0] != 0:
                raise_file_error(answer[0], answer[1], path)
            return
        _, err, code = self._plain(["sh", "-c", channel.WRITE, "hermes-write", self.cwd, path], data,
                                   self._file_timeout(len(data)))
        if code != 0:
            raise_file_error(code, err, path)


def raise_file_error(code: int, err: bytes, path: str) -> None:
    msg = err.decode("utf-8", "replace").strip() or f"exit code {code}"
    if code == 3:
        raise FileNotFoundError(errno.ENOENT, msg, path)
    if code == 4:
        raise IsADirectoryError(errno.EISDIR, msg, path)
    if "Permission denied" in msg or "Read-only file system" in msg:
        raise PermissionError(errno.EACCES, msg, path)
    raise SandboxError(f"{path}: {msg}")
