#!/usr/bin/env bash
# What `docker compose up` needs where no image registry is reachable (only package indexes):
#   1. a base image with python3.11 and pip, from Debian's packages (debootstrap + docker import),
#      with redis-server too, so it also serves as the Redis image;
#   2. ./wheelhouse, the project's wheels (pip download on this machine: the local CPU torch wheel).
# Then: MGRPO_BASE_IMAGE=mgrpo-base:bookworm MGRPO_REDIS_IMAGE=mgrpo-base:bookworm docker-compose build
# Usage (as root, from the repository root): tests/deploy/offline_images.sh [tag]
set -euo pipefail
tag=${1:-mgrpo-base:bookworm}
python=${PYTHON:-.venv/bin/python}
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  work=$(mktemp -d)
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,redis-server \
    bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log"
  chroot "$work/rootfs" python3 -m venv /opt/venv
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb
  tar -C "$work/rootfs" -c . | docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag"
  rm -rf "$work"
fi
if ! ls wheelhouse/torch-*.whl >/dev/null 2>&1; then
  # async-timeout: redis needs it below Python 3.11.3 (Debian's 3.11.2), which this machine's pip skips
  "$python" -m pip download -q -d wheelhouse '.[tracking]' setuptools wheel 'async-timeout>=4.0.3'
fi
echo "base image $tag; $(ls wheelhouse | wc -l) wheels in ./wheelhouse"
