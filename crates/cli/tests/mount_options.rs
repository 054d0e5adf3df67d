//! Mount options and flags as any kernel file system has them (issue 17 items 1-3, 6-8;
//! issue 11 item 8's mount bits): the generic mount(8) options, remount, atime, dev/suid, a
//! quiet mount helper, unmounting right after use, fusermount3's flags, --allow-other for a
//! regular user, and `lanefs umount` touching only its own mount. Compared with native
//! tmpfs where the flag has a visible meaning; the issue 17 cases run on the passthrough
//! and on a volume (`common::subject`). Every mount runs under the transport
//! `LANEFS_TEST_TRANSPORT` names.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::subject::{KINDS, Kind, Source};
use common::sys::{self, Errno};
use common::{Mount, TempDir, is_mounted, lanefs, process_alive, wait_until};

/// The per-mount and the superblock options of the mount at `path` (its mountinfo line).
fn mount_options(path: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let wanted = path.to_str().unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(wanted))
        .unwrap_or_else(|| panic!("{wanted} is not mounted"));
    let split = |s: &str| s.split(',').map(str::to_owned).collect::<BTreeSet<_>>();
    let fields: Vec<&str> = line.split(' ').collect();
    let dash = fields.iter().position(|f| *f == "-").unwrap();
    (split(fields[5]), split(fields[dash + 3]))
}

/// The `transport=` option for mount(8)'s form, from `LANEFS_TEST_TRANSPORT`.
fn transport_option() -> String {
    std::env::var("LANEFS_TEST_TRANSPORT")
        .map(|t| format!(",transport={t}"))
        .unwrap_or_default()
}

/// `mount -t fuse 'LANEFS#SOURCE' MOUNTPOINT -o OPTIONS`, as from fstab.
fn mount_8(source: &Path, mountpoint: &Path, options: &str) -> Output {
    Command::new("mount")
        .args(["-t", "fuse"])
        .arg(format!("{}#{}", lanefs(), source.display()))
        .arg(mountpoint)
        .arg("-o")
        .arg(format!("{options}{}", transport_option()))
        .output()
        .unwrap()
}

