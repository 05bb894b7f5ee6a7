"""The mock's images API and what it knows about images: small real PNGs, made and read back.

``POST /v1/images/generations``  JSON {"prompt", "model", "size", "n", "response_format"} -> {"created",
                                 "data": [{"b64_json"} | {"url"}], "usage"} (b64_json unless url is asked)
``POST /v1/images/edits``        multipart form (``image`` or ``image[]`` files, ``prompt``, ``size``...) -> same
``GET  /_mock/files/<name>``     an image answered as a url
``GET  /_mock/image_requests``   every images API request, with what the uploaded images were (for tests)

Each image is a real PNG (zlib + struct, no imaging library) of the asked size ("auto": 1024x1024;
an edit without a size keeps its first input's), in a colour taken from the prompt, with the prompt
in a tEXt chunk. A prompt containing ``MOCK_IMAGE_ERROR: <status>`` is answered with that HTTP error.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
import time
import uuid
import zlib
from email import policy
from email.parser import BytesParser
from typing import Any

MAX_SIDE = 4096
ERROR_MARK = re.compile(r"MOCK_IMAGE_ERROR:\s*(\d{3})")


def make_png(width: int, height: int, seed: str, text: str = "") -> bytes:
    """A width x height RGB PNG: two colours from `seed` in horizontal bands, `text` as its Comment."""
    digest = hashlib.sha256(seed.encode("utf-8")).digest()
    rows = [b"\x00" + digest[i:i + 3] * width for i in (0, 3)]
    raw = b"".join(rows[(y // 16) % 2] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    if text:
        out += chunk(b"tEXt", b"Comment\x00" + text.encode("latin-1", "replace")[:400])
    return out + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def describe(data: bytes) -> dict[str, Any]:
    """Format, size and digest of image bytes, read from the bytes themselves."""
    fmt, width, height = "unknown", None, None
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
        fmt, (width, height) = "PNG", struct.unpack(">II", data[16:24])
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        fmt, (width, height) = "GIF", struct.unpack("<HH", data[6:10])
    elif data.startswith(b"\xff\xd8\xff"):
        fmt = "JPEG"
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            if 0xC0 <= data[i + 1] <= 0xCF and data[i + 1] not in (0xC4, 0xC8, 0xCC):  # a start-of-frame
                height, width = struct.unpack(">HH", data[i + 5:i + 9])
                break
            i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        fmt = "WEBP"
    return {"format": fmt, "width": width, "height": height, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def _size(text: Any, fallback: tuple[int, int] = (1024, 1024)) -> tuple[int, int] | None:
    if text in (None, "", "auto"):
        return fallback
    m = re.fullmatch(r"(\d{1,5})x(\d{1,5})", str(text))
    if not m or not (0 < int(m[1]) <= MAX_SIDE and 0 < int(m[2]) <= MAX_SIDE):
        return None
    return int(m[1]), int(m[2])


class ImageAPI:
    """The images endpoints' state: requests seen and images handed out by url."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests: list[dict] = []
            self.files: dict[str, bytes] = {}

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.requests)

    def file(self, name: str) -> bytes | None:
        with self._lock:
            return self.files.get(name)

    # ----- endpoints: each returns (status, JSON payload)

    def generations(self, raw: bytes, host: str) -> tuple[int, dict]:
        try:
            body = json.loads(raw or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return 400, _error(400, f"request body is not valid JSON: {e}")
        if not isinstance(body, dict):
            return 400, _error(400, "request body must be a JSON object")
        return self._answer("generations", body, [], host)

    def edits(self, content_type: str, raw: bytes, host: str) -> tuple[int, dict]:
        if "multipart/form-data" not in content_type:
            return 400, _error(400, "images/edits takes multipart/form-data")
        message = BytesParser(policy=policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\nMIME-Version: 1.0\r\n\r\n" + raw)
        fields: dict[str, Any] = {}
        uploads: list[bytes] = []
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True) or b""
            if name in ("image", "image[]"):
                uploads.append(payload)
            elif name:
                fields[name] = payload.decode("utf-8", "replace")
        if not uploads:
            return 400, _error(400, "images/edits needs at least one 'image' file")
        return self._answer("edits", fields, uploads, host)

    def _answer(self, kind: str, body: dict, uploads: list[bytes], host: str) -> tuple[int, dict]:
        prompt = body.get("prompt")
        inputs = [describe(u) for u in uploads]
        record = {"endpoint": kind, "prompt": prompt, "model": body.get("model"), "size": body.get("size"),
                  "n": body.get("n"), "response_format": body.get("response_format"), "images": inputs}
        with self._lock:
            self.requests.append(record)
        if not isinstance(prompt, str) or not prompt.strip():
            return 400, _error(400, "'prompt' is required")
        forced = ERROR_MARK.search(prompt)
        if forced:
            status = int(forced[1])
            return status, _error(status, f"scripted image failure (MOCK_IMAGE_ERROR {status})")
        first = (inputs[0]["width"], inputs[0]["height"]) if inputs and inputs[0]["width"] else (1024, 1024)
        size = _size(body.get("size"), first)
        if size is None:
            return 400, _error(400, f"invalid size {body.get('size')!r}: expected WIDTHxHEIGHT or auto")
        n = max(1, min(4, int(body.get("n") or 1)))
        note = f"mock image for: {prompt[:200]}" + (f"; edited from {len(inputs)} image(s)" if inputs else "")
        data = []
        for i in range(n):
            png = make_png(size[0], size[1], f"{prompt}:{i}:{len(inputs)}", note)
            if body.get("response_format") == "url":
                name = f"{uuid.uuid4().hex}.png"
                with self._lock:
                    self.files[name] = png
                data.append({"url": f"http://{host}/_mock/files/{name}", "revised_prompt": None})
            else:
                data.append({"b64_json": base64.b64encode(png).decode("ascii"), "revised_prompt": None})
        text_tokens = max(1, len(prompt) // 4)
        image_tokens = 65 * len(inputs)
        usage = {"input_tokens": text_tokens + image_tokens, "output_tokens": 272 * n,
                 "total_tokens": text_tokens + image_tokens + 272 * n,
                 "input_tokens_details": {"text_tokens": text_tokens, "image_tokens": image_tokens}}
        return 200, {"created": int(time.time()), "data": data, "usage": usage,
                     "size": f"{size[0]}x{size[1]}", "output_format": "png"}


def _error(status: int, message: str) -> dict:
    from mockllm.wire import error_body

    return error_body(status, message)
