"""Errors that are the user's to fix; the CLI prints them as one line, no traceback."""


class UsageError(Exception):
    """Bad input: an unknown flow, a malformed repro, a missing optional package."""
