//! Liveness of a CPU's queue: requests answered later (parked) never leave a CPU without
//! entries to serve new requests (issue 11, item 2), slow operations never hold a queue's
//! worker (item 3), and the engine's shutdown never detaches a mount stacked on ours
//! (item 8).
//!
//! Over io_uring a request is served by the ring of the CPU its caller runs on, so these
//! tests pin their callers to CPU 0: that is where a ring's entries could run out. Over
//! /dev/fuse (LANEFS_TEST_TRANSPORT=dev) the same tests check that nothing waits either.

mod common;

use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Mount, TempDir, process_alive, wait_until};

/// The tests of this file run one at a time: the lock test forks, and its children hold
/// copies of every fd of this process (another test's open files, which would keep that
/// test's mount busy) until they exit.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a probe from a CPU with parked requests may take: far less than the parked
/// requests wait, far more than a loaded 2-core machine needs to answer.
const PROMPT: Duration = Duration::from_secs(2);

use common::pin_to_cpu as pin_to;

/// Runs `probe` on a thread pinned to CPU 0 and returns how long it took, or None if it
/// did not finish within `limit` (the thread is then left to finish on its own).
fn timed_on_cpu0<T: Send + 'static>(
    limit: Duration,
    probe: impl FnOnce() -> T + Send + 'static,
) -> Option<(Duration, T)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        pin_to(0);
        let start = Instant::now();
        let value = probe();
        let _ = tx.send((start.elapsed(), value));
    });
    rx.recv_timeout(limit).ok()
}

/// A lookup that always reaches the daemon (a name never seen, so never cached).
fn fresh_lookup(dir: &Path, tag: &str) -> std::io::ErrorKind {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match std::fs::metadata(dir.join(format!("absent-{tag}-{n}"))) {
        Ok(_) => std::io::ErrorKind::AlreadyExists,
        Err(e) => e.kind(),
    }
}

/// Engine level: reads that null answers 4 s later, many more than a ring has entries, all
/// from CPU 0. A lookup from CPU 0 must still be served at once.
/// A passthrough (one queue) of a new source holding `leased` (and the `extra` files), with
/// a read lease on the host's `leased` held by the returned file: an open for writing
/// through the mount must wait for its break. SIGIO, which a break sends the holder, is
/// ignored.
fn mount_with_a_read_lease(tag: &str, extra: &[(&str, &[u8])]) -> (TempDir, Mount, File) {
    use std::os::fd::AsRawFd;
    // SAFETY: setting a signal disposition.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    let src = TempDir::new(tag);
    let host = src.path().join("leased");
    std::fs::write(&host, b"data").unwrap();
    for (name, bytes) in extra {
        std::fs::write(src.path().join(name), bytes).unwrap();
    }
    let m = Mount::start(src.path().to_str().unwrap(), &["--queues", "1"]);
    let lease_holder = File::open(&host).unwrap();
    let take_lease = || {
        // SAFETY: fcntl on an fd we hold.
        unsafe { libc::fcntl(lease_holder.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) == 0 }
    };
    assert!(
        wait_until(Duration::from_secs(5), take_lease),
        "cannot take a read lease: {}",
        std::io::Error::last_os_error()
    );
    (src, m, lease_holder)
}

