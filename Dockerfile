# One image, two processes: `quorum-operator` (the default entrypoint) and `quorum-webhooks`
# (set `command: [quorum-webhooks]` in its Deployment). Runs as a non-root numeric user and
# needs no writable path: bytecode is compiled at build time, nothing is written at run time.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY quorum ./quorum
# The runtime venv has no pip or setuptools: the build stage's pip installs into it.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
    && python -m venv --without-pip /opt/quorum \
    && pip --python /opt/quorum/bin/python install --no-cache-dir --compile /dist/quorum-*.whl

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="quorum" \
      org.opencontainers.image.description="Gang admission and GPU-cloud admission policies for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/quorum /opt/quorum
ENV PATH=/opt/quorum/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["quorum-operator"]
