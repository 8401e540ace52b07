#!/usr/bin/env bash
# Index the corpora the shared gold sets bring (CMRC 2018 dev, SQuAD v1.1 dev, DuReader 2.0 demo dev) into
# one index, then evaluate each gold set on it (a fixed subset of LIMIT questions per set).
# Usage: bench/eval_goldsets.sh [GOLDSET_ROOT] ; env LIMIT (default 300), HOME_DIR (default .corpusync-bench)
set -euo pipefail
ROOT=${1:-../shared/data/goldsets}
LIMIT=${LIMIT:-300}
HOME_DIR=${HOME_DIR:-.corpusync-bench}
BIN=${BIN:-.venv/bin}
CORPUS="$HOME_DIR/corpus"
rm -rf "$HOME_DIR"; mkdir -p "$CORPUS"
for set in cmrc2018 squad-v1.1-dev dureader2-demo; do
  "$BIN/corpusync" --home "$HOME_DIR" goldset export "$ROOT/$set" "$CORPUS/$set"
done
/usr/bin/time -f "refresh: %e s wall, %M KiB max RSS" "$BIN/corpusync" --home "$HOME_DIR" refresh -q "$CORPUS"
for set in cmrc2018 squad-v1.1-dev dureader2-demo; do
  /usr/bin/time -f "eval $set: %e s wall" "$BIN/corpusync" --home "$HOME_DIR" eval --goldset "$ROOT/$set" --limit "$LIMIT"
done
