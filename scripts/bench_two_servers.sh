#!/usr/bin/env bash
# Two plain speechrt servers on one host, one per GPU, each driven by its own closed-loop clients
# at the same time, against one server alone: how far whole-server processes scale on one
# machine without Ray (compare docs/benchmarks.md, "One replica per GPU").
#
#   bash scripts/bench_two_servers.sh OUT_DIR
#
# FastPitch + HiFi-GAN V1 at default dims (scripts/bench_models.py, random weights), cuda fp16,
# max batch 8, 5 ms queue delay, --warmup. Each server is warmed up at 1-32 clients (not
# recorded); then `speechrt bench tts --url` runs LEVELS (default 16,32) against server 0
# alone, then against both servers at once, two client runs side by side (their levels last
# SECONDS_PER_LEVEL each, so they overlap but for the clients' start-up). Results:
# OUT_DIR/{alone,both-gpu0,both-gpu1}.json (stamped), server logs.
set -euo pipefail
out=${1:?usage: bench_two_servers.sh OUT_DIR}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
models=${BENCH_MODELS:-/tmp/speechrt-bench-models}
levels=${LEVELS:-16,32}
seconds=${SECONDS_PER_LEVEL:-8}
sr="python3 -m speechrt.cli"
mkdir -p "$out"
[ -d "$models/hifigan" ] || python3 scripts/bench_models.py "$models"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
voice=(--acoustic "$models/fastpitch" --vocoder "$models/hifigan" --device cuda --precision fp16)
batching=(--max-batch-size 8 --max-queue-delay-ms 5 --max-queue-size 4096)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

start() {  # GPU PORT: one server on that GPU, waited for until ready
  local t0
  t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$1 $sr serve --port "$2" "${voice[@]}" "${batching[@]}" --warmup \
    > "$out/serve-gpu$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 900); do curl -sf "http://127.0.0.1:$2/v2/health/ready" > /dev/null && break; sleep 1; done
  echo "server on GPU $1 ready after $(( $(date +%s) - t0 )) s" | tee -a "$out/serve-ready.txt"
}

start 0 8301
start 1 8302  # after the first: it finds the compiled kernels in the caches
for port in 8301 8302; do
  $sr bench tts --url "warmup=http://127.0.0.1:$port" --concurrency 1,8,32 --seconds 3 \
    --out-dir "$out/warmup" --name "warmup-$port" > "$out/warmup-$port.log" 2>&1 || true
done
run() {  # NAME PORT
  $sr bench tts --url "$1=http://127.0.0.1:$2" --concurrency "$levels" --seconds "$seconds" \
    --out-dir "$out" --name "$1" > "$out/$1.log" 2>&1
}
run alone 8301
run both-gpu0 8301 &
client=$!
run both-gpu1 8302
wait "$client"
for name in alone both-gpu0 both-gpu1; do tail -6 "$out/$name.log"; done
