"""`hermes-batch serve`: the OpenAI-compatible API server over the agent (SPEC §3).

Settings come from API_SERVER_* variables over the config file (see hermes/api/server_settings.py);
the flags below win over both. Jobs (/api/jobs) are Prefect deployments on the server named
by PREFECT_API_URL; without one the jobs endpoints answer 503 and everything else works.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hermes-batch serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=None, help="bind address (API_SERVER_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (API_SERVER_PORT, default 8642)")
    p.add_argument("--config", default=None, help="config.yaml with a gateway.api_server section "
                   "(API_SERVER_CONFIG, default $HERMES_HOME/config.yaml)")
    p.add_argument("--no-jobs", action="store_true", help="serve without /api/jobs")
    p.add_argument("--jobs-worker", action="store_true",
                   help="also start a Prefect worker for the jobs' work pool, stopped with the server")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def prefect_api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from pydantic import ValidationError

    from hermes.api import ApiSettings, create_app
    from hermes.api.server_settings import UnsafeBind, check_bind

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = ApiSettings.load(args.config, **overrides)
        check_bind(settings.host, settings.key_value())
    except (UnsafeBind, ValidationError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.getLogger("hermes").setLevel(logging.INFO)
    jobs = None
    if not args.no_jobs:
        if prefect_api_url():
            from flows.scheduled_jobs import PrefectJobs

            jobs = PrefectJobs(settings.jobs_work_pool, start_worker=args.jobs_worker)
        else:
            print("note: PREFECT_API_URL is not set: /api/jobs answers 503 (jobs need a Prefect server)",
                  file=sys.stderr)
    if settings.sandbox == "local":
        print("WARNING: API_SERVER_SANDBOX=local: model-written commands run on THIS host", file=sys.stderr)
    import uvicorn

    from hermes.api.server import uvicorn_config

    app = create_app(settings, jobs=jobs)
    print(f"[API Server] API server listening on http://{settings.host}:{settings.port}", flush=True)
    uvicorn.Server(uvicorn_config(app, host=settings.host, port=settings.port, log_level=args.log_level)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
