"""Keys for tests, all marked, so that the suite can check that none of them ever reaches
a log (tests/conftest.py scans every test's captured output and every log file)."""

from __future__ import annotations

MARK = "sk-corral-secret-"


def secret(name: str) -> str:
    """A test key: the mark, a name, and enough length to be a valid key."""
    return f"{MARK}{name}-0123456789"
