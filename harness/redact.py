"""The one redaction path: what k2bench records (database, JSON, `show --repro`), prints, or keeps
(server logs, job files) goes through here, so a secret given on the command line or in the
environment is written as ``***`` everywhere.

Two kinds of rule. By *shape*: a URL's user info and token-like query values, the value of an
environment variable or a flag whose name says it is a secret, ``NAME=value`` words inside a quoted
server command. By *value*: the secrets a sweep was handed (``Secrets``) are replaced wherever they
appear, which is how a server's own log lines and free console text are cleaned.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MASK = "***"

# name words (split on _ - . and case changes) that make a variable, flag or query parameter a secret
_SECRET_WORDS = frozenset({
    "PASS", "PASSWD", "PASSWORD", "PASSWORDS", "PASSPHRASE", "PWD", "PAT", "TOKEN", "SECRET", "SECRETS", "KEY",
    "APIKEY", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "OAUTH", "AUTHORIZATION", "COOKIE", "DSN", "SIG",
    "SIGNATURE", "SAS",
})
# a word ending in one of these is a secret too (HFTOKEN, DBPASSWORD), unlike KEYBOARD or TOKENIZERS
_SECRET_SUFFIXES = ("PASSWORD", "PASSWD", "TOKEN", "SECRET", "APIKEY", "CREDENTIAL", "CREDENTIALS")
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})  # the shell's working directories
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MIN_SECRET_LEN = 4  # shorter known values are not hunted for in free text (they would mask digits and words)
_TRIVIAL = frozenset({"true", "false", "yes", "no", "none", "null", "auto", "default"})  # e.g. HF_HUB_..._TOKEN=true

# scheme://userinfo@ : the user info, up to the last @ before the path (a raw @ in a password is masked too)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/?#\s'\"]*)@")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[A-Za-z0-9_.-]+)=(?P<value>[^&#;\s'\"]*)")
_TOKEN_PREFIXES = ("ghp_", "gho_", "ghs_", "github_pat_", "glpat-", "hf_", "sk-", "xox")


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag (``--api-key``) or query parameter named ``name`` holds a secret."""
    bare = name.lstrip("-")
    if bare.upper() in _NOT_SECRET:
        return False
    for word in _WORD_SPLIT.split(bare):
        w = word.upper()
        if w in _SECRET_WORDS or (len(w) > 6 and w.endswith(_SECRET_SUFFIXES)):
            return True
    return False


def is_shell_name(name: str) -> bool:
    """Whether ``name`` can stand on the left of ``export NAME=...`` (and nothing else)."""
    return _SHELL_NAME.fullmatch(name) is not None


def _user_is_token(user: str) -> bool:
    """A user name alone before @ that is really a token (https://TOKEN@github.com), not 'postgres'."""
    return len(user) >= 20 or user.startswith(_TOKEN_PREFIXES)


def _userinfo(m: re.Match) -> str:
    info = m.group("info")
    if not info or info == MASK:
        return m.group(0)
    user, colon, _password = info.partition(":")
    if colon:
        return f"{m.group('scheme')}{user}:{MASK}@"
    return f"{m.group('scheme')}{MASK if _user_is_token(user) else user}@"


def _query(m: re.Match) -> str:
    if not m.group("value") or not is_secret_name(m.group("name")):
        return m.group(0)
    return f"{m.group('lead')}{m.group('name')}={MASK}"


def text(value: str) -> str:
    """Free text with the passwords in its URLs and its token-like query values masked."""
    if "://" in value:
        value = _URL_USERINFO.sub(_userinfo, value)
    if "=" in value:
        value = _QUERY_PARAM.sub(_query, value)
    return value


