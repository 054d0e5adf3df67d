//! The volume with its blocks on S3 (issue 14, the data half): SQLite metadata, a real MinIO
//! server on loopback (tests/common/minio.rs), real mounts. A tree untarred and compared with
//! `diff -r`, a large file read back cold, fsck and gc on S3, kill -9 in the middle of
//! fsynced writes, the server killed in the middle of writes and started again, and format's
//! refusals. Without a minio binary each test prints "skipped: why" and passes.

mod common;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::minio::{Minio, S3Volume, SECRET_KEY};
use common::{TempDir, content, diff_r, run_ok, wait_until};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;
/// The longest one S3 request may take to fail (blocks.rs: S3_RETRY_TIMEOUT 30 s +
/// S3_REQUEST_TIMEOUT 30 s + S3_BACKOFF_MAX 5 s), with room for a loaded 2-CPU machine.
const S3_FAILS_WITHIN: Duration = Duration::from_secs(90);

/// A MinIO for one test, or None (and the reason printed) where there is no binary.
fn minio(tag: &str) -> Option<Minio> {
    match Minio::start(tag) {
        Ok(m) => Some(m),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// Sizes in the tree: mostly small (inline: no object), every 11th above 64 KiB (one
/// block), every 41st above 2 MiB (three blocks).
fn size_of(i: usize) -> usize {
    match i {
        i if i % 41 == 0 => 2 * MIB + 1 + i,
        i if i % 11 == 0 => 64 * KIB + 1 + i * 37,
        i => (i * 7919) % (16 * KIB),
    }
}

fn rel(i: usize) -> PathBuf {
    PathBuf::from(format!("d{}/s{}/f{i}", i % 7, i % 3))
}

/// The blocks a tree of `files` files is stored in.
fn blocks_of_tree(files: usize) -> usize {
    (0..files)
        .map(|i| match size_of(i) {
            s if s > 64 * KIB => s.div_ceil(MIB),
            _ => 0,
        })
        .sum()
}

#[test]
fn a_tree_on_s3_round_trips_and_fsck_and_gc_are_clean() {
    let Some(minio) = minio("tree") else { return };
    const FILES: usize = 400;
    let src = TempDir::new("s3-tree-src");
    let tree = src.path().join("tree");
    for i in 0..FILES {
        let p = tree.join(rel(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content(i, size_of(i))).unwrap();
    }
    std::os::unix::fs::symlink("d1/s1/f1", tree.join("link")).unwrap();
    std::fs::hard_link(tree.join(rel(2)), tree.join("hard")).unwrap();
    let tar = src.path().join("tree.tar");
    run_ok(
        Command::new("tar")
            .arg("cf")
            .arg(&tar)
            .arg("-C")
            .arg(src.path())
            .arg("tree"),
    );

    let volume = S3Volume::format(&minio, "tree");
    let m = volume.mount(&[]);
    run_ok(
        Command::new("tar")
            .arg("xf")
            .arg(&tar)
            .arg("-C")
            .arg(&m.mountpoint),
    );
    diff_r(&tree, &m.path("tree"));
    // Small files stay in the metadata: the untar stored one object per 1 MiB of the
    // large files and nothing for the ~360 small ones.
    assert_eq!(
        minio.blocks(&volume.bucket, &volume.prefix),
        blocks_of_tree(FILES)
    );
    // No secret in the mount table, the status or the volume's file.
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let status = volume.lanefs(&["status", volume.source()]);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.contains(&format!("s3://{}/vol", volume.bucket)),
        "{status}"
    );
    m.unmount();
    let db = std::fs::read(&volume.db).unwrap();
    for (what, text) in [
        ("/proc/mounts", mounts.as_bytes()),
        ("status", status.as_bytes()),
        ("the volume file", &db),
    ] {
        assert!(
            !text
                .windows(SECRET_KEY.len())
                .any(|w| w == SECRET_KEY.as_bytes()),
            "the secret key is in {what}"
        );
    }
    volume.assert_clean();

    // A new daemon: every block comes from MinIO (the cache is cold).
    let m = volume.mount(&[]);
    diff_r(&tree, &m.path("tree"));
    run_ok(Command::new("rm").arg("-rf").arg(m.path("tree")));
    m.unmount();
    // The reaper deleted the removed files' blocks; gc finds nothing left, fsck nothing wrong.
    assert_eq!(minio.blocks(&volume.bucket, &volume.prefix), 0);
    let gc = volume.lanefs(&["gc", volume.source()]);
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    assert!(String::from_utf8_lossy(&gc.stdout).contains("deleted 0 "));
    volume.assert_clean();
}

#[test]
fn gc_and_fsck_on_s3_find_and_delete_a_stray_block() {
    let Some(minio) = minio("gc") else { return };
    let volume = S3Volume::format(&minio, "gc");
    let m = volume.mount(&[]);
    std::fs::write(m.path("a"), content(1, 3 * MIB)).unwrap();
    m.unmount();
    // A stray object where a block of session 0x77 would be (as a crash leaves them).
    let stray = volume.dir.path().join("stray");
    std::fs::write(&stray, b"stray").unwrap();
    minio.request(
        "PUT",
        &format!("{}/vol/blocks/000077/05/0000770000000005", volume.bucket),
        Some(&stray),
    );
    assert_eq!(minio.blocks(&volume.bucket, &volume.prefix), 4);
    let (ok, report) = volume.fsck();
    assert!(!ok && report.contains("0000770000000005"), "{report}");
    let gc = volume.lanefs(&["gc", volume.source()]);
    assert!(
        String::from_utf8_lossy(&gc.stdout).contains("deleted 1 "),
        "{gc:?}"
    );
    assert_eq!(minio.blocks(&volume.bucket, &volume.prefix), 3);
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert!(std::fs::read(m.path("a")).unwrap() == content(1, 3 * MIB));
    m.unmount();
}

#[test]
fn a_large_file_on_s3_reads_back_after_a_remount() {
    let Some(minio) = minio("large") else { return };
    let volume = S3Volume::format(&minio, "large");
    let m = volume.mount(&[]);
    const LEN: usize = 100 * MIB + 12345;
    let data = content(5, LEN);
    {
        let mut f = std::fs::File::create(m.path("big")).unwrap();
        for piece in data.chunks(MIB) {
            f.write_all(piece).unwrap();
        }
        f.sync_all().unwrap();
    }
    m.unmount();
    assert_eq!(
        minio.blocks(&volume.bucket, &volume.prefix),
        LEN.div_ceil(MIB)
    );
    let m = volume.mount(&[]);
    // Sequential (read-ahead) and then a few reads here and there, all from MinIO first.
    assert!(std::fs::read(m.path("big")).unwrap() == data);
    m.unmount();
    let m = volume.mount(&[]);
    let f = std::fs::File::open(m.path("big")).unwrap();
    for at in [LEN - 100, 77 * MIB - 3, 12 * MIB + 5, 0] {
        let mut buf = vec![0u8; 100];
        f.read_exact_at(&mut buf, at as u64).unwrap();
        assert_eq!(buf, data[at..at + 100], "at {at}");
    }
    drop(f);
    m.unmount();
    volume.assert_clean();
}

#[test]
fn a_sequential_read_from_s3_gets_each_block_once() {
    let Some(minio) = minio("readahead") else {
        return;
    };
    let volume = S3Volume::format(&minio, "readahead");
    let m = volume.mount(&[]);
    const BLOCKS: usize = 40;
    let data = content(8, BLOCKS * MIB);
    std::fs::write(m.path("f"), &data).unwrap();
    m.unmount();
    let m = volume.mount(&[]);
    let before = minio.requests("GetObject");
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    let gets = minio.requests("GetObject") - before;
    m.unmount();
    // Read-ahead fetches the blocks ahead of the reader; the reads that reach a block in
    // flight wait for it instead of fetching it again (before: 650 GETs for 40 blocks). A read
    // racing a read-ahead to the same block may still fetch it twice now and then.
    assert!(
        (BLOCKS as u64..=(BLOCKS + BLOCKS / 4) as u64).contains(&gets),
        "{gets} GETs to read {BLOCKS} blocks"
    );
}

/// Writes files of 1.5 MiB (two blocks) and fsyncs each until `stop`, recording for each
/// file whether its write+fsync+close succeeded, the errno if not, and how long it took.
fn write_files(dir: &Path, stop: &std::sync::atomic::AtomicBool, log: &Mutex<Vec<Op>>) {
    for i in 0.. {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        // The longest of the file's three calls: each may wait for S3 (the write flushes
        // its first full chunk), each within the bound.
        let mut longest = Duration::ZERO;
        let mut timed = |call: &mut dyn FnMut() -> std::io::Result<()>| {
            let at = Instant::now();
            let result = call();
            longest = longest.max(at.elapsed());
            result
        };
        let path = dir.join(format!("f{i}"));
        let mut file = None;
        let result = timed(&mut || {
            file = Some(std::fs::File::create(&path)?);
            Ok(())
        })
        .and_then(|()| {
            let f = file.as_mut().unwrap();
            timed(&mut || f.write_all(&content(i, 3 * MIB / 2)))?;
            timed(&mut || f.sync_all())
        });
        drop(file);
        log.lock().unwrap().push(Op {
            file: i,
            at: started,
            took: started.elapsed(),
            longest_call: longest,
            errno: result.err().map(|e| e.raw_os_error().unwrap_or(-1)),
        });
    }
}

#[derive(Debug, Clone)]
struct Op {
    file: usize,
    at: Instant,
    took: Duration,
    /// The longest of its create, write and fsync.
    longest_call: Duration,
    /// None: the file's write and fsync succeeded (it is acknowledged).
    errno: Option<i32>,
}

#[test]
fn kill_9_in_the_middle_of_writes_to_s3_keeps_every_fsynced_file() {
    let Some(minio) = minio("kill9") else { return };
    let volume = S3Volume::format(&minio, "kill9");
    let mut acked = Vec::new();
    for run in 0..3u64 {
        let m = volume.mount(&[]);
        let dir = m.path(&format!("run{run}"));
        std::fs::create_dir(&dir).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let (dir, stop, log) = (dir.clone(), stop.clone(), log.clone());
            std::thread::spawn(move || write_files(&dir, &stop, &log))
        };
        std::thread::sleep(Duration::from_millis(400 + run * 500));
        common::kill_9_and_wait(m.pid);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        drop(m);
        let ops = log.lock().unwrap().clone();
        let ok: Vec<usize> = ops
            .iter()
            .filter(|o| o.errno.is_none())
            .map(|o| o.file)
            .collect();
        eprintln!("run {run}: {} files fsynced before kill -9", ok.len());
        acked.extend(ok.into_iter().map(|i| (run, i)));
        let m = volume.mount(&[]);
        for (run, i) in &acked {
            let got = std::fs::read(m.path(&format!("run{run}/f{i}")))
                .unwrap_or_else(|e| panic!("fsynced file run{run}/f{i} after kill -9: {e}"));
            assert!(
                got == content(*i, 3 * MIB / 2),
                "run{run}/f{i} differs after kill -9"
            );
        }
        m.unmount();
        volume.assert_clean();
    }
    assert!(!acked.is_empty(), "no file was fsynced before the kills");
}

#[test]
fn s3_killed_in_the_middle_of_writes_and_restarted_loses_nothing_and_never_hangs() {
    let Some(mut minio) = minio("restart") else {
        return;
    };
    let volume = S3Volume::format(&minio, "restart");
    let log_file = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log_file.to_str().unwrap()]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (dir, stop, log) = (m.mountpoint.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || write_files(&dir, &stop, &log))
    };
    std::thread::sleep(Duration::from_secs(1));
    minio.stop();
    let stopped = Instant::now();
    // The mount answers what needs no S3 meanwhile.
    std::fs::write(m.path("small"), b"inline, in the metadata").unwrap();
    assert!(std::fs::read_dir(&m.mountpoint).unwrap().count() > 0);
    std::thread::sleep(Duration::from_secs(3));
    minio.start_again();
    let restarted = Instant::now();
    // Writes go on after the restart (within the retry bound), then stop.
    assert!(
        wait_until(S3_FAILS_WITHIN, || log
            .lock()
            .unwrap()
            .iter()
            .any(|o| o.at > restarted && o.errno.is_none())),
        "no write succeeded after MinIO came back: {:?}",
        log.lock().unwrap()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let joined = common::deadline(S3_FAILS_WITHIN, "the writer", move || writer.join());
    assert!(joined.is_ok());
    let ops = log.lock().unwrap().clone();
    let during = ops
        .iter()
        .filter(|o| o.at < restarted && o.at + o.took > stopped)
        .count();
    eprintln!(
        "{} files: {} in flight while MinIO was down, {} failed, longest {:?}",
        ops.len(),
        during,
        ops.iter().filter(|o| o.errno.is_some()).count(),
        ops.iter().map(|o| o.longest_call).max()
    );
    assert!(during > 0, "no write was in flight while MinIO was down");
    for o in &ops {
        assert!(
            o.errno.is_none() || o.errno == Some(libc::EIO),
            "file {}: errno {:?} (only EIO may come of S3 trouble)",
            o.file,
            o.errno
        );
        // Per call: a file whose write flushed while S3 was down and whose fsync flushed
        // again may wait for two bounds in all when the server stays down longer than one.
        assert!(
            o.longest_call < S3_FAILS_WITHIN,
            "file {}: a call took {:?}",
            o.file,
            o.longest_call
        );
    }
    m.unmount();
    // Every fsynced file is there, read from MinIO by a new daemon.
    let m = volume.mount(&[]);
    for o in ops.iter().filter(|o| o.errno.is_none()) {
        let got = std::fs::read(m.path(&format!("f{}", o.file))).unwrap();
        assert!(got == content(o.file, 3 * MIB / 2), "f{} differs", o.file);
    }
    assert_eq!(
        std::fs::read(m.path("small")).unwrap(),
        b"inline, in the metadata"
    );
    m.unmount();
    // A flush that failed discards its blocks in the background, and a discard that meets
    // MinIO still down leaves them to gc (by design): fsck may find such blocks, and nothing
    // else; gc deletes them.
    let (clean, out) = volume.fsck();
    if !clean {
        let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("block ")).collect();
        assert!(
            !problems.is_empty() && problems.iter().all(|l| l.ends_with("no file refers to it")),
            "fsck found more than blocks left by failed flushes:\n{out}"
        );
        let gc = volume.lanefs(&["gc", volume.source()]);
        assert!(
            gc.status.success(),
            "{}",
            String::from_utf8_lossy(&gc.stderr)
        );
    }
    volume.assert_clean();
}

