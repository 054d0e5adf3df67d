//! The integration tests' harness: real lanefs mounts through /dev/fuse, each under its own
//! temp dir, always unmounted (lazily) and their daemon killed when the test ends, pass or
//! fail.
#![allow(dead_code)] // each test binary uses part of the harness

pub mod launcher;
pub mod minio;
pub mod postgres;
pub mod subject;
pub mod volume;

/// Asserts that `diff -r --no-dereference` finds the two trees equal.
pub fn diff_r(a: &std::path::Path, b: &std::path::Path) {
    let out = std::process::Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .expect("running diff");
    assert!(
        out.status.success(),
        "diff -r {} {}:\n{}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deterministic bytes for file `i` (xorshift from a seed of `i`): what a test writes and
/// later compares with what it reads back.
pub fn content(i: usize, len: usize) -> Vec<u8> {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

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
    // A zombie has exited, once its other threads have too: a killed daemon's thread group
    // leader is a zombie while its other threads are still exiting, and the last of them
    // closes the process's fds (its volume lock, its intent log) only then.
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    !(field("State:").starts_with('Z') && field("Threads:") == "1")
}

/// Pins the calling thread to `cpu` (0 or 1 exist on every machine we test): a FUSE
/// request then goes to that CPU's queue.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data, written by CPU_SET and read by the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pinning to CPU {cpu}"
        );
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

/// Kills `pid` with SIGKILL and waits until it has exited (see `process_alive`), at most
/// 30 s (once, in a busy run of several kill tests, a killed daemon still ran after 10 s);
/// past that, panics with each of its threads' state and kernel stack, which say what holds
/// a killed process back.
pub fn kill_9_and_wait(pid: u32) {
    // SAFETY: sending a signal has no memory effects.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if wait_until(Duration::from_secs(30), || !process_alive(pid)) {
        return;
    }
    let mut report = String::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let path = task.path();
            let read = |name: &str| std::fs::read_to_string(path.join(name)).unwrap_or_default();
            let status = read("status");
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            };
            report.push_str(&format!(
                "thread {} ({}) {}: wchan {}\n{}",
                task.file_name().to_string_lossy(),
                field("Name:"),
                field("State:"),
                read("wchan"),
                read("stack")
            ));
        }
    }
    panic!("process {pid} still runs 30 s after SIGKILL:\n{report}");
}

