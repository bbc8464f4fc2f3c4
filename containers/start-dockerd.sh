#!/bin/sh
# Start Debian's docker.io daemon for the kit's container tests and builds, if none answers.
#
# Idempotent: does nothing when `docker info` already succeeds. Otherwise starts dockerd in
# the background (as root), logging to $DOCKERD_LOG, and waits until it answers.
#
# Its log and pid file live in $DOCKERD_RUN_DIR (default /run/repro-kit), a folder only root
# can write: a fixed name in the world-writable /tmp could be a link planted by another user,
# which dockerd's root-owned output would then write through.
#
# The flags fit a machine that is itself a container without privileges for overlay
# mounts or netfilter (docs/measured.md, §Build machines): the vfs storage driver (no overlayfs), no iptables
# rules and no default bridge. Containers then run with `--network none` and builds that need
# package registries use the host network (the kit passes network_mode="host").
#
# CI: apt-get install -y docker.io debootstrap && sh containers/start-dockerd.sh
set -eu

DOCKERD_RUN_DIR=${DOCKERD_RUN_DIR:-/run/repro-kit}
DOCKERD_LOG=${DOCKERD_LOG:-$DOCKERD_RUN_DIR/dockerd.log}
PID_FILE=$DOCKERD_RUN_DIR/dockerd.pid
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

# A real folder owned by root and writable by no one else, or a refusal.
mkdir -p -m 0755 "$DOCKERD_RUN_DIR"
if [ -L "$DOCKERD_RUN_DIR" ] || [ "$(stat -c %u "$DOCKERD_RUN_DIR")" != 0 ] ||
    [ -n "$(find "$DOCKERD_RUN_DIR" -maxdepth 0 -perm /022)" ]; then
    echo "start-dockerd: $DOCKERD_RUN_DIR must be a folder owned by root and writable by root" \
        "only (it is a link, or another user may write it); set DOCKERD_RUN_DIR" >&2
    exit 1
fi
for file in "$DOCKERD_LOG" "$PID_FILE"; do
    if [ -L "$file" ]; then
        echo "start-dockerd: $file is a link; refusing to write through it" >&2
        exit 1
    fi
done

echo "start-dockerd: starting dockerd (log: $DOCKERD_LOG)"
nohup dockerd --storage-driver=vfs --iptables=false --ip-masq=false --bridge=none \
    >>"$DOCKERD_LOG" 2>&1 </dev/null &
echo $! >"$PID_FILE"

i=0
while ! docker info >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -ge "$WAIT_S" ]; then
        echo "start-dockerd: dockerd did not answer within ${WAIT_S}s; last log lines:" >&2
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
        echo "start-dockerd: dockerd exited; last log lines:" >&2
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    sleep 1
done
echo "start-dockerd: dockerd ready after ${i}s"
