"""Example databases: where Hypothesis keeps failing (and interesting) examples.

- a directory (default): ``DirectoryBasedExampleDatabase``;
- ``redis://host:port/db``: ``RedisExampleDatabase``, shared by many CI machines;
- a read-only layer (``--etprop-db-readonly``): replay what CI found without
  writing to it, multiplexed with the writable local database.

Entries are Hypothesis's recorded choices, which replay through the strategies
and so only ever yield valid specs. A shared database is still untrusted: an
entry that does not decode (another Hypothesis version, a corrupt write) is
skipped with a warning, never handed to Hypothesis.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterable, Optional

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
    choices_from_bytes,
)

from etprop.errors import UsageError


def _one(url: str) -> ExampleDatabase:
    if url.startswith("redis://"):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise UsageError("a redis:// database needs the redis client: pip install 'etprop[redis]'") from None
        return RedisExampleDatabase(redis.Redis.from_url(url), key_prefix=b"etprop:")
    return DirectoryBasedExampleDatabase(Path(url))


class UndecodableEntry(UserWarning):
    """An example database entry that is not a sequence of Hypothesis choices."""


class ScreenedDatabase(ExampleDatabase):
    """Passes through only entries that decode as Hypothesis choices; warns,
    once per key, how many it skipped."""

    def __init__(self, inner: ExampleDatabase):
        super().__init__()
        self.inner = inner
        self.skipped = 0
        self._warned: set[bytes] = set()

    def fetch(self, key: bytes) -> Iterable[bytes]:
        bad = 0
        for value in self.inner.fetch(key):
            if choices_from_bytes(value) is None:
                bad += 1
                continue
            yield value
        if bad:
            self.skipped += bad
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(
                    f"example database: skipped {bad} entr{'y' if bad == 1 else 'ies'} that do not "
                    f"decode as Hypothesis choices (key {key[:16].hex()}...)",
                    UndecodableEntry,
                    stacklevel=2,
                )

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(src, dest, value)


def open_database(url: Optional[str], readonly: Optional[str], default_dir: Path) -> ExampleDatabase:
    writable = _one(url) if url else DirectoryBasedExampleDatabase(default_dir)
    if not readonly:
        return ScreenedDatabase(writable)
    return ScreenedDatabase(MultiplexedDatabase(writable, ReadOnlyDatabase(_one(readonly))))
