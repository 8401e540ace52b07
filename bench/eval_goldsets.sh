#!/usr/bin/env bash
# Index the corpora the shared gold sets bring (CMRC 2018 dev, SQuAD v1.1 dev, DuReader 2.0 demo dev) into
# one index with the three gold sets configured (so the refresh tunes the fusion on them, as any gated
# refresh of a new index does, then gates), then evaluate each gold set on it (a fixed subset of LIMIT
# questions per set), and once more with the untuned default fusion for comparison.
# Usage: bench/eval_goldsets.sh [GOLDSET_ROOT] ; env LIMIT (default 300), HOME_DIR (default .corpusync-bench)
set -euo pipefail
ROOT=$(cd "${1:-../shared/data/goldsets}" && pwd)
LIMIT=${LIMIT:-300}
HOME_DIR=${HOME_DIR:-.corpusync-bench}
BIN=${BIN:-.venv/bin}
CORPUS="$HOME_DIR/corpus"
SETS=(cmrc2018 squad-v1.1-dev dureader2-demo)
rm -rf "$HOME_DIR"; mkdir -p "$CORPUS"
for set in "${SETS[@]}"; do
  "$BIN/corpusync" --home "$HOME_DIR" goldset export "$ROOT/$set" "$CORPUS/$set"
done
GOLDSETS=$(for set in "${SETS[@]}"; do printf '"%s/%s",' "$ROOT" "$set"; done | sed 's/,$//')
/usr/bin/time -f "refresh: %e s wall, %M KiB max RSS" env CORPUSYNC_GOLDSETS="[$GOLDSETS]" \
  CORPUSYNC_EVAL_MAX_QUESTIONS="$LIMIT" "$BIN/corpusync" --home "$HOME_DIR" refresh -q "$CORPUS"
for set in "${SETS[@]}"; do
  /usr/bin/time -f "eval $set: %e s wall" "$BIN/corpusync" --home "$HOME_DIR" eval --goldset "$ROOT/$set" --limit "$LIMIT"
done
echo "## untuned default fusion (RRF k 60, weights 1, dense weight scaled by query coverage)"
for set in "${SETS[@]}"; do
  CORPUSYNC_RRF_WEIGHTS='{"dense": 1, "lexical": 1, "sparse": 1}' CORPUSYNC_RRF_K=60 \
    "$BIN/corpusync" --home "$HOME_DIR" eval --goldset "$ROOT/$set" --limit "$LIMIT" | grep -A6 '^| mode'
done