#[test]
fn parked_reads_never_use_up_a_cpus_queue() {
    const PARKED: usize = 12;
    const DELAY_MS: u64 = 4000;
    let _serial = serial();
    let m = Mount::null(&[
        "--queue-depth",
        "4",
        "--defer-reads-ms",
        &DELAY_MS.to_string(),
    ]);
    let readers: Vec<_> = (0..PARKED)
        .map(|i| {
            let data = m.path("data");
            std::thread::spawn(move || {
                pin_to(0);
                let file = File::open(&data).unwrap();
                let mut buf = vec![1u8; 4096];
                let start = Instant::now();
                let n = file.read_at(&mut buf, i as u64 * 4096).unwrap();
                assert_eq!(n, 4096);
                assert!(buf.iter().all(|&b| b == 0));
                start.elapsed()
            })
        })
        .collect();
    // Let every read reach the daemon and park.
    std::thread::sleep(Duration::from_millis(500));
    let root = m.mountpoint.clone();
    let probe = timed_on_cpu0(PROMPT * 2, move || fresh_lookup(&root, "parked-reads"));
    let (took, kind) = probe.unwrap_or_else(|| {
        panic!("a lookup from CPU 0 waited more than {PROMPT:?} behind {PARKED} parked reads")
    });
    assert_eq!(kind, std::io::ErrorKind::NotFound);
    assert!(
        took < PROMPT,
        "a lookup from CPU 0 took {took:?} behind {PARKED} parked reads"
    );
    for reader in readers {
        let waited = reader.join().expect("a parked read failed");
        assert!(
            waited >= Duration::from_millis(DELAY_MS / 2),
            "a read came back after {waited:?}: it was not parked, so the test proves nothing"
        );
    }
    // The ring is whole again: more reads, from both CPUs, still work.
    let file = File::open(m.path("data")).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), 4096);
    drop(file);
    m.unmount();
}

/// A child process pinned to CPU 0 that takes a blocking POSIX write lock on `path` (a
/// parked SETLKW in the daemon while someone else holds it), then exits, which drops it.
fn spawn_lock_waiter(path: &CString) -> libc::pid_t {
    // SAFETY: the child only makes raw syscalls (no allocation, no locks) before _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
            let fd = libc::open(path.as_ptr(), libc::O_RDWR);
            if fd < 0 {
                libc::_exit(2);
            }
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as i16;
            fl.l_whence = libc::SEEK_SET as i16;
            let rc = libc::fcntl(fd, libc::F_SETLKW, &fl);
            libc::_exit(if rc == 0 { 0 } else { 3 });
        }
        pid
    }
}

