"""The viewer's HTTP side: one page (static/index.html, routed by its script), a JSON API, the run's images.

Everything shown is model-written text, so the page builds its DOM with textContent only and the
Content-Security-Policy allows this origin's own scripts and nothing inline or elsewhere.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from hermes.view import compare, queries, tasks
from hermes.view.index import ViewIndex

STATIC = Path(__file__).resolve().parent / "static"
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'"


def create_app(run_dir: Path | list[Path], index: ViewIndex | None = None) -> FastAPI:
    """The viewer of one run, or of several (`hermes-batch view A B`: the first is the default of every
    page; `?run=<label>` picks another; /compare?runs=A,B sets them side by side)."""
    dirs = [Path(d).resolve() for d in (run_dir if isinstance(run_dir, (list, tuple)) else [run_dir])]
    run_dir = dirs[0]
    index = index or ViewIndex(run_dir)
    indexes: dict[str, ViewIndex] = {}
    for d, idx in zip(dirs, [index] + [ViewIndex(d) for d in dirs[1:]]):
        label = d.name if d.name not in indexes else f"{d.name} ({len(indexes) + 1})"  # same name, other folder
        indexes[label] = idx
    app = FastAPI(title="hermes-batch view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.index = index
    app.state.indexes = indexes

    def pick(run: str | None) -> ViewIndex:
        if run is None:
            return index
        if run not in indexes:
            raise HTTPException(404, f"no run {run!r} served here (served: {', '.join(indexes)})")
        return indexes[run]

    @app.middleware("http")
    async def headers(request: Request, call_next):
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"  # a run in progress: a reload shows new entries
        return response

    page = STATIC / "index.html"

    @app.get("/", include_in_schema=False)
    @app.get("/tasks", include_in_schema=False)
    @app.get("/compare", include_in_schema=False)
    @app.get("/entry/{prompt_index}", include_in_schema=False)
    def index_page() -> FileResponse:
        return FileResponse(page, media_type="text/html")

    @app.get("/api/summary")
    def summary(run: str | None = None) -> dict:
        return {**queries.summary(pick(run)), "runs": list(indexes)}

    @app.get("/api/entries")
    def entries(filters: Annotated[queries.Filters, Depends()], run: str | None = None) -> dict:
        return queries.entries(pick(run), filters)

    @app.get("/api/tasks")
    def task_list(filters: Annotated[tasks.TaskFilters, Depends()], run: str | None = None) -> dict:
        return tasks.tasks(pick(run), filters)

    @app.get("/api/tasks/next")
    def next_task(task: str, kind: str | None = None, step: int = 1, run: str | None = None) -> dict:
        if kind is not None and kind not in tasks.KINDS:
            raise HTTPException(422, f"kind is one of {', '.join(tasks.KINDS)}")
        return {"task": tasks.neighbour(pick(run), task, kind, 1 if step >= 0 else -1)}

    @app.get("/api/runs")
    def two_runs(filters: Annotated[tasks.RunsFilters, Depends()], runs: str) -> dict:
        a, b = _two(runs)
        return {"runs": [a, b], **tasks.runs(indexes[a], indexes[b], filters)}

    def _two(runs: str) -> tuple[str, str]:
        names = [r for r in runs.split(",") if r]
        if len(names) != 2:
            raise HTTPException(422, "runs names two runs: runs=A,B")
        pick(names[0]), pick(names[1])
        return names[0], names[1]

    @app.get("/api/compare")
    def compare_view(task: str | None = None, entries: str | None = None, runs: str | None = None,
                     run: str | None = None, ref: int = 0) -> dict:
        if runs is not None:
            if task is None:
                raise HTTPException(422, "compare?runs=A,B needs a task (or open /compare?runs=A,B for the tasks)")
            lines = [(name, indexes[name], row) for name in _two(runs) for row in compare.task_lines(indexes[name], task)]
        elif task is not None:
            idx = pick(run)
            lines = [(None, idx, row) for row in compare.task_lines(idx, task)]
        elif entries is not None:
            try:  # prompt indexes, each optionally with its attempt: entries=3,7:2 (7:2, the 2nd attempt of 7)
                wanted = [(int(e.split(":")[0]), int(e.split(":")[1]) if ":" in e else None)
                          for e in entries.split(",") if e.strip()]
            except ValueError:
                raise HTTPException(422, "entries lists prompt indexes, each with its attempt or not: "
                                         "entries=3,7:2") from None
            idx = pick(run)
            lines = [(None, idx, row) for row in compare.entry_lines(idx, wanted)]
        else:
            raise HTTPException(422, "compare what? task=<key>, entries=<i>,<j> or runs=A,B&task=<key>")
        if not lines:
            raise HTTPException(404, "nothing to compare: no such task or entries in this run")
        return compare.compare(lines, ref)

    @app.get("/api/entry/{prompt_index}")
    def entry(prompt_index: int, pos: int | None = None, run: str | None = None) -> dict:
        found = queries.entry(pick(run), prompt_index, pos)
        if found is None:
            raise HTTPException(404, f"no entry with prompt_index {prompt_index} in {run_dir.name}")
        return found

    @app.get("/files/{path:path}")
    def run_file(path: str, run: str | None = None) -> FileResponse:
        # Only images, only inside the run folder (no ../, no link out of it).
        run_dir = pick(run).run_dir.resolve()
        target = (run_dir / path).resolve()
        if (not target.is_relative_to(run_dir) or target.suffix.lower() not in queries.IMAGE_SUFFIXES
                or not target.is_file()):
            raise HTTPException(404, "no such image in the run folder")
        return FileResponse(target)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
