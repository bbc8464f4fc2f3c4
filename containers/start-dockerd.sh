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
# The flags fit a machine that is itself a container without privileges for netfilter
# (docs/measured.md, §Build machines): no iptables rules and no default bridge. Containers then
# run with `--network none` and builds that need package registries use the host network (the
# kit passes network_mode="host").
#
# Storage: overlay2 where root can mount overlayfs in the daemon's data root (probed here, as
# dockerd would use it), else vfs, under which every layer is a full copy of the file system.
# DOCKERD_STORAGE_DRIVER=vfs|overlay2 skips the probe.
#
# CI: apt-get install -y docker.io debootstrap && sh containers/start-dockerd.sh
set -eu

DOCKERD_RUN_DIR=${DOCKERD_RUN_DIR:-/run/repro-kit}
DOCKERD_LOG=${DOCKERD_LOG:-$DOCKERD_RUN_DIR/dockerd.log}
PID_FILE=$DOCKERD_RUN_DIR/dockerd.pid
WAIT_S=${DOCKERD_WAIT_S:-60}
DATA_ROOT=${DOCKERD_DATA_ROOT:-/var/lib/docker}

# Whether an overlay mount works in folder $1 (the same kind of mount overlay2 makes).
overlay_mounts() {
    probe=$(mktemp -d "$1/overlay-probe.XXXXXX") || return 1
    mkdir "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
    if mount -t overlay overlay \
        -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" \
        2>/dev/null; then
        umount "$probe/merged"
        rm -rf "$probe"
        return 0
    fi
    rm -rf "$probe"
    return 1
}

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

mkdir -p -m 0711 "$DATA_ROOT"
DRIVER=${DOCKERD_STORAGE_DRIVER:-}
if [ -z "$DRIVER" ]; then
    if overlay_mounts "$DATA_ROOT"; then DRIVER=overlay2; else DRIVER=vfs; fi
fi
case "$DRIVER" in
    overlay2 | vfs) ;;
    *)
        echo "start-dockerd: DOCKERD_STORAGE_DRIVER must be overlay2 or vfs, got '$DRIVER'" >&2
        exit 1
        ;;
esac

echo "start-dockerd: starting dockerd with the $DRIVER storage driver (log: $DOCKERD_LOG)"
nohup dockerd --storage-driver="$DRIVER" --data-root "$DATA_ROOT" \
    --iptables=false --ip-masq=false --bridge=none \
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