#[test]
fn s3_down_for_good_gives_eio_within_the_bound_and_a_log_line_then_service_resumes() {
    let Some(mut minio) = minio("down") else {
        return;
    };
    let volume = S3Volume::format(&minio, "down");
    let log_file = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log_file.to_str().unwrap()]);
    std::fs::write(m.path("before"), content(1, 2 * MIB)).unwrap();
    minio.stop();
    let started = Instant::now();
    let path = m.path("during");
    // The file stays open (its close would flush, and wait out the retries, again).
    let (f, result) = common::deadline(S3_FAILS_WITHIN, "write+fsync with S3 down", move || {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&content(2, 2 * MIB)).unwrap();
        let result = f.sync_all();
        (f, result)
    });
    let took = started.elapsed();
    let err = result.expect_err("fsync succeeded with the S3 server down");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    eprintln!("fsync with S3 down failed with EIO after {took:?}");
    // One log line naming the inode and the object's key, with the cause.
    let logged = std::fs::read_to_string(&log_file).unwrap();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("writing blocks of inode") && l.contains("/vol/blocks/")),
        "no log line for the failed PUT:\n{logged}"
    );
    // The mount still answers what needs no S3: metadata, and small files (inline).
    assert_eq!(
        std::fs::metadata(m.path("before")).unwrap().len(),
        2 * MIB as u64
    );
    std::fs::write(m.path("small"), b"inline").unwrap();
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"inline");
    minio.start_again();
    // Service resumes: the failed fsync's data is still in memory and goes out at the next
    // one; new files too.
    f.sync_all().unwrap();
    drop(f);
    std::fs::write(m.path("after"), content(3, 2 * MIB)).unwrap();
    m.unmount();
    let m = volume.mount(&[]);
    assert!(std::fs::read(m.path("before")).unwrap() == content(1, 2 * MIB));
    assert!(std::fs::read(m.path("during")).unwrap() == content(2, 2 * MIB));
    assert!(std::fs::read(m.path("after")).unwrap() == content(3, 2 * MIB));
    m.unmount();
    // The failed flush's blocks were discarded in the background once MinIO was back; gc
    // deletes any the discard could not, and fsck finds nothing then.
    let gc = volume.lanefs(&["gc", volume.source()]);
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    volume.assert_clean();
}

