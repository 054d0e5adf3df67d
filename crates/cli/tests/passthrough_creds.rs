//! Acting for callers other than root: a create that meets a name made on the host meanwhile,
//! supplementary groups, set-ID bits on truncate, write and chown, POSIX locks, and objects
//! on other mounts the daemon must not open. Each scenario runs natively and on the mount, as
//! real unprivileged processes (forked children that drop to `nobody`), and the outcomes must
//! match.

mod common;

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::sys;
use common::{Mount, TempDir, deadline, run_ok};

const NOBODY: u32 = 65534;
/// A group no account is in, given to `nobody` as a supplementary group where a test says so.
const GROUP: u32 = 4242;
/// Long enough that a negative entry made at the start of a scenario is still cached at its
/// end.
const ENTRY_TIMEOUT: &str = "60";

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errno_name(e: i32) -> String {
    if e == 0 {
        "ok".into()
    } else {
        sys::Errno(e).name()
    }
}

fn c(p: &Path) -> CString {
    sys::cstr(p)
}

/// Runs `f` in a forked child with real, effective and saved ids `uid`/`gid`, exactly the
/// supplementary `groups`, and umask 0; returns what `f` returned (0 or an errno). `f` may
/// only make syscalls on memory prepared before the fork.
fn as_user(uid: u32, gid: u32, groups: &[u32], f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes syscalls on memory prepared before the fork, then exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", errno());
    if pid == 0 {
        // SAFETY: as above; the child never returns into the test harness.
        unsafe {
            let dropped = libc::setgroups(groups.len(), groups.as_ptr()) == 0
                && libc::setresgid(gid, gid, gid) == 0
                && libc::setresuid(uid, uid, uid) == 0;
            if !dropped {
                libc::_exit(255);
            }
            libc::umask(0);
            libc::_exit(f());
        }
    }
    let status = wait_or_kill(pid, CHILD_LIMIT)
        .unwrap_or_else(|| panic!("a call as {uid}:{gid} hung for {CHILD_LIMIT:?}"));
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 255, "the child could not become {uid}:{gid}");
    code
}

/// How long a child's calls may take before the test calls them hung.
const CHILD_LIMIT: Duration = Duration::from_secs(10);

