"""Untrusted text made inert before it goes into markdown (PR comments, regress and bisect reports).

Model, engine, tag, branch, commit, eval-task names and invalid-level reasons come from stored runs,
and anyone who can store a run (or open a PR whose CI stores one) chooses them. Rendered raw on
GitHub, such text could inject HTML (``<img onerror=...>``), start a new line with a heading or an
``@everyone`` that pings people, split a table row with ``|`` (so a status cell moves out of its
column), or close a code span early with a backtick. Every such string goes through one of the
functions here:

- ``md_text``: prose and table cells. Line breaks and other control characters collapse to one
  space; ``< > &`` become HTML entities; markdown's inline punctuation is backslash-escaped (``|``
  included, so a table keeps its columns); ``@`` gets a zero-width joiner after it, so a mention
  never pings.
- ``md_code``: a code span that cannot be closed early (its fence is longer than any run of
  backticks inside it); in a table cell its pipes are escaped, which GitHub undoes inside spans;
  ``@`` gets the zero-width joiner too.

Both cut text longer than ``limit`` characters, so one huge name cannot swamp a comment.
"""

from __future__ import annotations

import html
import re

ZWJ = "\u200d"  # after "@": GitHub and chat tools no longer see a mention
DEFAULT_LIMIT = 200
# line breaks and control characters (C0, DEL, C1, Unicode line/paragraph separators)
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# ASCII punctuation that opens or closes an inline construct once line starts are out of reach (line
# breaks are collapsed): code spans, emphasis, strikethrough, links and images (no "[" no link), table
# cells, and the backslash itself; raw HTML and autolinks are handled by html.escape
_INLINE = re.compile(r"([\\`*_\[\]|~])")


def _flat(value: object, limit: int | None) -> str:
    text = _BREAKS.sub(" ", str(value)).strip()
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 0)] + "…"
    return text


def md_text(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """``value`` as inert markdown text, safe in prose and inside a table cell."""
    text = _INLINE.sub(r"\\\1", _flat(value, limit))
    text = html.escape(text, quote=False)
    return text.replace("@", "@" + ZWJ)


def md_code(value: object, limit: int | None = DEFAULT_LIMIT, *, in_table: bool = False) -> str:
    """``value`` as a code span that its own backticks cannot close (CommonMark's rule: the fence is
    one backtick longer than the longest run inside; a leading or trailing backtick gets a space)."""
    text = _flat(value, limit)
    if not text:
        return "` `"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    if in_table:
        text = text.replace("|", "\\|")
    text = text.replace("@", "@" + ZWJ)  # GitHub does not ping from code, but a relay of the text might
    return f"{fence}{pad}{text}{pad}{fence}"
