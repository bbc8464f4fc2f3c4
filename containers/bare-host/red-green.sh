#!/usr/bin/env bash
# Red/green on a bare GPU host without network: install the carried vLLM set, run the arms on
# stock vLLM, patch a copy with the cold-race fix, run the arms again on the patched copy.
#
#   containers/bare-host/red-green.sh PARTS_DIR OUT_DIR [PATCH]
#
# PARTS_DIR holds an install set (python -m repro.installset build …): manifest.json + parts;
# installing it needs the host's python3 and its pip.
# The tiny model is found through REPRO_CACHE (carry it; building it needs transformers too).
# REPRO_PROFILE picks the tiny profile (default tiny; tiny-nemotron-h for the Mamba2 model;
# tiny-nemotron-h-tp4 for it at tensor parallel 4 on four GPUs, docs/tp4.md).
# REPRO_PHASES (default "install stock patched") picks steps, so a host whose calls are time
# limited can run them in separate calls: the installed trees stay under /tmp meanwhile.
# REPRO_EXTRA_WHEELS: a folder of wheels the kit itself needs and the host lacks, installed
# beside vLLM; on the measured H200 host that is jsonschema with its format-nongpl extra
# (rfc3339-validator and friends), fetched where pip works with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     -d WHEELS 'jsonschema[format-nongpl]'
# The install phase checks that artifacts can be validated, so a missing wheel stops it there.
# REPRO_RUN_ARGS: more arguments for each `repro run` (e.g. "--override async_scheduling=false"
# or "--inject-fault"); REPRO_TAG names that variant's run directories (OUT/stock-TAG/...).
set -euo pipefail
parts=$1 out=$2
patch=${3:-containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff}
kit=$(cd "$(dirname "$0")/../.." && pwd)
stock=/tmp/repro-site-stock patched=/tmp/repro-site-patched
phases=${REPRO_PHASES:-install stock patched}
export PYTHONUNBUFFERED=1 REPRO_KIT_CHECKOUT="$kit"
# NVLink multicast off in every process (repro.gpu_host.GPU_HOST_ENV; a value set before wins).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
mkdir -p "$out"

t() { local s=$SECONDS; "$@"; echo "[timing] $* : $((SECONDS - s)) s" | tee -a "$out/timings.txt"; }

for phase in $phases; do
  case $phase in
    install)
      t env PYTHONPATH="$kit" python3 -m repro.installset install --parts "$parts" --target "$stock"
      for w in "${REPRO_EXTRA_WHEELS:-}"/*.whl; do
        [ -f "$w" ] && python3 -m pip install -q --no-deps --no-index --target "$stock" "$w"
      done
      PYTHONPATH="$stock:$kit" python3 -c \
        'from repro.artifact import require_validation; require_validation()'
      rm -rf "$patched"
      t cp -a "$stock" "$patched"
      # The kit's CLI imports jsonschema, which the host has only through the install set.
      t env PYTHONPATH="$stock:$kit" python3 -m repro patch --site "$patched" "$patch"
      ;;
    stock | patched)
      site=$stock
      [ "$phase" = patched ] && site=$patched
      t env PYTHONPATH="$site:$kit" python3 -m repro run --profile "${REPRO_PROFILE:-tiny}" --device cuda \
        --out "$out/$phase${REPRO_TAG:+-$REPRO_TAG}" ${REPRO_ARMS:+--arms $REPRO_ARMS} \
        ${REPRO_RUN_ARGS:-} || true
      ;;
    *) echo "red-green: unknown phase $phase (expected install, stock or patched)" >&2; exit 2 ;;
  esac
done
