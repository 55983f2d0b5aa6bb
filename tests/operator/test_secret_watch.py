"""The Secret watch: a labelled Secret's change re-renders, at once, the AgentPolicies using it.

The handler is called as kopf calls an event handler (``body``, ``memo``, ``type``) against the
in-memory API stand-in (``FakeKube``). What it must do: find every policy that reads the Secret
(named in its spec, generated for it, a selected Principal's bearer token) and only those,
re-render them (a rotated bearer token reaches the principals file), skip kopf's initial
listing, and be registered for labelled Secrets only, with the API server filtering the watch.
Two events' renders run at once in kopf (one task per Secret): ``PausingKube`` holds one render
mid-apply while another finishes, and the slower one must not write its older status over the
newer one (the intermittent e2e failure: ``Applied`` written over ``SecretMissing``).
``FakeSecretWatch`` (a fake of kopf's watcher, not kopf) replays listings and watch events: a
Secret deleted while the watch was down shows in no event, and the re-list's first event must
re-render the namespace's policies, once per re-list.
The real API server (RBAC, the label selector, the operator process) is exercised by
``e2e/test_operator_client.py``.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf
import pytest

from agentsafe.operator import handlers
from agentsafe.operator.handlers import (
    SECRET_EVENT_ATTEMPTS,
    build_registry,
    configure_watching,
    policy_handler,
    secret_handler,
)
from agentsafe.operator.kubeapi import ApiError
from agentsafe.operator.reconcile import STATUS_WRITE_ATTEMPTS, policies_using_secret
from agentsafe.operator.render.common import WATCH_LABEL
from agentsafe.operator.runtime import Runtime, SecretListings
from agentsafe.operator.settings import FIELD_MANAGER, OperatorSettings

from .conftest import NS, memo_for, secret
from .fakekube import FakeKube, RecordingEvents

CONFIG = ("ConfigMap", NS, "payouts-executor-config")


@pytest.fixture(autouse=True)
def _no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler's pause between attempts after a passing refusal is backoff; none here."""
    monkeypatch.setattr(handlers, "SECRET_RETRY_SECONDS", 0.0)


async def _reconciled(rt: Runtime, kube: FakeKube) -> None:
    patch = kopf.Patch()
    body = copy.deepcopy(kube.objects[("AgentPolicy", NS, "payouts")])
    await policy_handler(body=kopf.Body(body), patch=patch, memo=memo_for(rt))
    await kube.patch_status("AgentPolicy", NS, "payouts", dict(patch["status"]))


def _bearer_digests(kube: FakeKube) -> dict[str, str]:
    document = json.loads(kube.objects[CONFIG]["data"]["principals.json"])
    return {
        p["id"]: p["credential"]["token_sha256"]
        for p in document["principals"]
        if "token_sha256" in (p.get("credential") or {})
    }


async def _event(rt: Runtime, body: dict[str, Any], type_: str | None = "MODIFIED") -> None:
    await secret_handler(body=kopf.Body(body), memo=memo_for(rt), type=type_, logger=None)


def _names(kube: FakeKube, secret_name: str) -> list[str]:
    policies = [o for k, o in kube.objects.items() if k[0] == "AgentPolicy"]
    principals = [o for k, o in kube.objects.items() if k[0] == "Principal"]
    using = policies_using_secret(secret_name, policies, principals)
    return [p["metadata"]["name"] for p in using]


def test_which_policies_use_a_secret(kube: FakeKube) -> None:
    # Named in the spec, generated for the policy, or a selected Principal's bearer token.
    for name in (
        "payouts-executor-tls",
        "payouts-downstream",
        "payouts-operator-token",
        "payouts-authority-key",
        "treasury-lead-token",
    ):
        assert _names(kube, name) == ["payouts"], name
    assert _names(kube, "someone-elses-secret") == []
    # A Principal the policy no longer selects does not tie its Secret to the policy.
    lead = kube.objects[("Principal", NS, "treasury-lead")]
    lead["metadata"]["labels"] = {"agentsafe.io/policy": "another"}
    assert _names(kube, "treasury-lead-token") == []
    # A policy being deleted is its own handlers' business.
    lead["metadata"]["labels"] = {"agentsafe.io/policy": "payouts"}
    kube.objects[("AgentPolicy", NS, "payouts")]["metadata"]["deletionTimestamp"] = "now"
    assert _names(kube, "treasury-lead-token") == []


