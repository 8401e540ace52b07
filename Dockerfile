# corpusync worker image: the pipeline, its deployments (prefect.yaml) and everything the flows import.
# torch: the CPU build from PyTorch's CPU wheel index (TORCH=cpu, the default), or the CUDA build from the
# default index (TORCH=cuda: docker-compose.yml's `gpu` profile). scripts/install.sh is the one install that
# `make install` and tests/test_install.py run too. No model, corpus or gold set is baked in: compose mounts them.
FROM python:3.11-slim
ARG TORCH=cpu
# libmagic1: unstructured's file-type detection (python-magic), as on a developer machine
RUN apt-get update && apt-get install -y --no-install-recommends libmagic1 && rm -rf /var/lib/apt/lists/*
# no package caches in the image; bytecode compiled at build time (uv leaves it to the first import otherwise)
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 UV_NO_CACHE=1 UV_COMPILE_BYTECODE=1
WORKDIR /opt/corpusync
COPY pyproject.toml README.md prefect.yaml ./
COPY requirements requirements
COPY scripts scripts
COPY corpusync corpusync
COPY flows flows
COPY tasks tasks
COPY schemas schemas
COPY evaluation evaluation
COPY query query
COPY sql sql
RUN bash scripts/install.sh --python python --extras eval --torch "$TORCH"
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 CORPUSYNC_CHECKOUT=/opt/corpusync
