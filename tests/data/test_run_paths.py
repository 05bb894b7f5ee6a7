"""RunPaths: the one place a run folder's files are named."""
from __future__ import annotations

from hermes.data import journal
from hermes.data.run_paths import RunPaths, batch_num


def test_batch_files_are_found_by_number_and_others_are_not(tmp_path):
    paths = RunPaths(tmp_path)
    for name in ("batch_10.jsonl", "batch_2.jsonl", "batch_x.jsonl", "batch_3.jsonl.tmp", "trajectories.jsonl"):
        (tmp_path / name).write_text("")
    assert paths.batch_files() == [(2, tmp_path / "batch_2.jsonl"), (10, tmp_path / "batch_10.jsonl")]
    assert journal.batch_files(tmp_path) == paths.batch_files()
    assert paths.batch(7) == tmp_path / "batch_7.jsonl" and batch_num(paths.batch(7).name) == 7
    assert batch_num("batch_7.jsonl.tmp") is None


def test_the_reference_file_names():
    paths = RunPaths.of("data", "r")
    assert [p.name for p in (paths.trajectories, paths.statistics, paths.checkpoint)] == \
        ["trajectories.jsonl", "statistics.json", "checkpoint.json"]
    assert paths.root.as_posix() == "data/r"
