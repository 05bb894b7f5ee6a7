import json

import pytest

from hermes.data.dataset import DatasetError, load_rows


def write(tmp_path, lines):
    p = tmp_path / "ds.jsonl"
    p.write_text("".join(l if isinstance(l, str) else json.dumps(l) + "\n" for l in lines), encoding="utf-8")
    return p


def test_rows_carry_fields_and_extra_metadata(tmp_path):
    p = write(tmp_path, [{"prompt": "a", "image": "img:1", "cwd": "/w", "difficulty": "hard"}, "\n", {"prompt": "b"}])
    rows, problems = load_rows(p)
    assert problems == []
    assert [r.index for r in rows] == [0, 1]
    assert [r.line for r in rows] == [1, 3]
    assert rows[0].row.container_image == "img:1" and rows[0].row.cwd == "/w"
    assert rows[0].row.extra == {"difficulty": "hard"}
    assert rows[1].row.container_image is None


def test_docker_image_is_an_alias_for_image(tmp_path):
    rows, _ = load_rows(write(tmp_path, [{"prompt": "a", "docker_image": "x:2"}]))
    assert rows[0].row.container_image == "x:2"


def test_every_bad_line_is_named_with_its_line_and_field(tmp_path):
    p = write(tmp_path, [{"prompt": "ok"}, "{not json\n", {"text": "no prompt"}, {"prompt": 7}, "[1, 2]\n",
                         {"prompt": ""}])
    with pytest.raises(DatasetError) as e:
        load_rows(p)
    problems = e.value.problems
    assert len(problems) == 5
    assert problems[0].startswith(f"{p}:2: not valid JSON")
    assert f"{p}:3: field 'prompt': Field required" in problems[1]
    assert f"{p}:4: field 'prompt'" in problems[2] and "string" in problems[2]
    assert f"{p}:5: expected a JSON object, got list" == problems[3]
    assert f"{p}:6: field 'prompt'" in problems[4]
    assert "nothing was run" in str(e.value)


def test_invalid_utf8_is_reported_not_crashed(tmp_path):
    p = tmp_path / "ds.jsonl"
    p.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DatasetError, match=r":2: not UTF-8"):
        load_rows(p)


def test_skip_bad_keeps_good_rows_and_reports_bad(tmp_path):
    rows, problems = load_rows(write(tmp_path, [{"prompt": "a"}, "oops\n", {"prompt": "b"}]), skip_bad=True)
    assert [r.row.prompt for r in rows] == ["a", "b"]
    assert len(problems) == 1 and ":2:" in problems[0]


def test_missing_file_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_rows(tmp_path / "absent.jsonl")


def test_max_samples_takes_the_first_rows(tmp_path):
    rows, _ = load_rows(write(tmp_path, [{"prompt": str(i)} for i in range(10)]), max_samples=3)
    assert [r.row.prompt for r in rows] == ["0", "1", "2"]


def test_content_keys_follow_content_not_position(tmp_path):
    a = load_rows(write(tmp_path, [{"prompt": "x"}, {"prompt": "y"}, {"prompt": "x"}]))[0]
    b = load_rows(write(tmp_path, [{"prompt": "y"}, {"prompt": "x"}, {"prompt": "x"}]))[0]
    assert {r.key for r in a} == {r.key for r in b}
    assert len({r.key for r in a}) == 3  # the duplicate needs its own completion
    c = load_rows(write(tmp_path, [{"prompt": "x", "image": "other"}]))[0]
    assert c[0].key not in {r.key for r in a}


# ------------------------------------------------------------------ the compact dataset that runs plan with


def test_keys_are_unchanged_for_runs_made_before(tmp_path):
    # Keys are persisted in users' runs: these were computed by the first version of load_rows.
    rows, _ = load_rows(write(tmp_path, [{"prompt": "x"}, {"prompt": "x"}, {"prompt": "x", "docker_image": "i:1",
                                                                              "cwd": "/w"}]))
    import hashlib
    h = hashlib.sha256(repr(("x", None, None)).encode()).hexdigest()[:32]
    assert [r.key for r in rows[:2]] == [f"{h}-0", f"{h}-1"]
    assert rows[2].key == hashlib.sha256(repr(("x", "i:1", "/w")).encode()).hexdigest()[:32] + "-0"


def test_duckdb_numbers_identical_rows_as_python_does(tmp_path):
    import duckdb

    from hermes.data.dataset import read_dataset
    from hermes.data.run_index import load_dataset

    lines = [{"prompt": p} for p in "abacabcaa"] + [{"prompt": "a", "image": "other"}, {"prompt": "é ☃ \u2028"}]
    ds = read_dataset(write(tmp_path, lines))
    con = duckdb.connect()
    load_dataset(con, ds)
    assert [k for (k,) in con.execute("SELECT key FROM dataset ORDER BY idx").fetchall()] == ds.keys()
    assert ds.keys() == [r.key for r in load_rows(tmp_path / "ds.jsonl")[0]]


def test_the_plan_of_a_fresh_run_of_three_attempts_is_every_prompt_in_row_then_attempt_order(tmp_path):
    from hermes.data.dataset import read_dataset
    from hermes.data.run_index import RunIndex

    # the tenth attempt sorts after the ninth (the plan orders by insertion, not by key text)
    ds = read_dataset(write(tmp_path, [{"prompt": p} for p in "abab"]), attempts=10)
    index = RunIndex(tmp_path, database=":memory:")
    index.load_dataset(ds)
    assert index.owed() == ds.indexed_keys()
    assert [k for _, k in index.owed()[:11]] == [ds.keys()[0]] + [f"{ds.keys()[0]}#a{n}" for n in range(2, 11)] + [ds.keys()[10]]


def test_a_row_changed_after_the_check_is_refused_not_run(tmp_path):
    from hermes.data.dataset import read_dataset

    p = write(tmp_path, [{"prompt": "first"}, {"prompt": "second"}])
    ds = read_dataset(p)
    keys = ds.keys()
    p.write_text(json.dumps({"prompt": "FIRST"}) + "\n" + json.dumps({"prompt": "second"}) + "\n")
    assert [r.row.prompt for r in ds.rows([(1, keys[1])])] == ["second"]
    with pytest.raises(DatasetError, match=":1: changed since"):
        ds.rows([(0, keys[0])])


def test_unusual_lines_are_judged_as_before(tmp_path):
    # NaN and repeated fields are accepted, a lone surrogate is not: as the first version judged them
    p = tmp_path / "ds.jsonl"
    p.write_bytes(b'{"prompt": "nan", "score": NaN}\n{"prompt": "lone \\ud800 surrogate"}\n'
                  b'{"prompt": "dup", "prompt": "last wins"}\n')
    rows, problems = load_rows(p, skip_bad=True)
    assert [r.row.prompt for r in rows] == ["nan", "last wins"] and [r.line for r in rows] == [1, 3]
    assert len(problems) == 1 and problems[0].startswith(f"{p}:2: field 'prompt'")


def test_disagreeing_images_are_a_problem_with_the_line(tmp_path):
    p = write(tmp_path, [{"prompt": "a", "image": "x:1", "docker_image": "y:2"}, {"prompt": "b", "cwd": 3}])
    with pytest.raises(DatasetError) as e:
        load_rows(p)
    assert e.value.problems[0].startswith(f"{p}:1: ") and "disagree" in e.value.problems[0]
    assert e.value.problems[1].startswith(f"{p}:2: field 'cwd'")
