//! POSIX conformance of the passthrough file system, side by side with the host.
//!
//! Each case is a function of a root directory that performs calls and records what each
//! returned (values, or the errno by name) in a transcript. A case runs on a native temp dir
//! (twice: the transcript must not depend on the run) and then on a passthrough mount in
//! several option variants; the transcripts must be identical, and afterwards the mount's
//! source directory must hold the same tree as the native one (types, modes, owners, links,
//! contents, xattrs). Inode numbers and times are only recorded as relations ("same inode")
//! or exact values the case set itself.
//!
//! Every case also runs on a volume (`on_volume::NAME`): the same transcript as natively, the
//! same tree seen through the volume's mount, and `lanefs fsck` clean after unmounting.

mod common;

use std::fmt::Debug;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::sys::{self, Errno, R};
use common::{Mount, TempDir, assert_same_tree, tree_snapshot};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

/// Mount option sets every case runs under.
const VARIANTS: &[&[&str]] = &[
    &[],
    &["--no-passthrough"],
    // The -o form, with everything the kernel may cache turned off and the fewest fds.
    &[
        "-o",
        "direct_io,no_file_handles,fd_cache=4,attr_timeout=0,entry_timeout=0",
    ],
];

/// A transcript of calls and their outcomes.
#[derive(Default)]
struct T(Vec<String>);

impl T {
    /// Records `what` and its outcome (value or errno).
    fn r<X: Debug>(&mut self, what: &str, res: R<X>) {
        match &res {
            Ok(v) => self.0.push(format!("{what}: ok {v:?}")),
            Err(e) => self.0.push(format!("{what}: {e}")),
        }
    }

    /// Records only success or the errno.
    fn e<X>(&mut self, what: &str, res: R<X>) {
        let _ = self.ev(what, res);
    }

    /// Records only success or the errno; returns the outcome.
    fn ev<X>(&mut self, what: &str, res: R<X>) -> R<X> {
        match &res {
            Ok(_) => self.0.push(format!("{what}: ok")),
            Err(e) => self.0.push(format!("{what}: {e}")),
        }
        res
    }

    fn note(&mut self, line: String) {
        self.0.push(line);
    }

    /// Records the metadata of `p` (lstat), or the errno.
    fn meta(&mut self, what: &str, p: &Path) {
        let line = match sys::lstat(p) {
            Ok(st) => meta(&st),
            Err(e) => e.name(),
        };
        self.0.push(format!("{what}: {line}"));
    }

    /// Records the metadata of `p` following symlinks.
    fn meta_follow(&mut self, what: &str, p: &Path) {
        let line = match sys::stat(p) {
            Ok(st) => meta(&st),
            Err(e) => e.name(),
        };
        self.0.push(format!("{what}: {line}"));
    }
}

/// What a stat says that must match between the host and the mount.
fn meta(st: &libc::stat) -> String {
    let kind = sys::file_type(st.st_mode);
    let mut s = format!(
        "{kind} {:04o} nlink={} {}:{}",
        st.st_mode & 0o7777,
        st.st_nlink,
        st.st_uid,
        st.st_gid
    );
    if kind != "dir" {
        s += &format!(" size={}", st.st_size);
    }
    if kind == "chardev" || kind == "blockdev" {
        s += &format!(
            " rdev={}:{}",
            libc::major(st.st_rdev),
            libc::minor(st.st_rdev)
        );
    }
    s
}

fn rw(p: &Path) -> R<OwnedFd> {
    sys::open(p, libc::O_RDWR, 0)
}

fn create(p: &Path, mode: u32) -> R<OwnedFd> {
    sys::open(p, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC, mode)
}

fn text(v: R<Vec<u8>>) -> R<String> {
    v.map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn read_all(p: &Path) -> R<String> {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(0)))
}

fn put(p: &Path, data: &[u8]) {
    std::fs::write(p, data).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 7 + seed as u64 * 13 % 251) as u8)
        .collect()
}

/// Runs `case` natively twice (the transcript must be stable), then on a passthrough mount in
/// each variant, comparing transcripts and the resulting trees.
fn side_by_side(name: &str, case: fn(&Path, &mut T)) {
    let run = |root: &Path| {
        let mut t = T::default();
        case(root, &mut t);
        t.0
    };
    let native = TempDir::new(&format!("native-{name}"));
    let expected = run(native.path());
    let native2 = TempDir::new(&format!("native2-{name}"));
    assert_eq!(
        expected,
        run(native2.path()),
        "{name}: the case itself is not deterministic"
    );
    if std::env::var_os("LANEFS_TEST_TRANSCRIPT").is_some() {
        eprintln!("{name} (native):\n  {}", expected.join("\n  "));
    }
    let expected_tree = tree_snapshot(native.path());
    // Every variant runs; the failures of all are reported together.
    let mut failures = Vec::new();
    for variant in VARIANTS {
        let source = TempDir::new(&format!("src-{name}"));
        let m = Mount::passthrough(source.path(), variant);
        let mut t = T::default();
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&m.mountpoint, &mut t)));
        if let Err(panic) = outcome {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!(
                "{name} with {variant:?} panicked ({why}) after:\n  {}",
                t.0.join("\n  ")
            ));
            continue;
        }
        let got = t.0;
        if got != expected {
            // From the first difference on, both transcripts in full.
            let first = expected
                .iter()
                .zip(&got)
                .position(|(e, g)| e != g)
                .unwrap_or(expected.len().min(got.len()));
            let report = format!(
                "  (first {first} lines agree)\n  native from there:\n    {}\n  mount from there:\n    {}",
                expected[first..].join("\n    "),
                got[first..].join("\n    ")
            );
            failures.push(format!(
                "{name} with {variant:?}: transcripts differ:\n{report}"
            ));
        }
        let tree = tree_snapshot(source.path());
        if tree != expected_tree {
            let diff: Vec<_> = expected_tree
                .keys()
                .chain(tree.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter(|k| tree.get(*k) != expected_tree.get(*k))
                .map(|k| {
                    format!(
                        "  {k}: native {:?}, source {:?}",
                        expected_tree.get(k),
                        tree.get(k)
                    )
                })
                .collect();
            failures.push(format!(
                "{name} with {variant:?}: the source differs from the native tree:\n{}",
                diff.join("\n")
            ));
        }
        m.unmount();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Cases the volume does not pass yet, and why.
const VOLUME_SKIPS: &[(&str, &str)] = &[(
    "fallocate_modes",
    "the volume preallocates nothing: st_blocks follows the data written, not KEEP_SIZE reservations or punched holes",
)];

/// Transcript lines that depend on the order a directory lists its names (tmpfs lists the
/// newest first, the volume by name), per case: left out of both transcripts on the volume,
/// and the trees (which such a case shapes by that order) are not compared.
const VOLUME_ORDER_DEPENDENT: &[(&str, &str)] = &[("readdir_while_changing", "final count:")];

/// Runs `case` natively, then on a new volume: transcripts and trees must agree, and fsck must
/// find nothing after unmounting.
fn on_volume(name: &str, case: fn(&Path, &mut T)) {
    on_a_volume(name, case, false)
}

/// A case on a volume whose metadata is on PostgreSQL (a server of the test's own).
fn on_pg_volume(name: &str, case: fn(&Path, &mut T)) {
    on_a_volume(name, case, true)
}

fn on_a_volume(name: &str, case: fn(&Path, &mut T), postgres: bool) {
    if let Some((_, why)) = VOLUME_SKIPS.iter().find(|(n, _)| *n == name) {
        eprintln!("skipped on the volume: {why}");
        return;
    }
    let native = TempDir::new(&format!("native-{name}"));
    let mut t = T::default();
    case(native.path(), &mut t);
    let order_dependent = |lines: Vec<String>| -> Vec<String> {
        lines
            .into_iter()
            .filter(|l| {
                !VOLUME_ORDER_DEPENDENT
                    .iter()
                    .any(|(case, prefix)| *case == name && l.starts_with(prefix))
            })
            .collect()
    };
    let expected = order_dependent(t.0);
    let expected_tree = tree_snapshot(native.path());
    let volume = if postgres {
        match common::volume::Volume::format_on_postgres(name) {
            Some(volume) => volume,
            None => return,
        }
    } else {
        common::volume::Volume::format(name)
    };
    let m = volume.mount(&[]);
    let mut t = T::default();
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&m.mountpoint, &mut t)));
    if let Err(panic) = outcome {
        panic!(
            "{name} panicked on the volume after:\n  {}\n{panic:?}",
            t.0.join("\n  ")
        );
    }
    let got = order_dependent(t.0);
    if got != expected {
        let first = expected
            .iter()
            .zip(&got)
            .position(|(e, g)| e != g)
            .unwrap_or(expected.len().min(got.len()));
        panic!(
            "{name} on the volume: transcripts differ (first {first} lines agree)\n  native from there:\n    {}\n  volume from there:\n    {}",
            expected[first..].join("\n    "),
            got[first..].join("\n    ")
        );
    }
    let tree = tree_snapshot(&m.mountpoint);
    let order_shaped = VOLUME_ORDER_DEPENDENT.iter().any(|(case, _)| *case == name);
    if tree != expected_tree && !order_shaped {
        let diff: Vec<_> = expected_tree
            .keys()
            .chain(tree.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| tree.get(*k) != expected_tree.get(*k))
            .map(|k| {
                format!(
                    "  {k}: native {:?}, volume {:?}",
                    expected_tree.get(k),
                    tree.get(k)
                )
            })
            .collect();
        panic!(
            "{name}: the volume's tree differs from the native one:\n{}",
            diff.join("\n")
        );
    }
    m.unmount();
    volume.assert_clean();
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                side_by_side(stringify!($name), cases::$name);
            }
        )*
        /// The same cases on a volume.
        mod on_volume {
            $(
                #[test]
                fn $name() {
                    super::on_volume(stringify!($name), super::cases::$name);
                }
            )*
        }
        /// The same cases on a volume on PostgreSQL.
        mod on_pg_volume {
            $(
                #[test]
                fn $name() {
                    super::on_pg_volume(stringify!($name), super::cases::$name);
                }
            )*
        }
    };
}

cases!(
    lookup_and_stat,
    setattr_chmod_chown_truncate_utimens,
    symlink_and_readlink,
    mknod_fifo_socket_devices,
    mkdir_and_rmdir,
    setgid_directories_pass_their_group_on,
    unlink,
    rename_and_renameat2,
    hard_links,
    open_and_create_flags,
    o_tmpfile_and_linkat,
    read_write_pread_pwrite,
    mmap_shared_writes,
    statfs,
    fsync_fdatasync_files_and_dirs,
    xattrs,
    posix_acls,
    readdir_names_and_types,
    readdir_large_and_seekdir,
    readdir_while_changing,
    access_as_root,
    fallocate_modes,
    lseek_data_and_hole,
    copy_file_range,
    flock_across_fds_and_processes,
    posix_record_locks,
    unlinked_while_open,
    name_lengths_and_odd_names,
    mixed_open_modes_of_one_file,
    offsets_past_4_gib,
    hard_links_share_one_cache,
);

mod cases {
    use super::*;

    pub fn lookup_and_stat(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"hello");
        t.meta("stat f", &f);
        t.meta_follow("stat f (follow)", &f);
        let st = sys::stat(&f).unwrap();
        t.note(format!("blocks>0: {}", st.st_blocks > 0));
        t.e("stat missing", sys::stat(&root.join("missing")));
        t.e("stat f/x", sys::stat(&root.join("f/x")));
        t.e("mkdir d", sys::mkdir(&root.join("d"), 0o755));
        t.meta("stat d", &root.join("d"));
        t.meta("stat d/../f", &root.join("d/../f"));
        t.meta("stat d/./..", &root.join("d/./.."));
        let fd = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        t.r("fstat", sys::fstat(&fd).map(|st| meta(&st)));
        let (a, b) = (sys::stat(&f).unwrap(), sys::fstat(&fd).unwrap());
        t.note(format!(
            "stat and fstat agree on ino: {}",
            a.st_ino == b.st_ino
        ));
        let d = sys::stat(&root.join("d")).unwrap();
        t.note(format!(
            "dir and file differ in ino: {}",
            a.st_ino != d.st_ino
        ));
        // O_PATH and fstatat through a directory fd.
        let dirfd = sys::open(root, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        t.r(
            "openat O_PATH f",
            sys::openat(&dirfd, "f", libc::O_PATH, 0)
                .and_then(|fd| sys::fstat(&fd).map(|s| meta(&s))),
        );
    }

    pub fn setattr_chmod_chown_truncate_utimens(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"0123456789");
        t.e("chmod 0640", sys::chmod(&f, 0o640));
        t.meta("after chmod", &f);
        t.e("chmod 04755", sys::chmod(&f, 0o4755));
        t.meta("after chmod 04755", &f);
        // chown of a set-user-ID file clears the bit, for root too.
        t.e("chown 1234:5678", sys::chown(&f, 1234, 5678));
        t.meta("after chown", &f);
        t.e("chown -1:42", sys::chown(&f, u32::MAX, 42));
        t.meta("after chown -1:42", &f);
        let fd = rw(&f).unwrap();
        t.e("fchmod 0600", sys::fchmod(&fd, 0o600));
        t.meta("after fchmod", &f);
        t.e("symlink s -> f", sys::symlink("f", &root.join("s")));
        t.e("lchown s 77:88", sys::lchown(&root.join("s"), 77, 88));
        t.meta("s", &root.join("s"));
        t.meta("f", &f);
        t.e("chmod missing", sys::chmod(&root.join("missing"), 0o644));