async def test_a_rotated_bearer_token_reaches_the_principals_file_at_once(
    runtime: Runtime, kube: FakeKube
) -> None:
    await _reconciled(runtime, kube)
    before = _bearer_digests(kube)["treasury-lead"]
    rotated = secret(NS, "treasury-lead-token", {"token": b"a-new-approver-token-0123456789"})
    kube.put(rotated)
    mark = len(kube.calls)
    await _event(runtime, rotated)
    after = _bearer_digests(kube)["treasury-lead"]
    assert after != before
    assert after == hashlib.sha256(b"a-new-approver-token-0123456789").hexdigest()
    # The policy's status was written by the watch path (nobody else would).
    assert ("patch_status", "AgentPolicy", NS, "payouts") in kube.calls[mark:]


async def test_a_deleted_secret_makes_the_policy_report_it(
    runtime: Runtime, kube: FakeKube
) -> None:
    await _reconciled(runtime, kube)
    gone = copy.deepcopy(kube.objects[("Secret", NS, "payouts-downstream")])
    await kube.delete("Secret", NS, "payouts-downstream")
    await _event(runtime, gone, "DELETED")
    status = kube.objects[("AgentPolicy", NS, "payouts")]["status"]
    ready = {c["type"]: c for c in status["conditions"]}["Reconciled"]
    assert (ready["status"], ready["reason"]) == ("False", "SecretMissing")
    assert "payouts-downstream" in ready["message"]


async def test_unrelated_secrets_and_the_initial_listing_touch_nothing(
    runtime: Runtime, kube: FakeKube
) -> None:
    await _reconciled(runtime, kube)
    mark = len(kube.calls)
    await _event(runtime, secret(NS, "someone-elses-secret", {"k": b"v"}, watched=False))
    assert [c for c in kube.calls[mark:] if c[0] != "list"] == []
    mark = len(kube.calls)
    await _event(runtime, copy.deepcopy(kube.objects[("Secret", NS, "payouts-downstream")]), None)
    assert kube.calls[mark:] == []


def test_only_labelled_secrets_are_watched_and_the_api_server_filters() -> None:
    registry = build_registry()
    (handler,) = [
        h
        for h in registry._watching.get_all_handlers()  # kopf's registry, as kopf reads it
        if getattr(h, "id", "") == "references"
    ]
    assert handler.labels == {WATCH_LABEL: "true"}
    settings = kopf.OperatorSettings()
    configure_watching(settings)
    (selector,) = list(settings.watching.label_selectors)
    assert (selector.group, selector.version, selector.plural or selector.any_name) == (
        "",
        "v1",
        "secrets",
    )
    assert settings.watching.label_selectors[selector] == f"{WATCH_LABEL}=true"


def test_the_generated_secrets_carry_the_watch_label(render_input: Any) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentsafe.operator.render import (
        render_authority_key_secret,
        render_operator_token_secret,
    )

    for obj in (
        render_operator_token_secret(render_input, "t"),
        render_authority_key_secret(render_input, Ed25519PrivateKey.generate()),
    ):
        assert obj["metadata"]["labels"][WATCH_LABEL] == "true"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentsafe-operator"


async def test_the_reconciled_message_names_unwatched_secrets(
    runtime: Runtime, kube: FakeKube
) -> None:
    def reconciled_message() -> str:
        status = kube.objects[("AgentPolicy", NS, "payouts")]["status"]
        return str({c["type"]: c for c in status["conditions"]}["Reconciled"]["message"])

    await _reconciled(runtime, kube)
    assert "not labelled" not in reconciled_message()  # the fixtures' Secrets are labelled
    for name in ("payouts-downstream", "treasury-lead-token"):
        unlabelled = copy.deepcopy(kube.objects[("Secret", NS, name)])
        unlabelled["metadata"]["labels"] = {}
        kube.put(unlabelled)
    await _reconciled(runtime, kube)
    assert reconciled_message().endswith(
        "not labelled agentsafe.io/watch=true, so their changes wait for the drift repair: "
        "Secret payouts-downstream, treasury-lead-token"
    )


