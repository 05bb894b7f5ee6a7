"""The file toolset: read_file, write_file, patch, search_files.

Reading and writing go through `Sandbox.read_file` / `Sandbox.write_file` (bytes, no shell
involved); text processing (line numbers, patching, diffs) happens here on the host, since
the sandbox image has no python. Searching runs busybox-compatible `find` + `grep -nHE`
inside the sandbox, with every model-supplied value shell-quoted.
"""
from __future__ import annotations

import difflib
import re
from typing import Any

from hermes.sandbox.base import SandboxError
from hermes.tools._common import MARK, dumps, error, in_sandbox, marked_lines, q, sandbox_timeout_limit
from hermes.tools.registry import Tool, Toolset, register

READ_DEFAULT_LIMIT = 500
READ_MAX_LIMIT = 2000
READ_MAX_CHARS = 100_000       # content budget of one read_file answer
MAX_LINE_CHARS = 2000          # longer lines are cut in read_file
DIFF_MAX_CHARS = 20_000
SEARCH_DEFAULT_LIMIT = 50
SEARCH_MAX_LIMIT = 1000
SEARCH_LINE_CHARS = 500        # matched line text is cut to this many characters
PRUNED_DIRS = (".git", "node_modules", "__pycache__", ".venv")

READ_FILE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Path of the file to read (absolute, or relative to the working directory)"},
        "offset": {"type": "integer", "description": "Line number to start reading from (1-based, default 1)", "default": 1, "minimum": 1},
        "limit": {"type": "integer", "description": f"Most lines to read (default {READ_DEFAULT_LIMIT}, max {READ_MAX_LIMIT})",
                  "default": READ_DEFAULT_LIMIT, "maximum": READ_MAX_LIMIT},
    },
    "required": ["path"],
}

WRITE_FILE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Path of the file to write (created if missing, overwritten if present)"},
        "content": {"type": "string", "description": "The complete new content of the file"},
    },
    "required": ["path", "content"],
}

PATCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Path of the file to edit"},
        "old_string": {"type": "string", "description": "Exact text to find. Must occur exactly once unless replace_all is true; include surrounding lines to make it unique."},
        "new_string": {"type": "string", "description": "Replacement text ('' deletes the match)"},
        "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring a unique match", "default": False},
    },
    "required": ["path", "old_string", "new_string"],
}

SEARCH_FILES_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string", "description": "Extended regular expression for content search, or a file-name glob (e.g. '*.py') for target='files'"},
        "path": {"type": "string", "description": "Directory or file to search (default: the working directory)", "default": "."},
        "target": {"type": "string", "enum": ["content", "files"], "default": "content",
                   "description": "'content' searches inside files, 'files' finds files by name"},
        "file_glob": {"type": "string", "description": "Content search only: search only files whose name matches this glob (e.g. '*.py')"},
        "limit": {"type": "integer", "description": f"Most results to return (default {SEARCH_DEFAULT_LIMIT})", "default": SEARCH_DEFAULT_LIMIT, "minimum": 1},
        "offset": {"type": "integer", "description": "Skip this many results first (pagination, default 0)", "default": 0, "minimum": 0},
    },
    "required": ["pattern"],
}


# --------------------------------------------------------------------------- helpers

