"""The StatefulSet watch: an executor StatefulSet's status moves its AgentPolicy's ``Ready``.

The handler is called as kopf calls an event handler (``body``, ``memo``: kopf's own ``Body`` and
``Memo``) against the in-memory API stand-in (``FakeKube``). What it must do: patch only the
policy's ``halted`` and conditions, only when they change, never render or apply, and leave
policies whose children are not applied for their current generation to their own handlers.
"""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from agentsafe.operator.handlers import policy_handler, statefulset_handler
from agentsafe.operator.kubeapi import ApiError
from agentsafe.operator.runtime import Runtime
from agentsafe.operator.settings import OperatorSettings

from .conftest import NS, memo_for, sts_status
from .fakekube import FakeKube, RecordingEvents

STS = ("StatefulSet", NS, "payouts-executor")
POLICY = ("AgentPolicy", NS, "payouts")
WRITES = ("apply:", "create", "delete")


def _conditions(kube: FakeKube) -> dict[str, dict[str, Any]]:
    status = kube.objects[POLICY].get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


async def _reconcile_and_store(rt: Runtime, kube: FakeKube) -> None:
    """What kopf does for a create/update/timer: run the handler, patch its status."""
    patch = kopf.Patch()
    body = copy.deepcopy(kube.objects[POLICY])
    try:
        await policy_handler(body=kopf.Body(body), patch=patch, memo=memo_for(rt))
    finally:
        if patch.get("status"):
            await kube.patch_status("AgentPolicy", NS, "payouts", dict(patch["status"]))


def _publish(kube: FakeKube, *, ready: int, updated: int | None = None) -> dict[str, Any]:
    """What the StatefulSet controller reports (a write through the API: a new version)."""
    sts = copy.deepcopy(kube.objects[STS])
    sts["status"] = sts_status(sts, ready=ready, updated=updated)
    kube.put(sts)
    return copy.deepcopy(kube.objects[STS])


async def _event(rt: Runtime, sts: dict[str, Any], type_: str = "MODIFIED") -> None:
    await statefulset_handler(
        body=kopf.Body(sts),
        memo=memo_for(rt),
        type=type_,
        event={"type": type_, "object": sts},
        logger=None,
    )


def _writes_since(kube: FakeKube, mark: int) -> list[tuple[str, str, str | None, str | None]]:
    return [c for c in kube.calls[mark:] if c[0].startswith(WRITES)]


@pytest.fixture
async def reconciled(runtime: Runtime, kube: FakeKube) -> Runtime:
    await _reconcile_and_store(runtime, kube)
    ready = _conditions(kube)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ExecutorsNotReady")
    return runtime


async def test_a_ready_statefulset_makes_the_policy_ready_without_rendering(
    reconciled: Runtime, kube: FakeKube
) -> None:
    before = copy.deepcopy(_conditions(kube))
    mark = len(kube.calls)
    await _event(reconciled, _publish(kube, ready=1))
    after = _conditions(kube)
    ready = after["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "ExecutorsReady",
        "1/1 ready",
    )
    assert ready["observedGeneration"] == kube.objects[POLICY]["metadata"]["generation"]
    assert after["Reconciled"] == before["Reconciled"]
    assert kube.objects[POLICY]["status"]["halted"] is False
    # Nothing was rendered or applied: reads and one status patch.
    assert _writes_since(kube, mark) == []
    assert [c for c in kube.calls[mark:] if c[0] == "patch_status"] == [
        ("patch_status", "AgentPolicy", NS, "payouts")
    ]
    assert reconciled.events.posted[-1] == ("Normal", "ExecutorsReady", "1/1 ready")  # type: ignore[attr-defined]


async def test_a_pod_lost_makes_it_not_ready_and_repeats_do_not_patch(
    reconciled: Runtime, kube: FakeKube
) -> None:
    await _event(reconciled, _publish(kube, ready=1))
    became_ready = _conditions(kube)["Ready"]["lastTransitionTime"]
    await _event(reconciled, _publish(kube, ready=0))
    ready = _conditions(kube)["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ExecutorsNotReady",
        "0/1 ready",
    )
    assert reconciled.events.posted[-1][:2] == ("Warning", "ExecutorsNotReady")  # type: ignore[attr-defined]
    assert ready["lastTransitionTime"] >= became_ready
    # The same state again (another event of the same StatefulSet): no write at all.
    mark = len(kube.calls)
    await _event(reconciled, copy.deepcopy(kube.objects[STS]))
    assert [c for c in kube.calls[mark:] if c[0] == "patch_status"] == []


async def test_a_rollout_in_progress_is_not_ready(reconciled: Runtime, kube: FakeKube) -> None:
    await _event(reconciled, _publish(kube, ready=1, updated=0))
    ready = _conditions(kube)["Ready"]
    assert (ready["status"], ready["message"]) == ("False", "rollout in progress: 0/1 updated")


async def test_the_timer_agrees_with_the_watch(reconciled: Runtime, kube: FakeKube) -> None:
    """One decision: the drift timer's reconcile writes the Ready the watch wrote, unchanged."""
    await _event(reconciled, _publish(kube, ready=1))
    from_watch = copy.deepcopy(_conditions(kube)["Ready"])
    await _reconcile_and_store(reconciled, kube)
    assert _conditions(kube)["Ready"] == from_watch