/// Runs mount.fuse3 exactly as mount(8) does for `mount -o remount,...` of a fuse.lanefs
/// mount (its argv, recorded with strace): `mount.fuse SOURCE MOUNTPOINT -o OPTIONS -t
/// fuse.lanefs`, which runs `lanefs SOURCE MOUNTPOINT -o OPTIONS` found on PATH. mount(8)
/// clears PATH for helpers, so an installed lanefs would be found in /usr/local/bin; here
/// `bin` holds a link to the binary under test.
fn mount_fuse3_remount(bin: &Path, source: &Path, mountpoint: &Path, options: &str) -> Output {
    let helper = ["/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("mount.fuse3 (apt-get install fuse3)");
    Command::new(helper)
        .arg(source)
        .arg(mountpoint)
        .arg("-o")
        .arg(options)
        .args(["-t", "fuse.lanefs"])
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap()
}

/// A directory holding `lanefs` (a link to the binary under test), for helpers that look
/// for it on PATH.
fn lanefs_on_path() -> TempDir {
    let dir = TempDir::new("bin");
    std::os::unix::fs::symlink(lanefs(), dir.path().join("lanefs")).unwrap();
    dir
}

/// Lazily unmounts on drop (for mounts whose daemon is not ours to kill).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 17 item 1: every generic option mount(8) and fstab pass is accepted and set on the
/// mount as it is on tmpfs (the old code refused nodiratime, strictatime, lazytime, dirsync,
/// mand and iversion, and dropped sync). `mand` is the exception: FUSE refuses the flag, so
/// lanefs says so and mounts without it (Linux ignores it everywhere since 5.15).
#[test]
fn generic_mount_options_are_applied_as_on_tmpfs() {
    let options = "nosuid,nodev,nodiratime,strictatime,lazytime,dirsync,iversion,sync,nosymfollow,silent,mand";
    let native = TempDir::new("native");
    common::run_ok(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(native.path()),
    );
    let _native_guard = Unmount(native.path().to_owned());
    let (theirs, their_sb) = mount_options(native.path());
    for kind in KINDS {
        let source = Source::new(kind, "generic");
        let dir = TempDir::new("generic");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let out = mount_8(source.path(), &mnt, options);
        let _guard = Unmount(mnt.clone());
        assert_ok(
            &format!("{kind:?}: mount(8) with every generic option"),
            &out,
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("mand"),
            "{kind:?}: the dropped `mand` is not mentioned: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (ours, our_sb) = mount_options(&mnt);
        assert_eq!(ours, theirs, "{kind:?}: per-mount flags differ from tmpfs'");
        let generic = ["ro", "rw", "sync", "dirsync", "lazytime"];
        let pick = |sb: &BTreeSet<String>| {
            sb.iter()
                .filter(|o| generic.contains(&o.as_str()))
                .cloned()
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(
            pick(&our_sb),
            pick(&their_sb),
            "{kind:?}: superblock flags differ"
        );
        assert!(our_sb.contains("sync"), "{kind:?}: {our_sb:?}");
        std::fs::write(mnt.join("f"), b"synchronous").unwrap();
        assert_eq!(
            std::fs::read(source.host(&mnt).join("f")).unwrap(),
            b"synchronous"
        );
        umount_retrying(&mnt);
    }
}

/// `umount MP`, retried while the mount is busy for a moment (another test of this process
/// that forks holds copies of our fds until it execs).
fn umount_retrying(mnt: &Path) {
    let mut out = None;
    for _ in 0..50 {
        let o = Command::new("umount").arg(mnt).output().unwrap();
        let busy = String::from_utf8_lossy(&o.stderr).contains("busy");
        out = Some(o);
        if !busy {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ok("umount", &out.unwrap());
}

/// Issue 17 item 7: the mount(8) form prints nothing when it succeeds (the old code printed
/// "mounted SRC on MP (...)" into every script's output).
#[test]
fn the_mount_helper_prints_nothing_on_success() {
    for kind in KINDS {
        let source = Source::new(kind, "quiet");
        let dir = TempDir::new("quiet");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let out = mount_8(source.path(), &mnt, "defaults");
        let _guard = Unmount(mnt.clone());
        assert_ok(&format!("{kind:?}: mount(8)"), &out);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{kind:?}: stdout");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{kind:?}: stderr");
        assert!(is_mounted(&mnt));
        umount_retrying(&mnt);
    }
}

/// Issue 17 item 2: `mount -o remount,ro MP` makes the mount refuse writes (EROFS) from then
/// on, and `remount,rw` gives them back, without a new daemon; the daemon keeps serving.
#[test]
fn remount_read_only_and_back() {
    for kind in KINDS {
        remount_read_only_and_back_on(kind);
    }
}

fn remount_read_only_and_back_on(kind: Kind) {
    let source = Source::new(kind, "remount");
    let m = source.mount(&[]);
    std::fs::write(m.path("old"), b"kept").unwrap();
    let host = source.host(&m.mountpoint);
    let bin = lanefs_on_path();
    let options = |flags: &str| {
        // What mount(8) passes: the mount's flags with the change, its FUSE options back.
        format!("{flags},nosuid,nodev,remount,user_id=0,group_id=0,default_permissions,allow_other")
    };
    let out = mount_fuse3_remount(bin.path(), source.path(), &m.mountpoint, &options("ro"));
    assert_ok(&format!("{kind:?}: remount,ro"), &out);
    assert!(mount_options(&m.mountpoint).0.contains("ro"));
    assert_eq!(
        sys::open(&m.path("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap_err(),
        Errno(libc::EROFS),
        "{kind:?}"
    );
    assert_eq!(
        sys::open(&m.path("old"), libc::O_WRONLY, 0).unwrap_err(),
        Errno(libc::EROFS),
        "{kind:?}"
    );
    assert_eq!(sys::unlink(&m.path("old")).unwrap_err(), Errno(libc::EROFS));
    assert_eq!(std::fs::read(m.path("old")).unwrap(), b"kept");
    assert!(!host.join("new").exists());

    let out = mount_fuse3_remount(bin.path(), source.path(), &m.mountpoint, &options("rw"));
    assert_ok(&format!("{kind:?}: remount,rw"), &out);
    assert!(mount_options(&m.mountpoint).0.contains("rw"));
    std::fs::write(m.path("new"), b"writable again").unwrap();
    assert_eq!(std::fs::read(host.join("new")).unwrap(), b"writable again");
    // A file open for writing keeps the mount writable, as on any file system.
    let held = sys::open(&m.path("new"), libc::O_WRONLY, 0).unwrap();
    let out = mount_fuse3_remount(bin.path(), source.path(), &m.mountpoint, &options("ro"));
    assert!(
        !out.status.success(),
        "{kind:?}: remount,ro with a writer succeeded"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("open for writing"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(held);
    assert!(process_alive(m.pid));
    m.unmount();
}

/// What reading a file twice and listing a directory do to their access times, on the host
/// (`host`, the directory the mount shows, or the mount itself for native) and through the
/// mount: (first read moved atime, second read moved it, listing moved the directory's).
fn atime_pattern(mount: &Path, host: &Path) -> [(bool, bool); 3] {
    let file = mount.join("f");
    std::fs::write(&file, vec![7u8; 8192]).unwrap();
    std::fs::create_dir(mount.join("d")).unwrap();
    // atime before mtime: relatime moves it on the next read.
    let past = |p: &Path| {
        sys::utimens(p, sys::ts(1_000_000_000, 0), sys::ts(1_500_000_000, 0), 0).unwrap()
    };
    past(&file);
    past(&mount.join("d"));
    let atime = |p: &Path| sys::stat(p).unwrap().st_atime;
    let seen = |rel: &str| (atime(&host.join(rel)), atime(&mount.join(rel)));
    let before = seen("f");
    std::fs::read(&file).unwrap();
    let first = seen("f");
    // Coarse clocks: let the second read's time differ from the first's.
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::read(&file).unwrap();
    let second = seen("f");
    let dir_before = seen("d");
    std::fs::read_dir(mount.join("d")).unwrap().for_each(drop);
    let dir_after = seen("d");
    let moved = |a: (i64, i64), b: (i64, i64)| (a.0 != b.0, a.1 != b.1);
    [
        moved(before, first),
        moved(first, second),
        moved(dir_before, dir_after),
    ]
}

/// Issue 17 item 3: noatime, relatime (the default), strictatime and nodiratime move access
/// times exactly as on tmpfs, on the mount and on the host. The old code let the daemon's
/// own reads move atime on the host whatever the mount said, so a noatime mount's reads
/// moved it; without kernel passthrough a relatime read after a write was served from the
/// page cache and moved nothing; the volume never moved atime. Runs on the passthrough
/// with kernel passthrough and without, and on the volume.
#[test]
fn atime_follows_the_mount_flags_as_on_tmpfs() {
    for (options, lanefs_args) in [
        ("noatime", &["--noatime"][..]),
        ("relatime", &[][..]),
        ("strictatime", &["-o", "strictatime"][..]),
        (
            "strictatime,nodiratime",
            &["-o", "strictatime,nodiratime"][..],
        ),
    ] {
        let native = TempDir::new("atime-native");
        common::run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", options, "tmpfs"])
                .arg(native.path()),
        );
        let guard = Unmount(native.path().to_owned());
        let expected = atime_pattern(native.path(), native.path());
        drop(guard);
        // The passthrough with kernel passthrough (reads never reach the daemon) and
        // without (reads the kernel serves from its page cache never reach it either); the
        // volume keeps atime in its own records.
        for (kind, passthrough) in [
            (Kind::Passthrough, true),
            (Kind::Passthrough, false),
            (Kind::Volume, false),
        ] {
            let source = Source::new(kind, "atime");
            let mut args = lanefs_args.to_vec();
            args.extend(["--attr-timeout", "0"]);
            if kind == Kind::Passthrough && !passthrough {
                args.push("--no-passthrough");
            }
            let m = source.mount(&args);
            let got = atime_pattern(&m.mountpoint, &source.host(&m.mountpoint));
            assert_eq!(
                got, expected,
                "{options} ({kind:?}, kernel passthrough {passthrough}): (host, mount) moved on \
                 first read, second read, listing"
            );
            m.unmount();
        }
    }
}

/// Issue 17 item 3, remount: `remount,noatime` stops the daemon's reads from moving atime,
/// and `remount,strictatime` makes every read move it, from then on.
#[test]
fn a_remount_changes_the_atime_rule() {
    for kind in KINDS {
        let source = Source::new(kind, "atime-remount");
        let m = source.mount(&["--attr-timeout", "0"]);
        let host = source.host(&m.mountpoint);
        let bin = lanefs_on_path();
        let remount = |flags: &str| {
            let options = format!("rw,{flags},nosuid,nodev,remount,user_id=0,group_id=0");
            assert_ok(
                flags,
                &mount_fuse3_remount(bin.path(), source.path(), &m.mountpoint, &options),
            );
        };
        std::fs::write(m.path("f"), b"x").unwrap();
        let read_moves = || {
            sys::utimens(
                &m.path("f"),
                sys::ts(1_000_000_000, 0),
                sys::ts(1_500_000_000, 0),
                0,
            )
            .unwrap();
            let before = sys::stat(&host.join("f")).unwrap().st_atime;
            // The watcher applies the new rule right after the mount table changes.
            std::thread::sleep(Duration::from_millis(200));
            std::fs::read(m.path("f")).unwrap();
            sys::stat(&host.join("f")).unwrap().st_atime != before
        };
        assert!(
            read_moves(),
            "{kind:?}: relatime: a read after a write moves atime"
        );
        remount("noatime");
        assert!(mount_options(&m.mountpoint).0.contains("noatime"));
        assert!(
            !read_moves(),
            "{kind:?}: after remount,noatime a read moved atime"
        );
        remount("strictatime");
        assert!(
            read_moves(),
            "{kind:?}: after remount,strictatime a read left atime alone"
        );
        m.unmount();
    }
}

/// Issue 17 item 6 and issue 11 item 8: as root, `-o dev,suid` (mount(8)) and `--dev
/// --suid` take effect: a device node made on the mount works and set-ID bits count. The
/// old code mounted nodev,nosuid whatever was asked, so opening the node failed (EACCES).
#[test]
fn dev_and_suid_take_effect_for_root() {
    for kind in KINDS {
        dev_and_suid_take_effect_on(kind);
    }
}

fn dev_and_suid_take_effect_on(kind: Kind) {
    let source = Source::new(kind, "devsuid");
    let check = |mnt: &Path, dev: bool, name: &str| {
        let node = mnt.join(name);
        sys::mknod(&node, libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
        let opened = sys::open(&node, libc::O_WRONLY, 0);
        let (flags, _) = mount_options(mnt);
        if dev {
            let fd = opened.expect("a device node on a dev mount opens");
            assert_eq!(sys::write(&fd, b"gone").unwrap(), 4);
            assert!(
                !flags.contains("nodev") && !flags.contains("nosuid"),
                "{kind:?}: {flags:?}"
            );
        } else {
            assert_eq!(opened.unwrap_err(), Errno(libc::EACCES), "{kind:?}");
            assert!(
                flags.contains("nodev") && flags.contains("nosuid"),
                "{kind:?}: {flags:?}"
            );
        }
    };
    let m = source.mount(&["--dev", "--suid"]);
    check(&m.mountpoint, true, "cli");
    m.unmount();
    let m = source.mount(&[]);
    check(&m.mountpoint, false, "default");
    m.unmount();

    let dir = TempDir::new("devsuid");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = mount_8(source.path(), &mnt, "dev,suid");
    let _guard = Unmount(mnt.clone());
    assert_ok(&format!("{kind:?}: mount(8) -o dev,suid"), &out);
    check(&mnt, true, "mount8");
    umount_retrying(&mnt);
}

/// Issue 11 item 8: `lanefs umount` acts on its own mount only. With a file system mounted
/// on it, a lazy unmount would have detached that one too (the old code did): it now says
/// what is in the way and leaves both mounted.
#[test]
fn umount_leaves_mounts_on_ours_alone() {
    let source = TempDir::new("stack-src");
    let m = Mount::passthrough(source.path(), &[]);
    std::fs::create_dir(m.path("sub")).unwrap();
    common::run_ok(
        Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(m.path("sub")),
    );
    let inner = Unmount(m.path("sub"));
    for lazy in [false, true] {
        let mut command = Command::new(lanefs());
        command.arg("umount");
        if lazy {
            command.arg("--lazy");
        }
        let out = command.arg(&m.mountpoint).output().unwrap();
        assert!(!out.status.success(), "lazy {lazy}: unmounted");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("tmpfs") && said.contains("sub"), "{said}");
        assert!(
            is_mounted(&m.path("sub")),
            "lazy {lazy}: the inner mount went"
        );
        assert!(is_mounted(&m.mountpoint));
    }
    drop(inner);
    assert!(wait_until(Duration::from_secs(5), || !is_mounted(
        &m.path("sub")
    )));
    m.unmount();
}

/// Issue 11 item 8: a regular user's mount through fusermount3 keeps --noexec and --noatime
/// (the old code passed only ro, nosuid and nodev), and --allow-other without
/// --default-permissions on a passthrough is refused with the reason instead of letting every
/// user reach SOURCE with the mounting user's rights.
#[test]
fn a_regular_users_mount_keeps_its_flags() {
    if Command::new("fusermount3").arg("-V").output().is_err() {
        panic!("fusermount3 is required (apt-get install fuse3)");
    }
    let kit = common::UserMountKit::new("user-flags");
    let source = kit.dir.path().join("src");
    let mnt = kit.dir.path().join("mnt");
    for dir in [&source, &mnt] {
        std::fs::create_dir(dir).unwrap();
        common::run_ok(Command::new("chown").arg("nobody").arg(dir));
    }
    let as_nobody = |args: &[&str]| {
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "env",
                "XDG_RUNTIME_DIR=",
            ])
            .arg(&kit.bin)
            .args(args);
        if let Ok(transport) = std::env::var("LANEFS_TEST_TRANSPORT") {
            command.args(["--transport", &transport]);
        }
        command.arg(&source).arg(&mnt).output().unwrap()
    };
    let out = as_nobody(&["mount", "--daemon", "--allow-other"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--default-permissions"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&mnt));

    // --suid and --dev are root's to take: a regular user's mount is nosuid,nodev whatever
    // it asks (fusermount3 forces them, and we pass them ourselves too).
    let out = as_nobody(&[
        "mount",
        "--daemon",
        "--noexec",
        "--noatime",
        "--suid",
        "--dev",
    ]);
    let _guard = Unmount(mnt.clone());
    assert_ok("mount as nobody", &out);
    let (flags, _) = mount_options(&mnt);
    for flag in ["noexec", "noatime", "nosuid", "nodev"] {
        assert!(flags.contains(flag), "{flag} missing from {flags:?}");
    }
    // noatime for a regular user's daemon, which cannot copy mounts: it reads the files it
    // owns with O_NOATIME, so reading one leaves the host's atime alone (relatime would move
    // it: atime is older than mtime).
    let file = source.join("f");
    std::fs::write(&file, b"owned by nobody").unwrap();
    common::run_ok(Command::new("chown").arg("nobody").arg(&file));
    sys::utimens(
        &file,
        sys::ts(1_000_000_000, 0),
        sys::ts(1_500_000_000, 0),
        0,
    )
    .unwrap();
    let read = common::sh_as(65534, 65534, &format!("cat {}/f", mnt.display()));
    assert_ok("cat as nobody", &read);
    assert_eq!(read.stdout, b"owned by nobody");
    assert_eq!(sys::stat(&file).unwrap().st_atime, 1_000_000_000);
}

/// `lanefs ARGS`; a mount under the transport `LANEFS_TEST_TRANSPORT` names.
fn lanefs_cmd(args: &[&str]) -> Output {
    let mut command = Command::new(lanefs());
    command.args(args);
    if args.first() == Some(&"mount")
        && let Ok(transport) = std::env::var("LANEFS_TEST_TRANSPORT")
    {
        command.args(["--transport", &transport]);
    }
    command.output().unwrap()
}

/// The `maj:min` of the mount at `path`, as mountinfo names it.
fn device_of(path: &Path) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let wanted = path.to_str().unwrap();
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(wanted))
        .and_then(|l| l.split(' ').nth(2))
        .unwrap_or_else(|| panic!("{wanted} is not mounted"))
        .to_owned()
}

/// Without XDG_RUNTIME_DIR (sudo, cron, services) a user's control sockets go in
/// /tmp/lanefs-UID, which another user can make first and listen in. A directory of
/// another user's, open to all as /tmp is, is not used: the daemon serves without `lanefs
/// stats`, and `lanefs stats` does not talk to whoever listens there (the old client read
/// all it was sent, so it showed made-up figures or ran out of memory). In the user's own
/// private directory (one of its own that others could enter is narrowed to 0700) `stats`
/// talks only to a listener of its own user (SO_PEERCRED): root putting its own socket in
/// place of the daemon's is refused too.
#[test]
fn a_control_directory_another_user_made_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let kit = common::UserMountKit::new("control-dir");
    let source = kit.dir.path().join("src");
    let mnt = kit.dir.path().join("mnt");
    let runtime = kit.dir.path().join("run");
    for dir in [&source, &mnt, &runtime] {
        std::fs::create_dir(dir).unwrap();
        common::run_ok(Command::new("chown").arg("nobody").arg(dir));
    }
    let control = runtime.join("lanefs");
    std::fs::create_dir(&control).unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "env"])
            .arg(format!("XDG_RUNTIME_DIR={}", runtime.display()))
            .arg(&kit.bin)
            .args(args);
        command.output().unwrap()
    };
    let mut mount_args = vec!["mount", "--daemon"];
    let transport = std::env::var("LANEFS_TEST_TRANSPORT").ok();
    if let Some(transport) = &transport {
        mount_args.extend(["--transport", transport]);
    }
    let (src, mp) = (source.to_str().unwrap(), mnt.to_str().unwrap());
    mount_args.extend([src, mp]);
    let out = as_nobody(&mount_args);
    let guard = Unmount(mnt.clone());
    assert_ok("mount as nobody", &out);
    let socket = control.join(format!("{}.sock", device_of(&mnt)));
    assert!(
        !socket.exists(),
        "the daemon listens in a directory root made"
    );
    // An impostor listens where a client looks, answering with made-up figures.
    let impostor = |socket: &Path| {
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::thread::spawn(move || {
            if let Some(Ok(mut stream)) = listener.incoming().next() {
                let _ = std::io::Write::write_all(&mut stream, b"{}");
            }
        });
    };
    impostor(&socket);
    let stats_refused = |why: &str| {
        let out = as_nobody(&["stats", mp]);
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && msg.contains(why), "{msg}");
    };
    stats_refused("is not a private directory of uid 65534");
    assert_ok("umount as nobody", &as_nobody(&["umount", mp]));
    drop(guard);

    // The user's own directory, made by an older lanefs under umask 002: narrowed, used.
    std::fs::remove_dir_all(&control).unwrap();
    std::fs::create_dir(&control).unwrap();
    common::run_ok(Command::new("chown").arg("nobody").arg(&control));
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o775)).unwrap();
    let out = as_nobody(&mount_args);
    let _guard = Unmount(mnt.clone());
    assert_ok("mount as nobody", &out);
    let meta = std::fs::symlink_metadata(&control).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            meta.permissions().mode() & 0o7777
        ),
        (65534, 0o700)
    );
    assert_ok("stats as nobody", &as_nobody(&["stats", mp]));
    let socket = control.join(format!("{}.sock", device_of(&mnt)));
    std::fs::remove_file(&socket).unwrap();
    impostor(&socket);
    stats_refused("is served by uid 0, not by a lanefs daemon of uid 65534");
}

