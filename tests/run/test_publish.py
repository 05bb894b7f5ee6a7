"""--publish: Parquet shards of a run's final entries while it goes, to a folder and to S3 (issue 48).

Real parts: the run is `batch_runner.py` in a process of its own (the direct engine: the same
orchestration as the Prefect flow), killed with SIGKILL at random moments and resumed; S3 is moto's
server on loopback, reached by the run through s3fs with AWS_ENDPOINT_URL, as a user's run reaches
theirs; readers are `datasets.load_dataset("parquet", data_files=...)` and pyarrow. The prompts call no
tool that needs a sandbox (publishing is what is under test), so the local backend is named and no
container is made.
"""
from __future__ import annotations

import datetime
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import script, unique_run, write_dataset

ROOT = Path(__file__).resolve().parents[2]
KEY = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a loopback port, with a bucket; yields the environment a run needs."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {**KEY, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="published")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # this process's readers (datasets, s3fs) find the server as the run does
    try:
        yield env
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        server.stop()


def rows(n: int, tag: str) -> list[dict]:
    """Most answer after a short think; some fail for good, some fail once then succeed (a retry),
    some have no reasoning (discarded), some call a tool that does not exist (dropped)."""
    out = []
    for i in range(n):
        if i % 11 == 3:
            turns = [{"error": 400}]
        elif i % 11 == 5:
            turns = [{"error": 500, "times": 1, "reasoning": "again", "content": f"answer {i}"}]
        elif i % 11 == 7:
            turns = [{"sleep": 0.1, "content": f"no reasoning {i}"}]
        elif i % 11 == 9:
            turns = [{"reasoning": "r", "tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
                     {"reasoning": "r", "content": "done"}]
        else:
            turns = [{"sleep": 0.15, "reasoning": f"thinking {i}", "content": f"answer {i}"}]
        out.append({"prompt": f"{tag} row {i} " + script(*turns), "source": "storm"})
    return out


def run_cmd(dataset: Path, run_name: str, base_url: str, url: str, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=3",
            f"--run_name={run_name}", f"--base_url={base_url}", "--model=mock", "--num_workers=4",
            "--engine=direct", "--distribution=terminal_only", "--sandbox_backend=local",
            "--sandbox_prefetch=false", "--max_retries=0", "--max_failed_share=1", "--resume",
            "--max_no_tool_use_share=1",  # most rows answer in prose: questions that merely offer tools
            f"--publish={url}", "--publish_every=4,1s", *extra]


def filesystem(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)


class Reader(threading.Thread):
    """Loads the published dataset again and again while the run goes, as a trainer would; notes
    every listing's shards and whether each one read whole. A load either fails loudly in the
    compaction's window (a listed shard gone, or the compacted shard's marker, which is no Parquet:
    hermes.run.publish's docstring) or is the whole dataset as it was: no entry twice, none lost."""

    def __init__(self, url: str, cache: Path):
        super().__init__(daemon=True)
        self.url, self.cache = url, cache
        self.stop = threading.Event()
        self.loads: list[set[int]] = []  # the distinct prompt indices of each successful load
        self.problems: list[str] = []
        self.missing: list[str] = []  # files listed then gone before read (compaction's window)
        self.marked: list[str] = []  # compacted shards read while they held the marker (the same window)
        self.listed: set[str] = set()

    def run(self) -> None:
        import datasets
        import pyarrow as pa
        import pyarrow.parquet as pq

        from hermes.run.publish import COMPACTING

        datasets.disable_progress_bars()
        fs, root = filesystem(self.url)
        while not self.stop.is_set():
            try:  # what a glob over data/ sees (s3fs may answer a missing prefix with the prefix itself)
                names = [p for p in fs.find(f"{root}/data") if p.rstrip("/") != f"{root}/data"]
            except FileNotFoundError:
                names = []
            fs.invalidate_cache()
            for p in names:
                if not p.endswith(".parquet"):
                    self.problems.append(f"a file that is no shard is listed: {p}")
                    continue
                self.listed.add(Path(p).name)
                try:
                    data = fs.cat_file(p)
                except FileNotFoundError:
                    self.missing.append(Path(p).name)
                    continue
                if data == COMPACTING:
                    self.marked.append(Path(p).name)
                    continue
                try:
                    pq.read_metadata(pa.BufferReader(data))  # a partial file has no footer
                except Exception as e:  # noqa: BLE001 (any failure to read a listed shard is the finding)
                    self.problems.append(f"{p} listed but not a whole Parquet file: {e!r}")
            if not names:
                continue
            try:
                ds = datasets.load_dataset("parquet", data_files=f"{self.url}/data/*.parquet", split="train",
                                           cache_dir=str(self.cache))
            except FileNotFoundError as e:
                self.missing.append(str(e))
                continue
            except Exception as e:  # noqa: BLE001
                gone = _vanished(e)  # datasets wraps a shard gone mid-read (the same window) in its own error
                if gone is not None:
                    self.missing.append(gone)
                elif _marker(e):
                    self.marked.append(repr(e))
                else:
                    self.problems.append(f"load_dataset failed mid-run: {e!r}")
                continue
            indices = ds["prompt_index"]
            seen = set(indices)
            if len(seen) != len(indices):
                self.problems.append(f"a load holds an entry twice: {len(indices)} rows, {len(seen)} entries")
            if self.loads and not self.loads[-1] <= seen:
                self.problems.append(f"the dataset shrank: {sorted(self.loads[-1] - seen)} gone")
            self.loads.append(seen)


def _vanished(error: BaseException) -> str | None:
    """The file of a FileNotFoundError behind `error` (its cause or context chain), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, FileNotFoundError):
            return str(error.filename or error)
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _marker(error: BaseException) -> bool:
    """Whether `error` (or its cause or context) is pyarrow's refusal of a file that is no Parquet: the
    compacted shard's marker (a partial shard would be refused so too: the reader's own listing, which
    reads every listed file's bytes, tells the two apart)."""
    import pyarrow as pa

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, pa.ArrowInvalid) and "magic bytes" in str(error):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def normal(value):
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value


