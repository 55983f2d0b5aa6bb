"""The pooled version 4 UUIDs are the standard library's, byte for byte, and never repeat."""

from __future__ import annotations

import os
import uuid

from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor import ids


@given(st.binary(min_size=16, max_size=16))
def test_the_text_is_what_the_standard_library_writes_for_the_same_bytes(raw: bytes) -> None:
    assert ids.format_uuid4(raw) == str(uuid.UUID(bytes=raw, version=4))


def test_identifiers_are_version_4_and_distinct_across_many_pool_refills() -> None:
    made = [ids.uuid4_text() for _ in range(3000)]  # about twelve 4 KiB reads
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


def test_a_forked_child_never_reuses_the_parents_pool() -> None:
    ids.uuid4_text()  # the parent holds a pool with unused bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next identifier and leave at once
        os.close(read)
        os.write(write, ids.uuid4_text().encode())
        os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert child != ids.uuid4_text()
