"""Who may approve or steer a session: its owner, named users, members of named user groups, or anyone in the
channel. Pure; the answer for anyone else is the sentence they see (ephemerally) when they click."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SteeringPolicy:
    anyone: bool = False
    users: frozenset[str] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, text: str) -> SteeringPolicy:
        """`anyone`, or a comma-separated list of user ids (U...) and user-group ids (S...); the owner always may."""
        words = [w.strip() for w in text.split(",") if w.strip()]
        if words == ["anyone"]:
            return cls(anyone=True)
        bad = [w for w in words if not w.startswith(("U", "W", "S"))]
        if bad:
            raise ValueError(f"KERNELBOT_STEERERS: {', '.join(bad)} are neither user ids (U...) nor user-group ids "
                             "(S...); use `anyone` or a comma-separated list of ids")
        return cls(users=frozenset(w for w in words if not w.startswith("S")),
                   groups=frozenset(w for w in words if w.startswith("S")))


def may_steer(policy: SteeringPolicy, *, user: str, owner: str | None, user_groups: frozenset[str] = frozenset()
              ) -> tuple[bool, str]:
    """(allowed, why not): the explanation names who may."""
    if policy.anyone or user == owner or user in policy.users or user_groups & policy.groups:
        return True, ""
    who = [f"<@{owner}> (who started it)"] if owner else []
    who += [f"<@{u}>" for u in sorted(policy.users)] + [f"<!subteam^{g}>" for g in sorted(policy.groups)]
    return False, f"Only {', '.join(who) or 'its owner'} may steer this session; nothing was changed."
