//! Escape attempts against the passthrough file system: a name under the mount must never
//! resolve to a host path outside the exported directory, and the server must never follow a
//! symlink on the client's behalf.
//!
//! The layouts use *relative* symlinks so that who resolved a link is visible: a link
//! `SOURCE/rel -> ../secret` names `T/secret` if the server follows it (T is SOURCE's parent)
//! but `M/secret` if the client's kernel does (M is the mount point's parent), and the two
//! files hold different text.

mod common;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::sys::{self, Errno};
use common::{Mount, TempDir, deadline, wait_until};

/// One operation tried through the mount.
type Attempt = Box<dyn FnOnce() -> Result<(), Errno> + Send>;

const SERVER_SIDE: &[u8] = b"SERVER-SIDE secret";
const CLIENT_SIDE: &[u8] = b"CLIENT-SIDE file";

/// A source dir `T/src` with an outside neighbour `T/secret` and `T/outside/` (a dir holding
/// `inner`), mounted at `M/mnt` where `M/secret` and `M/outside/` are the client's own.
struct Layout {
    t: TempDir,
    src: PathBuf,
    m: Mount,
}

impl Layout {
    fn new(args: &[&str]) -> Layout {
        let t = TempDir::new("escape");
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(t.path().join("secret"), SERVER_SIDE).unwrap();
        std::fs::create_dir(t.path().join("outside")).unwrap();
        std::fs::write(t.path().join("outside/inner"), SERVER_SIDE).unwrap();
        let m = Mount::passthrough(&src, args);
        let client = m.dir.path();
        std::fs::write(client.join("secret"), CLIENT_SIDE).unwrap();
        std::fs::create_dir(client.join("outside")).unwrap();
        Layout { t, src, m }
    }