/// Reaps `pid` within `limit`: its wait status, or None after killing it (it may stay
/// blocked in a request the daemon never answers until the mount guard aborts the
/// connection, so it is not waited for).
fn wait_or_kill(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: polling our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// open(2) with `flags` and `mode`, closing what it opened: 0 or the errno.
fn try_open(path: &CString, flags: i32, mode: u32) -> i32 {
    // SAFETY: path is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr(), flags, mode) };
    if fd < 0 {
        return errno();
    }
    // SAFETY: closing the fd just opened.
    unsafe { libc::close(fd) };
    0
}

fn mode_of(p: &Path) -> String {
    match sys::lstat(p) {
        Ok(st) => format!("{:o} {}:{}", st.st_mode, st.st_uid, st.st_gid),
        Err(e) => e.name(),
    }
}

/// A passthrough mount of `source` whose negative entries last the whole scenario.
fn mount(source: &Path, extra: &[&str]) -> Mount {
    let mut args = vec!["--entry-timeout", ENTRY_TIMEOUT];
    args.extend_from_slice(extra);
    Mount::passthrough(source, &args)
}

/// `view` is where the callers look (natively the directory itself, else the mount), `host`
/// where root changes things behind the client's back. `nobody` learns the names are absent
/// (cached negative entries), root then makes objects under those names on the host, and
/// `nobody` opens each with O_CREAT.
fn create_over_host_objects(view: &Path, host: &Path) -> String {
    let (vpub, hpub) = (view.join("pub"), host.join("pub"));
    let names = ["secret", "dir", "link", "fifo", "excl"];
    let views: Vec<CString> = names.iter().map(|n| c(&vpub.join(n))).collect();
    let probes = views.clone();
    let absent = as_user(NOBODY, NOBODY, &[], move || {
        for p in &probes {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: p is NUL-terminated; st is a valid out pointer.
            if unsafe { libc::stat(p.as_ptr(), st.as_mut_ptr()) } == 0 || errno() != libc::ENOENT {
                return 1;
            }
        }
        0
    });
    assert_eq!(absent, 0, "the names exist before the host makes them");
    std::fs::write(hpub.join("secret"), b"root's secret\n").unwrap();
    sys::chmod(&hpub.join("secret"), 0o600).unwrap();
    std::fs::write(hpub.join("excl"), b"x").unwrap();
    sys::mkdir(&hpub.join("dir"), 0o755).unwrap();
    sys::symlink("target", &hpub.join("link")).unwrap();
    sys::mknod(&hpub.join("fifo"), libc::S_IFIFO | 0o666, 0).unwrap();
    sys::chmod(&hpub.join("fifo"), 0o666).unwrap();
    let attempts: [(&str, i32); 5] = [
        ("secret", libc::O_CREAT | libc::O_RDWR),
        ("dir", libc::O_CREAT | libc::O_RDWR),
        ("link", libc::O_CREAT | libc::O_WRONLY),
        ("fifo", libc::O_CREAT | libc::O_WRONLY | libc::O_NONBLOCK),
        ("excl", libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY),
    ];
    let mut out = String::new();
    for (i, (name, flags)) in attempts.into_iter().enumerate() {
        let path = views[i].clone();
        let got = as_user(NOBODY, NOBODY, &[], move || try_open(&path, flags, 0o666));
        out += &format!("open(O_CREAT) {name}: {}\n", errno_name(got));
    }
    out += &format!(
        "secret holds {:?}, mode {}\n",
        std::fs::read_to_string(hpub.join("secret")).unwrap_or_default(),
        mode_of(&hpub.join("secret"))
    );
    out += &format!("symlink target: {}\n", mode_of(&hpub.join("target")));
    out
}

fn pub_dir(root: &Path) {
    sys::mkdir(&root.join("pub"), 0o777).unwrap();
    sys::chmod(&root.join("pub"), 0o1777).unwrap();
}

/// A create that meets a name the host made after the client cached it as absent is an open
/// of an existing object, with every check the caller gets natively: a root-only file stays
/// closed to `nobody` (today's main opened it read-write with the daemon's rights), a
/// symlink is followed, a directory is EISDIR, a FIFO without a reader ENXIO.
#[test]
fn a_create_that_meets_a_host_object_is_checked_as_natively() {
    let native = TempDir::new("creat-native");
    sys::chmod(native.path(), 0o755).unwrap();
    pub_dir(native.path());
    let expected = create_over_host_objects(native.path(), native.path());
    for line in [
        "open(O_CREAT) secret: EACCES",
        "open(O_CREAT) dir: EISDIR",
        "open(O_CREAT) link: ok",
        "open(O_CREAT) fifo: ENXIO",
        "open(O_CREAT) excl: EEXIST",
        "secret holds \"root's secret\\n\", mode 100600 0:0",
        "symlink target: 100666 65534:65534",
    ] {
        assert!(
            expected.contains(line),
            "native lacks {line:?}:\n{expected}"
        );
    }
    for extra in [&[][..], &["--no-passthrough"][..]] {
        let source = TempDir::new("creat-src");
        sys::chmod(source.path(), 0o755).unwrap();
        pub_dir(source.path());
        let m = mount(source.path(), extra);
        let got = create_over_host_objects(&m.mountpoint, source.path());
        assert_eq!(got, expected, "{extra:?}: the mount differs from native");
        m.unmount();
    }
}

/// The same with a FIFO and no O_NONBLOCK: natively the opener waits for a reader, and only
/// the opener. On main the daemon's own open waited, so with one queue nothing else was
/// answered again. Caller and prober share one CPU, so over io_uring they share a ring.
#[test]
fn a_create_that_meets_a_host_fifo_blocks_only_its_caller() {
    let source = TempDir::new("creat-fifo-src");
    sys::chmod(source.path(), 0o755).unwrap();
    pub_dir(source.path());
    let m = mount(source.path(), &["--queues", "1"]);
    let fifo = m.path("pub/fifo");
    assert_eq!(sys::stat(&fifo).map(drop), Err(sys::Errno(libc::ENOENT)));
    sys::mknod(&source.path().join("pub/fifo"), libc::S_IFIFO | 0o666, 0).unwrap();
    let path = c(&fifo);
    // SAFETY: the child pins itself and opens a prepared path, then exits.
    let opener = unsafe { libc::fork() };
    assert!(opener >= 0);
    if opener == 0 {
        // SAFETY: as above.
        unsafe {
            let mut cpus: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut cpus);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &cpus);
            let fd = libc::open(path.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
            libc::_exit(if fd >= 0 { 0 } else { 1 });
        }
    }
    let opener_guard = KillOnDrop(opener);
    std::thread::sleep(Duration::from_millis(300));
    let mut status = 0;
    // SAFETY: polling our own child.
    let done = unsafe { libc::waitpid(opener, &mut status, libc::WNOHANG) };
    assert_eq!(
        done, 0,
        "the opener of a FIFO without a reader did not wait"
    );
    let probe_dir = m.path("pub");
    // A listing always asks the daemon (nothing cached answers it).
    let listed = deadline(
        Duration::from_secs(5),
        "a listing on the FIFO opener's CPU",
        move || {
            Command::new("taskset")
                .args(["-c", "0", "ls", "-a"])
                .arg(&probe_dir)
                .output()
                .unwrap()
        },
    );
    assert!(listed.status.success(), "{listed:?}");
    drop(opener_guard);
    m.unmount();
}

/// Kills a child on drop (reaped if already dead; a child still blocked in a request the
/// daemon never answers is left for the mount guard to free).
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signalling and reaping our own child (harmless if already reaped).
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
}

