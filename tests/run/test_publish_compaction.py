"""--publish's compaction seen by a reader that lists the files, then reads them (issue 48): whatever the
moments of its listing and of each read, it gets every entry once, or an error; never an entry twice,
never fewer (hermes.run.publish's docstring). A real folder; the kill storms in test_publish.py meet
the same window with datasets' loader, on a folder and on S3."""
from __future__ import annotations

import collections
import json


def small_run(tmp_path):
    """A run folder of five batch files of three final entries each (no run is needed to publish one)."""
    from hermes.data.run_paths import RunPaths

    run = tmp_path / "run"
    run.mkdir()
    for num in range(5):
        RunPaths(run).batch(num).write_text("".join(json.dumps({
            "prompt_index": 3 * num + i, "conversations": [{"from": "human", "value": f"q{3 * num + i}"}],
            "metadata": {}, "completed": True, "partial": False, "api_calls": 1, "toolsets_used": [],
            "tool_stats": {}, "tool_error_counts": {},
            "hermes": {"status": "completed", "key": f"k{3 * num + i}"}}) + "\n" for i in range(3)))
    return run


def test_compaction_shows_a_reader_that_lists_then_reads_either_a_whole_dataset_or_an_error(tmp_path, monkeypatch):
    """Every moment a reader could list the folder, and every later moment it could read each listed file
    (in name order, as datasets reads them): what it gets is an error (a listed shard gone, or the
    marker) or exactly every entry once. The folder is real; the store is wrapped only to copy the
    folder after each single-file step of the compaction."""
    import itertools

    import pyarrow as pa
    import pyarrow.parquet as pq

    from hermes.run import publish

    run = small_run(tmp_path)
    folder = tmp_path / "published"
    pub = publish.Publication(run, str(folder), "sharegpt", every="3").open()
    pub.catch_up()
    pub.flush()
    before = sorted(p.name for p in (folder / "data").glob("*.parquet"))
    assert len(before) == 5

    states = []  # the folder's files after each step: name -> bytes

    def snapshot():
        states.append({p.name: p.read_bytes() for p in (folder / "data").glob("*.parquet")})

    store = pub.target.store
    for method in ("put_file", "put_bytes", "remove"):
        def spied(*args, _real=getattr(store, method)):
            _real(*args)
            snapshot()
        monkeypatch.setattr(store, method, spied)
    monkeypatch.setattr(publish, "COMPACT_GRACE", 0.0)  # the grace protects readers out of name order only
    snapshot()
    assert pub.compact() == 1
    pub.close()
    after = sorted(p.name for p in (folder / "data").glob("*.parquet"))
    assert len(after) == 1 and after[0].startswith("compact-") and after[0] < before[0]  # sorts first

    everyone = list(range(15))
    outcomes = collections.Counter()
    for listed_at, listing in enumerate(states):
        names = sorted(listing)
        # each listed file is read at some later step, in name order: non-decreasing steps from listed_at
        for steps in itertools.combinations_with_replacement(range(listed_at, len(states)), len(names)):
            got, error = [], None
            for name, step in zip(names, steps):
                data = states[step].get(name)
                if data is None:
                    error = "gone"
                    break
                if data == publish.COMPACTING:
                    error = "marker"
                    break
                got += pq.read_table(pa.BufferReader(data)).column("prompt_index").to_pylist()
            if error:
                outcomes[error] += 1
            else:
                assert sorted(got) == everyone, (listed_at, steps, sorted(got))
                outcomes["whole"] += 1
    assert outcomes["whole"] and outcomes["gone"] and outcomes["marker"], outcomes


def test_a_compaction_stopped_after_its_marker_is_finished_by_the_next_invocation(tmp_path, monkeypatch):
    """A worker dies between the marker and the reveal (here: its removal fails): the marker stays (loud,
    never wrong) and the next invocation's open() goes through the steps again: one compacted shard,
    every entry once, no marker, no small shard left."""
    import pyarrow.parquet as pq

    from hermes.run import publish

    run, folder = small_run(tmp_path), tmp_path / "published"
    monkeypatch.setattr(publish, "COMPACT_GRACE", 0.0)
    pub = publish.Publication(run, str(folder), "sharegpt", every="3").open()
    pub.catch_up()
    pub.flush()

    def dies(*_):
        raise OSError("the worker is killed here")

    monkeypatch.setattr(pub.target.store, "remove", dies)
    try:
        pub.compact()
    except OSError:
        pass
    else:
        raise AssertionError("the compaction went through")
    pub.close()
    marked = [p for p in (folder / "data").glob("compact-*.parquet")]
    assert len(marked) == 1 and marked[0].read_bytes() == publish.COMPACTING

    again = publish.Publication(run, str(folder), "sharegpt", every="3").open()
    again.write_manifest(complete=True)
    again.close()
    files = sorted((folder / "data").glob("*.parquet"))
    assert files == marked
    assert sorted(pq.read_table(files[0]).column("prompt_index").to_pylist()) == list(range(15))
    manifest = json.loads((folder / "_manifest.json").read_text())
    assert [s["name"] for s in manifest["shards"]] == [marked[0].name] and manifest["entries"] == 15