/// A mount point that is a symbolic link is refused with the reason (mount(2) would follow
/// it, and the mount then sit where mountinfo does not name it by that path: the daemon
/// could not find its own mount, so `stats` and `umount` said "not a mount point" and a
/// SIGTERM left it serving). One under a linked parent directory is mounted where the link
/// leads and found by either path: `stats`, `umount`, and SIGTERM work.
#[test]
fn a_mount_point_behind_a_symbolic_link() {
    let dir = TempDir::new("symlink-mp");
    let source = dir.path().join("src");
    let real = dir.path().join("real");
    std::fs::create_dir(&source).unwrap();
    std::fs::create_dir_all(real.join("mnt")).unwrap();
    let linked_parent = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &linked_parent).unwrap();
    let linked_mp = dir.path().join("mnt-link");
    std::os::unix::fs::symlink(real.join("mnt"), &linked_mp).unwrap();
    let src = source.to_str().unwrap();

    let out = lanefs_cmd(&["mount", "--daemon", src, linked_mp.to_str().unwrap()]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("is a symbolic link"), "{msg}");
    assert!(!is_mounted(&real.join("mnt")));

    let via_link = linked_parent.join("mnt");
    let via = via_link.to_str().unwrap();
    for stop in ["umount", "SIGTERM"] {
        let out = lanefs_cmd(&["mount", "--daemon", src, via]);
        let _guard = Unmount(real.join("mnt"));
        assert_ok("mount under a linked parent", &out);
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let pid: u32 = line
            .rsplit_once("(daemon pid ")
            .and_then(|(_, rest)| rest.trim().trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("no daemon pid in {line:?}"));
        assert!(is_mounted(&real.join("mnt")));
        assert_ok("stats via the link", &lanefs_cmd(&["stats", via]));
        match stop {
            "umount" => assert_ok("umount via the link", &lanefs_cmd(&["umount", via])),
            _ => {
                common::run_ok(Command::new("kill").arg("-TERM").arg(pid.to_string()));
            }
        }
        assert!(
            wait_until(Duration::from_secs(5), || !process_alive(pid)),
            "{stop}: the daemon still runs"
        );
        assert!(!is_mounted(&real.join("mnt")), "{stop}: still mounted");
    }
}