/// What `nobody` gets creating in a set-group-ID directory of group GROUP, with and
/// without GROUP as a supplementary group, and in a directory only GROUP may write.
fn creates_with_groups(view: &Path, host: &Path) -> String {
    let sg = host.join("sg");
    sys::mkdir(&sg, 0o777).unwrap();
    sys::chown(&sg, 0, GROUP).unwrap();
    sys::chmod(&sg, 0o2777).unwrap();
    let grp = host.join("grp");
    sys::mkdir(&grp, 0o770).unwrap();
    sys::chown(&grp, 0, GROUP).unwrap();
    sys::chmod(&grp, 0o770).unwrap();
    let mut out = String::new();
    let cases: [(&str, &[u32], &str); 5] = [
        ("member file", &[GROUP], "sg/member"),
        ("outsider file", &[], "sg/outsider"),
        ("member dir", &[GROUP], "sg/memberdir"),
        ("member fifo", &[GROUP], "sg/memberfifo"),
        ("member in group-only dir", &[GROUP], "grp/f"),
    ];
    for (what, groups, rel) in cases {
        let got = create_as(NOBODY, groups, &view.join(rel), what, 0o2775);
        out += &format!("{what}: {} {}\n", errno_name(got), mode_of(&host.join(rel)));
    }
    out
}

/// As `uid` (its own gid) with supplementary `groups`, makes `path`: a directory if `what`
/// ends in "dir" (mode `mode`, without the file type), a FIFO if in "fifo", else a file by
/// open(O_CREAT); the errno, 0 on success.
fn create_as(uid: u32, groups: &[u32], path: &Path, what: &str, mode: u32) -> i32 {
    let path = c(path);
    let kind = what.rsplit(' ').next().unwrap_or_default().to_owned();
    as_user(uid, uid, groups, move || {
        // SAFETY: path is NUL-terminated.
        let rc = match kind.as_str() {
            "dir" => unsafe { libc::mkdir(path.as_ptr(), mode & 0o7777) },
            "fifo" => unsafe { libc::mknod(path.as_ptr(), libc::S_IFIFO | (mode & 0o7777), 0) },
            _ => return try_open(&path, libc::O_CREAT | libc::O_WRONLY, mode),
        };
        if rc == 0 { 0 } else { errno() }
    })
}

/// A caller in a set-group-ID directory's group only as a supplementary group keeps the
/// set-group-ID bit it asks for (main gave 100775 where the host gives 102775), and may
/// create where only that group may write; an outsider loses the bit.
#[test]
fn creates_act_with_the_callers_supplementary_group() {
    let native = TempDir::new("supp-native");
    sys::chmod(native.path(), 0o755).unwrap();
    let expected = creates_with_groups(native.path(), native.path());
    for line in [
        "member file: ok 102775 65534:4242",
        "outsider file: ok 100775 65534:4242",
        "member in group-only dir: ok",
    ] {
        assert!(
            expected.contains(line),
            "native lacks {line:?}:\n{expected}"
        );
    }
    eprintln!("native:\n{expected}");
    let source = TempDir::new("supp-src");
    sys::chmod(source.path(), 0o755).unwrap();
    let m = mount(source.path(), &[]);
    let got = creates_with_groups(&m.mountpoint, source.path());
    m.unmount();
    assert_eq!(got, expected, "the mount differs from native");
}

/// What callers get creating in a directory (root's, mode 0755) that a POSIX ACL opens to
/// group ACL_GROUP (which `nobody` has only as a supplementary group) and to user 65533.
fn creates_under_an_acl(view: &Path, host: &Path) -> String {
    const ACL_GROUP: u32 = 4343;
    let dir = host.join("acl");
    sys::mkdir(&dir, 0o755).unwrap();
    common::run_ok(
        Command::new("setfacl")
            .arg("-m")
            .arg(format!("g:{ACL_GROUP}:rwx,u:65533:rwx"))
            .arg(&dir),
    );
    let mut out = String::new();
    let cases: [(&str, u32, &[u32], &str); 5] = [
        ("group member file", NOBODY, &[ACL_GROUP], "acl/f"),
        ("group member dir", NOBODY, &[ACL_GROUP], "acl/d"),
        ("group member fifo", NOBODY, &[ACL_GROUP], "acl/p"),
        ("outsider file", NOBODY, &[], "acl/no"),
        ("named user file", 65533, &[], "acl/u"),
    ];
    for (what, uid, groups, rel) in cases {
        let got = create_as(uid, groups, &view.join(rel), what, 0o644);
        out += &format!("{what}: {} {}\n", errno_name(got), mode_of(&host.join(rel)));
    }
    out
}

