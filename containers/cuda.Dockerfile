# The kit on vLLM's CUDA build, pinned per vLLM ref. Not buildable on the kit's development
# machine (no registry there); `python -m repro` renders its build arguments from
# containers/base-images.json and the ref (repro/containers/build.py cuda_build_args).
#
# Build arguments (all required; every one is a pin):
#   BASE_IMAGE      nvidia/cuda:<tag>@sha256:<digest>   (by digest, from base-images.json)
#   PYTHON_VERSION  e.g. 3.12                            (the base's python, from the pins)
#   CUDA_VARIANT    e.g. cu129                           (wheel variant: torch index, wheels.vllm.ai)
#   TORCH_VERSION   e.g. 2.13.0                          (what vLLM pins at that ref)
#   VLLM_SOURCE     release | commit | branch            (how VLLM_REF is resolved)
#   VLLM_REF        0.32.0 | 40-hex sha | branch name    (validated by repro.containers.refs)
#
# Refs reach the shell only as quoted "${VLLM_REF}" words, and the kit admits only
# [A-Za-z0-9._/-] in them (repro/containers/refs.py).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION
ARG CUDA_VARIANT
ARG TORCH_VERSION
ARG VLLM_SOURCE
ARG VLLM_REF

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

RUN for arg in PYTHON_VERSION CUDA_VARIANT TORCH_VERSION VLLM_SOURCE VLLM_REF; do \
        if [ -z "${!arg}" ]; then echo "build argument ${arg} is required" >&2; exit 1; fi; \
    done \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev" \
        python3-pip git ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && "python${PYTHON_VERSION}" -m venv /opt/venv
ENV PATH=/opt/venv/bin:${PATH} PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

RUN pip install --index-url "https://download.pytorch.org/whl/${CUDA_VARIANT}" \
        "torch==${TORCH_VERSION}"

# release: PyPI; commit: the per-commit wheel index of vLLM main; branch: its head built from
# source on the merge-base's precompiled binaries (VLLM_USE_PRECOMPILED=1).
RUN case "${VLLM_SOURCE}" in \
      release) pip install "vllm==${VLLM_REF}" "torch==${TORCH_VERSION}" ;; \
      commit)  pip install --extra-index-url "https://wheels.vllm.ai/${VLLM_REF}/${CUDA_VARIANT}" \
                   "vllm" "torch==${TORCH_VERSION}" ;; \
      branch)  git clone --depth 1 --branch "${VLLM_REF}" https://github.com/vllm-project/vllm /tmp/vllm \
               && VLLM_USE_PRECOMPILED=1 pip install "/tmp/vllm" "torch==${TORCH_VERSION}" \
               && rm -rf /tmp/vllm ;; \
      *) echo "VLLM_SOURCE must be release, commit or branch, got ${VLLM_SOURCE}" >&2; exit 1 ;; \
    esac

COPY src/ /src/
RUN pip install /src && rm -rf /src

ENV REPRO_IN_CONTAINER=1 HF_HUB_OFFLINE=1 REPRO_CACHE=/cache
WORKDIR /work
ENTRYPOINT ["python", "-m", "repro"]
CMD ["--help"]
