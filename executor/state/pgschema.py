"""The PostgreSQL schema of the shared store, and the migrations that build it.

Role: one ordered list of migrations, applied at start (and by ``agentsafe store migrate``) inside
one transaction that first takes a transaction-scoped advisory lock, so three replicas starting at
once apply each migration exactly once and the others wait, then see it applied. The version lives
in ``agentsafe_schema``; a database whose version is newer than :data:`SCHEMA_VERSION` is refused
(``STORE_SCHEMA_UNSUPPORTED``): an older executor must not write rows it does not understand.

Tables (every timestamp is seconds since the epoch as ``double precision``; lease and window times
are the database's clock, so replicas with skewed clocks agree):

==================  ==============================================================================
agentsafe_meta      the consumption HMAC key (never leaves the database)
grant_claims        one row per claimed grant id (primary key: the single-use guarantee)
idempotency         (tenant, principal, key) -> payload digest, IN_PROGRESS (its holder, lease and
                    attempt) or DONE with answer
consumptions        generic single-use markers (plan approvals, presented escalations)
approvals           escalations waiting for a person, decided once (or cancelled while pending)
passkeys            the WebAuthn credentials of APPROVER principals (issue 21)
enrolment_tokens    one-time passkey enrolment tokens, by SHA-256 digest (issue 21)
ceiling_lock        one row per window, locked ``FOR UPDATE`` by every reservation
ceiling_window      the reservations inside the host-ceiling window
attempts            the attempt journal's open-attempt state, with its owner, lease and
                    fencing token (``epoch``: incremented by every takeover)
==================  ==============================================================================

Callers: ``state/pgconn.py`` (at open, and for ``agentsafe store migrate``).
"""

from __future__ import annotations

from typing import Final

import psycopg

from ..codes import Code
from ..errors import StoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

