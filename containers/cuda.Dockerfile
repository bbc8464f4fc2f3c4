# The kit on vLLM's CUDA build: every Python package from one wheel lock
# (containers/locks/*.lock.json, the same lock the bare-host install set is made from).
#
# Built by `python -m repro build-image --variant cuda` (repro/containers/cuda.py), which makes
# the context: pip/ holds lock.txt (every wheel as name==version --hash=sha256:…), lock.json
# (the lock itself, kept in the image), pip.conf (where the wheels come from: the kit's local
# wheel server over the build's host network with no index at all, or an index), kit/ (the
# kit's own wheel) and patches/ (`--patch` overlays).
#
# Build arguments (both pins, recorded as labels and in the image record):
#   BASE_IMAGE      nvidia/cuda:<tag>@sha256:<digest> (containers/base-images.json), or the
#                   kit's local Ubuntu base by image id where no registry can be reached; CUDA's
#                   user-space libraries come from torch's nvidia-* wheels either way
#   PYTHON_VERSION  the lock's Python (3.12); installed from the base's apt where missing
#
# Layers: metadata and labels first, while the file system is small (with the vfs storage
# driver every step copies the whole file system), then the small context, then one layer
# with everything Python. The kit is in that layer too: a kit layer after it would copy the
# several GB again under vfs, so a kit change re-runs the install (minutes from the wheel
# server) instead of copying it.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ENV PATH=/opt/venv/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    REPRO_IN_CONTAINER=1 \
    HF_HUB_OFFLINE=1 \
    REPRO_CACHE=/cache
WORKDIR /work
ENTRYPOINT ["python", "-m", "repro"]
CMD ["--help"]
# Labels here, before the install: a LABEL step after it copies the whole image under vfs
# (measured: over 5 minutes for 0.26.0's 7 GB). The price: a new kit commit re-runs the install.
# REPRO-LABELS (the kit puts one LABEL instruction here)

COPY pip/ /opt/repro-pip/
ARG PYTHON_VERSION
RUN test -n "${PYTHON_VERSION}" || { echo "build argument PYTHON_VERSION is required" >&2; exit 1; } \
 && if ! command -v "python${PYTHON_VERSION}" >/dev/null; then \
        apt-get update \
     && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev" \
            g++ libnuma1 patch ca-certificates \
     && rm -rf /var/lib/apt/lists/*; \
    fi \
 && "python${PYTHON_VERSION}" -m venv /opt/venv \
 && PIP_CONFIG_FILE=/opt/repro-pip/pip.conf pip install --no-deps --require-hashes \
        --only-binary=:all: --requirement /opt/repro-pip/lock.txt \
 && pip install --no-deps --no-index /opt/repro-pip/kit/*.whl \
 && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && for diff in /opt/repro-pip/patches/*.diff; do \
        if [ -e "${diff}" ]; then python -m repro patch --site "${site}" "${diff}"; fi; \
    done \
 && python -m repro image-check --lock /opt/repro-pip/lock.json --at-build
