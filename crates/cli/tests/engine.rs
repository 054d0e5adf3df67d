//! The engine through the null file system: real mounts, real syscalls, fio.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::process::Command;
use std::time::Duration;

use common::{Foreground, Mount, TempDir, fio, is_mounted, process_alive, wait_until};

const MIB: usize = 1 << 20;

#[test]
fn null_reads_and_writes_of_known_sizes() {
    for queues in ["1", "4"] {
        let m = Mount::null(&["--queues", queues, "--size", "10M"]);
        let data = m.path("data");
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 10 * MIB as u64);
        let names: Vec<_> = std::fs::read_dir(&m.mountpoint)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["data"]);

        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&data)
            .unwrap();
        let mut buf = vec![1u8; MIB];
        assert_eq!(file.read_at(&mut buf, 0).unwrap(), MIB);
        assert!(buf.iter().all(|&b| b == 0), "null reads zeros");
        // A read across the end is short; one past it is empty.
        let end = 10 * MIB as u64;
        assert_eq!(file.read_at(&mut buf, end - 100).unwrap(), 100);
        assert_eq!(file.read_at(&mut buf, end).unwrap(), 0);
        // Writes are acknowledged in full; one past the end makes the file grow.
        assert_eq!(file.write_at(&[7u8; 4096], 0).unwrap(), 4096);
        assert_eq!(file.write_at(&[7u8; 12345], end).unwrap(), 12345);
        assert_eq!(file.metadata().unwrap().len(), end + 12345);
        file.set_len(4096).unwrap();
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 4096);

        // Through the read(2) path of std, in odd sizes.
        let mut whole = Vec::new();
        File::open(&data).unwrap().read_to_end(&mut whole).unwrap();
        drop(file);
        assert_eq!(whole.len(), 4096);
        assert_eq!(
            std::fs::metadata(m.path("missing")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        m.unmount();
    }
}

#[test]
fn fio_matrix_on_one_and_four_queues() {
    for queues in ["1", "4"] {
        let m = Mount::null(&["--queues", queues]);
        let data = m.path("data");
        for engine in ["psync", "libaio"] {
            for bs in ["4k", "1M"] {
                for rw in ["randread", "randwrite"] {
                    for numjobs in 1..=4 {
                        let size = if bs == "4k" { "4M" } else { "32M" };
                        let report = fio(&[
                            "--name=matrix".into(),
                            format!("--filename={}", data.display()),
                            format!("--ioengine={engine}"),
                            "--iodepth=8".into(),
                            format!("--rw={rw}"),
                            format!("--bs={bs}"),
                            "--direct=1".into(),
                            format!("--size={size}"),
                            format!("--numjobs={numjobs}"),
                            "--group_reporting".into(),
                        ]);
                        let job = &report["jobs"][0];
                        assert_eq!(job["error"], 0, "{engine} {bs} {rw} x{numjobs}");
                        let side = if rw == "randread" { "read" } else { "write" };
                        let bytes = job[side]["io_bytes"].as_u64().unwrap();
                        let expected = numjobs * if bs == "4k" { 4 * MIB } else { 32 * MIB };
                        assert_eq!(
                            bytes, expected as u64,
                            "{engine} {bs} {rw} x{numjobs} on {queues} queues"
                        );
                    }
                }
            }
        }
        // With several queues, the kernel handed requests to more than one of them (which
        // reader it wakes is its choice, so not necessarily to every one).
        let stats = m.stats();
        let per_queue: Vec<u64> = stats["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["requests"].as_u64().unwrap())
            .collect();
        if m.over_uring() {
            // One ring per possible CPU plus the /dev/fuse reader; --queues does not apply.
            assert!(per_queue.iter().any(|&r| r > 0), "{per_queue:?}");
        } else {
            assert_eq!(per_queue.len(), queues.parse::<usize>().unwrap());
        }
        if per_queue.len() > 1 && !m.over_uring() {
            let busy = per_queue.iter().filter(|&&r| r > 0).count();
            assert!(busy >= 2, "one queue served everything: {per_queue:?}");
        }
        m.unmount();
    }
}

#[test]
fn daemon_holds_one_dev_fuse_fd_per_queue() {
    let m = Mount::null(&["--queues", "4", "--transport", "dev"]);
    let fuse_fds = std::fs::read_dir(format!("/proc/{}/fd", m.pid))
        .unwrap()
        .filter(|e| {
            std::fs::read_link(e.as_ref().unwrap().path())
                .is_ok_and(|target| target.as_os_str() == "/dev/fuse")
        })
        .count();
    assert_eq!(fuse_fds, 4);
    assert!(m.line.contains("4 queues"), "{}", m.line);
    m.unmount();
}

#[test]
fn sigterm_and_sigint_unmount_and_exit_zero() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut fg = Foreground::start("null:", &["--queues", "2"]);
        assert!(is_mounted(&fg.mountpoint));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(fg.child.id() as i32, signal) };
        let status = fg.wait(Duration::from_secs(10)).expect("daemon exits");
        assert!(status.success(), "exit status {status}");
        assert!(!is_mounted(&fg.mountpoint));
    }
}

