#!/usr/bin/env bash
# The service image's size and build time: builds the Dockerfile of the tree
# given (default: this checkout) without cache and prints the image's size in
# bytes and MiB, its size above the base image, and the build's wall time.
#
#   bench/image_size.sh [TREE] [TAG]
#
# DOCKER_BUILD_ARGS adds arguments to `docker build` (e.g. `--network host`
# where pip inside the build reaches its index through the host). The base
# image is whatever `python:3.11-slim` resolves to on this daemon:
# docs/performance.md says which base the published figures used.
set -euo pipefail
tree=$(realpath "${1:-$(dirname "$0")/..}")
tag=${2:-hops:size}
start=$(date +%s.%N)
# shellcheck disable=SC2086  # the extra arguments are words on purpose
docker build --no-cache ${DOCKER_BUILD_ARGS:-} -t "$tag" "$tree" >/dev/null
end=$(date +%s.%N)
size=$(docker image inspect -f '{{.Size}}' "$tag")
base=$(docker image inspect -f '{{.Size}}' python:3.11-slim)
awk -v s="$size" -v b="$base" -v t="$(echo "$end - $start" | bc)" -v tag="$tag" 'BEGIN {
  printf "image %s: %d bytes (%.1f MiB), %.1f MiB above the base, built in %.1f s\n",
         tag, s, s / 1048576, (s - b) / 1048576, t }'
