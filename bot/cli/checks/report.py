"""The record every check returns and its rendering (terminal lines, JSON). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]



@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    needed: bool = True  # a failure of a needed check makes doctor exit 1

    @property
    def blocking(self) -> bool:
        return self.status == "fail" and self.needed


# -- rendering (pure) --------------------------------------------------------------------------------------------

_LABELS = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def exit_code(checks: Iterable[Check]) -> int:
    """1 when any needed check failed, else 0 (warnings and skips never fail doctor)."""
    return 1 if any(c.blocking for c in checks) else 0


def summary(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in _LABELS}
    blocking = [c.name for c in checks if c.blocking]
    verdict = (f"not ready: {', '.join(blocking)} failed" if blocking
               else "ready" + (" (with warnings)" if counts["warn"] or counts["fail"] else ""))
    plural = "" if counts["warn"] == 1 else "s"
    return (f"{counts['ok']} ok, {counts['warn']} warning{plural}, {counts['fail']} failed, {counts['skip']} "
            f"skipped: {verdict}")


def render_checks(checks: list[Check]) -> str:
    """One line per check (status, name, detail), then `fix: ...` under each check that is not ok or skipped."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{_LABELS[c.status]:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    lines.append(summary(checks))
    return "\n".join(lines)


def as_json(checks: list[Check]) -> dict[str, Any]:
    return {"ready": exit_code(checks) == 0, "exit_code": exit_code(checks), "summary": summary(checks),
            "checks": [{**asdict(c), "blocking": c.blocking} for c in checks]}
