"""A griffe extension for the API reference: Keras-style `Examples:` sections.

The library's docstrings follow Keras: an `Examples:` header, a blank line,
then doctest lines at the header's own indentation. Google-style parsers
(griffe's included) want a section's body indented under its header, so
without this the examples would render as Markdown quotes. This indents the
body of each such section (up to the next `Header:` line) before griffe
parses the docstring; the source stays as it is.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLES = re.compile(r"^Examples?:\s*$")
_NEXT_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")


def indent_examples(text: str) -> str:
    """`text` with the body of each unindented `Examples:` section indented."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not _EXAMPLES.match(line):
            continue
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i < len(lines) and lines[i].startswith(" "):
            continue  # already indented: griffe reads it as it is
        while i < len(lines) and not _NEXT_SECTION.match(lines[i]):
            out.append("    " + lines[i] if lines[i].strip() else "")
            i += 1
    return "\n".join(out)


class KerasStyleExamples(griffe.Extension):
    """Indents Keras-style `Examples:` bodies so griffe parses them."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = indent_examples(obj.docstring.value)