fn set_lock(file: &File, typ: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock is plain data; fcntl on an fd we hold.
    let rc = unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = typ as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A process's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// Waits for child `pid` for up to `limit`; its exit status, or None if it still runs.
fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A passthrough mount with `queue_depth` entries per ring whose file `locked` this process
/// holds write-locked: (its source, the mount, the holder's file, the file's path).
fn locked_file_on_mount(queue_depth: &str) -> (TempDir, Mount, File, CString) {
    let src = TempDir::new("liveness-src");
    std::fs::write(src.path().join("locked"), b"x").unwrap();
    let m = Mount::start(
        src.path().to_str().unwrap(),
        &["--queue-depth", queue_depth, "--no-passthrough"],
    );
    let target = m.path("locked");
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
        .unwrap();
    set_lock(&holder, libc::F_WRLCK).expect("the holder takes the lock");
    let c_target = CString::new(target.as_os_str().as_bytes()).unwrap();
    (src, m, holder, c_target)
}

/// The repro: queue depth 4, more blocking POSIX-lock waiters than that, all in
/// processes on CPU 0; then the holder, on CPU 0 too, stats a file and unlocks. Both must
/// be served at once, and every waiter must get the lock in turn.
#[test]
fn blocking_lock_waiters_never_use_up_a_cpus_queue() {
    const WAITERS: usize = 8;
    let _serial = serial();
    let (_src, m, holder, c_target) = locked_file_on_mount("4");
    let rss_before = rss_kib(m.pid);
    let waiters: Vec<libc::pid_t> = (0..WAITERS).map(|_| spawn_lock_waiter(&c_target)).collect();
    // Let every waiter reach the daemon and park.
    std::thread::sleep(Duration::from_millis(800));
    // All killed before any is waited for: a killed waiter's exit closes its file (a
    // FLUSH), which may need the others to go first.
    let kill_all = |waiters: &[libc::pid_t]| {
        for &pid in waiters {
            // SAFETY: signalling our own children.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in waiters {
            wait_child(pid, Duration::from_secs(10));
        }
    };
    for &pid in &waiters {
        if wait_child(pid, Duration::ZERO).is_some() {
            kill_all(&waiters);
            panic!("a waiter exited while the lock was held: it did not wait");
        }
    }
    // Each parked waiter may have cost a spare ring entry: its payload buffer (1 MiB) must
    // cost no memory, as a lock request never touches it.
    let rss_growth = rss_kib(m.pid).saturating_sub(rss_before);
    let root = m.mountpoint.clone();
    let probe = timed_on_cpu0(PROMPT * 2, move || fresh_lookup(&root, "lock-waiters"));
    let Some((took, kind)) = probe else {
        kill_all(&waiters);
        panic!("a lookup from CPU 0 hung behind {WAITERS} parked lock waiters");
    };
    assert_eq!(kind, std::io::ErrorKind::NotFound);
    let unlock = timed_on_cpu0(PROMPT * 2, move || {
        let r = set_lock(&holder, libc::F_UNLCK);
        drop(holder);
        r
    });
    let Some((unlock_took, unlocked)) = unlock else {
        kill_all(&waiters);
        panic!("the holder's unlock from CPU 0 hung behind {WAITERS} parked lock waiters");
    };
    unlocked.expect("unlock");
    let statuses: Vec<Option<i32>> = waiters
        .iter()
        .map(|&pid| wait_child(pid, Duration::from_secs(20)))
        .collect();
    if statuses.iter().any(Option::is_none) {
        kill_all(&waiters);
        panic!("waiters never got the lock after the unlock: {statuses:?}");
    }
    assert!(
        statuses.iter().all(|s| *s == Some(0)),
        "every waiter gets the lock: {statuses:?}"
    );
    assert!(took < PROMPT, "the lookup took {took:?}");
    assert!(unlock_took < PROMPT, "the unlock took {unlock_took:?}");
    assert!(
        rss_growth < 4096,
        "the daemon grew by {rss_growth} KiB for {WAITERS} parked lock waiters"
    );
    m.unmount();
}

fn mount_tmpfs(at: &Path) {
    let target = CString::new(at.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated strings; data may be null.
    let rc = unsafe {
        libc::mount(
            c"lanefs-test-stacked".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "mounting tmpfs: {}", std::io::Error::last_os_error());
}

fn unmount_lazily(at: &Path) {
    let target = CString::new(at.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
}

fn mounts_at(path: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(&*path.to_string_lossy()))
        .map(|l| l.split(" - ").nth(1).unwrap_or("").to_string())
        .collect()
}

/// SIGTERM to a daemon whose mount has another mount stacked on it (here a tmpfs on the
/// same mount point): the daemon ends its own connection and exits, and the stacked mount
/// stays where it is, with its files. (The old shutdown unmounted by path, which detaches
/// whatever is on top: the stacked mount.)
#[test]
fn sigterm_leaves_a_mount_stacked_on_ours_alone() {
    let _serial = serial();
    let m = Mount::null(&[]);
    let mountpoint: PathBuf = m.mountpoint.clone();
    mount_tmpfs(&mountpoint);
    let cleanup = |mp: &Path| {
        // The tmpfs first (it is on top), then our dead mount under it.
        unmount_lazily(mp);
        unmount_lazily(mp);
    };
    std::fs::write(mountpoint.join("kept"), b"stacked").unwrap();
    // SAFETY: signalling the daemon we started.
    unsafe { libc::kill(m.pid as i32, libc::SIGTERM) };
    let exited = wait_until(Duration::from_secs(15), || !process_alive(m.pid));
    let stack = mounts_at(&mountpoint);
    let kept = std::fs::read(mountpoint.join("kept"));
    cleanup(&mountpoint);
    assert!(exited, "the daemon did not exit after SIGTERM");
    assert!(
        stack.iter().any(|fs| fs.starts_with("tmpfs ")),
        "the mount stacked on ours was detached: {stack:?}"
    );
    assert_eq!(kept.expect("the stacked mount's file"), b"stacked");
}

/// An open that waits on the host for a lease break (another process holds a read lease on
/// the file, and the open is for writing) must not hold a queue: a lookup from the same CPU
/// (over /dev/fuse: with one queue) is served meanwhile, and the open completes once the
/// lease goes.
#[test]
fn an_open_waiting_for_a_lease_break_holds_no_queue() {
    use std::os::fd::AsRawFd;
    let _serial = serial();
    let (_src, m, lease_holder) = mount_with_a_read_lease("liveness-lease", &[]);
    let target = m.path("leased");
    let (opened_tx, opened) = mpsc::channel();
    std::thread::spawn(move || {
        pin_to(0);
        let start = Instant::now();
        let file = std::fs::OpenOptions::new().write(true).open(&target);
        let _ = opened_tx.send((start.elapsed(), file.map(drop)));
    });
    // Let the open reach the host and wait there.
    std::thread::sleep(Duration::from_millis(500));
    let root = m.mountpoint.clone();
    let probe = timed_on_cpu0(PROMPT * 2, move || fresh_lookup(&root, "lease"));
    // SAFETY: fcntl on an fd we hold: the lease goes, the open proceeds.
    unsafe { libc::fcntl(lease_holder.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    let (open_took, open_result) = opened
        .recv_timeout(Duration::from_secs(10))
        .expect("the open completes once the lease is gone");
    open_result.expect("the open for writing");
    let (took, kind) = probe.unwrap_or_else(|| {
        panic!("a lookup from CPU 0 hung behind an open waiting for a lease break")
    });
    assert_eq!(kind, std::io::ErrorKind::NotFound);
    assert!(took < PROMPT, "the lookup took {took:?}");
    assert!(
        open_took >= Duration::from_millis(400),
        "the open took only {open_took:?}: the lease did not hold it, so this proves nothing"
    );
    drop(lease_holder);
    m.unmount();
}

/// Opens waiting for a host lease break, more than the offload pool has threads (4 per
/// node), must leave the pool free: a truncate (always answered from the pool) of another
/// file completes at once, and every open completes once the lease goes. The old code
/// waited in a blocking open on a pool thread per open, so the truncate waited for the lease.
#[test]
fn opens_waiting_for_a_lease_break_leave_the_offload_pool_free() {
    const OPENS: usize = 6;
    let _serial = serial();
    let (src, m, lease_holder) =
        mount_with_a_read_lease("liveness-lease-pool", &[("other", &[7u8; 1 << 20])]);
    let (opened_tx, opened) = mpsc::channel();
    for _ in 0..OPENS {
        let (target, opened_tx) = (m.path("leased"), opened_tx.clone());
        std::thread::spawn(move || {
            pin_to(0);
            let start = Instant::now();
            let file = std::fs::OpenOptions::new().write(true).open(&target);
            let _ = opened_tx.send((start.elapsed(), file.map(drop)));
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    let waited = (0..OPENS).map(|_| {
        let (took, result) = opened
            .recv_timeout(Duration::from_secs(10))
            .expect("every open completes once the lease is gone");
        (took, result.map(drop))
    });
    a_truncate_stays_prompt_while_leases_hold(&src, &m, &[&lease_holder], waited, "open");
    drop(lease_holder);
    m.unmount();
}

/// Truncates by path of a file a host process holds a lease on (truncate(2) opens it for
/// writing, which breaks the lease) wait for the break on the wait list, as opens do: they
/// hold no offload thread, so a truncate of another file stays prompt, and each completes
/// once the holder lets go. Each held an offload thread in the open for up to the host's
/// lease-break-time (45 s) before.
#[test]
fn path_truncates_waiting_for_a_lease_break_leave_the_offload_pool_free() {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    // One truncate per file (the kernel runs one truncate of an inode at a time), more
    // files than the offload pool has threads.
    const FILES: usize = 6;
    let _serial = serial();
    let names: Vec<String> = (1..FILES).map(|i| format!("leased-{i}")).collect();
    let mut extra: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"data"[..])).collect();
    let other_bytes = vec![7u8; 1 << 20];
    extra.push(("other", &other_bytes));
    let (src, m, lease_holder) = mount_with_a_read_lease("liveness-lease-truncate", &extra);
    let mut holders = vec![lease_holder];
    for name in &names {
        let holder = File::open(src.path().join(name)).unwrap();
        // SAFETY: fcntl on an fd we hold.
        let rc = unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        assert_eq!(
            rc,
            0,
            "lease on {name}: {}",
            std::io::Error::last_os_error()
        );
        holders.push(holder);
    }
    let (done_tx, done) = mpsc::channel();
    for name in std::iter::once("leased").chain(names.iter().map(String::as_str)) {
        let path = std::ffi::CString::new(m.path(name).as_os_str().as_bytes()).unwrap();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            pin_to(0);
            let start = Instant::now();
            // SAFETY: a NUL-terminated path we own.
            let rc = unsafe { libc::truncate(path.as_ptr(), 1) };
            let result = (rc == 0)
                .then_some(())
                .ok_or_else(std::io::Error::last_os_error);
            let _ = done_tx.send((start.elapsed(), result));
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    let holding: Vec<&File> = holders.iter().collect();
    let waited = (0..FILES).map(|_| {
        done.recv_timeout(Duration::from_secs(10))
            .expect("every truncate completes once the leases are gone")
    });
    a_truncate_stays_prompt_while_leases_hold(&src, &m, &holding, waited, "truncate");
    for name in std::iter::once("leased").chain(names.iter().map(String::as_str)) {
        assert_eq!(std::fs::metadata(src.path().join(name)).unwrap().len(), 1);
    }
    drop(holders);
    m.unmount();
}

/// With requests waiting for host lease breaks (`waited` yields each one's time and
/// outcome once it completes), a truncate of "other" from CPU 0 is answered at once; then
/// the `holders` let go of their leases, and every waiting request completes, having
/// waited (else the test proves nothing). `what` names the waiting requests.
fn a_truncate_stays_prompt_while_leases_hold(
    src: &TempDir,
    m: &Mount,
    holders: &[&File],
    waited: impl Iterator<Item = (Duration, std::io::Result<()>)>,
    what: &str,
) {
    use std::os::fd::AsRawFd;
    let other = m.path("other");
    let probe = timed_on_cpu0(PROMPT * 2, move || {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&other)
            .unwrap();
        file.set_len(4096)
    });
    for holder in holders {
        // SAFETY: fcntl on an fd we hold: the lease goes, the waiting requests proceed.
        unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
    let mut completed = 0;
    for (took, result) in waited {
        result.unwrap_or_else(|e| panic!("a waiting {what}: {e}"));
        assert!(
            took >= Duration::from_millis(400),
            "a {what} took only {took:?}: the lease did not hold it, so this proves nothing"
        );
        completed += 1;
    }
    assert!(
        completed > 0,
        "no {what} completed once the leases were gone"
    );
    let (took, truncated) = probe.unwrap_or_else(|| {
        panic!("a truncate waited behind {what}s waiting for a lease break (offload pool used up)")
    });
    truncated.unwrap();
    assert!(took < PROMPT, "the truncate took {took:?}");
    assert_eq!(
        std::fs::metadata(src.path().join("other")).unwrap().len(),
        4096
    );
}

/// The daemon's offload threads (started on first use).
fn offload_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            t.as_ref().is_ok_and(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .unwrap_or_default()
                    .starts_with("lanefs-offload")
            })
        })
        .count()
}

/// What goes to the offload pool: over /dev/fuse (every queue its own worker, any idle one
/// takes the next request) fsync and readdirplus are answered in place; over io_uring a
/// small directory's readdirplus is too, while a large one's and fsync go to the pool. The
/// old code offloaded both always, starting a pool thread for `ls -l` of a small directory.
#[test]
fn fsync_and_small_listings_stay_on_the_worker_unless_it_serves_a_cpu() {
    let _serial = serial();
    let src = TempDir::new("liveness-offload-choice");
    std::fs::create_dir(src.path().join("small")).unwrap();
    std::fs::create_dir(src.path().join("large")).unwrap();
    for i in 0..5 {
        std::fs::write(src.path().join(format!("small/f{i}")), b"x").unwrap();
    }
    for i in 0..500 {
        std::fs::write(
            src.path()
                .join(format!("large/file-with-a-longer-name-{i}")),
            b"x",
        )
        .unwrap();
    }
    let m = Mount::start(src.path().to_str().unwrap(), &["--queues", "1"]);
    let listed = |dir: &str| {
        std::fs::read_dir(m.path(dir))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().metadata().is_ok())
            .count()
    };
    assert_eq!(listed("small"), 5);
    assert!(m.op_count("readdirplus") > 0, "ls -l used readdirplus");
    assert_eq!(offload_threads(m.pid), 0, "a small listing was offloaded");
    assert_eq!(listed("large"), 500);
    let after_large = offload_threads(m.pid);
    let file = File::options()
        .write(true)
        .open(m.path("small/f0"))
        .unwrap();
    file.write_all_at(b"y", 0).unwrap();
    file.sync_all().unwrap();
    let after_fsync = offload_threads(m.pid);
    if m.over_uring() {
        assert!(
            after_large > 0,
            "a large listing was answered on the ring's worker"
        );
    } else {
        assert_eq!(after_large, 0, "readdirplus was offloaded over /dev/fuse");
        assert_eq!(after_fsync, 0, "fsync was offloaded over /dev/fuse");
    }
    drop(file);
    m.unmount();
}

/// The ring's kicker stats our mount's root only: with another FUSE mount bound on our mount
/// point, a parked lock waiter (which asks for a kick after 10 ms of silence) must not make
/// the kicker send that other mount a GETATTR. The old kicker statted the mount point by
/// path, reaching whatever was mounted on top (which could be another user's file system,
/// and could block it). Over /dev/fuse there is no kicker: the check holds trivially.
#[test]
fn the_kicker_never_touches_a_mount_stacked_on_ours() {
    let _serial = serial();
    let (_src, m, holder, c_target) = locked_file_on_mount("4");
    let other = Mount::null(&[]);
    let mut gate = [0; 2];
    // SAFETY: pipe fills two fds into the array.
    assert_eq!(unsafe { libc::pipe(gate.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes raw syscalls (no allocation, no locks) before _exit.
    let waiter = unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            libc::close(gate[1]);
            // Opened before the other mount is stacked: the lock goes to ours.
            let fd = libc::open(c_target.as_ptr(), libc::O_RDWR);
            if fd < 0 {
                libc::_exit(2);
            }
            let mut byte = 0u8;
            libc::read(gate[0], (&raw mut byte).cast(), 1);
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as i16;
            fl.l_whence = libc::SEEK_SET as i16;
            let rc = libc::fcntl(fd, libc::F_SETLKW, &fl);
            libc::_exit(if rc == 0 { 0 } else { 3 });
        }
        libc::close(gate[0]);
        pid
    };
    std::thread::sleep(Duration::from_millis(200));
    let bind = |from: &Path, to: &Path| {
        let (from, to) = (
            CString::new(from.as_os_str().as_bytes()).unwrap(),
            CString::new(to.as_os_str().as_bytes()).unwrap(),
        );
        // SAFETY: valid NUL-terminated strings; no data.
        unsafe {
            libc::mount(
                from.as_ptr(),
                to.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        }
    };
    assert_eq!(
        bind(&other.mountpoint, &m.mountpoint),
        0,
        "binding the other mount on ours: {}",
        std::io::Error::last_os_error()
    );
    let before = other.op_count("getattr");
    // SAFETY: closing our end of the gate: the child's read returns and it locks.
    unsafe { libc::close(gate[1]) };
    // The request parks in our daemon (ours cannot be asked through the mount point now),
    // and then several kicks' worth of silence pass.
    std::thread::sleep(Duration::from_millis(400));
    let parked = wait_child(waiter, Duration::ZERO).is_none();
    let after = other.op_count("getattr");
    set_lock(&holder, libc::F_UNLCK).unwrap();
    let status = wait_child(waiter, Duration::from_secs(10));
    unmount_lazily(&m.mountpoint);
    assert!(parked, "the waiter did not wait for the lock");
    assert_eq!(status, Some(0), "the waiter got its lock");
    assert_eq!(
        after,
        before,
        "the kicker sent the mount stacked on ours {} GETATTRs",
        after - before
    );
    drop(holder);
    other.unmount();
    m.unmount();
}

/// Blocking lock requests that reach one CPU's ring all at once, more than it has entries
/// (depth 1): the kernel queues the ones that find no free entry, and hands a queued request
/// over only at a commit, never at the REGISTER of a spare. Every one of them parks, so
/// nothing is committed: without the ring's kicker they wait for some unrelated request or
/// answer on that CPU (here 24 took 2.2 s instead of 0.6 s with it; in the full suite, 25 of
/// 256 once waited for minutes). Nothing of the test touches the mount while it waits (the
/// count comes from the control socket).
#[test]
fn lock_waiters_arriving_together_all_reach_the_daemon() {
    const WAITERS: usize = 24;
    let _serial = serial();
    let (_src, m, holder, c_target) = locked_file_on_mount("1");
    let mut gate = [0; 2];
    // SAFETY: pipe fills two fds into the array.
    assert_eq!(unsafe { libc::pipe(gate.as_mut_ptr()) }, 0);
    let waiters: Vec<libc::pid_t> = (0..WAITERS)
        // SAFETY: the child only makes raw syscalls (no allocation, no locks) before _exit.
        .map(|_| unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
            if pid == 0 {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
                libc::close(gate[1]);
                let fd = libc::open(c_target.as_ptr(), libc::O_RDWR);
                if fd < 0 {
                    libc::_exit(2);
                }
                // Every waiter opens first, then all lock at once when the gate opens, at a
                // real-time priority: the ring's worker (on CPU 0 too) cannot run until
                // every one of them has sent its request and sleeps, so the kernel has to
                // queue all but the first.
                let param = libc::sched_param { sched_priority: 1 };
                libc::sched_setscheduler(0, libc::SCHED_FIFO, &param);
                let mut byte = 0u8;
                libc::read(gate[0], (&raw mut byte).cast(), 1);
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = libc::F_WRLCK as i16;
                fl.l_whence = libc::SEEK_SET as i16;
                let rc = libc::fcntl(fd, libc::F_SETLKW, &fl);
                libc::_exit(if rc == 0 { 0 } else { 3 });
            }
            pid
        })
        .collect();
    // SAFETY: closing our ends; the children's reads return at once (end of file).
    unsafe {
        libc::close(gate[0]);
        std::thread::sleep(Duration::from_millis(300));
        libc::close(gate[1]);
    }
    let all_waiting = wait_until(Duration::from_secs(10), || {
        m.counter("lock_waiters") == WAITERS as u64
    });
    let seen = m.counter("lock_waiters");
    let kill_all = || {
        for &pid in &waiters {
            // SAFETY: signalling our own children.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in &waiters {
            wait_child(pid, Duration::from_secs(10));
        }
    };
    if !all_waiting {
        kill_all();
        panic!("{seen} of {WAITERS} lock requests reached the daemon: the rest stayed queued");
    }
    assert_kickers_hold_no_connection(m.pid);
    set_lock(&holder, libc::F_UNLCK).unwrap();
    drop(holder);
    for &pid in &waiters {
        assert_eq!(
            wait_child(pid, Duration::from_secs(20)),
            Some(0),
            "waiter {pid}"
        );
    }
    m.unmount();
}

/// A ring's kicker sends a GETATTR to our own mount, which the kernel waits out
/// uninterruptibly once a worker took it; a kicker sharing the daemon's descriptors kept
/// its /dev/fuse and ring descriptors open when the daemon was killed mid-kick, so the
/// connection was never aborted and the process and its mount hung for good (a test's
/// kill -9 left one for two hours). Each kicker has a table of its own without them.
/// Over io_uring (the kicks above started the kickers) at least one must be found.
fn assert_kickers_hold_no_connection(pid: u32) {
    let mut kickers = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("lanefs-kick") {
            continue;
        }
        kickers += 1;
        for fd in std::fs::read_dir(task.path().join("fd")).unwrap().flatten() {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            let target = target.to_string_lossy();
            assert!(
                !target.contains("/dev/fuse") && !target.contains("io_uring"),
                "kicker {comm:?} holds {target}"
            );
        }
    }
    if std::env::var("LANEFS_TEST_TRANSPORT").as_deref() != Ok("dev") {
        assert!(kickers > 0, "no kicker ran");
    }
}

/// `lseek(fd, 0, whence)` through the mount (SEEK_DATA and SEEK_HOLE reach the daemon).
fn seek(file: &File, whence: i32) -> std::io::Result<i64> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is open for the call.
    match unsafe { libc::lseek(file.as_raw_fd(), 0, whence) } {
        -1 => Err(std::io::Error::last_os_error()),
        at => Ok(at),
    }
}

/// The volume: an fsync and a close that wait for the database (another process holds
/// SQLite's write lock, so their commits cannot start) hold no queue. lseek and lookups
/// from the same CPU are answered at once (seed 002), and both finish with their data once
/// the lock is free. The old volume answered them on the worker: over io_uring the lseek
/// waited for the lock, and over /dev/fuse on 2 CPUs the two waits took both workers.
/// (Not an lseek of the file being fsynced: the kernel holds that
/// inode's lock across FSYNC and takes it for SEEK_DATA.)
#[test]
fn volume_commits_waiting_for_the_database_hold_no_queue() {
    let _serial = serial();
    let volume = common::volume::Volume::format("liveness-busy-commit");
    let m = volume.mount(&[]);
    let open = |name: &str| {
        File::options()
            .create_new(true)
            .read(true)
            .write(true)
            .open(m.path(name))
            .unwrap()
    };
    let (waiting, closing, other) = (open("waiting"), open("closing"), open("other"));
    for file in [&waiting, &closing, &other] {
        file.write_all_at(&[1u8; 100_000], 0).unwrap();
        file.sync_all().unwrap();
    }
    // Bytes above the inline size: the commits write blocks, then wait for the lock.
    waiting.write_all_at(&[2u8; 100_000], 0).unwrap();
    closing.write_all_at(&[3u8; 100_000], 0).unwrap();
    let holder = rusqlite::Connection::open(&volume.db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let syncing = waiting.try_clone().unwrap();
    for (what, file) in [("fsync", syncing), ("close", closing)] {
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            pin_to(0);
            let result = if what == "fsync" {
                file.sync_all()
            } else {
                // SAFETY: the fd is ours; `into_raw_fd` gave up the File's ownership.
                match unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(file)) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            };
            let _ = done_tx.send((what, result));
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        done_rx.try_recv().is_err(),
        "an fsync or close did not wait for the database's lock"
    );
    let root = m.path("");
    let probed = timed_on_cpu0(PROMPT, move || {
        (
            seek(&other, libc::SEEK_DATA),
            seek(&other, libc::SEEK_HOLE),
            fresh_lookup(&root, "busy"),
        )
    });
    holder.execute_batch("COMMIT").unwrap();
    for _ in 0..2 {
        let (what, result) = done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("an fsync or close never finished after the lock was let go");
        result.unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let (_, (data, hole, lookup)) = probed.expect("an lseek from CPU 0 waited for a commit");
    assert_eq!(data.unwrap(), 0);
    assert_eq!(hole.unwrap(), 100_000);
    assert_eq!(lookup, std::io::ErrorKind::NotFound);
    drop(waiting);
    assert_eq!(
        std::fs::read(m.path("waiting")).unwrap(),
        vec![2u8; 100_000]
    );
    assert_eq!(
        std::fs::read(m.path("closing")).unwrap(),
        vec![3u8; 100_000]
    );
    m.unmount();
    volume.assert_clean();
}
