#!/usr/bin/env bash
# The one install of corpusync: the Dockerfile, `make install` (so CI) and tests/test_install.py run it.
#
#   scripts/install.sh [--python PY] [--extras eval,dev] [--torch auto|cpu|cuda] [--installer uv|pip] [--dry-run]
#
# torch goes first and pinned (requirements/constraints.txt), or a dependency pulls whatever build the
# package index serves: on Linux x86-64 PyPI's torch is the CUDA build (several GB). `cpu` installs the CPU
# build from PyTorch's CPU wheel index (CORPUSYNC_TORCH_INDEX); when that index cannot be reached the
# install falls back to the default index and says so. `cuda` takes the default index's (CUDA) build.
# `auto` (the default, or CORPUSYNC_TORCH): cuda when nvidia-smi lists a GPU, else cpu. torch goes through
# pip, which reads this machine's pip configuration (a local wheel folder or mirror may hold its build).
# Then corpusync itself, editable, with the extras, under the same constraints, through uv (installed into
# PY first, pinned; ~10x pip's speed, the same versions) or pip (--installer pip, or CORPUSYNC_INSTALLER).
# uv reads UV_INDEX_URL/UV_EXTRA_INDEX_URL, not pip's configuration; if uv cannot install, pip does, with a
# message. --dry-run prints the install commands only.
# Every module is compiled to bytecode at install (UV_COMPILE_BYTECODE=0 skips it; the image sets 1): where
# Python may not write __pycache__ (PYTHONDONTWRITEBYTECODE=1, a read-only install) it otherwise compiles each
# module it imports, in every process: seconds of CPU per command (great_expectations 15.7 -> 5.1 s, prefect
# 3.9 -> 1.6 s here), paid again by each worker process a refresh starts.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONSTRAINTS="$ROOT/requirements/constraints.txt"
PY="${PYTHON:-python3}"
EXTRAS=""
TORCH="${CORPUSYNC_TORCH:-auto}"
INSTALLER="${CORPUSYNC_INSTALLER:-uv}"
CPU_INDEX="${CORPUSYNC_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
DRY=0

while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY="$2"; shift 2 ;;
    --extras) EXTRAS="$2"; shift 2 ;;
    --torch) TORCH="$2"; shift 2 ;;
    --installer) INSTALLER="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "install.sh: $*" >&2; }
pip_install() {
  if [ "$DRY" = 1 ]; then echo "pip install $*"; else "$PY" -m pip install -q "$@"; fi
}
# Everything after torch: through uv unless --installer pip; pip where uv cannot be installed or fails.
project_install() {
  if [ "$INSTALLER" = uv ]; then
    if [ "$DRY" = 1 ]; then echo "uv pip install --python $PY $*"; return; fi
    if "$PY" -m pip install -q -c "$CONSTRAINTS" uv && "$PY" -m uv pip install -q --python "$PY" "$@"; then
      return
    fi
    say "uv could not install the packages (its message is above): installing them with pip instead."
  fi
  pip_install "$@"
}

if [ "$TORCH" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    TORCH=cuda
  else
    TORCH=cpu
  fi
fi
case "$TORCH" in
  cpu|cuda) ;;
  *) say "--torch must be auto, cpu or cuda, not '$TORCH'"; exit 2 ;;
esac
case "$INSTALLER" in
  uv|pip) ;;
  *) say "--installer must be uv or pip, not '$INSTALLER'"; exit 2 ;;
esac

# Whether PyTorch's CPU index answers (a short probe: pip itself would retry for minutes).
reachable() {
  "$PY" - "$1" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=15).read(1)
EOF
}

[ "$DRY" = 1 ] || "$PY" -m pip install -q --upgrade pip

if [ "$TORCH" = cpu ]; then
  if reachable "$CPU_INDEX" && pip_install -c "$CONSTRAINTS" --index-url "$CPU_INDEX" torch; then
    say "torch: CPU build from $CPU_INDEX"
  else
    say "PyTorch's CPU wheel index $CPU_INDEX cannot be reached: installing torch from the default package" \
        "index instead (on Linux x86-64 PyPI serves the CUDA build, several GB; it runs on the CPU too)."
    pip_install -c "$CONSTRAINTS" torch
  fi
else
  say "torch: the default index's build (CUDA on Linux x86-64)"
  pip_install -c "$CONSTRAINTS" torch
fi

project_install -c "$CONSTRAINTS" -e "$ROOT${EXTRAS:+[$EXTRAS]}"

# The environment's modules and the project's own (an editable install), to bytecode; what was compiled and has
# not changed since is skipped. Like pip and uv, the few files that do not compile (another Python's syntax,
# in test folders of packages) are passed over in silence.
case "${UV_COMPILE_BYTECODE:-1}" in
  0|false|no) ;;
  *) if [ "$DRY" = 1 ]; then echo "python -m compileall site-packages and the project"; else
       SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
       "$PY" -m compileall -q -j 0 "$SITE" "$ROOT"/{corpusync,flows,tasks,schemas,evaluation,query} >/dev/null 2>&1 \
         || true
     fi ;;
esac

if [ "$DRY" = 0 ]; then
  "$PY" -c 'import torch; print("install.sh: torch", torch.__version__, "CUDA", torch.version.cuda or "none")' >&2
fi
