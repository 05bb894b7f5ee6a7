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

from hermes.view import queries
from hermes.view.index import ViewIndex

STATIC = Path(__file__).resolve().parent / "static"
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'"


def create_app(run_dir: Path, index: ViewIndex | None = None) -> FastAPI:
    run_dir = Path(run_dir).resolve()
    index = index or ViewIndex(run_dir)
    app = FastAPI(title="hermes-batch view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.index = index

    @app.middleware("http")
    async def headers(request: Request, call_next):
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"  # a run in progress: a reload shows new entries
        return response

    page = STATIC / "index.html"

    @app.get("/", include_in_schema=False)
    @app.get("/entry/{prompt_index}", include_in_schema=False)
    def index_page() -> FileResponse:
        return FileResponse(page, media_type="text/html")

    @app.get("/api/summary")
    def summary() -> dict:
        return queries.summary(index)

    @app.get("/api/entries")
    def entries(filters: Annotated[queries.Filters, Depends()]) -> dict:
        return queries.entries(index, filters)

    @app.get("/api/entry/{prompt_index}")
    def entry(prompt_index: int, pos: int | None = None) -> dict:
        found = queries.entry(index, prompt_index, pos)
        if found is None:
            raise HTTPException(404, f"no entry with prompt_index {prompt_index} in {run_dir.name}")
        return found

    @app.get("/files/{path:path}")
    def run_file(path: str) -> FileResponse:
        # Only images, only inside the run folder (no ../, no link out of it).
        target = (run_dir / path).resolve()
        if (not target.is_relative_to(run_dir) or target.suffix.lower() not in queries.IMAGE_SUFFIXES
                or not target.is_file()):
            raise HTTPException(404, "no such image in the run folder")
        return FileResponse(target)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
