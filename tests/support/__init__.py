"""Helper scripts the tests run as separate OS processes (real races, real SIGKILL)."""