_ADVISORY_KEY: Final = 0x61677300_0000_0001  # "ags" + 1: agentsafe's migration lock

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE agentsafe_meta (name text PRIMARY KEY, value bytea NOT NULL)""",
        """CREATE TABLE grant_claims (
            grant_id text PRIMARY KEY, binding_digest text NOT NULL,
            expires_at double precision NOT NULL, claimed_at double precision NOT NULL)""",
        """CREATE TABLE idempotency (
            tenant text NOT NULL, principal text NOT NULL, key text NOT NULL,
            payload_digest text NOT NULL,
            state text NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE')),
            response text, created_at double precision NOT NULL,
            completed_at double precision,
            PRIMARY KEY (tenant, principal, key))""",
        """CREATE TABLE consumptions (
            namespace text NOT NULL, key text NOT NULL, nonce text NOT NULL,
            consumed_at double precision NOT NULL, binding_digest text NOT NULL,
            PRIMARY KEY (namespace, key))""",
        """CREATE TABLE approvals (
            request_id text PRIMARY KEY, intent text NOT NULL, intent_hash text NOT NULL,
            approvers text NOT NULL, proposer_principal text NOT NULL,
            proposer_actor text NOT NULL, expires_at double precision NOT NULL,
            created_at double precision NOT NULL,
            state text NOT NULL CHECK (state IN ('PENDING', 'APPROVED', 'DENIED')),
            approver text, reason text, decided_at double precision)""",
        """CREATE TABLE ceiling_lock (name text PRIMARY KEY)""",
        """INSERT INTO ceiling_lock (name) VALUES ('window')""",
        """CREATE TABLE ceiling_window (
            id bigserial PRIMARY KEY, at double precision NOT NULL,
            amount_minor bigint NOT NULL)""",
        """CREATE INDEX ceiling_window_at ON ceiling_window (at)""",
        """CREATE TABLE attempts (
            attempt_id text PRIMARY KEY, owner text NOT NULL,
            lease_until double precision NOT NULL,
            state text NOT NULL CHECK (state IN ('OPEN', 'CLOSED')),
            intent_id text, intent_hash text NOT NULL, decision_id text, dossier_id text,
            principal text, action text, binding text NOT NULL, opened_at text NOT NULL,
            grant_claimed boolean NOT NULL DEFAULT false, grant_id text,
            grant_expires_at text, payload_digest text, last_status text,
            closed_at double precision)""",
        """CREATE INDEX attempts_open ON attempts (state, lease_until)""",
    ),
    (  # 2: each idempotency key names the attempt it journals and its owner (issue 17)
        """ALTER TABLE idempotency ADD COLUMN attempt_id text, ADD COLUMN owner text""",
        """CREATE INDEX idempotency_attempt ON idempotency (attempt_id)""",
        """CREATE INDEX idempotency_owner ON idempotency (owner, state)""",
    ),
    (
        # issue 21: what escalated, the verification asked and given, cancellations; the
        # approvers' passkeys and their one-time enrolment tokens. Every statement is IF NOT
        # EXISTS, so this entry composes with other entries in either order.
        """ALTER TABLE approvals ADD COLUMN IF NOT EXISTS rule text,
            ADD COLUMN IF NOT EXISTS reason_codes text NOT NULL DEFAULT '[]',
            ADD COLUMN IF NOT EXISTS required_verification text NOT NULL DEFAULT 'CREDENTIAL',
            ADD COLUMN IF NOT EXISTS verification text,
            ADD COLUMN IF NOT EXISTS cancelled_by text,
            ADD COLUMN IF NOT EXISTS cancel_reason text,
            ADD COLUMN IF NOT EXISTS cancelled_at double precision""",
        """CREATE TABLE IF NOT EXISTS passkeys (
            credential_id text PRIMARY KEY, principal text NOT NULL, public_key bytea NOT NULL,
            sign_count bigint NOT NULL, transports text NOT NULL,
            created_at double precision NOT NULL, last_used_at double precision)""",
        """CREATE INDEX IF NOT EXISTS passkeys_principal ON passkeys (principal)""",
        """CREATE TABLE IF NOT EXISTS enrolment_tokens (
            token_digest text PRIMARY KEY, principal text NOT NULL, issued_by text NOT NULL,
            issued_at double precision NOT NULL, expires_at double precision NOT NULL,
            used_at double precision)""",
    ),
    # issue 15: a key IN_PROGRESS is held by one request (``holder``) under a lease until its
    # attempt opens (``opened_attempt``, set in the attempt's own INSERT transaction); a key whose
    # holder lapsed before that, or whose attempt closed without claiming its grant, can be taken
    # over. Every statement is IF NOT EXISTS, so this entry composes with others in either order.
    (
        """ALTER TABLE idempotency ADD COLUMN IF NOT EXISTS holder text""",
        """ALTER TABLE idempotency ADD COLUMN IF NOT EXISTS lease_until double precision""",
        """ALTER TABLE idempotency ADD COLUMN IF NOT EXISTS opened_attempt text""",
    ),
    # issue 29: each attempt's fencing token. 1 when it opens; every takeover (a new owner)
    # increments it in the transaction that changes the owner, and the grant claim is made only
    # under the owner and epoch its claimant holds. Rows of an older schema start at 1 (their
    # owner is unchanged; a takeover from here on increments it). IF NOT EXISTS: composes.
    ("""ALTER TABLE attempts ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 1""",),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)


async def migrate(conn: psycopg.AsyncConnection[object]) -> tuple[int, int]:
    """Bring the schema to :data:`SCHEMA_VERSION` under the advisory lock.

    ``conn`` must be in autocommit mode; the work is one transaction. Returns ``(before, after)``
    versions. Raises ``STORE_SCHEMA_UNSUPPORTED`` for a newer schema.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS agentsafe_schema ("
            " singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),"
            " version integer NOT NULL)"
        )
        cur = await conn.execute("SELECT version FROM agentsafe_schema")
        row = await cur.fetchone()
        before = 0 if row is None else int(row[0])  # type: ignore[index]
        if before > SCHEMA_VERSION:
            raise StoreError(
                f"the store's schema is version {before}; this agentsafe knows up to"
                f" {SCHEMA_VERSION}: upgrade agentsafe before starting it on this database",
                code=Code.STORE_SCHEMA_UNSUPPORTED,
            )
        for statements in MIGRATIONS[before:]:
            for statement in statements:
                await conn.execute(statement)
        if before < SCHEMA_VERSION:
            await conn.execute(
                "INSERT INTO agentsafe_schema (singleton, version) VALUES (true, %s)"
                " ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version",
                (SCHEMA_VERSION,),
            )
    return before, SCHEMA_VERSION
