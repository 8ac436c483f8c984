#!/usr/bin/env bash
# The committed GPU benchmark behind docs/benchmarks.md.
#
#   bash scripts/bench_gpu.sh OUT_DIR [PART ...]
#   PART: fastpitch onnx onnx-tacotron2 tacotron2 jasper quartznet server ttfa (default: all)
#
# Builds default-dims random-weight models (scripts/bench_models.py; no trained weights can be
# downloaded), then runs side by side, in one process per pipeline: eager fp32, eager fp16,
# cuda fp16 and onnx (CPU) at batch 1 and 8 (FastPitch + HiFi-GAN also 4); a server sweep, static
# (max batch 1) vs dynamic batching; and the time to first audio of a streamed ~10 s utterance
# (3 sentences) with dynamic batching. Servers run cuda fp16 with --warmup. Results:
# OUT_DIR/*.json, *.csv, *.png. SERVER_CONCURRENCY (default 1,2,4,8,16,32,64) sets the
# sweep's client counts; TACOTRON2_VARIANTS and TACOTRON2_BATCHES the tacotron2 part's.
set -euo pipefail
out=${1:?usage: bench_gpu.sh OUT_DIR [PART ...]}
shift
parts=${*:-fastpitch onnx onnx-tacotron2 tacotron2 jasper quartznet server ttfa}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
models=${BENCH_MODELS:-/tmp/speechrt-bench-models}
sr="python3 -m speechrt.cli"
mkdir -p "$out"
[ -d "$models/quartznet" ] || python3 scripts/bench_models.py "$models"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" || true

for part in $parts; do
  case $part in
  fastpitch)
    $sr bench tts --acoustic "$models/fastpitch" --vocoder "$models/hifigan" \
      --variants eager:fp32,eager:fp16,cuda:fp16 --batch-sizes 1,4,8 --warmup 10 --iters 100 \
      --out-dir "$out" --name fastpitch-hifigan ;;
  onnx)  # CPU onnxruntime (the GPU image has no onnxruntime-gpu): batch 1 and 8, few iterations
    $sr export "$models/fastpitch" && $sr export "$models/hifigan"
    $sr bench tts --acoustic "$models/fastpitch" --vocoder "$models/hifigan" --backends onnx \
      --device cpu --precisions fp32 --batch-sizes 1,8 --warmup 1 --iters 3 --out-dir "$out" \
      --name fastpitch-hifigan-onnx
    $sr export "$models/jasper"
    $sr bench asr --model "$models/jasper" --backends onnx --device cpu --precisions fp32 \
      --durations 7 --batch-sizes 1,8 --warmup 1 --iters 3 --out-dir "$out" --name jasper-onnx ;;
  onnx-tacotron2)  # few iterations: WaveGlow on the CPU takes seconds per item
    for m in tacotron2 waveglow256; do $sr export "$models/$m"; done
    $sr bench tts --acoustic "$models/tacotron2" --vocoder "$models/waveglow256" --denoise 0.01 \
      --backends onnx --device cpu --precisions fp32 --batch-sizes 1,8 --warmup 0 --iters 2 \
      --out-dir "$out" --name tacotron2-waveglow-onnx ;;
  tacotron2)
    $sr bench tts --acoustic "$models/tacotron2" --vocoder "$models/waveglow256" --denoise 0.01 \
      --variants "${TACOTRON2_VARIANTS:-eager:fp32,eager:fp16,cuda:fp16}" \
      --batch-sizes "${TACOTRON2_BATCHES:-1,8}" --warmup 3 --iters 20 \
      --out-dir "$out" --name tacotron2-waveglow ;;
  jasper)
    $sr bench asr --model "$models/jasper" --variants eager:fp32,eager:fp16,cuda:fp16 \
      --batch-sizes 1,8 --warmup 5 --iters 30 --out-dir "$out" --name jasper ;;
  quartznet)  # 15x5, 7 s only (the row)
    $sr bench asr --model "$models/quartznet" --variants eager:fp32,eager:fp16,cuda:fp16 \
      --durations 7 --batch-sizes 1,8 --warmup 5 --iters 30 --out-dir "$out" --name quartznet ;;
  server)  # one server warms up at a time: two compiling side by side took over 300 s
    pids=()
    for spec in "static 8101 1" "dynamic 8102 8"; do
      set -- $spec
      t0=$(date +%s)
      $sr serve --port "$2" --acoustic "$models/fastpitch" --vocoder "$models/hifigan" \
        --device cuda --precision fp16 --max-batch-size "$3" --max-queue-delay-ms 5 \
        --max-queue-size 4096 --warmup > "$out/serve-$1.log" 2>&1 &
      pids+=($!)
      ready=0  # a server that exits (a missing package, say) fails the part at once
      for _ in $(seq 900); do
        curl -sf "http://127.0.0.1:$2/v2/health/ready" >/dev/null && { ready=1; break; }
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 1
      done
      if [ $ready = 0 ]; then
        echo "server $1 not ready; the end of $out/serve-$1.log:" >&2
        tail -5 "$out/serve-$1.log" >&2; kill "${pids[@]}" 2>/dev/null; exit 1
      fi
      echo "server $1 ready after $(( $(date +%s) - t0 )) s" | tee -a "$out/serve-ready.txt"
    done
    $sr bench tts --url static=http://127.0.0.1:8101 --url dynamic=http://127.0.0.1:8102 \
      --concurrency "${SERVER_CONCURRENCY:-1,2,4,8,16,32,64}" --seconds 8 --out-dir "$out" --name server-sweep
    kill "${pids[@]}"; wait || true ;;
  ttfa)  # streamed vs whole, one request at a time, dynamic batching on (max batch 8, 5 ms);
    # the script's own warm-up sends each measured size once: new shapes compile in them
    python3 scripts/bench_streaming.py --sentences 3 --repeats 20 --ready-timeout 900 \
      --serve-arg=--acoustic="$models/fastpitch" --serve-arg=--vocoder="$models/hifigan" \
      --serve-arg=--backend=cuda --serve-arg=--device=cuda --serve-arg=--precision=fp16 \
      --serve-arg=--max-batch-size=8 --serve-arg=--max-queue-delay-ms=5 --serve-arg=--warmup \
      --serve-arg=--request-timeout=600 \
      --json "$out/ttfa.json" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