/// Kills a daemon with SIGKILL and waits until its mount is dead (stat fails with ENOTCONN):
/// the process exits at once, but the kernel ends the connection only once the last
/// reference to its /dev/fuse file is gone, which io_uring's teardown of the rings releases
/// a moment later, in a work queue of its own.
pub fn kill_daemon_leaving_a_dead_mount(pid: u32, mountpoint: &Path) {
    kill_9_and_wait(pid);
    let dead = wait_until(Duration::from_secs(10), || {
        std::fs::metadata(mountpoint).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
    });
    assert!(
        dead,
        "{} still answers after its daemon was killed",
        mountpoint.display()
    );
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
        Mount::start_wrapped(&[], source, args)
    }

    /// Mounts `source`, running `lanefs` under `wrapper` (e.g. `["prlimit", "--nofile=512"]`).
    pub fn start_wrapped(wrapper: &[&str], source: &str, args: &[&str]) -> Mount {
        let dir = TempDir::new("mnt");
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(lanefs());
                c
            }
            None => Command::new(lanefs()),
        };
        let out = command
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
    ///
    /// Read here, as `lanefs stats --json` reads them, rather than by running it: a fork
    /// and exec while the test holds files open on the mount closes their duplicates in the
    /// child, and each such close is a FLUSH, which on a volume commits the file's writes.
    pub fn stats(&self) -> serde_json::Value {
        let mountpoint = lanefs_fuse::mount::absolute(&self.mountpoint).unwrap();
        let info = lanefs_fuse::mount::find_mount(&mountpoint)
            .unwrap()
            .unwrap_or_else(|| panic!("{} is not mounted", mountpoint.display()));
        let snapshot = lanefs_fuse::control::query(&info)
            .unwrap_or_else(|e| panic!("stats of {}: {e}", mountpoint.display()));
        serde_json::to_value(snapshot).unwrap()
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
        // Another test of the same process that forks (a child process, a lock probe)
        // briefly holds copies of every open fd, ours included, until it execs or exits:
        // the mount may be busy for a moment.
        let mut out = None;
        for _ in 0..50 {
            let o = Command::new(lanefs())
                .arg("umount")
                .arg(&self.mountpoint)
                .output()
                .unwrap();
            let busy = String::from_utf8_lossy(&o.stderr).contains("busy");
            out = Some(o);
            if !busy {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = out.unwrap();
        assert!(
            out.status.success(),
            "lanefs umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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

// ---- Helpers for the passthrough suites (tests/passthrough*.rs). ----

pub mod sys;

impl Mount {
    /// A passthrough mount of the host directory `source`.
    pub fn passthrough(source: &Path, args: &[&str]) -> Mount {
        Mount::start(source.to_str().expect("UTF-8 source path"), args)
    }

    /// How many fds the daemon holds open.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The first number found under `key` anywhere in the stats JSON, if any.
    pub fn stat_number(&self, key: &str) -> Option<u64> {
        find_number(&self.stats(), key)
    }

    /// A file system's own counter (`"counters": [[name, value], ...]` in the stats JSON).
    pub fn counter(&self, name: &str) -> u64 {
        let stats = self.stats();
        stats["counters"]
            .as_array()
            .and_then(|pairs| {
                pairs
                    .iter()
                    .find(|p| p[0] == name)
                    .and_then(|p| p[1].as_u64())
            })
            .unwrap_or_else(|| panic!("no counter {name:?} in {}", stats["counters"]))
    }
}

/// The first number under `key` in `v`, searched depth first.
pub fn find_number(v: &serde_json::Value, key: &str) -> Option<u64> {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(n) = map.get(key).and_then(|n| n.as_u64()) {
                return Some(n);
            }
            map.values().find_map(|v| find_number(v, key))
        }
        serde_json::Value::Array(items) => items.iter().find_map(|v| find_number(v, key)),
        _ => None,
    }
}

/// Runs `command`, asserting it exits 0; returns its stdout.
/// stress-ng's file-system stressors, with verification where they have it, on `dir` (each
/// set passes natively on Debian 12's stress-ng 0.15): every one must pass.
pub fn stress_ng_file_system(dir: &Path) {
    if Command::new("stress-ng").arg("--version").output().is_err() {
        panic!("stress-ng is not installed (scripts/setup.sh installs it)");
    }
    let sets: [&[&str]; 2] = [
        &[
            "--dir",
            "1",
            "--dentry",
            "1",
            "--fallocate",
            "1",
            "--hdd",
            "1",
            "--link",
            "1",
            "--symlink",
            "1",
            "--rename",
            "1",
            "--chmod",
            "1",
            "--xattr",
            "1",
            "--lockf",
            "1",
            "--flock",
            "1",
            "--seek",
            "1",
            "-t",
            "5s",
        ],
        &[
            "--chown",
            "1",
            "--copy-file",
            "1",
            "--fstat",
            "1",
            "--getdent",
            "1",
            "--mknod",
            "1",
            "--open",
            "1",
            "--utime",
            "1",
            "--sync-file",
            "1",
            "--filename",
            "1",
            "--fcntl",
            "1",
            "--locka",
            "1",
            "--mmap",
            "1",
            "--mmap-file",
            "--io",
            "1",
            "--readahead",
            "1",
            "--dirdeep",
            "1",
            "-t",
            "4s",
        ],
    ];
    for set in sets {
        let start = std::time::Instant::now();
        let out = Command::new("stress-ng")
            .args(set)
            .arg("--verify")
            .arg("--temp-path")
            .arg(dir)
            .current_dir(dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("successful run completed"),
            "stress-ng {set:?} on the mount failed ({}):\n{text}",
            out.status
        );
        for bad in ["fail:", "error:", "verification"] {
            assert!(!text.contains(bad), "{bad:?} in stress-ng output:\n{text}");
        }
        eprintln!("stress-ng set took {:?}", start.elapsed());
    }
}

/// The name of the one entry an extracted tarball leaves in `dir` (its top directory).
pub fn top_entry(dir: &Path) -> std::ffi::OsString {
    std::fs::read_dir(dir)
        .unwrap()
        .next()
        .expect("an empty directory")
        .unwrap()
        .file_name()
}

/// Debian's kernel source tarball (`apt-get install linux-source`), the newest there is.
pub fn kernel_tarball() -> Option<PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir("/usr/src")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("linux-source-") && name.ends_with(".tar.xz")
        })
        .collect();
    found.sort();
    found.pop()
}

