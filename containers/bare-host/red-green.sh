#!/usr/bin/env bash
# Red/green on a bare GPU host without network: a thin wrapper of the kit's bare matrix,
#
#   containers/bare-host/red-green.sh PARTS_DIR OUT_DIR [CONDITIONS]
#
# which runs
#
#   python3 -m repro matrix --executor bare --device cuda --parts PARTS_DIR \
#     --conditions CONDITIONS --out OUT_DIR
#
# PARTS_DIR holds an install set (python -m repro.installset build …): manifest.json + parts.
# CONDITIONS defaults to containers/bare-host/red-green.toml (stock 0.26.0, the PR #51113
# port, async scheduling off); write your own for another profile (tiny-nemotron-h,
# tiny-nemotron-h-tp4 on four GPUs: docs/tp4.md), arm, patch or setting.
# Each (set, patch set) is installed once into a tree (python -m repro host-install), and the
# same command again keeps every finished cell: run it again after the machine went away.
# REPRO_EXTRA_WHEELS: a folder of wheels the kit itself needs and the host lacks; on the
# measured H200 host that is jsonschema with its format-nongpl extra, fetched where pip works:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     -d WHEELS 'jsonschema[format-nongpl]'
# REPRO_GPUS_PER_CELL=N: run the cells side by side, each on its own N GPUs (default: one
# cell at a time with every GPU; docs/matrix.md, A bare GPU host).
set -euo pipefail
parts=$1 out=$2
kit=$(cd "$(dirname "$0")/../.." && pwd)
conditions=${3:-$kit/containers/bare-host/red-green.toml}
export PYTHONUNBUFFERED=1 REPRO_KIT_CHECKOUT="$kit" PYTHONPATH="$kit"
# NVLink multicast off in every process (repro.engine.process_vars.GPU_HOST_VARIABLES; a value set before wins).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
exec python3 -m repro matrix --executor bare --device cuda --parts "$parts" \
  ${REPRO_EXTRA_WHEELS:+--extra-wheels "$REPRO_EXTRA_WHEELS"} \
  ${REPRO_GPUS_PER_CELL:+--gpus-per-cell "$REPRO_GPUS_PER_CELL"} \
  --conditions "$conditions" --out "$out"
