# syntax=docker/dockerfile:1
# One agentsafe image, two entrypoints:
#   agentsafe serve     the executor (default command; what AgentPolicy StatefulSets run)
#   agentsafe operator  the kopf operator (what the Helm chart's Deployment runs)
# No configuration inside: every setting comes from the environment and mounted files at run
# time. The final stage is distroless (no shell, no package manager), runs as a non-root user
# and writes nothing to its root filesystem, so readOnlyRootFilesystem: true holds.
#
# Without Docker (`make image`): e2e/cluster/images.py tags a debootstrap base under both base
# names below and runs `buildah bud --isolation chroot --pull=never`.
# Behind a TLS-inspecting proxy, pass its CA bundle as a build secret (never copied into a
# layer):  --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt

# --- build: a virtual environment with agentsafe and its dependencies, byte-compiled ---------
FROM debian:12-slim AS build
# PYTHONSAFEPATH: in WORKDIR /src, `python3 -m venv` and pip would otherwise put /src first on
# sys.path, and the repository's operator/ would shadow the standard library's operator module.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONSAFEPATH=1
# Debian 12's python3 is the interpreter the distroless runtime below ships (3.11, /usr/bin).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md image-requirements.txt ./
COPY executor/ executor/
COPY operator/ operator/
# Exactly the hashed lock (`make lock`), nothing resolved here: --require-hashes refuses any file
# whose sha256 is not in image-requirements.txt, --no-deps installs no dependency it does not
# name. Then agentsafe itself from this source tree, built with the locked setuptools offline.
# The CEL binding's REPL (typer, prompt-toolkit) is in it: cel/__init__.py imports cel.cli.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
 && python3 -m venv /opt/agentsafe \
 && /opt/agentsafe/bin/pip install --no-compile --no-deps --require-hashes -r image-requirements.txt \
 && /opt/agentsafe/bin/pip install --no-compile --no-deps --no-index --no-build-isolation . \
 && /opt/agentsafe/bin/pip uninstall -y pip setuptools wheel \
 && /opt/agentsafe/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/agentsafe
# The CycloneDX SBOM of exactly what the runtime carries (/opt/agentsafe), written by the
# maintained cyclonedx-bom over that installed environment. The tool lives in a venv of its own
# that never reaches the runtime stage.
ARG CYCLONEDX_BOM_VERSION=7.5.0
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
 && python3 -m venv /opt/sbom-tool \
 && /opt/sbom-tool/bin/pip install --no-compile "cyclonedx-bom==${CYCLONEDX_BOM_VERSION}" \
 && mkdir -p /opt/agentsafe-sbom \
 && /opt/sbom-tool/bin/cyclonedx-py environment --pyproject pyproject.toml \
      --output-reproducible --output-format JSON \
      --output-file /opt/agentsafe-sbom/agentsafe.cdx.json /opt/agentsafe/bin/python

# --- runtime: distroless python, non-root ---------------------------------------------------
FROM gcr.io/distroless/python3-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title="agentsafe" \
      org.opencontainers.image.description="The execution boundary between AI agents and the systems they change" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/agentsafe /opt/agentsafe
COPY --from=build /opt/agentsafe-sbom/agentsafe.cdx.json /usr/share/doc/agentsafe/sbom.cdx.json
ENV AGENTSAFE_ENV=production \
    PATH=/opt/agentsafe/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532 is distroless's "nonroot"; the chart and the operator's rendered pods use the same ids.
USER 65532:65532
ENTRYPOINT ["/opt/agentsafe/bin/agentsafe"]
CMD ["serve"]
