"""Example databases: where Hypothesis keeps failing (and interesting) examples.

- a directory (default): ``DirectoryBasedExampleDatabase``;
- ``redis://host:port/db``: ``RedisExampleDatabase``, shared by many CI machines;
- a read-only layer (``--etprop-db-readonly``): replay what CI found without
  writing to it, multiplexed with the writable local database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
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


def open_database(url: Optional[str], readonly: Optional[str], default_dir: Path) -> ExampleDatabase:
    writable = _one(url) if url else DirectoryBasedExampleDatabase(default_dir)
    if not readonly:
        return writable
    return MultiplexedDatabase(writable, ReadOnlyDatabase(_one(readonly)))
