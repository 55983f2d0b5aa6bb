"""Which images a build of the Dockerfile prunes (``cluster/images.py``), decided without buildah.

The entries are shaped as ``buildah images --json`` gives them (buildah 1.28, this machine), and
were all listed with the Dockerfile's label, as the prune asks for them.
"""

from __future__ import annotations

from typing import Any

from cluster.images import PRUNE_AGE, superseded

STARTED = 1_796_405_000.0


def _earlier() -> list[dict[str, Any]]:
    return [
        {"id": "a73bdec9ace3", "names": None, "created": STARTED - 7200},  # an old build stage
        {"id": "e824f6dc502b", "names": ["localhost/agentsafe:release"], "created": STARTED - 7200},
        {"id": "15ce3c1db1f2", "names": [], "created": STARTED - PRUNE_AGE},
        {"id": "b0f981639187", "names": None, "created": STARTED - PRUNE_AGE + 1},  # beside us
    ]


def test_a_build_that_made_a_new_image_prunes_the_older_untagged_ones() -> None:
    images = [
        *_earlier(),
        {"id": "c021e9df9890", "names": None, "created": STARTED + 20},  # its own build stage
        {"id": "7ad9ee86dd8b", "names": ["localhost/agentsafe:dev"], "created": STARTED + 30},
    ]
    assert superseded(images, tag="agentsafe:dev", started=STARTED) == [
        "a73bdec9ace3",
        "15ce3c1db1f2",
    ]


def test_a_build_answered_from_the_cache_prunes_nothing() -> None:
    # Its tag names an image made before it started; the old untagged build stage is its cache.
    cached = [
        *_earlier(),
        {"id": "9c9e9d432b6", "names": ["localhost/agentsafe:dev"], "created": STARTED - 7000},
    ]
    assert superseded(cached, tag="agentsafe:dev", started=STARTED) == []
    assert superseded([], tag="agentsafe:dev", started=STARTED) == []
