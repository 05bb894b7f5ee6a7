"""Publishing from a run (a worker process beside it) and after the fact (`hermes-batch publish`).

While a run goes, the Parquet and upload work happens in a process of its own
(`python -m hermes.run.publish_command --worker ...`), off the prompts' path: the run's process only
writes "landed N" lines into the worker's stdin, non-blocking (a landed batch costs a write of a few
bytes, no lock, no import of pyarrow or s3fs), and at its end "finish". The worker reads each landed
batch file once, past its cursor (hermes.run.publish). When the run's process dies, the worker
reads end-of-file, publishes what it read, and exits; the next invocation's worker waits for its lock.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class NoPublisher:
    """A run without --publish."""

    def landed(self, num: int) -> None:
        pass

    def finish_soon(self) -> None:
        pass

    def finish(self) -> dict[str, Any] | None:
        return None

    def abandon(self) -> None:
        pass


class Publisher(NoPublisher):
    """The run's side of the worker process."""

    def __init__(self, run_path: Path, url: str, fmt: str, only: str | None, every: str, compact: bool = True):
        cmd = [sys.executable, "-m", "hermes.run.publish_command", "--worker", str(run_path), url,
               "--format", fmt, "--every", every] + (["--only", only] if only else []) + ([] if compact else ["--no_compact"])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        os.set_blocking(self.proc.stdin.fileno(), False)
        self._unsent = b""

    def landed(self, num: int) -> None:
        self._unsent += f"landed {num}\n".encode()
        try:
            n = os.write(self.proc.stdin.fileno(), self._unsent)
            self._unsent = self._unsent[n:]
        except BlockingIOError:
            pass  # the worker is behind: kept, sent with the next batch or at the end
        except BrokenPipeError:
            self._unsent = b""  # the worker died: said at the end; the next start publishes the rest

    def finish_soon(self) -> None:
        """Send the rest and "finish": the worker publishes it while the run closes its session."""
        if self.proc.stdin.closed:
            return
        os.set_blocking(self.proc.stdin.fileno(), True)
        try:
            self.proc.stdin.write(self._unsent + b"finish\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def finish(self) -> dict[str, Any] | None:
        """finish_soon(), then wait for the worker's summary."""
        self.finish_soon()
        out = self.proc.stdout.read()
        code = self.proc.wait()
        if code != 0:
            log.error("publishing failed (exit %s): what landed stays in the journal; "
                      "`hermes-batch publish RUN URL` publishes it", code)
            return {"error": f"the publishing process exited with {code}"}
        try:
            return json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    def abandon(self) -> None:
        """The run failed: end-of-file tells the worker to publish what it read and go."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass


def check_settings(settings: Any) -> None:
    """Refuse a run whose --publish cannot work, before anything runs."""
    from hermes.run.rundir import RunRefused
    from hermes.run.shards import PublishError

    if settings.publish:
        try:
            check(settings.publish, settings.publish_format, settings.publish_only, settings.publish_every)
        except PublishError as e:
            raise RunRefused(f"run '{settings.run_name}' refused: {e}") from None


def start(settings: Any, run_path: Path) -> NoPublisher:
    """The run's publisher: a worker process when settings.publish names a URL (check_settings first)."""
    if not settings.publish:
        return NoPublisher()
    return Publisher(run_path, settings.publish, settings.publish_format, settings.publish_only,
                     settings.publish_every, settings.publish_compact)


def check(url: str, fmt: str, only: str | None, every: str) -> None:
    """What can be refused before a run starts: the shape, the filter, the cadence, the URL's
    credentials and whether a filesystem of its protocol is installed."""
    from fsspec.registry import known_implementations, registry

    from hermes.run.export import ONLY
    from hermes.run.publish import parse_every
    from hermes.run.publish_target import check_url
    from hermes.run.shards import PublishError, shape

    shape(fmt)
    parse_every(every)
    if only is not None and only not in ONLY:
        raise PublishError(f"--publish_only {only!r}: one of {', '.join(ONLY)}")
    url = check_url(url)
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    # whether the protocol's package is installed, without importing it here (s3fs brings botocore:
    # CPU the run's prompts would pay; the worker process imports it)
    known = known_implementations.get(protocol)
    if protocol not in registry and known is None:
        raise PublishError(f"--publish {url}: no fsspec filesystem knows the protocol {protocol!r}")
    if known is not None and importlib.util.find_spec(known["class"].split(".")[0]) is None:
        raise PublishError(f"--publish {url}: {known.get('err') or known['class'] + ' is not installed'} "
                           f"(pip install 'hermes-batch[publish]')")


# --------------------------------------------------------------------------- the worker process

def _worker(run_path: Path, url: str, fmt: str, only: str | None, every: str, compact: bool = True) -> int:
    from hermes.run.publish import Publication

    pub = Publication(run_path, url, fmt, only, every).open(wait=True)
    pub.prepare()  # pyarrow now, while the run's prompts go, not in the run's end
    lines: queue.Queue = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin.buffer:
            lines.put(line.decode().strip())
        lines.put(None)  # end-of-file: the run's process ended (or died)

    threading.Thread(target=read_stdin, daemon=True).start()
    try:
        pub.catch_up()  # what earlier invocations left unpublished
        while True:
            try:
                line = lines.get(timeout=pub.wait_seconds())
            except queue.Empty:
                pub.flush()
                continue
            if line is None:
                pub.flush()
                return 0
            if line == "finish":
                print(json.dumps(pub.finish(compact=compact)), flush=True)
                return 0
            if line.startswith("landed "):
                pub.landed(int(line.split()[1]))
                if pub.due():
                    pub.flush()
    finally:
        pub.close()


# --------------------------------------------------------------------------- hermes-batch publish

def main(argv: list[str]) -> int:
    from hermes.run.publish import Publication
    from hermes.run.shards import PublishError, shape_names

    p = argparse.ArgumentParser(prog="hermes-batch publish",
                                description="Publish a run's final entries as Parquet shards (after the fact, "
                                            "or what a killed run left): the same shards a run's --publish writes.")
    p.add_argument("run_name")
    p.add_argument("url", help="a folder, s3://bucket/prefix, hf://datasets/org/name, any fsspec URL "
                               "(credentials from the environment only)")
    p.add_argument("--output_dir", default="data")
    p.add_argument("--format", default="openai", help=f"row shape: {', '.join(shape_names())}")
    p.add_argument("--only", choices=("passed", "completed"), default=None)
    p.add_argument("--every", default="10000", help="entries (or Ns seconds) a shard, before compaction")
    a = p.parse_args(argv)
    run_path = Path(a.output_dir) / a.run_name
    if not run_path.is_dir():
        print(f"error: no run folder {run_path}", file=sys.stderr)
        return 2
    try:
        pub = Publication(run_path, a.url, a.format, a.only, a.every).open(wait=False)
        try:
            summary = pub.finish()  # every batch file past its cursor, in shards of --every, then compacted
        finally:
            pub.close()
    except PublishError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{summary['entries']} entries in {summary['shards']} shard(s) -> {summary['data_files']}")
    return 0


class _NoPandas:
    """pyarrow imports pandas, when it is installed, the first time it turns a Python list into an array
    (to ask whether the list is a pandas object): a quarter of a second of CPU, more than the rows of a
    200-prompt run cost; and numpy at its own import (a tenth of a second), which it needs for numpy
    arrays only. The worker never has a pandas object nor a numpy array, so it loads neither."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in ("pandas", "numpy"):
            raise ModuleNotFoundError("the publishing worker does not load pandas or numpy", name=name)


if __name__ == "__main__":
    sys.meta_path.insert(0, _NoPandas())
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("url")
    ap.add_argument("--format", default="openai")
    ap.add_argument("--only", default=None)
    ap.add_argument("--every", default="1000,60s")
    ap.add_argument("--no_compact", action="store_true")
    ns = ap.parse_args()
    code = _worker(Path(ns.worker), ns.url, ns.format, ns.only, ns.every, compact=not ns.no_compact)
    # the run waits for this exit: skip the interpreter's teardown (freeing botocore's and pyarrow's
    # modules object by object, tens of milliseconds); the state journal is fsync'ed, the lock closed
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