/// Environment variables for a command: (name, value).
type Env<'a> = [(&'a str, &'a str)];

#[test]
fn format_on_s3_says_in_one_sentence_what_is_wrong() {
    let Some(minio) = minio("refuse") else { return };
    let dir = TempDir::new("s3-refuse");
    let db = dir.path().join("v.db");
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    minio.make_bucket("present");
    let format = |data: &str, env: &[(&str, &str)]| {
        let out = Command::new(common::lanefs())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .envs(env.iter().copied())
            .arg("format")
            .arg(&db)
            .args(["--data", data, "--s3-endpoint", &minio.endpoint()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        (out.status.success(), err)
    };
    let good = [
        ("AWS_ACCESS_KEY_ID", common::minio::ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    ];
    let cases: [(&str, &Env, &str); 3] = [
        ("s3://missing/v", &good, "the bucket missing does not exist"),
        (
            "s3://present/v",
            &[
                ("AWS_ACCESS_KEY_ID", common::minio::ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", "wrong"),
            ],
            "refused the credentials",
        ),
        ("s3://present/v", &[], "no S3 credentials"),
    ];
    for (data, env, want) in cases {
        let (ok, err) = format(data, env);
        assert!(!ok && err.contains(want), "{data}: {err}");
        assert_eq!(err.lines().count(), 1, "not one line: {err}");
        assert!(!err.contains(SECRET_KEY), "{err}");
        assert!(!db.exists(), "a refused format left {}", db.display());
    }
    // The shared credentials file's profile works as the variables do, and the mount needs
    // no flags: the endpoint is in the volume.
    std::fs::write(
        home.join(".aws/credentials"),
        format!(
            "[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n[test]\naws_access_key_id = {}\naws_secret_access_key = {SECRET_KEY}\n",
            common::minio::ACCESS_KEY
        ),
    )
    .unwrap();
    let (ok, err) = format("s3://present/v", &[("AWS_PROFILE", "test")]);
    assert!(ok, "{err}");
    std::fs::remove_file(&db).unwrap();
    let (ok, err) = format("s3://present/v2", &[]);
    assert!(!ok && err.contains("refused the credentials"), "{err}");
    // A prefix with a volume in it is refused without --force.
    let (ok, err) = format("s3://present/v", &[("AWS_PROFILE", "test")]);
    assert!(!ok && err.contains("add --force"), "{err}");
}
