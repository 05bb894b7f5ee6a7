"""The HERMES_* environment variables hermes-batch reads: one model, each one documented and validated.

Tests and users set these while a process runs (monkeypatch.setenv, a subprocess's env, a Prefect
job variable), so nothing here is read at import or kept: every call reads os.environ anew.

    read("sandbox_image")   one variable, validated now; a bad value of another one does not fail it
    environment()           all of them, validated together (`hermes-batch env` lists them)

An empty value counts as unset, as it did for every reader. A field with more than one name
(the model key: HERMES_API_KEY, then OPENROUTER_API_KEY, then OPENAI_API_KEY) takes the first
that is set. Keys are SecretStr: read, never shown. A bad value raises EnvironmentInvalid, a
ValueError naming the variable: HERMES_PREFECT_SERVER='sometimes': expected background or ephemeral.

Other systems' variables stay theirs: PREFECT_* (Prefect), API_SERVER_* (hermes/api/server_settings.py),
SEARXNG_URL and the web tools' keys (hermes/tools/web/settings.py), FAL_KEY.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from hermes.errors import HermesError

#: a Dask scheduler address: tcp://host:8786, host:8786, tls://host:8786
DASK_ADDRESS_PATTERN = r"([a-z0-9+]+://)?[^\s/]+:\d+/?"
#: the model key's names, first set wins
API_KEY_VARIABLES = ("HERMES_API_KEY", "OPENROUTER_API_KEY", "OPENAI_API_KEY")


class EnvironmentInvalid(HermesError, ValueError):
    """An environment variable holds a value its reader cannot use; the message names it."""


def _comma_list(v: Any) -> Any:
    return [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v


def _prefect_server(v: Any) -> Any:
    if isinstance(v, str):
        v = v.strip().lower()
        if v not in ("background", "ephemeral"):
            raise ValueError("expected background or ephemeral")
    return v


def _dask_address(v: Any) -> Any:
    if isinstance(v, str):
        v = v.strip()
        if v and not re.fullmatch(DASK_ADDRESS_PATTERN, v):
            raise ValueError(f"expected a Dask scheduler address such as tcp://host:8786, not {v!r}")
        return v or None
    return v


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_list)]


class _Variables(BaseSettings):
    # extra: the rest of the environment is not ours; env_ignore_empty: VAR= means unset
    model_config = SettingsConfigDict(env_ignore_empty=True, extra="ignore")


class Environment(_Variables):
    """Every HERMES_* variable; a field's validation_alias is its variable's name."""

    # -- the model endpoint
    api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices(*API_KEY_VARIABLES),
        description="the model endpoint's API key when --api_key is not given (then OPENROUTER_API_KEY, "
                    "OPENAI_API_KEY); never stored in Prefect. Unset: 'no-key', which local servers accept")
    base_url: str = Field(
        "https://openrouter.ai/api/v1", validation_alias="HERMES_BASE_URL",
        description="the API server's and agent-prompt jobs' upstream model endpoint (over the config file's "
                    "base_url; batch runs take --base_url)")
    model: str = Field(
        "anthropic/claude-sonnet-4.6", validation_alias="HERMES_MODEL",
        description="the API server's and agent-prompt jobs' upstream model (over the config file's model)")
    home: Path = Field(
        default_factory=lambda: Path.home() / ".hermes", validation_alias="HERMES_HOME",
        description="folder of config.yaml (chat, the API server) and the API server's stored responses "
                    "(default ~/.hermes)")
    # -- how a run is carried out
    engine: Literal["prefect", "direct"] = Field(
        "prefect", validation_alias="HERMES_ENGINE",
        description="default of `hermes-batch run --engine`: prefect (a flow run) or direct (no Prefect)")
    prefect_server: Annotated[Literal["background", "ephemeral"], BeforeValidator(_prefect_server)] = Field(
        "background", validation_alias="HERMES_PREFECT_SERVER",
        description="without PREFECT_API_URL: background (a local Prefect server kept running and reused) or "
                    "ephemeral (Prefect's embedded server, booted for each run)")
    prefect_server_timeout: float = Field(
        120.0, gt=0,
        validation_alias=AliasChoices("HERMES_PREFECT_SERVER_TIMEOUT", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"),
        description="seconds a fresh background Prefect server may take to answer before the run falls back "
                    "to the ephemeral one (then PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
    dask_address: Annotated[str | None, BeforeValidator(_dask_address)] = Field(
        None, validation_alias="HERMES_DASK_ADDRESS",
        description="default of --dask_address: a Dask scheduler (tcp://host:8786) whose workers run the batches")
    # -- sandboxes
    sandbox_image: str | None = Field(
        None, validation_alias="HERMES_SANDBOX_IMAGE",
        description="default of --sandbox_image, for rows that name no image (unset: hermes-sandbox:bookworm)")
    busybox: Path | None = Field(
        None, validation_alias="HERMES_BUSYBOX",
        description="a static busybox binary for the offline sandbox image (else /bin/busybox, /usr/bin/busybox, PATH)")
    runc_cache: Path = Field(
        Path("/var/cache/hermes-runc"), validation_alias="HERMES_RUNC_CACHE",
        description="the runc backend's unpacked image roots and seccomp profiles (read when hermes.sandbox.runc loads)")
    runc_state: Path = Field(
        Path("/run/hermes-runc"), validation_alias="HERMES_RUNC_STATE",
        description="the runc backend's runc state and sandbox folders (read when hermes.sandbox.runc loads)")
    # -- toolsets
    toolset_modules: CommaList = Field(
        default_factory=list, validation_alias="HERMES_TOOLSET_MODULES",
        description="comma list of modules imported at start that register toolsets of your own")
    web_allow_hosts: CommaList = Field(
        default_factory=list, validation_alias="HERMES_WEB_ALLOW_HOSTS",
        description="default of --web_allow_hosts: hosts, addresses or CIDRs (comma list) the web and browser "
                    "tools may reach despite the private-address rules")
    web_search_backend: str = Field(
        "auto", validation_alias="HERMES_WEB_SEARCH_BACKEND",
        description="default of --web_search_backend: auto, searxng, brave, tavily, exa or none")
    web_extract_backend: str = Field(
        "auto", validation_alias="HERMES_WEB_EXTRACT_BACKEND",
        description="default of --web_extract_backend: auto, builtin, firecrawl, tavily, exa or none")
    vision_base_url: str = Field(
        "", validation_alias="HERMES_VISION_BASE_URL",
        description="default of --vision_base_url: the vision model's endpoint (unset: the run's own)")
    vision_model: str = Field(
        "", validation_alias="HERMES_VISION_MODEL",
        description="default of --vision_model (unset: the run's own --model)")
    vision_api_key: SecretStr | None = Field(
        None, validation_alias="HERMES_VISION_API_KEY",
        description="key of a separately configured vision endpoint (the run's key goes only to the run's endpoint)")
    image_base_url: str = Field(
        "", validation_alias="HERMES_IMAGE_BASE_URL",
        description="default of --image_base_url: an OpenAI images API endpoint (unset: the run's own)")
    image_model: str = Field(
        "", validation_alias="HERMES_IMAGE_MODEL",
        description="default of --image_model (unset: gpt-image-1, or fal-ai/flux/schnell on FAL)")
    image_api_key: SecretStr | None = Field(
        None, validation_alias="HERMES_IMAGE_API_KEY",
        description="key of a separately configured image endpoint")


def names(field: FieldInfo) -> tuple[str, ...]:
    """The variables a field is read from, first set wins."""
    alias = field.validation_alias
    return tuple(alias.choices) if isinstance(alias, AliasChoices) else (alias,)  # type: ignore[arg-type]


def _invalid(e: ValidationError) -> EnvironmentInvalid:
    lines = []
    for err in e.errors():
        why = err.get("ctx", {}).get("error") or err["msg"]
        lines.append(f"{err['loc'][0]}={err['input']!r}: {why}")
    return EnvironmentInvalid("; ".join(lines))


@functools.cache
def _one(name: str) -> type[_Variables]:
    # A model of that one field: reading it validates no other variable (the class is kept, never a value).
    field = Environment.model_fields[name]
    return create_model(f"Environment_{name}", __base__=_Variables, **{name: (field.annotation, field)})


def read(name: str) -> Any:
    """The field `name` of Environment, read from os.environ now (KeyError for an unknown name)."""
    if name not in Environment.model_fields:
        raise KeyError(f"no environment variable is modelled as {name!r}")
    try:
        return getattr(_one(name)(), name)
    except ValidationError as e:
        raise _invalid(e) from None


def environment() -> Environment:
    """Every variable, read from os.environ now and validated together."""
    try:
        return Environment()
    except ValidationError as e:
        raise _invalid(e) from None


def _shown_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return ",".join(value) if isinstance(value, list) else str(value).replace(str(Path.home()), "~")
    return "" if field.default is None else str(field.default)


def listing() -> str:
    """Each variable with its value now (keys: set or unset, never the value), default and meaning."""
    rows = []
    for name, field in Environment.model_fields.items():
        variables = names(field)
        is_set = next((v for v in variables if os.environ.get(v)), None)
        try:
            value = read(name)
            if isinstance(value, SecretStr):
                now = f"set ({is_set})" if value.get_secret_value() else "unset"
            else:
                now = (",".join(value) if isinstance(value, list) else str(value)) if is_set else "unset"
        except EnvironmentInvalid as e:
            now = f"INVALID: {e}"
        rows.append(f"{' | '.join(variables)}\n    now: {now}\n    default: {_shown_default(field) or '(none)'}\n"
                    f"    {field.description}")
    return "\n".join(rows)
