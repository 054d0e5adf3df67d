//! Ctrl-C and SIGTERM during a bench: the first stops the run at the next measurement (the
//! guards then unmount everything as the stack unwinds); a second one unmounts whatever is
//! still registered here, kills the servers and exits at once.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static REGISTRY: Mutex<Vec<Registered>> = Mutex::new(Vec::new());
static SCRATCH: Mutex<Option<PathBuf>> = Mutex::new(None);

struct Registered {
    id: u64,
    /// None: a server with no mount of its own (the bench's PostgreSQL).
    mountpoint: Option<PathBuf>,
    pid: Option<u32>,
}

/// Blocks the signals in this (the main) thread, so every thread created later inherits the
/// mask, and starts the thread that waits for them. Children get a clean mask from std.
pub fn install() {
    // SAFETY: plain libc calls on a local sigset; the watcher thread owns its copy.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        let set_copy = set;
        std::thread::Builder::new()
            .name("bench-signals".into())
            .spawn(move || {
                loop {
                    let mut sig = 0;
                    if libc::sigwait(&set_copy, &mut sig) != 0 {
                        continue;
                    }
                    if INTERRUPTED.swap(true, Ordering::SeqCst) {
                        eprintln!("\nlanefs bench: second signal, unmounting and exiting now");
                        emergency_cleanup();
                        libc::_exit(130);
                    }
                    eprintln!(
                        "\nlanefs bench: interrupted; finishing the current run, then \
                         unmounting (signal again to stop at once)"
                    );
                }
            })
            .ok();
    }
}

/// The bench's scratch directory, removed by an emergency exit once nothing is mounted in it.
pub fn set_scratch(path: PathBuf) {
    if let Ok(mut s) = SCRATCH.lock() {
        *s = Some(path);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Records a mount (and the process serving it) until `unregister`.
pub fn register(mountpoint: PathBuf, pid: Option<u32>) -> u64 {
    record(Some(mountpoint), pid)
}

/// Records a server process that mounts nothing (killed by an emergency exit).
pub fn register_process(pid: u32) -> u64 {
    record(None, Some(pid))
}

fn record(mountpoint: Option<PathBuf>, pid: Option<u32>) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut reg) = REGISTRY.lock() {
        reg.push(Registered {
            id,
            mountpoint,
            pid,
        });
    }
    id
}

pub fn unregister(id: u64) {
    if let Ok(mut reg) = REGISTRY.lock() {
        reg.retain(|r| r.id != id);
    }
}

/// Newest first: lazily unmounts each registered mount and kills its server; then removes
/// the scratch directory if nothing is mounted in it any more.
fn emergency_cleanup() {
    if let Ok(reg) = REGISTRY.try_lock() {
        for r in reg.iter().rev() {
            if let Some(mountpoint) = &r.mountpoint {
                let _ = super::systems::lazy_unmount(mountpoint);
            }
            if let Some(pid) = r.pid {
                // SAFETY: sending a signal has no memory effects.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
    if let Ok(Some(scratch)) = SCRATCH.try_lock().map(|s| s.clone())
        && !super::systems::has_mount_under(&scratch)
    {
        // A killed server's children (PostgreSQL's backends) may still write into it for a
        // moment after their parent died: try again while the removal finds new entries.
        for _ in 0..REMOVE_TRIES {
            if std::fs::remove_dir_all(&scratch).is_ok() || !scratch.exists() {
                break;
            }
            std::thread::sleep(REMOVE_RETRY_AFTER);
        }
    }
}

/// How often, and how far apart, an emergency exit tries to remove the scratch directory.
const REMOVE_TRIES: u32 = 20;
const REMOVE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(100);
