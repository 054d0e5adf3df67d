#!/usr/bin/env bash
# Sets up a Debian 12 machine (as root) and runs every lanefs test: unit tests, the decoder
# fuzzer for a bounded time, and the integration tests, which mount real file systems through
# /dev/fuse and drive them with syscalls, fio, tar and git.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
LANEFS_FUZZ_SECONDS=${LANEFS_FUZZ_SECONDS:-30} cargo test --workspace --locked

# Nothing may outlive the tests.
if grep -q 'fuse.lanefs' /proc/mounts || pgrep -x lanefs >/dev/null; then
  echo "tests left lanefs mounts or daemons behind:" >&2
  grep 'fuse.lanefs' /proc/mounts >&2 || true
  pgrep -a -x lanefs >&2 || true
  exit 1
fi
echo "all tests passed"
