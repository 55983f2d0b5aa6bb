"""Durable state: the use store (single-use claims, idempotency, approvals) and the attempt
journal.
"""
