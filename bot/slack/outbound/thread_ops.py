"""What a session event does to its Slack thread: a pure function from the event, with the data it refers to
(gathered by the notifier), to the messages that show it.

A thread holds: the root message (its status line edited in place), a card for each step that waits for a
person (plan, result, Auto's summary; buttons bound to the step, replaced by who answered once answered), and for
each HITL implement-evaluate cycle four replies: its plan card, one progress message edited through the stages
(kernel vN implemented, compiling, testing, profiling, evaluated) and the self-debugger's fixes, one files message
per evaluation posted with its verdict (the evaluated kernel, its diff against the version before it and the
profile as a trace), and the result card. A fixed kernel's files come with its own evaluation; a kernel a
cancelled session never evaluated comes alone when the session ends. Auto edits one progress message for the
whole run and ends with the best kernel beside its summary. The profile chart is inside the result card:
uploaded without being shared, it is referred to by its upload's key (`file_ref`) and the notifier puts in the
file's id (`with_files`). Every message has a key unique in its session (a files message's is its kernel's file
name, and any of its files' names finds it again after a crash), so showing it again edits it and a retried
event posts nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.slack.views import kit
from bot.slack.views import session as blocks
from bot.speedup import speedup_text

Payload = dict[str, Any]


@dataclass(frozen=True)
class Show:
    """Post the message under `key`, or edit it when it is there already."""

    key: str
    payload: Payload
    in_thread: bool = True


@dataclass(frozen=True)
class File:
    filename: str
    content: bytes
    title: str


@dataclass(frozen=True)
class Upload:
    """Upload a file (and `more` in the same message, `comment` its text) under `key`. An upload that is not
    `shared` posts nothing: it is a picture a message shows (an `image` block holding `file_ref(key)`)."""

    key: str
    filename: str
    content: bytes
    title: str
    comment: str = ""
    more: tuple[File, ...] = ()
    shared: bool = True

    @property
    def files(self) -> tuple[File, ...]:
        return (File(self.filename, self.content, self.title), *self.more)


Op = Show | Upload
FILE_REF = "kernelbot-upload:"  # a slack_file id that stands for the id of the file uploaded under the key after it


def file_ref(key: str) -> str:
    return FILE_REF + key


def with_files(payload: Payload, file_ids: dict[str, str]) -> Payload:
    """The payload with each `file_ref(key)` replaced by the id of the file uploaded under that key; an image
    whose file was never uploaded is left out (Slack refuses a message that shows a file it does not have)."""
    blocks = []
    for block in payload.get("blocks") or []:
        ref = str((block.get("slack_file") or {}).get("id", "")) if block.get("type") == "image" else ""
        if ref.startswith(FILE_REF):
            file_id = file_ids.get(ref.removeprefix(FILE_REF))
            if not file_id:
                continue
            block = {**block, "slack_file": {"id": file_id}}
        blocks.append(block)
    return {**payload, "blocks": blocks} if "blocks" in payload else payload


def without_images(payload: Payload) -> Payload:
    """The payload without its pictures (what is left when Slack refuses a picture, e.g. one still processing)."""
    return {**payload, "blocks": [b for b in payload.get("blocks") or [] if b.get("type") != "image"]}


@dataclass(frozen=True)
class SessionView:
    id: str
    mode: str
    status: str
    task: str
    target: str
    owner: str | None
    shapes: str = ""
    max_iterations: int = 5
    max_debug_attempts: int = 3
    search_budget: int = 0
    in_parent_thread: bool = False  # started from another session's thread: its root is a reply there
    started_mode: str = ""  # the mode it started in (a hand-over changes `mode`)

    @property
    def running(self) -> bool:
        """Not finished: its running messages keep their Cancel buttons."""
        return self.status not in ("done", "cancelled", "failed")


@dataclass(frozen=True)
class Card:
    """What the message for a waiting (or answered) step shows; `kind` is plan | result | summary."""

    kind: str
    step: int
    plan: str = ""
    redirect: str | None = None
    outcome: dict[str, Any] = field(default_factory=dict)
    chart: bool = False  # a result card that shows its evaluation's profile chart (uploaded under `chart_key`)

    @property
    def key(self) -> str:
        return f"{'summary' if self.kind == 'summary' else 'card'}:{self.step}"

    @property
    def chart_key(self) -> str:
        return f"file:profile_{self.step}.png"


@dataclass(frozen=True)
class Progress:
    """Where the session stands now: Auto's iteration, the evaluations so far and the best kernel."""

    iteration: int = 0
    evaluations: int = 0
    best: str = ""
    duplicates: int = 0
    debug_attempts: int = 0  # self-debug rounds in the current cycle
    last_error: str = ""  # the kind of the error being fixed


