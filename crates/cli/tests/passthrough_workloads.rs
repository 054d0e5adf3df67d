//! Real workloads on passthrough mounts: fio with verification writing one file from several
//! jobs (seed 000), the kernel source tarball untarred, compared and removed, git, a C build,
//! stress-ng's file-system stressors, and a 50,000-file walk that must leave the daemon's
//! inode table and fd count bounded.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{Mount, TempDir, drop_caches, fio, kernel_tarball, listing, run_ok, wait_until};

const MIB: u64 = 1 << 20;

/// Several fio jobs write disjoint regions of one pre-sized file with direct I/O (so the
/// writes do not extend it and may run in parallel), then read back and check crc32c of
/// every block.
#[test]
fn fio_parallel_writes_to_one_file_verify() {
    let variants: [&[&str]; 4] = [
        &["--direct-io"],
        &["--direct-io", "--no-parallel-writes"],
        &["--direct-io", "--no-file-handles", "--fd-cache", "2"],
        // Kernel passthrough: O_DIRECT goes to the host file.
        &[],
    ];
    for args in variants {
        let source = TempDir::new("fio-src");
        let jobs = 4;
        let region = 16 * MIB;
        // Sized on the host, as a sparse file: every write lands inside it.
        let f = std::fs::File::create(source.path().join("ssf")).unwrap();
        f.set_len(jobs * region).unwrap();
        drop(f);
        let m = Mount::passthrough(source.path(), args);
        let file = m.path("ssf");
        for (engine, depth) in [("psync", "1"), ("libaio", "16")] {
            let report = fio(&[
                "--name=ssf".into(),
                format!("--filename={}", file.display()),
                format!("--ioengine={engine}"),
                format!("--iodepth={depth}"),
                "--rw=randwrite".into(),
                "--bs=4k".into(),
                "--direct=1".into(),
                format!("--size={region}"),
                format!("--offset_increment={region}"),
                format!("--numjobs={jobs}"),
                "--verify=crc32c".into(),
                "--do_verify=1".into(),
                "--verify_fatal=1".into(),
                // No state files left in the working directory.
                "--verify_state_save=0".into(),
                "--group_reporting".into(),
            ]);
            let job = &report["jobs"][0];
            assert_eq!(job["error"], 0, "{args:?} {engine}: {job}");
            let written = job["write"]["io_bytes"].as_u64().unwrap();
            let read = job["read"]["io_bytes"].as_u64().unwrap();
            assert_eq!(written, jobs * region, "{args:?} {engine}");
            assert_eq!(read, jobs * region, "{args:?} {engine}: verification read");
        }
        let size = std::fs::metadata(source.path().join("ssf")).unwrap().len();
        assert_eq!(size, jobs * region, "{args:?}: the file grew");
        m.unmount();
    }
}

