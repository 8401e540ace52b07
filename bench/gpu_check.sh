#!/usr/bin/env bash
# GPU check (under 5 minutes on one GPU, offline): BGE-M3-architecture embedding throughput, naive vs
# corpusync batching, MFU against the bf16 peak. Needs PyTorch + transformers on the machine; builds the
# model from its config (random weights), so nothing but this repository travels.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  PYTHONUNBUFFERED=1 python3 bench/embed_gpu.py --chunks "${CHUNKS:-3000}" --budget "${BUDGET:-65536}" \
      --repeats "${REPEATS:-3}" --json "$out/embed_gpu.json"
} 2>&1 | tee "$out/gpu_check.log"
