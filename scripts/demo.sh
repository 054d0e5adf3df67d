#!/usr/bin/env bash
# Sets up a Debian 12 machine (as root), builds lanefs, installs it as /usr/local/bin/lanefs
# (so that `mount -t fuse.lanefs` and fstab find it), mounts a volume, a passthrough and null,
# and shows them working.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked
install -m 755 target/release/lanefs /usr/local/bin/lanefs

run() { echo "+ $*"; "$@"; }
# A small project with a symlink, committed with git, on whatever is mounted at $mnt.
git_project() {
  run mkdir -p "$mnt/project/src"
  run sh -c "printf 'int main(void) { return 0; }\n' > '$mnt/project/src/main.c'"
  run ln -s src/main.c "$mnt/project/main-link.c"
  run git -C "$mnt/project" init -q
  run git -C "$mnt/project" add -A
  run git -C "$mnt/project" -c user.name=demo -c user.email=demo@example.com commit -qm first
  run git -C "$mnt/project" log --oneline
}
mnt=$(mktemp -d /tmp/lanefs-demo.XXXXXX)
src=$(mktemp -d /tmp/lanefs-demo-src.XXXXXX)
vol=$(mktemp -d /tmp/lanefs-demo-vol.XXXXXX)
trap 'lanefs umount --lazy "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true
      rm -rf "$src" "$vol"' EXIT

echo "== a volume on its embedded defaults: metadata in SQLite, data blocks in a directory"
run lanefs format "$vol/vol.db" --data "$vol/data"
run lanefs mount --daemon "$vol/vol.db" "$mnt"
git_project
run sh -c "for i in \$(seq 1000); do echo \$i > '$mnt/small-'\$i; done"
run sh -c "ls '$mnt' | wc -l"
run dd if=/dev/urandom of="$mnt/big" bs=1M count=64 status=none
run sync
run ls -l "$mnt/big"
run sh -c "ls '$vol/data' | head -3"
run lanefs stats "$mnt"
run lanefs umount "$mnt"
run lanefs fsck "$vol/vol.db"
run lanefs status "$vol/vol.db"

echo "== passthrough: a host directory, exported as is"
run lanefs mount --daemon "$src" "$mnt"
git_project
run ls -lR "$src/project" --ignore=.git
run fio --name=randwrite --directory="$mnt" --rw=randwrite --bs=4k --ioengine=psync \
  --numjobs=2 --size=64M --runtime=3 --time_based --group_reporting \
  | grep -E '^ *(read|write):'
run lanefs stats "$mnt"
run lanefs umount "$mnt"

echo "== the null file system: the engine's overhead probe"
run lanefs mount --daemon null: "$mnt"
run ls -l "$mnt"
run fio --name=randread --filename="$mnt/data" --rw=randread --bs=4k --direct=1 \
  --ioengine=psync --numjobs=2 --size=256M --runtime=3 --time_based --group_reporting \
  | grep -E '^ *(read|write):'
run lanefs stats "$mnt"
run lanefs umount "$mnt"