/// A create that a POSIX ACL on the parent permits through a group the caller has only as a
/// supplementary group (or through a named-user entry) succeeds as natively. The old code
/// acted with the caller's fsgid and the one group the kernel sends (the parent's), so the
/// host refused what the kernel had allowed (EACCES).
#[test]
fn creates_allowed_by_a_parents_acl_succeed() {
    let native = TempDir::new("acl-native");
    sys::chmod(native.path(), 0o755).unwrap();
    let expected = creates_under_an_acl(native.path(), native.path());
    for line in [
        "group member file: ok",
        "group member dir: ok",
        "outsider file: EACCES",
        "named user file: ok",
    ] {
        assert!(
            expected.contains(line),
            "native lacks {line:?}:\n{expected}"
        );
    }
    let source = TempDir::new("acl-src");
    sys::chmod(source.path(), 0o755).unwrap();
    let m = mount(source.path(), &[]);
    let got = creates_under_an_acl(&m.mountpoint, source.path());
    m.unmount();
    assert_eq!(got, expected, "the mount differs from native");
}

/// A FIFO and a terminal bind-mounted into the source (each the root of another mount, so
/// the daemon needs an fd of that mount to reopen inodes by handle) are never opened. Main
/// opened them (as root, without O_NOCTTY): it held the FIFO open for reading, so a writer on
/// the host no longer got ENXIO, and the terminal's lookup failed with the open's EIO (a
/// terminal that opened would have become the controlling terminal of the daemon, a session
/// leader).
#[test]
fn objects_bound_into_the_source_are_never_opened() {
    // SAFETY: posix_openpt and friends on our own pty master.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(master >= 0, "posix_openpt: {}", errno());
    // SAFETY: the fd was just returned to us.
    let _master = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(master) };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::grantpt(master) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::unlockpt(master) }, 0);
    let mut name = [0 as libc::c_char; 64];
    // SAFETY: name has name.len() bytes.
    assert_eq!(
        unsafe { libc::ptsname_r(master, name.as_mut_ptr(), name.len()) },
        0
    );
    // SAFETY: ptsname_r wrote a NUL-terminated string.
    let pts = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let rdev = sys::stat(Path::new(&pts)).unwrap().st_rdev;
    // The terminal as a device node, and a FIFO, on a file system with file handles.
    let nodes = TempDir::new("bound-nodes");
    let tty = nodes.path().join("tty");
    sys::mknod(&tty, libc::S_IFCHR | 0o600, rdev).unwrap();
    let fifo = nodes.path().join("fifo");
    sys::mknod(&fifo, libc::S_IFIFO | 0o600, 0).unwrap();
    let source = TempDir::new("bound-src");
    let mut bound = Vec::new();
    for (node, at) in [(&tty, "tty"), (&fifo, "fifo")] {
        std::fs::write(source.path().join(at), b"").unwrap();
        run_ok(
            Command::new("mount")
                .arg("--bind")
                .arg(node)
                .arg(source.path().join(at)),
        );
        bound.push(BindGuard(source.path().join(at)));
    }
    let m = mount(source.path(), &[]);
    let kinds: Vec<_> = ["tty", "fifo"]
        .iter()
        .map(|n| sys::lstat(&m.path(n)).map(|st| st.st_mode & libc::S_IFMT))
        .collect();
    let writer = sys::open(&fifo, libc::O_WRONLY | libc::O_NONBLOCK, 0).map(drop);
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", m.pid)).unwrap();
    let tty_nr: u64 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(4))
        .and_then(|f| f.parse().ok())
        .unwrap();
    m.unmount();
    assert_eq!(
        writer,
        Err(sys::Errno(libc::ENXIO)),
        "a host writer found a reader: the daemon holds the FIFO open"
    );
    assert_eq!(
        kinds,
        [Ok(libc::S_IFCHR), Ok(libc::S_IFIFO)],
        "the bound objects are not seen as natively"
    );
    assert_eq!(
        tty_nr, 0,
        "the daemon took {pts} as its controlling terminal"
    );
}

/// Lazily unmounts a bind mount on drop.
struct BindGuard(std::path::PathBuf);

