#!/usr/bin/env bash
# One device call for the Prometheus exposition on a real GPU (issue 32): a GPU trainer run recorded with
# `record --metrics-port`, scraped every second by a plain HTTP client while it runs; the scrapes, the log
# dir and NVML's own view (index, UUID) come back in OUT_DIR and are checked on the CPU machine by
# bench/check_gpu_metrics.py (the series per GPU and per process carry NVML's UUID; allocator, NVML and
# RSS gauges and the true-peak gauge are there for the GPU process).
#   scripts/gpu_metrics.sh OUT_DIR      (prometheus_client as a wheel in .whl/: run(carry=[".whl"]))
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out/scrapes"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/prometheus_client-*.whl \
  && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader > "$out/nvidia_smi.csv"
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
timeout 300 python3 -m miles_profile.record --log-dir "$out/logs" --metrics-port "$port" -- \
  --preset gpu --num-rollout 3 --offload-train --offload-rollout > "$out/record.log" 2>&1 &
rec=$!
i=0
while kill -0 $rec 2>/dev/null; do
  sleep 1; i=$((i + 1))
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics', timeout=2).read().decode())" \
    > "$out/scrapes/$(printf %04d $i).txt" 2>/dev/null || rm -f "$out/scrapes/$(printf %04d $i).txt"
done
wait $rec; echo "record rc=$? after ${SECONDS} s, $(ls "$out/scrapes" | wc -l) scrapes"
tail -3 "$out/record.log"
(cd "$out" && tar czf logs.tgz logs scrapes && rm -rf logs scrapes)
