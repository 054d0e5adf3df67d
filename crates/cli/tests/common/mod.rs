//! The integration tests' harness: real lanefs mounts through /dev/fuse, each under its own
//! temp dir, always unmounted (lazily) and their daemon killed when the test ends, pass or
//! fail.
#![allow(dead_code)] // each test binary uses part of the harness

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn lanefs() -> &'static str {
    env!("CARGO_BIN_EXE_lanefs")
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "lanefs-test-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("creating a temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Never recurse into a mount that is still there.
        if !is_mounted(&self.0) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether `path` is a mount point (per /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .any(|line| line.split(' ').nth(4).is_some_and(|mp| mp == wanted))
}

pub fn process_alive(pid: u32) -> bool {
    // A zombie has exited; it only waits for its parent.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Polls `cond` until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn lazy_unmount(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// The transport the tests ask for: `LANEFS_TEST_TRANSPORT` (auto, uring or dev), unless a
/// test names one itself. scripts/test.sh runs the suite once per transport.
fn with_test_transport(args: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if let Ok(transport) = std::env::var("LANEFS_TEST_TRANSPORT")
        && !args.contains(&"--transport")
    {
        all.extend(["--transport".to_string(), transport]);
    }
    all
}

/// A lanefs daemon (`lanefs mount --daemon`) and its mount.
pub struct Mount {
    pub dir: TempDir,
    pub mountpoint: PathBuf,
    pub pid: u32,
    /// The line `lanefs mount` printed.
    pub line: String,
}

impl Mount {
    /// Mounts `source` with extra `lanefs mount` arguments.
    pub fn start(source: &str, args: &[&str]) -> Mount {
        let dir = TempDir::new("mnt");
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let out = Command::new(lanefs())
            .args(["mount", "--daemon"])
            .args(with_test_transport(args))
            .arg(source)
            .arg(&mountpoint)
            .output()
            .expect("running lanefs mount");
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "lanefs mount {source} failed: {}{}",
            line,
            String::from_utf8_lossy(&out.stderr)
        );
        let pid = line
            .rsplit_once("(daemon pid ")
            .and_then(|(_, rest)| rest.trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("no daemon pid in {line:?}"));
        assert!(is_mounted(&mountpoint), "{line}: but nothing is mounted");
        Mount {
            dir,
            mountpoint,
            pid,
            line,
        }
    }

    pub fn null(args: &[&str]) -> Mount {
        Mount::start("null:", args)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// Whether the mount serves over io_uring (per its mount line).
    pub fn over_uring(&self) -> bool {
        self.line.contains("transport io_uring")
    }

    /// `lanefs stats MP --json`.
    pub fn stats(&self) -> serde_json::Value {
        let out = Command::new(lanefs())
            .args(["stats", "--json"])
            .arg(&self.mountpoint)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("stats JSON")
    }

    /// The count of one operation in the stats.
    pub fn op_count(&self, op: &str) -> u64 {
        self.stats()["ops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["op"] == op)
            .map_or(0, |o| o["count"].as_u64().unwrap())
    }

    /// Unmounts with `lanefs umount` and waits for the daemon to exit.
    pub fn unmount(self) {
        let status = Command::new(lanefs())
            .arg("umount")
            .arg(&self.mountpoint)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(
            wait_until(Duration::from_secs(10), || !process_alive(self.pid)),
            "daemon {} still running after unmount",
            self.pid
        );
        assert!(!is_mounted(&self.mountpoint));
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.mountpoint) {
            lazy_unmount(&self.mountpoint);
        }
        if process_alive(self.pid)
            && !wait_until(Duration::from_secs(3), || !process_alive(self.pid))
        {
            // SAFETY: sending a signal has no memory effects.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
    }
}

/// A lanefs in the foreground, as our child: for checking how it exits.
pub struct Foreground {
    pub dir: TempDir,
    pub mountpoint: PathBuf,
    pub child: Child,
    pub line: String,
}

impl Foreground {
    pub fn start(source: &str, args: &[&str]) -> Foreground {
        let dir = TempDir::new("fg");
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mut child = Command::new(lanefs())
            .arg("mount")
            .args(with_test_transport(args))
            .arg(source)
            .arg(&mountpoint)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.starts_with("mounted "),
            "unexpected first line {line:?}"
        );
        Foreground {
            dir,
            mountpoint,
            child,
            line: line.trim().to_string(),
        }
    }

    /// Waits for the daemon to exit, returning its status.
    pub fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if is_mounted(&self.mountpoint) {
            lazy_unmount(&self.mountpoint);
        }
        if self.wait(Duration::from_secs(3)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs fio with `args` (plus JSON output) and returns its parsed report.
pub fn fio(args: &[String]) -> serde_json::Value {
    let out = Command::new("fio")
        .args(args)
        .arg("--output-format=json")
        .output()
        .expect("fio is installed (apt-get install fio)");
    assert!(
        out.status.success(),
        "fio {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // fio may print warnings before the JSON document.
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find('{').expect("fio JSON output");
    serde_json::from_str(&text[start..]).expect("fio JSON")
}
