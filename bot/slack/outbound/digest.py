"""The digest of a period: what the agents found, what waits for people, what broke and how the fleet is.

`gather_digest` reads the database into a JSON-able payload, with only the sessions the digest's channel may be
shown (its own, public channels', a terminal's: `bot.slack.visibility`); `record_digest` keeps it as a pending DigestRun
(unique per channel and period, so a digest is recorded once however many processes try); the notifier posts
it with `digest_ops`: the message from `build_digest` (pure, within Slack's limits) and, when there is
something to draw, the chart from `digest_chart`.
"""

from __future__ import annotations

import io
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from agents.auto_decide import StepRecord
from agents.hitl import waiting_for
from bot.slack.outbound.thread_ops import Op, Payload, Show, Upload
from bot.slack.views.kit import MAX_BLOCKS, context, header, sections, slack_date, thread_link
from bot.slack.visibility import Audience
from bot.speedup import no_clear_gain, speedup_text, stored_band
from storage import digests, queue, runners, sessions
from storage.models import DigestRun, Evaluation, KernelSession
from tpu_runner.reports import draws_alone

DAY_SECONDS = 24 * 3600.0
STALE_SECONDS = 120.0  # a runner not heard from for longer is stale
STORED_ITEMS = 50  # per list in the payload (the counts are the whole truth)
LISTING_CHARS = 1800  # per section of the message: five of them stay well under Slack's ~12k characters
PREVIEW_CHARS = 650  # per list in a preview's text
REASON_CHARS = 200
MANUAL_PREFIX = "manual-"
_WAITS = {"await_approval": "to approve the plan", "await_decision": "to decide on a result"}


# -- gathering (database reads only) ----------------------------------------------------------------------------
def _where(r: KernelSession) -> dict[str, Any]:
    return {"session": r.id, "mode": r.mode, "task": r.task, "target": r.target, "owner": r.owner,
            "channel": r.slack_channel, "thread_ts": r.slack_thread_ts}


def _new_bests(s: Session, since: float, until: float, shown: Audience) -> list[dict[str, Any]]:
    """Sessions whose best kernel was measured (or estimated) in the period, fastest first."""
    rows = digests.get_best_evaluations(s, since=since, until=until)
    best: dict[str, tuple[KernelSession, Evaluation]] = {}
    for record, evaluation in rows:
        if not shown(record.slack_channel):
            continue
        kept = best.get(record.id)
        if kept is None or (evaluation.speedup or 0.0) > (kept[1].speedup or 0.0):
            best[record.id] = (record, evaluation)
    items = [{**_where(r), "speedup": e.speedup, "method": e.method or "estimated", "band": stored_band(e.result),
              "verdict": e.verdict, "candidate": e.candidate_id, "at": e.created_at} for r, e in best.values()]
    return sorted(items, key=lambda item: (-(item["speedup"] or 0.0), item["task"]))


def _searches(s: Session, since: float, until: float, shown: Audience) -> list[dict[str, Any]]:
    rows = [(e, r) for e, r in digests.get_finished_searches(s, since=since, until=until) if shown(r.slack_channel)]
    return [{**_where(r), "evaluations": int((e.payload or {}).get("evaluations") or 0),
             "best_speedup": (e.payload or {}).get("best_speedup"), "best_method": (e.payload or {}).get("best_method"),
             "best_band": (e.payload or {}).get("best_band"), "reason": (e.payload or {}).get("reason"),
             "at": e.created_at} for e, r in rows]


def _awaiting(s: Session, shown: Audience) -> tuple[int, list[dict[str, Any]]]:
    rows = [r for r in sessions.get_awaiting_sessions(s) if shown(r.slack_channel)]
    items = []
    for r in rows[:STORED_ITEMS]:
        waits = None
        if r.mode == "hitl":
            steps = sessions.get_steps(s, session_id=r.id)
            waits = waiting_for([StepRecord(st.kind, dict(st.outputs or {})) for st in steps])
        items.append({**_where(r), "waiting_for": waits, "since": r.updated_at})
    return len(rows), items


