#!/usr/bin/env bash
# Run Ray 1.12's own RaySGD tests against raysgd with only the import prefix swapped.
#
#   tools/legacy_tests.sh PATH/TO/ray-1.12/python/ray/util/sgd/tests [pytest arguments]
#
# The test files are not part of this repository: point the script at a Ray 1.12
# checkout. It copies test_torch*.py, test_placement_groups.py and test_client.py into a
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
for name in test_torch.py test_torch_2.py test_torch_3.py test_placement_groups.py test_client.py; do
  if [ -f "$src/$name" ]; then
    sed 's/ray\.util\.sgd/raysgd/g' "$src/$name" > "$work/$name"
  fi
done
cd "$work"
"$python" -m pytest -q -rfE --continue-on-collection-errors -p no:cacheprovider "$@" test_*.py
