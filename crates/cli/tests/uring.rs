//! The io_uring transport on real mounts: every CPU's ring answers (with idle workers polling
//! or sleeping at once), unmounting with requests in flight ends every caller and the daemon,
//! and `auto` falls back to /dev/fuse (and `uring` refuses) when the kernel's module parameter
//! is off or when this process may not create an io_uring (kernel.io_uring_disabled).
//!
//! These tests set /sys/module/fuse/parameters/enable_uring themselves (root only) and put
//! back the value they found; a lock keeps them from doing so concurrently.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{Mount, is_mounted, lanefs, process_alive, wait_until};

const PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Serialises the tests of this file: each needs the module parameter at its own value.
static PARAMETER_LOCK: Mutex<()> = Mutex::new(());

/// Holds the module parameter at a value for one test and restores the old one on drop.
struct Parameter {
    old: String,
    _serial: MutexGuard<'static, ()>,
}

impl Parameter {
    /// None (and the test is skipped) on kernels without FUSE over io_uring.
    fn set(value: &str) -> Option<Parameter> {
        let serial = PARAMETER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(old) = std::fs::read_to_string(PARAMETER) else {
            eprintln!("{PARAMETER} missing (no FUSE io_uring in this kernel): skipping");
            return None;
        };
        std::fs::write(PARAMETER, value).expect("writing enable_uring (tests run as root)");
        Some(Parameter {
            old: old.trim().to_string(),
            _serial: serial,
        })
    }
}

impl Drop for Parameter {
    fn drop(&mut self) {
        let _ = std::fs::write(PARAMETER, &self.old);
    }
}

fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    lanefs_fuse::topology::parse_cpu_list(&text).unwrap()
}

fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; cpu is an online CPU number below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "pinning a client to CPU {cpu}"
        );
    }
}

#[test]
fn a_request_from_every_cpu_is_answered_on_that_cpus_ring() {
    let Some(_param) = Parameter::set("Y") else {
        return;
    };
    // The default (workers poll 50 us before sleeping) and workers that sleep at once.
    for poll in ["50", "0"] {
        every_cpu_is_answered(&["--transport", "uring", "--poll-us", poll]);
    }
}

fn every_cpu_is_answered(args: &[&str]) {
    let m = Mount::null(args);
    assert!(m.over_uring(), "{}", m.line);
    const ROUNDS: u64 = 200;
    let clients: Vec<_> = online_cpus()
        .into_iter()
        .map(|cpu| {
            let data = m.path("data");
            std::thread::spawn(move || {
                pin_to(cpu);
                let file = File::open(&data).unwrap();
                let mut buf = vec![0u8; 4096];
                for round in 0..ROUNDS {
                    std::fs::metadata(&data).unwrap();
                    assert_eq!(file.read_at(&mut buf, round * 4096).unwrap(), 4096);
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a pinned client failed");
    }
    let stats = m.stats();
    assert_eq!(stats["transport"], "io_uring");
    let queues = stats["queues"].as_array().unwrap();
    for cpu in online_cpus() {
        let ring = queues
            .iter()
            .find(|q| q["transport"] == "io_uring" && q["cpu"] == cpu)
            .unwrap_or_else(|| panic!("no ring for CPU {cpu}: {queues:?}"));
        // Direct-I/O reads bypass the page cache: every one is a request on the caller's CPU.
        assert!(
            ring["requests"].as_u64().unwrap() >= ROUNDS,
            "CPU {cpu}'s ring served too little: {queues:?}"
        );
        assert!(ring["node"].is_u64(), "{ring}");
    }
    m.unmount();
}

/// Starts `threads` readers looping on `data` until an error or `stop`; each returns how
/// many reads it completed.
fn readers(
    data: std::path::PathBuf,
    threads: usize,
    reopen: bool,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..threads)
        .map(|i| {
            let (data, stop) = (data.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                let mut buf = vec![0u8; 4096];
                let Ok(mut file) = File::open(&data) else {
                    return reads;
                };
                while !stop.load(Ordering::Relaxed) {
                    if file.read_at(&mut buf, (i as u64 + reads) * 4096).is_err() {
                        break;
                    }
                    reads += 1;
                    if reopen {
                        // After a lazy unmount the path no longer leads to the mount.
                        match File::open(&data) {
                            Ok(f) => file = f,
                            Err(_) => break,
                        }
                    }
                }
                reads
            })
        })
        .collect()
}

/// Waits for every reader, failing if one does not finish within `limit`.
fn join_all(handles: Vec<std::thread::JoinHandle<u64>>, limit: Duration) -> u64 {
    let start = Instant::now();
    assert!(
        wait_until(limit, || handles.iter().all(|h| h.is_finished())),
        "readers still blocked {:?} after the unmount",
        start.elapsed()
    );
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

#[test]
fn unmount_with_requests_in_flight_ends_every_caller_and_the_daemon() {
    let Some(_param) = Parameter::set("Y") else {
        return;
    };
    // A lazy unmount while readers reopen the file: they run out of the mount one by one,
    // the connection ends with the last close, and the daemon exits.
    let m = Mount::null(&["--transport", "uring", "--queue-depth", "2"]);
    assert!(m.over_uring(), "{}", m.line);
    let stop = Arc::new(AtomicBool::new(false));
    let handles = readers(m.path("data"), 16, true, &stop);
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new(lanefs())
        .args(["umount", "--lazy"])
        .arg(&m.mountpoint)
        .status()
        .unwrap();
    assert!(status.success());
    let reads = join_all(handles, Duration::from_secs(10));
    assert!(reads > 0, "the readers never got going");
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(m.pid)),
        "daemon still running after the lazy unmount and the last close"
    );
    assert!(!is_mounted(&m.mountpoint));

    // SIGTERM while readers hold their files open: the daemon aborts the connection after
    // its grace period, every blocked or later read fails, and the daemon exits.
    let m = Mount::null(&["--transport", "uring"]);
    let handles = readers(m.path("data"), 16, false, &stop);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(m.pid as i32, libc::SIGTERM) };
    join_all(handles, Duration::from_secs(15));
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(m.pid)),
        "daemon still running after SIGTERM"
    );
    assert!(!is_mounted(&m.mountpoint));
}