def _failed_jobs(s: Session, since: float, until: float, shown: Audience) -> tuple[int, list[dict[str, Any]]]:
    """(how many jobs failed for good in the period, the latest of them), a session's job only where its session
    may be shown."""
    rows = [job for job, channel in digests.get_failed_jobs(s, since=since, until=until) if shown(channel)]
    return len(rows), [{"job": j.id, "kind": j.kind, "session": j.session_id, "attempts": j.attempts,
                        "reason": (j.last_error or "no reason recorded")[:1000], "at": j.finished_at}
                       for j in rows[:STORED_ITEMS]]


def _failed_sessions(s: Session, since: float, until: float, shown: Audience) -> list[dict[str, Any]]:
    rows = [r for r in digests.get_failed_sessions(s, since=since, until=until) if shown(r.slack_channel)]
    return [{**_where(r), "at": r.updated_at} for r in rows]


def _fleet(s: Session, until: float) -> dict[str, Any]:
    active = runners.get_active_runners(s)
    stale = [{"name": r.name, "host": r.host, "silent_seconds": round(until - r.heartbeat_at)}
             for r in active if until - r.heartbeat_at > STALE_SECONDS]
    counts = queue.live_counts(s)
    return {"active": len(active) - len(stale), "stale": stale, "stale_after": STALE_SECONDS,
            "queued": int(counts.get("queued", 0)), "running": int(counts.get("running", 0))}


def _listed(items: list[dict[str, Any]], count: int | None = None) -> dict[str, Any]:
    return {"count": len(items) if count is None else count, "items": items[:STORED_ITEMS]}


def gather_digest(s: Session, *, since: float, until: float, shown: Audience) -> dict[str, Any]:
    """What happened in [since, until): new best kernels, finished searches, failures; and as of `until`: the
    sessions waiting for someone, the runner fleet and the queue. Of the sessions (and their jobs), only those
    whose channel passes `shown`: the digest's channel's audience. JSON-able; reads only (and asks `shown`)."""
    failed_count, failed = _failed_jobs(s, since, until, shown)
    awaiting_count, awaiting = _awaiting(s, shown)
    return {
        "since": since, "until": until,
        "new_bests": _listed(_new_bests(s, since, until, shown)),
        "searches": _listed(_searches(s, since, until, shown)),
        "awaiting": _listed(awaiting, awaiting_count),
        "failed_jobs": _listed(failed, failed_count),
        "failed_sessions": _listed(_failed_sessions(s, since, until, shown)),
        "fleet": _fleet(s, until),
    }


def _scheduled_ends(s: Session, *, channel: str) -> list[float]:
    """Where the channel's recent scheduled digests ended (a manual one does not count)."""
    runs = digests.get_recent_digest_runs(s, channel=channel, excluding_prefix=MANUAL_PREFIX, limit=20)
    return [end for end in (float((r.payload or {}).get("until") or 0.0) for r in runs) if end > 0.0]


def period_start(s: Session, *, channel: str, until: float) -> float:
    """Where the digest of `channel` closing at `until` starts: the end of the channel's previous scheduled
    digest (a manual one does not cut the day short), or a day earlier when there is none."""
    earlier = [end for end in _scheduled_ends(s, channel=channel) if end < until]
    return max(earlier) if earlier else until - DAY_SECONDS


def last_scheduled_end(s: Session, *, channel: str) -> float | None:
    """Where the channel's latest scheduled digest ended (None when it never had one)."""
    return max(_scheduled_ends(s, channel=channel), default=None)


def record_digest(engine: Engine, *, channel: str, period: str, since: float, until: float,
                  shown: Audience) -> bool:
    """Gather the period's digest for `channel` (of the sessions `shown` lets through) and keep it as a pending
    DigestRun for the notifier to post. False when this (channel, period) was recorded already - by this process
    or another (the unique constraint decides)."""
    with Session(engine) as s:  # read first: `shown` may ask Slack, which no write transaction should wait on
        payload = gather_digest(s, since=since, until=until, shown=shown)
    try:
        with Session(engine) as s, s.begin():
            digests.add_digest_run(s, channel=channel, period=period, payload=payload)
    except IntegrityError:
        return False
    return True


