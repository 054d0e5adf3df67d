#!/usr/bin/env bash
# Installs what building, running and testing lanefs needs on Debian 12 (as root):
# FUSE's user-space tools and headers (the libfuse example servers the bench compares with),
# fio and tar/git for the tests, and a current stable Rust (Debian's rustc is too old for
# edition 2024); for the passthrough suites: stress-ng, attr (setfattr), acl (setfacl), util-linux's setpriv
# and flock, and Debian's kernel source tarball (/usr/src/linux-source-*.tar.xz) to untar.
# Idempotent: quick when everything is there.
set -euo pipefail

packages=(build-essential pkg-config curl ca-certificates git tar xz-utils
          fuse3 libfuse3-dev fio fonts-dejavu-core
          stress-ng attr acl util-linux make gcc linux-source
          postgresql sqlite3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# /dev/fuse must exist (containers sometimes lack the node).
if [ ! -c /dev/fuse ]; then
  modprobe fuse 2>/dev/null || true
  [ -c /dev/fuse ] || mknod -m 666 /dev/fuse c 10 229
fi

export PATH="$HOME/.cargo/bin:$PATH"
need_rust=1
if command -v cargo >/dev/null 2>&1; then
  minor=$(cargo --version | sed -E 's/^cargo 1\.([0-9]+).*/\1/')
  [ "${minor:-0}" -ge 85 ] && need_rust=0
fi
if [ "$need_rust" = 1 ]; then
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
fi