@dataclass(frozen=True)
class EventView:
    id: int
    kind: str
    payload: dict[str, Any]
    at: float
    session: SessionView
    card: Card | None = None  # the card a paused event shows or a decision answers
    anchor: int | None = None  # the cycle's first candidate: its progress message is `progress:<anchor>`
    candidate: int | None = None  # the kernel whose files this event posts (`code`)
    version: int = 0  # which kernel of the session a candidate is (1, 2, ...)
    code: str | None = None  # a kernel just evaluated (HITL), or one a cancelled session never evaluated
    diff: str | None = None  # ... against the kernel before it
    chart: bytes | None = None  # the profile chart of the card's evaluation
    trace: bytes | None = None  # a profile as a Chrome trace (`timing.trace_export`): `code`'s, or Auto's best's
    kernel: str | None = None  # the best kernel, for a summary
    progress: Progress = field(default_factory=Progress)


def _who(user: str | None) -> str:
    return f"<@{user}>" if user else "someone"


def root(event: EventView, status: str) -> Show:
    s = event.session
    return Show("root", blocks.session_root(session_id=s.id, task=s.task, target=s.target, mode=s.mode,
                                            owner=s.owner, status=status, shapes=s.shapes,
                                            started_mode=s.started_mode),
                in_thread=s.in_parent_thread)


def card_payload(event: EventView, card: Card) -> Payload:
    s = event.session
    if card.kind == "plan":
        return blocks.plan_message(session_id=s.id, step=card.step, plan=card.plan, redirect=card.redirect)
    if card.kind == "summary":
        return blocks.auto_summary(session_id=s.id, step=card.step, outcome=card.outcome)
    return blocks.result_card(session_id=s.id, step=card.step, outcome=card.outcome,
                              chart=file_ref(card.chart_key) if card.chart else None)


def _auto(event: EventView, doing: str, *, running: bool = True) -> Show:
    p = event.progress
    return Show("auto", blocks.auto_progress(session_id=event.session.id, iteration=max(p.iteration, 1),
                                             max_iterations=event.session.max_iterations, doing=doing,
                                             evaluations=p.evaluations, best=p.best,
                                             running=running and event.session.running))


def _cycle(event: EventView, *, stage: str = "implemented", note: str = "", done: str = "") -> Show:
    title = f"Kernel v{event.version}" if event.version else "Kernel"
    return Show(f"progress:{event.anchor}", blocks.progress_message(title=title, stage=stage, note=note, done=done,
                                                                    session_id=event.session.id,
                                                                    running=event.session.running))


def _search(event: EventView, *, running: bool = True) -> Show:
    s, q = event.session, event.progress
    return Show("progress:search", blocks.search_progress(evaluations=q.evaluations, budget=s.search_budget,
                                                          best=q.best, duplicates=q.duplicates, session_id=s.id,
                                                          running=running and s.running))


def _kernel_files(event: EventView, how: str) -> list[Op]:
    """One message: the kernel, its diff against the version before it and the profile trace of its evaluation
    (`how` it went), those it has."""
    if event.code is None or event.candidate is None:
        return []
    n, v = event.candidate, event.version
    more, what = [], ["the code"]
    if event.diff:
        more.append(File(f"candidate_{n}.diff", event.diff.encode(), f"diff of kernel v{v} against v{v - 1}"))
        what.append(f"its diff against v{v - 1}")
    if event.trace:
        more.append(File(f"candidate_{n}.trace.json", event.trace,
                         f"profile trace of kernel v{v} (open in ui.perfetto.dev or chrome://tracing)"))
        what.append("its profile op by op (open the trace in ui.perfetto.dev)")
    listed = what[0] if len(what) == 1 else f"{', '.join(what[:-1])} and {what[-1]}"
    return [Upload(f"file:candidate_{n}.py", f"candidate_{n}.py", event.code.encode(), f"kernel v{v} (candidate {n})",
                   f"Kernel v{v}, {how}: {listed}.", more=tuple(more))]


