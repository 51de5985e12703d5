"""The parameters a plan carries on a line of its own, `Parameters: {"BLOCK_ROWS": 32, ...}`: the offline brain's
planner writes it, its implementer reads it back, and people's views show the same values as fields instead of
the line. Pure text in, values out."""

from __future__ import annotations

import json
import re
from typing import Any

LINE = re.compile(r"^Parameters: (\{.*\})\s*$", re.MULTILINE)


def parameters_line(params: dict[str, Any]) -> str:
    return f"Parameters: {json.dumps(params, sort_keys=True)}"


def plan_parameters(plan: str) -> dict[str, Any] | None:
    """The values of the plan's last `Parameters:` line; None when it has none that reads as a JSON object."""
    found = LINE.findall(plan)
    if not found:
        return None
    try:
        params = json.loads(found[-1])
    except json.JSONDecodeError:
        return None
    return params if isinstance(params, dict) else None


def without_parameters(plan: str) -> str:
    """The plan without its `Parameters:` lines (for a view that shows the values another way)."""
    kept = [line for line in plan.splitlines() if not LINE.fullmatch(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n")
