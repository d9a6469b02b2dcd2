"""Errors that are the user's to fix; the CLI prints them as one line, no traceback."""


class UsageError(Exception):
    """Bad input: an unknown flow, a malformed repro, a missing optional package."""


def parse_json(data: str | bytes, where: str, fix: str):
    """``data`` parsed as JSON, or a UsageError naming ``where`` and ``fix``:
    not UTF-8 text, not JSON, or nested deeper than the parser recurses (any of
    these is a damaged or foreign file, never a traceback)."""
    import json

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where} is not UTF-8 text (byte {exc.start}); {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where} is not valid JSON ({exc.msg}, line {exc.lineno}); {fix}") from None
    except RecursionError:
        raise UsageError(f"{where} nests its JSON too deeply to be a spec or repro; {fix}") from None
