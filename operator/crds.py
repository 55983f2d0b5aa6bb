"""CustomResourceDefinitions generated from the pydantic models in ``models.py``.

:func:`generate_crds` returns one CRD manifest per resource; :func:`structural_schema` turns a
pydantic JSON schema into a Kubernetes *structural* schema: every ``$ref`` inlined, ``anyOf``
with ``null`` collapsed to the non-null branch, free-form objects (a policy's parameter JSON
Schema) marked ``x-kubernetes-preserve-unknown-fields``, ``additionalProperties: false`` dropped
(structural schemas prune unknown fields anyway), ``const`` turned into a one-value ``enum``,
JSON Schema 2020-12 numeric ``exclusiveMinimum`` turned into the OpenAPI v3.0 boolean form, and
``title`` left out. A node marked ``x-kubernetes-int-or-string`` (a resource quantity) keeps its
``anyOf`` of integer and string, the one union a structural schema allows. The models'
``x-kubernetes-validations`` (CEL) pass through unchanged.

:func:`write_crds` writes ``crds/<plural>.yaml`` (plain manifests), the chart's CRD templates
``charts/agentsafe/templates/crds/<plural>.yaml`` (gated by ``crds.enabled``, kept through
uninstall under ``crds.keep``, upgraded with the chart) and kopf's peering CRDs in the
``kopf-peering`` subchart; :func:`stale_crds` names the files that differ from what the models
generate (``agentsafe crds check`` and ``tests/operator/test_crds_fresh.py``).

Callers: ``cli.py`` (``agentsafe crds generate|check``), the tests.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from .models import (
    GROUP,
    VERSION,
    AgentPolicySpec,
    AgentPolicyStatus,
    ConditionType,
    HaltSwitchSpec,
    HaltSwitchStatus,
    PrincipalSpec,
    PrincipalStatus,
)

__all__ = [
    "CHART_CRD_TEMPLATES",
    "PEERING_CRD_FILE",
    "RESOURCES",
    "CrdResource",
    "generate_crds",
    "peering_crds",
    "render_crd_files",
    "stale_crds",
    "structural_schema",
    "write_crds",
]

CATEGORY: Final = "agentsafe"

_READY = f'.status.conditions[?(@.type=="{ConditionType.READY}")].status'
_DROP: Final = frozenset({"title", "examples", "discriminator", "$schema", "$id", "$comment"})


@dataclass(frozen=True)
class CrdResource:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[tuple[str, str, str], ...]  # (name, type, jsonPath)
    description: str
    root_rules: tuple[tuple[str, str], ...] = ()


RESOURCES: Final[tuple[CrdResource, ...]] = (
    CrdResource(
        kind="AgentPolicy",
        plural="agentpolicies",
        singular="agentpolicy",
        short_names=("ap", "agentpol"),
        spec=AgentPolicySpec,
        status=AgentPolicyStatus,
        columns=(
            ("Mode", "string", ".spec.mode"),
            ("Ready", "string", _READY),
            ("Halted", "boolean", ".status.halted"),
            ("Replicas", "integer", ".spec.replicas"),
            ("Workers", "integer", ".status.workers"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ),
        description="A policy and the hardened executor workload that enforces it.",
        root_rules=(
            (
                "size(self.metadata.name) <= 40",
                "an AgentPolicy's name is at most 40 characters (its children add suffixes)",
            ),
        ),
    ),
    CrdResource(
        kind="Principal",
        plural="principals",
        singular="principal",
        short_names=("asp", "agentprincipal"),
        spec=PrincipalSpec,
        status=PrincipalStatus,
        columns=(
            ("Role", "string", ".spec.role"),
            ("Credential", "string", ".status.credential"),
            ("Policies", "integer", ".status.policies"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ),
        description="A caller of executors: its role, what it may do and how it proves itself.",
    ),
    CrdResource(
        kind="HaltSwitch",
        plural="haltswitches",
        singular="haltswitch",
        short_names=("halt", "hs"),
        spec=HaltSwitchSpec,
        status=HaltSwitchStatus,
        columns=(
            ("Halted", "boolean", ".spec.halted"),
            ("Reason", "string", ".spec.reason"),
            ("Acknowledged", "string", ".status.acknowledged"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ),
        description="Stops every selected executor, durably and at once.",
    ),
)


# --------------------------------------------------------------------------------------------
# Structural schema


_MAP_LIMIT = 64  # maxProperties of a keyed map, so the API server can bound its CEL key rule


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's validation JSON schema as a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: Mapping[str, Any] = raw.pop("$defs", {})
    return _convert(raw, defs, depth=0)


def _resolve(ref: str, defs: Mapping[str, Any]) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise ValueError(f"cannot inline the reference {ref!r}")
    return copy.deepcopy(dict(defs[ref[len(prefix) :]]))


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], *, depth: int) -> dict[str, Any]:
    if depth > 64:
        raise ValueError("schema nests too deep (a recursive model cannot be a CRD schema)")
    schema = dict(node)
    if "$ref" in schema:
        target = _resolve(schema.pop("$ref"), defs)
        target.update(schema)  # siblings of $ref (description, default) win
        schema = target
    if schema.get("x-kubernetes-int-or-string") is True:
        return schema  # its anyOf of integer and string is the structural form Kubernetes wants
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b != {"type": "null"}]
        if len(branches) != 1:
            raise ValueError("a union other than Optional[X] has no structural form")
        merged = dict(branches[0])
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            rest.pop("default")
        schema = _convert({**merged, **rest}, defs, depth=depth + 1)
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out["properties"] = {
                name: _convert(sub, defs, depth=depth + 1) for name, sub in value.items()
            }
        elif key == "items":
            out["items"] = _convert(value, defs, depth=depth + 1)
        elif key == "patternProperties":
            # Kubernetes has no patternProperties: the values' schema becomes
            # additionalProperties and the key pattern a CEL rule (bounded by maxProperties).
            if len(value) != 1:
                raise ValueError("only one key pattern per map has a structural form")
            ((pattern, sub),) = value.items()
            out["additionalProperties"] = _convert(sub, defs, depth=depth + 1)
            out.setdefault("maxProperties", schema.get("maxProperties", _MAP_LIMIT))
            out.setdefault("x-kubernetes-validations", []).append(
                {
                    "rule": f"self.all(k, k.matches({json.dumps(pattern)}))",
                    "message": f"every key must match {pattern}",
                }
            )
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                if value:
                    out["additionalProperties"] = _convert(value, defs, depth=depth + 1)
                else:
                    out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # false: structural schemas prune unknown fields; nothing to say
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "description":
            out["description"] = plain_text(value)
        elif key == "default" and value is None:
            continue
        elif key == "required":
            out["required"] = sorted(value)
        else:
            out[key] = copy.deepcopy(value)
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "propertyNames" in out:
        out.pop("propertyNames")
    return out


_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]+\.)?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """A docstring as ``kubectl explain`` should show it: no RST roles or literals, one line
    per paragraph."""
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    paragraphs = [" ".join(part.split()) for part in text.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


# --------------------------------------------------------------------------------------------
# CRD manifests


def _crd(resource: CrdResource) -> dict[str, Any]:
    spec_schema = structural_schema(resource.spec)
    status_schema = structural_schema(resource.status)
    description = plain_text(resource.description)
    root: dict[str, Any] = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "the versioned schema of this object (agentsafe.io/v1alpha1)",
            },
            "kind": {"type": "string", "description": f"the object's kind ({resource.kind})"},
            # The API server refuses anything but a type here (kubectl explain shows ObjectMeta).
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    if resource.root_rules:
        root["x-kubernetes-validations"] = [
            {"rule": rule, "message": message} for rule, message in resource.root_rules
        ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{resource.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "agentsafe"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.singular,
                "shortNames": list(resource.short_names),
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path}
                        for name, kind, path in resource.columns
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def generate_crds() -> list[dict[str, Any]]:
    """One CRD manifest per custom resource, in a stable order."""
    return [_crd(resource) for resource in RESOURCES]


def peering_crds() -> list[dict[str, Any]]:
    """kopf's peering resources (``kopf.dev``), which mandatory peering needs installed."""
    out: list[dict[str, Any]] = []
    for kind, plural, scope in (
        ("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        ("KopfPeering", "kopfpeerings", "Namespaced"),
    ):
        out.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.kopf.dev"},
                "spec": {
                    "group": "kopf.dev",
                    "scope": scope,
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "properties": {
                                        "status": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        }
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    return out


_HEADER = "# Generated by `agentsafe crds generate` from agentsafe.operator.models. Do not edit.\n"
_PEERING_HEADER = _HEADER.replace("from agentsafe.operator.models", "(kopf's peering)")
# The chart's own CRDs are templates, as cert-manager ships them: `helm upgrade` updates them,
# `crds.enabled=false` leaves them to whoever installs them, and `crds.keep` (the default)
# keeps them (and so every AgentPolicy, Principal and HaltSwitch) through `helm uninstall`.
CHART_CRD_TEMPLATES: Final = "charts/agentsafe/templates/crds"
# kopf's peering CRDs stay in the CRD-only subchart's crds/ directory: Helm installs those before
# it validates the peering object the chart creates (a template CRD would come too late), and
# the subchart's condition `peering.installCRDs` decides whether they are installed at all.
PEERING_CRD_FILE: Final = "charts/agentsafe/charts/kopf-peering/crds/kopf-peering.yaml"
_CHART_GATE_OPEN = "{{- if .Values.crds.enabled }}\n"
_CHART_GATE_CLOSE = "{{- end }}\n"
_CHART_KEEP = (
    "metadata:\n"
    "  {{- if .Values.crds.keep }}\n"
    "  annotations:\n"
    "    helm.sh/resource-policy: keep\n"
    "  {{- end }}\n"
)


def _dump(manifest: Mapping[str, Any]) -> str:
    text = yaml.safe_dump(dict(manifest), sort_keys=False, width=100, allow_unicode=True)
    if "{{" in text or "}}" in text:
        raise ValueError("a CRD's text holds template braces; it cannot be a Helm template")
    return text


def render_crd_files() -> dict[str, str]:
    """Path relative to the repository -> text, for every generated CRD file.

    ``crds/`` holds all five CRDs as plain manifests (``kubectl apply -f crds/``); the chart holds
    agentsafe's three as templates gated by ``crds.enabled`` (and annotated to survive uninstall
    under ``crds.keep``), and kopf's two in its peering subchart.
    """
    files: dict[str, str] = {}
    for resource, crd in zip(RESOURCES, generate_crds(), strict=True):
        text = _dump(crd)
        name = f"{resource.plural}.{GROUP}.yaml"
        files[f"crds/{name}"] = _HEADER + text
        if not text.startswith(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n"
        ):
            raise ValueError("unexpected CRD layout")
        files[f"{CHART_CRD_TEMPLATES}/{name}"] = (
            _HEADER
            + _CHART_GATE_OPEN
            + text.replace("metadata:\n", _CHART_KEEP, 1)
            + _CHART_GATE_CLOSE
        )
    peering = [_dump(crd) for crd in peering_crds()]
    for crd, text in zip(peering_crds(), peering, strict=True):
        files[f"crds/{crd['metadata']['name']}.yaml"] = _PEERING_HEADER + text
    files[PEERING_CRD_FILE] = _PEERING_HEADER + "---\n".join(peering)
    return files


def write_crds(root: Path) -> list[Path]:
    """Write the CRDs under ``root`` (the repository); returns the paths written."""
    written: list[Path] = []
    for relative, text in render_crd_files().items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_crds(root: Path) -> list[str]:
    """Relative paths of CRD files that are missing or differ from what the models generate."""
    stale: list[str] = []
    for relative, text in render_crd_files().items():
        try:
            current = (root / relative).read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            stale.append(relative)
    return stale