class PausingKube(FakeKube):
    """Stand-in whose next apply of the executor StatefulSet (once :attr:`armed`) waits until
    :attr:`release` is set: a reconcile still applying the children after the ConfigMap, as a
    slow one on a loaded API server is, while another event's reconcile runs."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.paused = asyncio.Event()
        self.release = asyncio.Event()

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        if self.armed and obj["kind"] == "StatefulSet":
            self.armed = False
            self.paused.set()
            await self.release.wait()
        return await super().apply(obj, field_manager=field_manager)


def _pausing(kube: FakeKube, settings: OperatorSettings) -> tuple[Runtime, PausingKube]:
    pausing = PausingKube()
    pausing.objects = copy.deepcopy(kube.objects)
    pausing._version = kube._version
    return Runtime(kube=pausing, settings=settings, events=RecordingEvents()), pausing


async def test_a_slower_reconcile_never_overwrites_a_deleted_secrets_report(
    runtime: Runtime, kube: FakeKube, settings: OperatorSettings
) -> None:
    """The e2e's intermittent failure: a rotated token's reconcile (it read every Secret
    before the delete) is still applying when a watched Secret is deleted; the delete's
    reconcile writes SecretMissing first. The slower one must not then write Applied over it:
    its status write is conditional on the policy's version it read, so it reads again."""
    await _reconciled(runtime, kube)
    rt, racing = _pausing(kube, settings)
    rotated = secret(NS, "treasury-lead-token", {"token": b"a-new-approver-token-0123456789"})
    racing.put(rotated)
    racing.armed = True
    slow = asyncio.create_task(_event(rt, rotated))
    await asyncio.wait_for(racing.paused.wait(), timeout=10)
    # Paused after the ConfigMap: the rotated digest is already in the principals file.
    assert (
        _bearer_digests(racing)["treasury-lead"]
        == hashlib.sha256(b"a-new-approver-token-0123456789").hexdigest()
    )
    gone = copy.deepcopy(racing.objects[("Secret", NS, "payouts-downstream")])
    await racing.delete("Secret", NS, "payouts-downstream")
    await _event(rt, gone, "DELETED")
    assert _reconciled_condition(racing)["reason"] == "SecretMissing"
    racing.release.set()
    await asyncio.wait_for(slow, timeout=10)
    reconciled = _reconciled_condition(racing)
    assert (reconciled["status"], reconciled["reason"]) == ("False", "SecretMissing")
    assert "payouts-downstream" in reconciled["message"]


async def test_persistent_conflicts_leave_as_an_api_error(
    runtime: Runtime, kube: FakeKube, settings: OperatorSettings
) -> None:
    """Another writer before every status patch: bounded attempts, then the API's 409 (kopf
    logs it); never an endless loop."""
    from .test_statefulset_watch import RacingKube

    await _reconciled(runtime, kube)
    racing = RacingKube(races=100)
    racing.objects = copy.deepcopy(kube.objects)
    racing._version = kube._version
    rt = Runtime(kube=racing, settings=settings, events=RecordingEvents())
    with pytest.raises(kopf.TemporaryError):
        await _event(rt, copy.deepcopy(racing.objects[("Secret", NS, "payouts-downstream")]))
    assert [c[0] for c in racing.calls].count("patch_status") == (
        STATUS_WRITE_ATTEMPTS * SECRET_EVENT_ATTEMPTS
    )


@pytest.mark.parametrize(("status", "attempts"), [(503, 2), (429, 2), (403, 1)])
async def test_a_passing_refusal_is_retried_since_kopf_never_retries_an_event(
    runtime: Runtime, kube: FakeKube, status: int, attempts: int
) -> None:
    """kopf only logs an event handler's error: a 503 or 429 is tried again (the rotated
    token still reaches the principals file); a 403 (RBAC, for a person to fix) is not."""
    await _reconciled(runtime, kube)
    rotated = secret(NS, "treasury-lead-token", {"token": b"a-new-approver-token-0123456789"})
    kube.put(rotated)
    kube.fail_next = ApiError(status, "Refused", "try again")
    mark = len(kube.calls)
    if attempts == 1:
        with pytest.raises((kopf.TemporaryError, kopf.PermanentError)):
            await _event(runtime, rotated)
        assert kube.calls[mark:] == []
        return
    await _event(runtime, rotated)
    assert (
        _bearer_digests(kube)["treasury-lead"]
        == hashlib.sha256(b"a-new-approver-token-0123456789").hexdigest()
    )


