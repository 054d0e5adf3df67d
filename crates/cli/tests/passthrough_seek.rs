//! Seeks and stats never wait for the write gate (seed 002).
//!
//! The gate must be held a long, known time by the server while nothing on the client side
//! holds the inode lock (the kernel's FUSE client takes it itself for SEEK_END/DATA/HOLE, and
//! around truncate, fallocate and extending direct writes). An open with O_TRUNC fits: the
//! server takes the gate exclusive and opens the host file for writing, and the client holds
//! no inode lock meanwhile. To make that open last, the test holds a read *lease* on the host
//! file: the server's open for writing waits in the host kernel until the test lets the lease
//! go, with the gate held all along. Meanwhile another thread probes the same file through
//! another fd with lseek(SEEK_END/SEEK_DATA/SEEK_HOLE), fstat and stat, with zero attribute
//! timeouts so every probe reaches the server. If the server's lseek or getattr took the
//! gate, the probes made during the hold would wait for it.

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::sys::{self, Errno};
use common::{Mount, TempDir, wait_until};

/// How long the lease keeps the O_TRUNC open (and so the gate) waiting.
const HOLD: Duration = Duration::from_millis(1000);

fn take_lease(fd: &impl AsRawFd) -> Result<(), Errno> {
    // SAFETY: fcntl on an fd we hold.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

fn drop_lease(fd: &impl AsRawFd) {
    // SAFETY: fcntl on an fd we hold.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    what: &'static str,
    start: Instant,
    took: Duration,
}

#[test]
fn seeks_and_stats_do_not_wait_for_a_held_write_gate() {
    // A lease break signals the holder (SIGIO by default, which would kill us).
    // SAFETY: setting a signal disposition.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    let variants: [&[&str]; 2] = [
        &["--direct-io", "--attr-timeout", "0", "--entry-timeout", "0"],
        &[
            "--no-passthrough",
            "--attr-timeout",
            "0",
            "--entry-timeout",
            "0",
        ],
    ];
    for args in variants {
        let source = TempDir::new("seek-src");
        let host = source.path().join("big");
        let m = Mount::passthrough(source.path(), args);
        let path = m.path("big");
        for round in 0..3 {
            // Data at 0 and at 1 MiB, a hole between, 4 MiB long.
            {
                let f = sys::open(&host, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)
                    .unwrap();
                sys::pwrite(&f, &[1u8; 65536], 0).unwrap();
                sys::pwrite(&f, &[2u8; 65536], 1 << 20).unwrap();
                sys::ftruncate(&f, 4 << 20).unwrap();
            }
            let probe_fd = sys::open(&path, libc::O_RDONLY, 0).unwrap();
            assert_eq!(sys::lseek(&probe_fd, 0, libc::SEEK_END).unwrap(), 4 << 20);
            // The lease needs no writer of the file anywhere: the server closes its fds of
            // the last round asynchronously, so retry a moment.
            let lease_fd = sys::open(&host, libc::O_RDONLY, 0).unwrap();
            assert!(
                wait_until(Duration::from_secs(5), || take_lease(&lease_fd).is_ok()),
                "{args:?}: cannot take a read lease: {:?}",
                take_lease(&lease_fd)
            );

            let before = (m.op_count("lseek"), m.op_count("getattr"));
            let stop = Arc::new(AtomicBool::new(false));
            let probes = Arc::new(Mutex::new(Vec::<Probe>::new()));
            let prober = {
                let (stop, probes, path) = (stop.clone(), probes.clone(), path.clone());
                std::thread::spawn(move || {
                    let mut local = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let ops: [(&'static str, &dyn Fn()); 5] = [
                            ("SEEK_END", &|| {
                                let _ = sys::lseek(&probe_fd, 0, libc::SEEK_END);
                            }),
                            ("SEEK_DATA", &|| {
                                let _ = sys::lseek(&probe_fd, 4096, libc::SEEK_DATA);
                            }),
                            ("SEEK_HOLE", &|| {
                                let _ = sys::lseek(&probe_fd, 0, libc::SEEK_HOLE);
                            }),
                            ("fstat", &|| {
                                let _ = sys::fstat(&probe_fd);
                            }),
                            ("stat", &|| {
                                let _ = sys::stat(&path);
                            }),
                        ];
                        for (what, op) in ops {
                            let start = Instant::now();
                            op();
                            local.push(Probe {
                                what,
                                start,
                                took: start.elapsed(),
                            });
                        }
                    }
                    *probes.lock().unwrap() = local;
                })
            };
            std::thread::sleep(Duration::from_millis(50));
            let holder = {
                let path = path.clone();
                std::thread::spawn(move || {
                    let start = Instant::now();
                    let fd = sys::open(&path, libc::O_WRONLY | libc::O_TRUNC, 0);
                    (start, Instant::now(), fd.map(drop))
                })
            };
            std::thread::sleep(HOLD);
            drop_lease(&lease_fd);
            let (t0, t1, opened) = holder.join().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::Relaxed);
            prober.join().unwrap();
            drop(lease_fd);
            let after = (m.op_count("lseek"), m.op_count("getattr"));
            opened.unwrap_or_else(|e| panic!("{args:?}: the O_TRUNC open failed: {e}"));

            let window = t1 - t0;
            assert!(
                window >= HOLD / 2,
                "{args:?}: the O_TRUNC open took only {window:?}: the lease did not hold it, \
                 so this round proves nothing"
            );
            let probes = probes.lock().unwrap().clone();
            // Probes that started while the gate was held (a margin at each end).
            let margin = Duration::from_millis(20);
            let during: Vec<_> = probes
                .iter()
                .filter(|p| p.start >= t0 + margin && p.start + margin <= t1)
                .collect();
            let worst = during.iter().max_by_key(|p| p.took).copied();
            eprintln!(
                "{args:?} round {round}: gate held {window:?}; {} probes during it, worst {:?}; \
                 server saw {} LSEEK and {} GETATTR",
                during.len(),
                worst,
                after.0 - before.0,
                after.1 - before.1
            );
            // Any probe that overlapped the hold must have been quick (one that was stuck
            // started before it and lasted through it).
            let bound = window / 4;
            let slow: Vec<_> = probes
                .iter()
                .filter(|p| p.start < t1 - margin && p.start + p.took > t0 + margin)
                .filter(|p| p.took > bound)
                .collect();
            assert!(
                slow.is_empty(),
                "{args:?}: probes waited while the write gate was held {window:?}: {slow:?}"
            );
            for what in ["SEEK_END", "SEEK_DATA", "SEEK_HOLE", "fstat", "stat"] {
                assert!(
                    during.iter().filter(|p| p.what == what).count() >= 3,
                    "{args:?}: too few {what} probes while the gate was held: {}",
                    during.len()
                );
            }
            // The probes were answered by the server, not the kernel's caches.
            let seeks = probes
                .iter()
                .filter(|p| p.what == "SEEK_DATA" || p.what == "SEEK_HOLE")
                .count() as u64;
            assert!(
                after.0 - before.0 >= seeks,
                "{args:?}: only {} LSEEKs reached the server for {seeks} probes",
                after.0 - before.0
            );
            assert!(
                after.1 - before.1 >= during.len() as u64 / 5,
                "{args:?}: GETATTRs did not reach the server"
            );
            // The truncation happened.
            assert_eq!(std::fs::metadata(&host).unwrap().len(), 0);
        }
        m.unmount();
    }
}
