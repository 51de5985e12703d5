"""Render the documentation's pictures from the real product.

It serves kernelbot (`bot.slack.server.Server` over HTTP with an embedded runner and the offline brain) against the
tests' fake Slack, plays a team's afternoon through signed Slack requests - `/kernel new softmax`, a redirect by
a thread reply, the Redirect… modal, Approve, Hand off to Auto, a search, a session left waiting, `/kernel digest
now`, the App Home opened - and draws what the fake Slack then holds, the way Slack shows it: a white card per
message with its sender and time, mrkdwn (*bold*, _italic_, `code`, code blocks, mentions, links), context lines
in grey, buttons (primary green, danger red), files as chips and uploaded PNGs inline.

    .venv/bin/python docs/render_screens.py [--out docs/images]

Writes session-thread.png, plan-card.png, result-card.png, redirect-modal.png, app-home.png and digest.png
(about 30 s here).
"""

from __future__ import annotations

import argparse
import copy
import io
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' fake Slack and request helpers live beside the product

USERS = {"U1": "ana", "U9": "ben"}  # how the pictures name the fake workspace's people
CHANNELS = {"C1": "kernels"}
BOT_NAME = "kernelbot"
SESSION_TIMEOUT = 150.0  # seconds any one step of the story may take before the script gives up


# ==============================================================================================================
# Part 1: the story, played against the real app and the fake Slack
# ==============================================================================================================
@dataclass(frozen=True)
class SlackFile:
    name: str
    title: str
    content: bytes


@dataclass(frozen=True)
class Post:
    """One message as Slack holds it (a copy taken at some moment of the story)."""

    user: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    files: list[SlackFile]
    images: dict[str, SlackFile] = field(default_factory=dict)  # the files its image blocks show, by id


@dataclass
class Shots:
    thread: list[Post] = field(default_factory=list)  # the HITL session's thread at the end
    result: list[Post] = field(default_factory=list)  # the trace and the result card (its chart inside) while it waits
    plan: list[Post] = field(default_factory=list)  # a plan card while it waits for a decision
    modal: dict[str, Any] = field(default_factory=dict)  # the redirect modal as opened
    home: dict[str, Any] = field(default_factory=dict)  # ana's App Home
    digest: list[Post] = field(default_factory=list)  # the digest message and its chart


def _session_id(reply: dict[str, Any]) -> str:
    match = re.search(r"`([0-9a-f]{12})`", reply.get("text", ""))
    if not match:
        raise RuntimeError(f"the command was not taken: {reply}")
    return match.group(1)


class Story:
    """The served app, the fake Slack and the steps a person takes."""

    def __init__(self, url: str, slack: Any, server: Any):
        self.url, self.slack, self.server = url, slack, server

    def _file(self, file_id: str) -> SlackFile:
        stored = self.slack.files[file_id]
        return SlackFile(str(stored["name"]), str(stored.get("title") or ""), bytes(stored["content"] or b""))

    def post(self, m: Any) -> Post:
        shown = [str(b["slack_file"]["id"]) for b in m.blocks if b.get("type") == "image" and b.get("slack_file")]
        return Post(m.user, m.ts, m.text, copy.deepcopy(m.blocks),
                    [self._file(f) for f in m.files if f in self.slack.files],
                    {f: self._file(f) for f in shown if f in self.slack.files})

    def thread_ts(self, session_id: str) -> str | None:
        from sqlmodel import Session

        from storage import sessions

        with Session(self.server.engine) as s:
            return sessions.get_session(s, session_id=session_id).slack_thread_ts

    def thread(self, session_id: str) -> list[Any]:
        ts = self.thread_ts(session_id)
        with self.slack.lock:
            return list(self.slack.thread("C1", ts)) if ts else []

    def card(self, session_id: str, first_button: str, after: int = 0) -> Any:
        from tests.support.reading import buttons, wait_for

        def find() -> Any:
            found = [m for m in self.thread(session_id)[after:] if list(buttons(m))[:1] == [first_button]]
            return found[-1] if found else None

        return wait_for(f"a message with {first_button}", find, timeout=SESSION_TIMEOUT)

    def reply_in_thread(self, session_id: str, text: str, user: str = "U1") -> None:
        """What Slack does when a person replies in a thread: it keeps the message and delivers the event."""
        from tests.fakes.slack_api import Message
        from tests.support.slack_http import event

        root = self.thread_ts(session_id)
        with self.slack.lock:
            ts = self.slack._ts()
            self.slack.messages["C1"].append(Message(channel="C1", ts=ts, text=text, user=user, thread_ts=root))
        event(self.url, {"type": "message", "channel": "C1", "user": user, "text": text, "ts": ts,
                         "thread_ts": root})


