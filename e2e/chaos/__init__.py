"""The nemesis harness of issue 29 (``make chaos``): real replicas, real faults, an independent
check.

Role: run three ``agentsafe serve`` replicas on a PostgreSQL primary with a streaming standby and
the synthetic provider, every replica reaching the database and the provider through toxiproxy;
clients that retry with the same idempotency key; a seeded schedule of faults (pauses and
SIGKILLs at each lifecycle point, partitions, failovers, a clock step); then
:mod:`chaos.checker`, which imports nothing of the executor, reads the provider's record and every
answer and says per property PASS or FAIL. Run from ``e2e/`` (``python -m chaos``) so that the
repository root never reaches ``sys.path`` (``operator/`` there shadows the standard library).

Modules: :mod:`chaos.pgpair` (primary + standby, promotion), :mod:`chaos.toxiproxy` (the proxy
process and its HTTP API), :mod:`chaos.schedule` (the seeded fault schedule), :mod:`chaos.system`
(the processes), :mod:`chaos.run` (nemesis, clients, the run), :mod:`chaos.checker`.
Callers: ``make chaos`` (``python -m chaos``), ``e2e/test_chaos_checker.py``. docs/chaos.md.
"""
