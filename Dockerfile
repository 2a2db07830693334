# The operator's image, wheels-in: the project's wheel and the wheels of its dependencies (at the
# versions of the tested .venv) are built on the host into build/wheels by hack/image.sh, so the
# build itself needs no network. `make image` does all of it with no registry:
#
#   make image                       # a debootstrap-made Debian base, `docker build --network none`
#   BASE_IMAGE=python:3.11-slim-bookworm make image   # the public base (needs a registry)
#
# BASE_IMAGE: a glibc (Debian-like) image with CPython 3.11 as `python3` on PATH; both stages use it,
# so the virtualenv's interpreter link (/usr/bin/python3 or /usr/local/bin/python3) stays valid.
# The final image holds the base and the virtualenv only: no pip, no compiler, no test kit.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS install
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY build/wheels/ /wheels/
# pip runs from its wheel (never installed into the virtualenv), from the local wheels only.
# kubernetes.aio, the client's asyncio twin (a third of the image, 70 MB with its bytecode), is
# removed: nothing imports it (kopf talks to the API with aiohttp; hack/image.sh fails if the
# operator's sources name it). Bytecode is compiled here (hash-based: valid whatever the files'
# times) because the root filesystem is read-only at run time; the last line fails the build if
# an import is missing.
RUN set -eu; \
    python3 -m venv --without-pip /opt/durable-agents; \
    set -- /wheels/pip-*.whl; \
    /opt/durable-agents/bin/python "$1/pip" install --quiet --no-index --find-links /wheels \
        --no-compile --no-warn-script-location durable-agents; \
    rm -rf /opt/durable-agents/bin/activate* /opt/durable-agents/bin/Activate.ps1 \
        /opt/durable-agents/lib/python3*/site-packages/kubernetes/aio; \
    /opt/durable-agents/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
        /opt/durable-agents/lib; \
    /opt/durable-agents/bin/python -c 'import durable_agents_controllers.__main__, durable_agents.kubectl.main'

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=0.0.0
LABEL org.opencontainers.image.title="durable-agents" \
      org.opencontainers.image.description="A Kubernetes operator that makes AI-agent runs durable" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
# A base's own pip (python:*-slim has one) goes; a fixed numeric user and group (Kubernetes'
# runAsNonRoot can only verify a numeric USER).
RUN if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip uninstall --quiet --yes pip setuptools wheel; \
    fi; \
    grep -q '^[^:]*:[^:]*:65532:' /etc/group || echo 'durable-agents:x:65532:' >> /etc/group; \
    grep -q '^[^:]*:[^:]*:65532:' /etc/passwd || \
        echo 'durable-agents:x:65532:65532:durable-agents:/nonexistent:/usr/sbin/nologin' >> /etc/passwd
COPY --from=install /opt/durable-agents /opt/durable-agents
# Nothing is written under / at run time: no bytecode, no output buffering. The only files the
# operator writes (the webhook's serving certificate) go to the temporary directory: mount an
# emptyDir on /tmp.
ENV PATH=/opt/durable-agents/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["/opt/durable-agents/bin/durable-agents-operator"]
