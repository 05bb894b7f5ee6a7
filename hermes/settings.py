"""Run settings: every flag of the reference batch_runner.py, as one validated model.

The same model is the Prefect deployment's parameter form, so each field carries a description.
The API key is deliberately not a field: flow parameters are stored in Prefect's database.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hermes.environment import API_KEY_VARIABLES, DASK_ADDRESS_PATTERN, read
from hermes.netpolicy import ALLOW_ENV, parse_hosts
from hermes.data.distributions import DISTRIBUTIONS
from hermes.sandbox.base import SIZE_PATTERN, SandboxSettings
from hermes.tools import toolset_settings_model

#: every registered toolset's settings, one field per toolset (hermes/tools/registry.py)
ToolsetSettings = toolset_settings_model()

ToolCallParser = Literal["auto", "native", "hermes", "json", "llama", "mistral", "qwen3_coder", "pythonic", "none"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
API_KEY_ENV_VARS = API_KEY_VARIABLES
DASK_ADDRESS_ENV = "HERMES_DASK_ADDRESS"



class AgentSettings(BaseModel):
    """How one agent run talks to its model and where its tools run: shared by batch runs and chat."""

    # A misspelt key (max_sample) is refused, naming it, instead of silently running with the default.
    model_config = ConfigDict(extra="forbid")

    model: str = Field("anthropic/claude-sonnet-4.6", description="model name sent to the endpoint")
    base_url: str = Field("https://openrouter.ai/api/v1", description="any OpenAI-compatible endpoint")
    max_turns: int = Field(10, gt=0, description="most model calls per prompt")
    max_tokens: int | None = Field(None, gt=0, description="max tokens per response (model default if unset)")
    max_retries: int = Field(6, ge=0, description="retries of a failed model call (429, 5xx, time-outs), with backoff honouring Retry-After")
    providers_allowed: list[str] | None = Field(None, description="OpenRouter providers to allow")
    providers_ignored: list[str] | None = Field(None, description="OpenRouter providers to ignore")
    providers_order: list[str] | None = Field(None, description="OpenRouter providers to try in order")
    provider_sort: Literal["price", "throughput", "latency"] | None = Field(None, description="OpenRouter provider sort")
    reasoning_effort: ReasoningEffort | None = Field(None, description="reasoning effort asked of the model")
    reasoning_disabled: bool = Field(False, description="turn reasoning off (wins over reasoning_effort)")
    ephemeral_system_prompt: str | None = Field(None, description="used while running, never saved into trajectories")
    prefill_messages_file: str | None = Field(None, description="JSON array of few-shot messages put before the prompt, not saved")
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings, description="how per-prompt sandboxes are made")
    tools: ToolsetSettings = Field(default_factory=ToolsetSettings, description="settings of each toolset (backends, endpoints, limits)")
    web_allow_hosts: list[str] = Field(
        default_factory=lambda: parse_hosts(read("web_allow_hosts")),
        description="hosts the web and browser tools may reach despite the private-address rules: host names, "
                    f"addresses or CIDRs, comma separated (default: ${ALLOW_ENV})")
    # -- tool calls written as text (hermes.model.textcalls; README "Running against open models") --
    tool_call_parser: ToolCallParser = Field(
        "auto", description="how tool calls are read from the model's answers: auto (native tool_calls, else calls "
        "written as text in any known format, unmarked JSON only naming an offered tool), native / none (native "
        "tool_calls only), or one text format: hermes, json, llama, mistral, qwen3_coder, pythonic")

    # --- open models: endpoint check, breaker, sampling, logprobs, context (issue 44; hermes/model/) ---
    check_endpoint: bool = Field(True, description="before a run fans out, one request checks the endpoint (reachable, "
                                 "the key accepted, the model known); a run whose endpoint cannot serve stops at once")
    breaker_seconds: float = Field(60.0, gt=0, description="a run stops (its prompts not done stay owed) when every "
                                   "model request failed for one endpoint-wide reason (unreachable, 401, 403, 404, "
                                   "5xx) for this many seconds with no success")
    request_timeout: float = Field(600.0, gt=0, description="seconds one model request may wait for its answer "
                                   "(each connect and each read; a time-out is retried like a 5xx): raise it for a "
                                   "slow server, e.g. llama.cpp on a CPU reading its first long prompt")
    temperature: float | None = Field(None, ge=0, description="sampling temperature (endpoint default if unset)")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling (endpoint default if unset)")
    top_k: int | None = Field(None, description="top-k sampling, sent in the extra body (vLLM, SGLang, llama.cpp, Ollama)")
    min_p: float | None = Field(None, ge=0, le=1, description="min-p sampling, sent in the extra body (vLLM, SGLang, llama.cpp)")
    stop: list[str] | None = Field(None, description="stop sequences, comma separated")
    extra_body: dict[str, Any] | None = Field(None, description="JSON object merged into every request body "
                                              "(chat_template_kwargs, repetition_penalty...): its keys win")
    sampling_seed: int | None = Field(None, description="each attempt of each row sends its own seed derived from this, "
                                      "its key, its attempt and turn: reruns repeat where the server honours seeds, "
                                      "and --attempts K differ")
    logprobs: bool = Field(False, description="ask for the logprobs of the assistant's tokens and keep them per turn "
                           "in the batch files (hermes-batch export --format rl)")
    context_length: int | None = Field(None, gt=0, description="the model's context in tokens (default: what the "
                                       "endpoint's /models says, if it does): tool results are cut to fit")

    @field_validator("web_allow_hosts", mode="before")
    @classmethod
    def _hosts(cls, v):
        return parse_hosts(v)

    @field_validator("extra_body", mode="before")
    @classmethod
    def _json_object(cls, v):
        if isinstance(v, str):  # the command line's --extra_body '{"repetition_penalty": 1.1}'
            import json
            try:
                v = json.loads(v) if v.strip() else None
            except ValueError as e:
                raise ValueError(f"not a JSON object: {e}") from None
        if v is not None and not isinstance(v, dict):
            raise ValueError("expected a JSON object")
        return v

    @field_validator("providers_allowed", "providers_ignored", "providers_order", "stop", mode="before")
    @classmethod
    def _comma_list(cls, v):
        if isinstance(v, str):
            v = [p.strip() for p in v.split(",") if p.strip()]
        return v or None


def _own_fields_first(schema: dict) -> None:
    """Show a run's own fields (dataset, batch size, run name) before the inherited model fields in forms."""
    own = [k for k in RunSettings.__annotations__ if k in schema.get("properties", {})]
    # The registry's names as the schema's choices: a dropdown in the form, refused at flow-run creation.
    schema["properties"]["distribution"]["enum"] = list(DISTRIBUTIONS)
    props = schema["properties"]
    schema["properties"] = {**{k: props[k] for k in own}, **{k: v for k, v in props.items() if k not in own}}