@contextmanager
def served(home: Path) -> Iterator[Story]:
    from tests.support.bot import whole_server

    with whole_server(home) as (url, slack, server):
        yield Story(url, slack, server)


def play(story: Story, say: Callable[[str], None]) -> Shots:
    from tests.support.reading import buttons, text_of, wait_for
    from tests.support.slack_http import click, command, event

    shots = Shots()
    slack = story.slack
    sid = _session_id(command(story.url, "new softmax --brain offline --budget 2", fake=slack)[1])
    say(f"/kernel new softmax: session {sid}")
    story.card(sid, "approve")
    before = len(story.thread(sid))
    story.reply_in_thread(sid, "redirect: rows 64")  # addressed to the bot, as a redirect must be
    plan = story.card(sid, "approve", after=before)
    say("a thread reply redirected the plan")

    click(story.url, action_id="redirect", value=buttons(plan)["redirect"])
    shots.modal = copy.deepcopy(wait_for("the redirect modal", lambda: list(slack.views.values()))[-1])
    click(story.url, action_id="approve", value=buttons(plan)["approve"])
    result = story.card(sid, "iterate")
    thread = story.thread(sid)
    trace = next(m for m in thread if any(slack.files[f]["name"].endswith(".trace.json") for f in m.files))
    shots.result = [story.post(trace), story.post(result)]
    say("approved: the result card came")

    click(story.url, action_id="handoff", value=buttons(result)["handoff"])
    wait_for("Auto's summary", lambda: any("Auto finished" in text_of(m) and buttons(m) for m in story.thread(sid)),
             timeout=SESSION_TIMEOUT)
    say("handed off to Auto: its summary came")

    search = _session_id(command(story.url, "search layer_norm --strategy beam --budget 2 --brain offline",
                                 fake=slack)[1])
    waiting = _session_id(command(story.url, "new rms_norm --brain offline", fake=slack)[1])
    shots.plan = [story.post(story.card(waiting, "approve"))]
    wait_for("the search's summary", lambda: any("Search finished" in text_of(m) for m in story.thread(search)),
             timeout=SESSION_TIMEOUT)
    say("a search finished; another session waits for its plan's approval")

    command(story.url, "digest now", fake=slack)

    def digest_posts() -> list[Any]:
        with slack.lock:
            top = [m for m in slack.messages.get("C1", []) if m.thread_ts is None]
        heads = [i for i, m in enumerate(top) if "Kernel digest" in text_of(m)]
        if not heads or len(top) <= heads[-1] + 1 or not top[heads[-1] + 1].files:
            return []
        return top[heads[-1]:heads[-1] + 2]

    shots.digest = [story.post(m) for m in wait_for("the digest and its chart", digest_posts, timeout=60)]
    say("/kernel digest now: posted")

    event(story.url, {"type": "app_home_opened", "user": "U1", "channel": "D1", "tab": "home"})
    shots.home = copy.deepcopy(wait_for("the App Home", lambda: slack.home.get("U1"), timeout=30))
    wait_for("the root's last status", lambda: "Auto finished" in text_of(story.thread(sid)[0]), timeout=30)
    shots.thread = [story.post(m) for m in story.thread(sid)]
    return shots


# ==============================================================================================================
# Part 2: drawing Slack
# ==============================================================================================================
S = 1.5  # pixels per CSS pixel: crisp on a documentation page at ~900 px wide


def px(value: float) -> int:
    return round(value * S)


INK = (29, 28, 29)
GREY = (97, 96, 97)
LIGHT = (134, 134, 134)
BORDER = (221, 221, 221)
PAGE = (244, 244, 245)
WHITE = (255, 255, 255)
LINK = (18, 100, 163)
MENTION_BG = (232, 245, 250)
CODE_INK = (224, 30, 90)
CODE_BG = (246, 246, 246)
GREEN = (0, 122, 90)
RED = (224, 30, 90)
EMOJI = {":warning:": "⚠", ":white_check_mark:": "✔", ":hourglass_flowing_sand:": "⌛", ":x:": "✖"}
CARD_WIDTH = 760  # CSS pixels


