"""Choosing and building a brain from settings (entry points only)."""

from __future__ import annotations

from agents.brain import Brain, Budget
from storage.settings import Settings

BRAINS = ("anthropic", "offline")


class BrainUnavailable(RuntimeError):
    """The brain asked for cannot run here; the message says what is needed."""


def default_brain(settings: Settings) -> str:
    return "anthropic" if settings.anthropic_api_key else "offline"


def make_brain(name: str, settings: Settings, budget: Budget) -> Brain:
    if name == "anthropic":
        if not settings.anthropic_api_key:
            raise BrainUnavailable("the anthropic brain needs ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a proxy)")
        import anthropic

        from agents.anthropic_brain import AnthropicBrain, choose_model

        client = anthropic.Anthropic(api_key=settings.anthropic_api_key, max_retries=0, timeout=300.0)
        return AnthropicBrain(client=client, model=choose_model(client, settings.model), budget=budget)
    if name == "offline":
        raise BrainUnavailable("the offline brain is not part of this version yet; set ANTHROPIC_API_KEY and use "
                               "--brain anthropic")
    raise BrainUnavailable(f"unknown brain {name!r}; choose one of {', '.join(BRAINS)}")