impl Drop for BindGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// What `nobody` does to set-ID files it may write, and the mode each file ends with (on
/// the host, and as the caller's view shows it): truncate, write, O_TRUNC, chgrp, fallocate
/// and copy_file_range, as a member of the file's group (primary or supplementary) and as an
/// outsider.
fn set_id_changes(view: &Path, host: &Path) -> String {
    // (name, owner gid, mode, operation, the caller's supplementary groups)
    let cases: [(&str, u32, u32, &str, &[u32]); 14] = [
        ("member-truncate", NOBODY, 0o2664, "truncate", &[]),
        ("member-write", NOBODY, 0o2664, "write", &[]),
        ("member-otrunc", NOBODY, 0o2664, "otrunc", &[]),
        ("supp-member-write", GROUP, 0o2666, "write", &[GROUP]),
        ("outsider-write", 0, 0o2666, "write", &[]),
        ("outsider-truncate", 0, 0o2666, "truncate", &[]),
        ("group-exec-truncate", NOBODY, 0o2674, "truncate", &[]),
        ("setuid-truncate", NOBODY, 0o6664, "truncate", &[]),
        ("member-chgrp", NOBODY, 0o2664, "chgrp", &[GROUP]),
        ("outsider-chgrp", 0, 0o2664, "chgrp", &[]),
        ("member-fallocate", NOBODY, 0o2664, "fallocate", &[]),
        ("outsider-fallocate", 0, 0o2666, "fallocate", &[]),
        ("setuid-fallocate", NOBODY, 0o6664, "fallocate", &[]),
        ("outsider-copy", 0, 0o6666, "copy", &[]),
    ];
    let mut out = String::new();
    for (name, gid, mode, op, groups) in cases {
        let file = host.join(name);
        std::fs::write(&file, b"set-id data\n").unwrap();
        sys::chown(&file, NOBODY, gid).unwrap();
        sys::chmod(&file, mode).unwrap();
        let path = c(&view.join(name));
        // The new group of a chgrp: one the caller is in, other than the file's.
        let new_gid = if gid == NOBODY { GROUP } else { NOBODY };
        let got = as_user(NOBODY, NOBODY, groups, move || {
            // SAFETY: path is NUL-terminated; the buffer is static.
            let ret = unsafe {
                match op {
                    "truncate" => libc::truncate(path.as_ptr(), 1),
                    "chgrp" => libc::chown(path.as_ptr(), u32::MAX, new_gid),
                    "fallocate" | "copy" => {
                        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
                        if fd < 0 {
                            return errno();
                        }
                        let ret = if op == "fallocate" {
                            libc::fallocate(fd, 0, 0, 8192)
                        } else {
                            let (mut from, mut to) = (0i64, 64i64);
                            let n = libc::copy_file_range(fd, &mut from, fd, &mut to, 4, 0);
                            if n == 4 { 0 } else { -1 }
                        };
                        let e = errno();
                        libc::close(fd);
                        if ret == 0 {
                            return 0;
                        }
                        return e;
                    }
                    _ => {
                        let flags = if op == "otrunc" {
                            libc::O_WRONLY | libc::O_TRUNC
                        } else {
                            libc::O_WRONLY | libc::O_APPEND
                        };
                        let fd = libc::open(path.as_ptr(), flags);
                        if fd < 0 {
                            return errno();
                        }
                        let n = libc::write(fd, b"more\n".as_ptr().cast(), 5);
                        libc::close(fd);
                        if n == 5 { 0 } else { -1 }
                    }
                }
            };
            if ret == 0 { 0 } else { errno() }
        });
        out += &format!(
            "{name}: {} host {} seen {}\n",
            errno_name(got),
            mode_of(&file),
            mode_of(&view.join(name))
        );
    }
    out
}

/// The set-ID bits an unprivileged caller's truncate, write, O_TRUNC and chgrp leave are the
/// kernel's (setattr_should_drop_suidgid): main cleared the set-group-ID bit of a file
/// without group execute for the file's own group members, whom the host, judging the
/// daemon's groups, took for outsiders, and kept it on an outsider's chgrp.
#[test]
fn set_id_bits_on_truncate_write_and_chown_follow_the_kernel() {
    let native = TempDir::new("setid-native");
    sys::chmod(native.path(), 0o777).unwrap();
    let expected = set_id_changes(native.path(), native.path());
    for line in [
        "member-truncate: ok host 102664 65534:65534",
        "member-write: ok host 102664 65534:65534",
        "supp-member-write: ok host 102666 65534:4242",
        "outsider-write: ok host 100666 65534:0",
        "group-exec-truncate: ok host 100674",
        "setuid-truncate: ok host 102664",
        "member-chgrp: ok host 102664 65534:4242",
        "outsider-chgrp: ok host 100664 65534:65534",
        "member-fallocate: ok host 102664",
        "outsider-fallocate: ok host 100666",
        "setuid-fallocate: ok host 102664",
        "outsider-copy: ok host 100666",
    ] {
        assert!(
            expected.contains(line),
            "native lacks {line:?}:\n{expected}"
        );
    }
    for extra in [&[][..], &["--no-passthrough"][..]] {
        let source = TempDir::new("setid-src");
        sys::chmod(source.path(), 0o777).unwrap();
        let m = mount(source.path(), extra);
        let got = set_id_changes(&m.mountpoint, source.path());
        m.unmount();
        assert_eq!(got, expected, "{extra:?}: the mount differs from native");
    }
    // The volume (issue 17 item 4): the same, root preparing the files through the mount.
    let volume = common::volume::Volume::format("setid");
    let m = volume.mount(&[]);
    sys::chmod(&m.mountpoint, 0o777).unwrap();
    let got = set_id_changes(&m.mountpoint, &m.mountpoint);
    m.unmount();
    assert_eq!(got, expected, "the volume differs from native");
    volume.assert_clean();
}

