"""What a finished run shows in the Prefect UI, and whether it counts as a success.

Artifacts (keys are derived from the run name, so each run keeps its own history of versions):

    statistics-<run>   table: the run's statistics (counts, failure share, time, usage)
    tools-<run>        table: tool calls in the run's trajectories
    failed-<run>       table: every prompt that failed, with its reason (only when some did)
    summary-<run>      markdown: outcome, output paths, how to retry

The progress artifact (progress-<run>) is kept by tasks/progress.py while the run runs.
"""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE

from hermes.data.run_paths import BATCH_GLOB, RunPaths
from hermes.run.merge import failed_prompts
from hermes.run.summary import commands, summary_lines
from hermes.data.outcome import TooManyFailedPrompts, check_failed_share, failed_share  # noqa: F401  (re-exported)


def artifact_key(run_name: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return "".join(c if c.isalnum() else "-" for c in str(run_name).lower())


@task(name="publish-report", cache_policy=NONE)
def publish(run_path: Path, stats: dict, max_failed_share: float | None = None) -> None:
    """Statistics, tool and failure tables, and a markdown summary with the output paths."""
    run_path = Path(run_path).resolve()
    name = str(stats["run_name"])
    key = artifact_key(name)
    share = failed_share(stats)

    scalars = [{"statistic": k, "value": v} for k, v in stats.items() if not isinstance(v, dict)]
    scalars.append({"statistic": "failed_share", "value": round(share, 4)})
    if max_failed_share is not None:
        scalars.append({"statistic": "max_failed_share", "value": max_failed_share})
    for k, v in (stats.get("reasoning_statistics") or {}).items():
        scalars.append({"statistic": f"reasoning.{k}", "value": v})
    for k, v in (stats.get("usage") or {}).items():
        scalars.append({"statistic": f"usage.{k}", "value": v})
    for kind, counts in (stats.get("aux_usage") or {}).items():  # tools' own model calls (vision, image_gen)
        scalars += [{"statistic": f"aux_usage.{kind}.{k}", "value": v} for k, v in counts.items()]
    for k, v in (stats.get("tool_use") or {}).items():  # calls by how they arrived, prompts that never acted
        scalars += ([{"statistic": f"tool_use.calls.{f}", "value": n} for f, n in v.items()] if isinstance(v, dict)
                    else [{"statistic": f"tool_use.{k}", "value": v}])
    create_table_artifact(scalars, key=f"statistics-{key}", description=f"Statistics of run '{name}' (statistics.json)")

    # Always published, so every run has the artifacts the docs list; a run without tool calls says so.
    tools = [{"tool": t, **v} for t, v in (stats.get("tool_statistics") or {}).items()]
    create_table_artifact(tools or [{"tool": "(no tool calls)", "count": 0}], key=f"tools-{key}",
                          description=f"Tool calls in the trajectories of run '{name}'")

    failed = failed_prompts(run_path) if stats.get("prompts_failed") else []
    if failed:
        more = stats["prompts_failed"] - len(failed)
        create_table_artifact(
            failed, key=f"failed-{key}",
            description=f"Failed prompts of run '{name}' with their reasons; they run again on resume"
                        + (f" ({more} more in the batch files)" if more > 0 else ""))

    create_markdown_artifact(_summary(run_path, stats, share, max_failed_share), key=f"summary-{key}",
                             description=f"Summary of run '{name}'")


def _summary(run_path: Path, stats: dict, share: float, max_share: float | None) -> str:
    name = stats["run_name"]
    paths = RunPaths(run_path)
    failed_too_many = max_share is not None and share > max_share
    verdict = (f"**Failed**: {stats['prompts_failed']} of {stats['total_prompts']} prompts failed "
               f"({share:.0%}, more than the allowed {max_share:.0%}). The outputs below were still written."
               if failed_too_many else
               f"**Done**: {stats['trajectories_written']} trajectories from {stats['total_prompts']} prompts.")
    never_acted = (stats.get("tool_use") or {}).get("warning")
    if never_acted:  # the agents did not act: never shown as a plain "Done" (hermes.run.tool_use)
        verdict += f"\n\n> **Warning: the agents never acted.** {never_acted}"
    cmd = commands(str(name), paths.root.parent)
    lines = [
        f"# Run `{name}`", "", verdict, "",
        # the terminal's end-of-run summary, word for word (hermes.run.summary)
        "```text", *summary_lines(stats), "```", "",
        "## Look at it", "",
        f"- in your browser: `{cmd['view']}` serves the run on http://127.0.0.1:8765/ (summary, entries under "
        "filters, each conversation with its tool calls, images and reward; `/entry/<prompt_index>` links to one; "
        "`/tasks` lists each task's attempts and pass rate, `/compare?task=<key>` sets them side by side, aligned "
        "turn by turn; `hermes-batch view RUN_A RUN_B` compares two runs)",
        f"- for training: `{cmd['export']}` (or `--format sharegpt`, `--format parquet`; `--only passed|completed`)",
        "",
        "## Output", "",
        f"- trajectories: `{paths.trajectories}`",
        f"- statistics: `{paths.statistics}`",
        f"- checkpoint: `{paths.checkpoint}`",
        f"- batch files (the journal): `{paths.root / BATCH_GLOB}`",
        "",
        *_published(run_path),
        "## Prompts", "",
        "| outcome | prompts |", "|---|---|",
        f"| completed | {stats.get('prompts_completed', 0)} |",
        f"| partial (max_turns reached) | {stats.get('prompts_partial', 0)} |",
        f"| failed | {stats.get('prompts_failed', 0)} |",
        f"| discarded: no reasoning | {stats.get('discarded_no_reasoning', 0)} |",
        f"| dropped: hallucinated tool | {stats.get('dropped_hallucinated_tools', 0)} |",
        f"| **trajectories written** | **{stats.get('trajectories_written', 0)}** |",
        "",
        f"Model `{stats.get('model')}`, distribution `{stats.get('distribution')}`, "
        f"{stats.get('total_batches')} batch file(s), {stats.get('api_calls', 0)} model calls, "
        f"{stats.get('duration_seconds', 0)} s over all invocations.",
    ]
    reasons = stats.get("failure_reasons") or {}
    if reasons:
        lines += ["", "## Failures by kind", "", "| kind | prompts | example |", "|---|---|---|"]
        lines += [f"| {_cell(kind)} | {g['count']} | {_cell(g['example'])} |" for kind, g in reasons.items()]
        lines += ["", f"Each failed prompt is listed in the `failed-{artifact_key(name)}` artifact. "
                      "Failed prompts run again when the run is started with `resume: true` "
                      "(the same settings otherwise)."]
    return "\n".join(lines) + "\n"


def _published(run_path: Path) -> list[str]:
    """Where --publish put the run's shards, and how many entries they hold (hermes.run.publish)."""
    from hermes.run.publish import published

    lines = []
    for p in published(run_path):
        lines += [f"- [{p['url']}]({p['url']}): {p['entries']} entries in {p['shards']} shard(s), format "
                  f"`{p['format']}`{', only ' + p['only'] if p.get('only') else ''}; load with "
                  f"`datasets.load_dataset(\"parquet\", data_files=\"{p['data_files']}\")`"]
    return ["## Published", "", *lines, ""] if lines else []


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