# -- rendering (pure) -------------------------------------------------------------------------------------------
def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _one_line(text: Any, limit: int = REASON_CHARS) -> str:
    flat = " ".join(str(text or "").split())
    return _escape(flat if len(flat) <= limit else flat[:limit - 1] + "…")


def _who(user: str | None) -> str:
    return f"<@{user}>" if user else "its owner"


def _link(item: dict[str, Any]) -> str:
    link = thread_link(item.get("channel"), item.get("thread_ts"))
    return f" - {link}" if link else ""


def _speedup(value: float | None, method: str | None = None, band: list[float] | None = None) -> str:
    """'x1.04 estimated, likely x0.90-x1.20: no clear gain'; without a method (stored before it was) 'x1.04'."""
    if value is None:
        return "no speedup"
    return speedup_text(value, method, band) if method else f"x{value:.2f}"


def _best_line(i: dict[str, Any]) -> str:
    return (f"• *{_one_line(i['task'], 80)}* ({i['target']}) {_speedup(i['speedup'], i['method'], i.get('band'))}; "
            f"{i['mode']} `{i['session']}` of {_who(i.get('owner'))}{_link(i)}")


def _search_line(i: dict[str, Any]) -> str:
    best = i.get("best_speedup")
    found = (f"best {_speedup(best, i.get('best_method'), i.get('best_band'))}" if best is not None
             else "no kernel faster than the reference")
    return (f"• *{_one_line(i['task'], 80)}* ({i['target']}) `{i['session']}`: {i['evaluations']} evaluation(s), "
            f"{found}{_link(i)}")


def _awaiting_line(i: dict[str, Any]) -> str:
    what = _WAITS.get(i.get("waiting_for") or "", "to decide")
    return (f"• `{i['session']}` {i['mode']} on *{_one_line(i['task'], 80)}*: waits for {_who(i.get('owner'))} "
            f"{what}, since {slack_date(i['since'])}{_link(i)}")


def _job_line(i: dict[str, Any]) -> str:
    of = f" of `{i['session']}`" if i.get("session") else ""
    return f"• job {i['job']} `{i['kind']}`{of}: {_one_line(i['reason'])}"


def _failed_session_line(i: dict[str, Any]) -> str:
    return f"• `{i['session']}` {i['mode']} on *{_one_line(i['task'], 80)}* failed{_link(i)}"


def _listing(title: str, listed: dict[str, Any], line: Any, limit: int = LISTING_CHARS) -> str | None:
    """The section's text: its title with the count, then as many lines as fit; None when the list is empty."""
    count = int(listed.get("count") or 0)
    if not count:
        return None
    text = f"*{title} ({count})*"
    shown = 0
    for item in listed.get("items") or []:
        candidate = f"{text}\n{line(item)}"
        if len(candidate) > limit - 60:
            break
        text, shown = candidate, shown + 1
    if shown < count:
        text += f"\n_…and {count - shown} more_"
    return text


def _fleet_text(fleet: dict[str, Any]) -> str:
    active, stale = int(fleet.get("active") or 0), list(fleet.get("stale") or [])
    queued, running = int(fleet.get("queued") or 0), int(fleet.get("running") or 0)
    text = f"*Runners*: {active} active"
    if stale:
        names = ", ".join(f"{_one_line(r['name'], 40)} on {_one_line(r['host'], 40)} ({r['silent_seconds']} s)"
                          for r in stale[:10])
        more = f" and {len(stale) - 10} more" if len(stale) > 10 else ""
        text += f"; :warning: {len(stale)} silent for over {int(fleet.get('stale_after') or STALE_SECONDS)} s: " \
                f"{names}{more}"
    text += f". Queue: {queued} waiting, {running} running."
    if queued and not active:
        text += " Nothing will run until a runner starts (`kernelbot runner`)."
    return text


