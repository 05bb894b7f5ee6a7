"""The tools (hermes/tools) against real shells: a local sandbox and, when an engine and the
image are there, a real Docker container. No mocks: every command really runs."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid

import pytest

from hermes.sandbox import open_sandbox
from hermes.sandbox.base import SandboxSettings, SandboxSpec
from hermes.sandbox.local import LocalSandbox
from hermes.tools import TOOLS, TOOLSETS, Tool, openai_schemas, run_tool, tools_for
from hermes.tools.processes import stop_background_processes
from tests.helpers import until


# --------------------------------------------------------------------------- fixtures

# Every tool test runs on each of the product's backends: "local" (LocalSandbox: the host's sh
# and tools) and "docker" (a real hardened container of the default image, a busybox userland;
# conftest's docker_engine fails it under CI when no engine answers, and skips it elsewhere).


def _local_sandbox(request):
    return LocalSandbox(SandboxSpec(image="local"), SandboxSettings(backend="local", command_timeout=20))


def _docker_sandbox(request):
    image = request.getfixturevalue("sandbox_image")
    return open_sandbox(SandboxSpec(image=image, run_id="test-tools", prompt_id=uuid.uuid4().hex[:8]),
                        SandboxSettings(backend="docker", image=image, command_timeout=20))


_FACTORIES = {"local": _local_sandbox, "docker": _docker_sandbox}


@pytest.fixture(params=[pytest.param("local"), pytest.param("docker", marks=pytest.mark.docker)])
def sb(request):
    box = _FACTORIES[request.param](request)
    try:
        yield box
    finally:
        _kill_background(box)
        box.close()


def _kill_background(box) -> None:
    """Background processes outlive a host-side sandbox: stop the ones a test started."""
    stop_background_processes(box)


def call(box, name: str, **args) -> dict:
    raw = run_tool(name, json.dumps(args), box)
    assert isinstance(raw, str)
    return json.loads(raw)


def exists_in(box, path: str) -> bool:
    return box.exec(f"[ -e '{path}' ] && echo YES").output.strip() == "YES"


# --------------------------------------------------------------------------- registry

def test_registry_names_toolsets_and_schemas():
    browser = ["browser_navigate", "browser_snapshot", "browser_click", "browser_type", "browser_scroll", "browser_back",
               "browser_press", "browser_get_images", "browser_vision", "browser_console"]
    assert list(TOOLS) == ["terminal", "process", "read_file", "write_file", "patch", "search_files",
                           "web_search", "web_extract", "vision_analyze", *browser, "image_generate"]
    assert TOOLSETS == {"terminal": ["terminal", "process"],
                        "file": ["read_file", "write_file", "patch", "search_files"],
                        "web": ["web_search", "web_extract"], "vision": ["vision_analyze"], "browser": browser,
                        "image_gen": ["image_generate"]}
    assert [t.name for t in tools_for(["file"])] == ["read_file", "write_file", "patch", "search_files"]
    assert [t.name for t in tools_for({"web", "terminal"})] == ["terminal", "process", "web_search", "web_extract"]
    assert [t.name for t in tools_for({"vision", "terminal"})] == ["terminal", "process", "vision_analyze"]
    assert tools_for([]) == []
    schemas = openai_schemas(tools_for(["terminal", "file"]))
    assert len(schemas) == 6
    for schema in schemas:
        assert schema["type"] == "function"
        fn = schema["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert fn["parameters"]["type"] == "object"
        assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
        json.dumps(schema)  # serialisable as a request body
    assert TOOLS["terminal"].required == ["command"]
    assert TOOLS["patch"].required == ["path", "old_string", "new_string"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TOOLS["terminal"].name = "x"  # frozen
    assert TOOLS["terminal"].name == "terminal"
    assert isinstance(TOOLS["read_file"], Tool)


def test_run_tool_errors_never_raise(sb):
    assert json.loads(run_tool("no_such_tool", "{}", sb)) == {"error": "Unknown tool: no_such_tool"}
    bad = json.loads(run_tool("terminal", "{not json", sb))
    assert bad["error"].startswith("Invalid JSON arguments: ")
    assert "object" in json.loads(run_tool("terminal", "[1, 2]", sb))["error"]
    missing = json.loads(run_tool("terminal", "{}", sb))
    assert "command" in missing["error"] and "Missing" in missing["error"]
    assert "command" in json.loads(run_tool("terminal", '{"command": null}', sb))["error"]
    wrong = json.loads(run_tool("terminal", json.dumps({"command": 5}), sb))
    assert "command" in wrong["error"] and "string" in wrong["error"]
    wrong = json.loads(run_tool("read_file", json.dumps({"path": "a", "limit": "lots"}), sb))
    assert "limit" in wrong["error"] and "integer" in wrong["error"]
    enum = json.loads(run_tool("process", json.dumps({"action": "explode"}), sb))
    assert "action" in enum["error"] and "explode" in enum["error"]
    # lossless coercions models often need, and nulls for optional parameters
    ok = json.loads(run_tool("terminal", json.dumps({"command": "echo hi", "timeout": "5", "workdir": None}), sb))
    assert ok == {"output": "hi\n", "exit_code": 0, "error": None}
    # already-parsed arguments and an empty argument string are accepted too
    assert json.loads(run_tool("terminal", {"command": "echo x"}, sb))["output"] == "x\n"
    assert "command" in json.loads(run_tool("terminal", "", sb))["error"]


def test_run_tool_reports_exceptions_from_a_broken_sandbox(sb):
    sb.close()  # every exec now raises SandboxError inside the tool
    for name, args in (("terminal", {"command": "echo hi"}),
                       ("search_files", {"pattern": "a"}), ("process", {"action": "list"})):
        result = json.loads(run_tool(name, json.dumps(args), sb))
        assert set(result) == {"error"} and result["error"].startswith("SandboxError: "), result
        assert "closed" in result["error"], result


def test_results_are_json_strings_without_ascii_escaping(sb):
    raw = run_tool("write_file", json.dumps({"path": "ü.txt", "content": "héllo ✓\n"}), sb)
    assert "ü.txt" in raw
    raw = run_tool("read_file", json.dumps({"path": "ü.txt"}), sb)
    assert "héllo ✓" in raw


# --------------------------------------------------------------------------- files

def test_write_then_read_back(sb):
    content = "alpha\nbeta\n\ngamma\n"
    w = call(sb, "write_file", path="dir/sub/notes.txt", content=content)
    assert w == {"bytes_written": len(content.encode()), "path": "dir/sub/notes.txt"}
    r = call(sb, "read_file", path="dir/sub/notes.txt")
    assert r["content"] == "     1|alpha\n     2|beta\n     3|\n     4|gamma"
    assert r["total_lines"] == 4 and r["truncated"] is False
    assert sb.read_file("dir/sub/notes.txt") == content.encode()
    # overwrite; unicode byte count
    w = call(sb, "write_file", path="dir/sub/notes.txt", content="π")
    assert w["bytes_written"] == 2
    assert call(sb, "read_file", path="dir/sub/notes.txt")["content"] == "     1|π"
    # empty file
    call(sb, "write_file", path="empty", content="")
    assert call(sb, "read_file", path="empty") == {"content": "", "total_lines": 0, "truncated": False}


def test_read_offset_and_limit(sb):
    call(sb, "write_file", path="n.txt", content="".join(f"line {i}\n" for i in range(1, 11)))
    r = call(sb, "read_file", path="n.txt", offset=3, limit=2)
    assert r["content"] == "     3|line 3\n     4|line 4"
    assert r["total_lines"] == 10 and r["truncated"] is True and r["next_offset"] == 5
    r = call(sb, "read_file", path="n.txt", offset=9, limit=5)
    assert r["content"] == "     9|line 9\n    10|line 10" and r["truncated"] is False
    r = call(sb, "read_file", path="n.txt", offset=50)
    assert r["content"] == "" and r["total_lines"] == 10 and r["truncated"] is False
    # the default page is 500 lines
    call(sb, "write_file", path="big.txt", content="x\n" * 700)
    r = call(sb, "read_file", path="big.txt")
    assert r["content"].count("\n") == 499 and r["truncated"] is True and r["next_offset"] == 501


def test_read_errors_missing_directory_binary(sb):
    r = call(sb, "read_file", path="nope/missing.txt")
    assert "not found" in r["error"].lower() and "nope/missing.txt" in r["error"]
    sb.exec("mkdir -p adir")
    r = call(sb, "read_file", path="adir")
    assert "directory" in r["error"].lower()
    sb.write_file("blob.bin", bytes(range(256)) * 4)
    r = call(sb, "read_file", path="blob.bin")
    assert "binary" in r["error"].lower() and "content" not in r


def test_patch_unique_ambiguous_replace_all(sb):
    call(sb, "write_file", path="src/app.py", content="def f():\n    return 1\n\nx = f()\ny = f()\n")
    p = call(sb, "patch", path="src/app.py", old_string="return 1", new_string="return 2")
    assert p["success"] is True and p["replacements"] == 1
    assert "--- a/src/app.py" in p["diff"] and "+++ b/src/app.py" in p["diff"]
    assert "-    return 1\n" in p["diff"] and "+    return 2\n" in p["diff"]
    assert sb.read_file("src/app.py") == b"def f():\n    return 2\n\nx = f()\ny = f()\n"

    amb = call(sb, "patch", path="src/app.py", old_string="f()", new_string="g()")
    assert amb["error"].startswith("old_string found 3 times in src/app.py")  # "def f():" has one too
    assert amb["success"] is False and amb["matches"] == 3
    assert sb.read_file("src/app.py") == b"def f():\n    return 2\n\nx = f()\ny = f()\n"  # untouched

    allp = call(sb, "patch", path="src/app.py", old_string="= f()", new_string="= g()", replace_all=True)
    assert allp["success"] is True and allp["replacements"] == 2
    assert "+x = g()\n+y = g()\n" in allp["diff"]
    assert sb.read_file("src/app.py") == b"def f():\n    return 2\n\nx = g()\ny = g()\n"

    nf = call(sb, "patch", path="src/app.py", old_string="return 42", new_string="x")
    assert "not found" in nf["error"]
    miss = call(sb, "patch", path="src/none.py", old_string="a", new_string="b")
    assert "not found" in miss["error"].lower()
    assert "old_string" in call(sb, "patch", path="src/app.py", old_string="", new_string="b")["error"]
    # deletion with an empty new_string, on a file without a final newline
    call(sb, "write_file", path="t.txt", content="keep DROP keep")
    d = call(sb, "patch", path="t.txt", old_string=" DROP", new_string="")
    assert d["success"] and sb.read_file("t.txt") == b"keep keep"
    assert "No newline at end of file" in d["diff"]


def test_search_content_and_files(sb):
    call(sb, "write_file", path="proj/a.py", content="import os\ndef main():\n    print('hello world')\n")
    call(sb, "write_file", path="proj/lib/b.py", content="HELLO = 1\nhello_again = 2\n")
    call(sb, "write_file", path="proj/notes.md", content="say hello\n")
    call(sb, "write_file", path="proj/.git/config", content="hello from git\n")

    r = call(sb, "search_files", pattern="hel+o", path="proj")
    found = {(m["path"], m["line"], m["text"]) for m in r["matches"]}
    assert found == {("proj/a.py", 3, "    print('hello world')"),
                     ("proj/lib/b.py", 2, "hello_again = 2"),
                     ("proj/notes.md", 1, "say hello")}
    assert r["total"] == 3 and r["truncated"] is False

    r = call(sb, "search_files", pattern="^(HELLO|import) ", path="proj", file_glob="*.py")
    assert sorted((m["path"], m["line"]) for m in r["matches"]) == [("proj/a.py", 1), ("proj/lib/b.py", 1)]

    r = call(sb, "search_files", pattern="hello", path="proj", limit=2)
    assert len(r["matches"]) == 2 and r["total"] == 3 and r["truncated"] is True
    r2 = call(sb, "search_files", pattern="hello", path="proj", limit=2, offset=2)
    assert len(r2["matches"]) == 1 and r2["truncated"] is False

    f = call(sb, "search_files", pattern="*.py", path="proj", target="files")
    assert sorted(f["files"]) == ["proj/a.py", "proj/lib/b.py"] and f["total"] == 2

    # default path is the working directory
    r = call(sb, "search_files", pattern="hello_again")
    assert [m["line"] for m in r["matches"]] == [2] and r["matches"][0]["path"].endswith("proj/lib/b.py")

    assert call(sb, "search_files", pattern="zzz_nothing", path="proj") == {"matches": [], "total": 0, "truncated": False}
    assert "regular expression" in call(sb, "search_files", pattern="(", path="proj")["error"]
    assert "not found" in call(sb, "search_files", pattern="x", path="no/such/dir")["error"].lower()


# --------------------------------------------------------------------------- terminal

def test_terminal_exit_codes_output_and_workdir(sb):
    r = call(sb, "terminal", command="echo out; echo err >&2")
    assert r["exit_code"] == 0 and r["error"] is None
    assert "out" in r["output"] and "err" in r["output"]
    r = call(sb, "terminal", command="echo failing; exit 3")
    assert r == {"output": "failing\n", "exit_code": 3, "error": None}
    sb.exec("mkdir -p w/deeper")
    r = call(sb, "terminal", command="pwd", workdir="w/deeper")
    assert r["output"].strip().endswith("/w/deeper") and r["exit_code"] == 0
    r = call(sb, "terminal", command="echo never", workdir="no/such/dir")
    assert "Working directory not found" in r["error"] and "never" not in r["output"]
    assert call(sb, "terminal", command="   ")["error"]


def test_terminal_timeout_is_reported(sb):
    r = call(sb, "terminal", command="echo started; sleep 10; echo finished", timeout=1)
    assert r["error"] == "Command timed out after 1s" and r["exit_code"] == -1
    assert r["output"].startswith("started") and "finished" not in r["output"]


def test_background_poll_wait_log_kill(sb):
    started = call(sb, "terminal", command="echo tick; sleep 30; echo never", background=True)
    assert started["error"] is None and started["exit_code"] == 0 and started["output"] == ""
    pid = started["process_id"]
    assert pid.startswith("proc_")

    quick = call(sb, "terminal", command="echo one; echo two; exit 4", background=True)
    qid = quick["process_id"]
    assert qid != pid

    w = call(sb, "process", action="wait", process_id=qid, timeout=10)
    assert w["status"] == "exited" and w["exit_code"] == 4 and w["timed_out"] is False
    assert "one\ntwo" in w["output"]
    log = call(sb, "process", action="log", process_id=qid)
    assert log["output"] == "one\ntwo\n" and log["total_lines"] == 2
    log = call(sb, "process", action="log", process_id=qid, offset=2, limit=1)
    assert log["output"] == "two\n"

    p = until(lambda: (q := call(sb, "process", action="poll", process_id=pid)) and "tick" in q["output"] and q,
              "the background job's first line", timeout=30, every=0.1)
    assert p["status"] == "running" and p["exit_code"] is None and "tick" in p["output"]
    assert p["command"].startswith("echo tick")

    w = call(sb, "process", action="wait", process_id=pid, timeout=1)
    assert w["status"] == "running" and w["timed_out"] is True

    listing = call(sb, "process", action="list")
    by_id = {proc["process_id"]: proc for proc in listing["processes"]}
    assert by_id[pid]["status"] == "running" and by_id[qid]["status"] == "exited"
    assert by_id[qid]["exit_code"] == 4

    k = call(sb, "process", action="kill", process_id=pid)
    assert k["killed"] is True and k["status"] == "killed"
    assert call(sb, "process", action="poll", process_id=pid)["status"] == "killed"
    again = call(sb, "process", action="kill", process_id=pid)
    assert again["killed"] is False and again["error"] is None

    sb.exec("mkdir -p bgdir/inner")
    here = call(sb, "terminal", command="pwd", background=True, workdir="bgdir/inner")
    w = call(sb, "process", action="wait", process_id=here["process_id"], timeout=10)
    assert w["exit_code"] == 0 and w["output"].strip().endswith("/bgdir/inner")
    assert "Working directory not found" in call(sb, "terminal", command="pwd", background=True,
                                                 workdir="no/such")["error"]

    assert "Unknown process_id" in call(sb, "process", action="poll", process_id="proc_999")["error"]

    two = [call(sb, "terminal", command="sleep 41", background=True)["process_id"] for _ in range(2)]
    assert stop_background_processes(sb) == 2
    assert {call(sb, "process", action="poll", process_id=i)["status"] for i in two} == {"killed"}
    assert stop_background_processes(sb) == 0
    assert "process_id" in call(sb, "process", action="poll")["error"]


def test_background_kill_reaches_children(sb):
    # the sleep runs as a grandchild of the tracked pid; kill must reach it
    marker = f"hermes-kill-{uuid.uuid4().hex[:8]}"
    started = call(sb, "terminal", command=f"sh -c 'sleep 3719; echo {marker}' ; echo after", background=True)
    pid = started["process_id"]

    # Filtered where it runs: the local variant's ps lists every process of the host, and on a busy
    # host that listing passes the output cap, whose cut can hide the very line looked for.
    # ([s]leep, [h]ermes: grep's own command line does not match itself.)
    pattern = f"-e '[s]leep 3719' -e '[h]{marker[1:]}'"

    def ps() -> str:
        return sb.exec(f"(ps -o pid,args 2>/dev/null || ps) | grep {pattern} || true").output

    # A whole-word match: the local variant's ps lists the host's processes too (a `sleep 370` there is not ours).
    until(lambda: re.search(r"\bsleep 3719\b", ps()), "the grandchild sleep to start", timeout=30)
    k = call(sb, "process", action="kill", process_id=pid)
    assert k["killed"] is True and k["status"] == "killed", k
    # Every process of the job names the marker (the wrappers carry the whole command): once none
    # is left, nothing can still write "after" or the marker into the log.
    until(lambda: marker not in ps() and not re.search(r"\bsleep 3719\b", ps()), "the job's processes to die", timeout=30)
    log = call(sb, "process", action="log", process_id=pid)
    assert marker not in log["output"] and "after" not in log["output"], log


# --------------------------------------------------------------------------- hostile input

def test_hostile_arguments_are_data_not_code(sb):
    tag = uuid.uuid4().hex[:10]
    pwned = f"/tmp/pwned_{tag}"
    path = f"x; touch {pwned}"
    content = f"$(touch {pwned}) `touch {pwned}` '\"; touch {pwned}; echo \"' \\n $HOME\n"

    w = call(sb, "write_file", path=path, content=content)
    assert w["path"] == path
    r = call(sb, "read_file", path=path)
    assert r["content"] == "     1|" + content.rstrip("\n")
    p = call(sb, "patch", path=path, old_string="$HOME", new_string=f"$(touch {pwned})'")
    assert p["success"] is True

    call(sb, "search_files", pattern=f"'; touch {pwned}; echo '", path=path)
    call(sb, "search_files", pattern="x", path=f"$(touch {pwned})")
    call(sb, "search_files", pattern=f"`touch {pwned}`", target="files")
    call(sb, "search_files", pattern="x", file_glob=f"*' -exec touch {pwned} ';' -name '*")
    call(sb, "terminal", command="true", workdir=f"$(touch {pwned})")
    call(sb, "terminal", command="true", workdir=f"'; touch {pwned}; '")
    for bad in (f"proc_1; touch {pwned}", "../../etc", "proc_1/../../x"):
        assert "Invalid process_id" in call(sb, "process", action="poll", process_id=bad)["error"]

    assert not exists_in(sb, pwned), "a hostile argument was executed"
    assert not os.path.exists(pwned)
    # and the literal file is there, under its literal name
    assert sb.read_file(path).startswith(f"$(touch {pwned})".encode())
    # (its name has a slash: it is the file pwned_TAG in a directory called "x; touch ")
    listed = call(sb, "search_files", pattern=f"pwned_{tag}", target="files")
    assert [f.lstrip("./") for f in listed["files"]] == [path]


def test_timeout_cap_through_a_lazy_sandbox():
    """A LazySandbox knows its limit before its backend exists; the tools cap to it."""
    from hermes.sandbox.lazy import LazySandbox
    from hermes.tools._common import sandbox_timeout_limit

    lazy = LazySandbox(lambda: LocalSandbox(SandboxSpec(image="local"),
                                            SandboxSettings(backend="local", command_timeout=2)), command_timeout=2)
    try:
        assert sandbox_timeout_limit(lazy) == 2
        assert not lazy.started  # the limit was known before any backend existed
        r = call(lazy, "terminal", command="echo begun; sleep 6; echo never", timeout=500)
        assert r["error"] == "Command timed out after 2s" and "never" not in r["output"]
    finally:
        lazy.close()
