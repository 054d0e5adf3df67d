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

# The engine's integration tests run under both transports. The io_uring run turns the
# kernel's switch on for its duration (lanefs itself never touches it) and puts the old value
# back however the script ends; the /dev/fuse run repeats only the integration tests.
# What was already there (a user's own lanefs mounts and daemons, e.g. the README's fstab
# line) is not the tests' to answer for: the check at the end looks only at what is new.
lanefs_mounts() { awk '$3 == "fuse.lanefs" { print $2 }' /proc/mounts | sort; }
# (Exited daemons may linger as zombies until init reaps them: those do not count.)
live_daemons() { ps -eo stat=,pid=,args= | awk '$1 !~ /^Z/ && $3 ~ /(^|\/)lanefs$/ { print $2, $3, $4, $5, $6 }' | sort; }
# The database and object servers the volume's tests and the bench start (PostgreSQL, MinIO)
# must be gone too; a system cluster that was running before is not theirs.
live_servers() { ps -eo stat=,pid=,comm= | awk '$1 !~ /^Z/ && ($3 == "postgres" || $3 == "minio") { print $2, $3 }' | sort; }
mounts_before=$(lanefs_mounts)
daemons_before=$(live_daemons | awk '{ print $1 }')
servers_before=$(live_servers | awk '{ print $1 }')

uring_switch=/sys/module/fuse/parameters/enable_uring
if [ -w "$uring_switch" ]; then
  uring_was=$(cat "$uring_switch")
  trap 'echo "$uring_was" > "$uring_switch"' EXIT
  echo Y > "$uring_switch"
  first_transport=uring
else
  echo "no writable $uring_switch: the first run uses whatever the kernel offers" >&2
  first_transport=auto
fi
LANEFS_TEST_TRANSPORT=$first_transport LANEFS_FUZZ_SECONDS=${LANEFS_FUZZ_SECONDS:-30} \
  cargo test --workspace --locked
# Again over cloned /dev/fuse fds, but for what exercises the stores and not the transport,
# which runs once, above: the S3 suite (volume_s3.rs: MinIO stopped and restarted, ~4
# minutes), the kernel tree on a volume and on the passthrough (~2 minutes each: 84,000
# entries through both transports is length, not coverage; fio verify, stress-ng, git and
# the 50,000-file walk still run on both) and the PostgreSQL volume's tests (~5 minutes,
# most of it waiting out session and lease expiries), of which only those whose answers
# depend on the kernel's caches and the notifications one mount sends for another's changes
# run again. Keeps the whole script under 40 minutes on 2 cores.
LANEFS_TEST_TRANSPORT=dev cargo test -p lanefs --tests --locked -- --skip s3 \
  --skip volume_kernel_tree --skip kernel_tree_untars --skip on_postgres:: --skip quick_
LANEFS_TEST_TRANSPORT=dev cargo test -p lanefs --test volume --locked -- \
  on_postgres::the_change_log_invalidates_the_other_mounts_caches \
  on_postgres::two_mounts_of_one_volume_see_each_others_changes \
  on_postgres::a_file_unlinked_on_one_mount_stays_readable_where_it_is_open \
  on_postgres::flock_holds_across_mounts \
  on_postgres::an_o_creat_open_of_a_name_another_mount_just_took_checks_permissions \
  on_postgres::chattr_flags_set_on_one_mount_hold_on_the_other

# Every other bench suite at minimal size (tests/bench.rs runs engine and create, which
# pick their own transports: it is not run again over /dev/fuse above): checks that each one
# runs and writes well-formed output (report, JSON, charts), not speed. With the tests'
# debug build: a release build (7 minutes on 2 cores) would cost more than it saves here
# (the debug run of every suite took 559 s, the release one 455 s).
bench_out=$(mktemp -d /tmp/lanefs-bench-check.XXXXXX)
target/debug/lanefs bench --quick ssf queues seek passthrough transport untar dd apps \
  --no-print --out "$bench_out"
for f in report.md results.json; do
  [ -s "$bench_out/$f" ] || { echo "lanefs bench --quick wrote no $f" >&2; exit 1; }
done
ls "$bench_out"/*.svg >/dev/null
rm -rf "$bench_out"

# Nothing the tests started may outlive them.
new_mounts=$(comm -13 <(echo "$mounts_before") <(lanefs_mounts) | grep . || true)
new_daemons=$(live_daemons | awk -v before=" $(echo $daemons_before) " 'index(before, " " $1 " ") == 0' || true)
new_servers() { live_servers | awk -v before=" $(echo $servers_before) " 'index(before, " " $1 " ") == 0' || true; }
# (A stopped PostgreSQL's backends exit a moment after its postmaster: give them 5 s.)
for _ in $(seq 10); do [ -z "$(new_servers)" ] && break; sleep 0.5; done
new_servers=$(new_servers)
if [ -n "$new_mounts" ] || [ -n "$new_daemons" ] || [ -n "$new_servers" ]; then
  echo "tests left lanefs mounts, daemons or servers behind:" >&2
  [ -z "$new_mounts" ] || echo "$new_mounts" >&2
  [ -z "$new_daemons" ] || echo "$new_daemons" >&2
  [ -z "$new_servers" ] || echo "$new_servers" >&2
  exit 1
fi
echo "all tests passed"