/// A lock in a forked child: `cmd` (F_SETLK or F_SETLKW) of `kind` on [start, start+len) of
/// a fresh open of `path` with `flags`; the child exits 0 once it has the lock, or with the
/// errno.
fn locker(path: &Path, flags: i32, cmd: i32, kind: i32, start: i64, len: i64) -> libc::pid_t {
    let path = c(path);
    // SAFETY: the child only opens a prepared path, locks and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            let fd = libc::open(path.as_ptr(), flags);
            if fd < 0 {
                libc::_exit(errno());
            }
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = kind as i16;
            fl.l_whence = libc::SEEK_SET as i16;
            fl.l_start = start;
            fl.l_len = len;
            libc::_exit(if libc::fcntl(fd, cmd, &fl) == 0 {
                0
            } else {
                errno()
            });
        }
    }
    pid
}

/// `locker` as `uid` (group `uid` too, no supplementary groups): a read lock (SETLKW)
/// through a read-only open.
fn read_locker_as(uid: u32, path: &Path) -> libc::pid_t {
    let path = c(path);
    // SAFETY: the child only changes its ids, opens a prepared path, locks and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(uid, uid, uid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                libc::_exit(200);
            }
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
            if fd < 0 {
                libc::_exit(errno());
            }
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_RDLCK as i16;
            fl.l_whence = libc::SEEK_SET as i16;
            libc::_exit(if libc::fcntl(fd, libc::F_SETLKW, &fl) == 0 {
                0
            } else {
                errno()
            });
        }
    }
    pid
}

/// One user may hold at most a quarter of the wait list (64 of 256 waiters): past its share
/// its next waiter gets ENOLCK, while another user can still wait. The old code let one
/// user fill the whole list, leaving every other user's blocking locks refused.
#[test]
fn one_user_cannot_take_every_lock_waiting_place() {
    const PER_USER: usize = 64;
    let source = TempDir::new("lockshare-src");
    let m = mount(source.path(), &[]);
    let f = m.path("f");
    std::fs::write(&f, b"lock").unwrap();
    let holder = sys::open(&f, libc::O_RDWR, 0).unwrap();
    sys::setlk(holder.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 0).unwrap();
    let mut children: Vec<KillOnDrop> = (0..PER_USER)
        .map(|_| KillOnDrop(read_locker_as(65534, &f)))
        .collect();
    assert!(
        common::wait_until(Duration::from_secs(60), || m.counter("lock_waiters")
            == PER_USER as u64),
        "{} of {PER_USER} waiters registered",
        m.counter("lock_waiters")
    );
    let refused = read_locker_as(65534, &f);
    assert_eq!(
        exit_code(wait_or_kill(refused, CHILD_LIMIT)),
        Some(libc::ENOLCK),
        "nobody's waiter past its share"
    );
    children.push(KillOnDrop(read_locker_as(65533, &f)));
    assert!(
        common::wait_until(Duration::from_secs(10), || m.counter("lock_waiters")
            == PER_USER as u64 + 1),
        "another user could not wait: {} waiters",
        m.counter("lock_waiters")
    );
    sys::setlk(holder.as_raw_fd(), libc::F_SETLK, libc::F_UNLCK, 0, 0).unwrap();
    for child in &children {
        assert_eq!(
            exit_code(wait_or_kill(child.0, CHILD_LIMIT)),
            Some(0),
            "a reader was not let in"
        );
    }
    assert_eq!(m.counter("lock_waiters"), 0);
    drop(holder);
    m.unmount();
}

fn exit_code(status: Option<i32>) -> Option<i32> {
    status.map(|s| {
        if libc::WIFEXITED(s) {
            libc::WEXITSTATUS(s)
        } else {
            -1
        }
    })
}

/// A read lock taken through a read-only open leaves the file open read-only on the host:
/// main reopened it read-write as root, so executing the locked binary on the host failed
/// with ETXTBSY. An owner that locks through a read-only and a write-only open keeps both
/// ranges, as natively.
#[test]
fn posix_locks_use_the_opens_own_access_mode() {
    let source = TempDir::new("lockmode-src");
    let bin = source.path().join("true");
    std::fs::copy("/bin/true", &bin).unwrap();
    sys::chmod(&bin, 0o755).unwrap();
    let m = mount(source.path(), &[]);
    let reader = sys::open(&m.path("true"), libc::O_RDONLY, 0).unwrap();
    sys::setlk(reader.as_raw_fd(), libc::F_SETLK, libc::F_RDLCK, 0, 100).unwrap();
    let ran = Command::new(&bin).status();
    assert!(
        ran.as_ref().is_ok_and(|s| s.success()),
        "executing the locked binary on the host: {ran:?}"
    );
    // The same owner's write lock through a write-only open of the same file.
    let data = m.path("data");
    std::fs::write(&data, vec![0u8; 64]).unwrap();
    let ro = sys::open(&data, libc::O_RDONLY, 0).unwrap();
    let wo = sys::open(&data, libc::O_WRONLY, 0).unwrap();
    sys::setlk(ro.as_raw_fd(), libc::F_SETLK, libc::F_RDLCK, 0, 10).unwrap();
    sys::setlk(wo.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 20, 10).unwrap();
    // Another process sees both ranges held.
    for (start, kind) in [(0, libc::F_WRLCK), (20, libc::F_RDLCK)] {
        let other = locker(&data, libc::O_RDWR, libc::F_SETLK, kind, start, 10);
        assert_eq!(
            exit_code(wait_or_kill(other, CHILD_LIMIT)),
            Some(libc::EAGAIN),
            "the range at {start} is not held"
        );
    }
    drop((reader, ro, wo));
    m.unmount();
}