def digest_sections(payload: dict[str, Any], section_chars: int = LISTING_CHARS) -> list[str]:
    """The digest's parts as mrkdwn, each list within `section_chars` (and so within a section's limit)."""
    empty: dict[str, Any] = {"count": 0, "items": []}
    parts = [
        _listing(title, payload.get(key) or empty, line, section_chars) for title, key, line in (
            ("New best kernels", "new_bests", _best_line), ("Searches finished", "searches", _search_line),
            ("Waiting for a decision", "awaiting", _awaiting_line), ("Failed jobs", "failed_jobs", _job_line),
            ("Failed sessions", "failed_sessions", _failed_session_line))
    ]
    sections = [p for p in parts if p]
    if not sections:
        sections.append("A quiet period: no new best kernel, no search finished, nothing waiting, no failure.")
    sections.append(_fleet_text(payload.get("fleet") or {}))
    return sections


def _summary(payload: dict[str, Any]) -> str:
    def n(key: str) -> int:
        return int((payload.get(key) or {}).get("count") or 0)

    failures = n("failed_jobs") + n("failed_sessions")
    return (f"Kernel digest: {n('new_bests')} new best kernel(s), {n('searches')} search(es) finished, "
            f"{n('awaiting')} waiting for a decision, {failures} failure(s)")


def _span(payload: dict[str, Any]) -> str:
    since, until = payload.get("since"), payload.get("until")
    if since is None or until is None:
        return ""
    return f"from {slack_date(float(since))} to {slack_date(float(until))}"


def build_digest(payload: dict[str, Any]) -> Payload:
    """The digest message: a header, the period, one section per non-empty part, the fleet. Within Slack's
    limits whatever the payload holds (each part is capped; counts say what was left out)."""
    blocks = [header("Kernel digest")]
    span = _span(payload)
    if span:
        blocks.append(context(span))
    for text in digest_sections(payload):
        blocks += sections(text)
    return {"text": _summary(payload), "blocks": blocks[:MAX_BLOCKS]}


def digest_text(payload: dict[str, Any], section_chars: int = PREVIEW_CHARS) -> str:
    """The digest as one mrkdwn text (an ephemeral preview: Slack shows about 4,000 characters of a text well)."""
    span = _span(payload)
    return "\n\n".join([f"*Kernel digest* {span}".rstrip(), *digest_sections(payload, section_chars)])


@draws_alone
def digest_chart(payload: dict[str, Any]) -> bytes | None:
    """A PNG of the best speedup per task among the period's new best kernels; None when there is none."""
    best: dict[str, dict[str, Any]] = {}
    for item in (payload.get("new_bests") or {}).get("items") or []:
        if item.get("speedup") is None:
            continue
        kept = best.get(item["task"])
        if kept is None or item["speedup"] > kept["speedup"]:
            best[item["task"]] = item
    if not best:
        return None
    from matplotlib.figure import Figure  # the object API: no pyplot state (and one chart at a time: draws_alone)

    items = sorted(best.values(), key=lambda i: i["speedup"])[-25:]
    fig = Figure(figsize=(7, 1.2 + 0.35 * len(items)))
    ax = fig.add_subplot()
    colors = ["#55A868" if i.get("method") == "measured" else "#8C8C8C" for i in items]
    ax.barh([str(i["task"])[:32] for i in items], [i["speedup"] for i in items], color=colors)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    for y, i in enumerate(items):
        band = i.get("band")
        if band:  # the estimate's likely range as a whisker
            ax.plot(band, [y, y], color="black", linewidth=1)
        label = f" x{i['speedup']:.2f} {i.get('method') or 'estimated'}"
        if band and no_clear_gain(band):
            label += ", no clear gain"
        ax.text(max(i["speedup"], *(band or [0.0])), y, label, va="center", fontsize=8)
    ax.set_xlabel("speedup over the XLA reference (dashed: x1; whiskers: an estimate's likely range)")
    ax.set_xlim(0, max(max(i["speedup"], *(i.get("band") or [0.0])) for i in items) * 1.35)
    ax.set_title("Best speedup per task (green: measured, grey: estimated)", fontsize=10)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()


def digest_ops(run: DigestRun) -> list[Op]:
    """How the notifier shows a recorded digest: the message in the channel, then its chart (when any)."""
    payload = run.payload or {}
    ops: list[Op] = [Show("digest", build_digest(payload), in_thread=False)]
    chart = digest_chart(payload)
    if chart is not None:
        ops.append(Upload(f"file:digest_{run.id}.png", f"digest_{run.id}.png", chart,
                          "Best speedup per task", ""))
    return ops

