#!/usr/bin/env bash
# Run Ray 1.12's own RaySGD tests against raysgd with only the import prefix swapped.
#
#   tools/legacy_tests.sh PATH/TO/ray-1.12/python/ray/util/sgd/tests [pytest arguments]
#
# The test files are not part of this repository: point the script at a Ray 1.12
# checkout. It copies test_torch*.py, test_placement_groups.py, test_client.py, test_ptl.py
# and ../../../tune/tests/test_torch_trainable.py into a
# temporary directory, replaces "ray.util.sgd" with "raysgd" and nothing else, and runs
# pytest there with the project's virtual environment (`make install` first).
# docs/legacy.md lists which of those tests cannot pass and why.
set -euo pipefail
src=${1:?usage: tools/legacy_tests.sh RAY_1_12_SGD_TESTS_DIR [pytest args]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in test_torch.py test_torch_2.py test_torch_3.py test_placement_groups.py test_client.py \
    test_ptl.py; do
  if [ -f "$src/$name" ]; then
    sed 's/ray\.util\.sgd/raysgd/g' "$src/$name" > "$work/$name"
  fi
done
# Ray 1.0 moved ray.util.sgd.torch.func_trainable (and its tests) under Tune, as
# ray.tune.integration.torch: that one import line is pointed back at the raysgd module
# (raysgd.torch.func_trainable); nothing else changes.
tune_tests=$src/../../../tune/tests
if [ -f "$tune_tests/test_torch_trainable.py" ]; then
  sed 's/ray\.util\.sgd/raysgd/g; s/ray\.tune\.integration\.torch/raysgd.torch.func_trainable/' \
    "$tune_tests/test_torch_trainable.py" > "$work/test_torch_trainable.py"
fi
cd "$work"
"$python" -m pytest -q -rfE --continue-on-collection-errors -p no:cacheprovider "$@" test_*.py
