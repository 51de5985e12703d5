"""Normalised lowered IR: two candidates that lower to the same program get the same digest.

What differs between textually different but identical programs is removed: source locations (also the ones
Mosaic keeps inside a kernel body), the names of the candidate's functions and kernels, and the kernel body's
encoding (hashed after the kernel's name is replaced). What the compiler acts on - shapes, ops, block specs,
grid, dimension semantics, VMEM limits, cost estimates - is kept.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

_DEBUG_LOCATIONS = re.compile(r',?\s*\\22debug_locations\\22: \\22[A-Za-z0-9+/=]*\\22')
_BODY = re.compile(r'\\22body\\22: \\22([A-Za-z0-9+/=]*)\\22')
_KERNEL_NAME = re.compile(r'kernel_name = "([^"]*)"')
_LOC = re.compile(r'\s*loc\((?:[^()]|\([^()]*\))*\)')
_LOC_LINE = re.compile(r'^#loc.*$\n?', re.MULTILINE)
_SYMBOL = re.compile(r'@([A-Za-z_][\w.$-]*)')
_KEEP_SYMBOLS = {"main", "mesh", "tpu_custom_call"}


def _kernel_names(text: str) -> list[str]:
    return sorted(set(_KERNEL_NAME.findall(text)), key=len, reverse=True)


def _normalised_body(encoded: str, kernel_names: list[str]) -> str:
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return hashlib.sha256(encoded.encode()).hexdigest()
    for name in kernel_names:
        raw = raw.replace(name.encode(), b"kernel")
    return hashlib.sha256(raw).hexdigest()


def normalise(text: str) -> str:
    """The lowered module's text with names, locations and encodings made canonical."""
    names = _kernel_names(text)
    text = _DEBUG_LOCATIONS.sub("", text)
    text = _BODY.sub(lambda m: f"\\22body\\22: \\22{_normalised_body(m.group(1), names)}\\22", text)
    text = _KERNEL_NAME.sub('kernel_name = "kernel"', text)
    text = _LOC_LINE.sub("", _LOC.sub("", text))
    renamed: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in _KEEP_SYMBOLS:
            return match.group(0)
        return "@" + renamed.setdefault(name, f"f{len(renamed)}")

    return _SYMBOL.sub(rename, text)


def ir_digest(texts: list[str]) -> str:
    """One digest for a candidate's lowered programs (one per configuration)."""
    h = hashlib.sha256()
    for text in texts:
        h.update(normalise(text).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]