#[test]
fn with_the_parameter_off_auto_falls_back_and_uring_refuses() {
    let Some(_param) = Parameter::set("N") else {
        return;
    };
    let m = Mount::null(&["--transport", "auto"]);
    assert!(!m.over_uring(), "{}", m.line);
    assert!(m.line.contains("transport /dev/fuse"), "{}", m.line);
    assert!(
        m.line.contains(&format!("echo Y > {PARAMETER}")),
        "the mount line should say how to turn io_uring on: {}",
        m.line
    );
    assert_eq!(m.stats()["transport"], "/dev/fuse");
    m.unmount();

    // Both spellings; daemon mode too, so a refused mount must not leave a daemon behind.
    let tmp = common::TempDir::new("refused");
    let forms: [&[&str]; 2] = [&["--transport", "uring"], &["-d", "-o", "transport=uring"]];
    for form in forms {
        let out = Command::new(lanefs())
            .arg("mount")
            .args(form)
            .arg("null:")
            .arg(tmp.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{form:?} mounted: {stderr}");
        assert!(
            stderr.contains("io_uring is off") && stderr.contains(PARAMETER),
            "{form:?}: unclear refusal: {stderr}"
        );
        assert!(!is_mounted(tmp.path()), "{form:?} left a mount behind");
    }
}

/// Holds kernel.io_uring_disabled at 2 (io_uring_setup refused to every process) and restores
/// the old value on drop. Taken while the module parameter is held, so under its lock.
struct SetupDisabled(String);

const SETUP_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

impl SetupDisabled {
    fn set() -> Option<SetupDisabled> {
        let Ok(old) = std::fs::read_to_string(SETUP_SYSCTL) else {
            eprintln!("{SETUP_SYSCTL} missing (kernel before 6.6): skipping");
            return None;
        };
        std::fs::write(SETUP_SYSCTL, "2").expect("writing io_uring_disabled (tests run as root)");
        Some(SetupDisabled(old.trim().to_string()))
    }
}

impl Drop for SetupDisabled {
    fn drop(&mut self) {
        let _ = std::fs::write(SETUP_SYSCTL, &self.0);
    }
}

#[test]
fn with_io_uring_setup_refused_auto_falls_back_and_uring_refuses() {
    let Some(_param) = Parameter::set("Y") else {
        return;
    };
    let Some(_disabled) = SetupDisabled::set() else {
        return;
    };
    // FUSE offers io_uring, but this process cannot create one: INIT must not ask for it.
    let m = Mount::null(&["--transport", "auto"]);
    assert!(!m.over_uring(), "{}", m.line);
    assert!(
        m.line.contains("may not create an io_uring") && m.line.contains("io_uring_disabled"),
        "the mount line should say why /dev/fuse serves: {}",
        m.line
    );
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        File::open(m.path("data"))
            .unwrap()
            .read_at(&mut buf, 0)
            .unwrap(),
        4096
    );
    assert_eq!(m.stats()["transport"], "/dev/fuse");
    m.unmount();

    let tmp = common::TempDir::new("setup-refused");
    let out = Command::new(lanefs())
        .args(["mount", "--transport", "uring", "null:"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted: {stderr}");
    assert!(
        stderr.contains("may not create an io_uring"),
        "unclear refusal: {stderr}"
    );
    assert!(!is_mounted(tmp.path()), "a refused mount was left behind");
}

#[test]
fn answers_from_other_threads_reach_the_ring() {
    let Some(_param) = Parameter::set("Y") else {
        return;
    };
    // Every read is answered after its handler returned, from a thread of its own: the
    // answer travels through the ring's deferred list and wakes its worker.
    let m = Mount::null(&[
        "--transport",
        "uring",
        "--queue-depth",
        "2",
        "--defer-reads",
    ]);
    assert!(m.over_uring(), "{}", m.line);
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let data = m.path("data");
            std::thread::spawn(move || {
                let file = File::open(&data).unwrap();
                let mut buf = vec![1u8; 8192];
                for round in 0..100u64 {
                    let n = file.read_at(&mut buf, (i * 100 + round) * 8192).unwrap();
                    assert_eq!(n, 8192);
                    assert!(buf.iter().all(|&b| b == 0));
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a reader failed");
    }
    assert!(m.op_count("read") >= 800);
    m.unmount();
}