        t.e("truncate 4", sys::truncate(&f, 4));
        t.r("content", read_all(&f));
        t.e("truncate 10000", sys::truncate(&f, 10000));
        let data = std::fs::read(&f).unwrap();
        t.note(format!(
            "len {} tail zero: {}",
            data.len(),
            data[4..].iter().all(|&b| b == 0)
        ));
        t.e("ftruncate 1", sys::ftruncate(&fd, 1));
        t.r("fstat size", sys::fstat(&fd).map(|s| s.st_size));
        t.e("truncate -1", sys::truncate(&f, -1));
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        t.e("truncate dir", sys::truncate(&root.join("d"), 0));
        t.e("truncate missing", sys::truncate(&root.join("missing"), 0));

        let times = |p: &Path| {
            sys::lstat(p).map(|s| (s.st_atime, s.st_atime_nsec, s.st_mtime, s.st_mtime_nsec))
        };
        t.e(
            "utimens exact",
            sys::utimens(
                &f,
                sys::ts(1_000_000_000, 123_456_789),
                sys::ts(1_100_000_000, 987_654_321),
                0,
            ),
        );
        t.r("times", times(&f));
        t.e(
            "utimens atime OMIT",
            sys::utimens(
                &f,
                sys::ts(0, libc::UTIME_OMIT),
                sys::ts(1_200_000_000, 5),
                0,
            ),
        );
        t.r("times", times(&f));
        let before = now();
        t.e(
            "utimens atime NOW mtime OMIT",
            sys::utimens(
                &f,
                sys::ts(0, libc::UTIME_NOW),
                sys::ts(0, libc::UTIME_OMIT),
                0,
            ),
        );
        let (a, _, m, mn) = times(&f).unwrap();
        t.note(format!(
            "atime is now: {}, mtime kept: {}",
            a >= before - 1 && a <= now() + 1,
            (m, mn) == (1_200_000_000, 5)
        ));
        t.e(
            "utimens both NOW",
            sys::utimens(
                &f,
                sys::ts(0, libc::UTIME_NOW),
                sys::ts(0, libc::UTIME_NOW),
                0,
            ),
        );
        let (_, _, m, _) = times(&f).unwrap();
        t.note(format!(
            "mtime is now: {}",
            m >= before - 1 && m <= now() + 1
        ));
        t.e(
            "utimens symlink nofollow",
            sys::utimens(
                &root.join("s"),
                sys::ts(500_000_000, 1),
                sys::ts(600_000_000, 2),
                libc::AT_SYMLINK_NOFOLLOW,
            ),
        );
        t.r("symlink times", times(&root.join("s")));
        let (_, _, m, _) = times(&f).unwrap();
        t.note(format!("target untouched: {}", m != 600_000_000));
        t.e(
            "utimens bad nsec",
            sys::utimens(&f, sys::ts(0, 2_000_000_000), sys::ts(0, 0), 0),
        );
        // ctime moves on a chmod.
        let c0 = sys::stat(&f).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        sys::chmod(&f, 0o644).unwrap();
        let c1 = sys::stat(&f).unwrap();
        t.note(format!(
            "ctime advanced: {}",
            (c1.st_ctime, c1.st_ctime_nsec) > (c0.st_ctime, c0.st_ctime_nsec)
        ));
    }

    pub fn symlink_and_readlink(root: &Path, t: &mut T) {
        let l = root.join("l1");
        t.e("symlink", sys::symlink("target/text", &l));
        t.r("readlink", sys::readlink(&l));
        t.meta("lstat", &l);
        t.e("stat dangling", sys::stat(&l));
        t.e("symlink again", sys::symlink("x", &l));
        put(&root.join("f"), b"content of f");
        t.e("readlink regular", sys::readlink(&root.join("f")));
        t.e("readlink missing", sys::readlink(&root.join("missing")));
        let long = "a/".repeat(2000);
        t.e(
            "symlink 4000-byte target",
            sys::symlink(&long, &root.join("long")),
        );
        t.r(
            "readlink long is same",
            sys::readlink(&root.join("long")).map(|s| s == long),
        );
        t.meta("lstat long", &root.join("long"));
        t.e(
            "symlink 5000-byte target",
            sys::symlink(&"b".repeat(5000), &root.join("toolong")),
        );
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        t.e(
            "relative symlink d/up -> ../f",
            sys::symlink("../f", &root.join("d/up")),
        );
        t.meta_follow("stat d/up", &root.join("d/up"));
        t.r("read d/up", read_all(&root.join("d/up")));
        t.e("symlink dl -> d", sys::symlink("d", &root.join("dl")));
        t.meta_follow("stat dl/up", &root.join("dl/up"));
        t.e(
            "open dl O_NOFOLLOW",
            sys::open(&root.join("dl"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
        );
        t.e(
            "open dl O_NOFOLLOW|O_PATH",
            sys::open(&root.join("dl"), libc::O_PATH | libc::O_NOFOLLOW, 0),
        );
        t.e("symlink loop a -> b", sys::symlink("b", &root.join("a")));
        t.e("symlink loop b -> a", sys::symlink("a", &root.join("b")));
        t.e("stat loop", sys::stat(&root.join("a")));
        t.e(
            "symlink empty target",
            sys::symlink("", &root.join("empty")),
        );
    }

    pub fn mknod_fifo_socket_devices(root: &Path, t: &mut T) {
        let nodes: [(&str, u32, u64); 5] = [
            ("fifo", libc::S_IFIFO | 0o644, 0),
            ("sock", libc::S_IFSOCK | 0o600, 0),
            ("chr", libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
            ("blk", libc::S_IFBLK | 0o640, libc::makedev(7, 0)),
            ("reg", libc::S_IFREG | 0o644, 0),
        ];
        for (name, mode, dev) in nodes {
            t.e(
                &format!("mknod {name}"),
                sys::mknod(&root.join(name), mode, dev),
            );
            t.meta(name, &root.join(name));
        }
        t.e(
            "mknod fifo again",
            sys::mknod(&root.join("fifo"), libc::S_IFIFO | 0o644, 0),
        );
        t.e(
            "mknod in missing dir",
            sys::mknod(&root.join("missing/x"), libc::S_IFIFO | 0o644, 0),
        );
        // A FIFO on the mount is a pipe in the client's kernel.
        let fd = sys::open(&root.join("fifo"), libc::O_RDWR | libc::O_NONBLOCK, 0).unwrap();
        t.r("write fifo", sys::write(&fd, b"ping"));
        t.r("read fifo", text(sys::read(&fd, 16)));
        t.e("read empty fifo", sys::read(&fd, 16));
    }

    pub fn mkdir_and_rmdir(root: &Path, t: &mut T) {
        let a = root.join("a");
        t.e("mkdir a 0777", sys::mkdir(&a, 0o777));
        t.meta("a", &a);
        t.e("mkdir a", sys::mkdir(&a, 0o777));
        t.e("mkdir a/b/c", sys::mkdir(&a.join("b/c"), 0o777));
        t.e("mkdir a/b 0700", sys::mkdir(&a.join("b"), 0o700));
        t.meta("a after subdir", &a);
        put(&a.join("b/f"), b"x");
        t.e("rmdir a/b", sys::rmdir(&a.join("b")));
        t.e("rmdir missing", sys::rmdir(&root.join("missing")));
        t.e("rmdir a/b/f", sys::rmdir(&a.join("b/f")));
        t.e("rmdir a/b/.", sys::rmdir(&a.join("b/.")));
        t.e("unlink a/b/f", sys::unlink(&a.join("b/f")));
        t.e("rmdir a/b", sys::rmdir(&a.join("b")));
        t.meta("a after rmdir", &a);
        t.e(
            "mkdir missing/..",
            sys::mkdir(&root.join("f-not-there/.."), 0o755),
        );
        put(&root.join("f"), b"");
        t.e("mkdir f", sys::mkdir(&root.join("f"), 0o755));
        t.e(
            "mkdir sticky 01777",
            sys::mkdir(&root.join("sticky"), 0o1777),
        );
        t.meta("sticky", &root.join("sticky"));
        t.e("mkdir 0", sys::mkdir(&root.join("zero"), 0));
        t.meta("zero", &root.join("zero"));
        t.e(
            "mkdir zero/in (root)",
            sys::mkdir(&root.join("zero/in"), 0o755),
        );
        // Deep nesting.
        let mut p = root.join("deep");
        for _ in 0..40 {
            sys::mkdir(&p, 0o755).unwrap();
            p = p.join("d");
        }
        t.e("mkdir at depth 40", sys::mkdir(&p, 0o755));
        t.e(
            "rm -r deep",
            std::fs::remove_dir_all(root.join("deep"))
                .map_err(|e| Errno(e.raw_os_error().unwrap_or(0))),
        );
    }

    pub fn setgid_directories_pass_their_group_on(root: &Path, t: &mut T) {
        let g = root.join("g");
        sys::mkdir(&g, 0o755).unwrap();
        t.e("chown g :4242", sys::chown(&g, u32::MAX, 4242));
        t.e("chmod g 02775", sys::chmod(&g, 0o2775));
        t.e("mkdir g/sub", sys::mkdir(&g.join("sub"), 0o755));
        t.meta("g/sub", &g.join("sub"));
        t.e("create g/file", create(&g.join("file"), 0o644));
        t.meta("g/file", &g.join("file"));
        t.e(
            "mknod g/fifo",
            sys::mknod(&g.join("fifo"), libc::S_IFIFO | 0o644, 0),
        );
        t.meta("g/fifo", &g.join("fifo"));
        t.e("symlink g/link", sys::symlink("file", &g.join("link")));
        t.meta("g/link", &g.join("link"));
    }

    pub fn unlink(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"data");
        t.e("unlink f", sys::unlink(&f));
        t.e("stat f", sys::stat(&f));
        t.e("unlink f again", sys::unlink(&f));
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        t.e("unlink dir", sys::unlink(&root.join("d")));
        put(&f, b"data");
        sys::link(&f, &root.join("g")).unwrap();
        t.e("unlink f (linked)", sys::unlink(&f));
        t.meta("g", &root.join("g"));
        sys::symlink("g", &root.join("s")).unwrap();
        t.e("unlink symlink", sys::unlink(&root.join("s")));
        t.meta("target kept", &root.join("g"));
        t.e("unlink f/x", sys::unlink(&root.join("g/x")));
        // A sticky dir: root may remove anyone's file.
        sys::mkdir(&root.join("tmp"), 0o1777).unwrap();
        put(&root.join("tmp/theirs"), b"");
        sys::chown(&root.join("tmp/theirs"), 4321, 4321).unwrap();
        t.e(
            "unlink other's file in sticky dir",
            sys::unlink(&root.join("tmp/theirs")),
        );
    }

    pub fn rename_and_renameat2(root: &Path, t: &mut T) {
        let p = |n: &str| root.join(n);
        put(&p("a"), b"A");
        put(&p("b"), b"B");
        t.e("rename a c", sys::rename(&p("a"), &p("c")));
        t.e("stat a", sys::stat(&p("a")));
        t.r("read c", read_all(&p("c")));
        t.e("rename c b (replace)", sys::rename(&p("c"), &p("b")));
        t.r("read b", read_all(&p("b")));
        t.meta("b", &p("b"));
        sys::mkdir(&p("d1"), 0o755).unwrap();
        sys::mkdir(&p("d2"), 0o755).unwrap();
        put(&p("d2/file"), b"in d2");
        sys::mkdir(&p("d3"), 0o755).unwrap();
        t.e(
            "rename d1 over non-empty d2",
            sys::rename(&p("d1"), &p("d2")),
        );
        t.e("rename d3 over empty d1", sys::rename(&p("d3"), &p("d1")));
        t.e("stat d3", sys::stat(&p("d3")));
        t.e("rename file over dir", sys::rename(&p("b"), &p("d1")));
        t.e("rename dir over file", sys::rename(&p("d1"), &p("b")));
        sys::mkdir(&p("d1/sub"), 0o755).unwrap();
        t.e(
            "rename d1 into itself",
            sys::rename(&p("d1"), &p("d1/sub/x")),
        );
        t.e("rename missing", sys::rename(&p("missing"), &p("x")));
        t.e("rename to missing dir", sys::rename(&p("b"), &p("nodir/x")));
        t.e(
            "rename d2/file d1/file",
            sys::rename(&p("d2/file"), &p("d1/file")),
        );
        t.r("read d1/file", read_all(&p("d1/file")));
        t.meta("d1", &p("d1"));
        t.meta("d2", &p("d2"));
        t.e(
            "rename dir across parents",
            sys::rename(&p("d1/sub"), &p("d2/sub")),
        );
        t.meta("d1 after", &p("d1"));
        t.meta("d2 after", &p("d2"));
        t.e("rename b b", sys::rename(&p("b"), &p("b")));
        sys::link(&p("b"), &p("b2")).unwrap();
        t.e(
            "rename between links of one inode",
            sys::rename(&p("b"), &p("b2")),
        );
        t.meta("b after", &p("b"));
        t.meta("b2 after", &p("b2"));

        put(&p("e"), b"E");
        t.e(
            "NOREPLACE over existing",
            sys::renameat2(&p("b"), &p("e"), libc::RENAME_NOREPLACE),
        );
        t.r("e kept", read_all(&p("e")));
        t.e(
            "NOREPLACE to new",
            sys::renameat2(&p("b"), &p("g"), libc::RENAME_NOREPLACE),
        );
        t.e(
            "EXCHANGE g e",
            sys::renameat2(&p("g"), &p("e"), libc::RENAME_EXCHANGE),
        );
        t.r("g", read_all(&p("g")));
        t.r("e", read_all(&p("e")));
        t.e(
            "EXCHANGE with missing",
            sys::renameat2(&p("g"), &p("missing"), libc::RENAME_EXCHANGE),
        );
        t.e(
            "EXCHANGE file and dir",
            sys::renameat2(&p("g"), &p("d2"), libc::RENAME_EXCHANGE),
        );
        t.meta("g now", &p("g"));
        t.meta("d2 now", &p("d2"));
        t.meta("g/sub", &p("g/sub"));
        t.e(
            "NOREPLACE|EXCHANGE",
            sys::renameat2(
                &p("g"),
                &p("e"),
                libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE,
            ),
        );
        // An open file keeps its content across a rename over its name.
        put(&p("victim"), b"old");
        let fd = sys::open(&p("victim"), libc::O_RDONLY, 0).unwrap();
        put(&p("new"), b"new");
        t.e(
            "rename new over open victim",
            sys::rename(&p("new"), &p("victim")),
        );
        t.r("open fd reads", text(sys::pread(&fd, 16, 0)));
        t.r("name reads", read_all(&p("victim")));
    }

    pub fn hard_links(root: &Path, t: &mut T) {
        let (f, g) = (root.join("f"), root.join("g"));
        put(&f, b"data");
        t.e("link f g", sys::link(&f, &g));
        let (a, b) = (sys::stat(&f).unwrap(), sys::stat(&g).unwrap());
        t.note(format!("same ino: {}", a.st_ino == b.st_ino));
        t.meta("f", &f);
        t.meta("g", &g);
        t.e("link f g again", sys::link(&f, &g));
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        t.e("link dir", sys::link(&root.join("d"), &root.join("d2")));
        t.e(
            "link missing",
            sys::link(&root.join("missing"), &root.join("h")),
        );
        t.e(
            "link into missing dir",
            sys::link(&f, &root.join("nodir/h")),
        );
        t.e("link d/h", sys::link(&f, &root.join("d/h")));
        t.meta("f after 3 links", &f);
        let fd = sys::open(&g, libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        t.r("append via g", sys::write(&fd, b"+more"));
        drop(fd);
        t.r("read via f", read_all(&f));
        t.r("read via d/h", read_all(&root.join("d/h")));
        t.e("unlink f", sys::unlink(&f));
        t.meta("g after unlink", &g);
        t.r("read g", read_all(&g));
        // link(2) does not follow a symlink: the new name is a symlink too.
        sys::symlink("g", &root.join("s")).unwrap();
        t.e("link symlink", sys::link(&root.join("s"), &root.join("s2")));
        t.meta("s2", &root.join("s2"));
        t.meta("s", &root.join("s"));
        // chmod through one name shows through the other.
        t.e("chmod d/h 0600", sys::chmod(&root.join("d/h"), 0o600));
        t.meta("g after chmod of d/h", &g);
    }

    pub fn open_and_create_flags(root: &Path, t: &mut T) {
        let f = root.join("f");
        let excl = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
        let fd = t
            .ev("create O_EXCL 0640", sys::open(&f, excl, 0o640))
            .unwrap();
        t.meta("f", &f);
        t.e("create O_EXCL again", sys::open(&f, excl, 0o640));
        t.r("write", sys::write(&fd, b"0123456789"));
        drop(fd);
        t.e(
            "open O_TRUNC",
            sys::open(&f, libc::O_WRONLY | libc::O_TRUNC, 0),
        );
        t.meta("after O_TRUNC", &f);
        t.e(
            "open missing",
            sys::open(&root.join("missing"), libc::O_RDONLY, 0),
        );
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        t.e(
            "open dir O_WRONLY",
            sys::open(&root.join("d"), libc::O_WRONLY, 0),
        );
        t.e(
            "open dir O_RDONLY",
            sys::open(&root.join("d"), libc::O_RDONLY, 0),
        );
        t.e(
            "open file O_DIRECTORY",
            sys::open(&f, libc::O_RDONLY | libc::O_DIRECTORY, 0),
        );
        t.e(
            "create in missing dir",
            sys::open(&root.join("nodir/x"), excl, 0o644),
        );
        t.e(
            "create in a file",
            sys::open(&root.join("f/x"), excl, 0o644),
        );

        put(&f, b"abc");
        let fd = sys::open(&f, libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        t.r("append def", sys::write(&fd, b"def"));
        // pwrite on an O_APPEND fd appends on Linux.
        t.r("pwrite X at 0 (append)", sys::pwrite(&fd, b"X", 0));
        drop(fd);
        t.r("content", read_all(&f));
        let fd = sys::open(&f, libc::O_RDWR | libc::O_CREAT, 0o600).unwrap();
        t.meta("O_CREAT on existing keeps it", &f);
        t.r("read", text(sys::read(&fd, 64)));
        drop(fd);

        sys::symlink("made-by-link", &root.join("dl")).unwrap();
        t.e(
            "O_CREAT|O_EXCL on dangling symlink",
            sys::open(&root.join("dl"), excl, 0o644),
        );
        t.e(
            "O_CREAT through dangling symlink",
            sys::open(&root.join("dl"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        );
        t.meta("made-by-link", &root.join("made-by-link"));
        t.e(
            "O_NOFOLLOW on symlink",
            sys::open(&root.join("dl"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
        );

        let fd = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        t.e("write to O_RDONLY fd", sys::write(&fd, b"x"));
        let fd = sys::open(&f, libc::O_WRONLY, 0).unwrap();
        t.e("read from O_WRONLY fd", sys::read(&fd, 1));
        t.e("create mode 0", sys::open(&root.join("zero"), excl, 0));
        t.meta("zero", &root.join("zero"));
        t.e(
            "root opens 0000 file rw",
            sys::open(&root.join("zero"), libc::O_RDWR, 0),
        );
        t.e(
            "create with 07777 (root)",
            sys::open(&root.join("allbits"), excl, 0o7777),
        );
        t.meta("allbits", &root.join("allbits"));
        t.e("open O_PATH", sys::open(&f, libc::O_PATH, 0));
        t.e(
            "open O_NOATIME",
            sys::open(&f, libc::O_RDONLY | libc::O_NOATIME, 0),
        );
        t.e(
            "open O_SYNC write",
            sys::open(&f, libc::O_WRONLY | libc::O_SYNC, 0).and_then(|fd| sys::write(&fd, b"sync")),
        );
        t.r("content after O_SYNC write", read_all(&f));
    }

    pub fn o_tmpfile_and_linkat(root: &Path, t: &mut T) {
        let fd = t
            .ev(
                "open O_TMPFILE",
                sys::open(root, libc::O_TMPFILE | libc::O_RDWR, 0o600),
            )
            .unwrap();
        t.r("write", sys::write(&fd, b"tmp data"));
        t.r("fstat", sys::fstat(&fd).map(|s| meta(&s)));
        t.r("listing before link", Ok::<_, Errno>(names(root)));
        t.e("linkat", sys::link_fd(&fd, &root.join("named")));
        t.meta("named", &root.join("named"));
        t.r("read named", read_all(&root.join("named")));
        t.r("write after link", sys::pwrite(&fd, b"TMP", 0));
        t.r("read named again", read_all(&root.join("named")));
        let fd = sys::open(root, libc::O_TMPFILE | libc::O_RDWR | libc::O_EXCL, 0o600).unwrap();
        t.e(
            "linkat of O_EXCL tmpfile",
            sys::link_fd(&fd, &root.join("never")),
        );
        t.e(
            "O_TMPFILE on a file",
            sys::open(&root.join("named"), libc::O_TMPFILE | libc::O_RDWR, 0o600),
        );
        t.e(
            "O_TMPFILE read-only",
            sys::open(root, libc::O_TMPFILE | libc::O_RDONLY, 0o600),
        );
    }

    pub fn read_write_pread_pwrite(root: &Path, t: &mut T) {
        let f = root.join("f");
        let fd = create(&f, 0o644).unwrap();
        let data = pattern(3 * MIB + 123, 1);
        t.r("write 3 MiB", sys::write(&fd, &data));
        t.r(
            "pread 100 @ 1MiB+3",
            sys::pread(&fd, 100, (MIB + 3) as i64).map(|b| b == data[MIB + 3..MIB + 103]),
        );
        t.r(
            "pread past EOF",
            sys::pread(&fd, 100, 4 * MIB as i64).map(|b| b.len()),
        );
        t.r(
            "pread across EOF",
            sys::pread(&fd, 1000, (data.len() - 10) as i64).map(|b| b.len()),
        );
        t.r("pwrite Z at 5 MiB", sys::pwrite(&fd, b"Z", 5 * MIB as i64));
        t.r("size", sys::fstat(&fd).map(|s| s.st_size));
        t.r(
            "hole reads zeros",
            sys::pread(&fd, MIB, (4 * MIB) as i64)
                .map(|b| b.len() == MIB && b.iter().all(|&x| x == 0)),
        );
        t.r("lseek SET 10", sys::lseek(&fd, 10, libc::SEEK_SET));
        t.r("read 5", sys::read(&fd, 5).map(|b| b == data[10..15]));
        t.r("lseek CUR", sys::lseek(&fd, 0, libc::SEEK_CUR));
        t.r("lseek END", sys::lseek(&fd, 0, libc::SEEK_END));
        t.r("lseek -1", sys::lseek(&fd, -1, libc::SEEK_SET));
        t.r("write 0 bytes", sys::write(&fd, b""));
        // Whole content through std, byte-exact.
        let mut expected = data.clone();
        expected.resize(5 * MIB, 0);
        expected.push(b'Z');
        let got = std::fs::read(&f).unwrap();
        t.note(format!("whole file matches: {}", got == expected));
        // Small unaligned overwrites in the middle.
        for (i, off) in [1usize, 4095, 4096, 65537, MIB - 1].iter().enumerate() {
            sys::pwrite(&fd, &[b'a' + i as u8; 3], *off as i64).unwrap();
            expected[*off..*off + 3].copy_from_slice(&[b'a' + i as u8; 3]);
        }
        let got = std::fs::read(&f).unwrap();
        t.note(format!("after overwrites matches: {}", got == expected));
        // A second fd sees writes of the first at once.
        let fd2 = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        sys::pwrite(&fd, b"shared", 7).unwrap();
        t.r("other fd sees write", text(sys::pread(&fd2, 6, 7)));
        t.e(
            "pread on dir",
            sys::open(root, libc::O_RDONLY, 0).and_then(|d| sys::pread(&d, 10, 0)),
        );
    }

    pub fn mmap_shared_writes(root: &Path, t: &mut T) {
        let f = root.join("f");
        let fd = create(&f, 0o644).unwrap();
        sys::ftruncate(&fd, 64 * KIB as i64).unwrap();
        // SAFETY: mapping a 64 KiB file we just sized; unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                64 * KIB,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        t.note(format!("mmap ok: {}", ptr != libc::MAP_FAILED));
        if ptr == libc::MAP_FAILED {
            return;
        }
        // SAFETY: the mapping is 64 KiB long.
        let map = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), 64 * KIB) };
        map[..5].copy_from_slice(b"mmap!");
        map[40000..40004].copy_from_slice(b"tail");
        // SAFETY: msync/munmap of our mapping.
        let synced = unsafe { libc::msync(ptr, 64 * KIB, libc::MS_SYNC) };
        t.note(format!("msync: {synced}"));
        t.r("pread sees mmap write", text(sys::pread(&fd, 5, 0)));
        sys::pwrite(&fd, b"PWRITE", 100).unwrap();
        t.note(format!("map sees pwrite: {}", &map[100..106] == b"PWRITE"));
        unsafe { libc::munmap(ptr, 64 * KIB) };
        drop(fd);
        let got = std::fs::read(&f).unwrap();
        t.note(format!(
            "file: {:?} {:?} len {}",
            String::from_utf8_lossy(&got[..5]),
            String::from_utf8_lossy(&got[40000..40004]),
            got.len()
        ));
    }

    pub fn statfs(root: &Path, t: &mut T) {
        let s = sys::statfs(root).unwrap();
        t.note(format!(
            "bsize={} frsize={} blocks={} files={} namelen={}",
            s.f_bsize, s.f_frsize, s.f_blocks, s.f_files, s.f_namelen
        ));
        t.note(format!(
            "free <= total: {}",
            s.f_bfree <= s.f_blocks && s.f_bavail <= s.f_bfree
        ));
        put(&root.join("f"), b"x");
        t.e("statfs of a file", sys::statfs(&root.join("f")));
        t.e("statfs of missing", sys::statfs(&root.join("missing")));
    }

    pub fn fsync_fdatasync_files_and_dirs(root: &Path, t: &mut T) {
        let f = root.join("f");
        let fd = create(&f, 0o644).unwrap();
        sys::write(&fd, &pattern(100 * KIB, 3)).unwrap();
        t.e("fsync", sys::fsync(&fd));
        t.e("fdatasync", sys::fdatasync(&fd));
        let ro = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        t.e("fsync O_RDONLY fd", sys::fsync(&ro));
        let dir = sys::open(root, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        t.e("fsync dir", sys::fsync(&dir));
        t.e("fdatasync dir", sys::fdatasync(&dir));
        sys::mkdir(&root.join("sub"), 0o755).unwrap();
        let sub = sys::open(&root.join("sub"), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        t.e("fsync subdir", sys::fsync(&sub));
        // SAFETY: syncfs on an fd we hold.
        let r = unsafe { libc::syncfs(fd.as_raw_fd()) };
        t.note(format!("syncfs: {r}"));
    }

    /// POSIX ACLs as the kernel hands them to the file system (FUSE_POSIX_ACL): the mode an
    /// access ACL sets, a minimal one kept as the mode alone, the ACL a chmod rewrites,
    /// default ACLs handed down to new files, directories and nodes in place of the umask,
    /// and the checks they make for another user.
    pub fn posix_acls(root: &Path, t: &mut T) {
        const ACCESS: &str = "system.posix_acl_access";
        const DEFAULT: &str = "system.posix_acl_default";
        const NOBODY: u32 = 65534;
        let (user_obj, user, group_obj, mask, other) = (0x01, 0x02, 0x04, 0x10, 0x20);
        let acl = |entries: &[(u16, u16, u32)]| {
            let mut v = 2u32.to_le_bytes().to_vec();
            for &(tag, perm, id) in entries {
                v.extend_from_slice(&tag.to_le_bytes());
                v.extend_from_slice(&perm.to_le_bytes());
                v.extend_from_slice(&id.to_le_bytes());
            }
            v
        };
        let get = |p: &Path, name: &str| sys::getxattr(p, name, 256).map(|(_, v)| v);
        // Runs a shell command as nobody, or as root with a umask; "ok" or "refused".
        let sh = |nobody: bool, script: &str| {
            let mut cmd = if nobody {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh"]);
                c
            } else {
                Command::new("sh")
            };
            let status = cmd
                .args(["-c", script])
                .current_dir(root)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("running {script:?} (setpriv, sh): {e}"));
            if status.success() { "ok" } else { "refused" }
        };
        // setfacl is needed below: "refused" on both sides would prove nothing.
        assert!(
            Command::new("setfacl").arg("--version").output().is_ok(),
            "setfacl is required (apt-get install acl; scripts/setup.sh does)"
        );
        sys::chmod(root, 0o755).unwrap();
        let f = root.join("f");
        put(&f, b"secret\n");
        sys::chmod(&f, 0o600).unwrap();
        t.note(format!("nobody reads 0600 f: {}", sh(true, "cat f")));
        let granted = acl(&[
            (user_obj, 6, u32::MAX),
            (user, 4, NOBODY),
            (group_obj, 0, u32::MAX),
            (mask, 4, u32::MAX),
            (other, 0, u32::MAX),
        ]);
        t.e("set access acl", sys::setxattr(&f, ACCESS, &granted, 0));
        t.meta("f with acl", &f);
        t.r("get access acl", get(&f, ACCESS));
        t.note(format!("nobody reads f: {}", sh(true, "cat f")));
        t.note(format!("nobody writes f: {}", sh(true, "echo x >> f")));
        // chmod rewrites the owner, mask and other entries.
        sys::chmod(&f, 0o640).unwrap();
        t.r("acl after chmod 640", get(&f, ACCESS));
        sys::chmod(&f, 0o600).unwrap();
        t.r("acl after chmod 600", get(&f, ACCESS));
        t.note(format!(
            "nobody reads f after chmod 600: {}",
            sh(true, "cat f")
        ));
        t.r("list", sys::listxattr(&f, 4096));
        // A minimal ACL says no more than the mode: the mode takes it, no xattr stays.
        let minimal = acl(&[
            (user_obj, 7, u32::MAX),
            (group_obj, 5, u32::MAX),
            (other, 1, u32::MAX),
        ]);
        t.e("set minimal acl", sys::setxattr(&f, ACCESS, &minimal, 0));
        t.meta("f with minimal acl", &f);
        t.e("get after minimal acl", get(&f, ACCESS));
        t.e(
            "malformed acl",
            sys::setxattr(&f, ACCESS, b"\x02\0\0\0\x01", 0),
        );
        t.e(
            "default acl on a file",
            sys::setxattr(&f, DEFAULT, &minimal, 0),
        );
        // An ACL that denies a user the others' rights.
        let g = root.join("g");
        put(&g, b"open to all but one\n");
        sys::chmod(&g, 0o644).unwrap();
        let denied = acl(&[
            (user_obj, 6, u32::MAX),
            (user, 0, NOBODY),
            (group_obj, 4, u32::MAX),
            (mask, 4, u32::MAX),
            (other, 4, u32::MAX),
        ]);
        t.e("set denying acl", sys::setxattr(&g, ACCESS, &denied, 0));
        t.note(format!("nobody reads g: {}", sh(true, "cat g")));
        t.e("remove access acl", sys::removexattr(&g, ACCESS));
        t.meta("g without acl", &g);
        t.note(format!("nobody reads g again: {}", sh(true, "cat g")));
        // Setting an ACL drops set-group-ID for an owner outside the file's group.
        let sgid = root.join("sgid");
        put(&sgid, b"x");
        sys::chown(&sgid, NOBODY, 0).unwrap();
        sys::chmod(&sgid, 0o2775).unwrap();
        t.note(format!(
            "nobody sets an acl on its set-group-ID file: {}",
            sh(true, "setfacl -m u:0:r sgid")
        ));
        t.meta("sgid after", &sgid);
        // Default ACLs: what new inodes get instead of the umask.
        let d = root.join("d");
        sys::mkdir(&d, 0o755).unwrap();
        let default = acl(&[
            (user_obj, 7, u32::MAX),
            (user, 6, NOBODY),
            (group_obj, 5, u32::MAX),
            (mask, 7, u32::MAX),
            (other, 0, u32::MAX),
        ]);
        t.e("set default acl", sys::setxattr(&d, DEFAULT, &default, 0));
        t.r("get default acl", get(&d, DEFAULT));
        t.e("no access acl on d", get(&d, ACCESS));
        t.note(format!(
            "creates under umask 077: {}",
            sh(
                false,
                "umask 077 && echo x > d/file && mkdir d/sub && mkfifo d/fifo && \
                 ln -s file d/link && echo y > d/sub/deep && mkdir -m 0700 d/private"
            )
        ));
        for name in ["file", "sub", "fifo", "sub/deep", "private"] {
            let p = d.join(name);
            t.meta(&format!("d/{name}"), &p);
            t.r(&format!("d/{name} access acl"), get(&p, ACCESS));
            t.r(&format!("d/{name} default acl"), get(&p, DEFAULT));
        }
        t.meta("d/link", &d.join("link"));
        t.note(format!(
            "nobody writes d/file: {}",
            sh(true, "echo z >> d/file")
        ));
        t.note(format!(
            "nobody creates in d: {}",
            sh(true, "echo z > d/new")
        ));
        t.e("remove default acl", sys::removexattr(&d, DEFAULT));
        t.note(format!(
            "creates under umask 027 without it: {}",
            sh(false, "umask 027 && echo x > d/plain && mkdir d/plaindir")
        ));
        t.meta("d/plain", &d.join("plain"));
        t.meta("d/plaindir", &d.join("plaindir"));
        t.e("d/plain access acl", get(&d.join("plain"), ACCESS));
    }

    pub fn xattrs(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"x");
        t.r("listxattr none", sys::listxattr(&f, 4096));
        t.e("set user.a", sys::setxattr(&f, "user.a", b"hello", 0));
        t.r("size probe", sys::getxattr(&f, "user.a", 0).map(|(n, _)| n));
        t.e("get into 2 bytes", sys::getxattr(&f, "user.a", 2));
        t.r(
            "get",
            sys::getxattr(&f, "user.a", 64).map(|(n, v)| (n, String::from_utf8(v).unwrap())),
        );
        t.e("get missing", sys::getxattr(&f, "user.missing", 64));
        t.e(
            "XATTR_CREATE existing",
            sys::setxattr(&f, "user.a", b"x", libc::XATTR_CREATE),
        );
        t.e(
            "XATTR_REPLACE missing",
            sys::setxattr(&f, "user.b", b"x", libc::XATTR_REPLACE),
        );
        t.e(
            "XATTR_REPLACE existing",
            sys::setxattr(&f, "user.a", b"replaced", libc::XATTR_REPLACE),
        );
        t.r(
            "get replaced",
            sys::getxattr(&f, "user.a", 64).map(|(_, v)| String::from_utf8(v).unwrap()),
        );
        t.e("set empty user.b", sys::setxattr(&f, "user.b", b"", 0));
        t.r("get empty", sys::getxattr(&f, "user.b", 64));
        t.r("list probe", sys::listxattr(&f, 0).map(|(n, _)| n));
        t.e("list into 3 bytes", sys::listxattr(&f, 3));
        t.r("list", sys::listxattr(&f, 4096));
        let big = pattern(4000, 9);
        t.e(
            "set 4000-byte value",
            sys::setxattr(&f, "user.big", &big, 0),
        );
        t.r(
            "get big",
            sys::getxattr(&f, "user.big", 65536).map(|(n, v)| (n, v == big)),
        );
        t.e("remove user.a", sys::removexattr(&f, "user.a"));
        t.e("remove user.a again", sys::removexattr(&f, "user.a"));
        t.r("list after remove", sys::listxattr(&f, 4096));
        t.e(
            "set trusted.t",
            sys::setxattr(&f, "trusted.t", b"root only", 0),
        );
        t.r(
            "get trusted.t",
            sys::getxattr(&f, "trusted.t", 64).map(|(n, _)| n),
        );
        t.e(
            "set unknown namespace",
            sys::setxattr(&f, "foo.bar", b"x", 0),
        );
        t.e(
            "name of 256 bytes",
            sys::setxattr(&f, &format!("user.{}", "n".repeat(251)), b"x", 0),
        );
        t.e(
            "get on missing file",
            sys::getxattr(&root.join("missing"), "user.a", 64),
        );
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        t.e(
            "set on dir",
            sys::setxattr(&root.join("d"), "user.d", b"dir", 0),
        );
        t.r(
            "get on dir",
            sys::getxattr(&root.join("d"), "user.d", 64).map(|(n, _)| n),
        );
        sys::symlink("f", &root.join("s")).unwrap();
        t.e(
            "lsetxattr user.* on symlink",
            sys::lsetxattr(&root.join("s"), "user.s", b"x", 0),
        );
        t.e(
            "lsetxattr trusted.* on symlink",
            sys::lsetxattr(&root.join("s"), "trusted.s", b"x", 0),
        );
        t.r(
            "lgetxattr trusted.s",
            sys::lgetxattr(&root.join("s"), "trusted.s", 64).map(|(n, _)| n),
        );
        t.e(
            "setxattr through symlink",
            sys::setxattr(&root.join("s"), "user.via", b"link", 0),
        );
        t.r(
            "lands on target",
            sys::getxattr(&f, "user.via", 64).map(|(n, _)| n),
        );
        // Many names: the list is longer than one small buffer.
        t.e("remove user.big", sys::removexattr(&f, "user.big"));
        for i in 0..60 {
            sys::setxattr(&f, &format!("user.many{i:03}"), b"v", 0).unwrap();
        }
        t.r(
            "list of 100+",
            sys::listxattr(&f, 65536).map(|(n, v)| (n, v.len())),
        );
        let fd = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        // SAFETY: fgetxattr into a 64-byte buffer.
        let mut buf = [0u8; 64];
        let n = unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                c"user.via".as_ptr(),
                buf.as_mut_ptr().cast(),
                64,
            )
        };
        t.note(format!("fgetxattr: {n}"));
    }

    pub fn readdir_names_and_types(root: &Path, t: &mut T) {
        put(&root.join("file"), b"");
        sys::mkdir(&root.join("dir"), 0o755).unwrap();
        sys::symlink("file", &root.join("link")).unwrap();
        sys::mknod(&root.join("fifo"), libc::S_IFIFO | 0o644, 0).unwrap();
        sys::mknod(&root.join("sock"), libc::S_IFSOCK | 0o644, 0).unwrap();
        sys::mknod(
            &root.join("chr"),
            libc::S_IFCHR | 0o644,
            libc::makedev(1, 3),
        )
        .unwrap();
        let mut d = sys::Dir::open(root).unwrap();
        let mut all = Vec::new();
        while let Some(e) = d.next_entry().unwrap() {
            all.push(e);
        }
        let dots: Vec<_> = all
            .iter()
            .filter(|e| e.0 == "." || e.0 == "..")
            .map(|e| (e.0.clone(), sys::dtype_name(e.1)))
            .collect();
        let mut entries: Vec<_> = all
            .iter()
            .filter(|e| e.0 != "." && e.0 != "..")
            .map(|(n, ty)| format!("{n}:{}", sys::dtype_name(*ty)))
            .collect();
        entries.sort();
        t.note(format!("entries: {entries:?}"));
        let mut dots_sorted = dots.clone();
        dots_sorted.sort();
        t.note(format!("dots: {dots_sorted:?}"));
        d.rewind();
        t.note(format!("after rewind: {}", d.rest().unwrap().len()));
        let empty = root.join("dir");
        t.r(
            "empty dir",
            sys::Dir::open(&empty).and_then(|mut d| d.rest()),
        );
        t.e(
            "opendir on a file",
            sys::Dir::open(&root.join("file")).map(|_| ()),
        );
        t.e(
            "opendir missing",
            sys::Dir::open(&root.join("missing")).map(|_| ()),
        );
        // std's read_dir agrees, and the types it reads match lstat.
        let mut agree = true;
        for e in std::fs::read_dir(root).unwrap() {
            let e = e.unwrap();
            let st = sys::lstat(&e.path()).unwrap();
            let ft = e.file_type().unwrap();
            agree &= ft.is_dir() == (st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                && ft.is_symlink() == (st.st_mode & libc::S_IFMT == libc::S_IFLNK);
        }
        t.note(format!("d_type agrees with lstat: {agree}"));
    }

    pub fn readdir_large_and_seekdir(root: &Path, t: &mut T) {
        let big = root.join("big");
        sys::mkdir(&big, 0o755).unwrap();
        // 3000 entries of ~48-byte names: ~100 pages of dirents.
        let mut expected = Vec::new();
        for i in 0..3000 {
            let name = format!("entry-{i:05}-{}", "x".repeat(36));
            if i % 3 == 0 {
                sys::mkdir(&big.join(&name), 0o755).unwrap();
            } else {
                put(&big.join(&name), b"");
            }
            expected.push(name);
        }
        expected.sort();
        let mut d = sys::Dir::open(&big).unwrap();
        let all = d.rest().unwrap();
        let mut names: Vec<_> = all.iter().map(|e| e.0.clone()).collect();
        names.sort();
        t.note(format!(
            "count {} all present once: {}",
            all.len(),
            names == expected
        ));
        let dirs = all.iter().filter(|e| e.1 == libc::DT_DIR).count();
        t.note(format!("dirs by d_type: {dirs}"));

        // telldir/seekdir: reading from a saved position gives the same run again.
        let mut d = sys::Dir::open(&big).unwrap();
        let mut first = Vec::new();
        for _ in 0..1000 {
            first.push(d.next_entry().unwrap().unwrap().0);
        }
        let pos = d.tell();
        let mut a = Vec::new();
        for _ in 0..700 {
            a.push(d.next_entry().unwrap().unwrap().0);
        }
        let rest_a = d.rest().unwrap().len();
        d.seek(pos);
        let mut b = Vec::new();
        for _ in 0..700 {
            b.push(d.next_entry().unwrap().unwrap().0);
        }
        t.note(format!("seekdir repeats: {}", a == b));
        t.note(format!(
            "rest after seek {}: {}",
            rest_a,
            d.rest().unwrap().len() == rest_a
        ));
        // Positions saved at several points all return to the same entry.
        let mut d = sys::Dir::open(&big).unwrap();
        let mut marks = Vec::new();
        for i in 0..3002 {
            let p = d.tell();
            let Some(e) = d.next_entry().unwrap() else {
                break;
            };
            if i % 250 == 0 {
                marks.push((p, e.0));
            }
        }
        let mut ok = true;
        for (p, name) in marks.iter().rev() {
            d.seek(*p);
            ok &= d.next_entry().unwrap().map(|e| e.0) == Some(name.clone());
        }
        t.note(format!(
            "{} saved positions return to their entry: {ok}",
            marks.len()
        ));
    }

    pub fn readdir_while_changing(root: &Path, t: &mut T) {
        let d = root.join("d");
        sys::mkdir(&d, 0o755).unwrap();
        let originals: Vec<String> = (0..1000).map(|i| format!("orig-{i:04}")).collect();
        for n in &originals {
            put(&d.join(n), b"");
        }
        // Add entries during the iteration: every original entry is returned exactly once,
        // and nothing twice (new entries may or may not show up).
        let mut dir = sys::Dir::open(&d).unwrap();
        let mut seen = Vec::new();
        for _ in 0..100 {
            seen.push(dir.next_entry().unwrap().unwrap().0);
        }
        for i in 0..500 {
            put(&d.join(format!("new-{i:04}")), b"");
        }
        seen.extend(dir.rest().unwrap().into_iter().map(|e| e.0));
        seen.retain(|n| n != "." && n != "..");
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        t.note(format!(
            "no duplicates while adding: {}",
            sorted.len() == seen.len()
        ));
        let origs_seen = seen.iter().filter(|n| n.starts_with("orig-")).count();
        t.note(format!(
            "originals seen once each: {}",
            origs_seen == originals.len()
        ));
        // Remove entries during iteration: survivors are each seen once.
        let mut dir = sys::Dir::open(&d).unwrap();
        let mut seen = Vec::new();
        for _ in 0..100 {
            seen.push(dir.next_entry().unwrap().unwrap().0);
        }
        let mut removed = Vec::new();
        for n in originals.iter().step_by(3) {
            if !seen.contains(n) {
                std::fs::remove_file(d.join(n)).unwrap();
                removed.push(n.clone());
            }
        }
        seen.extend(dir.rest().unwrap().into_iter().map(|e| e.0));
        seen.retain(|n| n != "." && n != "..");
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        t.note(format!(
            "no duplicates while removing: {}",
            sorted.len() == seen.len()
        ));
        let survivors_ok = originals
            .iter()
            .filter(|n| !removed.contains(n))
            .all(|n| seen.iter().filter(|s| *s == n).count() == 1);
        t.note(format!("survivors seen once each: {survivors_ok}"));
        t.note(format!("final count: {}", names(&d).len()));
    }

    pub fn access_as_root(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"x");
        for mode in [0o000, 0o100, 0o644, 0o010, 0o001] {
            sys::chmod(&f, mode).unwrap();
            for (how, name) in [
                (libc::F_OK, "F_OK"),
                (libc::R_OK, "R_OK"),
                (libc::W_OK, "W_OK"),
                (libc::X_OK, "X_OK"),
                (libc::R_OK | libc::W_OK | libc::X_OK, "RWX"),
            ] {
                t.e(&format!("access {mode:04o} {name}"), sys::access(&f, how));
            }
        }
        sys::mkdir(&root.join("d"), 0o000).unwrap();
        t.e(
            "access dir 0000 X_OK",
            sys::access(&root.join("d"), libc::X_OK),
        );
        t.e(
            "access missing",
            sys::access(&root.join("missing"), libc::F_OK),
        );
        sys::symlink("f", &root.join("s")).unwrap();
        t.e(
            "access via symlink X_OK",
            sys::access(&root.join("s"), libc::X_OK),
        );
    }

    pub fn fallocate_modes(root: &Path, t: &mut T) {
        let f = root.join("f");
        let fd = create(&f, 0o644).unwrap();
        let blocks = |fd: &OwnedFd| sys::fstat(fd).unwrap().st_blocks;
        t.e("fallocate 0..1MiB", sys::fallocate(&fd, 0, 0, MIB as i64));
        let st = sys::fstat(&fd).unwrap();
        t.note(format!(
            "size {} blocks>=2048: {}",
            st.st_size,
            st.st_blocks >= 2048
        ));
        t.e(
            "KEEP_SIZE 1..2MiB",
            sys::fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, MIB as i64, MIB as i64),
        );
        let st = sys::fstat(&fd).unwrap();
        t.note(format!(
            "size {} blocks>=4096: {}",
            st.st_size,
            st.st_blocks >= 4096
        ));
        sys::pwrite(&fd, &vec![0xab; MIB], 0).unwrap();
        let b0 = blocks(&fd);
        t.e(
            "PUNCH_HOLE|KEEP_SIZE 4K+8K",
            sys::fallocate(
                &fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                4096,
                8192,
            ),
        );
        t.r(
            "punched range reads zeros",
            sys::pread(&fd, 8192, 4096).map(|b| b.iter().all(|&x| x == 0)),
        );
        t.r(
            "around it intact",
            sys::pread(&fd, 1, 4095).map(|b| b == [0xab]),
        );
        t.r(
            "after it intact",
            sys::pread(&fd, 1, 12288).map(|b| b == [0xab]),
        );
        t.note(format!("blocks fell: {}", blocks(&fd) < b0));
        t.r("size kept", sys::fstat(&fd).map(|s| s.st_size));
        t.e(
            "PUNCH_HOLE without KEEP_SIZE",
            sys::fallocate(&fd, libc::FALLOC_FL_PUNCH_HOLE, 0, 4096),
        );
        t.e(
            "ZERO_RANGE 16K+8K",
            sys::fallocate(&fd, libc::FALLOC_FL_ZERO_RANGE, 16384, 8192),
        );
        t.r(
            "zeroed range reads zeros",
            sys::pread(&fd, 8192, 16384).map(|b| b.iter().all(|&x| x == 0)),
        );
        t.r(
            "after zero range intact",
            sys::pread(&fd, 1, 24576).map(|b| b == [0xab]),
        );
        t.e(
            "ZERO_RANGE past EOF",
            sys::fallocate(&fd, libc::FALLOC_FL_ZERO_RANGE, MIB as i64, 100_000),
        );
        t.r("size grew", sys::fstat(&fd).map(|s| s.st_size));
        t.e(
            "ZERO_RANGE|KEEP_SIZE past EOF",
            sys::fallocate(
                &fd,
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                2 * MIB as i64,
                4096,
            ),
        );
        t.r("size kept", sys::fstat(&fd).map(|s| s.st_size));
        t.e("len 0", sys::fallocate(&fd, 0, 0, 0));
        t.e("negative offset", sys::fallocate(&fd, 0, -1, 10));
        let ro = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        t.e("on O_RDONLY fd", sys::fallocate(&ro, 0, 0, 4096));
        t.e("posix_fallocate grows", {
            // SAFETY: posix_fallocate on an fd we hold.
            let r = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, 3 * MIB as i64) };
            if r == 0 { Ok(()) } else { Err(Errno(r)) }
        });
        t.r("size", sys::fstat(&fd).map(|s| s.st_size));
    }

    pub fn lseek_data_and_hole(root: &Path, t: &mut T) {
        let f = root.join("sparse");
        let fd = create(&f, 0o644).unwrap();
        sys::pwrite(&fd, &[1u8; 4096], 0).unwrap();
        sys::pwrite(&fd, &[2u8; 4096], MIB as i64).unwrap();
        sys::ftruncate(&fd, 2 * MIB as i64).unwrap();
        sys::fsync(&fd).unwrap();
        let m = MIB as i64;
        for (what, off, whence) in [
            ("DATA 0", 0, libc::SEEK_DATA),
            ("HOLE 0", 0, libc::SEEK_HOLE),
            ("DATA 100", 100, libc::SEEK_DATA),
            ("DATA 4096", 4096, libc::SEEK_DATA),
            ("HOLE 4096", 4096, libc::SEEK_HOLE),
            ("HOLE 1MiB", m, libc::SEEK_HOLE),
            ("DATA 1MiB+4096", m + 4096, libc::SEEK_DATA),
            ("HOLE 1MiB+8192", m + 8192, libc::SEEK_HOLE),
            ("DATA EOF", 2 * m, libc::SEEK_DATA),
            ("HOLE EOF", 2 * m, libc::SEEK_HOLE),
            ("DATA past EOF", 3 * m, libc::SEEK_DATA),
            ("HOLE past EOF", 3 * m, libc::SEEK_HOLE),
            ("DATA -1", -1, libc::SEEK_DATA),
            ("END", 0, libc::SEEK_END),
            ("END -10", -10, libc::SEEK_END),
        ] {
            t.r(&format!("lseek {what}"), sys::lseek(&fd, off, whence));
        }
        // The file position moves to what SEEK_DATA found.
        sys::lseek(&fd, 4096, libc::SEEK_DATA).unwrap();
        t.r(
            "position after SEEK_DATA",
            sys::lseek(&fd, 0, libc::SEEK_CUR),
        );
        let empty = create(&root.join("empty"), 0o644).unwrap();
        t.r("empty DATA 0", sys::lseek(&empty, 0, libc::SEEK_DATA));
        t.r("empty HOLE 0", sys::lseek(&empty, 0, libc::SEEK_HOLE));
        let dense = create(&root.join("dense"), 0o644).unwrap();
        sys::write(&dense, &[3u8; 10000]).unwrap();
        t.r("dense HOLE 0", sys::lseek(&dense, 0, libc::SEEK_HOLE));
        t.r("dense DATA 9999", sys::lseek(&dense, 9999, libc::SEEK_DATA));
        // A hole punched into a written file shows up.
        sys::fallocate(
            &dense,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            4096,
        )
        .unwrap();
        t.r("punched HOLE 0", sys::lseek(&dense, 0, libc::SEEK_HOLE));
        t.r(
            "punched DATA 4096",
            sys::lseek(&dense, 4096, libc::SEEK_DATA),
        );
        let dir = sys::open(root, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        t.e("SEEK_DATA on a dir", sys::lseek(&dir, 0, libc::SEEK_DATA));
    }

    pub fn copy_file_range(root: &Path, t: &mut T) {
        let a = create(&root.join("a"), 0o644).unwrap();
        let data = pattern(MIB + 777, 5);
        sys::write(&a, &data).unwrap();
        let b = create(&root.join("b"), 0o644).unwrap();
        t.r("copy 1 MiB", sys::copy_file_range(&a, 0, &b, 0, MIB));
        t.r(
            "copied bytes",
            sys::pread(&b, MIB, 0).map(|v| v == data[..MIB]),
        );
        t.r(
            "copy 100 to 2 MiB",
            sys::copy_file_range(&a, 4096, &b, 2 * MIB as i64, 100),
        );
        t.r("size", sys::fstat(&b).map(|s| s.st_size));
        t.r(
            "hole zeros",
            sys::pread(&b, 4096, MIB as i64).map(|v| v.iter().all(|&x| x == 0)),
        );
        t.r(
            "tail",
            sys::pread(&b, 100, 2 * MIB as i64).map(|v| v == data[4096..4196]),
        );
        t.r(
            "copy from EOF",
            sys::copy_file_range(&a, data.len() as i64, &b, 0, 100),
        );
        t.r(
            "copy across EOF",
            sys::copy_file_range(&a, (data.len() - 10) as i64, &b, 0, 100),
        );
        t.e(
            "overlapping in one file",
            sys::copy_file_range(&a, 0, &a, 100, 1000),
        );
        t.r(
            "same file, disjoint",
            sys::copy_file_range(&a, 0, &a, 2 * MIB as i64, 1000),
        );
        let wo = sys::open(&root.join("a"), libc::O_WRONLY, 0).unwrap();
        t.e("from O_WRONLY fd", sys::copy_file_range(&wo, 0, &b, 0, 10));
        let ro = sys::open(&root.join("b"), libc::O_RDONLY, 0).unwrap();
        t.e("to O_RDONLY fd", sys::copy_file_range(&a, 0, &ro, 0, 10));
        let ap = sys::open(&root.join("b"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        t.e("to O_APPEND fd", sys::copy_file_range(&a, 0, &ap, 0, 10));
    }

    pub fn flock_across_fds_and_processes(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"lock me");
        let other = |args: &[&str]| {
            Command::new("flock")
                .args(args)
                .arg(&f)
                .arg("true")
                .status()
                .expect("flock(1) from util-linux")
                .code()
        };
        let fd1 = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        let fd2 = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        t.e("fd1 LOCK_EX", sys::flock(&fd1, libc::LOCK_EX));
        t.e(
            "fd2 LOCK_EX|NB",
            sys::flock(&fd2, libc::LOCK_EX | libc::LOCK_NB),
        );
        t.e(
            "fd2 LOCK_SH|NB",
            sys::flock(&fd2, libc::LOCK_SH | libc::LOCK_NB),
        );
        t.note(format!("other process -x -n: {:?}", other(&["-x", "-n"])));
        t.note(format!("other process -s -n: {:?}", other(&["-s", "-n"])));
        t.e("fd1 LOCK_UN", sys::flock(&fd1, libc::LOCK_UN));
        t.e(
            "fd2 LOCK_SH|NB",
            sys::flock(&fd2, libc::LOCK_SH | libc::LOCK_NB),
        );
        t.e(
            "fd1 LOCK_SH|NB",
            sys::flock(&fd1, libc::LOCK_SH | libc::LOCK_NB),
        );
        t.note(format!("other process -s -n: {:?}", other(&["-s", "-n"])));
        t.note(format!("other process -x -n: {:?}", other(&["-x", "-n"])));
        t.e(
            "fd1 upgrade LOCK_EX|NB",
            sys::flock(&fd1, libc::LOCK_EX | libc::LOCK_NB),
        );
        drop(fd2);
        // Another test of this process that forks at this moment holds a copy of fd2 (and
        // so its lock) until its child execs: retry briefly instead of failing on that.
        let deadline = Instant::now() + Duration::from_secs(2);
        let upgraded = loop {
            let r = sys::flock(&fd1, libc::LOCK_EX | libc::LOCK_NB);
            if r.is_ok() || Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        t.e("fd1 upgrade after fd2 closed", upgraded);
        drop(fd1);
        t.note(format!(
            "other process -x -n after close: {:?}",
            other(&["-x", "-n"])
        ));
        // A waiter gets the lock when the holder lets go.
        let fd1 = sys::open(&f, libc::O_RDONLY, 0).unwrap();
        sys::flock(&fd1, libc::LOCK_EX).unwrap();
        let mut waiter = Command::new("flock")
            .args(["-x", "-w", "10"])
            .arg(&f)
            .arg("true")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        t.note(format!(
            "waiter still waiting: {}",
            waiter.try_wait().unwrap().is_none()
        ));
        drop(fd1);
        t.note(format!(
            "waiter got it: {:?}",
            waiter.wait().unwrap().code()
        ));
    }

    pub fn posix_record_locks(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, &[0u8; 100]);
        let fd = rw(&f).unwrap();
        let me = std::process::id() as i32;
        t.e(
            "parent WRLCK 0+50",
            sys::setlk(fd.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 50),
        );
        let r = child_probe(
            &f,
            &[
                Probe::Set(libc::F_WRLCK, 0, 10),
                Probe::Set(libc::F_RDLCK, 40, 20),
                Probe::Set(libc::F_WRLCK, 50, 10),
                Probe::Get(libc::F_WRLCK, 0, 100),
                Probe::Get(libc::F_RDLCK, 50, 50),
            ],
        );
        t.note(format!("child sees: {}", describe(&r, me)));
        t.e(
            "parent downgrades to RDLCK",
            sys::setlk(fd.as_raw_fd(), libc::F_SETLK, libc::F_RDLCK, 0, 50),
        );
        let r = child_probe(
            &f,
            &[
                Probe::Set(libc::F_RDLCK, 0, 50),
                Probe::Set(libc::F_WRLCK, 0, 50),
                Probe::Get(libc::F_WRLCK, 10, 1),
            ],
        );
        t.note(format!("child after downgrade: {}", describe(&r, me)));
        t.e(
            "parent unlocks",
            sys::setlk(fd.as_raw_fd(), libc::F_SETLK, libc::F_UNLCK, 0, 0),
        );
        let r = child_probe(
            &f,
            &[
                Probe::Set(libc::F_WRLCK, 0, 0),
                Probe::Get(libc::F_WRLCK, 0, 0),
            ],
        );
        t.note(format!("child after unlock: {}", describe(&r, me)));
        t.r(
            "parent GETLK free",
            sys::getlk(fd.as_raw_fd(), libc::F_WRLCK, 0, 0),
        );
        // A lock of the whole file to EOF and beyond.
        t.e(
            "parent WRLCK 0..EOF+",
            sys::setlk(fd.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 0),
        );
        let r = child_probe(
            &f,
            &[
                Probe::Set(libc::F_WRLCK, 1_000_000, 1),
                Probe::Get(libc::F_RDLCK, 1_000_000, 1),
            ],
        );
        t.note(format!("child past EOF: {}", describe(&r, me)));
        drop(fd);
        let r = child_probe(&f, &[Probe::Set(libc::F_WRLCK, 0, 0)]);
        t.note(format!("child after close: {}", describe(&r, me)));
        // OFD locks conflict between two fds of one process.
        let a = rw(&f).unwrap();
        let b = rw(&f).unwrap();
        t.e(
            "OFD WRLCK via a",
            sys::setlk(a.as_raw_fd(), libc::F_OFD_SETLK, libc::F_WRLCK, 0, 10),
        );
        t.e(
            "OFD WRLCK via b",
            sys::setlk(b.as_raw_fd(), libc::F_OFD_SETLK, libc::F_WRLCK, 5, 10),
        );
        t.e(
            "OFD RDLCK via b elsewhere",
            sys::setlk(b.as_raw_fd(), libc::F_OFD_SETLK, libc::F_RDLCK, 20, 10),
        );
        // An OFD lock goes with its open, while another open of the file stays (the kernel
        // sends no unlock for it: its owner is the open, not the closing process). FUSE's
        // RELEASE is asynchronous: close(2) returns before the daemon lets go, so a lock
        // that the close frees is tried again for a moment (natively it is free at once).
        let once_freed = |fd: i32, start: i64, len: i64| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                match sys::setlk(fd, libc::F_OFD_SETLK, libc::F_WRLCK, start, len) {
                    Err(e) if e.0 == libc::EAGAIN && std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    done => return done,
                }
            }
        };
        drop(a);
        t.e(
            "OFD WRLCK via b after a's close",
            once_freed(b.as_raw_fd(), 0, 10),
        );
        let c = rw(&f).unwrap();
        t.e(
            "OFD WRLCK via c over b's",
            sys::setlk(c.as_raw_fd(), libc::F_OFD_SETLK, libc::F_WRLCK, 5, 1),
        );
        drop(b);
        t.e(
            "OFD WRLCK via c after b's close",
            once_freed(c.as_raw_fd(), 0, 30),
        );
        let r = child_probe(&f, &[Probe::Set(libc::F_WRLCK, 40, 1)]);
        t.note(format!("child beside c's OFD lock: {}", describe(&r, me)));
        let r = child_probe(&f, &[Probe::Set(libc::F_WRLCK, 0, 1)]);
        t.note(format!("child over c's OFD lock: {}", describe(&r, me)));
        drop(c);
    }

    pub fn unlinked_while_open(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, b"hello");
        let fd = rw(&f).unwrap();
        t.e("unlink", sys::unlink(&f));
        t.e("stat name", sys::stat(&f));
        t.r("fstat nlink", sys::fstat(&fd).map(|s| s.st_nlink));
        t.r("pread", text(sys::pread(&fd, 64, 0)));
        t.r("pwrite", sys::pwrite(&fd, b"J", 0));
        t.r("pread again", text(sys::pread(&fd, 64, 0)));
        t.e("ftruncate 3", sys::ftruncate(&fd, 3));
        t.r("fstat size", sys::fstat(&fd).map(|s| s.st_size));
        t.e("fchmod", sys::fchmod(&fd, 0o600));
        t.r("fstat", sys::fstat(&fd).map(|s| meta(&s)));
        t.r("listing has no trace", Ok::<_, Errno>(names(root)));
        put(&f, b"new file");
        t.r("old fd still reads old data", text(sys::pread(&fd, 64, 0)));
        t.r("name reads new file", read_all(&f));
        // Big writes to the orphan, then read back.
        let big = pattern(2 * MIB, 7);
        t.r("write 2 MiB to orphan", sys::pwrite(&fd, &big, 0));
        t.r("read back", sys::pread(&fd, 2 * MIB, 0).map(|v| v == big));
        drop(fd);
        t.r("listing after close", Ok::<_, Errno>(names(root)));
        // An unlinked directory that is still open reads as empty.
        sys::mkdir(&root.join("d"), 0o755).unwrap();
        let mut dir = sys::Dir::open(&root.join("d")).unwrap();
        sys::rmdir(&root.join("d")).unwrap();
        t.r("readdir of removed dir", dir.rest());
    }

    pub fn name_lengths_and_odd_names(root: &Path, t: &mut T) {
        let n255 = "a".repeat(255);
        let n256 = "b".repeat(256);
        t.e("create 255", create(&root.join(&n255), 0o644));
        t.meta("stat 255", &root.join(&n255));
        t.e("create 256", create(&root.join(&n256), 0o644));
        t.e("stat 256", sys::stat(&root.join(&n256)));
        t.e("mkdir 256", sys::mkdir(&root.join(&n256), 0o755));
        t.e("symlink 256", sys::symlink("x", &root.join(&n256)));
        t.e(
            "rename to 256",
            sys::rename(&root.join(&n255), &root.join(&n256)),
        );
        t.e(
            "link to 256",
            sys::link(&root.join(&n255), &root.join(&n256)),
        );
        t.e(
            "mknod 256",
            sys::mknod(&root.join(&n256), libc::S_IFIFO | 0o644, 0),
        );
        for name in [
            "with space",
            "new\nline",
            "ünïcødé-日本",
            "back\\slash",
            "-leading-dash",
            ".hidden",
            "...",
            "tab\there",
            "colon:semi;",
            "\u{1}ctrl",
        ] {
            t.e(&format!("create {name:?}"), create(&root.join(name), 0o644));
        }
        t.r("listing", Ok::<_, Errno>(names(root)));
    }

    /// A 4 KiB-aligned buffer for O_DIRECT.
    struct Aligned(*mut u8, usize);

    impl Aligned {
        fn new(len: usize, fill: u8) -> Aligned {
            let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
            // SAFETY: a non-zero size layout; freed in Drop with the same layout.
            let p = unsafe { std::alloc::alloc(layout) };
            assert!(!p.is_null());
            // SAFETY: p points to len bytes.
            unsafe { std::ptr::write_bytes(p, fill, len) };
            Aligned(p, len)
        }

        fn bytes(&self) -> &[u8] {
            // SAFETY: self.0 points to self.1 initialised bytes.
            unsafe { std::slice::from_raw_parts(self.0, self.1) }
        }

        fn bytes_mut(&mut self) -> &mut [u8] {
            // SAFETY: as above, uniquely borrowed.
            unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
        }
    }

    impl Drop for Aligned {
        fn drop(&mut self) {
            let layout = std::alloc::Layout::from_size_align(self.1, 4096).unwrap();
            // SAFETY: allocated in new with this layout.
            unsafe { std::alloc::dealloc(self.0, layout) };
        }
    }

    /// One file open at once read-only, write-only, read-write, with O_DIRECT and with
    /// O_APPEND (a mix of passed-through, cached and direct opens on the mount): each sees
    /// the others' writes. Then the file turns set-user-ID while open, and new opens of
    /// every kind still work.
    pub fn mixed_open_modes_of_one_file(root: &Path, t: &mut T) {
        let f = root.join("f");
        put(&f, &vec![b'.'; 16384]);
        let r = t.ev("open O_RDONLY", sys::open(&f, libc::O_RDONLY, 0));
        let w = t.ev("open O_WRONLY", sys::open(&f, libc::O_WRONLY, 0));
        let rw = t.ev("open O_RDWR", sys::open(&f, libc::O_RDWR, 0));
        let d = t.ev(
            "open O_RDWR|O_DIRECT",
            sys::open(&f, libc::O_RDWR | libc::O_DIRECT, 0),
        );
        let a = t.ev(
            "open O_WRONLY|O_APPEND",
            sys::open(&f, libc::O_WRONLY | libc::O_APPEND, 0),
        );
        let (Ok(r), Ok(w), Ok(rw), Ok(a)) = (r, w, rw, a) else {
            return;
        };
        // (An O_DIRECT open that failed is recorded above; the rest goes on without it.)
        let d = d.ok();
        t.r("write via w", sys::pwrite(&w, b"WWWW", 0));
        t.r("read via r", text(sys::pread(&r, 4, 0)));
        t.r("read via rw", text(sys::pread(&rw, 4, 0)));
        let mut buf = Aligned::new(4096, 0);
        if let Some(d) = &d {
            // SAFETY: reading into our aligned 4 KiB buffer.
            let n =
                unsafe { libc::pread(d.as_raw_fd(), buf.bytes_mut().as_mut_ptr().cast(), 4096, 0) };
            t.note(format!(
                "O_DIRECT read {n}: {:?}",
                String::from_utf8_lossy(&buf.bytes()[..6])
            ));
            let block = Aligned::new(4096, b'D');
            // SAFETY: writing our aligned 4 KiB buffer.
            let n =
                unsafe { libc::pwrite(d.as_raw_fd(), block.bytes().as_ptr().cast(), 4096, 8192) };
            t.note(format!("O_DIRECT write {n}"));
            t.r("read O_DIRECT's block via r", text(sys::pread(&r, 4, 8192)));
        }
        t.r("append via a", sys::write(&a, b"AAAA"));
        t.r("size via rw", sys::fstat(&rw).map(|s| s.st_size));
        t.r("tail via r", text(sys::pread(&r, 4, 16384)));
        t.r("write via rw", sys::pwrite(&rw, b"RW", 100));
        t.r("read via r", text(sys::pread(&r, 2, 100)));
        if let Some(d) = &d {
            // SAFETY: reading into our aligned buffer.
            let n =
                unsafe { libc::pread(d.as_raw_fd(), buf.bytes_mut().as_mut_ptr().cast(), 4096, 0) };
            t.note(format!(
                "O_DIRECT sees: {n} {:?} {:?}",
                String::from_utf8_lossy(&buf.bytes()[..4]),
                String::from_utf8_lossy(&buf.bytes()[100..102])
            ));
        }
        // A file that becomes set-user-ID while open.
        t.e("chmod 04777", sys::chmod(&f, 0o4777));
        t.r(
            "new O_WRONLY open writes",
            sys::open(&f, libc::O_WRONLY, 0).and_then(|fd| sys::pwrite(&fd, b"S", 0)),
        );
        t.r(
            "new O_RDWR open reads",
            sys::open(&f, libc::O_RDWR, 0).and_then(|fd| text(sys::pread(&fd, 4, 0))),
        );
        t.r(
            "new O_RDONLY open reads",
            sys::open(&f, libc::O_RDONLY, 0).and_then(|fd| text(sys::pread(&fd, 4, 0))),
        );
        t.r("old O_WRONLY fd writes", sys::pwrite(&w, b"O", 1));
        t.r("old O_RDONLY fd reads", text(sys::pread(&r, 4, 0)));
        t.meta("mode (root writes keep set-ID bits)", &f);
        drop((r, w, rw, d, a));
        t.meta("after closing all", &f);
    }

    /// 64-bit offsets and sizes: nothing is cut to 32 bits on the way.
    pub fn offsets_past_4_gib(root: &Path, t: &mut T) {
        let f = root.join("huge");
        let fd = create(&f, 0o644).unwrap();
        let g = 1i64 << 30;
        t.r("pwrite at 5 GiB + 1", sys::pwrite(&fd, b"far", 5 * g + 1));
        t.r("size", sys::fstat(&fd).map(|s| s.st_size));
        t.r("stat size", sys::stat(&f).map(|s| s.st_size));
        t.r("pread at 5 GiB + 1", text(sys::pread(&fd, 3, 5 * g + 1)));
        t.r(
            "pread at 4 GiB + 1",
            sys::pread(&fd, 4, 4 * g + 1).map(|b| b == [0; 4]),
        );
        t.r(
            "SEEK_DATA from 4 GiB",
            sys::lseek(&fd, 4 * g, libc::SEEK_DATA),
        );
        t.r("SEEK_END", sys::lseek(&fd, 0, libc::SEEK_END));
        t.r("SEEK_SET 6 GiB", sys::lseek(&fd, 6 * g, libc::SEEK_SET));
        t.r("write at 6 GiB", sys::write(&fd, b"end"));
        t.r("size", sys::fstat(&fd).map(|s| s.st_size));
        t.e("ftruncate to 4 GiB + 2", sys::ftruncate(&fd, 4 * g + 2));
        t.r("size", sys::fstat(&fd).map(|s| s.st_size));
        t.e("truncate to 8 GiB", sys::truncate(&f, 8 * g));
        t.r("stat size", sys::stat(&f).map(|s| s.st_size));
        t.e(
            "fallocate KEEP_SIZE at 7 GiB",
            sys::fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, 7 * g, 4096),
        );
        t.r(
            "SEEK_DATA from 6 GiB",
            sys::lseek(&fd, 6 * g, libc::SEEK_DATA),
        );
        t.r(
            "pwrite past the host's limit",
            sys::pwrite(&fd, b"x", 1 << 46),
        );
        let other = create(&root.join("copy"), 0o644).unwrap();
        sys::pwrite(&fd, b"copied", 5 * g).unwrap();
        t.r(
            "copy_file_range from 5 GiB to 4 GiB + 3",
            sys::copy_file_range(&fd, 5 * g, &other, 4 * g + 3, 6),
        );
        t.r("copied", text(sys::pread(&other, 6, 4 * g + 3)));
        // (Small again, so that comparing the trees reads little.)
        t.e("ftruncate copy", sys::ftruncate(&other, 10));
        t.e("ftruncate huge", sys::ftruncate(&fd, 10));
    }

    /// Two names of one inode are one file to the kernel too: after both were read (and
    /// perhaps cached), a write through one name is what the other reads, and so is a
    /// truncate.
    pub fn hard_links_share_one_cache(root: &Path, t: &mut T) {
        let (a, b) = (root.join("a"), root.join("b"));
        put(&a, &vec![b'1'; 20000]);
        t.e("link a b", sys::link(&a, &b));
        t.r("read a", read_all(&a).map(|s| s.len()));
        t.r("read b", read_all(&b).map(|s| s.len()));
        let fa = rw(&a).unwrap();
        let fb = sys::open(&b, libc::O_RDONLY, 0).unwrap();
        t.r("pread b", text(sys::pread(&fb, 4, 10000)));
        t.r("write via a", sys::pwrite(&fa, b"NEW!", 10000));
        t.r("pread b after", text(sys::pread(&fb, 4, 10000)));
        t.r(
            "new open of b",
            read_all(&b).map(|s| s[10000..10004].to_string()),
        );
        t.e("ftruncate via a", sys::ftruncate(&fa, 100));
        t.r("fstat b", sys::fstat(&fb).map(|s| s.st_size));
        t.r("stat b", sys::stat(&b).map(|s| s.st_size));
        t.r("read b", read_all(&b).map(|s| s.len()));
        t.r(
            "same ino",
            Ok::<_, Errno>(sys::stat(&a).unwrap().st_ino == sys::stat(&b).unwrap().st_ino),
        );
    }

    // ---- helpers ----

    pub fn names(p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    pub enum Probe {
        Set(i32, i64, i64),
        Get(i32, i64, i64),
    }

    /// Runs `probes` with F_SETLK/F_GETLK in a forked child that opens `path` itself; returns
    /// per probe (errno or 0, type, pid, start, len). The child uses only async-signal-safe
    /// calls and no allocation.
    pub fn child_probe(path: &Path, probes: &[Probe]) -> Vec<[i64; 5]> {
        let c = sys::cstr(path);
        let mut out = vec![[0i64; 5]; probes.len()];
        let mut fds = [0i32; 2];
        // SAFETY: pipe into a 2-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only calls open/fcntl/write/_exit on memory prepared before fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            unsafe {
                let fd = libc::open(c.as_ptr(), libc::O_RDWR);
                for (i, p) in probes.iter().enumerate() {
                    let (cmd, (kind, start, len)) = match p {
                        Probe::Set(k, s, l) => (libc::F_SETLK, (*k, *s, *l)),
                        Probe::Get(k, s, l) => (libc::F_GETLK, (*k, *s, *l)),
                    };
                    let mut fl: libc::flock = std::mem::zeroed();
                    fl.l_type = kind as i16;
                    fl.l_whence = libc::SEEK_SET as i16;
                    fl.l_start = start;
                    fl.l_len = len;
                    let r = libc::fcntl(fd, cmd, &mut fl);
                    let err = if r < 0 {
                        *libc::__errno_location() as i64
                    } else {
                        0
                    };
                    out[i] = [err, fl.l_type as i64, fl.l_pid as i64, fl.l_start, fl.l_len];
                }
                let bytes = out.len() * 40;
                libc::write(fds[1], out.as_ptr().cast(), bytes);
                libc::_exit(0);
            }
        }
        // SAFETY: closing our write end, reading into `out`, reaping the child.
        unsafe {
            libc::close(fds[1]);
            let want = out.len() * 40;
            let mut got = 0;
            let base = out.as_mut_ptr().cast::<u8>();
            while got < want {
                let n = libc::read(fds[0], base.add(got).cast(), want - got);
                assert!(n > 0, "lock probe child died");
                got += n as usize;
            }
            libc::close(fds[0]);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
        out
    }

    /// A probe result with pids told as "parent"/"none" so transcripts compare.
    pub fn describe(results: &[[i64; 5]], parent: i32) -> String {
        results
            .iter()
            .map(|[err, kind, pid, start, len]| {
                if *err != 0 {
                    Errno(*err as i32).name()
                } else {
                    let who = if *pid == parent as i64 {
                        "parent".to_string()
                    } else if *pid == 0 {
                        "-".to_string()
                    } else {
                        format!("pid {pid}")
                    };
                    let kind = match *kind as i32 {
                        libc::F_RDLCK => "RD",
                        libc::F_WRLCK => "WR",
                        _ => "UN",
                    };
                    format!("ok {kind} {who} {start}+{len}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// With --read-only (and -o ro), every change is refused with EROFS and reads work; the
/// source is left as it was.
#[test]
fn read_only_mounts_refuse_changes_with_erofs() {
    for args in [&["--read-only"][..], &["-o", "ro"][..]] {
        let source = TempDir::new("ro-src");
        let s = source.path();
        put(&s.join("f"), b"read me");
        sys::mkdir(&s.join("d"), 0o755).unwrap();
        sys::setxattr(&s.join("f"), "user.a", b"v", 0).unwrap();
        sys::symlink("f", &s.join("s")).unwrap();
        let before = tree_snapshot(s);
        let m = Mount::passthrough(s, args);
        let p = |n: &str| m.path(n);
        let erofs = Err(Errno(libc::EROFS));
        let mut results = vec![
            (
                "create",
                sys::open(&p("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            ),
            (
                "open O_WRONLY",
                sys::open(&p("f"), libc::O_WRONLY, 0).map(|_| ()),
            ),
            (
                "open O_RDWR",
                sys::open(&p("f"), libc::O_RDWR, 0).map(|_| ()),
            ),
            (
                "open O_TRUNC",
                sys::open(&p("f"), libc::O_RDONLY | libc::O_TRUNC, 0).map(|_| ()),
            ),
            ("mkdir", sys::mkdir(&p("d2"), 0o755)),
            ("rmdir", sys::rmdir(&p("d"))),
            ("unlink", sys::unlink(&p("f"))),
            ("rename", sys::rename(&p("f"), &p("g"))),
            ("link", sys::link(&p("f"), &p("g"))),
            ("symlink", sys::symlink("x", &p("t"))),
            ("mknod", sys::mknod(&p("fifo"), libc::S_IFIFO | 0o644, 0)),
            ("chmod", sys::chmod(&p("f"), 0o600)),
            ("chown", sys::chown(&p("f"), 1, 1)),
            ("truncate", sys::truncate(&p("f"), 0)),
            (
                "utimens",
                sys::utimens(&p("f"), sys::ts(1, 0), sys::ts(1, 0), 0),
            ),
            ("setxattr", sys::setxattr(&p("f"), "user.b", b"x", 0)),
            ("removexattr", sys::removexattr(&p("f"), "user.a")),
            (
                "O_TMPFILE",
                sys::open(&m.mountpoint, libc::O_TMPFILE | libc::O_RDWR, 0o600).map(|_| ()),
            ),
        ];
        let ro = sys::open(&p("f"), libc::O_RDONLY, 0).unwrap();
        results.push(("fallocate on O_RDONLY fd", sys::fallocate(&ro, 0, 0, 10)));
        let bad: Vec<_> = results
            .iter()
            .filter(|(what, r)| {
                // fallocate on a read-only fd is EBADF before the fs is asked.
                if *what == "fallocate on O_RDONLY fd" {
                    r.is_ok()
                } else {
                    *r != erofs
                }
            })
            .map(|(what, r)| format!("{what}: {r:?}"))
            .collect();
        assert!(bad.is_empty(), "{args:?}: not refused with EROFS: {bad:?}");
        assert_eq!(std::fs::read(p("f")).unwrap(), b"read me");
        assert_eq!(sys::readlink(&p("s")).unwrap(), "f");
        assert_eq!(sys::getxattr(&p("f"), "user.a", 16).unwrap().1, b"v");
        assert_eq!(cases::names(&m.mountpoint), ["d", "f", "s"]);
        let c = sys::cstr(&m.mountpoint);
        // SAFETY: statvfs into a zeroed struct.
        let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut vfs) }, 0);
        assert!(
            vfs.f_flag & libc::ST_RDONLY != 0,
            "statvfs does not say read-only"
        );
        drop(ro);
        m.unmount();
        assert_same_tree("read-only source", &before, &tree_snapshot(s));
    }
}

/// Threads creating, renaming, linking and removing in one directory while others list it
/// and stat what they find: every call answers, the end state is exactly what was left, and
/// the host agrees.
#[test]
fn concurrent_metadata_changes_in_one_directory() {
    let source = TempDir::new("conc-src");
    let m = Mount::passthrough(source.path(), &[]);
    let dir = m.path("d");
    std::fs::create_dir(&dir).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listers: Vec<_> = (0..2)
        .map(|_| {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut listings = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for e in std::fs::read_dir(&dir).unwrap() {
                        let e = e.unwrap();
                        // Gone by now is fine; any other error is not.
                        if let Err(err) = sys::lstat(&e.path())
                            && err != Errno(libc::ENOENT)
                        {
                            panic!("lstat {}: {err}", e.path().display());
                        }
                    }
                    listings += 1;
                }
                listings
            })
        })
        .collect();
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    let a = dir.join(format!("t{t}-{i}"));
                    std::fs::write(&a, format!("{t}/{i}")).unwrap();
                    let b = dir.join(format!("t{t}-{i}.renamed"));
                    sys::rename(&a, &b).unwrap();
                    if i % 3 == 0 {
                        sys::link(&b, &dir.join(format!("t{t}-{i}.link"))).unwrap();
                    }
                    if i % 2 == 0 {
                        sys::unlink(&b).unwrap();
                    }
                    if i % 10 == 0 {
                        let sub = dir.join(format!("t{t}-{i}.dir"));
                        sys::mkdir(&sub, 0o755).unwrap();
                        std::fs::write(sub.join("x"), b"x").unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in listers {
        assert!(l.join().unwrap() > 0);
    }
    let mut expected = Vec::new();
    for t in 0..4 {
        for i in 0..300 {
            if i % 2 != 0 {
                expected.push(format!("t{t}-{i}.renamed"));
            }
            if i % 3 == 0 {
                expected.push(format!("t{t}-{i}.link"));
            }
            if i % 10 == 0 {
                expected.push(format!("t{t}-{i}.dir"));
            }
        }
    }
    expected.sort();
    assert_eq!(cases::names(&dir), expected);
    assert_eq!(cases::names(&source.path().join("d")), expected);
    // Links of removed names still hold the data, with the right link count.
    let st = sys::stat(&dir.join("t2-0.link")).unwrap();
    assert_eq!(st.st_nlink, 1);
    assert_eq!(std::fs::read(dir.join("t2-3.link")).unwrap(), b"2/3");
    assert_eq!(sys::stat(&dir.join("t2-3.link")).unwrap().st_nlink, 2);
    m.unmount();
}

/// A forked child, killed and reaped on drop if it is still there.
struct ChildGuard(libc::pid_t);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SAFETY: signalling and reaping our own child (harmless if already reaped).
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// Forks a child that takes a blocking lock on `path` (F_SETLKW write lock of the whole
/// file, or flock LOCK_EX) and exits 0 once it has it. `close_first` is our holder's fd:
/// the child's inherited copy would share its open file, and so its flock.
fn blocking_locker(path: &Path, use_flock: bool, close_first: i32) -> libc::pid_t {
    let c = sys::cstr(path);
    // SAFETY: the child only calls close/open/fcntl/flock/_exit on memory prepared before
    // fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        unsafe {
            libc::close(close_first);
            let fd = libc::open(c.as_ptr(), libc::O_RDWR);
            let r = if use_flock {
                libc::flock(fd, libc::LOCK_EX)
            } else {
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = libc::F_WRLCK as i16;
                fl.l_whence = libc::SEEK_SET as i16;
                libc::fcntl(fd, libc::F_SETLKW, &fl)
            };
            libc::_exit(if r == 0 { 0 } else { 1 });
        }
    }
    pid
}

/// Waits up to `limit` for `pid`; its exit status, or None if it is still running.
fn wait_child(pid: libc::pid_t, limit: std::time::Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: reaping our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process waiting for a lock (POSIX or flock) gets it when the holder lets go, and one
/// killed while it waits dies at once; nothing is left locked behind it.
#[test]
fn blocked_lock_waiters_wake_and_can_be_killed() {
    use std::time::Duration;
    let native = TempDir::new("lockwait-native");
    let source = TempDir::new("lockwait-src");
    let m = Mount::passthrough(source.path(), &[]);
    // Natively first (the scenario itself holds), then on the mount.
    for (side, use_flock) in [
        ("native", false),
        ("native", true),
        ("mount", false),
        ("mount", true),
    ] {
        let f = if side == "native" {
            native.path().join("f")
        } else {
            m.path("f")
        };
        put(&f, b"lock");
        let what = format!("{side} {}", if use_flock { "flock" } else { "F_SETLKW" });
        let holder = rw(&f).unwrap();
        if use_flock {
            sys::flock(&holder, libc::LOCK_EX).unwrap();
        } else {
            sys::setlk(holder.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 0).unwrap();
        }
        // A waiter killed while blocked dies promptly.
        let doomed = blocking_locker(&f, use_flock, holder.as_raw_fd());
        let _doomed_guard = ChildGuard(doomed);
        assert_eq!(
            wait_child(doomed, Duration::from_millis(300)),
            None,
            "{what}: the waiter did not wait"
        );
        // SAFETY: killing our own child.
        unsafe { libc::kill(doomed, libc::SIGKILL) };
        let status = wait_child(doomed, Duration::from_secs(3))
            .unwrap_or_else(|| panic!("{what}: a killed lock waiter did not die within 3 s"));
        assert!(libc::WIFSIGNALED(status), "{what}: {status:#x}");
        // A waiter that is let in.
        let waiter = blocking_locker(&f, use_flock, holder.as_raw_fd());
        let _waiter_guard = ChildGuard(waiter);
        assert_eq!(wait_child(waiter, Duration::from_millis(300)), None);
        drop(holder);
        let status = wait_child(waiter, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{what}: the waiter never got the lock"));
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{what}: {status:#x}"
        );
        // Nothing is left locked: a non-blocking lock succeeds at once.
        let again = rw(&f).unwrap();
        if use_flock {
            sys::flock(&again, libc::LOCK_EX | libc::LOCK_NB).unwrap();
        } else {
            sys::setlk(again.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 0).unwrap();
        }
    }
    m.unmount();
}

/// Writers appending to one file at once from their own O_APPEND fds: every record lands
/// whole, once, none overwritten.
#[test]
fn concurrent_appends_are_atomic() {
    const THREADS: usize = 4;
    const RECORDS: usize = 500;
    const LEN: usize = 100;
    for args in [
        &[][..],
        &["--no-passthrough"][..],
        &["--direct-io"][..],
        &["--direct-io", "--no-parallel-writes"][..],
    ] {
        let source = TempDir::new("append-src");
        let m = Mount::passthrough(source.path(), args);
        let f = m.path("log");
        put(&f, b"");
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    let fd = sys::open(&f, libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
                    for i in 0..RECORDS {
                        let mut rec = format!("<{t}:{i:04}:").into_bytes();
                        rec.resize(LEN - 1, b'.');
                        rec.push(b'\n');
                        assert_eq!(sys::write(&fd, &rec).unwrap(), LEN);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for path in [f.clone(), source.path().join("log")] {
            let data = std::fs::read(&path).unwrap();
            assert_eq!(
                data.len(),
                THREADS * RECORDS * LEN,
                "{args:?} {}",
                path.display()
            );
            let mut seen = std::collections::HashSet::new();
            for rec in data.chunks(LEN) {
                assert!(
                    rec[0] == b'<' && rec[LEN - 1] == b'\n',
                    "{args:?}: a torn record: {:?}",
                    String::from_utf8_lossy(rec)
                );
                assert!(seen.insert(rec.to_vec()), "{args:?}: a record twice");
            }
            assert_eq!(seen.len(), THREADS * RECORDS);
        }
        m.unmount();
    }
}

/// mount(8)'s form (`mount -t fuse 'lanefs#SOURCE' MOUNTPOINT -o ...`, as from fstab) mounts
/// a passthrough with its options: here a 10-fd cache and read-only.
#[test]
fn mount_8_form_passes_passthrough_options() {
    if !Path::new("/sbin/mount.fuse3").exists() && !Path::new("/usr/sbin/mount.fuse3").exists() {
        panic!("mount.fuse3 is required (apt-get install fuse3)");
    }
    let source = TempDir::new("fstab-src");
    for i in 0..200 {
        put(&source.path().join(format!("f{i}")), b"x");
    }
    let dir = TempDir::new("fstab-mnt");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            if common::is_mounted(self.0) {
                let _ = Command::new("umount").arg("-l").arg(self.0).status();
            }
        }
    }
    let out = Command::new("mount")
        .args(["-t", "fuse"])
        .arg(format!("{}#{}", common::lanefs(), source.path().display()))
        .arg(&mnt)
        .args(["-o", "fd_cache=10,attr_timeout=0,ro"])
        .output()
        .unwrap();
    let _guard = Unmount(&mnt);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::run_ok(
        Command::new("sh")
            .arg("-c")
            .arg("cat f* | wc -c")
            .current_dir(&mnt),
    );
    assert_eq!(out.trim(), "200");
    assert_eq!(
        sys::open(&mnt.join("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap_err(),
        Errno(libc::EROFS)
    );
    let stats = common::run_ok(
        Command::new(common::lanefs())
            .args(["stats", "--json"])
            .arg(&mnt),
    );
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let cached = stats["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p[0] == "fd_cache_fds")
        .and_then(|p| p[1].as_u64())
        .unwrap();
    assert!(
        cached <= 10,
        "fd_cache=10 did not reach the daemon: {cached} fds cached"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
}
