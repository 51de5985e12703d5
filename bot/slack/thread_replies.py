"""Which replies in a session's thread are meant for the bot. People talk in threads ("looks good!"); only a
reply addressed to the bot steers it: one that mentions the bot, or one that starts with `redirect:`. Pure."""

from __future__ import annotations

import re

REDIRECT_KEYWORD = "redirect:"
_KEYWORD = re.compile(r"^\s*redirect\s*:\s*", re.IGNORECASE)
_LEADING = re.compile(r"^[\s:,;.\-–—]+")


def addressed_text(text: str, *, bot_user: str | None) -> str | None:
    """The instruction in a reply addressed to the bot, with the mention and the keyword taken out; None when the
    reply is conversation (or holds nothing but the address)."""
    mention = re.compile(rf"<@{re.escape(bot_user)}(?:\|[^>]*)?>") if bot_user else None
    if mention is not None and mention.search(text):
        rest = _LEADING.sub("", mention.sub(" ", text))
        rest = _KEYWORD.sub("", rest)
    elif _KEYWORD.match(text):
        rest = _KEYWORD.sub("", text)
    else:
        return None
    rest = re.sub(r"[ \t]{2,}", " ", rest).strip()  # where a mention was taken out of the middle
    return rest or None
