#!/usr/bin/env bash
# `make lint`'s supply-chain check: cargo-deny over Cargo.lock with deny.toml.
#
# Licenses, bans and sources need nothing but the lockfile: always checked, and a finding fails.
# Advisories need the RustSec database, which lives on github.com: fetched when reachable and
# then checked (a finding fails); when it cannot be fetched, a copy fetched earlier is used and
# its age printed; with no copy at all, one line says advisories were NOT checked and why.
# SLIPWAY_REQUIRE_ADVISORIES=1 (CI with network) turns that line into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

if ! "$CARGO" deny --version >/dev/null 2>&1; then
  echo "deny: installing cargo-deny (cargo install cargo-deny --locked)"
  "$CARGO" install cargo-deny --locked
fi

"$CARGO" deny --log-level error check licenses bans sources
echo "deny: licenses, bans, sources ok"

db=${CARGO_HOME:-$HOME/.cargo}/advisory-db
# A checkout cargo-deny made earlier: advisory-db-<hash>/crates/<crate>/RUSTSEC-*.md.
# No copy yet (a new machine): find fails on the missing folder, which is not an error here.
copy=$(find "$db" -mindepth 1 -maxdepth 1 -type d -name 'advisory-db-*' 2>/dev/null | head -1 || true)
if fetch_err=$(timeout 120 "$CARGO" deny --log-level error fetch db 2>&1); then
  "$CARGO" deny --log-level error --offline check advisories
  echo "deny: advisories ok (RustSec database fetched now)"
elif [ -n "$copy" ] && [ -d "$copy/crates" ]; then
  age=$(git -C "$copy" log -1 --format=%cs 2>/dev/null || echo unknown)
  echo "deny: the RustSec database could not be fetched; checking advisories against the copy in $copy (last updated $age)"
  "$CARGO" deny --log-level error --offline check advisories
  echo "deny: advisories ok (against the earlier copy)"
else
  reason=$(printf '%s\n' "$fetch_err" | grep -v '^\s*$' | tail -1)
  echo "deny: advisories NOT checked: the RustSec database (github.com/rustsec/advisory-db) cannot be fetched from here and no earlier copy is in $db: ${reason:-no reason given}"
  if [ "${SLIPWAY_REQUIRE_ADVISORIES:-0}" = 1 ]; then
    echo "deny: SLIPWAY_REQUIRE_ADVISORIES=1: failing" >&2
    exit 1
  fi
fi
