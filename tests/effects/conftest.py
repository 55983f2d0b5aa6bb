"""The attempt test's world (real authority, store, journal and registry) for the bridge tests."""

from tests.lifecycle.test_attempt import world  # noqa: F401
