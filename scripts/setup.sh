#!/usr/bin/env bash
# Installs what building, running and testing lanefs needs on Debian 12 (as root):
# FUSE's user-space tools and headers (the libfuse example servers the bench compares with),
# fio and tar/git for the tests, and a current stable Rust (Debian's rustc is too old for
# edition 2024); for the passthrough suites: stress-ng, attr (setfattr), acl (setfacl), util-linux's setpriv
# and flock, and Debian's kernel source tarball (/usr/src/linux-source-*.tar.xz) to untar;
# for the volume's S3 tests: MinIO, built with Go into /usr/local/bin (curl signs the
# requests that make buckets).
# Idempotent: quick when everything is there.
set -euo pipefail

packages=(build-essential pkg-config curl ca-certificates git tar xz-utils
          fuse3 libfuse3-dev fio fonts-dejavu-core
          stress-ng attr acl util-linux make gcc linux-source
          postgresql sqlite3 faketime)
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

# MinIO, the S3 server the volume's S3 tests run (crates/cli/tests/common/minio.rs finds it
# in /usr/local/bin): built from the Go module proxy with the Go toolchain our machines have
# in /usr/local/go/bin, pinned to one version; ~7 minutes on 2 cores, skipped when present.
MINIO_MODULE=github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c
if [ ! -x /usr/local/bin/minio ]; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  if [ -x "$go" ]; then
    GOBIN=/usr/local/bin "$go" install "$MINIO_MODULE"
  else
    echo "setup.sh: no Go toolchain (go, /usr/local/go/bin/go): no MinIO; the S3 tests will say skipped" >&2
  fi
fi