def by_index(table, json_text=("metadata", "tool_stats", "tool_error_counts", "reward")) -> dict[int, dict]:
    out = {}
    for row in table.to_pylist():
        row = {k: (json.loads(v) if k in json_text and isinstance(v, str) else v) for k, v in row.items()}
        out[row["prompt_index"]] = normal(row)
    return out


def export(tmp_path: Path, run_name: str, *args: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "flows.cli", "export", run_name, *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / done.stdout.strip().split(" -> ")[-1]


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_kill_storm_publishes_every_final_entry_exactly_once(where, tmp_path, mock_llm, request):
    import pyarrow.parquet as pq

    env = dict(os.environ)
    if where == "s3":
        env.update(request.getfixturevalue("s3"))
        url = f"s3://published/{unique_run('storm')}"
    else:
        url = str(tmp_path / "published")
    run_name = unique_run("publish-storm")
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows(66, run_name))
    cmd = run_cmd(dataset, run_name, mock_llm.base_url, url)
    reader = Reader(url, tmp_path / "hf-cache")
    reader.start()
    rnd = random.Random(48)
    kills = 0
    try:
        for attempt in range(40):
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                if attempt < 12:  # the storm; then the run is let finish
                    proc.wait(timeout=rnd.uniform(0.8, 4.0))
                else:
                    proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                # the run's process alone (its publishing worker reads end-of-file), or its whole group
                os.killpg(proc.pid, signal.SIGKILL) if kills % 2 else proc.kill()
                proc.wait()
                kills += 1
                continue
            stderr = proc.stderr.read().decode()
            assert proc.returncode == 0, stderr[-3000:]
            break
        else:
            pytest.fail("the run never finished")
    finally:
        reader.stop.set()
        reader.join(timeout=120)
    assert kills >= 3, "the storm killed too few runs to mean anything"

    assert not reader.problems, reader.problems[:5]
    assert reader.loads, "the reader never loaded the dataset mid-run"

    fs, root = filesystem(url)
    fs.invalidate_cache()
    manifest = json.loads(fs.cat(f"{root}/_manifest.json"))
    names = sorted(Path(p).name for p in fs.find(f"{root}/data"))
    assert names == sorted(s["name"] for s in manifest["shards"]) and manifest["complete"]
    # files a reader saw vanish are only those a compaction replaced, never a shard of the final set
    assert not {Path(m).name for m in reader.missing} & set(names)
    # a marker was only ever read under a compacted shard's name, and only when a compaction happened
    assert all(m.startswith("compact-") for m in reader.marked if m.endswith(".parquet")), reader.marked[:5]
    assert not reader.marked or any(n.startswith("compact-") for n in names), reader.marked[:5]

    published = pq.read_table([f"{root}/data/{n}" for n in names], filesystem=fs) if len(names) > 1 else \
        pq.read_table(f"{root}/data/{names[0]}", filesystem=fs)
    indices = published.column("prompt_index").to_pylist()
    assert len(indices) == len(set(indices)) == manifest["entries"], "an entry was published twice"

    expected = by_index(pq.read_table(export(tmp_path, run_name, "--format", "parquet")))
    assert sorted(indices) == sorted(expected)  # the same entries as the merge: no failed, discarded or dropped one
    assert not {i for i in indices if i % 11 in (3, 7, 9)}
    assert {i for i in range(66) if i % 11 == 5} <= set(indices)  # failed once, published when it succeeded
    got = by_index(published)
    for i, want in expected.items():
        assert {k: v for k, v in got[i].items() if k in want} == want, f"entry {i} differs from the export"

    import datasets

    final = datasets.load_dataset("parquet", data_files=f"{url}/data/*.parquet", split="train",
                                  cache_dir=str(tmp_path / "hf-final"))
    assert sorted(final["prompt_index"]) == sorted(expected)


