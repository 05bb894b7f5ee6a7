"""The journal under concurrent writers: every line whole, none lost, none doubled."""
import json
import threading

from hermes.data import journal


def test_concurrent_appends_land_whole_and_once(tmp_path):
    path = tmp_path / "batch_0.jsonl"
    big = "x" * 70_000  # larger than any pipe or stdio buffer: must still be one intact line
    threads = [threading.Thread(target=lambda t=t: [journal.append(path, {"t": t, "i": i, "pad": big if i % 10 == 0 else ""})
                                                   for i in range(50)]) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends with a newline
    entries = [json.loads(line) for line in lines[:-1]]  # each line parses alone: no interleaving
    assert sorted((e["t"], e["i"]) for e in entries) == [(t, i) for t in range(8) for i in range(50)]
    assert all(len(e["pad"]) == (70_000 if e["i"] % 10 == 0 else 0) for e in entries)
    assert list(journal.read(path)) == entries


def test_read_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "batch_0.jsonl"
    journal.append(path, {"a": 1})
    with open(path, "ab") as f:
        f.write(b'{"a": 2, "conversa')  # a crash mid-write
    assert list(journal.read(path)) == [{"a": 1}]
