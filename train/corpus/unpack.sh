#!/usr/bin/env bash
# Unpack .carry/debs (and .carry/pico's pico-say, where fetch.sh built it) into a prefix
# (default /tmp/teachers), .carry/wheels into a site folder
# (default /tmp/site) and, where there are any, .carry/text/*.deb (more English text: see
# `speechrt_train corpus --text-root`) into a text root (default /tmp/text); idempotent. Then:
# PYTHONPATH=src:train:/tmp/site and pass `--prefix /tmp/teachers` to `python -m speechrt_train
# corpus` (it sets LD_LIBRARY_PATH and festival's --libdir itself).
# Usage: bash train/corpus/unpack.sh [PREFIX] [SITE] [TEXT]
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=${1:-/tmp/teachers}
SITE=${2:-/tmp/site}
TEXT=${3:-/tmp/text}

unpack() {  # unpack DEST DEB...
  local dest=$1
  shift
  mkdir -p "$dest"
  if command -v dpkg >/dev/null; then
    for f in "$@"; do dpkg -x "$f" "$dest"; done
  else  # no dpkg: speechrt_train.debs reads the .deb's data.tar itself
    PYTHONPATH=train python3 -m speechrt_train.debs "$dest" "$@"
  fi
}

# the set unpacked is stamped: a later call carrying other .debs (a warm machine) unpacks again
debs=$(cd .carry/debs && ls -- *.deb)
if [ ! -x "$PREFIX/usr/bin/festival" ] || [ "$(cat "$PREFIX/.debs" 2>/dev/null)" != "$debs" ]; then
  unpack "$PREFIX" .carry/debs/*.deb
  echo "$debs" > "$PREFIX/.debs"
fi
if [ -x .carry/pico/usr/bin/pico-say ] && [ ! -x "$PREFIX/usr/bin/pico-say" ]; then
  cp -r .carry/pico/usr "$PREFIX/"  # pico-say + its language files (fetch.sh built them)
fi
if compgen -G ".carry/text/*.deb" >/dev/null && [ ! -d "$TEXT/usr" ]; then
  unpack "$TEXT" .carry/text/*.deb
fi
if [ ! -d "$SITE/inflect" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .carry/wheels/*.whl
  # typeguard needs typing_extensions >= 4.14: keep the machine's own when it is new enough
  if python3 -c "import importlib.metadata as m
v = tuple(int(x) for x in m.version('typing_extensions').split('.')[:2])
raise SystemExit(v < (4, 14))" 2>/dev/null; then
    rm -rf "$SITE"/typing_extensions*
  fi
fi
# soundfile and G722 for the corpus's codec round trips, sentencepiece for the FastConformer's
# tokenizer, where the machine's Python lacks them
if ! PYTHONPATH=$SITE python3 -c "import soundfile, G722, sentencepiece" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .carry/wheels-bin/*.whl ||
    { echo "unpack.sh: $(python3 -V) lacks soundfile, G722 or sentencepiece and the carried" \
      "wheels do not fit it (pip install soundfile G722 sentencepiece)" >&2; exit 1; }
fi
echo "teachers in $PREFIX, wheels in $SITE$([ -d "$TEXT/usr" ] && echo ", text in $TEXT")"
