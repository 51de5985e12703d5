"""`/kernel schedule` (recurring searches, kept as `schedules` rows that every `serve` scheduler reads) and
`/kernel digest` (where the daily digest goes - KERNELBOT_DIGEST_CHANNELS, with each channel's subscribe or
unsubscribe kept as a row over it - the digest so far, or posted now). Each command is a function from its parsed
form to the ephemeral reply; a mistake gets one line naming the value and what to type instead."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from agents.brains import default_brain
from agents.search_decide import SearchConfig
from bot.slack.listener_context import BotContext
from bot.slack.outbound.digest import MANUAL_PREFIX, digest_text, gather_digest, period_start, record_digest
from bot.slack.scheduler import SEARCH_KIND, CronError, next_fires, parse_cron, shortest_gap
from bot.slack.slash import Command, closest
from bot.slack.views.kit import slack_date
from bot.slack.visibility import audience
from bot.task_suites import suite_tasks
from storage import digests, schedules
from storage.models import Schedule, now
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import load_task

MIN_INTERVAL_SECONDS = 600.0  # a recurring search is a batch of evaluations: at most one every 10 minutes
ADD_EXAMPLE = '`/kernel schedule add softmax "0 2 * * *" --budget 8`'
STRATEGIES_WITHOUT_SEED = ("beam", "parallel", "hybrid")  # a schedule has no seed kernel for the autotuner


def _describe(row: Schedule) -> str:
    p = row.payload or {}
    try:
        fires = next_fires(parse_cron(row.cron, row.timezone), datetime.now(UTC), 1)
        upcoming = f"next {slack_date(fires[0].timestamp())}" if fires else "never fires again"
    except CronError as exc:
        upcoming = f"not scheduled: {exc}"
    last = f", last {slack_date(row.last_run_at)}" if row.last_run_at else ""
    where = f" in <#{row.channel}>" if row.channel else ""
    owner = f"<@{p['owner']}>" if p.get("owner") else "someone"
    return (f"• #{row.id} {p.get('strategy', 'beam')} search of *{p.get('task')}* ({p.get('budget')} evaluations, "
            f"{p.get('target')}, {p.get('brain')} brain) at `{row.cron}` ({row.timezone}): {upcoming}{last}; by "
            f"{owner}{where}")


def _list(ctx: BotContext) -> str:
    with Session(ctx.engine) as s:
        rows = schedules.get_schedules(s, kind=SEARCH_KIND)
    if not rows:
        return f"No recurring search is scheduled. {ADD_EXAMPLE} adds one."
    return "Recurring searches:\n" + "\n".join(_describe(r) for r in rows)


def _add(ctx: BotContext, command: Command, *, user: str, channel: str) -> str:
    name, cron = command.args.get("task"), " ".join(command.args.get("cron", "").split())
    if not name or not cron:
        return f"`schedule add` needs a task and a quoted cron line, e.g. {ADD_EXAMPLE}."
    tasks = suite_tasks(ctx.suites)
    if name not in tasks:
        return f"No task `{name}`. Tasks: {', '.join(f'`{t}`' for t in sorted(tasks)) or 'none'}."
    timezone = ctx.settings.timezone
    try:
        trigger = parse_cron(cron, timezone)
    except CronError as exc:
        return f"Not a schedule: {exc}."
    gap = shortest_gap(trigger, datetime.now(UTC))
    if gap is not None and gap < MIN_INTERVAL_SECONDS:
        return (f"`{cron}` would start a search every {gap:.0f} s; a recurring search may run at most every "
                f"{MIN_INTERVAL_SECONDS / 60:.0f} minutes, e.g. {ADD_EXAMPLE}.")
    strategy = str(command.options.get("strategy") or "beam")
    if strategy not in STRATEGIES_WITHOUT_SEED:
        return (f"`--strategy {strategy}` needs a seed kernel, which a schedule does not take; use one of "
                f"{', '.join(STRATEGIES_WITHOUT_SEED)}.")
    config = SearchConfig(strategy=strategy, budget=int(command.options.get("budget") or 12))
    task = load_task(tasks[name])  # a task that does not load is refused now, not at 2 a.m.
    target = get_chip(str(command.options.get("target") or ctx.settings.default_target)).name
    brain = str(command.options.get("brain") or default_brain(ctx.settings))
    ctx.channels.require(channel, outcome="Nothing was scheduled.")  # results come here: refused now, not at 2 a.m.
    name = f"{SEARCH_KIND}:{channel}:{task.task_id}:{cron}"
    payload = {"task": task.task_id, "task_dir": str(task.path), "strategy": config.strategy,
               "budget": config.budget, "brain": brain, "target": target, "owner": user}
    try:
        with Session(ctx.engine) as s, s.begin():
            schedule_id = schedules.create_schedule(s, name=name, kind=SEARCH_KIND, cron=cron, timezone=timezone,
                                                    channel=channel, payload=payload).id
    except IntegrityError:
        with Session(ctx.engine) as s:
            same = schedules.get_schedule_named(s, name=name)
        which = f" (#{same.id})" if same else ""
        return (f"*{task.task_id}* is already scheduled at `{cron}` in this channel{which}; "
                "`/kernel schedule list` shows the schedules.")
    fires = next_fires(trigger, datetime.now(UTC), 1)
    first = slack_date(fires[0].timestamp())
    return (f"Scheduled #{schedule_id}: a {config.strategy} search of *{task.task_id}* ({config.budget} "
            f"evaluations, {target}, {brain} brain) at `{cron}` ({timezone}), first {first}. "
            "Each result comes to a thread here; `/kernel schedule remove "
            f"{schedule_id}` stops it.")


def _remove(ctx: BotContext, command: Command, *, user: str) -> str:
    raw = (command.args.get("task") or "").lstrip("#")
    if not raw.isdigit():
        shown = command.args.get("task")
        what = f"`{shown}` is not a schedule id" if shown else "`schedule remove` needs a schedule id"
        return f"{what}: `/kernel schedule list` shows them, e.g. `/kernel schedule remove 3`."
    with Session(ctx.engine) as s:
        row = schedules.get_schedule(s, schedule_id=int(raw))
        owner = (row.payload or {}).get("owner") if row else None
    if row is None or row.kind != SEARCH_KIND:
        return f"No schedule #{raw}: `/kernel schedule list` shows the schedules and their ids."
    allowed, why = ctx.may_steer(user=user, owner=owner)
    if not allowed:
        return why.replace("steer this session", "remove this schedule")
    with Session(ctx.engine) as s, s.begin():
        schedules.delete_schedule(s, schedule_id=int(raw))
    return f"Removed schedule #{raw} (the *{(row.payload or {}).get('task')}* search at `{row.cron}`)."


def schedule_reply(ctx: BotContext, command: Command, *, user: str, channel: str) -> str:
    action = (command.args.get("action") or "list").lower()
    if action == "list":
        return _list(ctx)
    if action == "add":
        return _add(ctx, command, user=user, channel=channel)
    if action in ("remove", "rm", "delete"):
        return _remove(ctx, command, user=user)
    return (f"`schedule {action}` is not something schedules do: use `/kernel schedule list`, "
            f"{ADD_EXAMPLE} or `/kernel schedule remove ID`.")


DIGEST_ACTIONS = ("list", "subscribe", "unsubscribe", "preview", "now")
DIGEST_HELP = ("`/kernel digest subscribe` sends it to this channel, `/kernel digest unsubscribe` stops it, "
               "`/kernel digest preview` shows it so far, `/kernel digest now` posts it here.")


def _digest_schedule(ctx: BotContext) -> str:
    """When digests go out: the cron line, its time zone and the next time, or why they do not."""
    cron, timezone = ctx.settings.digest_cron, ctx.settings.timezone
    try:
        fires = next_fires(parse_cron(cron, timezone), datetime.now(UTC), 1)
    except CronError as exc:
        return f"no digest goes out: KERNELBOT_DIGEST_CRON {exc}"
    return f"at `{cron}` ({timezone})" + (f", next {slack_date(fires[0].timestamp())}" if fires else "")


def _digest_where(ctx: BotContext, *, user: str, channel: str) -> str:
    with Session(ctx.engine) as s:
        targets = digests.get_digest_channels(s, defaults=ctx.settings.digest_channels)
        chosen = {row.channel: row for row in digests.get_digest_subscriptions(s)}
    shown = audience(ctx.visibility, viewer=user, where=channel)  # another private channel's name stays out
    named = [c for c in targets if shown(c)]

    def why(c: str) -> str:
        row = chosen.get(c)
        if row is None:
            return "KERNELBOT_DIGEST_CHANNELS"
        return f"subscribed by {f'<@{row.changed_by}>' if row.changed_by else 'someone'} {slack_date(row.changed_at)}"

    if not targets:
        return f"No channel gets the daily digest ({_digest_schedule(ctx)}). {DIGEST_HELP}"
    hidden = len(targets) - len(named)
    listing = ", ".join(f"<#{c}> ({why(c)})" for c in named)
    if hidden:
        listing += f"{' and ' if named else ''}{hidden} private channel(s) you are not in"
    here = "This channel gets it." if channel in targets else "This channel does not get it."
    return f"The daily digest goes out {_digest_schedule(ctx)} to {listing}. {here} {DIGEST_HELP}"


def _subscribe(ctx: BotContext, *, user: str, channel: str) -> str:
    with Session(ctx.engine) as s:
        already = channel in digests.get_digest_channels(s, defaults=ctx.settings.digest_channels)
    if already:
        return (f"This channel already gets the daily digest ({_digest_schedule(ctx)}); "
                "`/kernel digest unsubscribe` stops it.")
    ctx.channels.require(channel, outcome="This channel was not subscribed.")  # refused now, not at 9 a.m.
    with Session(ctx.engine) as s, s.begin():
        digests.set_digest_subscription(s, channel=channel, subscribed=True, user=user)
    return (f"This channel now gets the daily digest {_digest_schedule(ctx)}: this channel's sessions and public "
            "channels', never another private channel's. `/kernel digest unsubscribe` stops it.")


def _unsubscribe(ctx: BotContext, *, user: str, channel: str) -> str:
    with Session(ctx.engine) as s:
        getting = channel in digests.get_digest_channels(s, defaults=ctx.settings.digest_channels)
    if not getting:
        return "This channel does not get the daily digest; nothing was changed. `/kernel digest` says where it goes."
    with Session(ctx.engine) as s, s.begin():
        digests.set_digest_subscription(s, channel=channel, subscribed=False, user=user)
    listed = (" KERNELBOT_DIGEST_CHANNELS lists it; this holds over that list." if channel in
              ctx.settings.digest_channels else "")
    return f"This channel no longer gets the daily digest.{listed} `/kernel digest subscribe` brings it back."


def digest_reply(ctx: BotContext, command: Command, *, user: str, channel: str) -> str:
    action = (command.args.get("action") or "list").lower()
    if action == "list":
        return _digest_where(ctx, user=user, channel=channel)
    if action == "subscribe":
        return _subscribe(ctx, user=user, channel=channel)
    if action == "unsubscribe":
        return _unsubscribe(ctx, user=user, channel=channel)
    shown = audience(ctx.visibility, where=channel)  # what this channel may be shown of others' sessions
    until = now()
    if action == "preview":
        with Session(ctx.engine) as s:
            since = period_start(s, channel=channel, until=until)
            payload = gather_digest(s, since=since, until=until, shown=shown)
        return f"{digest_text(payload)}\n\n_A preview: nothing was posted. `/kernel digest now` posts it here._"
    if action == "now":
        ctx.channels.require(channel, outcome="No digest was posted.")  # one the channel refuses would fail unseen
        with Session(ctx.engine) as s:
            since = period_start(s, channel=channel, until=until)
        period = MANUAL_PREFIX + datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds")
        if not record_digest(ctx.engine, channel=channel, period=period, since=since, until=until, shown=shown):
            return f"A digest for this channel was recorded this very second (`{period}`); it is on its way."
        ctx.notify()
        return f"The digest since {slack_date(since)} is being posted in this channel (`{period}`)."
    return f"`digest {action}` is not a digest command.{closest(action, list(DIGEST_ACTIONS))} {DIGEST_HELP}"
