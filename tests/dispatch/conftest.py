"""Every guard a test here builds is closed after it (``tests/support/guards.py``)."""

from tests.support.guards import close_guards

__all__ = ["close_guards"]
