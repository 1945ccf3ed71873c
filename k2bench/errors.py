"""Errors a user can fix, shared by the harness, the engine and the workloads. The CLI prints them as
one line and exits with the error's code, without a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an unusable environment, explained in words the user can act on."""

    exit_code = 2


class ServerError(UserError):
    """The server under test could not be started, reached, or gave unusable answers."""

    exit_code = 3
