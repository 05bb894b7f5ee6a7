"""Settings of the API server: API_SERVER_* environment variables over a config file.

The config file is the reference's config.yaml (default $HERMES_HOME/config.yaml, else the
file named by API_SERVER_CONFIG or `--config`); its `gateway.api_server:` section (or
`gateway.platforms.api_server:`, `platforms.api_server:`) holds the same keys as the
variables, lower-cased without the prefix. The environment wins over the file.

The upstream model comes from HERMES_BASE_URL and HERMES_MODEL (or `base_url` / `model` in
the section); its key from HERMES_API_KEY, OPENROUTER_API_KEY or OPENAI_API_KEY, never from
a file that might be committed.
"""
from __future__ import annotations

import contextvars
import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, InitSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from hermes.errors import HermesError
from hermes.environment import read
from hermes.sandbox.base import BackendName, SandboxSettings

SECTIONS = (("gateway", "api_server"), ("gateway", "platforms", "api_server"), ("platforms", "api_server"))

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("api_config_file", default=None)


def hermes_home() -> Path:
    return read("home")


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="API_SERVER_", extra="ignore", populate_by_name=True,
                                      protected_namespaces=())

    enabled: bool = Field(False, description="read for compatibility: `hermes-batch serve` always serves")
    host: str = Field("127.0.0.1", description="bind address; anything but loopback needs a key")
    port: int = Field(8642, ge=0, le=65535)
    key: SecretStr | None = Field(None, description="Bearer key clients must send")
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description="browser origins allowed (comma list)")
    model_name: str = Field("hermes-agent", description="model id advertised on /v1/models")

    store_path: Path = Field(default_factory=lambda: hermes_home() / "api_server" / "responses.sqlite3",
                             description="SQLite file of stored responses")
    max_stored_responses: int = Field(100, ge=1, description="stored responses kept (least recently used go first)")
    max_concurrent_runs: int = Field(4, ge=1, description="agent runs in flight; more answer 429")
    retry_after: int = Field(5, ge=1, description="Retry-After seconds sent with 429")
    keep_alive: float = Field(75.0, gt=0, description="seconds an idle client connection is kept open "
                              "(always more than retry_after: a client waiting that long reuses its connection)")
    tool_progress: bool = Field(True, description="hermes.tool.progress events in streamed chat completions "
                                "(per request: stream_options.include_tool_progress)")
    max_request_bytes: int = Field(16 << 20, ge=1024, description="largest request body accepted")
    idempotency_ttl: float = Field(300.0, gt=0, description="seconds an Idempotency-Key answer is replayed")
    run_events_ttl: float = Field(300.0, gt=0, description="seconds unread run events are buffered")
    run_retention: float = Field(600.0, gt=0, description="seconds a finished run stays pollable")

    max_turns: int = Field(10, ge=1, description="model calls per request")
    toolsets: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["terminal", "file"])
    sandbox: BackendName = Field("docker", description="'local' runs model commands on this host: explicit opt-in only")
    sandbox_image: str = Field(default_factory=SandboxSettings.model_fields["image"].default_factory)
    sandbox_network: bool = False
    command_timeout: float = Field(60.0, gt=0)

    upstream_base_url: str = Field("https://openrouter.ai/api/v1",
                                   validation_alias=AliasChoices("HERMES_BASE_URL", "upstream_base_url"))
    upstream_model: str = Field("anthropic/claude-sonnet-4.6",
                                validation_alias=AliasChoices("HERMES_MODEL", "upstream_model"))

    upstream_max_retries: int = Field(6, ge=0, description="retries of a failed model call (429, 5xx, time-outs)")

    jobs_work_pool: str = Field("hermes", description="Prefect work pool job deployments go to (the pool of prefect.yaml)")

    @field_validator("cors_origins", "toolsets", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        # Order is priority: explicit arguments, then the environment, then the config file.
        return init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=config_section())

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any) -> "ApiSettings":
        path = Path(config_file) if config_file else (Path(os.environ["API_SERVER_CONFIG"])
                                                       if os.environ.get("API_SERVER_CONFIG") else None)
        token = _config_file.set(path)
        try:
            return cls(**overrides)
        finally:
            _config_file.reset(token)

    def keep_alive_seconds(self) -> float:
        # A client told to wait Retry-After seconds comes back on its idle connection; had the
        # server closed it at that very moment, the retry would fail with a read error.
        return max(self.keep_alive, self.retry_after + 5.0)

    def sandbox_settings(self) -> SandboxSettings:
        return SandboxSettings(backend=self.sandbox, image=self.sandbox_image, network=self.sandbox_network,
                               command_timeout=self.command_timeout)

    def key_value(self) -> str | None:
        return self.key.get_secret_value() if self.key and self.key.get_secret_value() else None


def config_section(path: Path | None = None) -> dict[str, Any]:
    """The api_server section of the config file ({} when there is none)."""
    from hermes.agent.single_run import load_config  # the reference's config.yaml reader, shared with `chat`

    data = load_config(path or _config_file.get())
    for keys in SECTIONS:
        node: Any = data
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            # `model` and `base_url` name the upstream in the file; as environment names they
            # would be far too generic, so they are translated here rather than aliased.
            renamed = {"model": "upstream_model", "base_url": "upstream_base_url"}
            return {renamed.get(k, k): v for k, v in node.items()}
    return {}


class UnsafeBind(HermesError, ValueError):
    """A non-loopback bind without a key: everyone who can reach the port could run commands."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name might resolve anywhere: treat it as exposed


def check_bind(host: str, key: str | None) -> None:
    if not key and not is_loopback(host):
        raise UnsafeBind(f"refusing to serve on {host} without API_SERVER_KEY: the API runs terminal commands; "
                         "set a key or bind 127.0.0.1")