def test_publish_after_the_fact_matches_the_export_and_refuses_what_cannot_work(tmp_path, mock_llm):
    from hermes.data.entry import KEPT
    from hermes.run import publish

    assert publish.KEPT == tuple(s.value for s in KEPT)  # the worker's copy, kept to spare it pydantic's models

    run_name = unique_run("publish-later")
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows(12, run_name))
    cmd = [c for c in run_cmd(dataset, run_name, mock_llm.base_url, "x") if not c.startswith("--publish")]

    refused = subprocess.run([*cmd, "--publish_format=xml", f"--publish={tmp_path / 'xml'}"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "xml" in refused.stderr and "rl" in refused.stderr  # names the shapes
    assert not (tmp_path / "data" / run_name / "batch_0.jsonl").exists()  # refused before anything ran
    secret = subprocess.run([*cmd, "--publish=s3://AKIAXXXX:hunter2@bucket/p"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert secret.returncode != 0 and "credentials" in secret.stderr
    assert not (tmp_path / "data" / run_name / "run.json").exists()

    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    target = tmp_path / "later"
    publish = [sys.executable, "-m", "flows.cli", "publish", run_name, str(target), "--format", "sharegpt",
               "--only", "completed", "--every", "2"]
    first = subprocess.run(publish, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]

    import datasets
    import pyarrow.parquet as pq

    shards = sorted((target / "data").glob("*.parquet"))
    assert len(shards) == 1  # shards of 2 entries, compacted into one
    got = by_index(pq.read_table(shards[0]))
    want = [json.loads(line) for line in
            export(tmp_path, run_name, "--format", "sharegpt", "--only", "completed").read_text().splitlines()]
    assert sorted(got) == sorted(e["prompt_index"] for e in want)
    for e in want:
        assert got[e["prompt_index"]] == normal(e)
    assert "messages" not in pq.read_schema(shards[0]).names  # sharegpt: the trajectory's fields only

    again = subprocess.run(publish, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and sorted((target / "data").glob("*.parquet")) == shards  # nothing twice
    ds = datasets.load_dataset("parquet", data_files=str(target / "**" / "*.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert len(ds) == len(want)

    # rl: the rows `export --format rl` writes (messages, tools, reward, turns), as Parquet shards
    rl_target = tmp_path / "later-rl"
    rl = subprocess.run([sys.executable, "-m", "flows.cli", "publish", run_name, str(rl_target), "--format", "rl"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rl.returncode == 0, rl.stderr[-3000:]
    rl_rows = datasets.load_dataset("parquet", data_files=str(rl_target / "data" / "*.parquet"), split="train",
                                    cache_dir=str(tmp_path / "hf-rl"))
    want_rl = {e["key"]: e for e in map(json.loads, export(tmp_path, run_name, "--format", "rl").read_text().splitlines())}
    assert sorted(rl_rows["key"]) == sorted(want_rl) and len(want_rl) > 0
    for row in rl_rows:
        want = want_rl[row["key"]]
        assert (row["prompt_index"], row["reward"], row["tools"]) == (want["prompt_index"], want["reward"], want["tools"])
        assert [m["content"] for m in row["messages"]] == [m.get("content") for m in want["messages"]]
        assert len(row["turns"]) == len(want["turns"])



def test_without_compaction_a_reader_never_meets_a_window_and_publish_compacts_later(tmp_path, mock_llm):
    run_name = unique_run("publish-nocompact")
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows(12, run_name))
    target = tmp_path / "live"
    reader = Reader(str(target), tmp_path / "hf-live")
    reader.start()
    try:
        done = subprocess.run(run_cmd(dataset, run_name, mock_llm.base_url, str(target), "--publish_compact=false"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        reader.stop.set()
        reader.join(timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not reader.problems and not reader.missing and not reader.marked, (reader.problems, reader.missing,
                                                                              reader.marked)
    parts = sorted(p.name for p in (target / "data").glob("*.parquet"))
    assert len(parts) > 1 and all(n.startswith("part-") for n in parts)  # shards of 4 entries, left as they are
    assert reader.listed <= set(parts)  # nothing a reader listed ever went away
    later = subprocess.run([sys.executable, "-m", "flows.cli", "publish", run_name, str(target),
                            "--every", "4"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert later.returncode == 0, later.stderr[-3000:]
    import pyarrow.parquet as pq

    compacted = sorted((target / "data").glob("*.parquet"))
    assert len(compacted) == 1 and compacted[0].name.startswith("compact-")
    assert sorted(pq.read_table(compacted[0])["prompt_index"].to_pylist()) == sorted(
        json.loads(line)["prompt_index"] for line in export(tmp_path, run_name, "--format", "sharegpt").read_text().splitlines())
