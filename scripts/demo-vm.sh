#!/usr/bin/env bash
# `make demo-vm`: examples/vm-pipeline.yml with every job in a VM — a nesting daemon on this
# machine, guest images built here, the runner of examples/config/vm.toml pointed at them.
# Everything lives under target/demo-vm and the daemon and its VMs are gone when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test >/dev/null
dir=$(pwd)/target/demo-vm
bin=$(pwd)/target/debug
rm -rf "$dir/state" "$dir/n.sock"
mkdir -p "$dir"
"$bin/slipway" image build --name ci-microvm --level microvm --images-dir "$dir/images"
"$bin/slipway" image build --name ci-vm --level vm --images-dir "$dir/images"
"$bin/slipway" nesting --socket "$dir/n.sock" serve --state-dir "$dir/state" \
  --images-dir "$dir/images" 2>"$dir/nesting.log" &
daemon=$!
stop() {
  "$bin/slipway" nesting --socket "$dir/n.sock" shutdown 2>/dev/null || true
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
}
trap stop EXIT
for _ in $(seq 100); do [ -S "$dir/n.sock" ] && break; sleep 0.1; done
# The example config, pointed at this daemon; no GitLab (local pipeline), no idle instance.
sed -e "s|unix:///run/slipway/nesting.sock|unix://$dir/n.sock|" \
    -e '/^  url = /d; /^  id = /d; /^  token = /d' \
    -e 's|idle_count = 1|idle_count = 0|' \
    examples/config/vm.toml > "$dir/config.toml"
"$bin/slipway" exec -c "$dir/config.toml" examples/vm-pipeline.yml
