# hypertopo: one image for the agent, the aggregator and the scheduler (the command picks the part).
#   docker build -t ghcr.io/hypertopo/hypertopo:0.1.0 .
# Stage 1 builds a wheel and its dependencies; stage 2 installs them into a slim runtime with no
# compilers and no pip cache. The aggregator and scheduler run as UID 65532; the agent's manifest
# runs it as root with every capability dropped except NET_RAW (raw LLDP sockets), no privileged.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY aggregator ./aggregator
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
# lldpd provides lldpcli for reading a host lldpd through its mounted socket (optional source).
RUN apt-get update \
 && apt-get install -y --no-install-recommends lldpd \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin hypertopo
USER 65532
EXPOSE 9730 9731 9732
ENTRYPOINT []
CMD ["hypertopo-agent", "--help"]