class Fonts:
    """DejaVu from matplotlib's own data (there wherever the project is installed), by style and size."""

    FILES = {"regular": "DejaVuSans.ttf", "bold": "DejaVuSans-Bold.ttf", "italic": "DejaVuSans-Oblique.ttf",
             "bolditalic": "DejaVuSans-BoldOblique.ttf", "mono": "DejaVuSansMono.ttf",
             "monobold": "DejaVuSansMono-Bold.ttf"}

    def __init__(self) -> None:
        import matplotlib

        self.root = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
        self._cache: dict[tuple[str, int], ImageFont.FreeTypeFont] = {}

    def get(self, kind: str, size: float) -> ImageFont.FreeTypeFont:
        key = (kind, px(size))
        if key not in self._cache:
            self._cache[key] = ImageFont.truetype(str(self.root / self.FILES[kind]), key[1])
        return self._cache[key]

    def for_style(self, style: frozenset[str], size: float) -> ImageFont.FreeTypeFont:
        if "code" in style or "pre" in style:
            return self.get("monobold" if "b" in style else "mono", size - 1)
        kind = ("bold" if "b" in style else "") + ("italic" if "i" in style else "")
        return self.get(kind or "regular", size)


FONTS = Fonts()


# -- mrkdwn -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    text: str
    style: frozenset[str] = frozenset()


_ENTITY = re.compile(r"`[^`\n]+`|<[^<>\n]+>")
_EMPHASIS = {"b": re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?!\w)"),
             "i": re.compile(r"(?<![\w])_(?=[^\s_])(.+?)(?<=[^\s_])_(?!\w)"),
             "s": re.compile(r"(?<![\w~])~(?=[^\s~])(.+?)(?<=[^\s~])~(?!\w)")}
_PRIVATE = 0xE000  # placeholders for code spans and <...> entities while emphasis is read