def _split_lines(text: str) -> list[str]:
    """Lines of a text file as a reader counts them: a final newline ends, not starts, a line."""
    if text == "":
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _looks_binary(data: bytes) -> bool:
    sample = data[:8192]
    if b"\x00" in sample:
        return True
    try:
        sample.decode("utf-8")
        return False
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the sample's end is not binary.
        if exc.start >= len(sample) - 4 and exc.reason.startswith("unexpected end"):
            return False
    text = sample.decode("utf-8", errors="replace")
    return text.count("\ufffd") > max(1, len(text) // 100)


def _is_directory(sandbox: Any, path: str) -> bool:
    try:
        result = sandbox.exec(f"[ -d {q(path)} ] && echo '{MARK} dir'", timeout=_short_timeout(sandbox))
    except Exception:
        return False
    return "dir" in marked_lines(result.output)


def _short_timeout(sandbox: Any) -> float:
    limit = sandbox_timeout_limit(sandbox)
    return min(30.0, limit) if limit else 30.0


def _read_bytes(sandbox: Any, path: str) -> tuple[bytes | None, str | None]:
    """(data, None) or (None, error json)."""
    try:
        return sandbox.read_file(path), None
    except FileNotFoundError:
        return None, error(f"File not found: {path}")
    except IsADirectoryError:
        return None, error(f"Is a directory, not a file: {path} (use search_files with target='files' to list it)")
    except PermissionError:
        return None, error(f"Permission denied: {path}")
    except (SandboxError, OSError) as exc:
        if _is_directory(sandbox, path):
            return None, error(f"Is a directory, not a file: {path} (use search_files with target='files' to list it)")
        return None, error(f"Could not read {path}: {exc}")


# --------------------------------------------------------------------------- read_file

def run_read_file(sandbox: Any, args: dict) -> str:
    path: str = args["path"]
    if not path:
        return error("path is empty")
    offset = max(1, int(args.get("offset") or 1))
    limit = max(1, min(int(args.get("limit") or READ_DEFAULT_LIMIT), READ_MAX_LIMIT))

    data, err = _read_bytes(sandbox, path)
    if err:
        return err
    assert data is not None
    if _looks_binary(data):
        return error(f"Binary file, not shown: {path} ({len(data)} bytes)", binary=True, size=len(data))

    lines = _split_lines(data.decode("utf-8", errors="replace"))
    total = len(lines)
    page = lines[offset - 1: offset - 1 + limit]
    out: list[str] = []
    used = 0
    for number, line in enumerate(page, start=offset):
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + "... [line truncated]"
        rendered = f"{number:6d}|{line}"
        if out and used + len(rendered) + 1 > READ_MAX_CHARS:
            break
        out.append(rendered)
        used += len(rendered) + 1
    shown_end = offset + len(out) - 1
    payload: dict[str, Any] = {
        "content": "\n".join(out),
        "total_lines": total,
        "truncated": shown_end < total,
    }
    if payload["truncated"]:
        payload["next_offset"] = shown_end + 1
        payload["hint"] = f"Showing lines {offset}-{shown_end} of {total}; use offset={shown_end + 1} to continue."
    elif offset > total and total > 0:
        payload["hint"] = f"offset {offset} is past the end of the file ({total} lines)."
    return dumps(payload)


# --------------------------------------------------------------------------- write_file

def run_write_file(sandbox: Any, args: dict) -> str:
    path: str = args["path"]
    if not path:
        return error("path is empty")
    data = args["content"].encode("utf-8")
    try:
        sandbox.write_file(path, data)
    except IsADirectoryError:
        return error(f"Is a directory, not a file: {path}")
    except PermissionError:
        return error(f"Permission denied: {path}")
    except (SandboxError, OSError) as exc:
        return error(f"Could not write {path}: {exc}")
    return dumps({"bytes_written": len(data), "path": path})


# --------------------------------------------------------------------------- patch

def _unified_diff(before: str, after: str, path: str) -> str:
    shown = path.lstrip("/")
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{shown}", tofile=f"b/{shown}",
    )
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)
    if len(text) > DIFF_MAX_CHARS:
        text = text[:DIFF_MAX_CHARS] + "\n... [diff truncated]\n"
    return text


def run_patch(sandbox: Any, args: dict) -> str:
    mode = args.get("mode")
    if mode not in (None, "replace"):
        return error(f"patch mode {mode!r} is not supported; use path + old_string + new_string")
    path: str = args["path"]
    old: str = args["old_string"]
    new: str = args["new_string"]
    replace_all = bool(args.get("replace_all", False))
    if not path:
        return error("path is empty")
    if old == "":
        return error("old_string is empty; use write_file to create or overwrite a file")
    if old == new:
        return error("old_string and new_string are identical; nothing to change")

    data, err = _read_bytes(sandbox, path)
    if err:
        return err
    assert data is not None
    try:
        before = data.decode("utf-8")
    except UnicodeDecodeError:
        return error(f"Not a UTF-8 text file, cannot patch: {path}")

    count = before.count(old)
    if count == 0:
        hint = ""
        if old.strip() and old.strip() in before:
            hint = " (it matches when leading/trailing whitespace is ignored: check indentation and newlines)"
        return error(f"old_string not found in {path}{hint}", success=False)
    if count > 1 and not replace_all:
        return error(
            f"old_string found {count} times in {path}; include more surrounding context to make it "
            "unique, or set replace_all=true", success=False, matches=count,
        )
    after = before.replace(old, new) if replace_all else before.replace(old, new, 1)
    try:
        sandbox.write_file(path, after.encode("utf-8"))
    except (SandboxError, OSError) as exc:
        return error(f"Could not write {path}: {exc}", success=False)
    return dumps({
        "success": True,
        "path": path,
        "replacements": count if replace_all else 1,
        "diff": _unified_diff(before, after, path),
        "error": None,
    })


# --------------------------------------------------------------------------- search_files

_MATCH = re.compile(r"^(.*?):(\d+):(.*)$", re.S)


def _prune_expr() -> str:
    names = " -o ".join(f"-name {q(n)}" for n in PRUNED_DIRS)
    return f"\\( -type d \\( {names} \\) \\) -prune -o"