def _chart_upload(event: EventView, card: Card) -> list[Op]:
    """The chart of the card's evaluation, uploaded unshared for the card to show."""
    if not event.chart:
        return []
    return [Upload(card.chart_key, f"profile_step{card.step}.png", event.chart, "profile chart", shared=False)]


def _step_ops(event: EventView) -> list[Op]:
    kind, p = event.payload.get("kind"), event.payload
    auto = event.session.mode == "auto"
    verdict = p.get("verdict")
    if kind == "plan":
        return [_auto(event, "planning")] if auto else [root(event, "plan ready: waiting for a decision")]
    if kind == "implement":
        if auto:
            return [_auto(event, f"implemented kernel v{event.version}; evaluating")]
        return [_cycle(event), root(event, f"evaluating kernel v{event.version}")]
    if kind == "debug":
        attempt = f"{event.progress.debug_attempts}/{event.session.max_debug_attempts}"
        error = event.progress.last_error or "the"
        if auto:
            return [_auto(event, f"fixing {error} error {attempt}")]
        return [_cycle(event, note=f"fixing {error} error {attempt}: the self-debugger wrote kernel v{event.version}")]
    if kind == "evaluate":
        line = f"evaluated: {p.get('message') or verdict}".strip()[:1500]
        if auto:
            return [_auto(event, f"kernel v{event.version}: {verdict}")]
        ops: list[Op] = [_cycle(event, done=line), *_kernel_files(event, f"evaluated ({verdict})")]
        if verdict not in ("ok", "unverified"):
            ops.append(root(event, f"kernel v{event.version}: {verdict}; the self-debugger is on it"))
        return ops
    if kind in ("analyse", "give_up"):
        if auto:
            return [_auto(event, f"iteration {event.progress.iteration} done")]
        return []
    return []


def _decision_status(p: dict[str, Any]) -> str:
    who = _who(p.get("actor"))
    return {
        "approve": f"approved by {who}: implementing", "redirect": f"redirected by {who}: re-planning",
        "iterate": f"{who} asked for another iteration: planning", "handoff": f"handed to Auto by {who}",
        "finish": f"finished by {who}", "cancel": f"cancelled by {who}", "adopt": f"kernel adopted by {who}",
        "search": f"{who} started a search from the best kernel", "handback": f"back in HITL ({who})",
    }.get(str(p.get("action")), f"{p.get('action')} by {who}")


def _best_line(event: EventView) -> str:
    p = event.payload
    if p.get("best_speedup") is None:
        return "no kernel faster than the reference yet"
    if not p.get("best_method"):  # an event stored before the method and the band were
        return f"best x{p['best_speedup']:.2f}"
    return f"best {speedup_text(p['best_speedup'], p['best_method'], p.get('best_band'))}"


