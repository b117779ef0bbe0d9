#!/usr/bin/env bash
# Makes sure a Docker Engine answers on /var/run/docker.sock and that the local test image
# `slipway-busybox:latest` exists. Idempotent and quick when everything is already there; safe to
# run concurrently (one flock). Needs root to install or start anything.
#
#   scripts/docker-engine.sh            # ensure engine + image
#   DOCKERD_LOG=/tmp/x.log scripts/...   # where dockerd logs (default /var/log/slipway-dockerd.log)
#
# No registry is reachable on the development machine, so the image is made with `docker import`
# from a rootfs holding Debian's static busybox and its applet symlinks.
set -euo pipefail

IMAGE=${SLIPWAY_BUSYBOX_IMAGE:-slipway-busybox:latest}
SOCK=/var/run/docker.sock
LOG=${DOCKERD_LOG:-/var/log/slipway-dockerd.log}
LOCK=/tmp/slipway-docker-engine.lock

log() { echo "docker-engine: $*" >&2; }
CLEANUP=()
cleanup() { for c in "${CLEANUP[@]}"; do eval "$c"; done; }
trap cleanup EXIT
engine_up() { docker -H "unix://$SOCK" info >/dev/null 2>&1; }
image_present() { docker -H "unix://$SOCK" image inspect "$IMAGE" >/dev/null 2>&1; }

# Fast path: nothing to do, no lock needed.
if engine_up && image_present; then
  exit 0
fi

exec 9>"$LOCK"
flock -w 600 9 || { log "could not take $LOCK within 600 s"; exit 1; }

as_root() {
  if [ "$(id -u)" != 0 ]; then
    log "need root to $1"
    exit 1
  fi
}

apt_install() {
  as_root "install $*"
  log "installing $*"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  fi
}

# 1. The engine binary.
if ! command -v dockerd >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ] && [ ! -x /usr/bin/dockerd ]; then
  # Keep the package's maintainer scripts from trying to start a service (no init system here).
  as_root "install docker.io"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    CLEANUP+=("rm -f /usr/sbin/policy-rc.d")
  fi
  apt_install docker.io
fi
DOCKERD=$(command -v dockerd || echo /usr/sbin/dockerd)

# 2. The daemon.
if ! engine_up; then
  as_root "start dockerd"
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    # Leftovers of a dockerd that died.
    rm -f "$SOCK" /var/run/docker.pid
    log "starting dockerd (log: $LOG)"
    # overlay2 + cgroupfs are what works on this machine (machine-notes.md). Fd 9 (the lock) is
    # closed so the daemon does not hold it forever.
    # Every docker-level slot holds a network, and the tests' instances share this one engine:
    # Docker's default pools (31 networks) run out under a soak's 20 slots. /24s from
    # 172.18.0.0/15 (beside docker0's 172.17.0.0/16) give 512.
    setsid "$DOCKERD" --host "unix://$SOCK" --storage-driver overlay2 \
      --exec-opt native.cgroupdriver=cgroupfs \
      --default-address-pool base=172.18.0.0/15,size=24 >>"$LOG" 2>&1 </dev/null 9>&- &
  fi
  for _ in $(seq 1 120); do
    engine_up && break
    sleep 0.5
  done
  if ! engine_up; then
    log "dockerd did not answer within 60 s; last log lines:"
    tail -n 30 "$LOG" >&2 || true
    exit 1
  fi
  log "engine up: $(docker -H "unix://$SOCK" version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"
fi

# 3. The local busybox image.
if ! image_present; then
  BUSYBOX=
  for b in /bin/busybox /usr/bin/busybox; do
    # Only a static busybox runs in an otherwise empty rootfs.
    if [ -x "$b" ] && [[ "$(LC_ALL=C ldd "$b" 2>&1 || true)" =~ (not\ a\ dynamic\ executable|statically\ linked) ]]; then
      BUSYBOX=$b
      break
    fi
  done
  if [ -z "$BUSYBOX" ]; then
    apt_install busybox-static
    BUSYBOX=/bin/busybox
  fi
  ROOTFS=$(mktemp -d /tmp/slipway-busybox-rootfs.XXXXXX)
  CLEANUP+=("rm -rf '$ROOTFS'")
  mkdir -p "$ROOTFS"/{bin,sbin,usr/bin,usr/sbin,tmp,etc,root,var/www,proc,sys,dev}
  chmod 1777 "$ROOTFS/tmp"
  cp "$BUSYBOX" "$ROOTFS/bin/busybox"
  chroot "$ROOTFS" /bin/busybox --install -s
  echo 'root:x:0:0:root:/root:/bin/sh' >"$ROOTFS/etc/passwd"
  echo 'root:x:0:' >"$ROOTFS/etc/group"
  log "importing $IMAGE from $BUSYBOX"
  tar -C "$ROOTFS" -c . | docker -H "unix://$SOCK" import \
    --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' - "$IMAGE" >/dev/null
  image_present
fi
