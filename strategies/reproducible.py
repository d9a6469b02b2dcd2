"""Draws decided by the seed and the strategies alone."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def draws_independent_of_imported_source():
    """Hypothesis now and then draws a literal collected from the local source
    modules imported so far. Which modules those are depends on the checkout
    and on which tests ran before in the same worker, so a clean clone drew
    other ``ci`` examples than a working tree. Inside this context the local
    pool is empty (Hypothesis's own constants stay), so a seed alone decides
    the draws. Restores Hypothesis's function on exit."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants

        original = providers._get_local_constants
    except (ImportError, AttributeError):
        yield
        return
    empty = Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()