def _unescape(text: str) -> str:
    for code, char in EMOJI.items():
        text = text.replace(code, char)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _slack_date(inner: str) -> str:
    """`!date^UNIX^FORMAT|fallback` as Slack shows it to a reader (the pictures' reader is in UTC)."""
    stamp, pattern = inner.split("|", 1)[0].split("^")[1:3]
    t = int(stamp)
    days = (int(time.time()) // 86400) - (t // 86400)
    pretty = {0: "Today", 1: "Yesterday"}.get(days, time.strftime("%b %-d", time.gmtime(t)))
    return (pattern.replace("{date_short_pretty}", pretty).replace("{time}", time.strftime("%H:%M", time.gmtime(t)))
            .replace("{date_short}", time.strftime("%b %-d", time.gmtime(t))))


def _entity(raw: str) -> tuple[str, frozenset[str]]:
    """What Slack shows for a code span, a mention, a date or a link."""
    if raw.startswith("`"):
        return _unescape(raw[1:-1]), frozenset({"code"})
    inner = raw[1:-1]
    if inner.startswith("@"):
        return "@" + USERS.get(inner[1:].split("|")[0], inner[1:]), frozenset({"mention"})
    if inner.startswith("#"):
        channel = inner[1:].split("|")
        return "#" + (channel[1] if len(channel) > 1 else CHANNELS.get(channel[0], channel[0])), frozenset({"link"})
    if inner.startswith("!date^"):
        return _slack_date(inner), frozenset()
    if inner.startswith("!"):
        return _unescape(inner.split("|", 1)[1] if "|" in inner else inner[1:]), frozenset()
    label = inner.split("|", 1)[1] if "|" in inner else inner
    return _unescape(label), frozenset({"link"})


def parse_line(line: str, base: frozenset[str] = frozenset()) -> list[Run]:
    """One line of mrkdwn -> styled runs (b, i, s, code, mention, link); a code block's lines stay literal."""
    if "pre" in base:
        return [Run(_unescape(line), base)]
    entities: list[str] = []

    def hold(match: re.Match[str]) -> str:
        entities.append(match.group(0))
        return chr(_PRIVATE + len(entities) - 1)

    held = _ENTITY.sub(hold, line)
    styles: list[set[str]] = [set(base) for _ in held]
    dropped: set[int] = set()
    for style, pattern in _EMPHASIS.items():
        for match in pattern.finditer(held):
            dropped.update((match.start(), match.end() - 1))
            for i in range(match.start(1), match.end(1)):
                styles[i].add(style)
    runs: list[Run] = []

    def add(text: str, style: frozenset[str]) -> None:
        if runs and runs[-1].style == style:
            runs[-1] = Run(runs[-1].text + text, style)
        else:
            runs.append(Run(text, style))

    plain = ""
    plain_style: frozenset[str] = frozenset(base)
    for i, char in enumerate(held):
        if i in dropped:
            continue
        style = frozenset(styles[i])
        if _PRIVATE <= ord(char) < _PRIVATE + len(entities):
            if plain:
                add(_unescape(plain), plain_style)
                plain = ""
            text, extra = _entity(entities[ord(char) - _PRIVATE])
            add(text, style | extra)
            continue
        if style != plain_style and plain:
            add(_unescape(plain), plain_style)
            plain = ""
        plain, plain_style = plain + char, style
    if plain:
        add(_unescape(plain), plain_style)
    return runs


# -- boxes: something of a known size that paints itself ----------------------------------------------------
@dataclass
class Box:
    width: int
    height: int
    paint: Callable[[Image.Image, int, int], None]
    lines: int = 0  # text lines shown (text boxes)
    cut: bool = False  # text was left out (Slack's "Show more")


def vstack(boxes: list[Box], gap: float = 0) -> Box:
    width = max((b.width for b in boxes), default=0)
    height = sum(b.height for b in boxes) + px(gap) * max(len(boxes) - 1, 0)

    def paint(img: Image.Image, x: int, y: int) -> None:
        for box in boxes:
            box.paint(img, x, y)
            y += box.height + px(gap)

    return Box(width, height, paint)


def spacer(height: float) -> Box:
    return Box(0, px(height), lambda img, x, y: None)


@dataclass
class _Placed:
    x: int
    text: str
    style: frozenset[str]
    width: int


def _tokens(runs: list[Run]) -> Iterator[tuple[str, frozenset[str]]]:
    for run in runs:
        for piece in re.split(r"( +)", run.text):
            if piece:
                yield piece, run.style


def _wrap(lines: list[list[Run]], width: int, size: float) -> list[list[_Placed]]:
    """Greedy word wrap; a word longer than a line is cut where it fills the line."""
    out: list[list[_Placed]] = []
    for runs in lines:
        line: list[_Placed] = []
        x = 0
        for text, style in _tokens(runs):
            font = FONTS.for_style(style, size)
            if text.isspace():
                if line:
                    w = round(font.getlength(text))
                    line.append(_Placed(x, text, style, w))
                    x += w
                continue
            while text:
                w = round(font.getlength(text))
                if x + w <= width:
                    line.append(_Placed(x, text, style, w))
                    x += w
                    break
                if line and w <= width:
                    out.append(_trim(line))
                    line, x = [], 0
                    continue
                fits = [n for n in range(1, len(text)) if x + font.getlength(text[:n]) <= width]
                if not fits and line:
                    out.append(_trim(line))
                    line, x = [], 0
                    continue
                n = fits[-1] if fits else 1
                line.append(_Placed(x, text[:n], style, round(font.getlength(text[:n]))))
                out.append(_trim(line))
                line, x = [], 0
                text = text[n:]
        out.append(_trim(line))
    return out


def _trim(line: list[_Placed]) -> list[_Placed]:
    while line and line[-1].text.isspace():
        line.pop()
    return line


def text_box(text: str, width: int, *, size: float = 15, color: tuple[int, int, int] = INK,
             max_lines: int | None = None, base: frozenset[str] = frozenset(), line_height: float = 1.45) -> Box:
    """Wrapped mrkdwn, cut after `max_lines` lines (`cut` says so)."""
    lines = _wrap([parse_line(line, base) for line in text.split("\n")], width, size)
    cut = max_lines is not None and len(lines) > max_lines
    if max_lines is not None:
        lines = lines[:max_lines]
    step = px(size * line_height)
    pre = "pre" in base

    def paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        for n, line in enumerate(lines):
            top = y + n * step
            baseline = top + round(step * 0.74)
            for group in _groups(line, ("code", "mention")):
                first, last = group[0], group[-1]
                kind = "code" if "code" in first.style else "mention"
                fill, outline = (CODE_BG, BORDER) if kind == "code" else (MENTION_BG, None)
                draw.rounded_rectangle((x + first.x - px(2), top + px(2), x + last.x + last.width + px(2),
                                        top + step - px(2)), radius=px(3), fill=fill, outline=outline)
            for item in line:
                if item.text.isspace():
                    continue
                font = FONTS.for_style(item.style, size)
                ink = color
                if "code" in item.style and not pre:
                    ink = CODE_INK
                elif item.style & {"link", "mention"}:
                    ink = LINK
                draw.text((x + item.x, baseline), item.text, font=font, fill=ink, anchor="ls")
                if "s" in item.style:
                    mid = baseline - px(size * 0.3)
                    draw.line((x + item.x, mid, x + item.x + item.width, mid), fill=ink, width=max(1, px(1)))

    return Box(width, step * len(lines), paint, lines=len(lines), cut=cut)


def _groups(line: list[_Placed], kinds: tuple[str, ...]) -> list[list[_Placed]]:
    """Neighbouring pieces of one code span or mention (spaces included), to share one background."""
    groups: list[list[_Placed]] = []
    for item in line:
        kind = next((k for k in kinds if k in item.style), None)
        if kind and groups and groups[-1] and kind in groups[-1][-1].style:
            groups[-1].append(item)
        elif kind:
            groups.append([item])
        else:
            groups.append([])
    return [g for g in groups if g]


def code_block_box(text: str, width: int, max_lines: int | None = None) -> Box:
    pad = px(8)
    inner = text_box(text, width - 2 * pad, size=13, base=frozenset({"pre"}), max_lines=max_lines, line_height=1.4)

    def paint(img: Image.Image, x: int, y: int) -> None:
        ImageDraw.Draw(img).rounded_rectangle((x, y, x + width, y + inner.height + 2 * pad), radius=px(4),
                                              fill=(248, 248, 248), outline=BORDER)
        inner.paint(img, x + pad, y + pad)

    return Box(width, inner.height + 2 * pad, paint, lines=inner.lines, cut=inner.cut)


def mrkdwn_box(text: str, width: int, *, max_lines: int | None = None) -> Box:
    """A section's text: mrkdwn with ``` blocks; past `max_lines` lines, cut with Slack's "Show more"."""
    boxes: list[Box] = []
    left = max_lines
    parts = [(i % 2 == 1, part.strip("\n")) for i, part in enumerate(text.split("```"))]
    parts = [(code, part) for code, part in parts if part]
    for n, (code, part) in enumerate(parts):
        box = code_block_box(part, width, max_lines=left) if code else text_box(part, width, max_lines=left)
        boxes.append(box)
        if left is not None:
            left -= box.lines
            if box.cut or (left <= 0 and n + 1 < len(parts)):
                boxes.append(text_box("<more|Show more>", width))
                break
    return vstack(boxes, gap=4)


def button_box(label: str, style: str | None) -> Box:
    font = FONTS.get("bold", 14)
    width, height = round(font.getlength(label)) + px(24), px(30)
    fill, ink, outline = {"primary": (GREEN, WHITE, GREEN), "danger": (RED, WHITE, RED)}.get(
        style or "", (WHITE, INK, (187, 187, 187)))

    def paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        draw.rounded_rectangle((x, y, x + width, y + height), radius=px(4), fill=fill, outline=outline,
                               width=max(1, px(1)))
        draw.text((x + width // 2, y + height // 2), label, font=font, fill=ink, anchor="mm")

    return Box(width, height, paint)


def actions_box(elements: list[dict[str, Any]], width: int) -> Box:
    buttons = [button_box(e["text"]["text"], e.get("style")) for e in elements if e.get("type") == "button"]
    rows: list[list[Box]] = [[]]
    used = 0
    for b in buttons:
        if rows[-1] and used + b.width > width:
            rows.append([])
            used = 0
        rows[-1].append(b)
        used += b.width + px(8)
    row_h = px(30)

    def paint(img: Image.Image, x: int, y: int) -> None:
        for r, row in enumerate(rows):
            cx = x
            for b in row:
                b.paint(img, cx, y + r * (row_h + px(8)))
                cx += b.width + px(8)

    return Box(width, len(rows) * row_h + (len(rows) - 1) * px(8), paint)


def context_box(elements: list[dict[str, Any]], width: int) -> Box:
    text = "  ".join(str(e.get("text", "")) for e in elements if isinstance(e.get("text"), str))
    return text_box(text, width, size=13, color=GREY, line_height=1.4)


def header_box(text: str, width: int) -> Box:
    return text_box(text, width, size=18, base=frozenset({"b"}), line_height=1.4)


FILE_KINDS = {".py": ("PY", (54, 118, 191), "Python"), ".diff": ("DIFF", (46, 160, 67), "Diff"),
              ".md": ("MD", (97, 96, 97), "Markdown"), ".png": ("PNG", (232, 145, 45), "PNG"),
              ".json": ("JSON", (97, 96, 97), "JSON")}


def file_chip_box(file: SlackFile) -> Box:
    width, height = px(380), px(58)
    tag, color, kind = FILE_KINDS.get(Path(file.name).suffix, ("FILE", LIGHT, "File"))
    lines = file.content.decode(errors="replace").count("\n") if kind != "PNG" else 0

    def paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        draw.rounded_rectangle((x, y, x + width, y + height), radius=px(8), fill=WHITE, outline=BORDER,
                               width=max(1, px(1)))
        icon = px(38)
        ix, iy = x + px(10), y + (height - icon) // 2
        draw.rounded_rectangle((ix, iy, ix + icon, iy + icon), radius=px(6), fill=color)
        draw.text((ix + icon // 2, iy + icon // 2), tag, font=FONTS.get("bold", 10 if len(tag) > 2 else 12),
                  fill=WHITE, anchor="mm")
        tx = ix + icon + px(12)
        draw.text((tx, y + px(25)), file.name, font=FONTS.get("bold", 14), fill=INK, anchor="ls")
        detail = f"{kind} · {lines} lines" if lines else kind
        draw.text((tx, y + px(44)), detail, font=FONTS.get("regular", 12), fill=GREY, anchor="ls")

    return Box(width, height, paint)


def image_box(file: SlackFile, max_width: int) -> Box:
    """An uploaded image as Slack shows it: its name above, the picture scaled to fit, a thin border."""
    picture = Image.open(io.BytesIO(file.content)).convert("RGB")
    scale = min(max_width / picture.width, px(420) / picture.height, S)
    shown = picture.resize((round(picture.width * scale), round(picture.height * scale)), Image.Resampling.LANCZOS)
    label = text_box(f"{file.name} ▾", max_width, size=12, color=GREY)

    def paint(img: Image.Image, x: int, y: int) -> None:
        label.paint(img, x, y)
        top = y + label.height + px(4)
        img.paste(shown, (x, top))
        ImageDraw.Draw(img).rounded_rectangle((x, top, x + shown.width, top + shown.height), radius=px(6),
                                              outline=BORDER, width=max(1, px(1)))

    return Box(max(shown.width, label.width), label.height + px(4) + shown.height, paint)


def input_box(block: dict[str, Any], width: int) -> Box:
    label = text_box(block["label"]["text"], width, size=15, base=frozenset({"b"}))
    element = block.get("element", {})
    height = px(90) if element.get("multiline") else px(38)
    hint = (element.get("placeholder") or {}).get("text", "")

    def paint(img: Image.Image, x: int, y: int) -> None:
        label.paint(img, x, y)
        top = y + label.height + px(6)
        draw = ImageDraw.Draw(img)
        draw.rounded_rectangle((x, top, x + width, top + height), radius=px(6), fill=WHITE, outline=(134, 134, 134),
                               width=max(1, px(1)))
        draw.text((x + px(12), top + px(22)), hint, font=FONTS.get("regular", 15), fill=LIGHT, anchor="ls")

    return Box(width, label.height + px(6) + height, paint)


def with_accessory(block: dict[str, Any], width: int, *, max_lines: int | None = None) -> Box:
    """A section with a button beside its text, on the right, as Slack lays it out."""
    accessory = block["accessory"]
    button = button_box(accessory["text"]["text"], accessory.get("style"))
    body = mrkdwn_box(block["text"]["text"], width - button.width - px(12), max_lines=max_lines)

    def paint(img: Image.Image, x: int, y: int) -> None:
        body.paint(img, x, y)
        button.paint(img, x + width - button.width, y)

    return Box(width, max(body.height, button.height), paint)


def fields_box(fields: list[dict[str, Any]], width: int) -> Box:
    """A section's fields as Slack lays them out: two a row."""
    gap = px(16)
    column = (width - gap) // 2
    rows = []
    for i in range(0, len(fields), 2):
        pair = [mrkdwn_box(f["text"], column) for f in fields[i:i + 2]]

        def paint(img: Image.Image, x: int, y: int, pair: list[Box] = pair) -> None:
            for j, box in enumerate(pair):
                box.paint(img, x + j * (column + gap), y)

        rows.append(Box(width, max(b.height for b in pair), paint))
    return vstack(rows, gap=4)


def blocks_box(blocks: list[dict[str, Any]], width: int, *, max_lines: int | None = None,
               images: dict[str, SlackFile] | None = None) -> Box:
    boxes: list[Box] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "image" and (images or {}).get(str((block.get("slack_file") or {}).get("id"))):
            boxes.append(image_box((images or {})[str(block["slack_file"]["id"])], width))
        elif kind == "section" and (block.get("accessory") or {}).get("type") == "button":
            boxes.append(with_accessory(block, width, max_lines=max_lines))
        elif kind == "section":
            if block.get("text"):
                boxes.append(mrkdwn_box(block["text"]["text"], width, max_lines=max_lines))
            if block.get("fields"):
                boxes.append(fields_box(block["fields"], width))
        elif kind == "context":
            boxes.append(context_box(block.get("elements", []), width))
        elif kind == "actions":
            boxes += [spacer(2), actions_box(block.get("elements", []), width)]
        elif kind == "header":
            boxes.append(header_box(block["text"]["text"], width))
        elif kind == "divider":
            boxes.append(Box(width, px(9), lambda img, x, y, w=width: ImageDraw.Draw(img).line(
                (x, y + px(4), x + w, y + px(4)), fill=BORDER, width=max(1, px(1)))))
        elif kind == "input":
            boxes.append(input_box(block, width))
    return vstack(boxes, gap=6)


# -- messages and pages -----------------------------------------------------------------------------------------
def avatar(img: Image.Image, x: int, y: int, user: str) -> None:
    size = px(36)
    draw = ImageDraw.Draw(img)
    color, letters = ((74, 21, 75), "kb") if user not in USERS else ((232, 145, 45), USERS[user][:1].upper())
    draw.rounded_rectangle((x, y, x + size, y + size), radius=px(6), fill=color)
    draw.text((x + size // 2, y + size // 2), letters, font=FONTS.get("bold", 15), fill=WHITE, anchor="mm")


def message_box(post: Post, width: int, *, max_lines: int | None = None) -> Box:
    """A white card: avatar, name (with the APP badge for the bot), time, then what the message shows."""
    pad, side = px(14), px(36) + px(10)
    inner = width - 2 * pad - side
    content: list[Box] = []
    if post.blocks:
        content.append(blocks_box(post.blocks, inner, max_lines=max_lines, images=post.images))
    elif post.text:
        content.append(mrkdwn_box(post.text, inner, max_lines=max_lines))
    for f in post.files:
        content.append(image_box(f, inner) if f.name.endswith(".png") else file_chip_box(f))
    body = vstack(content, gap=8)
    head = px(22)
    height = pad + head + px(4) + body.height + pad
    name = USERS.get(post.user, BOT_NAME)
    stamp = time.strftime("%H:%M", time.gmtime(float(post.ts)))

    def paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        draw.rounded_rectangle((x, y, x + width, y + height), radius=px(8), fill=WHITE, outline=(226, 226, 228),
                               width=max(1, px(1)))
        avatar(img, x + pad, y + pad, post.user)
        tx, baseline = x + pad + side, y + pad + px(15)
        bold = FONTS.get("bold", 15)
        draw.text((tx, baseline), name, font=bold, fill=INK, anchor="ls")
        tx += round(bold.getlength(name)) + px(6)
        if post.user not in USERS:
            badge = FONTS.get("bold", 10)
            bw = round(badge.getlength("APP")) + px(8)
            draw.rounded_rectangle((tx, baseline - px(12), tx + bw, baseline + px(2)), radius=px(3),
                                   fill=(232, 232, 232))
            draw.text((tx + bw // 2, baseline - px(5)), "APP", font=badge, fill=GREY, anchor="mm")
            tx += bw + px(6)
        draw.text((tx, baseline), stamp, font=FONTS.get("regular", 12), fill=LIGHT, anchor="ls")
        body.paint(img, x + pad + side, y + pad + head + px(4))

    return Box(width, height, paint)


def title_bar(width: int, title: str, subtitle: str = "") -> Box:
    height = px(48)

    def paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        draw.rectangle((x, y, x + width, y + height), fill=WHITE)
        draw.line((x, y + height - 1, x + width, y + height - 1), fill=BORDER, width=max(1, px(1)))
        bold = FONTS.get("bold", 17)
        draw.text((x + px(16), y + height // 2), title, font=bold, fill=INK, anchor="lm")
        if subtitle:
            draw.text((x + px(16) + round(bold.getlength(title)) + px(10), y + height // 2), subtitle,
                      font=FONTS.get("regular", 14), fill=GREY, anchor="lm")

    return Box(width, height, paint)


def replies_rule(width: int, count: int) -> Box:
    def paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        label = f"{count} replies"
        font = FONTS.get("regular", 13)
        draw.text((x, y + px(10)), label, font=font, fill=GREY, anchor="lm")
        start = x + round(font.getlength(label)) + px(10)
        draw.line((start, y + px(10), x + width, y + px(10)), fill=BORDER, width=max(1, px(1)))

    return Box(width, px(20), paint)


def page(header: Box | None, body: list[Box], width: int, *, gap: float = 8) -> Image.Image:
    margin = px(14)
    stack = vstack(body, gap=gap)
    top = header.height if header else 0
    img = Image.new("RGB", (width, top + stack.height + 2 * margin), PAGE)
    if header:
        header.paint(img, 0, 0)
    stack.paint(img, margin, top + margin)
    return img


def render_thread(posts: list[Post]) -> Image.Image:
    width = px(CARD_WIDTH)
    cards = [message_box(p, width - 2 * px(14), max_lines=9) for p in posts]
    body = [cards[0], replies_rule(width - 2 * px(14), len(posts) - 1), *cards[1:]]
    return page(title_bar(width, "Thread", f"# {CHANNELS['C1']}"), body, width)


def render_cards(posts: list[Post], max_lines: int | None = None) -> Image.Image:
    width = px(CARD_WIDTH)
    return page(None, [message_box(p, width - 2 * px(14), max_lines=max_lines) for p in posts], width)


def render_channel(posts: list[Post]) -> Image.Image:
    width = px(CARD_WIDTH)
    return page(title_bar(width, f"# {CHANNELS['C1']}"), [message_box(p, width - 2 * px(14)) for p in posts], width)


def render_home(view: dict[str, Any]) -> Image.Image:
    width = px(CARD_WIDTH)
    pad = px(20)
    content = blocks_box(view.get("blocks", []), width - 2 * px(14) - 2 * pad)

    def bar_paint(img: Image.Image, x: int, y: int) -> None:
        draw = ImageDraw.Draw(img)
        draw.rectangle((x, y, x + width, y + px(84)), fill=WHITE)
        avatar(img, x + px(16), y + px(10), "UBOT")
        draw.text((x + px(62), y + px(28)), BOT_NAME, font=FONTS.get("bold", 17), fill=INK, anchor="lm")
        tab_x = x + px(16)
        for i, tab in enumerate(("Home", "Messages", "About")):
            font = FONTS.get("bold" if i == 0 else "regular", 14)
            draw.text((tab_x, y + px(68)), tab, font=font, fill=INK if i == 0 else GREY, anchor="ls")
            if i == 0:
                draw.line((tab_x, y + px(82), tab_x + round(font.getlength(tab)), y + px(82)), fill=GREEN,
                          width=px(3))
            tab_x += round(font.getlength(tab)) + px(24)
        draw.line((x, y + px(84), x + width, y + px(84)), fill=BORDER, width=max(1, px(1)))

    def panel_paint(img: Image.Image, x: int, y: int) -> None:
        ImageDraw.Draw(img).rounded_rectangle((x, y, x + content.width + 2 * pad, y + content.height + 2 * pad),
                                              radius=px(8), fill=WHITE, outline=(226, 226, 228))
        content.paint(img, x + pad, y + pad)

    panel = Box(content.width + 2 * pad, content.height + 2 * pad, panel_paint)
    return page(Box(width, px(85), bar_paint), [panel], width)


def render_modal(view: dict[str, Any], behind: Image.Image) -> Image.Image:
    """The modal over the (dimmed) thread it was opened from."""
    width = px(520)
    pad = px(22)
    content = blocks_box(view.get("blocks", []), width - 2 * pad)
    buttons = [button_box(view["close"]["text"], None), button_box(view["submit"]["text"], "primary")]
    head, foot = px(60), px(66)
    height = head + content.height + 2 * pad + foot
    backdrop = behind.crop((0, 0, behind.width, max(height + px(80), px(420))))
    backdrop = Image.blend(backdrop, Image.new("RGB", backdrop.size, (40, 40, 40)), 0.55)
    x, y = (backdrop.width - width) // 2, px(40)
    draw = ImageDraw.Draw(backdrop)
    draw.rounded_rectangle((x, y, x + width, y + height), radius=px(10), fill=WHITE)
    draw.text((x + pad, y + head // 2), view["title"]["text"], font=FONTS.get("bold", 20), fill=INK, anchor="lm")
    draw.text((x + width - pad, y + head // 2), "✕", font=FONTS.get("regular", 18), fill=GREY, anchor="rm")
    draw.line((x, y + head, x + width, y + head), fill=BORDER, width=max(1, px(1)))
    content.paint(backdrop, x + pad, y + head + pad)
    fy = y + head + content.height + 2 * pad
    draw.line((x, fy, x + width, fy), fill=BORDER, width=max(1, px(1)))
    bx = x + width - pad - sum(b.width for b in buttons) - px(10)
    for b in buttons:
        b.paint(backdrop, bx, fy + (foot - b.height) // 2)
        bx += b.width + px(10)
    return backdrop


def save(img: Image.Image, path: Path) -> int:
    """A palette PNG: these pictures are mostly flat colour, so 256 colours keep them sharp and small."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return path.stat().st_size


def render_all(shots: Shots, out: Path) -> dict[str, int]:
    thread = render_thread(shots.thread)
    pictures = {
        "session-thread.png": thread,
        "result-card.png": render_cards(shots.result),
        "plan-card.png": render_cards(shots.plan, max_lines=16),
        "redirect-modal.png": render_modal(shots.modal, thread),
        "app-home.png": render_home(shots.home),
        "digest.png": render_channel(shots.digest),
    }
    return {name: save(img, out / name) for name, img in pictures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the PNGs go")
    args = parser.parse_args(argv)
    start = time.monotonic()

    def say(what: str) -> None:
        print(f"[{time.monotonic() - start:5.1f} s] {what}", flush=True)

    with tempfile.TemporaryDirectory(prefix="kernelbot-screens-") as home, served(Path(home)) as story:
        shots = play(story, say)
    for name, size in render_all(shots, args.out).items():
        say(f"wrote {args.out / name} ({size / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
