"""Who may steer a session."""

from __future__ import annotations

import pytest

from bot.slack.steering import SteeringPolicy, may_steer


def test_owner_named_users_and_groups_may_steer_and_others_are_told_who_may() -> None:
    policy = SteeringPolicy.parse("U2, S9")
    assert may_steer(policy, user="U1", owner="U1")[0]
    assert may_steer(policy, user="U2", owner="U1")[0]
    assert may_steer(policy, user="U3", owner="U1", user_groups=frozenset({"S9"}))[0]
    allowed, why = may_steer(policy, user="U3", owner="U1")
    assert not allowed and "<@U1> (who started it)" in why and "<@U2>" in why and "<!subteam^S9>" in why
    assert may_steer(SteeringPolicy.parse("anyone"), user="U7", owner="U1")[0]


def test_a_bad_policy_names_the_setting() -> None:
    with pytest.raises(ValueError, match="KERNELBOT_STEERERS: bob"):
        SteeringPolicy.parse("U1, bob")
