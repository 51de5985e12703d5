"""Choosing and building a brain from settings (entry points only)."""

from __future__ import annotations

from agents.brain import Brain, Budget
from agents.offline.brain import NotRecognised, offline_brain
from agents.offline.families import FAMILIES
from storage.errors import KernelbotError
from storage.settings import Settings
from tpu_runner.hardware import ChipSpec
from tpu_runner.tasks import Task

BRAINS = ("anthropic", "offline")


class BrainUnavailable(KernelbotError, RuntimeError):
    """The brain asked for cannot run here; the message says what is needed."""
    next_step = ("choose a brain that can do this here with --brain (the anthropic brain needs ANTHROPIC_API_KEY); "
                 "`--help` in the terminal or `/kernel help` in Slack lists the options")


def default_brain(settings: Settings) -> str:
    return "anthropic" if settings.anthropic_api_key else "offline"


def make_brain(name: str, settings: Settings, budget: Budget, *, task: Task | None, chip: ChipSpec | None) -> Brain:
    """The brain for one session on one task (the offline brain reads the task's reference itself, so it needs
    one; an LLM brain does not, e.g. when it writes a task's reference from CUDA source)."""
    if name == "anthropic":
        if not settings.anthropic_api_key:
            raise BrainUnavailable("the anthropic brain needs ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a proxy)")
        # Here, not at the top: the SDK takes most of a second to import, which a process that only runs the
        # offline brain (the runner, a test, the terminal without a key) never needs to pay.
        import anthropic

        from agents.anthropic_brain import PRICES_PER_MTOK, AnthropicBrain, choose_model

        client = anthropic.Anthropic(api_key=settings.anthropic_api_key, max_retries=0, timeout=300.0)
        # Every session has a spending cap: its own, or the setting's when that is lower (or it has none).
        if budget.max_cost_usd is None or budget.max_cost_usd > settings.max_cost_usd:
            budget.max_cost_usd = settings.max_cost_usd
        prices = {**PRICES_PER_MTOK, **{f: (i, o) for f, i, o in settings.prices}}
        return AnthropicBrain(client=client, model=choose_model(client, settings.model), budget=budget,
                              prices=prices)
    if name == "offline":
        if task is None or chip is None:
            raise BrainUnavailable("the offline brain works on a task's reference; this needs an LLM brain "
                                   "(--brain anthropic with ANTHROPIC_API_KEY)")
        try:
            return offline_brain(task, chip, settings)
        except NotRecognised as exc:
            raise BrainUnavailable(f"the offline brain cannot write a kernel for {task.task_id}: {exc}. It writes "
                                   f"{FAMILIES}; for anything else use --brain anthropic") from exc
    raise BrainUnavailable(f"unknown brain {name!r}; choose one of {', '.join(BRAINS)}")
