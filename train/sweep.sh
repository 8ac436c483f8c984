#!/usr/bin/env bash
# Training configs side by side, in one call:
#
#   SWEEP="--lr 2e-3; --lr 1e-3 --set warmup=3000" bash train/sweep.sh [MINUTES] [MODEL]
#
# MINUTES (default 9.3) is the wall time of the whole command, MODEL (default fastconformer)
# the trainer. It makes the corpus as train/gpu_train.sh does (PLAN, CORPUS_MINUTES), then
# runs one trainer per ;-separated argument list of SWEEP, all at once, each in
# runs/sweep-N from nothing, until the deadline. Into $OUT: train.log, sweep.json (per variant:
# its arguments, every logged step's loss and every evaluation), and the compact file of the
# variant with the lowest last loss as sweep-best.pt.part-?? (<= 4 parts of 15 MiB; rejoin with
# cat), to warm-start a longer run (WARM_<MODEL> in gpu_train.sh).
#
# Variant i runs on GPU i mod the GPUs there are. SWEEP_WARM=FILE warm-starts every variant from
# that compact file; SWEEP_RESUME=1 keeps runs/sweep-N, so that a later call on the same warm
# machine goes on from each one's last.pt; SWEEP_RETURN=N sends variant N's compact file back
# (as sweep-N.pt.part-??) in place of the best's. PEOPLE_VOICES and CORPUS_ROUND act as in
# gpu_train.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
MINUTES=${1:-9.3}
MODEL=${2:-fastconformer}
OUT=${OUT:-out}
mkdir -p "$OUT"
IFS=';' read -ra VARIANTS <<< "${SWEEP:?SWEEP: ';'-separated argument lists}"
# the corpus alone: gpu_train.sh with no model to train (its log goes to $OUT/train.log)
MODELS="" bash train/gpu_train.sh 0 || exit 1
exec > >(tee -a "$OUT/train.log") 2>&1
export PYTHONPATH=$PWD/src:$PWD/train:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
NGPU=$(( NGPU > 0 ? NGPU : 1 ))
WARM_ARGS=()
[ -n "${SWEEP_WARM:-}" ] && WARM_ARGS=(--warm-start "$SWEEP_WARM")
# the host's cores shared out: each trainer makes its batches' features on the CPU
threads=$(( $(nproc --all) / ${#VARIANTS[@]} ))
export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
DEADLINE=$(python3 -c "print(int($START + float('$MINUTES') * 60 - 40))")
echo "== sweep of ${#VARIANTS[@]} $MODEL runs for $(( DEADLINE - $(date +%s) )) s"
PIDS=()
for i in "${!VARIANTS[@]}"; do
  [ -n "${SWEEP_RESUME:-}" ] || rm -rf "runs/sweep-$i"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$(( i % NGPU )) python3 -m speechrt_train "$MODEL" --corpus corpus \
    --run "runs/sweep-$i" --minutes 600 --deadline "$DEADLINE" --quiet \
    --compact-out "runs/sweep-$i.pt" "${WARM_ARGS[@]}" ${VARIANTS[$i]} \
    > >(sed -u "s/^/[$i] /") 2>&1 &
  PIDS+=($!)
done
wait "${PIDS[@]}"
python3 - "$OUT" "${VARIANTS[@]}" <<'EOF'
import json, sys
from pathlib import Path

out, variants = Path(sys.argv[1]), sys.argv[2:]
runs = []
for i, args in enumerate(variants):
    log = Path(f"runs/sweep-{i}/log.jsonl")
    lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    losses = [x for x in lines if "eval" not in x]
    last = {k: v for k, v in losses[-1].items() if k not in ("step", "seconds")} if losses else {}
    runs.append({"args": args.strip(), "steps": losses[-1]["step"] if losses else 0,
                 "last": last, "log": lines})
    print(f"[{i}] {args.strip()}: step {runs[-1]['steps']}, last {last}")
(out / "sweep.json").write_text(json.dumps(runs, indent=1))
done = [i for i, r in enumerate(runs) if r["last"] and Path(f"runs/sweep-{i}.pt").exists()]
if done:
    best = min(done, key=lambda i: sum(runs[i]["last"].values()))
    print(f"== best: [{best}] {runs[best]['args']}")
    Path("runs/sweep-best.pt").unlink(missing_ok=True)
    Path("runs/sweep-best.pt").symlink_to(f"sweep-{best}.pt")
EOF
if [ -n "${SWEEP_RETURN:-}" ]; then
  split -b 15M "runs/sweep-$SWEEP_RETURN.pt" "$OUT/sweep-$SWEEP_RETURN.pt.part-"
elif [ -e runs/sweep-best.pt ]; then
  split -b 15M runs/sweep-best.pt "$OUT/sweep-best.pt.part-"
fi
rm -f "$OUT"/corpus-manifest.json
echo "== done in $(( $(date +%s) - START )) s"
sleep 1
