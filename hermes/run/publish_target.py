"""Where shards go: any fsspec URL (a folder, s3://bucket/prefix, hf://datasets/org/name, ...).

Credentials come only from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, HF_TOKEN, fsspec's
FSSPEC_<PROTOCOL>_<OPTION> variables): a URL that carries a user or a password is refused, so that
no secret lands in the run's settings, run.json or a Prefect parameter.

A file becomes visible whole or not at all: it is uploaded under `_staging/<name>.partial` (a name
no `**/*.parquet` glob matches) and then moved to its place: a rename on a folder, a server-side
copy on S3 (CopyObject: the new key appears complete), a commit on the Hub. One code path for
every filesystem: no caller asks which one it has.
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from hermes.run.shards import PublishError

STAGING = "_staging"
MANIFEST = "_manifest.json"
DATA = "data"


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


class Target:
    """The publication's root: shards under data/, the manifest beside them."""

    def __init__(self, url: str):
        import fsspec

        self.url = check_url(url)
        if "://" not in self.url:  # a plain folder: absolute, so the worker process and the CLI agree
            self.url = str(Path(self.url).resolve())
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as e:
            raise PublishError(f"--publish {self.url}: {e}") from None
        self.root = self.root.rstrip("/")
        for folder in (DATA, STAGING):  # a folder needs them made; on S3 or the Hub this does nothing
            self.fs.makedirs(f"{self.root}/{folder}", exist_ok=True)

    def shard_path(self, name: str) -> str:
        return f"{self.root}/{DATA}/{name}"

    def shard_url(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{DATA}/{name}"

    def put(self, local: Path, relative: str) -> None:
        """Upload a local file to root/relative so that it appears whole or not at all."""
        staging = f"{self.root}/{STAGING}/{relative.replace('/', '__')}.partial"
        self.fs.put_file(str(local), staging)
        self.fs.mv(staging, f"{self.root}/{relative}")

    def remove(self, names: list[str]) -> None:
        for name in names:
            try:
                self.fs.rm_file(self.shard_path(name))
            except FileNotFoundError:
                pass  # gone already: an earlier invocation removed it before it was killed

    def write_manifest(self, manifest: dict, scratch: Path) -> None:
        tmp = scratch / f".{MANIFEST}.upload"
        tmp.write_text(json.dumps(manifest, ensure_ascii=False) + "\n", encoding="utf-8")
        try:
            self.put(tmp, MANIFEST)
        finally:
            tmp.unlink(missing_ok=True)

    def listed(self) -> list[str]:
        """Shard names visible under data/ now."""
        try:
            return sorted(Path(p).name for p in self.fs.ls(f"{self.root}/{DATA}", detail=False)
                          if str(p).endswith(".parquet"))
        except FileNotFoundError:
            return []