#[test]
fn external_umount_ends_the_daemon() {
    let tools: [&[&str]; 2] = [&["umount"], &["fusermount3", "-u"]];
    for tool in tools {
        if tool[0] == "fusermount3" && Command::new("fusermount3").arg("-V").output().is_err() {
            eprintln!("fusermount3 not installed: skipping that variant");
            continue;
        }
        let mut fg = Foreground::start("null:", &[]);
        let status = Command::new(tool[0])
            .args(&tool[1..])
            .arg(&fg.mountpoint)
            .status()
            .unwrap();
        assert!(status.success());
        let exit = fg.wait(Duration::from_secs(10)).expect("daemon exits");
        assert!(exit.success(), "{tool:?}: exit status {exit}");
        assert!(!is_mounted(&fg.mountpoint));
    }
}

#[test]
fn signal_with_open_files_still_ends_the_daemon() {
    let mut fg = Foreground::start("null:", &[]);
    let held = File::open(fg.mountpoint.join("data")).unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(fg.child.id() as i32, libc::SIGTERM) };
    // The mount leaves the namespace at once; the open file keeps the connection a while,
    // then the daemon aborts it and exits.
    assert!(wait_until(Duration::from_secs(2), || !is_mounted(
        &fg.mountpoint
    )));
    let exit = fg.wait(Duration::from_secs(15)).expect("daemon exits");
    assert!(exit.success(), "{exit}");
    drop(held);
}

