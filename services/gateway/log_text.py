"""Untrusted text (model names, error messages that quote a request) made safe for a log line or
an error body: escaped as repr() escapes it, so a newline cannot forge a log line nor a control
character reach a terminal, and cut short, so a megabyte of it stays a short line."""

from __future__ import annotations

EXCERPT_CHARS = 80
LOG_CHARS = 500


def excerpt(value: str, limit: int = EXCERPT_CHARS) -> str:
    """repr() of the first `limit` characters, with an ellipsis when there were more."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + "..."


def log_safe(value: str, limit: int = LOG_CHARS) -> str:
    """The text escaped (without repr's quotes) and truncated, for the middle of a log line."""
    shown = value[:limit].encode("unicode_escape").decode("ascii")
    return shown + (f"... ({len(value)} characters)" if len(value) > limit else "")
