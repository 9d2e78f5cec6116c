#!/usr/bin/env bash
# How long `pip install .` takes without extras, and how much it installs:
# a fresh virtual environment per run, the exact versions of constraints.txt,
# the tree's build outputs removed first so every run starts alike.
#
#   bench/install_time.sh [TREE] [RUNS]     (default: this checkout, 2 runs)
#
# The first run warms pip's and the system's caches and is printed apart.
set -euo pipefail
tree=$(realpath "${1:-$(dirname "$0")/..}")
runs=${2:-2}
py=${PY:-python3.11}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$tree"/. "$work/src"
rm -rf "$work/src/.venv" "$work/src/build" "$work/src"/*.egg-info
for i in $(seq 0 "$runs"); do
  rm -rf "$work/venv" "$work/src/build" "$work/src"/*.egg-info
  "$py" -m venv "$work/venv"
  start=$(date +%s.%N)
  (cd "$work/src" && "$work/venv/bin/pip" install -q -c constraints.txt . >/dev/null 2>&1)
  end=$(date +%s.%N)
  site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  label=$([ "$i" = 0 ] && echo warm-up || echo "run $i")
  printf '%s: %.1f s, site-packages %s bytes\n' "$label" "$(echo "$end - $start" | bc)" \
    "$(du -sb "$site" | cut -f1)"
done
