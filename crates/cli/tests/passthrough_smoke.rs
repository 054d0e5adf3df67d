//! A quick end-to-end check of the passthrough file system (the full suites are
//! passthrough*.rs): a mount of a temp dir, the common operations, the KILLPRIV_V2 saving,
//! and a bad SOURCE refused before anything is mounted.

mod common;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use common::{Mount, TempDir, is_mounted, lanefs};

fn counter(mount: &Mount, name: &str) -> u64 {
    mount.stats()["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_u64())
        .unwrap_or_else(|| panic!("no counter {name}"))
}

#[test]
fn a_host_directory_round_trips() {
    let src = TempDir::new("pt-src");
    std::fs::write(src.path().join("old"), b"from the host").unwrap();
    let mount = Mount::start(src.path().to_str().unwrap(), &[]);
    assert_eq!(std::fs::read(mount.path("old")).unwrap(), b"from the host");

    std::fs::create_dir(mount.path("dir")).unwrap();
    std::fs::write(mount.path("dir/new"), b"via lanefs").unwrap();
    assert_eq!(
        std::fs::read(src.path().join("dir/new")).unwrap(),
        b"via lanefs"
    );
    std::fs::rename(mount.path("dir/new"), mount.path("moved")).unwrap();
    std::fs::hard_link(mount.path("moved"), mount.path("link")).unwrap();
    let (a, b) = (
        std::fs::metadata(mount.path("moved")).unwrap(),
        std::fs::metadata(mount.path("link")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    std::fs::set_permissions(mount.path("moved"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        std::fs::metadata(src.path().join("moved")).unwrap().mode() & 0o777,
        0o600
    );
    let mut names: Vec<_> = std::fs::read_dir(mount.mountpoint.as_path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["dir", "link", "moved", "old"]);
    std::fs::remove_file(mount.path("link")).unwrap();
    std::fs::remove_file(mount.path("moved")).unwrap();
    std::fs::remove_dir(mount.path("dir")).unwrap();
    assert!(!src.path().join("dir").exists());

    // An open file keeps working after its name is gone.
    let mut file = std::fs::File::create(mount.path("doomed")).unwrap();
    std::fs::remove_file(mount.path("doomed")).unwrap();
    file.write_all(b"still here").unwrap();
    assert_eq!(file.metadata().unwrap().len(), 10);
    drop(file);
    mount.unmount();
}

#[test]
fn writes_cost_no_getxattr_with_killpriv_v2() {
    let src = TempDir::new("pt-src");
    let mount = Mount::start(src.path().to_str().unwrap(), &[]);
    let before = counter(&mount, "getxattr");
    let status = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", mount.path("f").display()))
        .args(["bs=4k", "count=200", "status=none"])
        .status()
        .unwrap();
    assert!(status.success());
    let getxattrs = counter(&mount, "getxattr") - before;
    assert!(getxattrs <= 2, "{getxattrs} GETXATTRs for 200 writes");
}

#[test]
fn a_missing_source_is_refused_before_mounting() {
    let dir = TempDir::new("pt-bad");
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let out = Command::new(lanefs())
        .args(["mount", "--daemon"])
        .arg(dir.path().join("missing"))
        .arg(&mountpoint)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing"), "{stderr}");
    assert!(!is_mounted(&mountpoint));
}

/// As root with kernel passthrough on, an O_DIRECT open goes through it too: direct reads and
/// writes reach the host file without a daemon round trip (before, every O_DIRECT open was
/// answered FOPEN_DIRECT_IO and each 4k read was a READ request). With `--no-passthrough`
/// the same I/O is served by the daemon, which shows the count is the right one to watch.
#[test]
fn o_direct_opens_go_through_kernel_passthrough() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    const BLOCK: usize = 4096;
    const IOS: usize = 64;
    for (args, through_kernel) in [(&[][..], true), (&["--no-passthrough"][..], false)] {
        let src = common::Tmpfs::new("64m");
        std::fs::write(src.path.join("f"), vec![7u8; BLOCK * IOS]).unwrap();
        let mount = Mount::start(src.path.to_str().unwrap(), args);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(mount.path("f"))
            .unwrap();
        let layout = std::alloc::Layout::from_size_align(BLOCK, BLOCK).unwrap();
        // SAFETY: a non-zero-sized layout; freed below with the same layout.
        let buf = unsafe { std::alloc::alloc_zeroed(layout) };
        for i in 0..IOS {
            let offset = (i * BLOCK) as i64;
            // SAFETY: buf is BLOCK bytes, aligned to BLOCK, as O_DIRECT wants.
            let n = unsafe { libc::pread(file.as_raw_fd(), buf.cast(), BLOCK, offset) };
            assert_eq!(n, BLOCK as isize, "{args:?}: read {i}");
            // SAFETY: the same buffer, read back out.
            let n = unsafe { libc::pwrite(file.as_raw_fd(), buf.cast(), BLOCK, offset) };
            assert_eq!(n, BLOCK as isize, "{args:?}: write {i}");
        }
        // SAFETY: buf was allocated above with this layout.
        assert_eq!(unsafe { *buf.add(BLOCK - 1) }, 7);
        // SAFETY: as above.
        unsafe { std::alloc::dealloc(buf, layout) };
        let (reads, writes) = (mount.op_count("read"), mount.op_count("write"));
        if through_kernel {
            assert_eq!(
                (reads, writes),
                (0, 0),
                "{args:?}: direct I/O reached the daemon"
            );
            assert!(counter(&mount, "backing_ids_opened") >= 1);
        } else {
            assert!(
                reads >= IOS as u64 && writes >= IOS as u64,
                "{reads} {writes}"
            );
        }
        drop(file);
        mount.unmount();
    }
}
