# syntax=docker/dockerfile:1
# One agentsafe image, two entrypoints:
#   agentsafe serve     the executor (default command; what AgentPolicy StatefulSets run)
#   agentsafe operator  the kopf operator (what the Helm chart's Deployment runs)
# No configuration inside: every setting comes from the environment and mounted files at run
# time. The final stage is distroless (no shell, no package manager), runs as a non-root user
# and writes nothing to its root filesystem, so readOnlyRootFilesystem: true holds.

# --- build: a virtual environment with agentsafe and its dependencies, byte-compiled ---------
FROM debian:12-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# Debian 12's python3 is the interpreter the distroless runtime below ships (3.11, /usr/bin).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY executor/ executor/
COPY operator/ operator/
RUN python3 -m venv /opt/agentsafe \
 && /opt/agentsafe/bin/pip install --no-compile ".[operator]" \
 && /opt/agentsafe/bin/pip uninstall -y pip setuptools wheel \
 && /opt/agentsafe/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/agentsafe

# --- runtime: distroless python, non-root ---------------------------------------------------
FROM gcr.io/distroless/python3-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title="agentsafe" \
      org.opencontainers.image.description="The execution boundary between AI agents and the systems they change" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/agentsafe /opt/agentsafe
ENV AGENTSAFE_ENV=production \
    PATH=/opt/agentsafe/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532 is distroless's "nonroot"; the chart and the operator's rendered pods use the same ids.
USER 65532:65532
ENTRYPOINT ["/opt/agentsafe/bin/agentsafe"]
CMD ["serve"]
