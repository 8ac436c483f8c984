#!/usr/bin/env bash
# The cuda runner of this tree against a baseline tree, in one GPU process per pipeline part,
# same models, same machine: the "before" columns of docs/benchmarks.md.
#
#   git archive BASE src scripts ':(exclude)src/speechrt/defaults' | tar -x -C BASE_DIR
#   SPEECHRT_COMMIT=$(git rev-parse --short HEAD) bash scripts/bench_gpu_compare.sh OUT BASE_DIR BASE
#
# Runs the cuda parity tests of the changed paths first, then Tacotron 2 + WaveGlow, Jasper 10x5
# and QuartzNet 15x5 (7 s) on cuda fp16 in both trees (eager fp16 in this tree), then the
# decoder-step and WaveGlow profiles. Results: OUT/<part>/*.json (stamped with device, commit
# and command), OUT/tests.txt, OUT/prof/profile.json.
set -uo pipefail
out=${1:?usage: bench_gpu_compare.sh OUT BASE_DIR BASE_COMMIT}; base=${2:?}; base_commit=${3:?}
export PYTHONUNBUFFERED=1 COLUMNS=180
models=${BENCH_MODELS:-/tmp/speechrt-bench-models}
mkdir -p "$out"
[ -d "$models/quartznet" ] || PYTHONPATH="$PWD/src" python3 scripts/bench_models.py "$models"
PYTHONPATH="$PWD/src:$PWD/tests" python3 -m pytest -q -p no:cacheprovider \
  "tests/test_cuda.py::test_cuda_graphs_match_eager_fp32[tacotron2]" \
  "tests/test_cuda.py::test_cuda_graphs_match_eager_fp32[waveglow]" \
  "tests/test_cuda.py::test_tts_pipeline_cuda_matches_eager_fp32[tacotron2-waveglow]" \
  "tests/test_cuda.py::test_asr_cuda_matches_eager_fp32[jasper]" \
  "tests/test_featurizer.py::test_cuda_featurizer_matches_per_item_reference[default]" \
  > "$out/tests.txt" 2>&1
tail -1 "$out/tests.txt"

bench() {  # TREE NAME bench-arguments...: one `speechrt bench` process in that tree
  local tree=$1 name=$2; shift 2
  (cd "$tree" && PYTHONPATH="$PWD/src" python3 -m speechrt.cli bench "$@" \
    --out-dir "$out/$name" --name "$name" > "$out/$name.log" 2>&1) || echo "$name failed"
  tail -6 "$out/$name.log"
}
t2="tts --acoustic $models/tacotron2 --vocoder $models/waveglow256 --denoise 0.01"
jasper="asr --model $models/jasper --durations 7 --warmup 5 --iters 30"
qn="asr --model $models/quartznet --durations 7 --warmup 5 --iters 30"
bench . tacotron2-waveglow $t2 --variants cuda:fp16 --batch-sizes 1,8 --warmup 3 --iters 20
SPEECHRT_COMMIT=$base_commit bench "$base" tacotron2-waveglow-before $t2 --variants cuda:fp16 \
  --batch-sizes 1,8 --warmup 3 --iters 20
bench . tacotron2-waveglow-eager $t2 --variants eager:fp16 --batch-sizes 1 --warmup 1 --iters 3
bench . jasper $jasper --variants cuda:fp16,eager:fp16 --batch-sizes 1,8
SPEECHRT_COMMIT=$base_commit bench "$base" jasper-before $jasper --variants cuda:fp16 --batch-sizes 1,8
bench . quartznet $qn --variants cuda:fp16 --batch-sizes 1,8
SPEECHRT_COMMIT=$base_commit bench "$base" quartznet-before $qn --variants cuda:fp16 --batch-sizes 1,8
PYTHONPATH="$PWD/src" python3 scripts/gpu_profile.py "$models" "$out/prof" --parts waveglow,decoder \
  > "$out/prof.log" 2>&1 || echo "profile failed"
grep "^{" "$out/prof.log"
