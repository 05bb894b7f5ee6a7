"""`hermes-batch tasks list PATH` and `hermes-batch verify PATH`: Harbor task folders before and
without a model (hermes.data.harbor, hermes.run.verify)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from pydantic import ValidationError

from flows.run_command import add_model_flags, validation_text
from hermes.sandbox.base import SandboxSettings


def tasks_main(argv: Sequence[str]) -> int:
    from hermes.data.harbor import describe_tasks
    from hermes.sandbox import get_backend

    p = argparse.ArgumentParser(prog="hermes-batch tasks", description="Harbor task folders, before anything runs.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="the tasks found, what each needs, and any problem")
    ls.add_argument("path")
    add_model_flags(ls, SandboxSettings, prefix="sandbox_")
    a = p.parse_args(argv)
    sandbox = {k.removeprefix("sandbox_"): v for k, v in vars(a).items() if k.startswith("sandbox_") and v is not None}
    backend = get_backend(SandboxSettings(**sandbox))
    lines, bad = describe_tasks(a.path, backend.build_problems)
    print("\n".join(lines))
    return 1 if bad else 0


def verify_main(argv: Sequence[str]) -> int:
    from hermes.run.verify import format_results, verify
    from hermes.settings import RunSettings

    p = argparse.ArgumentParser(prog="hermes-batch verify",
                                description="Run each task's solution/solve.sh, then its tests; name the tasks whose "
                                            "oracle fails.")
    p.add_argument("path")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--max_samples", type=int, default=None)
    p.add_argument("--check_timeout", type=float, default=None)
    p.add_argument("--prompt_timeout", type=float, default=None)
    p.add_argument("--build_concurrency", type=int, default=None)
    p.add_argument("--task_max_cpus", type=float, default=None)
    p.add_argument("--task_max_memory", default=None)
    p.add_argument("--task_max_timeout", type=float, default=None)
    p.add_argument("--run_name", default="oracle", help="labels its sandboxes (verify-RUN_NAME)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_model_flags(p, SandboxSettings, prefix="sandbox_")
    a = p.parse_args(argv)
    sandbox = {k.removeprefix("sandbox_"): v for k, v in vars(a).items() if k.startswith("sandbox_") and v is not None}
    own = {k: v for k in ("num_workers", "max_samples", "check_timeout", "prompt_timeout", "build_concurrency",
                          "task_max_cpus", "task_max_memory", "task_max_timeout")
           if (v := getattr(a, k)) is not None}
    try:
        settings = RunSettings(dataset_file=a.path, batch_size=1, run_name=a.run_name,
                               sandbox=SandboxSettings(**sandbox),
                               **own)
        results, problems, asked = verify(settings)
    except ValidationError as e:
        print(f"error: {validation_text(e)}", file=sys.stderr)
        return 2
    except ValueError as e:  # DatasetError: not a folder of tasks
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"results": [r.model_dump() for r in results], "problems": problems, "limits": asked},
                         indent=2))
    else:
        print(asked)
        print(format_results(results, problems))
    return 0 if results and all(r.passed for r in results) and not problems else 1