def env(values: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of secret-named variables masked, and URLs in the rest cleaned."""
    return {k: (MASK if is_secret_name(k) else text(v)) for k, v in values.items()}


def _assignment(word: str) -> str | None:
    """'NAME=value' with a secret NAME, masked; None when the word is something else."""
    name, eq, _ = word.partition("=")
    if eq and _SHELL_NAME.fullmatch(name) and is_secret_name(name):
        return f"{name}={MASK}"
    return None


def argv(words: list[str]) -> list[str]:
    """Command words with the values of secret-like flags (--api-key K, --hf-token=T), secret
    NAME=value words, and URL passwords masked; a quoted group of words (--server-cmd '...',
    --server-args '...') is masked word by word."""
    out: list[str] = []
    hide_next = False
    for arg in words:
        if hide_next and not arg.startswith("--"):  # "--flag": the secret-named one was a switch
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = arg.partition("=")
        if name.startswith("-") and is_secret_name(name) and not any(c.isspace() for c in arg):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        assignment = _assignment(arg)
        if assignment:
            out.append(assignment)
        elif any(c.isspace() for c in arg):
            try:
                words = shlex.split(arg)
            except ValueError:  # not shell words: mask what the shapes catch
                out.append(text(arg))
            else:
                masked = argv(words)
                out.append(arg if masked == words else shlex.join(masked))  # unchanged when nothing was secret
        else:
            out.append(text(arg))
    return out


def command(line: str | None) -> str | None:
    """A shell command line ('ENV=v prog --flag value') with its secrets masked."""
    if line is None:
        return None
    try:
        words = shlex.split(line)
    except ValueError:
        return text(line)
    lead = []
    while words and _SHELL_NAME.fullmatch(words[0].partition("=")[0]) and "=" in words[0]:
        lead.append(words.pop(0))
    given_env = dict(w.split("=", 1) for w in lead)
    masked_env, masked_words = env(given_env), argv(words)
    if masked_env == given_env and masked_words == words:
        return line  # nothing secret: the line as written (a stored tag still matches it)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in masked_env.items()), shlex.join(masked_words)])


def deep(obj: Any, secrets: Secrets | None = None) -> Any:
    """Every string inside ``obj`` (dicts, lists) with its shapes and ``secrets`` masked: the last net
    before a record is stored."""
    if isinstance(obj, str):
        return secrets.scrub(obj) if secrets else text(obj)
    if isinstance(obj, dict):
        return {k: deep(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(deep(v, secrets) for v in obj)
    return obj


def values_in_text(value: str) -> set[str]:
    """The secret values the shapes find in ``value``: URL passwords (and token users), query tokens."""
    found: set[str] = set()
    for m in _URL_USERINFO.finditer(value):
        user, colon, password = m.group("info").partition(":")
        if colon and password:
            found.add(password)
        elif not colon and _user_is_token(user):
            found.add(user)
    for m in _QUERY_PARAM.finditer(value):
        if m.group("value") and is_secret_name(m.group("name")):
            found.add(m.group("value"))
    return found


def values_in_argv(words: Iterable[str]) -> set[str]:
    """The secret values in command words, found by the same rules `argv` masks with."""
    found: set[str] = set()
    take_next = False
    for arg in words:
        if take_next and not arg.startswith("--"):
            found.add(arg)
            take_next = False
            continue
        take_next = False
        name, eq, value = arg.partition("=")
        if name.startswith("-") and is_secret_name(name) and not any(c.isspace() for c in arg):
            if eq:
                found.add(value)
            else:
                take_next = True
        elif eq and _SHELL_NAME.fullmatch(name) and is_secret_name(name):
            found.add(value)
        elif any(c.isspace() for c in arg):
            try:
                found |= values_in_argv(shlex.split(arg))
            except ValueError:
                found |= values_in_text(arg)
        else:
            found |= values_in_text(arg)
    return found


def values_in_env(values: Mapping[str, str]) -> set[str]:
    found: set[str] = set()
    for k, v in values.items():
        if is_secret_name(k):
            found.add(v)
        else:
            found |= values_in_text(v)
    return found


class Secrets:
    """The secret values one command was handed; `scrub` masks them, and every shape, in free text
    (console lines, a server's log)."""

    def __init__(self, values: Iterable[str | None] = ()) -> None:
        self.values: set[str] = set()
        self.add(*values)

    def add(self, *values: str | None) -> Secrets:
        for v in values:
            if v and len(v) >= MIN_SECRET_LEN and v != MASK and v.lower() not in _TRIVIAL and not v.isdigit():
                self.values.add(v)
        return self

    def add_argv(self, words: Iterable[str] | None) -> Secrets:
        return self.add(*values_in_argv(words or []))

    def add_env(self, values: Mapping[str, str] | None) -> Secrets:
        return self.add(*values_in_env(values or {}))

    def add_text(self, *values: str | None) -> Secrets:
        for v in values:
            if v:
                self.add(*values_in_text(v))
        return self

    def scrub(self, value: str) -> str:
        value = text(value)
        for secret in sorted(self.values, key=len, reverse=True):  # longest first: one may contain another
            value = value.replace(secret, MASK)
        return value


def scrub_file(path: Path, secrets: Secrets) -> None:
    """Rewrite a kept file (a server's log, once the server has stopped) with ``secrets`` masked; the
    new file is owner-only, like the log it replaces."""
    try:
        raw = path.read_text(errors="replace")
    except OSError:
        return
    clean = secrets.scrub(raw)
    if clean == raw:
        return
    tmp = path.with_name(path.name + ".redacting")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(clean)
    os.replace(tmp, path)


def sweep_secrets(cfg: Any) -> Secrets:
    """The secrets a sweep's settings (a SweepConfig) hand it: the API key, and whatever the command
    line, --url, --db, --server-cmd and --server-args carry."""
    return (Secrets([cfg.api_key]).add_argv(cfg.command_line).add_text(cfg.url, cfg.db)
            .add_argv([w for w in (cfg.server_cmd, cfg.server_args) if w]))