/// `find ROOT -printf` of type, mode, size and link target, sorted: metadata to compare.
pub fn listing(root: &Path) -> String {
    listing_printf(root, &["-printf", "%P %y %m %s %l\n"])
}

/// `listing` without the sizes of directories (a volume's are 4096, ext4's grow with them).
pub fn listing_but_dir_sizes(root: &Path) -> String {
    listing_printf(
        root,
        &[
            "(",
            "-type",
            "d",
            "-printf",
            "%P %y %m\n",
            ")",
            "-o",
            "-printf",
            "%P %y %m %s %l\n",
        ],
    )
}

fn listing_printf(root: &Path, printf: &[&str]) -> String {
    let out = run_ok(Command::new("find").arg(".").args(printf).current_dir(root));
    let mut lines: Vec<_> = out.lines().collect();
    lines.sort_unstable();
    lines.join("\n")
}

pub fn run_ok(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sh -c script`, as root.
pub fn sh(script: &str) -> std::process::Output {
    Command::new("sh").arg("-c").arg(script).output().unwrap()
}

/// `sh -c script` as uid:gid with no supplementary groups (setpriv).
pub fn sh_as(uid: u32, gid: u32, script: &str) -> std::process::Output {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "sh", "-c", script])
        .output()
        .expect("setpriv (util-linux)")
}

/// Runs `f` on its own thread and panics if it takes longer than `limit` (a hung file-system
/// call must fail the test, not hang it; the mount guard then aborts the connection, which
/// frees the thread).
pub fn deadline<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what}: no answer within {limit:?} (hung)"),
    }
}

/// Writes 2 to /proc/sys/vm/drop_caches: the kernel forgets unused dentries and inodes.
pub fn drop_caches() {
    // SAFETY: sync has no memory effects.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches (root)");
}

/// A tmpfs mounted under a temp dir, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: TempDir,
}

impl Tmpfs {
    pub fn new(size: &str) -> Tmpfs {
        let dir = TempDir::new("tmpfs");
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={size},mode=0755"))
                .arg("tmpfs")
                .arg(&path),
        );
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if is_mounted(&self.path) {
            lazy_unmount(&self.path);
        }
    }
}

/// What a tree holds, path by path, for comparing two trees: type, permission bits, owner,
/// link count, size and a content hash of files, symlink targets, device numbers and user.*
/// and trusted.* xattrs. Times and inode numbers are left out.
pub fn tree_snapshot(root: &Path) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    snapshot_into(root, root, &mut out);
    out
}

fn snapshot_into(root: &Path, p: &Path, out: &mut std::collections::BTreeMap<String, String>) {
    let st = sys::lstat(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
    let kind = sys::file_type(st.st_mode);
    let mut desc = format!(
        "{kind} {:04o} {}:{}",
        st.st_mode & 0o7777,
        st.st_uid,
        st.st_gid
    );
    if kind != "dir" {
        desc += &format!(" nlink={} size={}", st.st_nlink, st.st_size);
    } else if !rel.is_empty() {
        desc += &format!(" nlink={}", st.st_nlink);
    }
    match kind {
        "file" => desc += &format!(" fnv={:016x}", content_fingerprint(p, st.st_size as u64)),
        "symlink" => desc += &format!(" -> {}", sys::readlink(p).unwrap()),
        "chardev" | "blockdev" => desc += &format!(" rdev={:x}", st.st_rdev),
        _ => {}
    }
    if kind != "symlink" {
        for name in sys::llistxattr(p).unwrap_or_default() {
            if name.starts_with("user.")
                || name.starts_with("trusted.")
                || name.starts_with("system.posix_acl_")
            {
                let v = sys::getxattr(p, &name, 65536)
                    .map(|(_, v)| v)
                    .unwrap_or_default();
                desc += &format!(" {name}={}", String::from_utf8_lossy(&v).escape_debug());
            }
        }
    }
    out.insert(if rel.is_empty() { ".".into() } else { rel }, desc);
    if kind == "dir" {
        let mut names: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for child in names {
            snapshot_into(root, &child, out);
        }
    }
}

/// FNV-1a of a file's content; of files over 64 MiB, of their first and last MiB (a
/// snapshot must not read gigabytes of a sparse file).
fn content_fingerprint(p: &Path, size: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    const WHOLE_MAX: u64 = 64 << 20;
    if size <= WHOLE_MAX {
        return fnv(&std::fs::read(p).unwrap());
    }
    let f = std::fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut h = Vec::with_capacity(2 << 20);
    for at in [0, size - (1 << 20)] {
        f.read_exact_at(&mut buf, at).unwrap();
        h.extend_from_slice(&buf);
    }
    fnv(&h)
}

/// FNV-1a, for content fingerprints in snapshots.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Asserts two snapshots agree, naming the first few differences.
pub fn assert_same_tree(
    what: &str,
    a: &std::collections::BTreeMap<String, String>,
    b: &std::collections::BTreeMap<String, String>,
) {
    if a == b {
        return;
    }
    let mut diffs = Vec::new();
    for key in a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        if a.get(key) != b.get(key) {
            diffs.push(format!(
                "  {key}:\n    expected {:?}\n    got      {:?}",
                a.get(key),
                b.get(key)
            ));
        }
    }
    panic!(
        "{what}: trees differ:\n{}",
        diffs[..diffs.len().min(20)].join("\n")
    );
}

/// What a test that mounts as a regular user (through fusermount3) needs: /dev/fuse open to
/// everyone while this lives (some VMs create it 0600; Debian's udev makes it 0666; the mode
/// is put back on drop), and a 0755 temp dir holding a copy of the lanefs binary, since the
/// test binary's own directory may not be reachable by that user.
pub struct UserMountKit {
    pub dir: TempDir,
    pub bin: PathBuf,
    _dev_fuse: DevFuseOpen,
}

/// Kits alive in this process, and /dev/fuse's mode before the first: the last one to go
/// puts it back. (Each kit restoring what it found raced: a kit made while another held
/// /dev/fuse open to all found it so, and one that went first took the access away from a
/// kit still mounting, whose fusermount3 then could not open /dev/fuse.)
static DEV_FUSE_OPENED: std::sync::Mutex<(usize, u32)> = std::sync::Mutex::new((0, 0));

/// One kit's share of /dev/fuse open to everyone (see `DEV_FUSE_OPENED`).
struct DevFuseOpen;

impl DevFuseOpen {
    fn take() -> DevFuseOpen {
        use std::os::unix::fs::PermissionsExt;
        let mut opened = DEV_FUSE_OPENED.lock().unwrap_or_else(|e| e.into_inner());
        if opened.0 == 0 {
            let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode();
            std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(mode | 0o666))
                .unwrap();
            opened.1 = mode;
        }
        opened.0 += 1;
        DevFuseOpen
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let mut opened = DEV_FUSE_OPENED.lock().unwrap_or_else(|e| e.into_inner());
        opened.0 -= 1;
        if opened.0 == 0 {
            let _ =
                std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(opened.1));
        }
    }
}

impl UserMountKit {
    pub fn new(tag: &str) -> UserMountKit {
        use std::os::unix::fs::PermissionsExt;
        let dev_fuse = DevFuseOpen::take();
        let mut kit = UserMountKit {
            dir: TempDir::new(tag),
            bin: PathBuf::new(),
            _dev_fuse: dev_fuse,
        };
        std::fs::set_permissions(kit.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        kit.bin = kit.dir.path().join("lanefs");
        std::fs::copy(lanefs(), &kit.bin).unwrap();
        kit
    }
}
