"""Images the vision and image_gen tools take in: where they come from, what they are.

An image a model names (`image_url`) is one of

    data:image/png;base64,...      inline, decoded here
    http(s)://host/chart.png       fetched here under the run's network rules (ctx.net), capped in size and time
    images/<key>-<call>.png        what image_generate returned earlier in the same prompt (a run-folder file)
    /workspace/chart.png           a file in the prompt's own sandbox (read out of the container)

and every one is checked to be an image (PNG, JPEG, GIF or WebP by its bytes, not by its name)
and not larger than the caller's limit, so a model gets a clear error result, never a backend's
confusing answer to a text file. Images the tools produce (image_generate's, browser_vision's
screenshots) are saved in the run folder by `save`, named by prompt key and call id.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes, urljoin, urlsplit

from hermes.errors import HermesError
from hermes.netpolicy import UrlRefused
from hermes.tools._common import q

MIME = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
EXT = {"png": ".png", "jpeg": ".jpg", "gif": ".gif", "webp": ".webp"}
MAX_REDIRECTS = 5


class ImageError(HermesError, ValueError):
    """An image that cannot be used; the message is what the model is told."""


@dataclass(frozen=True)
class Image:
    data: bytes
    format: str                  # png | jpeg | gif | webp
    width: int | None
    height: int | None
    source: str                  # where it came from, for messages

    @property
    def mime(self) -> str:
        return MIME[self.format]

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def sniff(data: bytes) -> str | None:
    """The image format of these bytes (by their signature), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def dimensions(data: bytes, fmt: str) -> tuple[int | None, int | None]:
    """(width, height) read from the header; (None, None) when the header does not say."""
    try:
        if fmt == "png" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if fmt == "gif":
            return struct.unpack("<HH", data[6:10])
        if fmt == "webp":
            kind = data[12:16]
            if kind == b"VP8 ":
                w, h = struct.unpack("<HH", data[26:30])
                return w & 0x3FFF, h & 0x3FFF
            if kind == b"VP8L":
                bits = int.from_bytes(data[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if kind == b"VP8X":
                return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
        if fmt == "jpeg":
            i = 2
            while i + 9 < len(data):
                if data[i] != 0xFF:
                    i += 1
                    continue
                marker = data[i + 1]
                if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                    h, w = struct.unpack(">HH", data[i + 5:i + 9])
                    return w, h
                i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    except (struct.error, IndexError):
        pass
    return None, None


def as_image(data: bytes, source: str, max_bytes: int) -> Image:
    if len(data) > max_bytes:
        raise ImageError(f"{source}: image too large ({len(data)} bytes; the limit is {max_bytes} bytes)")
    if not data:
        raise ImageError(f"{source}: the file is empty, not an image")
    fmt = sniff(data)
    if fmt is None:
        raise ImageError(f"{source}: not an image (a PNG, JPEG, GIF or WebP file is needed; "
                         f"its first bytes are {data[:12]!r})")
    w, h = dimensions(data, fmt)
    return Image(data, fmt, w, h, source)


# --------------------------------------------------------------------------- sources

DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,(?P<data>.*)$",
                      re.S | re.I)


def from_data_url(url: str, max_bytes: int) -> Image:
    m = DATA_URL.match(url.strip())
    if not m:
        raise ImageError("not a valid data URL (expected data:image/<type>;base64,<data>)")
    payload = m["data"]
    if len(payload) > max_bytes * 4 // 3 + 8:  # refuse before decoding a huge string
        raise ImageError(f"data URL: image too large (over {max_bytes} bytes; the limit is {max_bytes} bytes)")
    try:
        data = base64.b64decode(payload, validate=True) if m["b64"] else unquote_to_bytes(payload)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"data URL: the base64 data does not decode ({e})") from None
    return as_image(data, "data URL", max_bytes)


