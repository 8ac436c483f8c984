#!/usr/bin/env bash
# Where a TTS server's time goes beside the GPU's: the dynamic server (FastPitch + HiFi-GAN,
# cuda fp16, max batch 8, 5 ms delay) at 32 and 64 closed-loop clients for each switch interval
# (`serve --switch-interval-ms`), beside the in-process batch of 8 it cannot beat; with PYSPY=1
# first a py-spy profile of the server at 32 clients (py-spy on PATH: every thread, waiting
# included, and the interpreter lock's holders). Results: OUT_DIR/*.json, py-spy-*.txt.
#
#   bash scripts/bench_server_host.sh OUT_DIR [INTERVAL_MS ...]   (default: 5 1 0.2)
# BENCH_MODELS: scripts/bench_models.py's folder; DEVICE=cpu PRECISION=fp32 VARIANT=eager:fp32
# WARMUP=1 ITERS=2 and BENCH_MODELS with fastpitch/ and hifigan/ of any voice make a CPU smoke run.
# WORKERS=N serves with `--workers N` (the load starts once every worker has started; PYSPY
# profiles one worker only with WORKERS=1).
set -uo pipefail
out=${1:?usage: bench_server_host.sh OUT_DIR [INTERVAL_MS ...]}
shift
intervals=${*:-5 1 0.2}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
m=${BENCH_MODELS:-/tmp/speechrt-bench-models}
sr="python3 -m speechrt.cli"
mkdir -p "$out"
[ -d "$m/hifigan" ] || python3 scripts/bench_models.py "$m" > /dev/null
$sr bench tts --acoustic "$m/fastpitch" --vocoder "$m/hifigan" --variants "${VARIANT:-cuda:fp16}" \
  --batch-sizes 8 --warmup "${WARMUP:-10}" --iters "${ITERS:-100}" --out-dir "$out" --name in-process > /dev/null 2>&1

serve() {  # serve INTERVAL_MS: the dynamic server on port 8102 once ready (its pid in $pid)
  $sr serve --port 8102 --acoustic "$m/fastpitch" --vocoder "$m/hifigan" --device "${DEVICE:-cuda}" \
    --precision "${PRECISION:-fp16}" --max-batch-size 8 --max-queue-delay-ms 5 --max-queue-size 4096 --warmup \
    --switch-interval-ms "$1" --workers "${WORKERS:-1}" > "$out/serve-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    started=$(grep -c "Application startup complete" "$out/serve-$1.log")
    [ "$started" -ge "${WORKERS:-1}" ] && curl -sf http://127.0.0.1:8102/v2/health/ready \
      > /dev/null && return 0
    kill -0 $pid 2> /dev/null || break
    sleep 1
  done
  echo "server at $1 ms not ready; the end of its log:" >&2
  tail -5 "$out/serve-$1.log" >&2
  kill $pid 2> /dev/null
  exit 1
}

if [ -n "${PYSPY:-}" ]; then  # (py-spy slows what it samples: its load is not a result)
  serve 5
  $sr bench tts --url profiled=http://127.0.0.1:8102 --concurrency 32 --seconds 12 \
    --out-dir /tmp --name pyspy-load > /dev/null 2>&1 &
  load=$!
  sleep 3
  py-spy record -p $pid -d 4 -r 250 --idle --threads --format raw -o "$out/py-spy-threads.txt"
  py-spy record -p $pid -d 4 -r 250 --gil --format raw -o "$out/py-spy-gil.txt"
  wait $load
  kill $pid
  wait $pid 2> /dev/null
fi
for ms in $intervals; do
  serve "$ms"
  $sr bench tts --url "interval-$ms=http://127.0.0.1:8102" --concurrency 32,64 --seconds 10 \
    --out-dir "$out" --name "server-$ms" > /dev/null 2>&1
  kill $pid
  wait $pid 2> /dev/null
done
python3 - "$out" $intervals <<'PY'
import csv, json, sys
out, intervals = sys.argv[1], sys.argv[2:]
row = next(csv.DictReader(open(f"{out}/in-process.csv")))
items = 8 / float(row["latency_s.mean"])
print(f"in-process batch of 8: {1e3 * float(row['latency_s.mean']):.2f} ms, {items:.0f} items/s")
for ms in intervals:
    for r in json.load(open(f"{out}/server-{ms}.json"))["rows"]:
        print(f"{ms} ms, {r['level']} clients: {r['throughput_rps']:.1f} req/s "
              f"({r['throughput_rps'] / items:.0%} of in-process), GPU busy {r['gpu_busy_pct']}")
PY
