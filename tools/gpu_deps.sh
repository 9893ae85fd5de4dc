#!/usr/bin/env bash
# Run here, before tools/gpu_check.sh goes to a lent GPU machine: that machine reaches no
# package registry, and its image has torch (CUDA), Lightning, pyarrow and pytest but not Ray.
# Writes .gpudeps/ (git-ignored; name it in the device call's `carry`):
#   ray-slim.tar.xz  Ray's wheel for Python 3.12 unpacked without what raysgd never loads
#                    (Java jars, RLlib, Serve, the LLM library, the dashboard's web client):
#                    the whole wheel (79 MB) is over the 64 MiB a call may carry;
#   *.whl            Ray's pure dependencies that image lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RAY_VERSION:-}" ]; then  # the Ray that `make install` put in .venv
  [ -x .venv/bin/python ] || { echo "run make install first, or set RAY_VERSION" >&2; exit 2; }
  RAY_VERSION=$(.venv/bin/python -c 'import ray; print(ray.__version__)')
fi
DEST=.gpudeps
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$1" "${@:2}"
}
rm -rf "$DEST" && mkdir -p "$DEST"
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
download "$work" "ray==$RAY_VERSION"
# Unzipped with each file's mode (zipfile drops it; raylet and gcs_server must stay executable).
python3 - "$work"/ray-*.whl "$work/site" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for info in wheel.infolist():
        path = wheel.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode and not info.is_dir():
            os.chmod(path, mode & 0o777)
PY
rm -rf "$work"/site/ray/{jars,rllib,serve,llm,dashboard/client}
tar -C "$work/site" -cJf "$DEST/ray-slim.tar.xz" .
download "$DEST" jsonschema jsonschema-specifications referencing rpds-py tensorboardX \
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
du -sh "$DEST"