/// Blocked lock requests wait on the mount's one waiting thread (main started a thread per
/// waiter), all wake when the holder lets go, and past `WAITERS_MAX` (256) a request gets
/// ENOLCK instead of waiting.
#[test]
fn lock_waiters_share_one_thread_and_are_bounded() {
    const WAITERS_MAX: usize = 256;
    let source = TempDir::new("lockwait-src");
    let m = mount(source.path(), &[]);
    let f = m.path("f");
    std::fs::write(&f, b"lock").unwrap();
    let holder = sys::open(&f, libc::O_RDWR, 0).unwrap();
    sys::setlk(holder.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 0).unwrap();
    // Threads of the daemon, less each io_uring ring's kicker (one per ring, started by the
    // first batch of parked requests that committed nothing; see uring::Kicker).
    let threads = || {
        std::fs::read_dir(format!("/proc/{}/task", m.pid))
            .unwrap()
            .map(|t| {
                t.map_or(String::new(), |t| {
                    std::fs::read_to_string(t.path().join("comm")).unwrap_or_default()
                })
                .trim()
                .to_owned()
            })
            .filter(|comm| !comm.starts_with("lanefs-kick"))
            .collect::<Vec<_>>()
    };
    let before = threads();
    // Over io_uring every waiter keeps a ring entry of its CPU until it is answered; the
    // ring registers spares, so the bound is reached there too.
    let waiters = WAITERS_MAX;
    let mut children = Vec::new();
    for _ in 0..waiters {
        children.push(KillOnDrop(locker(
            &f,
            libc::O_RDONLY,
            libc::F_SETLKW,
            libc::F_RDLCK,
            0,
            0,
        )));
    }
    assert!(
        common::wait_until(Duration::from_secs(60), || m.counter("lock_waiters")
            == waiters as u64),
        "{} of {waiters} waiters registered",
        m.counter("lock_waiters")
    );
    let after = threads();
    assert!(
        after.len() <= before.len() + 1,
        "{waiters} waiters took {} more daemon threads: {after:?} against {before:?}",
        after.len() - before.len()
    );
    let refused = locker(&f, libc::O_RDONLY, libc::F_SETLKW, libc::F_RDLCK, 0, 0);
    assert_eq!(
        exit_code(wait_or_kill(refused, CHILD_LIMIT)),
        Some(libc::ENOLCK),
        "a waiter past the bound"
    );
    // The holder lets go: every reader gets its lock at once.
    sys::setlk(holder.as_raw_fd(), libc::F_SETLK, libc::F_UNLCK, 0, 0).unwrap();
    for child in &children {
        assert_eq!(
            exit_code(wait_or_kill(child.0, CHILD_LIMIT)),
            Some(0),
            "a reader was not let in"
        );
    }
    assert_eq!(m.counter("lock_waiters"), 0);
    drop(holder);
    m.unmount();
}

/// A lock held on the host (which tells us nothing when it goes) is still taken by a waiter
/// on the mount soon after the host lets go: the waiting thread retries on a bounded back-off.
#[test]
fn a_waiter_gets_a_lock_the_host_held() {
    let source = TempDir::new("hostlock-src");
    let host_file = source.path().join("f");
    std::fs::write(&host_file, b"lock").unwrap();
    let m = mount(source.path(), &[]);
    let holder = sys::open(&host_file, libc::O_RDWR, 0).unwrap();
    sys::setlk(holder.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 0, 0).unwrap();
    let waiter = KillOnDrop(locker(
        &m.path("f"),
        libc::O_RDWR,
        libc::F_SETLKW,
        libc::F_WRLCK,
        0,
        0,
    ));
    assert!(common::wait_until(Duration::from_secs(10), || m
        .counter("lock_waiters")
        == 1));
    std::thread::sleep(Duration::from_millis(300));
    let released = std::time::Instant::now();
    drop(holder);
    assert_eq!(exit_code(wait_or_kill(waiter.0, CHILD_LIMIT)), Some(0));
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "the waiter took {waited:?} to notice the host let go"
    );
    m.unmount();
}

/// `count` appends of one line by `nobody` through one open of `path`: 0 or the errno.
fn appends_as_nobody(path: &Path, count: usize) -> i32 {
    let path = c(path);
    as_user(NOBODY, NOBODY, &[], move || {
        // SAFETY: path is NUL-terminated; the buffer is static.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
            if fd < 0 {
                return errno();
            }
            for _ in 0..count {
                if libc::write(fd, b"x\n".as_ptr().cast(), 2) != 2 {
                    return errno();
                }
            }
            libc::close(fd);
        }
        0
    })
}

