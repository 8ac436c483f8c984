#!/usr/bin/env bash
# Build pico-say (train/corpus/pico_say.c) against SVOX Pico from PyPI's ttspico sdist, statically
# linked so it runs on any x86-64 Linux, into a prefix: PREFIX/usr/bin/pico-say and
# PREFIX/usr/share/pico/lang/en-{US,GB}_*.bin (where speechrt_train.teachers looks for them).
# Usage: bash train/corpus/build_pico.sh SDIST.tar.gz PREFIX
set -euo pipefail
SDIST=$(realpath "$1")
DEST=$(realpath -m "$2")
HERE=$(realpath "$(dirname "$0")")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK" --strip-components=1
P=$WORK/picopi/pico
mkdir -p "$DEST/usr/bin" "$DEST/usr/share/pico/lang"
# the library is 1990s-style C: quiet its warnings, keep ours
gcc -O2 -w -static -I"$P/lib" -I"$P/tts" -o "$DEST/usr/bin/pico-say" "$HERE/pico_say.c" \
  "$P"/tts/tts_engine.c "$P"/tts/langfiles.c "$P"/lib/*.c -lm
cp "$P"/lang/en-US_* "$P"/lang/en-GB_* "$DEST/usr/share/pico/lang/"
echo "pico-say and $(ls "$DEST/usr/share/pico/lang" | wc -l) language files in $DEST/usr"
