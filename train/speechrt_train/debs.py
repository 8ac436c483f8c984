"""A .deb's files unpacked without dpkg (a GPU image may lack it); standard library only.

python -m speechrt_train.debs DEST DEB...      (train/corpus/unpack.sh's fallback)
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path


def extract_deb(deb: Path, dest: Path) -> None:
    """A .deb is an ar archive whose data.tar.* member holds the files: those into `dest`
    (tarfile's "tar" filter: nothing outside `dest`, symlinks kept as the package has them)."""
    blob = deb.read_bytes()
    if blob[:8] != b"!<arch>\n":
        raise ValueError(f"{deb}: not a .deb (ar archive)")
    at = 8
    while at + 60 <= len(blob):
        name, size = blob[at : at + 16].decode().strip(), int(blob[at + 48 : at + 58])
        if name.rstrip("/").startswith("data.tar"):
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(blob[at + 60 : at + 60 + size])) as tar:
                tar.extractall(dest, filter="tar")
            return
        at += 60 + size + size % 2
    raise ValueError(f"{deb}: no data.tar member")


if __name__ == "__main__":
    for path in sys.argv[2:]:
        extract_deb(Path(path), Path(sys.argv[1]))
