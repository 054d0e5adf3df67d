//! File attributes through the ioctls the kernel forwards (issue 11 item 7, issue 17 item
//! 9): lsattr and chattr +i/+a/+d, FS_IOC_FSGETXATTR/FSSETXATTR, on files and directories,
//! with the caller's rights, side by side with native tmpfs. The old code answered every
//! FUSE_IOCTL with ENOSYS, so lsattr and chattr failed with "Operation not supported".

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use common::subject::{KINDS, Kind, Source};
use common::sys::{self, Errno};
use common::{Mount, Tmpfs};

/// `lsattr -d PATH`'s flag column.
fn lsattr(p: &Path) -> String {
    let out = Command::new("lsattr").arg("-d").arg(p).output().unwrap();
    assert!(
        out.status.success(),
        "lsattr {}: {}",
        p.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn chattr(p: &Path, change: &str) -> Result<(), String> {
    let out = Command::new("chattr").arg(change).arg(p).output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// `sh -c` as nobody (uid 65534), for the caller's-rights checks.
fn as_nobody(script: &str) -> bool {
    common::sh_as(65534, 65534, script).status.success()
}

/// The fsx_xflags word of FS_IOC_FSGETXATTR.
fn fs_xflags(p: &Path) -> u32 {
    let fd = sys::open(p, libc::O_RDONLY | libc::O_NONBLOCK, 0).unwrap();
    let mut raw = [0u8; 28];
    // SAFETY: the ioctl writes a 28-byte struct fsxattr into raw.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), 0x801c_581f, raw.as_mut_ptr()) };
    assert_eq!(
        rc,
        0,
        "FS_IOC_FSGETXATTR {}: {}",
        p.display(),
        Errno::last()
    );
    u32::from_ne_bytes(raw[..4].try_into().unwrap())
}

/// FS_IOC_FSSETXATTR with fsx_xflags `xflags` (the rest as read).
fn set_fs_xflags(p: &Path, xflags: u32) -> Result<(), Errno> {
    let fd = sys::open(p, libc::O_RDONLY | libc::O_NONBLOCK, 0).unwrap();
    let mut raw = [0u8; 28];
    // SAFETY: the ioctls read and write a 28-byte struct fsxattr in raw.
    unsafe {
        assert_eq!(
            libc::ioctl(fd.as_raw_fd(), 0x801c_581f, raw.as_mut_ptr()),
            0
        );
        raw[..4].copy_from_slice(&xflags.to_ne_bytes());
        if libc::ioctl(fd.as_raw_fd(), 0x401c_5820, raw.as_ptr()) != 0 {
            return Err(Errno::last());
        }
    }
    Ok(())
}

/// What each step of a chattr session did under `root` (a directory on the file system under
/// test): lsattr's column, and whether the operations the flags forbid were refused.
fn chattr_session(root: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    let file = root.join("f");
    let dir = root.join("d");
    std::fs::write(&file, b"first\n").unwrap();
    std::fs::create_dir(&dir).unwrap();
    let mut note = |what: &str, value: String| seen.push(format!("{what}: {value}"));
    note("fresh", lsattr(&file));
    note(
        "+i",
        format!("{:?}", chattr(&file, "+i").map(|_| lsattr(&file))),
    );
    note(
        "append to immutable",
        format!(
            "{:?}",
            sys::open(&file, libc::O_WRONLY | libc::O_APPEND, 0).map(drop)
        ),
    );
    note("unlink immutable", format!("{:?}", sys::unlink(&file)));
    note(
        "xflags immutable",
        format!("{:#x}", fs_xflags(&file) & 0x18),
    );
    note(
        "-i +a",
        format!("{:?}", chattr(&file, "-i").and(chattr(&file, "+a"))),
    );
    note(
        "append to append-only",
        format!(
            "{:?}",
            sys::open(&file, libc::O_WRONLY | libc::O_APPEND, 0).map(drop)
        ),
    );
    note(
        "overwrite append-only",
        format!(
            "{:?}",
            sys::open(&file, libc::O_WRONLY | libc::O_TRUNC, 0).map(drop)
        ),
    );
    note(
        "-a via FSSETXATTR",
        format!("{:?}", set_fs_xflags(&file, 0)),
    );
    note("after", lsattr(&file));
    note(
        "nodump",
        format!("{:?}", chattr(&file, "+d").map(|_| lsattr(&file))),
    );
    note(
        "dir +i",
        format!("{:?}", chattr(&dir, "+i").map(|_| lsattr(&dir))),
    );
    note(
        "create in immutable dir",
        format!(
            "{:?}",
            sys::open(&dir.join("x"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(drop)
        ),
    );
    note(
        "dir -i",
        format!("{:?}", chattr(&dir, "-i").map(|_| lsattr(&dir))),
    );
    // The caller's rights: a stranger may not, the owner may (but not +i without
    // CAP_LINUX_IMMUTABLE).
    let shown = file.display();
    note(
        "stranger +d",
        as_nobody(&format!("chattr +d {shown} 2>/dev/null")).to_string(),
    );
    std::fs::write(root.join("mine"), b"").unwrap();
    common::run_ok(Command::new("chown").arg("65534").arg(root.join("mine")));
    let mine = root.join("mine");
    let mine = mine.display();
    note(
        "owner -d +d",
        as_nobody(&format!("chattr -d {mine} && chattr +d {mine}")).to_string(),
    );
    note(
        "owner +i",
        as_nobody(&format!("chattr +i {mine} 2>/dev/null")).to_string(),
    );
    note("mine", lsattr(&root.join("mine")));
    seen
}

#[test]
fn chattr_and_lsattr_work_as_on_tmpfs() {
    let native = Tmpfs::new("16M");
    let expected = chattr_session(&native.path);
    // tmpfs supports the flags (a kernel without them would make this test vacuous).
    assert!(
        expected.iter().any(|s| s.starts_with("+i: Ok(")),
        "{expected:#?}"
    );
    for kind in KINDS {
        let source = Source::new(kind, "chattr");
        let m = source.mount(&[]);
        let got = chattr_session(&m.mountpoint);
        assert_eq!(got, expected, "lanefs ({kind:?}) vs tmpfs");
        if kind == Kind::Passthrough {
            // The host file carries the attribute.
            assert_eq!(
                lsattr(&source.path().join("f")),
                lsattr(&native.path.join("f"))
            );
        }
        assert!(m.op_count("ioctl") > 0);
        m.unmount();
    }
}

/// What immutable and append-only forbid beyond opens and unlink, on tmpfs and on the
/// volume (which enforces them itself: FUSE inodes carry no flags for the kernel to check):
/// rename, link, truncate, chmod, utimes, xattrs, writes through a descriptor opened before
/// the flag, and entries of an immutable or append-only directory.
fn guarded_changes(root: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    let f = root.join("g");
    let d = root.join("gd");
    std::fs::write(&f, b"guarded\n").unwrap();
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("inside"), b"").unwrap();
    for flag in ["+i", "+a"] {
        let early = sys::open(&f, libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        chattr(&f, flag).unwrap();
        chattr(&d, flag).unwrap();
        let mut note =
            |what: &str, r: Result<(), Errno>| seen.push(format!("{flag} {what}: {r:?}"));
        note("rename", sys::rename(&f, &root.join("g2")));
        note("link", sys::link(&f, &root.join("g3")));
        note("truncate", sys::truncate(&f, 1));
        note("chmod", sys::chmod(&f, 0o600));
        note(
            "utimes now",
            sys::utimens(
                &f,
                sys::ts(0, libc::UTIME_NOW),
                sys::ts(0, libc::UTIME_NOW),
                0,
            ),
        );
        note(
            "utimes set",
            sys::utimens(&f, sys::ts(5, 0), sys::ts(5, 0), 0),
        );
        note("setxattr", sys::setxattr(&f, "user.k", b"v", 0));
        note("append early fd", sys::write(&early, b"x").map(drop));
        note("pwrite O_RDWR", {
            sys::open(&f, libc::O_RDWR, 0).and_then(|fd| sys::pwrite(&fd, b"y", 0).map(drop))
        });
        note(
            "create in dir",
            sys::open(&d.join("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(drop),
        );
        note("unlink in dir", sys::unlink(&d.join("inside")));
        note("mkdir in dir", sys::mkdir(&d.join("sub"), 0o755));
        chattr(&f, &flag.replace('+', "-")).unwrap();
        chattr(&d, &flag.replace('+', "-")).unwrap();
        let _ = sys::rmdir(&d.join("sub"));
        let _ = sys::unlink(&d.join("new"));
    }
    seen.push(format!(
        "content: {:?}",
        String::from_utf8_lossy(&std::fs::read(&f).unwrap())
    ));
    seen
}

#[test]
fn immutable_and_append_only_guard_every_change_as_on_tmpfs() {
    let native = Tmpfs::new("16M");
    let expected = guarded_changes(&native.path);
    for kind in KINDS {
        let source = Source::new(kind, "guards");
        let m = source.mount(&[]);
        let got = guarded_changes(&m.mountpoint);
        assert_eq!(got, expected, "lanefs ({kind:?}) vs tmpfs");
        m.unmount();
    }
}

/// An append-only file written anywhere but at its end through a descriptor opened for
/// appending: natively F_SETFL refuses to clear O_APPEND; a FUSE inode has no such flag for
/// the kernel to check, so the volume refuses the write itself (it was written at offset 0).
/// (The passthrough's own descriptor of the file keeps O_APPEND, so there the byte lands at
/// the end: not compared.)
#[test]
fn an_append_only_file_is_written_only_at_its_end() {
    fn session(root: &Path) -> Vec<String> {
        let f = root.join("log");
        std::fs::write(&f, b"line\n").unwrap();
        chattr(&f, "+a").unwrap();
        let fd = sys::open(&f, libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        let overwrite = sys::setfl(&fd, 0).and_then(|()| sys::pwrite(&fd, b"X", 0));
        // (Natively the descriptor never lost O_APPEND; on FUSE it did, and gets it back.)
        let appended = sys::setfl(&fd, libc::O_APPEND).and_then(|()| sys::write(&fd, b"more\n"));
        drop(fd);
        chattr(&f, "-a").unwrap();
        vec![
            format!("overwrite: {overwrite:?}"),
            format!("append: {appended:?}"),
            format!("content: {:?}", std::fs::read_to_string(&f).unwrap()),
        ]
    }
    let native = Tmpfs::new("16M");
    let expected = session(&native.path);
    let source = Source::new(Kind::Volume, "append-only");
    let m = source.mount(&[]);
    assert_eq!(session(&m.mountpoint), expected, "lanefs volume vs tmpfs");
    m.unmount();
}

/// The volume keeps the flags across a remount, and its xattr calls never show the row
/// that holds them.
#[test]
fn the_volume_keeps_the_flags_and_hides_where() {
    let source = Source::new(Kind::Volume, "chattr-kept");
    let m = source.mount(&[]);
    std::fs::write(m.path("f"), b"x").unwrap();
    chattr(&m.path("f"), "+a").unwrap();
    chattr(&m.path("f"), "+d").unwrap();
    m.unmount();
    let m = source.mount(&[]);
    assert_eq!(lsattr(&m.path("f")), "-----ad---------------");
    assert_eq!(
        sys::open(&m.path("f"), libc::O_WRONLY, 0).unwrap_err(),
        Errno(libc::EPERM)
    );
    assert_eq!(
        sys::listxattr(&m.path("f"), 1024).unwrap().1,
        Vec::<String>::new()
    );
    assert_eq!(
        sys::getxattr(&m.path("f"), "lanefs.fileattr", 64).unwrap_err(),
        Errno(libc::ENODATA)
    );
    chattr(&m.path("f"), "-a").unwrap();
    std::fs::write(m.path("f"), b"y").unwrap();
    m.unmount();
}

/// The same without kernel passthrough: the ioctl then arrives on a page-cache open.
#[test]
fn chattr_works_without_kernel_passthrough() {
    let source = Tmpfs::new("16M");
    let m = Mount::passthrough(&source.path, &["--no-passthrough"]);
    std::fs::write(m.path("f"), b"x").unwrap();
    chattr(&m.path("f"), "+a").unwrap();
    assert!(lsattr(&source.path.join("f")).contains('a'));
    assert_eq!(
        sys::open(&m.path("f"), libc::O_WRONLY | libc::O_TRUNC, 0).unwrap_err(),
        Errno(libc::EPERM)
    );
    chattr(&m.path("f"), "-a").unwrap();
    m.unmount();
}

/// What a sequence of capability changes and truncates shows under `root`: the kernel asks
/// for security.capability before each truncate (lanefs remembers "none" for the attribute
/// timeout), and that memory must never hide a capability set through the mount, nor keep
/// one a truncate removed.
fn capability_session(root: &Path) -> Vec<String> {
    let file = root.join("prog");
    std::fs::write(&file, b"#!/bin/sh\n").unwrap();
    let caps = |what: &str| {
        let size = sys::getxattr(&file, "security.capability", 0).map(|(n, _)| n);
        format!("{what}: {size:?}")
    };
    let truncate = || {
        let fd = sys::open(&file, libc::O_WRONLY, 0).unwrap();
        sys::ftruncate(&fd, 4).unwrap();
    };
    let mut seen = vec![caps("fresh")];
    truncate();
    seen.push(caps("truncated"));
    // cap_net_raw+ep in the VFS_CAP_REVISION_2 layout: magic|effective, then permitted and
    // inheritable words for capabilities 0-31 and 32-63.
    let mut value = Vec::new();
    for word in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        value.extend_from_slice(&word.to_ne_bytes());
    }
    seen.push(format!(
        "set: {:?}",
        sys::setxattr(&file, "security.capability", &value, 0)
    ));
    seen.push(caps("after set"));
    truncate();
    seen.push(caps("truncated again"));
    seen
}

#[test]
fn capability_answers_stay_true_as_on_tmpfs() {
    let native = Tmpfs::new("16M");
    let expected = capability_session(&native.path);
    assert_eq!(expected[3], "after set: Ok(20)", "{expected:?}");
    for kind in KINDS {
        let source = Source::new(kind, "caps");
        let m = source.mount(&["--attr-timeout", "60"]);
        let got = capability_session(&m.mountpoint);
        assert_eq!(got, expected, "lanefs ({kind:?}) vs tmpfs");
        m.unmount();
    }
}

/// FS_IOC_SETFLAGS and its 32-bit twin FS_IOC32_SETFLAGS (which the kernel forwards to us
/// unchecked when a 64-bit caller issues it raw).
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IOC32_SETFLAGS: libc::c_ulong = 0x4004_6602;

/// Runs `ioctl(cmd, flags)` on `path` (opened read-only) in a child that is nobody inside a
/// user namespace of its own, where it holds every capability (CapEff all ones in
/// /proc/PID/status) but none over the host's files. Returns the ioctl's errno (0: it worked).
fn ioctl_as_nobody_in_userns(path: &Path, cmd: libc::c_ulong, flags: libc::c_int) -> i32 {
    let path = sys::cstr(path);
    // SAFETY: the child makes only raw syscalls (no allocation, no locks) and ends in _exit;
    // the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", Errno::last());
        if pid == 0 {
            let code = (|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(65534, 65534, 65534) != 0
                    || libc::setresuid(65534, 65534, 65534) != 0
                {
                    return 200;
                }
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return 201;
                }
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK);
                if fd < 0 {
                    return 202;
                }
                if libc::ioctl(fd, cmd, &flags) == 0 {
                    0
                } else {
                    *libc::__errno_location()
                }
            })();
            libc::_exit(code);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        let code = libc::WEXITSTATUS(status);
        assert!(code < 200, "child setup step {code} failed");
        code
    }
}

/// Issue 11 review item 1: an unprivileged caller in a user namespace of its own (full
/// capabilities there, none over our files) must not set immutable or append-only through
/// the mount, neither on a file it does not own nor on its own, by the native ioctl (which the
/// kernel checks) nor by the 32-bit number (which the kernel forwards unchecked). The old
/// code trusted CapEff from /proc and served FS_IOC32_SETFLAGS: nobody made root's file
/// immutable.
#[test]
fn a_user_namespace_gives_no_rights_over_file_attributes() {
    let source = Tmpfs::new("16M");
    let m = Mount::passthrough(&source.path, &[]);
    std::fs::write(m.path("roots"), b"x").unwrap();
    std::fs::write(m.path("nobodys"), b"x").unwrap();
    common::run_ok(Command::new("chown").arg("65534").arg(m.path("nobodys")));
    for name in ["roots", "nobodys"] {
        for (cmd, what) in [(FS_IOC_SETFLAGS, "native"), (FS_IOC32_SETFLAGS, "32-bit")] {
            for (flag, letter) in [(0x10, 'i'), (0x20, 'a')] {
                let errno = ioctl_as_nobody_in_userns(&m.path(name), cmd, flag);
                assert_ne!(errno, 0, "{what} +{letter} on {name} worked");
                assert!(
                    !lsattr(&source.path.join(name)).contains(letter),
                    "{what} +{letter} on {name}: {}",
                    lsattr(&source.path.join(name))
                );
            }
        }
    }
    // The owner may still change what needs no privilege, and root anything.
    let mine = m.path("nobodys");
    assert!(as_nobody(&format!("chattr +d {}", mine.display())));
    chattr(&m.path("roots"), "+a").unwrap();
    assert!(lsattr(&source.path.join("roots")).contains('a'));
    chattr(&m.path("roots"), "-a").unwrap();
    m.unmount();
}