async def test_a_deleted_statefulset_is_not_ready(reconciled: Runtime, kube: FakeKube) -> None:
    await _event(reconciled, _publish(kube, ready=1))
    last = copy.deepcopy(kube.objects[STS])
    await kube.delete(*STS)
    await _event(reconciled, last, "DELETED")
    ready = _conditions(kube)["Ready"]
    assert (ready["status"], ready["message"]) == (
        "False",
        "the executor StatefulSet does not exist",
    )
    assert STS not in kube.objects  # the timer repairs it, not the watch


async def test_a_halted_policy_reports_halted(reconciled: Runtime, kube: FakeKube) -> None:
    kube.put(
        {
            "apiVersion": "agentsafe.io/v1alpha1",
            "kind": "HaltSwitch",
            "metadata": {"name": "stop", "namespace": NS, "generation": 1},
            "spec": {"halted": True, "reason": "drill", "policySelector": {}},
        }
    )
    await _event(reconciled, _publish(kube, ready=1))
    ready = _conditions(kube)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Halted")
    assert kube.objects[POLICY]["status"]["halted"] is True


async def test_a_failed_render_keeps_its_reason(
    reconciled: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    broken = copy.deepcopy(kube.objects[POLICY])
    broken["spec"]["policy"]["actions"][0]["rules"][1]["when"] = "params.amountMinor <<< 1"
    broken["metadata"]["generation"] = 2
    kube.put(broken)
    await _reconcile_and_store(reconciled, kube)
    assert _conditions(kube)["Ready"]["reason"] == "PolicyInvalid"
    mark = len(kube.calls)
    await _event(reconciled, _publish(kube, ready=1))
    assert _conditions(kube)["Ready"]["reason"] == "PolicyInvalid"
    assert [c for c in kube.calls[mark:] if c[0] == "patch_status"] == []


async def test_a_generation_not_yet_applied_is_left_to_its_update_handler(
    reconciled: Runtime, kube: FakeKube
) -> None:
    edited = copy.deepcopy(kube.objects[POLICY])
    edited["metadata"]["generation"] = 2
    edited["spec"]["replicas"] = 2
    kube.put(edited)
    mark = len(kube.calls)
    await _event(reconciled, _publish(kube, ready=1))
    assert [c for c in kube.calls[mark:] if c[0] == "patch_status"] == []
    assert _conditions(kube)["Ready"]["reason"] == "ExecutorsNotReady"


async def test_a_statefulset_of_a_previous_policy_with_the_same_name_is_ignored(
    reconciled: Runtime, kube: FakeKube
) -> None:
    sts = _publish(kube, ready=1)
    sts["metadata"]["ownerReferences"][0]["uid"] = "an-older-policy"
    mark = len(kube.calls)
    await _event(reconciled, sts)
    assert [c for c in kube.calls[mark:] if c[0] == "patch_status"] == []


async def test_a_statefulset_without_an_agentpolicy_owner_reads_nothing(
    reconciled: Runtime, kube: FakeKube
) -> None:
    sts = _publish(kube, ready=1)
    del sts["metadata"]["ownerReferences"]
    mark = len(kube.calls)
    await _event(reconciled, sts)
    assert kube.calls[mark:] == []


class RacingKube(FakeKube):
    """Stand-in where another writer changes the policy just before each of the first ``races``
    status patches (as kopf's own status patch may), so the patch meets a newer version."""

    def __init__(self, races: int) -> None:
        super().__init__()
        self.races = races

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Any,
        *,
        resource_version: str | None = None,
    ) -> None:
        if self.races > 0 and resource_version is not None:
            self.races -= 1
            self.put(self.objects[(kind, namespace, name)])  # someone else wrote meanwhile
        await super().patch_status(kind, namespace, name, status, resource_version=resource_version)


def _racing(kube: FakeKube, settings: OperatorSettings, races: int) -> tuple[Runtime, RacingKube]:
    racing = RacingKube(races)
    racing.objects = copy.deepcopy(kube.objects)
    racing._version = kube._version
    return Runtime(kube=racing, settings=settings, events=RecordingEvents()), racing


async def test_a_conflicting_write_is_read_again(
    reconciled: Runtime, kube: FakeKube, settings: OperatorSettings
) -> None:
    rt, racing = _racing(kube, settings, races=1)
    sts = _publish(racing, ready=1)
    await _event(rt, sts)
    assert [c[0] for c in racing.calls].count("patch_status") == 2
    assert _conditions(racing)["Ready"]["status"] == "True"


async def test_persistent_conflicts_are_a_temporary_error(
    reconciled: Runtime, kube: FakeKube, settings: OperatorSettings
) -> None:
    rt, racing = _racing(kube, settings, races=10)
    sts = _publish(racing, ready=1)
    with pytest.raises(kopf.TemporaryError):
        await _event(rt, sts)
    assert _conditions(racing)["Ready"]["status"] == "False"


async def test_api_errors_become_kopf_errors(reconciled: Runtime, kube: FakeKube) -> None:
    sts = _publish(kube, ready=1)
    kube.fail_next = ApiError(503, "ServiceUnavailable", "etcd")
    with pytest.raises(kopf.TemporaryError):
        await _event(reconciled, sts)
