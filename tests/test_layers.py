"""The layout holds: imports run one way, from a higher layer to a lower one, with no circle.

Read from the source (AST), not hoped for: every `import` and `from ... import`, at the top of a
module or inside a function (an import put in a function to dodge a circle is still a circle),
except those under `if TYPE_CHECKING:`. A module's own ancestor packages do not count: Python runs
them first whatever the module says.
"""
from __future__ import annotations

import ast
import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hermes", "flows", "tasks", "mockllm", "bench")

#: layers from the top down; a module may import its own layer's modules and any layer below it.
#: Two groups on one line are peers that must not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("bench",),
    ("flows",),
    ("tasks",),
    ("hermes.view",),  # hermes-batch view: reads hermes/run's merge, export and run folder
    ("hermes.api", "hermes.run"),
    ("hermes.agent",),
    ("hermes.model",),
    ("hermes.settings",),
    ("hermes.data", "hermes.tools"),
    ("hermes.sandbox",),
    ("hermes.netpolicy", "hermes.lazyimport", "hermes.environment"),
    ("hermes.errors",),  # the root of the product's errors, under everything that raises them
    ("hermes",),  # the package itself: a docstring
    ("mockllm",),  # the scripted model server knows nothing of the product
]
RANK = {group: rank for rank, groups in enumerate(LAYERS) for group in groups}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if any(part.startswith(".") or part == "node_modules" for part in path.relative_to(ROOT).parts):
                continue  # a virtual environment (bench/.venv-reference), hidden folders
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(path: Path) -> set[str]:
    """Every module name the file imports (absolute imports; the product uses no relative ones)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for n in ast.walk(node))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def graph() -> dict[str, set[str]]:
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = collections.defaultdict(set)
    for mod, path in mods.items():
        for name in imports_of(path):
            target = resolve(name)
            if target and target != mod and not mod.startswith(target + "."):
                edges[mod].add(target)
        edges.setdefault(mod, set())
    return edges


def group(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2]) if parts[0] == "hermes" and len(parts) > 1 else parts[0]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_belongs_to_a_layer():
    assert {group(m) for m in modules()} - set(RANK) == set(), "a new top-level module or package: give it a layer"


def test_no_import_circles():
    assert circles(graph()) == []


def test_imports_run_downward():
    upward = sorted(f"{mod} imports {target}" for mod, targets in graph().items() for target in targets
                    if group(mod) != group(target) and RANK[group(target)] <= RANK[group(mod)])
    assert upward == []


def test_the_domain_never_imports_prefect():
    offenders = sorted(f"{mod}: {name}" for mod, path in modules().items() if group(mod).startswith("hermes")
                       for name in imports_of(path) if name.split(".")[0] in ("prefect", "prefect_dask", "flows", "tasks"))
    assert offenders == []


def test_hermes_top_level_is_a_few_layers():
    # every entry is a layer of LAYERS (no module left lying about), and they stay few: 11 before
    # issue 32 put the bottom layer's environment.py and errors.py beside netpolicy.py
    entries = sorted(p.name for p in (ROOT / "hermes").iterdir() if p.name not in ("__pycache__", "__init__.py"))
    layered = {g.removeprefix("hermes.") for groups in LAYERS for g in groups if g.startswith("hermes.")}
    assert [e for e in entries if e.removesuffix(".py") not in layered] == []
    assert len(entries) <= 13, entries


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The checks above would fail on the faults they look for (graphs made for the purpose)."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert RANK["hermes.sandbox"] > RANK["hermes.run"]  # so sandbox -> run reads as upward


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_every_module_imports_on_its_own():
    """Each module of the product imports in a process that has imported nothing of ours before
    (as Prefect's own import smoke test does): no module relies on another having been loaded first.
    One clean interpreter forks a child per module, so each child starts with the standard library only."""
    names = sorted(m for m in modules() if group(m) != "bench" and not m.endswith(".__main__"))
    script = (
        "import os, sys, traceback\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "bad, running = [], {}\n"
        "def reap():\n"
        "    pid, status = os.wait()\n"
        "    if status:\n"
        "        bad.append(running[pid])\n"
        "    del running[pid]\n"
        "for name in sys.argv[1:]:\n"
        "    if len(running) >= 2:\n"
        "        reap()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            __import__(name)\n"
        "        except BaseException:\n"
        "            traceback.print_exc()\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    running[pid] = name\n"
        "while running:\n"
        "    reap()\n"
        "print('FAILED:' + ','.join(sorted(bad)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "FAILED:", proc.stderr[-3000:]