def run_search_files(sandbox: Any, args: dict) -> str:
    pattern: str = args["pattern"]
    path: str = args.get("path") or "."
    target: str = args.get("target") or "content"
    file_glob = args.get("file_glob")
    limit = max(1, min(int(args.get("limit") or SEARCH_DEFAULT_LIMIT), SEARCH_MAX_LIMIT))
    offset = max(0, int(args.get("offset") or 0))
    if pattern == "":
        return error("pattern is empty")

    if target == "files":
        name_test = "-path" if "/" in pattern else "-name"
        finder = f"find {q(path)} {_prune_expr()} -type f {name_test} {q(pattern)} -print"
    else:
        glob_test = f"-name {q(file_glob)} " if file_glob else ""
        finder = (f"find {q(path)} {_prune_expr()} -type f {glob_test}"
                  f"-exec grep -nHE -e {q(pattern)} -- {{}} +")
    # awk keeps the page [offset, offset+limit), cuts long lines (bytes; the host cuts
    # characters cleanly), and counts everything; grep/find errors go to a temp file.
    check = ""
    if target != "files":
        # grep compiles the expression only when it has input: feed it one line.
        check = (f"m=$(echo x | grep -E -e {q(pattern)} 2>&1 >/dev/null)\n"
                 f"if [ $? -ge 2 ]; then echo \"{MARK} badregex\"; echo \"$m\"; exit 0; fi\n")
    script = f"""if [ ! -e {q(path)} ]; then echo "{MARK} nopath"; exit 0; fi
{check}e=$(mktemp 2>/dev/null) || e=/dev/null
{finder} 2>"$e" | awk -v o={offset} -v l={limit} 'NR>o && NR<=o+l {{ print substr($0, 1, 4000) }} END {{ print "{MARK} total " NR }}'
echo "{MARK} errors"
head -c 2000 "$e" 2>/dev/null
[ "$e" = /dev/null ] || rm -f "$e"
"""
    result = sandbox.exec(script)
    output = result.output
    if f"{MARK} nopath" in output:
        return error(f"Path not found: {path}")
    if f"{MARK} badregex" in output:
        detail = output.split(f"{MARK} badregex", 1)[1].strip()[:500]
        return error(f"Invalid regular expression {pattern!r}: {detail}")
    if result.timed_out:
        return error("Search timed out; narrow the path or the pattern")

    total: int | None = None
    body_lines: list[str] = []
    errors_text = ""
    lines = output.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(f"{MARK} total "):
            total = int(line.split()[-1]) if line.split()[-1].isdigit() else None
        elif line == f"{MARK} errors":
            errors_text = "\n".join(lines[i + 1:]).strip()
            break
        elif MARK not in line and line != "":
            body_lines.append(line)
    if total is None:  # the sandbox cut the output before the summary
        total = offset + len(body_lines)
        cut = True
    else:
        cut = False
    truncated = cut or result.truncated or offset + len(body_lines) < total

    if target == "files":
        payload: dict[str, Any] = {"files": body_lines, "total": total, "truncated": truncated}
    else:
        matches = []
        for line in body_lines:
            m = _MATCH.match(line)
            if not m:
                continue
            text = m.group(3)
            if len(text) > SEARCH_LINE_CHARS:
                text = text[:SEARCH_LINE_CHARS] + "... [truncated]"
            matches.append({"path": m.group(1), "line": int(m.group(2)), "text": text})
        payload = {"matches": matches, "total": total, "truncated": truncated}
    if errors_text:
        payload["warnings"] = errors_text[:1000]
    if truncated and not cut:
        payload["hint"] = f"Showing {offset + 1}-{offset + len(body_lines)} of {total}; use offset={offset + len(body_lines)} for more."
    return dumps(payload)


TOOLSET = register(Toolset(
    name="file", needs_sandbox=True, description="file reading, writing, patching and search in the prompt's sandbox",
    tools=[
    Tool(name="read_file",
         description=("Read a text file with line numbers ('     N|text'), paginated with offset/limit. "
                      "Use this instead of cat/head/tail. Binary files are reported, not shown."),
         parameters=READ_FILE_PARAMETERS, run=in_sandbox(run_read_file)),
    Tool(name="write_file",
         description=("Write content to a file, replacing it completely (parent directories are created). "
                      "Use patch for targeted edits."),
         parameters=WRITE_FILE_PARAMETERS, run=in_sandbox(run_write_file)),
    Tool(name="patch",
         description=("Targeted find-and-replace edit of one file: old_string must match exactly and be "
                      "unique unless replace_all=true. Returns a unified diff. Use this instead of sed."),
         parameters=PATCH_PARAMETERS, run=in_sandbox(run_patch)),
    Tool(name="search_files",
         description=("Search file contents with an extended regex (target='content', optional file_glob), "
                      "or find files by name glob (target='files'). Use this instead of grep/find/ls."),
         parameters=SEARCH_FILES_PARAMETERS, run=in_sandbox(run_search_files)),
]))