def fetch(client: Any, url: str, net: Any, max_bytes: int, timeout: float) -> Image:
    """GET an image URL a model chose: every URL and redirect checked by the network policy, and
    the address actually connected to checked too (a name may resolve differently the second time)."""
    deadline = time.monotonic() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        try:
            net.check(url)
        except UrlRefused as e:
            raise ImageError(f"{url}: {e}") from None
        with client.stream("GET", url, follow_redirects=False, timeout=timeout,
                           headers={"Accept": "image/png,image/jpeg,image/gif,image/webp,image/*;q=0.8"}) as r:
            peer = _peer(r)
            if peer:
                try:
                    net.check_address(peer, urlsplit(url).hostname or "")
                except UrlRefused as e:
                    raise ImageError(f"{url}: {e}") from None
            if r.is_redirect and r.headers.get("location"):
                url = urljoin(url, r.headers["location"])
                continue
            if r.status_code != 200:
                raise ImageError(f"{url}: the server answered HTTP {r.status_code}")
            length = r.headers.get("content-length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise ImageError(f"{url}: image too large ({length} bytes; the limit is {max_bytes} bytes)")
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ImageError(f"{url}: image too large (over {max_bytes} bytes; the limit is {max_bytes} bytes)")
                if time.monotonic() > deadline:
                    raise ImageError(f"{url}: fetching took longer than {timeout:g} s")
            return as_image(bytes(body), url, max_bytes)
    raise ImageError(f"{url}: more than {MAX_REDIRECTS} redirects")


def _peer(response: Any) -> str | None:
    stream = response.extensions.get("network_stream")
    try:
        address = stream.get_extra_info("server_addr") if stream is not None else None
    except Exception:  # noqa: BLE001 - a transport that cannot say is checked by name only
        return None
    return str(address[0]) if address else None


def from_sandbox(sandbox: Any, path: str, max_bytes: int) -> Image:
    """A file of the prompt's sandbox; its size is asked first so a huge file is never copied out."""
    from hermes.sandbox.base import SandboxError

    try:
        size = sandbox.exec(f"stat -L -c %s -- {q(path)} 2>/dev/null || echo missing")
    except SandboxError as e:
        raise ImageError(f"{path}: not a URL or data URL, and no file can be read here ({e})") from None
    text = (size.output or "").strip()
    if text.endswith("missing") or not text:
        raise ImageError(f"{path}: no such file in the sandbox (nor a URL or data URL)")
    if text.isdigit() and int(text) > max_bytes:
        raise ImageError(f"{path}: image too large ({text} bytes; the limit is {max_bytes} bytes)")
    try:
        data = sandbox.read_file(path)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file in the sandbox") from None
    except IsADirectoryError:
        raise ImageError(f"{path}: is a directory, not an image") from None
    except (SandboxError, OSError) as e:
        raise ImageError(f"{path}: cannot read it from the sandbox ({e})") from None
    return as_image(data, path, max_bytes)


def produced_file(ctx: Any, name: str) -> Path | None:
    """The run-folder file `name` names when this prompt's own tools produced it (image_generate's `image`)."""
    if not ctx.files:
        return None
    for shown in list(ctx.files):
        path = Path(shown) if Path(shown).is_absolute() else (ctx.run_dir / shown if ctx.run_dir else Path(shown))
        if name in (shown, str(path)):
            return path
    return None


def load(ctx: Any, image_url: str, *, max_bytes: int, timeout: float, http: Any) -> Image:
    """The image `image_url` names, from wherever it is (module docstring)."""
    ref = image_url.strip()
    if not ref:
        raise ImageError("image_url is empty")
    if ref[:5].lower() == "data:":
        return from_data_url(ref, max_bytes)
    scheme = urlsplit(ref).scheme.lower()
    if scheme in ("http", "https"):
        return fetch(http(), ref, ctx.net, max_bytes, timeout)
    if scheme and len(scheme) > 1:  # a drive letter is not a scheme, but file:, ftp:, ... are refused
        raise ImageError(f"{ref}: only http(s) URLs, data URLs and file paths are accepted, not {scheme}:")
    produced = produced_file(ctx, ref)
    if produced is not None:
        try:
            data = produced.read_bytes()
        except OSError as e:
            raise ImageError(f"{ref}: cannot read it ({e})") from None
        return as_image(data, ref, max_bytes)
    return from_sandbox(ctx.sandbox, ref, max_bytes)


# --------------------------------------------------------------------------- files

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def images_dir(ctx: Any) -> Path:
    if ctx.run_dir is not None:
        return Path(ctx.run_dir) / "images"
    return Path(tempfile.gettempdir()) / "hermes-images"  # chat and the API server have no run folder


def save(ctx: Any, data: bytes, ext: str) -> str:
    """Save an image a tool produced (image_generate, browser_vision's screenshot) as
    images/<prompt key>-<call id><ext>, written whole; returns its name as recorded (ctx.add_file)."""
    folder = images_dir(ctx)
    folder.mkdir(parents=True, exist_ok=True)
    _forget_earlier_attempts(ctx, folder)
    stem = f"{_SAFE.sub('_', ctx.key) or 'prompt'}-{_SAFE.sub('_', ctx.call_id) or os.urandom(4).hex()}"
    final = folder / f"{stem}{ext}"
    tmp = folder / f".{stem}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)  # whole or absent: a kill mid-write leaves only a hidden temp file
    return ctx.add_file(final)  # relative to the run folder: images/<key>-<call>.png


def _forget_earlier_attempts(ctx: Any, folder: Path) -> None:
    """Once per prompt attempt, before its first saved image (of any tool -- one state for all, so
    one tool's cleanup never removes another's file of this attempt): remove files an earlier
    attempt of this prompt left. A prompt runs again only when no earlier attempt of it finished
    (resume re-runs failed and unfinished ones), so none of those files belongs to a kept entry."""
    if ctx.run_dir is None or not ctx.key:
        return
    state = ctx.prompt_state.setdefault("saved_images", {"lock": threading.Lock(), "cleaned": False})
    with state["lock"]:
        if state["cleaned"]:
            return
        state["cleaned"] = True
        stem = _SAFE.sub("_", ctx.key)
        for old in [*folder.glob(f"{stem}-*"), *folder.glob(f".{stem}-*.tmp")]:
            old.unlink(missing_ok=True)
