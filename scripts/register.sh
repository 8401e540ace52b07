#!/usr/bin/env bash
# Registers prefect.yaml's deployments on the Prefect server at PREFECT_API_URL: docker-compose.yml's
# one-shot `register` service (and tests/test_install.py). `prefect deploy` refuses a deployment whose work
# pool does not exist yet, so first the process work pool and the queues the deployments name are created
# when missing (the `writer` queue with a concurrency limit of 1: one writer at a time, as prefect.yaml
# says), then `prefect deploy --all`.
#
#   scripts/register.sh [POOL]
#
# With POOL (the gpu profile's corpusync-gpu) every deployment goes to that pool instead of prefect.yaml's
# (`prefect deploy --all` ignores --pool, so they are deployed one by one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
override="${1:-}"
PY="${PYTHON:-python}"

# "deployment pool queue" for each deployment of prefect.yaml
mapfile -t targets < <("$PY" - <<'EOF'
import yaml

for d in yaml.safe_load(open("prefect.yaml", encoding="utf-8"))["deployments"]:
    wp = d.get("work_pool") or {}
    print(d["name"], wp.get("name") or "corpusync", wp.get("work_queue_name") or "default")
EOF
)
[ "${#targets[@]}" -gt 0 ] || { echo "register.sh: no deployments in prefect.yaml" >&2; exit 1; }

declare -A seen=()
for t in "${targets[@]}"; do
  read -r _ pool queue <<<"$t"
  pool="${override:-$pool}"
  if [ -z "${seen[$pool]:-}" ]; then
    prefect work-pool inspect "$pool" >/dev/null 2>&1 || prefect work-pool create "$pool" --type process
    seen[$pool]=1
  fi
  if [ -z "${seen[$pool/$queue]:-}" ]; then
    prefect work-queue inspect "$queue" --pool "$pool" >/dev/null 2>&1 \
      || prefect work-queue create "$queue" --pool "$pool"
    [ "$queue" != writer ] || prefect work-queue set-concurrency-limit "$queue" 1 --pool "$pool"
    seen[$pool/$queue]=1
  fi
done

if [ -z "$override" ]; then
  prefect --no-prompt deploy --all
else
  for t in "${targets[@]}"; do
    read -r name _ _ <<<"$t"
    prefect --no-prompt deploy --name "$name" --pool "$override"
  done
fi
