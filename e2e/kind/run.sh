#!/usr/bin/env bash
# The kind path of the end-to-end suite (`make e2e-kind`): a real cluster with real pods.
#   1. create the kind cluster from e2e/kind/cluster.yaml (reused if it exists)
#   2. build the agentsafe image and load it into the cluster's nodes
#   3. helm install the chart with that image (pulled never: it is already on the nodes)
#   4. run the same e2e scenarios with --backend=kind: the chart's operator Deployment renders
#      real executor pods (the same image: the chart's executor.image defaults to image.*),
#      reached by kubectl port-forward; the downstream is e2e/kind/provider.yaml (test-only)
# Needs: docker, kind, kubectl, helm on PATH. KEEP_CLUSTER=1 keeps the cluster afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER="${KIND_CLUSTER:-agentsafe-e2e}"
IMAGE="${AGENTSAFE_IMAGE:-agentsafe:e2e}"
NAMESPACE="${AGENTSAFE_NAMESPACE:-agentsafe-system}"
PYTHON="${PYTHON:-.venv/bin/python}"

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is required on PATH" >&2; exit 2; }
done

if ! kind get clusters | grep -qx "$CLUSTER"; then
  echo "== creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --config e2e/kind/cluster.yaml --wait 180s
fi
if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
  trap 'kind delete cluster --name "$CLUSTER"' EXIT
fi
export KUBECONFIG="${KUBECONFIG_KIND:-$(mktemp)}"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"

echo "== building and loading $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "== installing the chart"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl label namespace "$NAMESPACE" --overwrite pod-security.kubernetes.io/enforce=restricted
helm upgrade --install agentsafe charts/agentsafe \
  --namespace "$NAMESPACE" \
  --set image.repository="${IMAGE%:*}" \
  --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never \
  --set 'metrics.scraper.namespaceSelector.kubernetes\.io/metadata\.name=agentsafe-e2e-monitoring' \
  --wait --timeout 5m
helm test agentsafe --namespace "$NAMESPACE" --timeout 2m

echo "== running the e2e scenarios against kind"
# AGENTSAFE_E2E_IMAGE: the scenario checks the operator renders exactly the image loaded above.
AGENTSAFE_E2E=require AGENTSAFE_E2E_NAMESPACE="$NAMESPACE" AGENTSAFE_E2E_IMAGE="$IMAGE" \
  "$PYTHON" -m pytest e2e --backend=kind -p no:cacheprovider "$@"