/// Issue 17 item 8: a mount that is busy only for a moment (here a process that still holds
/// a file for 300 ms, as a child between fork and exec holds copies of its parent's fds)
/// is unmounted by `lanefs umount` once it is free, instead of failing with "target is busy";
/// one that stays busy still fails, after at most a second.
#[test]
fn umount_waits_out_a_moment_of_busy() {
    let source = TempDir::new("busy-src");
    std::fs::write(source.path().join("f"), b"held").unwrap();
    let m = Mount::passthrough(source.path(), &[]);
    let hold = |secs: &str| {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec 3<{}; echo held; exec sleep {secs}",
                m.path("f").display()
            ))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        child
    };
    let umount = || {
        Command::new(lanefs())
            .arg("umount")
            .arg(&m.mountpoint)
            .output()
            .unwrap()
    };

    let mut long = hold("5");
    let started = std::time::Instant::now();
    let out = umount();
    assert!(!out.status.success(), "unmounted while a file was open");
    assert!(String::from_utf8_lossy(&out.stderr).contains("busy"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    long.kill().unwrap();
    long.wait().unwrap();

    let mut brief = hold("0.3");
    let out = umount();
    assert_ok("lanefs umount of a mount busy for 300 ms", &out);
    brief.wait().unwrap();
    assert!(!is_mounted(&m.mountpoint));
    assert!(wait_until(Duration::from_secs(10), || !process_alive(
        m.pid
    )));
}

/// Issue 17 item 8: `umount MP` (util-linux's, which does not retry) right after a mount and
/// some work ending in `rm -rf MP/*` succeeds at once, 20 times in a row with every CPU
/// busy, on both kinds. The report had 7 of 20 fail with "target is busy" for 0.1-0.3 s;
/// that has not been seen again (nor with the old binary), so this guards against it coming
/// back. Every file on the mount is touched by child processes only: this test process
/// holds no fd of the mount that a fork elsewhere in it could copy.
#[test]
fn umount_right_after_use_succeeds_at_once_under_load() {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..std::thread::available_parallelism().map_or(2, |n| n.get()))
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for kind in KINDS {
        for attempt in 0..20 {
            let source = Source::new(kind, "umount-now");
            let dir = TempDir::new("umount-now");
            let mnt = dir.path().join("mnt");
            std::fs::create_dir(&mnt).unwrap();
            assert_ok("mount(8)", &mount_8(source.path(), &mnt, "defaults"));
            let _guard = Unmount(mnt.clone());
            let work = format!(
                "cd {m} && mkdir -p a/b && for i in 1 2 3 4 5 6 7 8; do echo x > a/b/f$i; \
                 echo y > g$i; done && cat a/b/* g* >/dev/null && ls -lR >/dev/null && \
                 rm -rf {m}/*",
                m = mnt.display()
            );
            assert_ok("the work", &common::sh(&work));
            let out = Command::new("umount").arg(&mnt).output().unwrap();
            if !out.status.success() {
                failures.push(format!(
                    "{kind:?} try {attempt}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for hog in hogs {
        hog.join().unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
