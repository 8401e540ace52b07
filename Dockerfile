# corpusync worker image (CPU). GPU users: start FROM a CUDA PyTorch image and drop the torch pin.
FROM python:3.11-slim
WORKDIR /opt/corpusync
COPY pyproject.toml README.md ./
COPY requirements requirements
COPY corpusync corpusync
COPY flows flows
COPY tasks tasks
COPY schemas schemas
COPY evaluation evaluation
COPY query query
COPY sql sql
RUN pip install --no-cache-dir -c requirements/constraints.txt torch \
 && pip install --no-cache-dir -c requirements/constraints.txt -e .
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 CORPUSYNC_CHECKOUT=/opt/corpusync
