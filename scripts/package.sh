#!/usr/bin/env bash
# Slipway's Debian package, a Debian root with it installed, and the container image made from
# that root (no registry is reachable: the base is debootstrapped here).
#
#   scripts/package.sh deb [--dev [OUT]]  build target/dist/slipway_VERSION_amd64.deb (cargo-deb);
#                                       --dev packages the debug build already made (tests), at OUT
#   scripts/package.sh root DEB DIR     a Debian bookworm root at DIR with DEB installed
#   scripts/package.sh in-root DIR CMD  run CMD in DIR (chroot with /proc, /dev, /sys; a private
#                                       mount and pid namespace: nothing outlives CMD)
#   scripts/package.sh image [DEB]      the image slipway:VERSION (and :latest) from such a root
#                                       (SLIPWAY_IMAGE_TAG=NAME:TAG: that tag alone)
set -euo pipefail
# A failing command inside $(...) stops the script too (a failed build must not be packaged).
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

SUITE=bookworm
MIRROR=${SLIPWAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Shared between runs and test processes (under a lock): debootstrap takes minutes.
CACHE=${SLIPWAY_PACKAGE_CACHE:-/var/tmp/slipway-debootstrap-cache}
# What the package needs at run time, and systemd for `systemd-analyze verify` in the root.
INCLUDE=openssh-server,git,systemd,ca-certificates

die() { echo "package: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (debootstrap, chroot, mounts)"; }

version() {
  sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1
}

ensure_cargo_deb() {
  if ! cargo deb --version >/dev/null 2>&1; then
    echo "package: installing cargo-deb (cargo install)" >&2
    cargo install -q --locked cargo-deb --no-default-features >&2
  fi
}

# The job helper, static and optimized (as `make helper` builds it).
build_helper() {
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
    cargo build --release -p slipway-helper --target x86_64-unknown-linux-gnu >&2
}

# The static helper where the package's assets take it: target/<profile>/slipway-helper-static.
stage_helper() {
  local target=${CARGO_TARGET_DIR:-target}
  install -m 755 "$target/x86_64-unknown-linux-gnu/release/slipway-helper" \
    "$target/$1/slipway-helper-static"
}

cmd_deb() {
  ensure_cargo_deb
  # The package's binaries (the assets of [package.metadata.deb]), each its crate's name.
  local bins=(slipway fleeting-plugin-local fleeting-plugin-static fleeting-plugin-qemu
    fleeting-plugin-aws slipway-guest-agent)
  local out=target/debian
  mkdir -p "$out"
  if [ "${1:-}" = --dev ]; then
    # The debug binaries a test build already made (no build here: tests run beside it), fast
    # compression (the file is thrown away). One build at a time: tests share the file.
    local b
    for b in "${bins[@]}"; do
      [ -x "${CARGO_TARGET_DIR:-target}/debug/$b" ] || die "${CARGO_TARGET_DIR:-target}/debug/$b is missing: cargo build --workspace --bins first"
    done
    [ -x "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/slipway-helper" ] \
      || die "the static job helper is missing: make helper first"
    local deb=${2:-$out/slipway_$(version)_amd64-dev.deb}
    (
      flock 9
      stage_helper debug
      rm -f "$deb"
      local log
      # cargo-deb warns that a dev profile is unusual; only its errors are worth showing.
      log=$(cargo deb -q -p slipway --no-build --profile dev --fast --output "$deb" 2>&1) \
        || die "cargo deb failed: $log"
      [ -f "$deb" ] || die "cargo deb made no $deb: $log"
    ) 9>"$out/.dev.lock"
    echo "$deb"
  else
    cargo build --release "${bins[@]/#/--package=}" --bins >&2
    build_helper
    stage_helper release
    # Not in target/debian: cargo-deb deletes earlier slipway_*.deb there on every run, the
    # tests' included.
    mkdir -p target/dist
    # --strip: the release profile keeps line tables for backtraces, which cargo-deb would ship.
    cargo deb -p slipway --no-build --strip --output "target/dist/slipway_$(version)_amd64.deb" >&2
    echo "target/dist/slipway_$(version)_amd64.deb"
  fi
}

# The debootstrap tree, made once under a lock; its path.
base_tree() {
  local tree="$CACHE/$SUITE-package" stamp="$CACHE/$SUITE-package.complete"
  mkdir -p "$CACHE"
  (
    flock 9
    if [ ! -e "$stamp" ] || [ "$(cat "$stamp")" != "$INCLUDE" ]; then
      command -v debootstrap >/dev/null || die "debootstrap is missing; install with: apt-get install -y debootstrap"
      rm -rf "$tree"
      echo "package: debootstrap $SUITE from $MIRROR (takes minutes)" >&2
      debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$tree" "$MIRROR" >&2 \
        || { rm -rf "$tree"; die "debootstrap $SUITE failed"; }
      rm -rf "$tree/var/cache/apt/archives/"*.deb
      echo "$INCLUDE" >"$stamp"
    fi
  ) 9>"$CACHE/$SUITE-package.lock"
  echo "$tree"
}

cmd_in_root() {
  local dir=$1; shift
  need_root "running in a root"
  # A new mount and pid namespace: the mounts and every process started go with it.
  unshare --mount --pid --fork --kill-child --propagation private -- /bin/sh -ec '
    dir=$1; shift
    mount -t proc proc "$dir/proc"
    mount --rbind /dev "$dir/dev"
    mount -t sysfs sys "$dir/sys"
    mount -t tmpfs tmpfs "$dir/run"
    exec chroot "$dir" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 /bin/sh -ec "$*"
  ' sh "$dir" "$@"
}

cmd_root() {
  local deb=$1 dir=$2
  need_root "making a root"
  [ -f "$deb" ] || die "no package at $deb"
  [ ! -e "$dir" ] || die "$dir exists: give a new directory"
  local tree
  tree=$(base_tree)
  cp -a "$tree" "$dir"
  cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  cp "$deb" "$dir/tmp/slipway.deb"
  cmd_in_root "$dir" "dpkg -i /tmp/slipway.deb >/dev/null && rm /tmp/slipway.deb"
}

cmd_image() {
  need_root "building the image"
  local deb=${1:-}
  [ -n "$deb" ] || deb=$(cmd_deb)
  # Installs and starts a Docker Engine where none answers (quick when one does).
  scripts/docker-engine.sh >&2
  # One build at a time: the tag is shared.
  exec 8>/var/tmp/slipway-image.lock
  flock 8
  # Global: the EXIT trap runs after this function's locals are gone.
  IMAGE_WORK=$(mktemp -d /var/tmp/slipway-image.XXXXXX)
  trap 'rm -rf "$IMAGE_WORK"' EXIT
  local work=$IMAGE_WORK
  cmd_root "$deb" "$work/root"
  # In the image the container is the boundary: its one user runs the manager and owns the
  # volumes (the package makes them root's, for a host where jobs run beside the manager).
  local ids
  ids=$(awk -F: '$1 == "slipway" { print $3 ":" $4 }' "$work/root/etc/passwd")
  chown -R "$ids" "$work/root/etc/slipway" "$work/root/var/lib/slipway" "$work/root/var/lib/slipway-local"
  # The image's own files only: no host resolver, apt lists or logs.
  rm -rf "$work/root/etc/resolv.conf" "$work/root/var/lib/apt/lists/"* "$work/root/var/log/"*
  local tag old
  # SLIPWAY_IMAGE_TAG: the tests' own tag, so that they never replace an operator's image.
  tag=${SLIPWAY_IMAGE_TAG:-slipway:$(version)}
  old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
  tar -C "$work/root" --numeric-owner -c . | docker import - slipway-rootfs:build >/dev/null
  # `docker import --change` takes no STOPSIGNAL: the image's settings come from a build on it.
  mkdir -p "$work/context"
  cat >"$work/context/Dockerfile" <<'DOCKERFILE'
FROM slipway-rootfs:build
USER slipway
WORKDIR /var/lib/slipway
ENV HOME=/var/lib/slipway
VOLUME ["/etc/slipway", "/var/lib/slipway"]
# `docker stop` drains the manager: no new jobs, the running ones finish (shutdown_timeout).
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/usr/bin/slipway"]
CMD ["run", "--config", "/etc/slipway/config.toml"]
DOCKERFILE
  DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$work/context" >/dev/null 2>"$work/build.err" \
    || { cat "$work/build.err" >&2; docker rmi slipway-rootfs:build >/dev/null 2>&1 || true; die "docker build failed"; }
  docker rmi slipway-rootfs:build >/dev/null
  [ -n "${SLIPWAY_IMAGE_TAG:-}" ] || docker tag "$tag" slipway:latest
  # The image this one replaces (same version, an earlier build) goes, unless a container uses it.
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$tag")" ]; then
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
  echo "$tag"
}

case "${1:-}" in
  deb) shift; cmd_deb "$@" ;;
  root) [ $# -eq 3 ] || die "usage: scripts/package.sh root DEB DIR"; cmd_root "$2" "$3" ;;
  in-root) [ $# -ge 3 ] || die "usage: scripts/package.sh in-root DIR CMD"; shift; cmd_in_root "$@" ;;
  image) shift; cmd_image "$@" ;;
  *) die "unknown command \"${1:-}\": expected deb, root, in-root or image" ;;
esac
