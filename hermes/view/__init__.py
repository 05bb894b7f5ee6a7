"""`hermes-batch view RUN`: a run in the browser, served on 127.0.0.1 by the product itself.

    index.py     the viewer's DuckDB index over the run's journal (view.duckdb), kept up to date
    queries.py   the summary, a page of entries under filters, one entry taken apart
    app.py       the FastAPI app: the page (static/, no build step, nothing fetched from elsewhere),
                 its JSON API and the run folder's images
    server.py    the command: the app under uvicorn on loopback

A top layer beside hermes/run and hermes/api: it reads hermes/run and hermes/data, nothing imports it
but flows/.
"""
