"""What reading calls written as text costs per answer: hermes.model.textcalls.recover now, and as it
was before issue 44's follow-up (XML in <tools>, pythonic, one run per repeated call), on the same
answers: every recorded case (tests/model/recorded/), a long prose answer, and answers built to be
slow (a <tools> block full of unclosed tags, thousands of elements, a long call list).

    PYTHONPATH=$PWD python3 -m bench.textcalls_cost [--before REV] [--out bench/textcalls_cost.json]

Prints one line per answer: microseconds per recover() (best of 5 rounds), before and now, and
the calls each found. The machine's load is printed too: the numbers are only comparable within one run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "model" / "recorded"


def _old_module(rev: str):
    """hermes/model/textcalls.py as it was at `rev` (it imported the standard library only then)."""
    source = subprocess.run(["git", "show", f"{rev}:hermes/model/textcalls.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "textcalls_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("textcalls_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def answers() -> dict[str, tuple[str, list[str]]]:
    """name -> (the answer's text, the tools offered)."""
    out = {}
    for path in sorted(RECORDED.glob("*.json")):
        case = json.loads(path.read_text())
        content = case["response"]["choices"][0]["message"].get("content")
        if isinstance(content, str) and content:
            out[path.stem] = (content, case["tools"])
    tools = ["terminal", "write_file", "read_file"]
    out["synthetic_prose_20k"] = ("The answer is that the file holds forty-two lines. " * 400, tools)
    out["synthetic_tools_unclosed_tags"] = ("<tools><function=terminal>" + "<br>x" * 20000 + "</function></tools>", tools)
    out["synthetic_tools_5000_elements"] = ("<tools>" + '<function name="terminal" arguments=\'{"command": "x"}\'/>' * 5000
                                            + "</tools>", tools)
    out["synthetic_tools_20000_unclosed_functions"] = ("<tools>" + "<function=terminal>" * 20000 + "</tools>", tools)
    out["synthetic_python_list_5000"] = ("[" + ",".join(f'terminal(command="{i}")' for i in range(5000)) + "]", tools)
    return out


def _best(fn, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            took = time.perf_counter() - start
            if took > 0.05 or n >= 1000:
                break
        best = min(best, took / n)
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", default="3514ef8", help="the revision to compare with (before the follow-up)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from hermes.model import textcalls
    from hermes.tools import get_tool, openai_schemas

    before = _old_module(a.before)
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    print(f"{'answer':58} {'before us':>10} {'now us':>10}  calls before -> now")
    for name, (text, tool_names) in answers().items():
        tools = openai_schemas([get_tool(t) for t in tool_names])
        old = before.recover(text, tools, "auto")
        new = textcalls.recover(text, tools, "auto")
        row = {"answer": name, "chars": len(text),
               "before_us": round(_best(lambda: before.recover(text, tools, "auto")), 1),
               "now_us": round(_best(lambda: textcalls.recover(text, tools, "auto")), 1),
               "calls_before": 0 if old is None else len(old.calls), "calls_now": 0 if new is None else len(new.calls)}
        rows.append(row)
        print(f"{name[:58]:58} {row['before_us']:>10} {row['now_us']:>10}  {row['calls_before']} -> {row['calls_now']}")
    if a.out:
        a.out.write_text(json.dumps({"load": os.getloadavg()[0], "cpus": os.cpu_count(), "before": a.before,
                                     "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