def ops_for(event: EventView) -> list[Op]:
    """The posts, edits and uploads that show this event in its session's thread, in order."""
    p, s = event.payload, event.session
    if event.kind == "session_started":
        if s.mode == "search":
            return [root(event, f"searching ({p.get('strategy', 'beam')}, {s.search_budget} evaluations)"),
                    _search(event)]
        return [root(event, "planning")]
    if event.kind == "task_described":
        return [root(event, "planning")]
    if event.kind == "step":
        return _step_ops(event)
    if event.kind == "progress":
        stage = str(p.get("stage", "implemented"))
        if s.mode == "auto":
            return [_auto(event, f"kernel v{event.version}: {blocks.progress_text(stage)}")]
        return [_cycle(event, stage=stage)]
    if event.kind == "hitl_paused" and event.card is not None:
        ops: list[Op] = []
        if event.card.kind == "plan" and kit.too_long(event.card.plan):
            ops.append(Upload(f"file:plan_{event.card.step}.md", f"plan_step{event.card.step}.md",
                              event.card.plan.encode(), "the full plan", "The plan in full:"))
        ops += _chart_upload(event, event.card)
        ops.append(Show(event.card.key, card_payload(event, event.card)))
        waiting = "approval of the plan" if event.card.kind == "plan" else "a decision on the result"
        ops.append(root(event, f"waiting for {waiting}"))
        return ops
    if event.kind == "hitl_paused":
        return [root(event, str(p.get("stop_reason", "paused")))]
    if event.kind == "auto_paused":
        return [_auto(event, str(p.get("stop_reason", "paused")), running=False),
                root(event, str(p.get("stop_reason", "paused")))]
    if event.kind == "auto_finished" and event.card is not None:
        ops = [_auto(event, f"finished ({p.get('stop_reason')})", running=False)]
        if event.kernel is not None and p.get("best_candidate_id"):
            name = f"best_candidate_{p['best_candidate_id']}.py"
            trace = (File(f"best_candidate_{p['best_candidate_id']}.trace.json", event.trace,
                          "its profile trace (open in ui.perfetto.dev or chrome://tracing)"),) if event.trace else ()
            ops.append(Upload(f"file:{name}", name, event.kernel.encode(), "best kernel", more=trace))
        ops += [Show(event.card.key, card_payload(event, event.card)),
                root(event, f"Auto finished after {p.get('evaluations', 0)} evaluation(s): {_best_line(event)}")]
        return ops
    if event.kind in ("hitl_finished", "auto_finished"):
        return [*_kernel_files(event, f"not evaluated ({s.status})"),
                root(event, f"{'cancelled' if s.status == 'cancelled' else 'finished'}: {_best_line(event)}")]
    if event.kind == "decision":
        return _decision_ops(event)
    if event.kind == "job_done" and s.mode == "search":
        return [_search(event)]
    if event.kind == "search_finished":
        ops = [_search(event, running=False)]
        if event.kernel is not None and p.get("best_candidate_id"):
            name = f"best_candidate_{p['best_candidate_id']}.py"
            ops.append(Upload(f"file:{name}", name, event.kernel.encode(), "best kernel"))
        outcome = event.card.outcome if event.card else {}
        ops += [Show("summary:search", blocks.search_summary(outcome=outcome)),
                root(event, f"search finished after {p.get('evaluations', 0)} evaluation(s): {_best_line(event)}")]
        return ops
    if event.kind == "job_failed":
        reason = str(p.get("reason", "")).strip()[:1500]
        return [Show(f"event:{event.id}", blocks.notice(f":warning: A runner gave up on this session's "
                                                        f"`{p.get('kind')}` job: {reason}")),
                root(event, "failed: a runner job gave up (see the thread)")]
    return []


def _decision_ops(event: EventView) -> list[Op]:
    p = event.payload
    ops: list[Op] = []
    if event.card is not None:
        ops.append(Show(event.card.key, blocks.answered(card_payload(event, event.card), decision=str(p["action"]),
                                                         user=str(p.get("actor")), at=event.at, text=p.get("text"))))
    if p.get("via") == "thread" and p.get("action") == "redirect":
        ops.append(Show(f"event:{event.id}", blocks.notice(
            f"Taking {_who(p.get('actor'))}'s reply as a redirect: “{str(p.get('text') or '').strip()[:500]}”")))
    if p.get("action") == "handoff":
        ops.append(_auto(event, "starting"))
    if p.get("action") == "handback":
        ops.append(_auto(event, f"handed back to HITL by {_who(p.get('actor'))}", running=False))
    if p.get("action") == "cancel" and event.session.mode == "auto":
        ops.append(_auto(event, f"cancelled by {_who(p.get('actor'))}", running=False))
    elif p.get("action") == "cancel" and event.anchor is not None:  # a HITL cycle was running
        ops.append(_cycle(event, done=f"cancelled by {_who(p.get('actor'))}; the runner stops after its current stage"))
    ops.append(root(event, _decision_status(p)))
    return ops
