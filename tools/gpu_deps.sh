#!/usr/bin/env bash
# Run here, before tools/gpu_check.sh goes to a lent GPU machine: that machine reaches no
# package registry, and its image has torch (CUDA), Lightning, pyarrow and pytest but not Ray.
# Writes .gpudeps/ (git-ignored; name it in the device call's `carry`):
#   ray-slim.tar.xz  Ray's wheel for Python 3.12 unpacked without what raysgd never loads
#                    (Java jars, RLlib, Serve, the LLM library, the dashboard's web client):
#                    the whole wheel (79 MB) is over the 64 MiB a call may carry;
#   *.whl            Ray's pure dependencies that image lacks;
#   s3-site.tar.xz   moto's S3 server and what it needs, for bench.disk's S3 cases (the disk
#                    steps of gpu_check.sh), without botocore's models of other services:
#                    12 MB, where its wheels are 31 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RAY_VERSION:-}" ] || [ -z "${MOTO_VERSION:-}" ]; then  # what `make install` put in .venv
  [ -x .venv/bin/python ] || { echo "run make install first, or set RAY_VERSION and MOTO_VERSION" >&2; exit 2; }
  RAY_VERSION=${RAY_VERSION:-$(.venv/bin/python -c 'import ray; print(ray.__version__)')}
  MOTO_VERSION=${MOTO_VERSION:-$(.venv/bin/python -c 'import moto; print(moto.__version__)')}
fi
DEST=.gpudeps
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}")
download() {
  python3 -m pip download -q --no-deps "${TARGET[@]}" -d "$1" "${@:2}"
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
python3 -m pip download -q "${TARGET[@]}" -d "$work/s3-wheels" "moto==$MOTO_VERSION" flask flask-cors
python3 -m pip install -q --no-index --no-deps --no-compile "${TARGET[@]}" --target "$work/s3-site" \
  "$work"/s3-wheels/*.whl
(cd "$work/s3-site/botocore/data" && ls | grep -vxE 's3|sts|[^/]*\.json(\.gz)?' | xargs rm -rf)
tar -C "$work/s3-site" -cJf "$DEST/s3-site.tar.xz" .
du -sh "$DEST"
