"""Redacting secrets from whatever is shown about a job: its log, its status's error and traceback, the
worker's own log, a URL quoted in a message.

A secret is the value of an environment variable whose name says so (``SECRET``, ``TOKEN``,
``PASSWORD``...), or the password of any URL (``scheme://user:PASSWORD@host``). A secret of 8 characters
or more is redacted wherever it appears; a shorter one where it stands as a whole token, never as a part
of another word (``test`` in ``latest``). What names things (a job's id, a checkpoint's key, a link) is the
caller's to leave alone (``baton.dashboard.access``).
"""
from __future__ import annotations

import logging
import os
import re
from typing import Mapping

SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_KEY", re.IGNORECASE)
URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^\s/]+)@(?=[^@\s/]*(?:[/\s?#]|$))")
"""``scheme://user:PASSWORD@host``: the user info ends at the authority's *last* '@' (as urlparse and
redis-py read it), so a password may hold '@'."""
MIN_SECRET_CHARS = 4
"""Shorter values are not redacted (hiding every "1" would hide the log, not a secret)."""
WORD_CHARS = 8
"""A secret shorter than this (``test``, ``hunter2``) may be a word, or a part of one (``latest``): it is
redacted where it stands as a whole token. A longer one (a key, a token) is redacted wherever it appears,
glued to other characters too (``Bearer<token>``, ``\\n<token>`` in a repr)."""
NOT_SECRETS = frozenset({"true", "false", "none", "null", "yes", "no", "auto"})
"""Values of a variable named like a secret that are settings, not secrets (``TOKENIZERS_PARALLELISM=false``)."""
REDACTED = "***"


class Redactor:
    """Replaces the secrets of an environment, and any URL's password, in text: a long secret wherever it
    appears, a short one where it stands as a whole token (never inside another word)."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        secrets = set()
        for name, value in environ.items():
            if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS and value.lower() not in NOT_SECRETS:
                secrets.add(value)
                # text is redacted line by line: each line of a multi-line secret (a PEM key, a JSON credential)
                secrets.update(line.strip() for line in value.splitlines() if len(line.strip()) >= MIN_SECRET_CHARS)
            secrets.update(m["password"] for m in URL_PASSWORD.finditer(value) if len(m["password"]) >= MIN_SECRET_CHARS)
        ordered = sorted(secrets, key=len, reverse=True)  # a longer secret first: it may hold a shorter
        long = [re.escape(secret) for secret in ordered if len(secret) >= WORD_CHARS]
        short = [re.escape(secret) for secret in ordered if len(secret) < WORD_CHARS]
        parts = [f"(?:{'|'.join(long)})"] if long else []
        if short:
            parts.append(f"(?<![A-Za-z0-9])(?:{'|'.join(short)})(?![A-Za-z0-9])")
        self._pattern = re.compile("|".join(parts)) if parts else None

    def __call__(self, text: str) -> str:
        text = URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)
        return self._pattern.sub(REDACTED, text) if self._pattern is not None else text


class RedactingFilter(logging.Filter):
    """Redacts every record a handler writes: its message and its traceback (a worker's own log)."""

    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = self.redact(message)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self.redact(logging.Formatter().formatException(record.exc_info))
        return True