class RunSettings(AgentSettings):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_own_fields_first)

    dataset_file: str = Field(description="JSONL dataset, one object a line with a string 'prompt'; or a folder of "
                              "Harbor task folders (instruction.md, task.toml, environment/, tests/), or one of them")
    batch_size: int = Field(gt=0, description="prompts per batch: one batch_N.jsonl and one unit of progress")
    run_name: str = Field(description="names the output folder data/RUN_NAME/ and is the resume key",
                          json_schema_extra={"pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"})  # = _safe_run_name
    distribution: str = Field("default", description="toolset distribution to sample from")
    num_workers: int = Field(4, gt=0, description="prompts in flight across the whole run; with dask_address: "
                                                  "prompts in flight in EACH Dask worker process (a cluster of W "
                                                  "workers runs up to W x num_workers at once)")
    dask_address: str | None = Field(
        default_factory=lambda: read("dask_address"),
        description="Dask scheduler address (tcp://host:8786): batches run on that cluster's workers, each "
                    "against its own machine's Docker engine; output_dir must be shared storage mounted at the "
                    f"same path everywhere. Unset: threads of this process (default: ${DASK_ADDRESS_ENV})",
        json_schema_extra={"pattern": f"^({DASK_ADDRESS_PATTERN})?$"})
    worker_processes: int = Field(
        1, gt=0, description="processes on this machine that run the prompts, --num_workers shared among them "
                             "(a Dask LocalCluster): past one core's worth of work for one interpreter; 1: threads "
                             "of the run's own process; ignored with dask_address")
    # -- where the run's Dask workers come from (--cluster; hermes/run/clusters.py, hermes/run/slurm.py)
    cluster: str = Field("local", description="where batches run: local (this process, --worker_processes, or the "
                         "cluster at --dask_address) or slurm (Dask workers submitted as Slurm jobs, scaled to the "
                         "batches owed, cancelled at the run's end); names from hermes/run/clusters.py, checked "
                         "as the run starts; output_dir must be shared storage for slurm")
    slurm_partition: str | None = Field(None, description="Slurm partition of the worker jobs (sbatch -p); unset: the default one")
    slurm_account: str | None = Field(None, description="Slurm account charged for the worker jobs (sbatch -A)")
    slurm_walltime: str = Field("01:00:00", description="time limit of each worker job (sbatch -t): a job killed at "
                                "it has its batch rerun by another job; also bounds what a SIGKILLed run leaves")
    slurm_cores: int = Field(4, gt=0, description="cores of each worker job: one Dask worker process running that "
                             "many batches at once, --num_workers prompts in flight in it")
    slurm_memory: str = Field("8GB", description="memory of each worker job (sbatch --mem), e.g. 8GB")
    slurm_max_jobs: int = Field(4, gt=0, description="most worker jobs at once; jobs are added while batches wait "
                                "and given back when none are owed")
    slurm_python: str | None = Field(None, description="the Python a worker job runs (hermes-batch installed, on the "
                                     "nodes); unset: this process's own")
    slurm_scheduler_host: str | None = Field(None, description="address the run's Dask scheduler listens on, "
                                             "reachable from the nodes; unset: this machine's outward address")
    slurm_job_directives: str | None = Field(None, description="more sbatch options for each worker job, space "
                                             "separated (e.g. '--qos=long --constraint=docker')")
    resume: bool = Field(False, description="continue an existing run")
    verbose: bool = Field(False, description="detailed logs")
    max_samples: int | None = Field(None, gt=0, description="only the first N rows")
    log_prefix_chars: int = Field(100, ge=0, description="characters of a prompt shown in log previews")
    seed: int = Field(0, description="seed of the toolset sampler: the same seed draws the same toolsets per prompt")
    keep_unreasoned: bool = Field(False, description="keep samples none of whose turns carry reasoning (discarded by default)")
    prompt_retries: int = Field(3, ge=0, description="times a prompt that failed for a transient reason (429 or 5xx after the client's retries, a time-out, a dropped connection, an engine time-out) is put back in the queue within the run, with backoff, before its failure is recorded")
    max_attempts: int | None = Field(None, gt=0, description="give up on a prompt after this many failed attempts (retried on every resume if unset)")
    inline_batches: bool = Field(False, description="on the Prefect engine, run this process's batches without a task "
                                 "run each (the UI then shows plan, merge and report only): for huge runs of tiny, "
                                 "fast batches, where a task run's cost shows (bench/FANOUT_REPORT.md)")
    batch_retries: int = Field(2, ge=0, description="on the Prefect engine, times a batch that failed as a whole "
                               "for a transient reason (an exception, not its prompts' own failures) is run again "
                               "as a task retry, skipping the prompts it already finished")
    max_failed_share: float = Field(0.5, ge=0, le=1, description="the run ends Failed (outputs still written) when more than this share of its prompts failed: 0 fails on any failed prompt, 1 never fails")
    prompt_timeout: float | None = Field(3600.0, gt=0, description="wall-clock seconds one prompt may take, model "
                                         "calls and tools together (setup and check included): past it the prompt "
                                         "ends failed and its sandbox is removed; unset: no limit")
    setup_timeout: float = Field(300.0, gt=0, description="seconds a row's setup (its files and commands) may take "
                                 "before the agent starts; past it the prompt fails")
    check_timeout: float = Field(300.0, gt=0, description="seconds a row's check command may take after the agent "
                                 "finished; past it the check counts as failed")
    require_check_pass: bool = Field(False, description="merge keeps only entries whose row check passed (rejection "
                                     "sampling); the others are counted in statistics.json, not written")
    skip_bad_lines: bool = Field(False, description="skip dataset lines (or task folders) that fail validation instead of refusing to run")
    attempts: int = Field(1, gt=0, description="times each row (or task) is run, each attempt a prompt of its own with its "
                          "own sandbox and journal entry; statistics.json gives pass@k for k = 1 .. attempts")
    # Attempt policies (hermes.run.attempt_policy): which of the --attempts K a task really runs,
    # decided from the verdicts in the journal as they land
    attempt_policy: Literal["all", "first_pass", "informative"] = Field(
        "all", description="all: every task runs its --attempts K; first_pass: attempts one after another, "
        "stopping at the first whose check passed (SFT by rejection sampling); informative: --min_attempts first, "
        "stop if all passed, else go on up to K until the group holds a pass and a fail (RL groups with signal)")
    attempt_parallelism: int = Field(1, gt=0, description="under first_pass and informative, attempts of one task "
                                     "in flight at once; siblings still running when one passes are stopped")
    min_attempts: int = Field(2, gt=0, description="under informative, attempts every task runs before its group "
                              "is judged")
    attempt_budget: int | None = Field(None, gt=0, description="most attempts the whole run starts (resumes "
                                       "included); they go first to tasks with no pass and the fewest attempts")
    build_concurrency: int = Field(2, gt=0, description="image builds (a task's environment/, a row's `build`) in "
                                   "flight at once; each image is built once per content hash")
    verifier_network: bool = Field(False, description="give a task's verifier (tests/test.sh) the network even when "
                                   "the agent has none; off: a verifier that needs it fails its check, saying so")
    # Task folders' resources (hermes.run.task_limits): a task gets what its task.toml asks; these
    # are the user's ceilings over it, none unless set.
    task_max_cpus: float | None = Field(None, gt=0, description="most CPUs a task folder's sandbox gets, whatever "
                                        "its task.toml asks (unset: what it asks, up to what the engine has)")
    task_max_memory: str | None = Field(None, pattern=SIZE_PATTERN, description="most memory a task folder's "
                                        "sandbox gets, like 2g (unset: what its task.toml asks, up to the engine's)")
    task_max_timeout: float | None = Field(None, gt=0, description="most seconds a task folder's agent, and its "
                                           "verifier, each get (unset: its task.toml's timeout_sec)")
    output_dir: str = Field("data", description="parent folder of run folders")
    # -- tool use (hermes.run.tool_use): a run whose agents never acted does not pass for a good one --
    max_no_tool_use_share: float = Field(
        0.9, ge=0, le=1, description="the run ends Failed (outputs still written) when more than this share of the "
        "prompts offered tools never called one (a server without a tool parser, a model that does not call "
        "tools); the default 0.9 fails a run where nearly every agent only talked. Past half, the summary, the "
        "Prefect report's verdict and the log warn loudly whatever this is; 1: warn only (a question-answering "
        "dataset that merely offers tools)")

    # --- publishing while the run goes (issue 48; hermes/run/publish.py). No credentials here: the
    # URL is refused when it carries any; they come from the worker's environment.
    publish: str | None = Field(None, description="publish the final entries as Parquet shards while the run goes: "
                                "a folder, s3://bucket/prefix, hf://datasets/org/name or any fsspec URL "
                                "(credentials from the environment only, never in the URL)")
    publish_format: str = Field("openai", description="row shape of the shards: openai (the columns of `export "
                                "--format parquet`), sharegpt (the trajectory's fields), or a registered one (rl)")
    publish_only: Literal["passed", "completed"] | None = Field(
        None, description="publish only entries whose row check passed, or those not stopped at max_turns")
    publish_every: str = Field("1000,60s", description="a shard every N entries and/or every Ns seconds "
                               "(e.g. 1000, 30s, 1000,30s): an entry is published within that long of its "
                               "batch landing; small shards are compacted at the end",
                               json_schema_extra={"pattern": r"^\s*\d+(\.\d+)?s?\s*(,\s*\d+(\.\d+)?s?\s*)?$"})

    publish_compact: bool = Field(True, description="compact small shards at an invocation's end (a reader "
                                  "loading in those seconds fails and lists again, never a wrong dataset); false: "
                                  "shards stay as published, no reader ever meets a compaction (`hermes-batch "
                                  "publish RUN URL` compacts later)")

    @field_validator("publish")
    @classmethod
    def _publish_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(v.strip())
        if parts.scheme and (parts.username or parts.password):
            raise ValueError("the URL carries credentials: give them through the environment "
                             "(AWS_ACCESS_KEY_ID, HF_TOKEN, ...), never in the URL, which is stored with the run")
        return v.strip()

    @field_validator("run_name")
    @classmethod
    def _safe_run_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
            raise ValueError("run_name must be letters, digits, '.', '_' or '-' (it names a folder)")
        return v

    @field_validator("dask_address", mode="before")
    @classmethod
    def _dask_address(cls, v):
        # An empty value (a form's blank field) means the environment's, as when the key is missing:
        # the deployment's job variable HERMES_DASK_ADDRESS is the switch.
        if not (v is None or isinstance(v, str)):
            return v  # not text: pydantic's own type check names the field
        v = (v or read("dask_address") or "").strip()
        if v and not re.fullmatch(DASK_ADDRESS_PATTERN, v):
            raise ValueError(f"expected a Dask scheduler address such as tcp://host:8786, not {v!r}")
        return v or None

    @field_validator("distribution")
    @classmethod
    def _known_distribution(cls, v: str) -> str:
        if v not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution '{v}'; choose one of: {', '.join(DISTRIBUTIONS)}")
        return v
