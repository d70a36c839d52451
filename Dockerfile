# hypertopo: one image for the agent, the aggregator and the scheduler (the command picks the part).
#   docker build -t ghcr.io/hypertopo/hypertopo:0.1.0 .
# Only the last stage ships, and it deletes nothing an earlier layer holds (no leftover layer):
# - `lldpcli` builds lldpd's client from Debian's lldpd source (for --lldpd-socket): ~200 kB, libc
#   only, mode 0755. Debian's binary package would bring ~95 MB (SNMP, Perl, ICU for libxml2), and
#   its lldpcli is setuid _lldpd, executable only by group adm: root without CAP_DAC_OVERRIDE under
#   no-new-privileges (the agent's securityContext) cannot run it.
# - `build` installs the pinned, hash-checked dependencies (requirements/runtime.lock) and the
#   hypertopo wheel (--no-deps) into the virtualenv /opt/hypertopo. The kubernetes client's asyncio
#   half (kubernetes/aio, 68 MB), which hypertopo never imports, is left out.
# - The shipped stage adds Debian's perftest (ib_write_lat, ib_write_bw: the measured fabric's RDMA
#   transport, --measure-transport) with the verbs libraries it loads at run time: libibverbs1,
#   librdmacm1 and ibverbs-providers (the user-space drivers: mlx5, rxe, efa, bnxt_re, irdma ...),
#   7.8 MB in all. Debian's package, not a build, because the adapter's command lines are held to
#   its parser (tests/live/test_measure_rdma_probe.py). The `rdma` stage installs them with apt and
#   copies out the files of every package that install added (docs and manuals left out), so the
#   shipped stage runs no apt and holds no apt lists or .debs.
#   The tools do nothing unless the pod gets /dev/infiniband (daemonset/components/rdma-measure).
# The aggregator and scheduler run as UID 65532; the agent's manifest runs it as root with every
# capability dropped except NET_RAW (raw LLDP sockets), not privileged.
FROM python:3.11-slim-bookworm AS lldpcli
WORKDIR /src
# The source as Debian ships it: apt checks the .dsc and tarballs against the signed Sources index;
# sha256sum re-checks them against the .dsc (a mirror without the upstream .asc fails `apt-get
# source` after downloading the rest). Debian's two patches touch the daemon and zsh completion only.
RUN (test ! -f /etc/apt/sources.list.d/debian.sources \
      || sed -i 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources) \
 && (test ! -f /etc/apt/sources.list \
      || sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/deb-src.list) \
 && apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make pkg-config \
 && (apt-get source --download-only lldpd || true) \
 && awk '/^Checksums-Sha256:/{f=1;next} /^[^ ]/{f=0} f && $3 !~ /\.asc$/ {print $1"  "$3}' lldpd_*.dsc \
    | sha256sum -c - \
 && tar -xzf lldpd_*.orig.tar.gz && cd lldpd-*/ \
 && ./configure -q --without-xml --without-readline --without-snmp --without-libbsd --without-seccomp \
      --disable-shared --enable-static --disable-privsep --with-embedded-libevent \
 && make -s -C src/compat \
 && make -s -C src libcommon-daemon-lib.la libcommon-daemon-client.la \
 && make -s -C src/lib \
 && make -s -C src/client lldpcli \
 && install -D -m 0755 -s src/client/lldpcli /out/usr/local/bin/lldpcli

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY requirements ./requirements
# The build tools live in a venv of their own (a Debian python's pip refuses the system, PEP 668);
# the shipped venv has no pip: the tools' pip installs into it (--python).
RUN python3 -m venv /tmp/tools \
 && /tmp/tools/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements/build.lock \
 && python3 -m venv --without-pip /opt/hypertopo \
 && /tmp/tools/bin/pip --python /opt/hypertopo/bin/python install --no-cache-dir --require-hashes --no-deps \
      -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY aggregator ./aggregator
RUN /tmp/tools/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/wheel . \
 && /tmp/tools/bin/pip --python /opt/hypertopo/bin/python install --no-cache-dir --no-deps /tmp/wheel/*.whl \
 && rm -rf /opt/hypertopo/lib/python3.*/site-packages/kubernetes/aio

FROM python:3.11-slim-bookworm AS rdma
# Every file of the packages this install adds (their dependencies too: libnl, libibumad ...), at
# its real path (/lib is /usr/lib on bookworm), for the shipped stage to copy.
RUN dpkg-query -W -f '${Package}\n' | sort > /tmp/before \
 && apt-get update \
 && apt-get install -y --no-install-recommends perftest ibverbs-providers libibverbs1 librdmacm1 \
 && dpkg-query -W -f '${Package}\n' | sort > /tmp/after \
 && comm -13 /tmp/before /tmp/after > /tmp/added \
 && mkdir /out \
 && for package in $(cat /tmp/added); do \
      dpkg -L "$package" | while read -r file; do \
        case "$file" in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;; esac; \
        if [ -f "$file" ] || [ -L "$file" ]; then \
          dir=$(readlink -f "$(dirname "$file")") && mkdir -p "/out$dir" && cp -a "$file" "/out$dir/"; \
        fi; \
      done; \
    done

FROM python:3.11-slim-bookworm
COPY --from=lldpcli /out/ /
COPY --from=rdma /out/ /
COPY --from=build /opt/hypertopo /opt/hypertopo
ENV PATH=/opt/hypertopo/bin:$PATH
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin hypertopo
USER 65532
EXPOSE 9730 9731 9732
ENTRYPOINT []
CMD ["hypertopo-agent", "--help"]
