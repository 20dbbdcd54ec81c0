"""Text as a person reads it in pictures, reports and listings: a token's whitespace made visible, a
character that does not print as its escape, and names sorted by the numbers inside them.

    token_label(" the\n")                     # '␣the↵': a token's text with its whitespace made visible
    visible("a\rb")                           # 'a\\x0db': every character that does not print, escaped
    sorted(names, key=natural_key)            # h.2 before h.10: modules by depth, as every listing orders them
"""

from __future__ import annotations

import re

WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥"}  # how a token's whitespace is shown (plot, report, grids)


def token_label(text: str, special: str = "<empty>") -> str:
    """A token's text as a label that can be seen: each space, newline and tab as a sign (WHITESPACE),
    any other character that does not print as its escape (\\x0d, \\u200b); `special` (`<bos>`,
    ...) where the text is empty (a special token decodes to nothing). Plain text, never markup: a
    report escapes it where it is drawn."""
    if not text:
        return special
    return "".join(WHITESPACE.get(c) or (c if c.isprintable() else _escaped(c)) for c in text)


def visible(text: str) -> str:
    """`text` with each character that does not print (a carriage return, an ESC, a tab) as its escape
    (\\x0d), newlines kept: matplotlib stopped drawing a title at a carriage return, so a class
    name 'a\\rb' hid the rest of its caption. Running it twice changes nothing."""
    return "".join(c if c == "\n" or c.isprintable() else _escaped(c) for c in str(text))


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def natural_key(text: str) -> list:
    """Sort key that orders the numbers inside names by value: features.4 before features.10 (HDF5
    lists a file's groups in text order: h.10, h.11 before h.2)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]
