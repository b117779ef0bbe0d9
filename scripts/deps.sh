#!/usr/bin/env bash
# Installs what Slipway's demo (`deps.sh demo`), VM demo (`deps.sh demo-vm`), Debian package
# (`deps.sh deb`), image (`deps.sh package`) or test suite (`deps.sh test`) needs on Debian, or says exactly what is
# missing when not run as root.
set -euo pipefail
what=${1:-test}
case "$what" in
  demo | demo-vm | deb | package | test) ;;
  *) echo "deps: unknown set \"$what\": expected demo, demo-vm, deb, package or test" >&2; exit 2 ;;
esac

missing=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if [ "$what" != deb ]; then
  have sshd || missing+=(openssh-server)
  have ssh-keygen || missing+=(openssh-client)
  have ip || missing+=(iproute2)
  have nsenter || missing+=(util-linux)
  have tar || missing+=(tar)
  # GitLab jobs' repositories are fetched on the manager.
  have git || missing+=(git)
  # Repositories with LFS objects (GitLab jobs; the git test server serves an LFS endpoint).
  git lfs version >/dev/null 2>&1 || missing+=(git-lfs)
  have gzip || missing+=(gzip)
fi
if [ "$what" = test ]; then
  have python3 || missing+=(python3)
  have pgrep || missing+=(procps)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  # The Python bubblewrap executor plugin's sandboxes.
  have bwrap || missing+=(bubblewrap)
  # The peer local pipelines are compared with: gitlab-ci-local (npm) copies projects with rsync.
  have node || missing+=(nodejs)
  have npm || missing+=(npm)
  have rsync || missing+=(rsync)
  # The status page is checked in a real browser (headless, DevTools protocol).
  have chromium || missing+=(chromium)
fi

# microvm / vm isolation: QEMU, the guest kernel and the image tools (`slipway image build`).
vm_missing=()
if [ "$what" = test ] || [ "$what" = demo-vm ]; then
  have qemu-system-x86_64 || vm_missing+=(qemu-system-x86)
  have qemu-img || vm_missing+=(qemu-utils)
  # The guest needs a static busybox (no libc in its initramfs).
  { ldd /bin/busybox 2>&1 || true; } | grep -q 'not a dynamic' || vm_missing+=(busybox-static)
  have cpio || vm_missing+=(cpio)
  have debootstrap || vm_missing+=(debootstrap)
  have mke2fs || vm_missing+=(e2fsprogs)
  ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || vm_missing+=(linux-image-cloud-amd64)
fi

# The Debian package's root and the image's base are debootstrapped here.
if [ "$what" = package ]; then
  have debootstrap || missing+=(debootstrap)
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "deps: installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing Debian packages: ${missing[*]}" >&2
    echo "deps: install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
if [ ${#vm_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "deps: installing ${vm_missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    # One at a time: busybox-static replaces busybox, which apt refuses inside a larger request
    # on some systems ("held broken packages").
    for p in "${vm_missing[@]}"; do
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$p" >/dev/null
    done
  else
    echo "deps: missing Debian packages: ${vm_missing[*]}" >&2
    echo "deps: install them with: sudo apt-get install ${vm_missing[*]}" >&2
    exit 1
  fi
fi
# OpenSSH's sshd refuses to start without its privilege-separation directory.
if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi

if [ "$what" = test ]; then
  # The go-plugin peer (python-plugin) and grpc codegen for the Python test plugin.
  if ! python3 -c 'import pyplugin, grpclib, grpc_tools' >/dev/null 2>&1; then
    echo "deps: installing Python packages python-plugin grpcio-tools"
    # Debian's own python3 refuses system-wide installs (PEP 668) unless told otherwise.
    pkgs="python-plugin grpcio-tools"
    python3 -m pip install -q $pkgs 2>/dev/null \
      || python3 -m pip install -q --break-system-packages $pkgs 2>&1 | grep -v 'Running pip as the' || true
    python3 -c 'import pyplugin, grpclib, grpc_tools' >/dev/null
  fi
  # moto in server mode: the AWS API the fleeting-plugin-aws tests run against.
  if ! python3 -c 'import moto.server, flask, flask_cors, boto3' >/dev/null 2>&1; then
    echo "deps: installing Python package moto[server]"
    python3 -m pip install -q 'moto[server]' 2>/dev/null \
      || python3 -m pip install -q --break-system-packages 'moto[server]' 2>&1 | grep -v 'Running pip as the' || true
    python3 -c 'import moto.server, flask, flask_cors, boto3' >/dev/null
  fi
  # The distributed cache's Google Cloud Storage emulator (its Azure one, Azurite, is below).
  if ! python3 -c 'import gcp_storage_emulator' >/dev/null 2>&1; then
    echo "deps: installing Python package gcp-storage-emulator"
    python3 -m pip install -q 'gcp-storage-emulator==2026.7.19' 2>/dev/null \
      || python3 -m pip install -q --break-system-packages 'gcp-storage-emulator==2026.7.19' 2>&1 | grep -v 'Running pip as the' || true
    python3 -c 'import gcp_storage_emulator' >/dev/null
  fi
  # LocalStack's S3 (the distributed cache's tests), pinned in a virtual environment of its own.
  ls_venv=${SLIPWAY_LOCALSTACK_VENV:-$HOME/.cache/slipway/localstack-4.4.0}
  if ! "$ls_venv/bin/python" -c 'import localstack.aws.components, boto3' >/dev/null 2>&1; then
    echo "deps: installing LocalStack 4.4.0 (pip, into $ls_venv)"
    python3 -m venv "$ls_venv"
    "$ls_venv/bin/python" -m pip install -q 'localstack-core[runtime]==4.4.0' 'cbor2<5.7' \
      'pyOpenSSL<24.3' 'cryptography<44' 'joserfc<1.1' service_identity
    "$ls_venv/bin/python" -c 'import localstack.aws.components, boto3' >/dev/null
  fi
fi
if [ "$what" = test ]; then
  # gitlab-ci-local 4.60.1: the newest that runs on Node 20 (newer ones need Node 22).
  if [ "$(gitlab-ci-local --version 2>/dev/null)" != 4.60.1 ]; then
    echo "deps: installing gitlab-ci-local@4.60.1 (npm)"
    npm install -g --silent gitlab-ci-local@4.60.1 >/dev/null 2>&1 \
      || { echo "deps: npm install -g gitlab-ci-local@4.60.1 failed" >&2; exit 1; }
  fi
fi
if [ "$what" = test ]; then
  # Azurite, Microsoft's Azure Storage emulator: 3.34.0 is the newest that runs on Node 20.
  if [ "$(azurite-blob --version 2>/dev/null)" != 3.34.0 ]; then
    echo "deps: installing azurite@3.34.0 (npm)"
    npm install -g --silent azurite@3.34.0 >/dev/null 2>&1 \
      || { echo "deps: npm install -g azurite@3.34.0 failed" >&2; exit 1; }
  fi
fi
command -v cargo >/dev/null || { echo "deps: cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
if [ "$what" = test ] || [ "$what" = package ] || [ "$what" = deb ]; then
  # `make deb` and the package tests build the .deb with cargo-deb.
  if ! cargo deb --version >/dev/null 2>&1; then
    echo "deps: installing cargo-deb (cargo install)"
    cargo install -q --locked cargo-deb --no-default-features
  fi
fi