#[test]
fn a_panicking_handler_answers_eio_and_the_mount_lives_on() {
    let m = Mount::null(&["--panic-on-lookup", "boom"]);
    let err = std::fs::metadata(m.path("boom")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(std::fs::metadata(m.path("data")).is_ok());
    assert!(process_alive(m.pid));
    let lookup = m.stats()["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == "lookup")
        .cloned()
        .unwrap();
    assert!(lookup["errors"].as_u64().unwrap() >= 1, "{lookup}");
    m.unmount();
}

#[test]
fn stats_show_ops_protocol_and_queues() {
    let m = Mount::null(&["--queues", "2"]);
    let mut f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("data"))
        .unwrap();
    for _ in 0..10 {
        f.write_all(&[0u8; 4096]).unwrap();
    }
    drop(f);
    assert_eq!(m.op_count("write"), 10);
    let out = Command::new(common::lanefs())
        .arg("stats")
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in ["FUSE 7.", "PARALLEL_DIROPS", "queue", "write", "p99 us"] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
    m.unmount();
}

#[test]
fn bad_mount_points_get_an_explanation() {
    let dir = TempDir::new("bad");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let cases = [
        (file.clone(), "not a directory"),
        (dir.path().join("missing"), "does not exist"),
    ];
    for (mountpoint, explanation) in cases {
        let err = mount_fails_on(&mountpoint);
        assert!(err.contains(explanation), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    // On top of a live lanefs mount.
    let m = Mount::null(&[]);
    let err = mount_fails_on(&m.mountpoint);
    assert!(err.contains("already a FUSE mount"), "{err}");
    m.unmount();
}

/// Mounts null on `mountpoint`, expecting a refusal; returns its message.
fn mount_fails_on(mountpoint: &std::path::Path) -> String {
    let out = Command::new(common::lanefs())
        .args(["mount", "null:"])
        .arg(mountpoint)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "mounting on {} succeeded",
        mountpoint.display()
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_dead_mount_is_explained_and_can_be_cleared() {
    let m = Mount::null(&[]);
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    let err = mount_fails_on(&m.mountpoint);
    assert!(err.contains("dead FUSE mount"), "{err}");
    let status = Command::new(common::lanefs())
        .arg("umount")
        .arg(&m.mountpoint)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(!is_mounted(&m.mountpoint));
}

#[test]
fn mount_8_and_its_options_reach_lanefs() {
    if !std::path::Path::new("/sbin/mount.fuse3").exists()
        && !std::path::Path::new("/usr/sbin/mount.fuse3").exists()
    {
        eprintln!("mount.fuse3 not installed (apt-get install fuse3): skipping");
        return;
    }
    let dir = TempDir::new("fstab");
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    // mount(8) runs helpers with a fixed PATH, so name our binary in mount.fuse3's
    // `TYPE#SOURCE` form; an installed lanefs is found as `-t fuse.lanefs null:`.
    let out = Command::new("mount")
        .args(["-t", "fuse"])
        .arg(format!("{}#null:", common::lanefs()))
        .arg(&mountpoint)
        .args(["-o", "queues=3,size=1G,nofail,x-systemd.automount"])
        .output()
        .unwrap();
    let guard = scopeguard(&mountpoint);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::metadata(mountpoint.join("data")).unwrap().size(),
        1 << 30
    );
    let stats = Command::new(common::lanefs())
        .args(["stats", "--json"])
        .arg(&mountpoint)
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["queues"].as_array().unwrap().len(), 3);
    assert!(
        Command::new("umount")
            .arg(&mountpoint)
            .status()
            .unwrap()
            .success()
    );
    drop(guard);
}

/// Lazily unmounts on drop (for mounts made by mount(8), whose daemon exits on unmount).
fn scopeguard(path: &std::path::Path) -> impl Drop + '_ {
    struct Guard<'a>(&'a std::path::Path);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if is_mounted(self.0) {
                let _ = Command::new("umount").arg("-l").arg(self.0).status();
            }
        }
    }
    Guard(path)
}

#[test]
fn a_regular_user_mounts_through_fusermount3() {
    if Command::new("setpriv").arg("--version").output().is_err()
        || Command::new("fusermount3").arg("-V").output().is_err()
    {
        eprintln!("setpriv or fusermount3 missing: skipping");
        return;
    }
    let kit = common::UserMountKit::new("user");
    let (dir, bin) = (&kit.dir, &kit.bin);
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    Command::new("chown")
        .args(["nobody"])
        .arg(&mountpoint)
        .status()
        .unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "env",
                "XDG_RUNTIME_DIR=",
            ])
            .arg(bin)
            .args(args)
            .output()
            .unwrap()
    };
    let mp = mountpoint.to_str().unwrap();
    let out = as_nobody(&["mount", "--daemon", "--queues", "2", "null:", mp]);
    let guard = scopeguard(&mountpoint);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = line
        .rsplit_once("(daemon pid ")
        .and_then(|(_, rest)| rest.trim().trim_end_matches(')').parse().ok())
        .unwrap();
    let info = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let ours = info.lines().find(|l| l.contains(mp)).expect("mounted");
    assert!(ours.contains("user_id=65534"), "{ours}");
    let stats = as_nobody(&["stats", mp]);
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let umount = as_nobody(&["umount", mp]);
    assert!(
        umount.status.success(),
        "{}",
        String::from_utf8_lossy(&umount.stderr)
    );
    assert!(wait_until(Duration::from_secs(10), || !process_alive(pid)));
    drop(guard);
}
