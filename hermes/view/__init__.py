"""`hermes-batch view RUN`: a run in the browser, served on 127.0.0.1 by the product itself.

    index.py     the viewer's DuckDB index over the run's journal (view.duckdb), kept up to date
    queries.py   the summary, a page of entries under filters, one entry taken apart
    tasks.py     the tasks page (one row per task, grouped in DuckDB) and two runs' tasks joined
    align.py     attempts as steps, aligned into rows (Needleman-Wunsch), the first divergence
    compare.py   the compare view's columns: the compared lines read, their steps aligned
    app.py       the FastAPI app: the page (static/: app.js, compare.js; no build step, nothing fetched from elsewhere),
                 its JSON API and the run folder's images
    server.py    the command: the app under uvicorn on loopback (one run, or two side by side)

A top layer beside hermes/run and hermes/api: it reads hermes/run and hermes/data, nothing imports it
but flows/.
"""
