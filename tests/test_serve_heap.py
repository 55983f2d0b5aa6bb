"""``freeze_startup_heap``: start-up garbage is collected; what lives is kept out of later walks."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from agentsafe.executor.serve import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.peer: _Node = self


@pytest.fixture
def unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_garbage_is_collected_before_the_heap_is_frozen(unfreeze: None) -> None:
    garbage = _Node()  # a cycle: only the collector frees it
    dead = weakref.ref(garbage)
    kept = _Node()
    del garbage
    frozen = freeze_startup_heap()
    assert dead() is None  # collected, not frozen for ever
    assert frozen == gc.get_freeze_count() > 0
    assert kept.peer is kept


def test_a_full_collection_no_longer_walks_the_frozen_heap(unfreeze: None) -> None:
    survivors = [_Node() for _ in range(5000)]
    freeze_startup_heap()
    tracked = {id(obj) for obj in gc.get_objects()}
    assert not any(id(node) in tracked for node in survivors)
