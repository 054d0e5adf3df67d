//! Round trips per create (issue 15): what `echo > $i` in a bash loop costs in requests, by
//! opcode, on the passthrough and on a volume, counted with `lanefs stats`; and per
//! lseek(SEEK_END) of a file open for writing (issue 16's database rows). Each count is
//! the least the kernel (6.18) sends for it; ARCHITECTURE.md ("Round trips of a create")
//! says why each one remains. A count that grows means a round trip we removed came back.

mod common;

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::subject::{KINDS, Source};
use common::sys;
use common::volume::Volume;
use common::{Mount, TempDir, wait_until};

/// Files created per run: enough that a stray request or two (an attribute timeout running
/// out mid-run) stays within the margin.
const FILES: u64 = 200;
/// Requests of one opcode beyond the expected count that are tolerated, per run.
const MARGIN: u64 = FILES / 20;

/// Every opcode's count in the mount's stats.
fn op_counts(mount: &Mount) -> BTreeMap<String, u64> {
    mount.stats()["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["op"].as_str().unwrap().to_owned(),
                o["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn counter(mount: &Mount, name: &str) -> u64 {
    mount.stats()["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_u64())
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// Runs `script` (bash, `$N` = FILES) in `dir` on `mount` and returns the requests it made,
/// by opcode, once the asynchronous RELEASEs of its files have arrived.
fn requests_of(mount: &Mount, dir: &Path, script: &str) -> BTreeMap<String, u64> {
    let before = op_counts(mount);
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("N", FILES.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "{script}");
    let released = |mount: &Mount| {
        op_counts(mount).get("release").copied().unwrap_or(0)
            - before.get("release").copied().unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(10), || released(mount) >= FILES),
        "{} RELEASEs for {FILES} files",
        released(mount)
    );
    op_counts(mount)
        .into_iter()
        .map(|(op, n)| {
            let d = n - before.get(&op).copied().unwrap_or(0);
            (op, d)
        })
        .filter(|(op, d)| *d > 0 && !op.contains("forget"))
        .collect()
}

/// Asserts that `got` holds `per_file` requests per file of each opcode named there (at
/// least that many, at most `MARGIN` more) and no other opcode beyond `MARGIN`.
fn assert_requests(what: &str, got: &BTreeMap<String, u64>, per_file: &[(&str, u64)]) {
    let table = format!("{what}: {got:?} for {FILES} files");
    for (op, per) in per_file {
        let n = got.get(*op).copied().unwrap_or(0);
        let want = per * FILES;
        assert!(n >= want && n <= want + MARGIN, "{op}: {table}");
    }
    for (op, n) in got {
        if !per_file.iter().any(|(o, _)| o == op) {
            assert!(*n <= MARGIN, "unexpected {op}: {table}");
        }
    }
}

const CREATE_LOOP: &str = "for ((i = 0; i < N; i++)); do echo > $i; done";

/// What `echo > $i` costs on a volume, with and without flushes at close, and the data
/// being there afterwards (read back at once by another process, and after a remount).
fn volume_creates(args: &[&str], flushes: u64) {
    let volume = Volume::format("rtt");
    let mount = volume.mount(args);
    std::fs::create_dir(mount.path("d")).unwrap();
    let got = requests_of(
        &mount,
        &mount.path("d"),
        "for ((i = 0; i < N; i++)); do echo $i > $i; done",
    );
    assert_requests(
        &format!("volume {args:?}"),
        &got,
        &[
            ("lookup", 1),
            ("create", 1),
            ("getattr", 1),
            // None: `>` opens write-only, and such an open's writes are direct (see
            // `write_only_opens_of_a_volume_send_one_write_per_write_and_stay_coherent`).
            ("write", 1),
            ("flush", flushes),
            ("release", 1),
        ],
    );
    // Close-to-open: a file closed one instant is read whole by the next process.
    let status = Command::new("bash")
        .arg("-c")
        .arg(
            "for ((i = 0; i < 50; i++)); do echo $i > r$i; [ \"$(cat r$i)\" = $i ] || exit 1; done",
        )
        .current_dir(mount.path("d"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{args:?}: a file read after close lacked its data"
    );
    mount.unmount();
    let again = volume.mount(&[]);
    for i in [0, FILES / 2, FILES - 1] {
        assert_eq!(
            std::fs::read_to_string(again.path(&format!("d/{i}"))).unwrap(),
            format!("{i}\n"),
            "{args:?}"
        );
    }
    again.unmount();
    volume.assert_clean();
}

#[test]
fn a_create_on_the_passthrough_costs_what_the_kernel_needs() {
    let src = TempDir::new("rtt-src");
    let mount = Mount::start(src.path().to_str().unwrap(), &[]);
    std::fs::create_dir(mount.path("d")).unwrap();
    let from_memory = counter(&mount, "caps_from_memory");
    let got = requests_of(&mount, &mount.path("d"), CREATE_LOOP);
    // LOOKUP: fuse_atomic_open looks up a name the dcache has never seen before its
    // CREATE; GETATTR: of the parent, whose attributes each create invalidates
    // (fuse_dir_changed) and the next path walk's permission check must refetch; GETXATTR:
    // security.capability before the first write to a new inode (never S_NOSEC); FLUSH:
    // one per close(2), bash closes twice; RELEASE: asynchronous.
    assert_requests(
        "passthrough",
        &got,
        &[
            ("lookup", 1),
            ("create", 1),
            ("getattr", 1),
            ("getxattr", 1),
            ("flush", 2),
            ("release", 1),
        ],
    );
    // The GETXATTR that remains is answered without asking the host: the file is new.
    let answered = counter(&mount, "caps_from_memory") - from_memory;
    assert!(
        answered + MARGIN >= FILES,
        "{answered} of {FILES} GETXATTRs answered from memory"
    );
    mount.unmount();
}

/// A database's pattern on a file it keeps open for writing through kernel passthrough:
/// lseek(SEEK_END) again and again between writes. Each write(2) makes the kernel drop the
/// size it cached, so the next lseek asks (GETATTR) and sees the size the write made; the
/// lseeks after it are answered from the cache for a few milliseconds
/// (`MAPPED_WRITE_ATTR_VALID`), not each by a round trip as when such a file's attributes
/// were never cached (539,000 GETATTRs in a 10 s pgbench).
#[test]
fn seeks_to_the_end_of_a_file_open_for_writing_reuse_its_attributes() {
    use std::io::{Seek, SeekFrom, Write};
    let src = TempDir::new("rtt-seek-src");
    let mount = Mount::start(src.path().to_str().unwrap(), &[]);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mount.path("table"))
        .unwrap();
    const ROUNDS: u64 = 50;
    const SEEKS: u64 = 100;
    let before = op_counts(&mount).get("getattr").copied().unwrap_or(0);
    for round in 1..=ROUNDS {
        file.write_all(&[7u8; 8192]).unwrap();
        for _ in 0..SEEKS {
            assert_eq!(file.seek(SeekFrom::End(0)).unwrap(), round * 8192);
        }
    }
    let getattrs = op_counts(&mount).get("getattr").copied().unwrap_or(0) - before;
    // One after each write, plus one each time the 10 ms ran out within a round (a slow
    // machine): far from one per lseek.
    assert!(
        (ROUNDS..=ROUNDS * 4).contains(&getattrs),
        "{getattrs} GETATTRs for {ROUNDS} writes each followed by {SEEKS} lseeks"
    );
    drop(file);
    mount.unmount();
}

#[test]
fn no_flush_on_close_removes_both_flushes_on_the_passthrough() {
    let src = TempDir::new("rtt-src");
    let mount = Mount::start(src.path().to_str().unwrap(), &["--no-flush-on-close"]);
    std::fs::create_dir(mount.path("d")).unwrap();
    let got = requests_of(&mount, &mount.path("d"), CREATE_LOOP);
    assert_requests(
        "passthrough --no-flush-on-close",
        &got,
        &[
            ("lookup", 1),
            ("create", 1),
            ("getattr", 1),
            ("getxattr", 1),
            ("flush", 0),
            ("release", 1),
        ],
    );
    assert_eq!(std::fs::read(src.path().join("d/7")).unwrap(), b"\n");

    // POSIX locks stay exact on the mount without FLUSH: a process's close of any of its
    // descriptors of the file drops its locks, so another process can lock at once.
    let path = mount.path("locked");
    std::fs::write(&path, b"x").unwrap();
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    set_write_lock(&holder).unwrap();
    assert!(!other_process_can_lock(&path), "the lock is not held");
    drop(std::fs::File::open(&path).unwrap());
    assert!(
        other_process_can_lock(&path),
        "closing another descriptor of the file kept the lock"
    );
    drop(holder);

    // flock stays the daemon's (on the open's host fd, closed at RELEASE, which comes
    // without FLUSH too): held while open, gone once closed.
    let flocked = std::fs::File::open(&path).unwrap();
    // SAFETY: flock on an fd we hold.
    assert_eq!(
        unsafe { libc::flock(flocked.as_raw_fd(), libc::LOCK_EX) },
        0
    );
    let free = || {
        Command::new("flock")
            .args(["-n", "-E", "9"])
            .arg(&path)
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    assert!(!free(), "flock not held");
    drop(flocked);
    assert!(
        wait_until(Duration::from_secs(5), free),
        "flock kept after close"
    );
    mount.unmount();
}

#[test]
fn a_create_on_a_volume_costs_what_the_kernel_needs() {
    volume_creates(&[], 2);
}

#[test]
fn no_flush_on_close_removes_both_flushes_on_a_volume() {
    volume_creates(&["-o", "noflush"], 0);
}

/// A write-only open of a volume file sends one WRITE per write(2) and no GETXATTR. Through
/// the page cache, a write that starts inside a page an earlier write left partly written
/// (tar's 10 KiB records, after each file's first) went as two requests, and each write(2)
/// first asked for security.capability (the kernel's file_remove_privs): a kernel untar sent
/// 3.9 WRITEs and 2 GETXATTRs per file, now 2.6 and 1 (tar's fchown asks too). Readers of
/// the file through other opens, by read(2) and through a shared mapping, see every write
/// at once, as on tmpfs: the kernel drops their cached pages around a direct write.
#[test]
fn write_only_opens_of_a_volume_send_one_write_per_write_and_stay_coherent() {
    const LEN: usize = 10_000;
    let volume = Volume::format("rtt-wronly");
    let m = volume.mount(&[]);
    let path = m.path("f");
    let before = op_counts(&m);
    let writer = sys::open(&path, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o644).unwrap();
    // Two writes of 5000 bytes: the second starts inside the page the first ended in.
    assert_eq!(sys::write(&writer, &[b'b'; 5000]).unwrap(), 5000);
    assert_eq!(sys::write(&writer, &[b'c'; 5000]).unwrap(), 5000);
    let after = op_counts(&m);
    let sent =
        |op: &str| after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0);
    assert_eq!(sent("write"), 2, "WRITEs for two write(2)s: {after:?}");
    assert_eq!(
        sent("getxattr"),
        0,
        "GETXATTRs for two write(2)s: {after:?}"
    );

    // A reader that has the file cached, by read(2) and by a shared mapping.
    let mut want = vec![b'b'; LEN];
    want[5000..].fill(b'c');
    let reader = sys::open(&path, libc::O_RDONLY, 0).unwrap();
    assert_eq!(sys::pread(&reader, LEN, 0).unwrap(), want);
    // SAFETY: a fresh shared read-only mapping of LEN bytes of an fd open for reading.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ,
            libc::MAP_SHARED,
            reader.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mapped = |at: usize| {
        assert!(at < LEN);
        // SAFETY: at < LEN, inside the mapping, which lives until the munmap below.
        unsafe { map.cast::<u8>().add(at).read_volatile() }
    };
    assert_eq!(mapped(6000), b'c');
    // A write over cached, mapped pages through the write-only open.
    assert_eq!(sys::pwrite(&writer, &[b'd'; 3000], 3500).unwrap(), 3000);
    want[3500..6500].fill(b'd');
    assert_eq!(
        sys::pread(&reader, LEN, 0).unwrap(),
        want,
        "read(2) of another open"
    );
    for at in [0, 3499, 3500, 4096, 6499, 6500, LEN - 1] {
        assert_eq!(mapped(at), want[at], "the shared mapping at {at}");
    }
    // SAFETY: the mapping made above, unmapped once.
    assert_eq!(unsafe { libc::munmap(map, LEN) }, 0);
    drop(writer);
    drop(reader);
    assert_eq!(std::fs::read(&path).unwrap(), want);
    m.unmount();
    let again = volume.mount(&[]);
    assert_eq!(
        std::fs::read(again.path("f")).unwrap(),
        want,
        "after a remount"
    );
    again.unmount();
    volume.assert_clean();
}

/// A name looked up and found absent is remembered by the kernel for the entry timeout, so
/// the create that follows sends no LOOKUP of its own: one per file, not two (two with
/// `--entry-timeout 0`, which shows the count can tell).
#[test]
fn a_create_after_a_miss_reuses_the_cached_negative_entry() {
    let script = "for ((i = 0; i < N; i++)); do [ -e $i ] || echo > $i; done";
    for (timeout, lookups) in [("1", 1), ("0", 2)] {
        let src = TempDir::new("rtt-src");
        let mount = Mount::start(src.path().to_str().unwrap(), &["--entry-timeout", timeout]);
        std::fs::create_dir(mount.path("d")).unwrap();
        let got = requests_of(&mount, &mount.path("d"), script);
        let n = got.get("lookup").copied().unwrap_or(0);
        assert!(
            n >= lookups * FILES && n <= lookups * FILES + MARGIN,
            "passthrough, entry timeout {timeout}: {got:?}"
        );
        mount.unmount();

        let volume = Volume::format("rtt-neg");
        let mount = volume.mount(&["--entry-timeout", timeout]);
        std::fs::create_dir(mount.path("d")).unwrap();
        let got = requests_of(&mount, &mount.path("d"), script);
        let n = got.get("lookup").copied().unwrap_or(0);
        assert!(
            n >= lookups * FILES && n <= lookups * FILES + MARGIN,
            "volume, entry timeout {timeout}: {got:?}"
        );
        mount.unmount();
    }
}

/// The GETXATTR before a new file's first write is answered from memory ("no capability":
/// the file is new); that memory must never hide a capability set afterwards while the file
/// is still open from its create, nor keep one the write removed. Same answers as tmpfs.
#[test]
fn a_new_files_capability_answers_stay_true_as_on_tmpfs() {
    fn session(root: &Path) -> Vec<String> {
        let path = root.join("prog");
        let file = sys::open(&path, libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL, 0o755).unwrap();
        let caps = |what: &str| {
            let size = sys::getxattr(&path, "security.capability", 0).map(|(n, _)| n);
            format!("{what}: {size:?}")
        };
        let mut seen = vec![caps("created")];
        // cap_net_raw+ep in the VFS_CAP_REVISION_2 layout.
        let mut value = Vec::new();
        for word in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
            value.extend_from_slice(&word.to_ne_bytes());
        }
        seen.push(format!(
            "set: {:?}",
            sys::setxattr(&path, "security.capability", &value, 0)
        ));
        seen.push(caps("after set, still open"));
        sys::write(&file, b"#!/bin/sh\n").unwrap();
        seen.push(caps("after a write"));
        drop(file);
        seen.push(caps("closed"));
        seen
    }
    let native = common::Tmpfs::new("16M");
    let expected = session(&native.path);
    assert_eq!(expected[2], "after set, still open: Ok(20)", "{expected:?}");
    assert_as_on_tmpfs(
        "rtt-caps",
        &["--attr-timeout", "60"],
        |_| {},
        session,
        &expected,
    );
}

/// Asserts that `session` gives `expected` (tmpfs's transcript) on every file system lanefs
/// serves, mounted with `args` after `prepare` ran on a mount of its own (so that what the
/// session opens is read back from the source, not kept from its creation).
fn assert_as_on_tmpfs(
    tag: &str,
    args: &[&str],
    prepare: fn(&Path),
    session: fn(&Path) -> Vec<String>,
    expected: &[String],
) {
    for kind in KINDS {
        let source = Source::new(kind, tag);
        let m = source.mount(args);
        prepare(&m.mountpoint);
        m.unmount();
        let m = source.mount(args);
        assert_eq!(
            session(&m.mountpoint),
            expected,
            "lanefs ({kind:?}) vs tmpfs"
        );
        m.unmount();
    }
}

/// A file open on a volume has its xattrs answered from what its open read when it had
/// none (cp -a and tar ask every file they copy for its xattrs and ACL); that must never
/// hide one set while the file is open, by path or by another descriptor, nor show one a
/// file never had. Same answers as tmpfs; the files are opened after a remount, so their
/// state is read from the store.
#[test]
fn the_xattrs_of_an_open_file_stay_true_as_on_tmpfs() {
    fn prepare(root: &Path) {
        std::fs::write(root.join("plain"), b"p").unwrap();
        std::fs::write(root.join("tagged"), b"t").unwrap();
        sys::setxattr(&root.join("tagged"), "user.before", b"1", 0).unwrap();
    }
    fn session(root: &Path) -> Vec<String> {
        let (plain, tagged) = (root.join("plain"), root.join("tagged"));
        let held = [&plain, &tagged].map(|p| std::fs::File::open(p).unwrap());
        let names = |p: &Path| format!("{:?}", sys::listxattr(p, 1024).map(|(_, n)| n));
        let value =
            |p: &Path, name: &str| format!("{:?}", sys::getxattr(p, name, 64).map(|(_, v)| v));
        let mut seen = vec![
            names(&plain),
            value(&plain, "user.x"),
            value(&plain, "system.posix_acl_access"),
            names(&tagged),
            value(&tagged, "user.before"),
        ];
        seen.push(format!("{:?}", sys::setxattr(&plain, "user.x", b"2", 0)));
        seen.push(names(&plain));
        seen.push(value(&plain, "user.x"));
        seen.push(format!("{:?}", sys::removexattr(&plain, "user.x")));
        seen.push(names(&plain));
        seen.push(value(&plain, "user.x"));
        seen.push(format!("{:?}", sys::setxattr(&plain, "user.y", b"3", 0)));
        drop(held);
        seen.push(names(&plain));
        seen
    }
    let native = common::Tmpfs::new("16M");
    prepare(&native.path);
    let expected = session(&native.path);
    assert_eq!(expected[6], r#"Ok(["user.x"])"#, "{expected:?}");
    assert_as_on_tmpfs("rtt-xattrs", &[], prepare, session, &expected);
}

/// What `cp -a` of a directory out of a volume costs per file: OPEN, READ, the GETATTR
/// after it (a read drops the kernel's cached atime), cp's two LISTXATTRs and the GETXATTR
/// of its ACL, RELEASE; no FLUSH: a read-only open is answered FOPEN_NOFLUSH, since it has
/// nothing to commit at close. The copy is whole.
#[test]
fn copying_files_out_of_a_volume_costs_what_the_kernel_needs() {
    let volume = Volume::format("rtt-copy");
    let mount = volume.mount(&[]);
    std::fs::create_dir(mount.path("src")).unwrap();
    for i in 0..FILES {
        std::fs::write(mount.path(&format!("src/{i}")), format!("file {i}\n")).unwrap();
    }
    mount.unmount();
    let mount = volume.mount(&[]);
    let out = TempDir::new("rtt-copy");
    let got = requests_of(
        &mount,
        &mount.path(""),
        &format!("cp -a src {}", out.path().join("copy").display()),
    );
    assert_requests(
        "cp -a out of a volume",
        &got,
        &[
            ("open", 1),
            ("read", 1),
            ("getattr", 1),
            ("listxattr", 2),
            ("getxattr", 1),
            ("release", 1),
        ],
    );
    for i in 0..FILES {
        assert_eq!(
            std::fs::read_to_string(out.path().join(format!("copy/{i}"))).unwrap(),
            format!("file {i}\n")
        );
    }
    mount.unmount();
    volume.assert_clean();
}

fn set_write_lock(file: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: flock is plain data; fcntl on an fd we hold.
    let rc = unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a child process can take a write lock on `path` at once (F_SETLK).
fn other_process_can_lock(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the child only makes raw syscalls (no allocation, no locks) before _exit.
    let pid = unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let fd = libc::open(c.as_ptr(), libc::O_RDWR);
            if fd < 0 {
                libc::_exit(2);
            }
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as i16;
            fl.l_whence = libc::SEEK_SET as i16;
            let rc = libc::fcntl(fd, libc::F_SETLK, &fl);
            libc::_exit(if rc == 0 { 0 } else { 1 });
        }
        pid
    };
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "lock probe died");
    match libc::WEXITSTATUS(status) {
        0 => true,
        1 => false,
        code => panic!("lock probe could not open {}: {code}", path.display()),
    }
}