/// Writes by a caller without CAP_FSETID to a file known to have no set-ID bits do not stat
/// it each time (main did, one fstat per write); a set-ID bit the host adds is still stripped
/// by the first write after the attribute timeout, as the kernel's own cached mode would be
/// refreshed.
#[test]
fn unprivileged_writes_reuse_the_mode_they_saw() {
    let source = TempDir::new("setid-cache-src");
    sys::chmod(source.path(), 0o777).unwrap();
    let host_file = source.path().join("f");
    std::fs::write(&host_file, b"").unwrap();
    sys::chmod(&host_file, 0o666).unwrap();
    // Writes reach the daemon (no kernel passthrough); attributes last 0.3 s.
    let m = mount(
        source.path(),
        &["--no-passthrough", "--attr-timeout", "0.3"],
    );
    let f = m.path("f");
    // The open's lookup saw the mode; 1,000 writes follow at once.
    assert_eq!(appends_as_nobody(&f, 1000), 0);
    let checks = m.counter("set_id_checks");
    // One per attribute timeout at most (a slow machine may take more than one).
    assert!(checks <= 20, "{checks} set-ID checks for 1,000 writes");
    // The host makes the file set-user-ID; once the timeout has passed, a write strips it.
    sys::chmod(&host_file, 0o4777).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(appends_as_nobody(&f, 1), 0);
    assert_eq!(mode_of(&host_file), "100777 0:0");
    m.unmount();
}

/// A root daemon without CAP_SETUID and CAP_SETGID cannot act as its callers: it says so in
/// its log and does not pretend (main went on silently, every switch failing unnoticed).
#[test]
fn a_root_daemon_that_cannot_switch_says_so() {
    let source = TempDir::new("noswitch-src");
    pub_dir(source.path());
    let logs = TempDir::new("noswitch-log");
    let log = logs.path().join("daemon.log");
    let m = Mount::start_wrapped(
        &["setpriv", "--bounding-set", "-setuid,-setgid"],
        source.path().to_str().unwrap(),
        &["--log", log.to_str().unwrap()],
    );
    let created = c(&m.path("pub/f"));
    let got = as_user(NOBODY, NOBODY, &[], move || {
        try_open(&created, libc::O_CREAT | libc::O_WRONLY, 0o644)
    });
    m.unmount();
    assert_eq!(got, 0, "{}", errno_name(got));
    // Made with the daemon's own ids: it could not take on the caller's.
    assert_eq!(mode_of(&source.path().join("pub/f")), "100644 0:0");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("without CAP_SETUID and CAP_SETGID"),
        "the daemon's log does not say it cannot act as callers:\n{logged}"
    );
}

/// What `nobody` learns from listxattr of a file root gave a trusted.* and a user.* xattr,
/// asking its size first and then the list, as getfattr does: bit 0 the list names the
/// trusted one, bit 1 it misses the user one, bit 2 the size asked first is not the list's.
fn nobody_lists_xattrs(file: &Path) -> i32 {
    sys::setxattr(file, "trusted.secret", b"t", 0).unwrap();
    sys::setxattr(file, "user.visible", b"u", 0).unwrap();
    let path = c(file);
    let mut buf = vec![0u8; 4096];
    as_user(NOBODY, NOBODY, &[], || {
        // SAFETY: path is NUL-terminated and buf has buf.len() writable bytes.
        let (asked, got) = unsafe {
            (
                libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0),
                libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()),
            )
        };
        if got < 0 {
            return 100 + errno();
        }
        let names: Vec<&[u8]> = buf[..got as usize].split(|&b| b == 0).collect();
        let trusted = names.iter().any(|n| n.starts_with(b"trusted."));
        let user = names.contains(&&b"user.visible"[..]);
        trusted as i32 | (!user as i32) << 1 | ((asked != got) as i32) << 2
    })
}

/// trusted.* xattrs are for CAP_SYS_ADMIN: natively nobody's listxattr leaves their names
/// out. The daemon lists them with its own capability, so it leaves them out itself for a
/// caller other than root (the passthrough listed them to everyone, and so did the volume).
#[test]
fn only_root_sees_trusted_xattr_names() {
    let native = common::Tmpfs::new("16M");
    let file = native.path.join("f");
    std::fs::write(&file, b"x").unwrap();
    assert_eq!(nobody_lists_xattrs(&file), 0, "natively");
    for kind in common::subject::KINDS {
        let source = common::subject::Source::new(kind, "trusted-names");
        let m = source.mount(&[]);
        std::fs::write(m.path("f"), b"x").unwrap();
        assert_eq!(nobody_lists_xattrs(&m.path("f")), 0, "on lanefs ({kind:?})");
        m.unmount();
    }
}