def _reconciled_condition(kube: FakeKube) -> dict[str, Any]:
    status = kube.objects[("AgentPolicy", NS, "payouts")]["status"]
    return dict({c["type"]: c for c in status["conditions"]}["Reconciled"])


class FakeSecretWatch:
    """A fake of kopf's Secret watch (not kopf): it hands ``secret_handler`` what kopf's
    watcher would, from the in-memory API: a listing is every labelled Secret with ``type``
    ``None`` (at start, and again after a ``410 Gone`` or a pause), and a watch event is one
    Secret with its type. A delete while the watch is down is simply never seen, as with kopf."""

    def __init__(self, rt: Runtime, kube: FakeKube) -> None:
        self.rt, self.kube = rt, kube

    async def listing(self) -> None:
        for found in await self.kube.list_objects("Secret", NS, label_selector=SELECTOR):
            await _event(self.rt, found, None)

    async def event(self, type_: str, body: dict[str, Any]) -> None:
        await _event(self.rt, body, type_)


SELECTOR = f"{WATCH_LABEL}=true"


def _with_uids(kube: FakeKube) -> None:
    """Give every Secret a uid, as the API server does (kopf keys its events by it)."""
    for (kind, _, name), obj in kube.objects.items():
        if kind == "Secret":
            obj["metadata"].setdefault("uid", f"uid-{name}")


async def test_a_secret_deleted_while_the_watch_was_down_is_reported_by_the_relist(
    runtime: Runtime, kube: FakeKube
) -> None:
    await _reconciled(runtime, kube)
    _with_uids(kube)
    watch = FakeSecretWatch(runtime, kube)
    mark = len(kube.calls)
    await watch.listing()  # the first listing: every policy's resume handler does the work
    assert [c for c in kube.calls[mark:] if c[0] == "patch_status"] == []
    # The watch stream ends (410 Gone); the Secret is deleted before kopf lists again.
    await kube.delete("Secret", NS, "payouts-downstream")
    mark = len(kube.calls)
    await watch.listing()
    reconciled = _reconciled_condition(kube)
    assert (reconciled["status"], reconciled["reason"]) == ("False", "SecretMissing")
    assert "payouts-downstream" in reconciled["message"]
    # One re-render for the whole re-list, not one per listed Secret.
    assert [c[0] for c in kube.calls[mark:]].count("patch_status") == 1


async def test_every_relist_is_told_from_the_first_listing_and_watch_events_between(
    runtime: Runtime, kube: FakeKube
) -> None:
    await _reconciled(runtime, kube)
    _with_uids(kube)
    watch = FakeSecretWatch(runtime, kube)
    await watch.listing()
    # A Secret created and another modified while watching: watch events, not a re-list.
    created = secret(NS, "payouts-new", {"k": b"v"})
    kube.put(created)
    _with_uids(kube)
    await watch.event("ADDED", copy.deepcopy(kube.objects[("Secret", NS, "payouts-new")]))
    rotated = copy.deepcopy(kube.objects[("Secret", NS, "treasury-lead-token")])
    await watch.event("MODIFIED", rotated)
    for round_ in range(2):  # two re-lists: each one re-renders once
        mark = len(kube.calls)
        await watch.listing()
        assert [c[0] for c in kube.calls[mark:]].count("patch_status") == 1, round_
    # A Secret deleted through the watch is forgotten: the next listing does not show it.
    gone = copy.deepcopy(kube.objects[("Secret", NS, "payouts-new")])
    await kube.delete("Secret", NS, "payouts-new")
    await watch.event("DELETED", gone)
    mark = len(kube.calls)
    await watch.listing()
    assert [c[0] for c in kube.calls[mark:]].count("patch_status") == 1


def test_secret_listings_per_namespace() -> None:
    listings = SecretListings()

    def body(namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name, "uid": f"{namespace}-{name}"}}

    first = [body("a", "x"), body("a", "y"), body("b", "x")]
    assert [listings.listed(b) for b in first] == [False, False, False]
    # A re-list of both namespaces: the first event of each starts its round.
    assert [listings.listed(b) for b in first] == [True, False, True]
    # A Secret created while the watch was down is listed in the round already begun.
    assert listings.listed(body("a", "z")) is False
    assert [listings.listed(b) for b in (body("a", "z"), body("a", "x"))] == [True, False]
