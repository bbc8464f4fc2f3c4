#!/bin/sh
# Start Debian's docker.io daemon for the kit's container tests and builds, if none answers.
#
# Idempotent: does nothing when `docker info` already succeeds. Otherwise starts dockerd in
# the background (as root), logging to $DOCKERD_LOG, and waits until it answers.
#
# The flags fit a machine that is itself a container without privileges for overlay
# mounts or netfilter (ARCHITECTURE.md): the vfs storage driver (no overlayfs), no iptables
# rules and no default bridge. Containers then run with `--network none` and builds that need
# package registries use the host network (the kit passes network_mode="host").
#
# CI: apt-get install -y docker.io debootstrap && sh containers/start-dockerd.sh
set -eu

DOCKERD_LOG=${DOCKERD_LOG:-/tmp/dockerd.log}
WAIT_S=${DOCKERD_WAIT_S:-60}

if docker info >/dev/null 2>&1; then
    echo "start-dockerd: a Docker daemon already answers"
    exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
    echo "start-dockerd: dockerd not found; install it: apt-get install -y docker.io" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "start-dockerd: dockerd must be started as root (this is uid $(id -u))" >&2
    exit 1
fi

echo "start-dockerd: starting dockerd (log: $DOCKERD_LOG)"
nohup dockerd --storage-driver=vfs --iptables=false --ip-masq=false --bridge=none \
    >>"$DOCKERD_LOG" 2>&1 </dev/null &
echo $! >/tmp/dockerd.pid

i=0
while ! docker info >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -ge "$WAIT_S" ]; then
        echo "start-dockerd: dockerd did not answer within ${WAIT_S}s; last log lines:" >&2
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    if ! kill -0 "$(cat /tmp/dockerd.pid)" 2>/dev/null; then
        echo "start-dockerd: dockerd exited; last log lines:" >&2
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    sleep 1
done
echo "start-dockerd: dockerd ready after ${i}s"
