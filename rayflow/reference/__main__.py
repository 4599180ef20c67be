"""`python -m rayflow.reference`: the command that writes the docs' generated parts (the config
reference on stdout; the architecture page's blocks, printed or rewritten in a page)."""

from __future__ import annotations

import sys
from pathlib import Path

from rayflow.reference.architecture import architecture_blocks, fill_blocks
from rayflow.reference.config import markdown

USAGE = """usage: python -m rayflow.reference                     the config reference, on stdout
       python -m rayflow.reference architecture        the architecture page's generated blocks
       python -m rayflow.reference architecture PAGE   ... rewritten in PAGE, between its markers
"""


def main(argv: list[str]) -> int:
    if not argv:
        sys.stdout.write(markdown())
        return 0
    if argv[0] != "architecture" or len(argv) > 2:
        sys.stderr.write(USAGE)
        return 2
    blocks = architecture_blocks()
    if len(argv) == 1:
        for name, body in blocks.items():
            sys.stdout.write(f"<!-- generated: {name} -->\n\n{body}\n\n<!-- end generated -->\n\n")
        return 0
    page = Path(argv[1])
    page.write_text(fill_blocks(page.read_text(), blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
