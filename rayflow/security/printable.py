"""Text from a cluster, a log or a store, made safe to print: data, never terminal commands.

A job's log, a kept cluster's detail, an error a head answered: whoever wrote them can put
escape sequences in them, and a terminal acts on those: OSC 52 writes the user's clipboard, CSI
moves the cursor or clears the screen (hiding what came before), a carriage return or backspace
overwrites a line, and a bidi override (U+202E) shows text in another order than it is. So every
such text goes through `printable` where rayflow prints it, after its secrets are masked: each
control character but newline and tab is shown as its escape (`\\x1b`, `\\x9b`, `\\u202e`).
rayflow's own output (its progress line's `\\r\\033[K`) is not passed through it.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI, 0x9d OSC), the
# bidirectional overrides, embeddings, isolates and marks, and the line and paragraph separators
# (a terminal may show them as line ends).
_UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escaped(match: re.Match) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control character but newline and tab escaped (`\\x1b[2J` is shown as
    those characters, not acted on), and bidirectional controls (U+202E) shown as `\\u202e`."""
    return _UNPRINTABLE.sub(_escaped, text)


def printable_line(text: str) -> str:
    """One line of output: `printable`, with newlines escaped too (a name, a table cell)."""
    return printable(text).replace("\n", "\\n")
