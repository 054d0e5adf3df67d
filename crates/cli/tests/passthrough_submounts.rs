//! Host file systems mounted inside SOURCE (issue 11, item 5). Every inode of a FUSE mount
//! has the mount's one st_dev (the kernel makes automounted submounts for virtio-fs only), so
//! two files that share an inode number on two host file systems under SOURCE must still
//! show different inode numbers, or tar, cp -a, rsync -H and find -samefile take them for
//! one file; a hard link inside one of them must still show as one.

mod common;

use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Mount, TempDir, run_ok};

/// A tmpfs mounted on a directory inside a test's SOURCE, lazily unmounted on drop.
struct InnerTmpfs(PathBuf);

impl InnerTmpfs {
    fn new(path: PathBuf) -> InnerTmpfs {
        std::fs::create_dir(&path).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs"])
                .arg(&path),
        );
        InnerTmpfs(path)
    }
}

impl Drop for InnerTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn id(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.dev(), m.ino())
}

/// A tree as the test sees it through the mount: `a/f` and `b/f` share a host inode number,
/// `a/g` is a hard link of `a/f` and `b/g` one of `b/f`.
fn check_identities(root: &Path, what: &str) {
    let (af, ag, bf, bg) = (
        id(&root.join("a/f")),
        id(&root.join("a/g")),
        id(&root.join("b/f")),
        id(&root.join("b/g")),
    );
    assert_ne!(af, bf, "{what}: a/f and b/f look like one file");
    assert_eq!(af, ag, "{what}: a/f and its hard link a/g are not one file");
    assert_eq!(bf, bg, "{what}: b/f and its hard link b/g are not one file");
    assert_eq!(std::fs::read(root.join("a/f")).unwrap(), b"on a", "{what}");
    assert_eq!(std::fs::read(root.join("b/f")).unwrap(), b"on b", "{what}");
    assert_eq!(std::fs::metadata(root.join("b/f")).unwrap().nlink(), 2);
}

fn copy_with(tool: &str, mount: &Mount, scratch: &Path) {
    let dest = scratch.join(tool);
    std::fs::create_dir_all(&dest).unwrap();
    let script = match tool {
        "cp" => format!("cp -a {}/. {}", mount.mountpoint.display(), dest.display()),
        _ => format!(
            "tar -C {} -cf - a b | tar -C {} -xf -",
            mount.mountpoint.display(),
            dest.display()
        ),
    };
    let out = common::sh(&script);
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_identities(&dest, &format!("the copy made by {tool}"));
}

#[test]
fn files_on_two_host_file_systems_never_look_like_one() {
    let src = TempDir::new("sub-src");
    let scratch = TempDir::new("sub-copies");
    let inner = [
        InnerTmpfs::new(src.path().join("a")),
        InnerTmpfs::new(src.path().join("b")),
    ];
    for (fs, text) in inner.iter().zip([&b"on a"[..], b"on b"]) {
        std::fs::write(fs.0.join("f"), text).unwrap();
        std::fs::hard_link(fs.0.join("f"), fs.0.join("g")).unwrap();
    }
    let host = |rel: &str| std::fs::metadata(src.path().join(rel)).unwrap();
    assert_eq!(
        host("a/f").ino(),
        host("b/f").ino(),
        "two fresh tmpfs should number their first file alike: the test proves nothing"
    );
    assert_ne!(host("a/f").dev(), host("b/f").dev());

    for args in [&[][..], &["--no-passthrough"], &["--no-file-handles"]] {
        let what = format!("through lanefs {args:?}");
        let mount = Mount::start(src.path().to_str().unwrap(), args);
        check_identities(&mount.mountpoint, &what);

        // A listing shows the numbers a stat shows.
        for entry in std::fs::read_dir(mount.path("b")).unwrap() {
            let entry = entry.unwrap();
            assert_eq!(
                entry.ino(),
                entry.metadata().unwrap().ino(),
                "{what}: d_ino of b/{:?}",
                entry.file_name()
            );
        }
        // An open file (with kernel passthrough, a backing file) shows the same.
        let open_a = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mount.path("a/f"))
            .unwrap();
        let open_b = std::fs::File::open(mount.path("b/f")).unwrap();
        let (ma, mb) = (open_a.metadata().unwrap(), open_b.metadata().unwrap());
        assert_eq!((ma.dev(), ma.ino()), id(&mount.path("a/f")), "{what}");
        assert_ne!(
            (ma.dev(), ma.ino()),
            (mb.dev(), mb.ino()),
            "{what}: open files"
        );
        let kernel_passthrough = args.is_empty()
            && mount.stats()["flags"]
                .as_str()
                .is_some_and(|f| f.contains("PASSTHROUGH"));
        if kernel_passthrough {
            // The opens went through kernel passthrough: the kernel's backing files did not
            // bring the host's numbers back.
            assert!(mount.counter("backing_ids_opened") > 0, "{what}");
        }
        drop((open_a, open_b));

        let found = common::sh(&format!(
            "cd {} && find . -samefile a/f | sort",
            mount.mountpoint.display()
        ));
        assert_eq!(
            String::from_utf8_lossy(&found.stdout),
            "./a/f\n./a/g\n",
            "{what}: find -samefile"
        );
        for tool in ["cp", "tar"] {
            copy_with(tool, &mount, &scratch.path().join(mount.pid.to_string()));
        }
        mount.unmount();
    }
}
