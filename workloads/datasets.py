"""Local dataset files read into prompt texts and conversations (nothing is fetched at run time).

Formats (docs/workloads.md shows each):
- jsonl: one JSON object per line with the prompt text in ``prompt_field`` (and optionally an output
  length in ``output_field``);
- sharegpt: ShareGPT's JSON (an array of ``{"conversations": [{"from": "human"|"gpt", "value": ...}]}``),
  or the same objects one per line; ``human``/``user`` turns are prompts, ``gpt``/``assistant`` answers;
- text: a plain text corpus that prompts are sampled from.

A malformed file is refused with the line where the problem is, before anything is sent or stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from k2bench.errors import UserError

USER_ROLES = ("human", "user")
ANSWER_ROLES = ("gpt", "assistant", "chatgpt", "bing", "bard")


@dataclass(frozen=True)
class Sample:
    """One prompt of a dataset, and the output length the dataset gives for it (None: not given)."""

    text: str
    output_len: int | None = None
    answer: str | None = None  # ShareGPT: the recorded answer (its length in tokens is the output length)
    line: int = 0


@dataclass(frozen=True)
class Conversation:
    """The user turns of one ShareGPT conversation, with the recorded answers between them."""

    user: tuple[str, ...]
    answers: tuple[str, ...]
    line: int = 0


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read dataset {path}: {exc}") from None


def _bad(path: str | Path, line: int, why: str) -> UserError:
    return UserError(f"{path}, line {line}: {why}")


@lru_cache(maxsize=4)  # read once per sweep, not once per level
def read_jsonl(path: str | Path, prompt_field: str = "prompt", output_field: str | None = None) -> list[Sample]:
    """Every non-blank line of a JSONL file as a Sample; the first malformed line is an error."""
    out = []
    for number, raw in enumerate(_read(path).splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise _bad(path, number, f"not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise _bad(path, number, "expected a JSON object")
        text = obj.get(prompt_field)
        if not isinstance(text, str) or not text.strip():
            raise _bad(path, number, f"no text in field {prompt_field!r} (set prompt_field to the field that "
                                     f"holds the prompt)")
        olen = None
        if output_field is not None:
            olen = obj.get(output_field)
            if isinstance(olen, bool) or not isinstance(olen, int) or olen < 1:
                raise _bad(path, number, f"field {output_field!r} must be a whole number >= 1, got {olen!r}")
        out.append(Sample(text=text, output_len=olen, line=number))
    if not out:
        raise UserError(f"{path}: no prompts in the file")
    return out


def _objects(path: str | Path, text: str) -> list[tuple[int, object]]:
    """(line, value) of each element of a JSON array, or of each line of a JSONL file."""
    stripped = text.lstrip()
    if not stripped.startswith("["):
        out = []
        for number, raw in enumerate(text.splitlines(), start=1):
            if raw.strip():
                try:
                    out.append((number, json.loads(raw)))
                except ValueError as exc:
                    raise _bad(path, number, f"not JSON ({exc.msg})") from None
        return out
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    out = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise _bad(path, text.count("\n", 0, pos) + 1, "the JSON array is not closed")
        if text[pos] == "]":
            return out
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError as exc:
            raise _bad(path, text.count("\n", 0, getattr(exc, "pos", pos)) + 1, f"not JSON ({exc.msg})") from None
        out.append((line, value))


@lru_cache(maxsize=4)  # read once per sweep, not once per level
def read_sharegpt(path: str | Path) -> list[Conversation]:
    """The conversations of a ShareGPT-format file (those with at least one user turn)."""
    out = []
    for line, obj in _objects(path, _read(path)):
        turns = obj.get("conversations", obj.get("conversation")) if isinstance(obj, dict) else None
        if not isinstance(turns, list):
            raise _bad(path, line, "expected an object with a 'conversations' list")
        user: list[str] = []
        answers: list[str] = []
        for turn in turns:
            if not (isinstance(turn, dict) and isinstance(turn.get("value"), str) and isinstance(turn.get("from"), str)):
                raise _bad(path, line, "each turn needs 'from' and 'value' strings")
            role = turn["from"].lower()
            if role in USER_ROLES:
                if len(user) > len(answers):  # two user turns in a row: one message
                    user[-1] += "\n" + turn["value"]
                else:
                    user.append(turn["value"])
            elif role in ANSWER_ROLES and len(answers) < len(user):
                answers.append(turn["value"])
        if user and all(u.strip() for u in user):
            out.append(Conversation(tuple(user), tuple(answers), line))
    if not out:
        raise UserError(f"{path}: no conversation with a user turn")
    return out


def first_turns(conversations: list[Conversation]) -> list[Sample]:
    """Single-turn prompts: each conversation's first user turn and its recorded answer."""
    return [Sample(text=c.user[0], answer=c.answers[0] if c.answers else None, line=c.line) for c in conversations]


@lru_cache(maxsize=4)  # read once per sweep, not once per level
def read_corpus(path: str | Path) -> tuple[str, ...]:
    """A text corpus as its words (prompts are runs of words from random places)."""
    words = tuple(_read(path).split())
    if not words:
        raise UserError(f"{path}: the corpus is empty")
    return words


def check(source: str, path: str, prompt_field: str = "prompt", output_field: str | None = None) -> None:
    """Read a workload's file once before anything runs, so a malformed one is refused (with its line)
    before a server starts and before anything is stored."""
    if source == "jsonl":
        read_jsonl(path, prompt_field, output_field)
    elif source == "sharegpt":
        read_sharegpt(path)
    elif source == "text":
        read_corpus(path)
    elif source == "trace":
        from k2bench.workloads.trace import read_trace

        read_trace(path)