/// Four threads write their own 8 MiB region of an initially empty file in 64 KiB pwrites,
/// all at once: writes past the end (exclusive gate) and below it (shared) interleave. Every
/// byte must land where it was written.
#[test]
fn concurrent_extending_and_inner_writes_land_intact() {
    for args in [
        &["--direct-io"][..],
        &["--direct-io", "--no-parallel-writes"][..],
        &[][..],
    ] {
        let source = TempDir::new("grow-src");
        let m = Mount::passthrough(source.path(), args);
        let file = m.path("grow");
        std::fs::File::create(&file).unwrap();
        const REGION: usize = 8 << 20;
        const CHUNK: usize = 64 << 10;
        let block = |t: usize, c: usize| -> Vec<u8> {
            (0..CHUNK)
                .map(|i| (i as u64 * 31 + t as u64 * 7 + c as u64 * 13) as u8)
                .collect()
        };
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let file = file.clone();
                std::thread::spawn(move || {
                    use std::os::unix::fs::FileExt;
                    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
                    // Threads go in different orders so some write past the end while
                    // others fill in below it.
                    let order: Vec<usize> = if t % 2 == 0 {
                        (0..REGION / CHUNK).collect()
                    } else {
                        (0..REGION / CHUNK).rev().collect()
                    };
                    for c in order {
                        f.write_all_at(&block(t, c), (t * REGION + c * CHUNK) as u64)
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for path in [file.clone(), source.path().join("grow")] {
            let data = std::fs::read(&path).unwrap();
            assert_eq!(data.len(), 4 * REGION, "{args:?} {}", path.display());
            for t in 0..4 {
                for c in 0..REGION / CHUNK {
                    let at = t * REGION + c * CHUNK;
                    assert!(
                        data[at..at + CHUNK] == block(t, c)[..],
                        "{args:?}: {} differs at {at}",
                        path.display()
                    );
                }
            }
        }
        m.unmount();
    }
}

/// Held by a test that counts the inodes its walk made the kernel remember, and around every
/// drop_caches of the other tests of this binary, which run beside it and would make the
/// kernel forget them mid-walk.
static INODE_CACHE: Mutex<()> = Mutex::new(());

fn inode_cache() -> MutexGuard<'static, ()> {
    INODE_CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// After a workload, with every file closed and the kernel's caches dropped: no backing id
/// is left registered and the daemon's inode table is back to (nearly) the root alone, so
/// lookups and forgets balanced.
fn assert_nothing_leaked(m: &Mount, what: &str) {
    let walks_wait = inode_cache();
    drop_caches();
    drop(walks_wait);
    let mut last = (0, 0);
    let clean = wait_until(Duration::from_secs(10), || {
        last = (m.counter("backing_ids_live"), m.counter("inodes"));
        last.0 == 0 && last.1 <= 2
    });
    assert!(
        clean,
        "{what}: after closing everything and drop_caches, {} backing ids are live and {} \
         inodes known",
        last.0, last.1
    );
}

/// The whole kernel tree (~84,000 entries, 1.5 GB) untarred onto the mount, compared with a
/// native extraction (contents by diff -r, types, modes, sizes and link targets by find),
/// then removed through the mount. The daemon runs with at most 8192 fds, far fewer than
/// the tree's entries: it must not run out (EMFILE).
#[test]
fn kernel_tree_untars_compares_and_removes() {
    let Some(tarball) = kernel_tarball() else {
        eprintln!(
            "\n!!! SKIPPED: no /usr/src/linux-source-*.tar.xz (apt-get install linux-source; \
             scripts/setup.sh does) !!!\n"
        );
        return;
    };
    let native = TempDir::new("ktree-native");
    let source = TempDir::new("ktree-src");
    let m = Mount::start_wrapped(
        &["prlimit", "--nofile=8192:8192", "--"],
        source.path().to_str().unwrap(),
        &[],
    );
    let start = Instant::now();
    let untar = |dir: PathBuf, tarball: PathBuf| {
        std::thread::spawn(move || {
            let t = Instant::now();
            let out = Command::new("tar")
                .arg("-xf")
                .arg(&tarball)
                .current_dir(&dir)
                .output()
                .unwrap();
            (out, t.elapsed())
        })
    };
    let on_mount = untar(m.mountpoint.clone(), tarball.clone());
    let natively = untar(native.path().to_path_buf(), tarball.clone());
    let (out, mount_time) = on_mount.join().unwrap();
    assert!(
        out.status.success(),
        "tar onto the mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (nout, _) = natively.join().unwrap();
    assert!(nout.status.success());
    let top = common::top_entry(native.path());
    let entries = run_ok(Command::new("find").arg(".").current_dir(native.path()))
        .lines()
        .count();
    assert!(entries > 20_000, "{entries} entries");
    let diff_start = Instant::now();
    run_ok(
        Command::new("diff")
            .arg("-r")
            .arg(native.path().join(&top))
            .arg(m.mountpoint.join(&top)),
    );
    let diff_time = diff_start.elapsed();
    assert_eq!(
        listing(&m.mountpoint),
        listing(native.path()),
        "metadata through the mount differs from the native extraction"
    );
    assert_eq!(listing(source.path()), listing(native.path()));
    let fds = m.fd_count();
    assert!(fds < 8192 - 64, "the daemon holds {fds} fds");
    let rm_start = Instant::now();
    run_ok(Command::new("rm").arg("-rf").arg(m.mountpoint.join(&top)));
    let rm_time = rm_start.elapsed();
    assert_eq!(std::fs::read_dir(source.path()).unwrap().count(), 0);
    assert_nothing_leaked(&m, "kernel tree");
    eprintln!(
        "kernel tree, {entries} entries: untar on the mount {mount_time:?}, diff -r \
         {diff_time:?}, rm -rf {rm_time:?}, total {:?}; daemon fds {fds}; counters {}",
        start.elapsed(),
        m.stats()["counters"]
    );
    m.unmount();
}

fn git(dir: &Path, args: &[&str]) -> String {
    run_ok(
        Command::new("git")
            .args([
                "-c",
                "user.name=lanefs",
                "-c",
                "user.email=lanefs@example.com",
            ])
            .args(["-c", "init.defaultBranch=main", "-c", "gc.auto=0"])
            .args(args)
            .current_dir(dir),
    )
}

#[test]
fn git_init_add_commit_log_status_gc_clone() {
    let source = TempDir::new("git-src");
    let m = Mount::passthrough(source.path(), &[]);
    let repo = m.path("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    for i in 0..20 {
        std::fs::create_dir_all(repo.join(format!("dir{}", i % 4))).unwrap();
        std::fs::write(
            repo.join(format!("dir{}/file{i}.txt", i % 4)),
            format!("file {i}\n").repeat(100 + i),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("dir0/file0.txt", repo.join("link")).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    std::fs::write(repo.join("dir1/file1.txt"), "changed\n").unwrap();
    std::fs::remove_file(repo.join("dir2/file2.txt")).unwrap();
    assert_eq!(
        git(&repo, &["status", "--porcelain"]),
        " M dir1/file1.txt\n D dir2/file2.txt\n"
    );
    git(&repo, &["commit", "-q", "-a", "-m", "second"]);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    let log = git(&repo, &["log", "--format=%s"]);
    assert_eq!(log, "second\nfirst\n");
    git(&repo, &["gc", "-q", "--aggressive"]);
    git(&repo, &["fsck", "--strict", "--no-progress"]);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    // A local clone hard-links the objects.
    git(m.mountpoint.as_path(), &["clone", "-q", "repo", "clone"]);
    let clone = m.path("clone");
    assert_eq!(git(&clone, &["log", "--format=%s"]), "second\nfirst\n");
    assert_eq!(
        std::fs::read_to_string(clone.join("dir1/file1.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        std::fs::read_link(clone.join("link")).unwrap(),
        Path::new("dir0/file0.txt")
    );
    // The host sees a valid repository too.
    git(
        &source.path().join("repo"),
        &["fsck", "--strict", "--no-progress"],
    );
    assert_nothing_leaked(&m, "git");
    m.unmount();
}

#[test]
fn a_small_c_program_builds_runs_and_rebuilds_by_mtime() {
    let source = TempDir::new("cc-src");
    let m = Mount::passthrough(source.path(), &[]);
    let dir = m.path("proj");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("add.h"), "int add(int a, int b);\n").unwrap();
    std::fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\n#include \"add.h\"\nint main(void) { printf(\"%d\\n\", add(2, 3)); return 0; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("add.c"),
        "#include \"add.h\"\nint add(int a, int b) { return a + b; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("Makefile"),
        "prog: main.o add.o\n\t$(CC) -o $@ main.o add.o\n%.o: %.c add.h\n\t$(CC) -c -O2 -o $@ $<\n",
    )
    .unwrap();
    let make = |dir: &Path| run_ok(Command::new("make").current_dir(dir));
    let out = make(&dir);
    assert!(out.contains("main.c") && out.contains("add.c"), "{out}");
    let run = |dir: &Path| run_ok(&mut Command::new(dir.join("prog")));
    assert_eq!(run(&dir), "5\n");
    let out = make(&dir);
    assert!(
        out.contains("up to date"),
        "make rebuilt with nothing changed: {out}"
    );
    // Change add.c (and date it in the future, so the comparison does not hang on
    // sub-second resolution): only add.o and prog are rebuilt.
    std::fs::write(
        dir.join("add.c"),
        "#include \"add.h\"\nint add(int a, int b) { return a + b + 1; }\n",
    )
    .unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(dir.join("add.c"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    let out = make(&dir);
    assert!(out.contains("add.c") && !out.contains("main.c"), "{out}");
    assert_eq!(run(&dir), "6\n");
    // The binary on the host is the same file.
    assert_eq!(
        run_ok(&mut Command::new(source.path().join("proj/prog"))),
        "6\n"
    );
    m.unmount();
}

/// stress-ng's file-system stressors, with verification where they have it, must all pass
/// on the mount (each set passes natively on Debian 12's stress-ng 0.15).
#[test]
fn stress_ng_file_system_stressors_pass() {
    let source = TempDir::new("stress-src");
    let m = Mount::passthrough(source.path(), &[]);
    common::stress_ng_file_system(&m.mountpoint);
    assert_nothing_leaked(&m, "stress-ng");
    m.unmount();
}

/// 50,000 files walked through the mount twice: the daemon's fds stay within its fd cache
/// bound all along, and when the kernel forgets the inodes (drop_caches), the daemon's
/// inode table empties again.
#[test]
fn a_50000_file_walk_keeps_fds_and_inodes_bounded() {
    const DIRS: usize = 50;
    const PER_DIR: usize = 1000;
    const FD_CACHE: usize = 512;
    let source = TempDir::new("walk-src");
    for d in 0..DIRS {
        let dir = source.path().join(format!("d{d:02}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..PER_DIR {
            std::fs::File::create(dir.join(format!("f{f:04}"))).unwrap();
        }
    }
    // Fewer fds allowed than files: an fd per known inode would run out.
    let m = Mount::start_wrapped(
        &["prlimit", "--nofile=2048:2048", "--"],
        source.path().to_str().unwrap(),
        &["--fd-cache", &FD_CACHE.to_string()],
    );
    // What the daemon holds before it knows any file (its queues' /dev/fuse fds, the
    // control socket, the source...): the cache comes on top of that.
    let baseline = m.fd_count();
    let stop = Arc::new(AtomicBool::new(false));
    let max_fds = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, max_fds, pid) = (stop.clone(), max_fds.clone(), m.pid);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .map(|d| d.count())
                    .unwrap_or(0);
                max_fds.fetch_max(n, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let no_drop_caches = inode_cache();
    let start = Instant::now();
    for pass in 0..2 {
        // -size 0 stats every file, so every one is looked up.
        let out = run_ok(
            Command::new("find")
                .arg(&m.mountpoint)
                .args(["-type", "f", "-size", "0"]),
        );
        assert_eq!(out.lines().count(), DIRS * PER_DIR, "pass {pass}");
    }
    let walk_time = start.elapsed();
    let known = m.counter("inodes");
    assert!(
        known as usize > DIRS * PER_DIR / 2,
        "the daemon knows only {known} inodes after the walk"
    );
    let cached = m.counter("fd_cache_fds");
    drop(no_drop_caches);
    drop_caches();
    let mut left = known;
    let forgotten = wait_until(Duration::from_secs(15), || {
        left = m.counter("inodes");
        left < 1000
    });
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let max_fds = max_fds.load(Ordering::Relaxed);
    eprintln!(
        "walk of {} files x2: {walk_time:?}; inodes known {known}, after drop_caches {left}; \
         fd cache {cached}, daemon fds at most {max_fds} ({baseline} at the start)",
        DIRS * PER_DIR
    );
    assert!(
        forgotten,
        "after drop_caches the daemon still knows {left} inodes (of {known})"
    );
    assert!(cached as usize <= FD_CACHE, "fd cache holds {cached}");
    assert!(
        max_fds <= baseline + FD_CACHE + 16,
        "the daemon held {max_fds} fds with --fd-cache {FD_CACHE} ({baseline} before the walk)"
    );
    // Everything still works after the forgets.
    assert_eq!(std::fs::read_dir(m.path("d07")).unwrap().count(), PER_DIR);
    m.unmount();
}

/// Many machines start daemons with a soft fd limit of 1024 (and a high hard limit). With
/// its default fd cache the daemon must still walk and read more files than that: it has to
/// raise its soft limit or size its cache to fit.
#[test]
fn default_options_survive_a_soft_fd_limit_of_1024() {
    let source = TempDir::new("soft-src");
    for d in 0..3 {
        let dir = source.path().join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..1000 {
            std::fs::write(dir.join(format!("f{f:04}")), b"x").unwrap();
        }
    }
    let m = Mount::start_wrapped(
        &["prlimit", "--nofile=1024:", "--"],
        source.path().to_str().unwrap(),
        &[],
    );
    let out = run_ok(
        Command::new("find")
            .arg(&m.mountpoint)
            .args(["-type", "f", "-size", "-2"]),
    );
    assert_eq!(out.lines().count(), 3000);
    // Open and read every file.
    let out = run_ok(
        Command::new("sh")
            .arg("-c")
            .arg("find . -type f -exec cat {} + | wc -c")
            .current_dir(&m.mountpoint),
    );
    assert_eq!(out.trim(), "3000");
    // Hold 1500 files open at once from here, through the mount.
    let held: Vec<_> = (0..1500)
        .map(|i| {
            std::fs::File::open(m.path(&format!("d{}/f{:04}", i % 3, i / 3)))
                .unwrap_or_else(|e| panic!("opening file {i}: {e}"))
        })
        .collect();
    drop(held);
    m.unmount();
}
