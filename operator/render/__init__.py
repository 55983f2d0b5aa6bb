"""Pure render functions: an AgentPolicy (and what it selects) -> Kubernetes manifests.

Callers: ``reconcile.py``, ``operator/halt.py``, ``readiness.py``, ``runtime.py``, the tests.
"""

from .children import Rendered, check_policy, compile_spec_policy, render_children
from .common import PolicyRef, RenderError, RenderInput, SelectedPrincipal, names
from .config import (
    render_authority_key_secret,
    render_configmap,
    render_metrics_token_secret,
    render_operator_token_secret,
    render_principals_document,
)
from .network import (
    render_agent_network_policies,
    render_executor_network_policy,
    render_pdb,
    render_service,
)
from .workload import render_environment, render_service_account, render_statefulset

__all__ = [
    "PolicyRef",
    "RenderError",
    "RenderInput",
    "Rendered",
    "SelectedPrincipal",
    "check_policy",
    "compile_spec_policy",
    "names",
    "render_agent_network_policies",
    "render_authority_key_secret",
    "render_children",
    "render_configmap",
    "render_environment",
    "render_executor_network_policy",
    "render_metrics_token_secret",
    "render_operator_token_secret",
    "render_pdb",
    "render_principals_document",
    "render_service",
    "render_service_account",
    "render_statefulset",
]