    /// What the server-side neighbours look like (must never change).
    fn outside_state(&self) -> String {
        let t = self.t.path();
        let mut s = String::new();
        for p in [t.join("secret"), t.join("outside/inner")] {
            let st = sys::stat(&p).unwrap();
            s += &format!(
                "{}: {:o} {}:{} nlink={} {:?} xattrs={:?}\n",
                p.display(),
                st.st_mode,
                st.st_uid,
                st.st_gid,
                st.st_nlink,
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()),
                sys::listxattr(&p, 4096).unwrap().1
            );
        }
        let mut names: Vec<_> = std::fs::read_dir(t)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        s += &format!("T: {names:?}\n");
        let mut names: Vec<_> = std::fs::read_dir(t.join("outside"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        s += &format!("T/outside: {names:?}\n");
        s
    }
}

#[test]
fn dotdot_from_the_mount_root_stays_on_the_client() {
    let l = Layout::new(&[]);
    let mnt = &l.m.mountpoint;
    // `..` of the mount root is the mount point's parent, never the source's.
    let up = sys::stat(&mnt.join("..")).unwrap();
    let client_parent = sys::stat(l.m.dir.path()).unwrap();
    assert_eq!(up.st_ino, client_parent.st_ino);
    assert_eq!(
        std::fs::read(mnt.join("../secret")).unwrap(),
        CLIENT_SIDE,
        "mnt/../secret must be the client's"
    );
    let root = sys::open(mnt, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
    let fd = sys::openat(&root, "../secret", libc::O_RDONLY, 0).unwrap();
    assert_eq!(sys::pread(&fd, 64, 0).unwrap(), CLIENT_SIDE);
    // Deep `..` chains from inside the mount also climb the client's tree.
    std::fs::create_dir_all(mnt.join("a/b/c")).unwrap();
    assert_eq!(
        std::fs::read(mnt.join("a/b/c/../../../../secret")).unwrap(),
        CLIENT_SIDE
    );
    // openat2 with RESOLVE_BENEATH refuses to leave.
    // SAFETY: open_how is plain data; zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = libc::O_RDONLY as u64;
    how.resolve = libc::RESOLVE_BENEATH;
    let name = sys::cstr("a/../../secret");
    // SAFETY: openat2 with a valid open_how of the given size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd() as i64,
            name.as_ptr(),
            &how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    assert_eq!(r, -1);
    assert_eq!(Errno::last().0, libc::EXDEV);
    let before = l.outside_state();
    assert!(before.contains("SERVER-SIDE"));
    drop((fd, root));
    l.m.unmount();
}

#[test]
fn symlinks_in_the_source_are_resolved_by_the_client() {
    for args in [&[][..], &["--no-file-handles", "--fd-cache", "1"][..]] {
        let l = Layout::new(args);
        let before = l.outside_state();
        let (src, mnt) = (&l.src, &l.m.mountpoint);
        std::os::unix::fs::symlink("../secret", src.join("rel")).unwrap();
        let abs = l.t.path().join("secret");
        std::os::unix::fs::symlink(&abs, src.join("abs")).unwrap();
        std::os::unix::fs::symlink("../outside", src.join("dlink")).unwrap();
        std::fs::write(src.join("plain"), b"plain").unwrap();

        // readlink gives the text; lstat shows a symlink; O_NOFOLLOW refuses it.
        assert_eq!(sys::readlink(&mnt.join("rel")).unwrap(), "../secret");
        assert_eq!(
            sys::readlink(&mnt.join("abs")).unwrap(),
            abs.to_str().unwrap()
        );
        let st = sys::lstat(&mnt.join("rel")).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
        assert_eq!(
            sys::open(&mnt.join("rel"), libc::O_RDONLY | libc::O_NOFOLLOW, 0).unwrap_err(),
            Errno(libc::ELOOP)
        );
        let p = sys::open(&mnt.join("rel"), libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        assert_eq!(
            sys::fstat(&p).unwrap().st_mode & libc::S_IFMT,
            libc::S_IFLNK
        );
        // Following happens in the client: the relative link lands next to the mount point.
        assert_eq!(
            std::fs::read(mnt.join("rel")).unwrap(),
            CLIENT_SIDE,
            "{args:?}"
        );
        // (An absolute link names the same host path from both sides.)
        assert_eq!(std::fs::read(mnt.join("abs")).unwrap(), SERVER_SIDE);

        // An absolute link made through the mount is stored as text and followed by the
        // client: it reads the client's /etc/passwd.
        sys::symlink("/etc/passwd", &mnt.join("pw")).unwrap();
        assert_eq!(sys::readlink(&mnt.join("pw")).unwrap(), "/etc/passwd");
        assert_eq!(sys::readlink(&src.join("pw")).unwrap(), "/etc/passwd");
        assert_eq!(
            std::fs::read(mnt.join("pw")).unwrap(),
            std::fs::read("/etc/passwd").unwrap()
        );
        assert_eq!(
            sys::lstat(&src.join("pw")).unwrap().st_mode & libc::S_IFMT,
            libc::S_IFLNK
        );

        // Creating "through" a symlinked directory creates on the client's side.
        std::fs::write(mnt.join("dlink/new"), b"x").unwrap();
        std::fs::create_dir(mnt.join("dlink/newdir")).unwrap();
        assert!(l.m.dir.path().join("outside/new").exists());
        assert!(l.m.dir.path().join("outside/newdir").is_dir());
        let listed: Vec<_> = std::fs::read_dir(mnt.join("dlink"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!listed.contains(&"inner".to_string()), "{listed:?}");

        // Changes through the link name reach the client's target, never T/secret.
        sys::chmod(&mnt.join("rel"), 0o600).unwrap();
        assert_eq!(
            sys::stat(&l.m.dir.path().join("secret")).unwrap().st_mode & 0o777,
            0o600
        );
        sys::truncate(&mnt.join("rel"), 6).unwrap();
        sys::setxattr(&mnt.join("rel"), "user.x", b"y", 0).unwrap();
        let _ = sys::utimens(&mnt.join("rel"), sys::ts(1, 0), sys::ts(1, 0), 0);
        // ...and those on the link itself stay on the link.
        sys::lchown(&mnt.join("rel"), 4321, 4321).unwrap();
        assert_eq!(sys::lstat(&src.join("rel")).unwrap().st_uid, 4321);
        sys::utimens(
            &mnt.join("rel"),
            sys::ts(5, 0),
            sys::ts(5, 0),
            libc::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        assert_eq!(sys::lstat(&src.join("rel")).unwrap().st_mtime, 5);
        sys::link(&mnt.join("rel"), &mnt.join("rel2")).unwrap();
        assert_eq!(
            sys::lstat(&src.join("rel2")).unwrap().st_mode & libc::S_IFMT,
            libc::S_IFLNK
        );
        sys::rename(&mnt.join("dlink"), &mnt.join("dlink2")).unwrap();
        assert_eq!(sys::readlink(&src.join("dlink2")).unwrap(), "../outside");
        sys::unlink(&mnt.join("rel")).unwrap();
        sys::unlink(&mnt.join("rel2")).unwrap();
        // O_CREAT|O_EXCL on a symlink name is EEXIST (it is never followed to create).
        assert_eq!(
            sys::open(
                &mnt.join("abs"),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o644
            )
            .unwrap_err(),
            Errno(libc::EEXIST)
        );
        assert_eq!(
            l.outside_state(),
            before,
            "{args:?}: outside the source changed"
        );
        drop(p);
        l.m.unmount();
    }
}

/// The server holds each inode by handle or fd, not by path: when the host swaps a name the
/// client has cached for a symlink pointing outside, operations on the cached inode must not
/// reach the symlink's target. Long timeouts keep the client using its cached nodeids;
/// `--fd-cache 1` makes the server reopen inodes for nearly every operation.
#[test]
fn host_swapping_a_name_for_a_symlink_never_redirects_the_server() {
    let variants: [&[&str]; 3] = [
        &["--attr-timeout", "60", "--entry-timeout", "60"],
        &[
            "--attr-timeout",
            "60",
            "--entry-timeout",
            "60",
            "--fd-cache",
            "1",
        ],
        &[
            "--attr-timeout",
            "60",
            "--entry-timeout",
            "60",
            "--no-file-handles",
            "--fd-cache",
            "1",
        ],
    ];
    for args in variants {
        let l = Layout::new(args);
        let (src, mnt) = (l.src.clone(), l.m.mountpoint.clone());
        std::fs::write(src.join("f"), b"INSIDE").unwrap();
        std::fs::create_dir(src.join("d")).unwrap();
        std::fs::write(src.join("d/x"), b"x").unwrap();
        // The client learns both inodes.
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"INSIDE");
        assert!(mnt.join("d/x").exists());
        let before = l.outside_state();
        // Behind its back, each name becomes a symlink to the outside.
        std::fs::rename(src.join("f"), src.join("f.orig")).unwrap();
        std::os::unix::fs::symlink("../secret", src.join("f")).unwrap();
        std::fs::rename(src.join("d"), src.join("d.orig")).unwrap();
        std::os::unix::fs::symlink("../outside", src.join("d")).unwrap();

        let m2 = mnt.clone();
        let read = deadline(Duration::from_secs(10), "read of swapped f", move || {
            std::fs::read(m2.join("f"))
        });
        if let Ok(data) = &read {
            assert_ne!(data.as_slice(), SERVER_SIDE, "{args:?}: server followed f");
        }
        let f = mnt.join("f");
        let d = mnt.join("d");
        let attempts: Vec<(&str, Attempt)> = vec![
            ("write", {
                let f = f.clone();
                Box::new(move || {
                    let fd = sys::open(&f, libc::O_WRONLY | libc::O_TRUNC, 0)?;
                    sys::write(&fd, b"PWNED").map(|_| ())
                })
            }),
            ("chmod", {
                let f = f.clone();
                Box::new(move || sys::chmod(&f, 0o777))
            }),
            ("chown", {
                let f = f.clone();
                Box::new(move || sys::chown(&f, 1, 1))
            }),
            ("truncate", {
                let f = f.clone();
                Box::new(move || sys::truncate(&f, 0))
            }),
            ("setxattr", {
                let f = f.clone();
                Box::new(move || sys::setxattr(&f, "user.pwned", b"1", 0))
            }),
            ("utimens", {
                let f = f.clone();
                Box::new(move || sys::utimens(&f, sys::ts(7, 0), sys::ts(7, 0), 0))
            }),
            ("create in d", {
                let d = d.clone();
                Box::new(move || {
                    sys::open(&d.join("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ())
                })
            }),
            ("mkdir in d", {
                let d = d.clone();
                Box::new(move || sys::mkdir(&d.join("newdir"), 0o755))
            }),
            ("mknod in d", {
                let d = d.clone();
                Box::new(move || sys::mknod(&d.join("fifo"), libc::S_IFIFO | 0o644, 0))
            }),
            ("symlink in d", {
                let d = d.clone();
                Box::new(move || sys::symlink("x", &d.join("sl")))
            }),
            ("rename in d", {
                let d = d.clone();
                Box::new(move || sys::rename(&d.join("x"), &d.join("inner")))
            }),
            ("unlink in d", {
                let d = d.clone();
                Box::new(move || sys::unlink(&d.join("inner")))
            }),
            ("link into d", {
                let d = d.clone();
                let f = f.clone();
                Box::new(move || sys::link(&f, &d.join("hard")))
            }),
            ("setxattr on d", {
                let d = d.clone();
                Box::new(move || sys::setxattr(&d, "user.pwned", b"1", 0))
            }),
        ];
        let mut outcomes = Vec::new();
        for (what, op) in attempts {
            let r = deadline(Duration::from_secs(10), what, op);
            outcomes.push(format!("{what}: {r:?}"));
        }
        let m3 = mnt.clone();
        let listing = deadline(Duration::from_secs(10), "readdir of swapped d", move || {
            std::fs::read_dir(m3.join("d")).map(|rd| {
                rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect::<Vec<_>>()
            })
        });
        if let Ok(names) = &listing {
            assert!(
                !names.contains(&"inner".to_string()),
                "{args:?}: listing of d shows T/outside: {names:?}"
            );
        }
        assert_eq!(
            l.outside_state(),
            before,
            "{args:?}: an operation through the mount reached outside the source; \
             outcomes: {outcomes:#?}"
        );
        // What succeeded acted on the inodes the client knew (now renamed aside), which
        // shows the operations did reach the server.
        if outcomes.iter().any(|o| o == "chmod: Ok(())") {
            assert_eq!(
                sys::stat(&src.join("f.orig")).unwrap().st_mode & 0o777,
                0o777,
                "{args:?}"
            );
        }
        if outcomes.iter().any(|o| o == "create in d: Ok(())") {
            assert!(src.join("d.orig/new").exists(), "{args:?}");
        }
        eprintln!("{args:?}: read {read:?}, listing {listing:?}, {outcomes:?}");
        l.m.unmount();
    }
}

/// A directory the host keeps moving between the source and an outside neighbour (which
/// holds `secret`) while the client works under it: no client path ever shows the
/// neighbour's contents, nothing is created in the neighbour itself, and nothing hangs.
#[test]
fn a_directory_moved_in_and_out_of_the_source_does_not_leak_its_neighbours() {
    for args in [&[][..], &["--fd-cache", "1", "--entry-timeout", "0"][..]] {
        let l = Layout::new(args);
        let src = l.src.clone();
        let away = l.t.path().join("away");
        std::fs::create_dir(&away).unwrap();
        std::fs::write(away.join("secret"), SERVER_SIDE).unwrap();
        std::fs::create_dir(src.join("sub")).unwrap();
        std::fs::write(src.join("sub/marker"), b"marker").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let moves = Arc::new(AtomicUsize::new(0));
        let mover = {
            let (stop, moves, src, away) = (stop.clone(), moves.clone(), src.clone(), away.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(src.join("sub"), away.join("sub")).unwrap();
                    std::thread::sleep(Duration::from_micros(300));
                    std::fs::rename(away.join("sub"), src.join("sub")).unwrap();
                    std::thread::sleep(Duration::from_micros(300));
                    moves.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let mnt = l.m.mountpoint.clone();
        let seen = deadline(
            Duration::from_secs(30),
            "client under a moving dir",
            move || {
                let mut seen = Vec::new();
                let start = Instant::now();
                let mut i = 0;
                while start.elapsed() < Duration::from_secs(2) {
                    i += 1;
                    let sub = mnt.join("sub");
                    if let Ok(data) = std::fs::read(sub.join("marker")) {
                        seen.push(String::from_utf8_lossy(&data).into_owned());
                    }
                    for path in [
                        sub.join("../secret"),
                        sub.join("secret"),
                        mnt.join("secret"),
                    ] {
                        if let Ok(data) = std::fs::read(&path) {
                            seen.push(format!(
                                "{}: {}",
                                path.display(),
                                String::from_utf8_lossy(&data)
                            ));
                        }
                    }
                    if let Ok(dir) = sys::open(&sub, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                        && let Ok(fd) = sys::openat(&dir, "../secret", libc::O_RDONLY, 0)
                    {
                        seen.push(format!("openat ../secret: {:?}", sys::pread(&fd, 64, 0)));
                    }
                    let tmp = sub.join(format!("t{i}"));
                    if std::fs::write(&tmp, b"t").is_ok() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                    if let Ok(rd) = std::fs::read_dir(&sub) {
                        for e in rd.flatten() {
                            if e.file_name() == "secret" {
                                seen.push("listing of sub shows secret".into());
                            }
                        }
                    }
                }
                seen
            },
        );
        stop.store(true, Ordering::Relaxed);
        mover.join().unwrap();
        assert!(moves.load(Ordering::Relaxed) > 10, "the race barely ran");
        let leaks: Vec<_> = seen
            .iter()
            .filter(|s| s.contains("SERVER-SIDE") || s.contains("secret"))
            .collect();
        assert!(leaks.is_empty(), "{args:?}: leaked: {leaks:?}");
        // Only the moving dir and the secret ever lived in the neighbour.
        let mut names: Vec<_> = std::fs::read_dir(&away)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["secret"], "{args:?}");
        // The mount still works, and the dir is back in the source.
        // (A lookup made while the dir was away may be cached as absent for the entry
        // timeout.)
        let after = l.m.path("sub/after");
        assert!(
            wait_until(Duration::from_secs(3), || std::fs::write(&after, b"ok")
                .is_ok()),
            "{args:?}: cannot create under sub after the race: {:?}",
            std::fs::write(&after, b"ok")
        );
        assert_eq!(std::fs::read(src.join("sub/after")).unwrap(), b"ok");
        assert_eq!(std::fs::read(l.m.path("sub/marker")).unwrap(), b"marker");
        l.m.unmount();
    }
}

/// A hard link the host made to a file outside the source is the same inode: that is allowed
/// and works; removing the name through the mount leaves the outside file alone.
#[test]
fn a_host_hard_link_to_an_outside_file_is_the_same_inode() {
    let l = Layout::new(&[]);
    let outside = l.t.path().join("outside/inner");
    std::fs::hard_link(&outside, l.src.join("hl")).unwrap();
    let mnt = &l.m.mountpoint;
    assert_eq!(std::fs::read(mnt.join("hl")).unwrap(), SERVER_SIDE);
    assert_eq!(sys::stat(&mnt.join("hl")).unwrap().st_nlink, 2);
    let fd = sys::open(&mnt.join("hl"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    sys::write(&fd, b"+").unwrap();
    drop(fd);
    assert!(std::fs::read(&outside).unwrap().ends_with(b"+"));
    sys::unlink(&mnt.join("hl")).unwrap();
    assert_eq!(sys::stat(&outside).unwrap().st_nlink, 1);
    assert!(!l.src.join("hl").exists());
    l.m.unmount();
}

/// Files and dirs removed on the host behind the mount give ENOENT (or ESTALE) promptly,
/// never a hang; open fds keep working on the unlinked inode.
#[test]
fn host_removals_give_enoent_promptly() {
    let gone = |r: &Result<(), Errno>| matches!(r, Err(Errno(e)) if *e == libc::ENOENT || *e == libc::ESTALE);
    for (args, cached) in [
        (&["--attr-timeout", "0", "--entry-timeout", "0"][..], false),
        (
            &[
                "--attr-timeout",
                "0",
                "--entry-timeout",
                "0",
                "--fd-cache",
                "1",
            ][..],
            false,
        ),
        (&["--attr-timeout", "1", "--entry-timeout", "1"][..], true),
    ] {
        let source = TempDir::new("rm-src");
        let src = source.path().to_path_buf();
        std::fs::write(src.join("f"), b"file").unwrap();
        std::fs::write(src.join("held"), b"held").unwrap();
        std::fs::create_dir_all(src.join("d/e")).unwrap();
        std::fs::write(src.join("d/e/inner"), b"inner").unwrap();
        let m = Mount::passthrough(&src, args);
        let mnt = m.mountpoint.clone();
        assert!(mnt.join("f").exists() && mnt.join("d/e/inner").exists());
        let held = sys::open(&mnt.join("held"), libc::O_RDWR, 0).unwrap();
        let dir = sys::open(&mnt.join("d/e"), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        std::fs::remove_file(src.join("f")).unwrap();
        std::fs::remove_file(src.join("held")).unwrap();
        std::fs::remove_dir_all(src.join("d")).unwrap();
        if cached {
            // Cached for up to a second: ops answer at once, and the names go after that.
            std::thread::sleep(Duration::from_millis(1500));
        }
        let checks: Vec<(&str, PathBuf)> = vec![
            ("stat f", mnt.join("f")),
            ("stat d/e/inner", mnt.join("d/e/inner")),
            ("stat d", mnt.join("d")),
        ];
        for (what, p) in checks {
            let r = deadline(Duration::from_secs(5), what, move || {
                sys::stat(&p).map(|_| ())
            });
            assert!(gone(&r), "{args:?} {what}: {r:?}");
        }
        let p = mnt.join("f");
        let r = deadline(Duration::from_secs(5), "open f", move || {
            sys::open(&p, libc::O_RDONLY, 0).map(|_| ())
        });
        assert!(gone(&r), "{args:?} open f: {r:?}");
        let p = mnt.join("d/e/new");
        let r = deadline(Duration::from_secs(5), "create in removed dir", move || {
            sys::open(&p, libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ())
        });
        assert!(gone(&r), "{args:?} create in removed dir: {r:?}");
        let names: Vec<_> = std::fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.is_empty(), "{args:?}: {names:?}");
        // The fd opened before the removal still reads and writes the orphan.
        assert_eq!(sys::pread(&held, 64, 0).unwrap(), b"held");
        assert_eq!(sys::pwrite(&held, b"H", 0).unwrap(), 1);
        assert_eq!(sys::pread(&held, 64, 0).unwrap(), b"Held");
        // A directory fd of a removed dir: reading it answers (empty or an error), at once.
        let r = deadline(
            Duration::from_secs(5),
            "readdir of removed dir",
            move || {
                let path = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
                let r = std::fs::read_dir(&path).map(|rd| rd.count());
                drop(dir);
                r.map_err(|e| e.to_string())
            },
        );
        assert!(matches!(r, Ok(0) | Err(_)), "{args:?}: {r:?}");
        // A name the host re-creates is the new file.
        std::fs::write(src.join("f"), b"recreated").unwrap();
        let p = mnt.join("f");
        let data = deadline(Duration::from_secs(5), "read recreated", move || {
            std::fs::read(p)
        });
        if !cached {
            assert_eq!(data.unwrap(), b"recreated", "{args:?}");
        }
        drop(held);
        m.unmount();
    }
}

/// Host-side truncation and growth show through promptly with zero timeouts.
#[test]
fn host_side_changes_show_through_with_zero_timeouts() {
    let source = TempDir::new("chg-src");
    let src = source.path();
    std::fs::write(src.join("f"), vec![b'a'; 10000]).unwrap();
    let m = Mount::passthrough(src, &["--attr-timeout", "0", "--entry-timeout", "0"]);
    let f = m.path("f");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 10000);
    std::fs::write(src.join("f"), b"short").unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 5);
    assert_eq!(std::fs::read(&f).unwrap(), b"short");
    std::fs::create_dir(src.join("newdir")).unwrap();
    std::fs::write(src.join("newdir/x"), b"x").unwrap();
    assert_eq!(std::fs::read(m.path("newdir/x")).unwrap(), b"x");
    sys::chmod(&src.join("f"), 0o600).unwrap();
    assert_eq!(sys::stat(&f).unwrap().st_mode & 0o777, 0o600);
    std::fs::rename(src.join("f"), src.join("g")).unwrap();
    assert_eq!(sys::stat(&f).unwrap_err(), Errno(libc::ENOENT));
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"short");
    m.unmount();
}

/// Contents the host rewrites in place (same size, only the mtime tells) reach a client that
/// read and cached the old contents, once the attribute timeout has passed: the kernel must
/// not serve its page cache forever. Also for a file the client keeps open.
#[test]
fn host_rewrites_in_place_reach_a_caching_client() {
    use std::os::unix::fs::FileExt;
    for args in [
        &["--attr-timeout", "0.2", "--entry-timeout", "0.2"][..],
        &[
            "--no-passthrough",
            "--attr-timeout",
            "0.2",
            "--entry-timeout",
            "0.2",
        ][..],
    ] {
        let source = TempDir::new("rewrite-src");
        let src = source.path();
        std::fs::write(src.join("f"), vec![b'a'; 64 << 10]).unwrap();
        let m = Mount::passthrough(src, args);
        let f = m.path("f");
        // Read twice (the second from the kernel's cache where there is one).
        assert!(std::fs::read(&f).unwrap().iter().all(|&b| b == b'a'));
        assert!(std::fs::read(&f).unwrap().iter().all(|&b| b == b'a'));
        let held = std::fs::File::open(&f).unwrap();
        // The host rewrites it in place, a second later (a distinct mtime).
        std::thread::sleep(Duration::from_millis(1100));
        std::fs::OpenOptions::new()
            .write(true)
            .open(src.join("f"))
            .unwrap()
            .write_all_at(&vec![b'b'; 64 << 10], 0)
            .unwrap();
        let fresh = wait_until(Duration::from_secs(3), || {
            std::fs::read(&f).unwrap().iter().all(|&b| b == b'b')
        });
        assert!(
            fresh,
            "{args:?}: new opens still read the old contents after 3 s"
        );
        let mut buf = vec![0u8; 64 << 10];
        let fresh = wait_until(Duration::from_secs(3), || {
            held.read_exact_at(&mut buf, 0).unwrap();
            buf.iter().all(|&b| b == b'b')
        });
        assert!(
            fresh,
            "{args:?}: an open file still reads the old contents after 3 s"
        );
        drop(held);
        m.unmount();
    }
}
