"""Anthropic: the key, the API's answer and the configured model's lifecycle."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from bot.cli.checks.report import Check
from bot.cli.checks.slack import masked
from storage.settings import Settings

ANTHROPIC_TIMEOUT_S = 20.0


def check_anthropic(settings: Settings) -> list[Check]:
    """The key lists models; the configured KERNELBOT_MODEL (or the default choice) is among them."""
    if not settings.anthropic_api_key:
        return [Check("anthropic", "skip", "ANTHROPIC_API_KEY is not set: the agents use the offline brain")]
    import anthropic

    from agents.anthropic_brain import BrainError, choose_model

    client = anthropic.Anthropic(api_key=settings.anthropic_api_key, max_retries=0, timeout=ANTHROPIC_TIMEOUT_S)
    where = f"the Messages API at {client.base_url}"
    key = f"ANTHROPIC_API_KEY ({masked(settings.anthropic_api_key)})"
    base_fix = " (ANTHROPIC_BASE_URL points elsewhere: check it too)" if os.environ.get("ANTHROPIC_BASE_URL") else ""
    try:
        models = list(client.models.list(limit=100))
    except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
        return [Check("anthropic", "fail", f"{where} refuses {key}: {exc.status_code} {_api_message(exc)}",
                      "create or copy a key at console.anthropic.com -> API keys and set ANTHROPIC_API_KEY"
                      + base_fix)]
    except anthropic.APIConnectionError as exc:
        return [Check("anthropic", "fail", f"cannot reach {where}: {exc}", "check the network" + base_fix)]
    except anthropic.APIStatusError as exc:
        return [Check("anthropic", "fail", f"{where} answered {exc.status_code} to GET /v1/models: "
                      f"{_api_message(exc)}", "try again later; status.anthropic.com says whether it is down")]
    ids = [m.id for m in models]
    key_check = Check("anthropic", "ok", f"{key} lists {len(ids)} models at {where}")
    try:
        model = choose_model(client, settings.model)
    except (BrainError, anthropic.APIError) as exc:
        return [key_check, Check("anthropic model", "fail", f"no default model: {exc}",
                                 f"set KERNELBOT_MODEL to one of {', '.join(ids) or 'the models your key can use'}")]
    return [key_check, model_verdict(model, configured=settings.model is not None,
                                     lifecycles={m.id: getattr(m, "lifecycle", "active") for m in models})]


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        return str((body.get("error") or {}).get("message") or exc)
    return str(exc)


def model_verdict(model: str, *, configured: bool, lifecycles: Mapping[str, str]) -> Check:
    """The model the anthropic brain would use, against the models the key lists (id -> lifecycle)."""
    how = f"KERNELBOT_MODEL={model!r}" if configured else f"{model} (the newest active Opus listed)"
    active = sorted(m for m, life in lifecycles.items() if life == "active")
    choose = f"set KERNELBOT_MODEL to one of {', '.join(active)}, or unset it for the newest active Opus"
    if model not in lifecycles:
        return Check("anthropic model", "fail", f"{how} is not among the {len(lifecycles)} models this key can use "
                     f"({', '.join(sorted(lifecycles)) or 'none'})", choose)
    life = lifecycles[model] or "active"
    if life == "active":
        return Check("anthropic model", "ok", f"{how} is available")
    if life == "deprecated":
        return Check("anthropic model", "warn", f"{how} is deprecated: it still answers, with a warning, until it "
                     "is retired", choose)
    return Check("anthropic model", "fail", f"{how} is {life}", choose)
