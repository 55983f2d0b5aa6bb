"""Test helpers: scripts the tests run as separate OS processes (real races, real SIGKILL) and
small building blocks shared between test modules."""
