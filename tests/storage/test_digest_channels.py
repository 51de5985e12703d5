"""Where digests go, on SQLite and PostgreSQL: the settings' channels by default, a channel's subscribe or
unsubscribe recorded over them (an unsubscribe of a listed channel holds), who chose and when."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlmodel import Session

from storage import digests


def _channels(engine: Engine, defaults: tuple[str, ...]) -> list[str]:
    with Session(engine) as s:
        return digests.get_digest_channels(s, defaults=defaults)


def test_subscriptions_add_to_and_take_from_the_default_channels(engine: Engine) -> None:
    assert _channels(engine, ("C1", "C2", "C1")) == ["C1", "C2"]
    with Session(engine) as s, s.begin():
        digests.set_digest_subscription(s, channel="C3", subscribed=True, user="U1")
        digests.set_digest_subscription(s, channel="C1", subscribed=False, user="U2")
    assert _channels(engine, ("C1", "C2")) == ["C2", "C3"]
    assert _channels(engine, ()) == ["C3"]
    with Session(engine) as s, s.begin():  # a second choice replaces the first
        digests.set_digest_subscription(s, channel="C1", subscribed=True, user="U3")
        digests.set_digest_subscription(s, channel="C3", subscribed=False, user="U3")
    assert _channels(engine, ("C1", "C2")) == ["C1", "C2"]
    with Session(engine) as s:
        row = digests.get_digest_subscription(s, channel="C3")
        assert row is not None and (row.subscribed, row.changed_by) == (False, "U3") and row.changed_at > 0
        assert [r.channel for r in digests.get_digest_subscriptions(s)] == ["C1", "C3"]
        assert digests.get_digest_subscription(s, channel="C9") is None


def test_a_first_choice_recorded_by_someone_else_meanwhile_is_replaced_not_a_crash(engine: Engine) -> None:
    with Session(engine) as other, other.begin():
        digests.set_digest_subscription(other, channel="C1", subscribed=True, user="U1")
    with Session(engine) as s, s.begin():
        looks: list[object] = []
        real_get = s.get

        def before_the_other_committed(entity: object, ident: object, **kwargs: object) -> object:
            looks.append(ident)  # the first look happened before the other transaction's row existed
            return None if len(looks) == 1 else real_get(entity, ident, **kwargs)  # type: ignore[call-overload]

        s.get = before_the_other_committed  # type: ignore[method-assign]
        row = digests.set_digest_subscription(s, channel="C1", subscribed=False, user="U2")
        assert len(looks) == 2  # the insert clashed and the row was read again
        assert (row.subscribed, row.changed_by) == (False, "U2")
    assert _channels(engine, ("C1",)) == []
