#!/usr/bin/env bash
# Unpack .carry/debs into a prefix (default /tmp/teachers) and .carry/wheels into a site folder
# (default /tmp/site); idempotent. Then: PYTHONPATH=src:train:/tmp/site and pass
# `--prefix /tmp/teachers` to `python -m speechrt_train corpus` (it sets LD_LIBRARY_PATH and
# festival's --libdir itself). Usage: bash scripts/corpus/unpack.sh [PREFIX] [SITE]
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=${1:-/tmp/teachers}
SITE=${2:-/tmp/site}
if [ ! -x "$PREFIX/usr/bin/festival" ]; then
  mkdir -p "$PREFIX"
  for f in .carry/debs/*.deb; do dpkg -x "$f" "$PREFIX"; done
fi
if [ ! -d "$SITE/inflect" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .carry/wheels/*.whl
fi
echo "teachers in $PREFIX, wheels in $SITE"
