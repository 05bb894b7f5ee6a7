"""Where shards go: any fsspec URL (a folder, s3://bucket/prefix, hf://datasets/org/name, ...).

Credentials come only from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, HF_TOKEN, fsspec's
FSSPEC_<PROTOCOL>_<OPTION> variables): a URL that carries a user or a password is refused, so that
no secret lands in the run's settings, run.json or a Prefect parameter.

A file becomes visible whole or not at all, and replacing one is atomic (a reader gets the old
bytes or the new, never a mix):
- s3:// goes through botocore's client directly: one PutObject is atomic on S3 (the key appears
  complete, or keeps its old object), so a file is one request. botocore is the client s3fs wraps;
  s3fs adds an asyncio layer (aiobotocore, aiohttp) that costs the publishing worker ~0.3 s of CPU
  at every start, as much as a short run's whole publication. When fsspec's FSSPEC_S3_* variables
  configure s3fs, s3fs is used, so that they are honoured.
- any other URL goes through fsspec: uploaded under `_staging/<name>.partial` (a name no
  `**/*.parquet` glob matches), then moved to its place: a rename on a folder, a commit on the Hub.
Callers never ask which store they have.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

from hermes.run.shards import PublishError

STAGING = "_staging"
MANIFEST = "_manifest.json"
DATA = "data"

log = logging.getLogger(__name__)


def check_url(url: str) -> str:
    """The URL as given, once it is known to carry no credentials."""
    url = (url or "").strip()
    if not url:
        raise PublishError("--publish: an empty URL")
    parts = urlsplit(url)
    if parts.scheme and (parts.username or parts.password):
        raise PublishError(f"--publish {parts.scheme}://...: the URL carries credentials; give them through "
                           f"the environment (e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, HF_TOKEN), never "
                           f"in the URL, which is stored with the run's settings")
    return url


def _s3_direct(url: str) -> bool:
    return url.startswith(("s3://", "s3a://")) and not any(k.startswith("FSSPEC_S3") for k in os.environ)


class _S3:
    """The few S3 calls a publication makes, on one botocore client (credentials, region and
    AWS_ENDPOINT_URL from botocore's own chain: the environment, config files, instance roles)."""

    def __init__(self, url: str):
        import botocore.session

        bucket_key = url.split("://", 1)[1]
        self.bucket, _, prefix = bucket_key.partition("/")
        if not self.bucket:
            raise PublishError(f"--publish {url}: no bucket")
        self.prefix = prefix.strip("/")
        self.client = botocore.session.get_session().create_client("s3")

    def warm(self) -> None:
        """One cheap request: the first one resolves the endpoint and opens the connection (a tenth of
        a second of CPU), which is better spent at the worker's start than at the run's end."""
        try:
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(f"{DATA}/"), MaxKeys=1)
        except Exception as e:  # noqa: BLE001 (a credential allowed to put but not to list: the puts will say)
            log.debug("publish: warming the S3 client: %r", e)

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def put_file(self, local: Path, relative: str) -> None:
        with open(local, "rb") as body:
            self.client.put_object(Bucket=self.bucket, Key=self.key(relative), Body=body)

    def put_bytes(self, data: bytes, relative: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(relative), Body=data)

    def remove(self, relative: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(relative))  # a missing key is no error

    def list(self, relative: str) -> list[str]:
        out, token = [], None
        while True:
            kwargs = {"ContinuationToken": token} if token else {}
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(relative) + "/", **kwargs)
            out += [Path(o["Key"]).name for o in page.get("Contents", ())]
            token = page.get("NextContinuationToken")
            if not token:
                return out


class _Fsspec:
    """Any fsspec filesystem: staged upload, then a move (a rename or a commit) into place."""

    def __init__(self, url: str):
        import fsspec

        try:
            self.fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise PublishError(f"--publish {url}: {e}") from None
        self.root = root.rstrip("/")
        for folder in (DATA, STAGING):  # a folder needs them made; on S3 or the Hub this does nothing
            self.fs.makedirs(f"{self.root}/{folder}", exist_ok=True)

    def warm(self) -> None:
        pass

    def put_file(self, local: Path, relative: str) -> None:
        staging = f"{self.root}/{STAGING}/{relative.replace('/', '__')}.partial"
        self.fs.put_file(str(local), staging)
        self.fs.mv(staging, f"{self.root}/{relative}")

    def put_bytes(self, data: bytes, relative: str) -> None:
        staging = f"{self.root}/{STAGING}/{relative.replace('/', '__')}.partial"
        self.fs.pipe_file(staging, data)
        self.fs.mv(staging, f"{self.root}/{relative}")

    def remove(self, relative: str) -> None:
        try:
            self.fs.rm_file(f"{self.root}/{relative}")
        except FileNotFoundError:
            pass  # gone already: an earlier invocation removed it before it was killed

    def list(self, relative: str) -> list[str]:
        try:
            self.fs.invalidate_cache()
            return [Path(p).name for p in self.fs.ls(f"{self.root}/{relative}", detail=False)]
        except FileNotFoundError:
            return []


class Target:
    """The publication's root: shards under data/, the manifest beside them."""

    def __init__(self, url: str):
        self.url = check_url(url)
        if "://" not in self.url:  # a plain folder: absolute, so the worker process and the CLI agree
            self.url = str(Path(self.url).resolve())
        self.store = _S3(self.url) if _s3_direct(self.url) else _Fsspec(self.url)

    def shard_url(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{DATA}/{name}"

    def warm(self) -> None:
        """Make the first request's setup now (the worker's start), not in the run's end."""
        self.store.warm()

    def put(self, local: Path, relative: str) -> None:
        """Upload a local file to root/relative so that it appears (or replaces) whole or not at all."""
        self.store.put_file(local, relative)

    def put_bytes(self, data: bytes, relative: str) -> None:
        self.store.put_bytes(data, relative)

    def remove(self, names: list[str]) -> None:
        for name in names:
            self.store.remove(f"{DATA}/{name}")

    def write_manifest(self, manifest: dict) -> None:
        self.put_bytes((json.dumps(manifest, ensure_ascii=False) + "\n").encode(), MANIFEST)

    def listed(self) -> list[str]:
        """Shard names visible under data/ now."""
        return sorted(n for n in self.store.list(DATA) if n.endswith(".parquet"))
