//! The volume (issue 13) with its real parts: SQLite files, data directories, mounts through
//! /dev/fuse. The POSIX cases run on the volume from passthrough.rs (`on_volume::*`); here:
//! a tree untarred and compared with `diff -r`, kill -9 of the daemon in the middle of writes
//! with fsyncs, fsck finding and repairing damage, blocks that are missing or corrupt, inline
//! small files, and every way a mount or format is refused.

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::volume::Volume;
use common::{TempDir, content, diff_r, is_mounted, process_alive, run_ok, wait_until};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

/// A file's size in the generated trees: mostly small (inline on the volume), some above
/// 64 KiB (blocks), a few above 1 MiB (several chunks), one empty.
fn size_of(i: usize) -> usize {
    match i {
        0 => 0,
        i if i % 97 == 0 => MIB + MIB / 2 + i,
        i if i % 13 == 0 => 64 * KIB + 1 + i * 31,
        i => (i * 7919) % (12 * KIB),
    }
}

/// Relative path of file `i` in the generated trees.
fn rel(i: usize) -> PathBuf {
    PathBuf::from(format!("d{}/s{}/f{i}.c", i % 17, i % 3))
}

/// A tree of `files` files in nested directories, with symlinks and hard links.
fn make_tree(root: &Path, files: usize) {
    for i in 0..files {
        let p = root.join(rel(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content(i, size_of(i))).unwrap();
    }
    std::os::unix::fs::symlink("d1/s1/f1.c", root.join("link-to-f1")).unwrap();
    std::fs::hard_link(root.join(rel(2)), root.join("hard-f2")).unwrap();
    std::fs::create_dir_all(root.join("empty/dir")).unwrap();
}

/// Block objects in a volume's data directory.
fn block_files(data: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                walk(&e.path(), out);
            } else {
                out.push(e.path());
            }
        }
    }
    let mut out = Vec::new();
    walk(&data.join("blocks"), &mut out);
    out.sort();
    out
}

/// Where the volume keeps block `id` (blocks/SESSION/XX/ID).
fn block_path(data: &Path, id: u64) -> PathBuf {
    data.join(format!(
        "blocks/{:06x}/{:02x}/{id:016x}",
        id >> 40,
        id & 0xff
    ))
}

fn lanefs(args: &[&str]) -> std::process::Output {
    Command::new(common::lanefs()).args(args).output().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Lazily unmounts whatever is mounted at its path when dropped (for mounts a test makes
/// itself, with mount(8)).
struct LazyUnmount<'a>(&'a Path);

impl Drop for LazyUnmount<'_> {
    fn drop(&mut self) {
        if is_mounted(self.0) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
}

/// `lanefs umount` returns once the daemon has exited, so the file system holding the
/// volume's files can be unmounted right after: it waited only for the daemon's control
/// socket, which closes before the volume's database, intent log and data directory do,
/// and `umount` of the file system under them failed with "target is busy" in 4 of 10
/// tries.
#[test]
fn umount_waits_for_the_daemon_to_let_go_of_the_volumes_files() {
    let dir = TempDir::new("vol-under-tmpfs");
    let under = dir.path().join("fs");
    std::fs::create_dir(&under).unwrap();
    for round in 0..6 {
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "tmpfs"])
                .arg(&under),
        );
        let guard = LazyUnmount(&under);
        let volume = Volume {
            dir: TempDir::new("vol-under-tmpfs-files"),
            db: under.join("vol.db"),
            data: under.join("data"),
            pg: None,
        };
        common::volume::format_volume(&volume.db, &volume.data);
        let m = volume.mount(&[]);
        for i in 0..200 {
            std::fs::write(m.path(&format!("f{i}")), b"x").unwrap();
        }
        let out = lanefs(&["umount", m.mountpoint.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let out = Command::new("umount").arg(&under).output().unwrap();
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        drop(m);
        drop(guard);
    }
}

#[test]
fn untar_of_a_tree_matches_with_diff_and_after_remount() {
    let src = TempDir::new("vol-tree-src");
    let tree = src.path().join("tree");
    make_tree(&tree, 600);
    run_ok(
        Command::new("tar")
            .arg("cf")
            .arg(src.path().join("tree.tar"))
            .arg("-C")
            .arg(src.path())
            .arg("tree"),
    );
    untar_round_trip(&Volume::format("untar"), src.path(), &tree);
}

/// Untars `src/tree.tar` into the volume, compares it with `tree` with `diff -r`, again after
/// a remount, then removes it all: fsck finds nothing at each step and no block is left.
fn untar_round_trip(volume: &Volume, src: &Path, tree: &Path) {
    let m = volume.mount(&[]);
    run_ok(
        Command::new("tar")
            .arg("xf")
            .arg(src.join("tree.tar"))
            .arg("-C")
            .arg(&m.mountpoint),
    );
    diff_r(tree, &m.path("tree"));
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    diff_r(tree, &m.path("tree"));
    // Hard links and link counts came through.
    assert_eq!(
        std::fs::metadata(m.path("tree/hard-f2")).unwrap().nlink(),
        2
    );
    // rm -rf of the whole tree leaves an empty volume with no blocks.
    run_ok(Command::new("rm").arg("-rf").arg(m.path("tree")));
    assert_eq!(std::fs::read_dir(&m.mountpoint).unwrap().count(), 0);
    m.unmount();
    volume.assert_clean();
    assert_eq!(block_files(&volume.data), Vec::<PathBuf>::new());
}

/// The whole kernel tree (~84,000 entries, 1.1 GB) untarred onto a volume, with early answers
/// and slices as they come, compares with a native extraction after a remount (the bytes from
/// the store alone): contents by `diff -r`, types, modes, sizes and link targets by `find`;
/// fsck is clean, and removing it leaves no block. Runs once in CI (io_uring), not again over
/// /dev/fuse: it tests the volume's store, not the transport.
#[test]
fn volume_kernel_tree_untars_and_compares_after_remount() {
    let Some(tarball) = common::kernel_tarball() else {
        eprintln!(
            "\n!!! SKIPPED: no /usr/src/linux-source-*.tar.xz (apt-get install linux-source; \
             scripts/setup.sh does) !!!\n"
        );
        return;
    };
    let native = TempDir::new("vol-ktree-native");
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .current_dir(native.path()),
    );
    let volume = Volume::format("ktree");
    let m = volume.mount(&[]);
    let started = std::time::Instant::now();
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .current_dir(&m.mountpoint),
    );
    let untar = started.elapsed();
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    let top = common::top_entry(native.path());
    diff_r(&native.path().join(&top), &m.mountpoint.join(&top));
    let (got, want) = (
        common::listing_but_dir_sizes(&m.mountpoint),
        common::listing_but_dir_sizes(native.path()),
    );
    if got != want {
        let differ: Vec<_> = got
            .lines()
            .zip(want.lines())
            .filter(|(g, w)| g != w)
            .take(5)
            .collect();
        panic!("metadata through the volume differs from the native extraction: {differ:?}");
    }
    run_ok(Command::new("rm").arg("-rf").arg(m.mountpoint.join(&top)));
    m.unmount();
    volume.assert_clean();
    assert_eq!(block_files(&volume.data), Vec::<PathBuf>::new());
    eprintln!("kernel tree onto a volume: untar {untar:?}");
}

/// kill -9 runs in CI: each costs ~1 s (a mount, up to 0.7 s of writes, a remount, fsck).
const KILL9_RUNS: u64 = 20;
/// kill -9 runs of the slow test (`cargo test -- --ignored kill_9_many`).
const KILL9_RUNS_SLOW: u64 = 300;
/// Runs share a volume in groups of this many (each run's fsck reads the whole volume, so
/// one volume for all the slow test's runs would cost time quadratic in the runs).
const KILL9_RUNS_PER_VOLUME: u64 = 20;
/// The kill comes this long into the untar, at most.
const KILL9_LATEST: Duration = Duration::from_millis(700);

/// A small xorshift generator: runs are replayable from their printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Untars a kernel-like tree into `dir` as tar does (mkdir, create, write in 10 KiB pieces,
/// close, chmod, set mtime; a symlink and a hard link now and then), fsyncing every
/// `every`th file and recording it in `acked` only after its fsync returned, and every file
/// in `answered` once all of its steps were answered, until an error (the daemon was
/// killed). A file held open after being unlinked is an orphan when the
/// daemon dies.
fn untar_until_killed(
    dir: &Path,
    every: usize,
    acked: &Mutex<Vec<usize>>,
    answered: &Mutex<Vec<usize>>,
) {
    let held = std::fs::File::create(dir.join("held-open")).and_then(|mut f| {
        f.write_all(&content(7, 100 * KIB))?;
        std::fs::remove_file(dir.join("held-open"))?;
        Ok(f)
    });
    for i in 0.. {
        let p = dir.join(rel(i));
        let result = std::fs::create_dir_all(p.parent().unwrap()).and_then(|()| {
            let mut f = std::fs::File::create(&p)?;
            let data = content(i, size_of(i));
            for piece in data.chunks(10 * KIB) {
                f.write_all(piece)?;
            }
            if i % every == 0 {
                f.sync_all()?;
                acked.lock().unwrap().push(i);
            }
            drop(f);
            std::fs::set_permissions(
                &p,
                std::os::unix::fs::PermissionsExt::from_mode(0o644 | ((i as u32 % 2) * 0o111)),
            )?;
            std::fs::File::options()
                .write(true)
                .open(&p)?
                .set_modified(
                    std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000 + i as u64),
                )?;
            if i % 23 == 0 {
                std::os::unix::fs::symlink(format!("f{i}.c"), p.with_extension("link"))?;
            }
            if i % 31 == 0 {
                std::fs::hard_link(&p, p.with_extension("hard"))?;
            }
            Ok(())
        });
        if result.is_err() {
            break;
        }
        answered.lock().unwrap().push(i);
    }
    drop(held);
}

/// `runs` times: mount, untar, kill -9 the daemon at a random moment, remount: every file
/// fsynced before the kill is there, byte for byte, and fsck finds nothing to repair. Runs
/// share a volume in groups of KILL9_RUNS_PER_VOLUME, so each run also remounts over what
/// earlier kills left; at the end of a group every run's fsynced files are checked again.
fn kill_9_during_untars(runs: u64) {
    let seed = std::env::var("LANEFS_KILL9_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill -9 runs: seed {seed} (LANEFS_KILL9_SEED={seed} replays them)");
    let mut rng = Rng(seed);
    let mut first = 0;
    while first < runs {
        let last = runs.min(first + KILL9_RUNS_PER_VOLUME);
        kill_9_group(&Volume::format("kill9"), first..last, seed, &mut rng);
        first = last;
    }
}

/// Runs `runs` of [`kill_9_during_untars`] on one new volume. On PostgreSQL a killed
/// mount's session lives on until the others end it (`SESSION_EXPIRY`), and fsck refuses a
/// volume with live sessions: there fsck runs once, at the end, after a mount ended them.
fn kill_9_group(volume: &Volume, runs: std::ops::Range<u64>, seed: u64, rng: &mut Rng) {
    let shared = volume.pg.is_some();
    let mut all_acked = Vec::new();
    for run in runs {
        let every = 1 + rng.below(10) as usize;
        let delay = Duration::from_millis(rng.below(KILL9_LATEST.as_millis() as u64) + 1);
        let m = volume.mount(&[]);
        let dir = m.path(&format!("run{run}"));
        std::fs::create_dir(&dir).unwrap();
        let acked = Arc::new(Mutex::new(Vec::new()));
        let answered = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let (dir, acked, answered) = (dir.clone(), acked.clone(), answered.clone());
            std::thread::spawn(move || untar_until_killed(&dir, every, &acked, &answered))
        };
        std::thread::sleep(delay);
        common::kill_9_and_wait(m.pid);
        writer.join().unwrap();
        drop(m);
        let acked = acked.lock().unwrap().clone();
        eprintln!(
            "run {run}: fsync every {every} files, kill -9 after {delay:?}: {} files fsynced",
            acked.len()
        );
        let m = volume.mount(&[]);
        for i in &acked {
            let path = m.path(&format!("run{run}")).join(rel(*i));
            let got = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("run {run}: fsynced file {i} after kill -9: {e}"));
            assert!(
                got == content(*i, size_of(*i)),
                "run {run}: fsynced file {i} differs after kill -9 (seed {seed})"
            );
        }
        // Only the daemon died, not the machine: what it answered before its commit is in
        // its intent log, which this mount applied. Every file whose steps were all
        // answered is whole, with its mode, mtime and links.
        let answered = answered.lock().unwrap().clone();
        for &i in &answered {
            let path = m.path(&format!("run{run}")).join(rel(i));
            let got = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("run {run}: file {i}, answered before the kill, after it: {e} (seed {seed})")
            });
            assert!(
                got == content(i, size_of(i)),
                "run {run}: file {i}, answered before the kill, differs after it (seed {seed})"
            );
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(
                meta.mode() & 0o7777,
                0o644 | ((i as u32 % 2) * 0o111),
                "run {run}: the mode of file {i} (seed {seed})"
            );
            assert_eq!(
                meta.mtime(),
                1_600_000_000 + i as i64,
                "run {run}: the mtime of file {i} (seed {seed})"
            );
            if i % 23 == 0 {
                assert_eq!(
                    std::fs::read_link(path.with_extension("link")).unwrap(),
                    Path::new(&format!("f{i}.c")),
                    "run {run}: the symlink of file {i} (seed {seed})"
                );
            }
            if i % 31 == 0 {
                assert_eq!(
                    std::fs::metadata(path.with_extension("hard"))
                        .unwrap()
                        .ino(),
                    meta.ino(),
                    "run {run}: the hard link of file {i} (seed {seed})"
                );
            }
        }
        eprintln!(
            "run {run}: {} files answered before the kill, all there",
            answered.len()
        );
        m.unmount();
        if !shared {
            let (clean, out) = volume.fsck(false);
            assert!(
                clean && out.contains("clean"),
                "run {run}: fsck after kill -9 and a remount (seed {seed}):\n{out}"
            );
        }
        all_acked.extend(acked.into_iter().map(|i| (run, i)));
    }
    let m = volume.mount(&[]);
    for (run, i) in &all_acked {
        let got = std::fs::read(m.path(&format!("run{run}")).join(rel(*i))).unwrap();
        assert!(
            got == content(*i, size_of(*i)),
            "run {run}: fsynced file {i} changed by later runs (seed {seed})"
        );
    }
    if shared {
        wait_for_sessions(volume, 1);
    }
    m.unmount();
    volume.assert_clean();
}

#[test]
fn kill_9_at_random_points_of_an_untar_keeps_every_fsynced_file() {
    kill_9_during_untars(KILL9_RUNS);
}

#[test]
#[ignore = "slow: KILL9_RUNS_SLOW kill -9 runs (cargo test -- --ignored kill_9_many)"]
fn kill_9_many_times_during_untars_keeps_every_fsynced_file() {
    kill_9_during_untars(KILL9_RUNS_SLOW);
}

/// The inode number of a path.
/// The names in a directory, sorted.
fn sorted_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn ino(p: &Path) -> i64 {
    std::fs::metadata(p).unwrap().ino() as i64
}

#[test]
fn fsck_finds_and_repairs_injected_damage() {
    let volume = Volume::format("fsck");
    let m = volume.mount(&[]);
    std::fs::write(m.path("small"), b"small").unwrap();
    std::fs::write(m.path("linked"), content(1, 2 * MIB)).unwrap();
    std::fs::write(m.path("chunked"), content(2, 3 * MIB)).unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    std::fs::create_dir_all(m.path("outer/inner")).unwrap();
    std::fs::write(m.path("outer/inner/kept"), b"kept").unwrap();
    std::fs::write(m.path("tiny"), b"tiny").unwrap();
    // Two small rewrites of a stored file, each fsync'd: a slice in each of its chunks.
    std::fs::write(m.path("sliced"), content(3, 2 * MIB)).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path("sliced"))
            .unwrap();
        for at in [100, MIB + 100] {
            f.write_all_at(&[0xab; 4096], at as u64).unwrap();
            f.sync_all().unwrap();
        }
    }
    let sliced = ino(&m.path("sliced"));
    let (small, linked, chunked) = (
        ino(&m.path("small")),
        ino(&m.path("linked")),
        ino(&m.path("chunked")),
    );
    let (outer, inner, tiny) = (
        ino(&m.path("outer")),
        ino(&m.path("outer/inner")),
        ino(&m.path("tiny")),
    );
    m.unmount();
    volume.assert_clean();

    let db = rusqlite::Connection::open(&volume.db).unwrap();
    // A dangling entry: the inode of `small` is gone.
    db.execute("DELETE FROM inodes WHERE ino = ?", [small])
        .unwrap();
    // An inode no entry names.
    db.execute(
        "INSERT INTO inodes (ino, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns, ctime_ns, parent)
         VALUES (999999, 33188, 0, 0, 0, 1, 0, 0, 0, 0, 1)",
        [],
    )
    .unwrap();
    // A wrong link count.
    db.execute("UPDATE inodes SET nlink = 5 WHERE ino = ?", [linked])
        .unwrap();
    // A missing block: the object of chunk 1 of `chunked`.
    let block: i64 = db
        .query_row(
            "SELECT block FROM chunks WHERE ino = ? AND idx = 1",
            [chunked],
            |r| r.get(0),
        )
        .unwrap();
    // A loop no path reaches: outer moved into its own child (the root's and inner's link
    // counts are wrong with it).
    db.execute(
        "UPDATE entries SET parent = ? WHERE ino = ?",
        [inner, outer],
    )
    .unwrap();
    db.execute("UPDATE inodes SET parent = ? WHERE ino = ?", [inner, outer])
        .unwrap();
    // An inline file with a chunk too (of `chunked`'s chunk 0's block: shared, not freed).
    db.execute(
        "INSERT INTO chunks (ino, idx, block, len, crc) SELECT ?, 0, block, len, crc FROM chunks WHERE ino = ? AND idx = 0",
        [tiny, chunked],
    )
    .unwrap();
    // A slice whose block is missing (chunk 0's of `sliced`), and slice rows of an inode
    // that is gone.
    let slice_block: i64 = db
        .query_row(
            "SELECT block FROM slices WHERE ino = ? AND idx = 0",
            [sliced],
            |r| r.get(0),
        )
        .unwrap();
    db.execute(
        "INSERT INTO slices (ino, idx, seq, pos, len, block, crc) VALUES (888888, 0, 1, 0, 1, 1, 0)",
        [],
    )
    .unwrap();
    drop(db);
    let key = |id: u64| block_path(&volume.data, id);
    std::fs::remove_file(key(block as u64)).unwrap();
    std::fs::remove_file(key(slice_block as u64)).unwrap();
    // An unreferenced block.
    std::fs::create_dir_all(key(0xdead_beef).parent().unwrap()).unwrap();
    std::fs::write(key(0xdead_beef), b"stray").unwrap();

    let (ok, report) = volume.fsck(false);
    assert!(!ok, "fsck passed a damaged volume:\n{report}");
    for expected in [
        "dangling entry \"small\"",
        "orphan inode 999999",
        &format!("inode {linked} has link count 5, should be 1"),
        &format!("block {block:016x} of inode {chunked} (chunk 1) is missing"),
        "block 00000000deadbeef is in the data directory but no file refers to it",
        &format!("directory {outer} is not reachable from the root"),
        &format!("directory {inner} is not reachable from the root"),
        &format!("inode {tiny} has inline bytes and chunks"),
        &format!("block {slice_block:016x} of inode {sliced} (chunk 0, slice 1) is missing"),
        "slices rows for missing inode 888888",
    ] {
        assert!(
            report.contains(expected),
            "fsck did not report {expected:?}:\n{report}"
        );
    }
    let (ok, report) = volume.fsck(true);
    // The loop is one problem per directory; named again from the root, it leaves no
    // wrong link count to repair.
    assert!(ok && report.contains("repaired 10 problems"), "{report}");
    volume.assert_clean();
    assert!(!key(0xdead_beef).exists());

    let m = volume.mount(&[]);
    assert!(!m.path("small").exists());
    assert_eq!(
        std::fs::read(m.path(&format!("lost+found-{outer}/inner/kept"))).unwrap(),
        b"kept"
    );
    assert_eq!(std::fs::read(m.path("tiny")).unwrap(), b"tiny");
    m.unmount();
    // A gc after the repair leaves `chunked` whole (read below).
    let gc = lanefs(&["gc", volume.db.to_str().unwrap()]);
    assert!(gc.status.success(), "lanefs gc: {}", stderr(&gc));
    let m = volume.mount(&[]);
    assert_eq!(std::fs::metadata(m.path("linked")).unwrap().nlink(), 1);
    assert_eq!(
        std::fs::read(m.path("linked")).unwrap(),
        content(1, 2 * MIB)
    );
    let chunked_now = std::fs::read(m.path("chunked")).unwrap();
    let want = content(2, 3 * MIB);
    assert_eq!(chunked_now[..MIB], want[..MIB]);
    assert!(
        chunked_now[MIB..2 * MIB].iter().all(|b| *b == 0),
        "the lost chunk reads as zeros"
    );
    assert_eq!(chunked_now[2 * MIB..], want[2 * MIB..]);
    // The slice whose block was lost is gone: its chunk reads as before it; the other stays.
    let mut want = content(3, 2 * MIB);
    want[MIB + 100..MIB + 4196].fill(0xab);
    assert!(std::fs::read(m.path("sliced")).unwrap() == want);
    m.unmount();
}

#[test]
fn corrupt_and_missing_blocks_give_eio_and_a_log_line() {
    let volume = Volume::format("eio");
    let m = volume.mount(&[]);
    std::fs::write(m.path("a"), content(3, 2 * MIB)).unwrap();
    std::fs::write(m.path("b"), content(4, 200 * KIB)).unwrap();
    let (a, b) = (ino(&m.path("a")), ino(&m.path("b")));
    m.unmount();
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    let block_of = |ino: i64| -> u64 {
        db.query_row(
            "SELECT block FROM chunks WHERE ino = ? AND idx = 0",
            [ino],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as u64
    };
    let key = |id: u64| block_path(&volume.data, id);
    let (block_a, block_b) = (block_of(a), block_of(b));
    // One flipped byte in a's first block; b's block is gone.
    let mut bytes = std::fs::read(key(block_a)).unwrap();
    bytes[1000] ^= 0x40;
    std::fs::write(key(block_a), bytes).unwrap();
    std::fs::remove_file(key(block_b)).unwrap();

    let log = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log.to_str().unwrap()]);
    for (name, block, why) in [
        ("a", block_a, "fails its checksum"),
        ("b", block_b, "is missing"),
    ] {
        let err = std::fs::read(m.path(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "reading {name}: {err}");
        let logged = std::fs::read_to_string(&log).unwrap();
        let line = format!("block {block:016x}");
        assert!(
            logged.lines().any(|l| l.contains(&line) && l.contains(why)),
            "no log line naming block {block:016x} ({why}):\n{logged}"
        );
    }
    // The second MiB of `a` is intact and still reads.
    let f = std::fs::File::open(m.path("a")).unwrap();
    let mut tail = vec![0u8; MIB];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, MIB as u64).unwrap();
    assert_eq!(tail, content(3, 2 * MIB)[MIB..]);
    drop(f);
    m.unmount();
}

/// A crafted or damaged database (rows written by hand, not by lanefs): rows no file can
/// have fail their file's reads with EIO and a log line, never the daemon (a chunk of
/// 2^40 bytes was an allocation of that size: the daemon aborted); bytes stored past a
/// file's size stay gone; a listing skips a name no file can have instead of ending or
/// failing there; a session counter past what block ids can number refuses the mount;
/// fsck reports each and its repair leaves a volume that reads.
#[test]
fn crafted_rows_fail_their_file_not_the_daemon_and_fsck_repairs_them() {
    use std::os::unix::fs::FileExt;
    let volume = Volume::format("crafted");
    let m = volume.mount(&[]);
    std::fs::write(m.path("huge"), content(1, 2 * MIB)).unwrap();
    std::fs::write(m.path("both"), content(6, 2 * MIB)).unwrap();
    std::fs::write(m.path("past-size"), b"0123456789").unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    for name in ["a", "b", "c"] {
        std::fs::write(m.path(&format!("dir/{name}")), name).unwrap();
    }
    std::fs::create_dir(m.path("kinded")).unwrap();
    std::fs::write(m.path("kinded/kept"), b"kept").unwrap();
    // The names the repair gives, taken already (the repair failed on them).
    let b_ino = ino(&m.path("dir/b"));
    std::fs::write(m.path(&format!("dir/bad-name-{b_ino}-0")), b"taken").unwrap();
    let kinded = ino(&m.path("kinded"));
    std::fs::write(m.path(&format!("lost+found-{kinded}")), b"taken").unwrap();
    let both = ino(&m.path("both"));
    let (huge, past_size, dir) = (
        ino(&m.path("huge")),
        ino(&m.path("past-size")),
        ino(&m.path("dir")),
    );
    m.unmount();

    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute(
        "UPDATE chunks SET len = ? WHERE ino = ? AND idx = 1",
        [1i64 << 40, huge],
    )
    .unwrap();
    db.execute(
        "INSERT INTO slices (ino, idx, seq, pos, len, block, crc)
         SELECT ino, 0, 99, ?, 1, block, crc FROM chunks WHERE ino = ? AND idx = 0",
        [1i64 << 40, huge],
    )
    .unwrap();
    db.execute(
        "UPDATE inodes SET inline_data = ? WHERE ino = ?",
        rusqlite::params![b"0123456789stale bytes".to_vec(), past_size],
    )
    .unwrap();
    // Inline bytes longer than a chunk beside the file's chunks: the repair drops the
    // inline value and keeps the chunks (dropped first as a file's second copy, the chunks
    // went, and then the inline value too).
    db.execute(
        "UPDATE inodes SET inline_data = ? WHERE ino = ?",
        rusqlite::params![vec![7u8; MIB + 1], both],
    )
    .unwrap();
    db.execute(
        "UPDATE entries SET name = ? WHERE parent = ? AND name = ?",
        rusqlite::params![b"x/y".to_vec(), dir, b"b".to_vec()],
    )
    .unwrap();
    // A directory's entry of a file's kind: no walk from the root goes through it (fsck's
    // repair moved it to the root and found it cut off again, without end).
    db.execute("UPDATE entries SET kind = 8 WHERE ino = ?", [kinded])
        .unwrap();
    let next_session: i64 = db
        .query_row(
            "SELECT value FROM counters WHERE name = 'next_session'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    db.execute(
        "UPDATE counters SET value = ? WHERE name = 'next_session'",
        [(1i64 << 24) + 5],
    )
    .unwrap();

    let mnt = TempDir::new("crafted-mnt");
    let out = lanefs(&[
        "mount",
        volume.source(),
        mnt.path().to_str().unwrap(),
        "--daemon",
    ]);
    if out.status.success() {
        lanefs(&["umount", mnt.path().to_str().unwrap()]);
        panic!("a volume whose next session number wraps block ids was mounted");
    }
    assert!(stderr(&out).contains("next_session"), "{}", stderr(&out));
    db.execute(
        "UPDATE counters SET value = ? WHERE name = 'next_session'",
        [next_session],
    )
    .unwrap();
    drop(db);

    let log = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log.to_str().unwrap()]);
    let err = std::fs::read(m.path("huge")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "reading huge: {err}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains(&format!(
            "inode {huge}: chunk 1 of 1099511627776 bytes is out of range"
        )),
        "{logged}"
    );
    // The daemon lives on, and the bytes past the size did not come back with it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("past-size"))
        .unwrap();
    f.set_len(21).unwrap();
    let mut read = vec![0; 21];
    f.read_exact_at(&mut read, 0).unwrap();
    assert_eq!(read, b"0123456789\0\0\0\0\0\0\0\0\0\0\0");
    f.set_len(10).unwrap();
    drop(f);
    assert_eq!(
        sorted_names(&m.path("dir")),
        ["a", &format!("bad-name-{b_ino}-0"), "c"]
    );
    m.unmount();

    let (ok, report) = volume.fsck(false);
    assert!(!ok, "fsck passed a damaged volume:\n{report}");
    for expected in [
        format!("inode {huge} has a chunk out of range"),
        format!("inode {huge} has a slice out of range"),
        format!("inode {both} has inline bytes longer than a chunk out of range"),
        format!("entry \"x/y\" in directory {dir}"),
        format!("directory {kinded} is not reachable from the root"),
    ] {
        assert!(
            report.contains(&expected),
            "fsck did not report {expected:?}:\n{report}"
        );
    }
    let (ok, report) = volume.fsck(true);
    assert!(ok, "{report}");
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert!(std::fs::read(m.path("both")).unwrap() == content(6, 2 * MIB));
    let read = std::fs::read(m.path("huge")).unwrap();
    assert!(read[..MIB] == content(1, 2 * MIB)[..MIB]);
    assert!(
        read[MIB..].iter().all(|&b| b == 0),
        "the dropped chunk reads as a hole"
    );
    let renamed = format!("bad-name-{b_ino}-0-1");
    assert_eq!(
        sorted_names(&m.path("dir")),
        ["a", &format!("bad-name-{b_ino}-0"), &renamed, "c"]
    );
    assert_eq!(
        std::fs::read(m.path(&format!("dir/{renamed}"))).unwrap(),
        b"b"
    );
    assert_eq!(
        std::fs::read(m.path(&format!("lost+found-{kinded}-1/kept"))).unwrap(),
        b"kept"
    );
    assert_eq!(
        std::fs::read(m.path(&format!("lost+found-{kinded}"))).unwrap(),
        b"taken"
    );
    m.unmount();
    volume.assert_clean();
}

/// Inode rows whose columns no attribute can have (written by hand or damaged): each costs
/// its own file (EIO, and a log line naming it and the column), not its directory's
/// listing (all of it failed with EIO before) nor the daemon; fsck reports every column
/// and negative data rows (it stopped at the first before, or took them for none) and
/// repairs them so that the data is there again.
#[test]
fn damaged_inode_columns_fail_their_file_not_the_listing_and_fsck_repairs_them() {
    use std::os::unix::fs::FileExt;
    let volume = Volume::format("damaged-inodes");
    let m = volume.mount(&[]);
    for name in ["sound", "oversized", "negative", "typeless", "unowned"] {
        std::fs::write(m.path(name), b"hello\n").unwrap();
    }
    std::fs::create_dir(m.path("dir")).unwrap();
    std::fs::write(m.path("dir/inner"), b"in").unwrap();
    std::fs::write(m.path("chunked"), content(3, 3 * MIB)).unwrap();
    std::os::unix::fs::symlink("target", m.path("link")).unwrap();
    let inos: Vec<i64> = [
        "oversized",
        "negative",
        "typeless",
        "unowned",
        "dir",
        "chunked",
    ]
    .iter()
    .map(|n| ino(&m.path(n)))
    .collect();
    let [oversized, negative, typeless, unowned, dir, chunked] = inos[..] else {
        unreachable!()
    };
    let link = std::fs::symlink_metadata(m.path("link")).unwrap().ino() as i64;
    let ino_of_sound = ino(&m.path("sound"));
    m.unmount();

    let db = rusqlite::Connection::open(&volume.db).unwrap();
    let set = |sql: &str, ino: i64| {
        db.execute(sql, [ino]).unwrap();
    };
    set(
        "UPDATE inodes SET size = 4611686018427387904 WHERE ino = ?",
        oversized,
    );
    set("UPDATE inodes SET size = -5 WHERE ino = ?", negative);
    set(
        "UPDATE inodes SET mode = 61440 | 420 WHERE ino = ?",
        typeless,
    );
    set(
        "UPDATE inodes SET uid = -1, gid = 4294967295 WHERE ino = ?",
        unowned,
    );
    // A directory of no known type: its entries are kept (fsck took them for entries
    // under a file, and dropped them).
    set(
        "UPDATE inodes SET mode = 61440 | 493, size = -1 WHERE ino = ?",
        dir,
    );
    set(
        "UPDATE inodes SET size = -1, parent = -7 WHERE ino = ?",
        link,
    );
    set("UPDATE inodes SET size = -9 WHERE ino = ?", chunked);
    set(
        "UPDATE chunks SET idx = -3 WHERE ino = ? AND idx = 1",
        chunked,
    );
    set(
        "INSERT INTO slices (ino, idx, seq, pos, len, block, crc)
         SELECT ino, 0, 99, -9223372036854775807, 5, block, crc FROM chunks
         WHERE ino = ? AND idx = 0",
        chunked,
    );
    drop(db);

    let log = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log.to_str().unwrap()]);
    assert_eq!(
        sorted_names(&m.path("")),
        [
            "chunked",
            "dir",
            "link",
            "negative",
            "oversized",
            "sound",
            "typeless",
            "unowned"
        ],
        "the listing of a directory with damaged inodes"
    );
    assert_eq!(std::fs::read(m.path("sound")).unwrap(), b"hello\n");
    for name in ["negative", "typeless", "unowned", "dir"] {
        let err = std::fs::metadata(m.path(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    for expected in [
        format!("inode {negative}: size -5 is out of range"),
        format!("inode {typeless}: mode 61860 is out of range"),
        format!("inode {unowned}: uid -1 is out of range"),
    ] {
        assert!(logged.contains(&expected), "no {expected:?} in\n{logged}");
    }
    m.unmount();

    // The root's mode too: no entry names it, so no entry's kind gives its type (made a
    // file's, it would have had every entry in the volume dropped as dangling).
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute("UPDATE inodes SET mode = 61440 | 493 WHERE ino = 1", [])
        .unwrap();
    // An inode numbered below 1, which every mount refuses, and its entry.
    db.execute(
        "INSERT INTO inodes SELECT -5, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns,
         ctime_ns, parent, inline_data FROM inodes WHERE ino = ?",
        [ino_of_sound],
    )
    .unwrap();
    db.execute(
        "INSERT INTO entries (parent, name, ino, kind) VALUES (1, ?, -5, 8)",
        [b"numbered-below-1".to_vec()],
    )
    .unwrap();
    drop(db);
    // The check reports what the repair does: the damaged directories' entries stay.
    let (ok, report) = volume.fsck(false);
    assert!(!ok, "fsck passed a damaged volume:\n{report}");
    assert!(!report.contains("dangling entry \"inner\""), "{report}");
    for expected in [
        "inode 1 has mode 61933, out of range; mode 40755 at repair",
        "an inode row is numbered -5, which no inode can be; freed at repair",
        "dangling entry \"numbered-below-1\"",
    ] {
        assert!(report.contains(expected), "no {expected:?} in\n{report}");
    }
    for expected in [
        format!("inode {typeless} has mode 61860, out of range; mode 100644 at repair"),
        format!("inode {unowned} has uid -1, out of range; uid 0 at repair"),
        format!("inode {unowned} has gid 4294967295, out of range; gid 0 at repair"),
        format!("inode {dir} has mode 61933, out of range; mode 40755 at repair"),
        format!("inode {link} has parent -7, out of range; parent 1 at repair"),
        format!("inode {chunked} has a chunk out of range"),
        format!("inode {chunked} has a slice out of range"),
        format!("inode {oversized} has a size out of range; set to 6"),
        format!("inode {chunked} has a size out of range; set to 3145728"),
        format!("inode {link} has a size out of range; set to 6"),
    ] {
        assert!(
            report.contains(&expected),
            "fsck did not report {expected:?}:\n{report}"
        );
    }
    let (ok, report) = volume.fsck(true);
    assert!(ok, "{report}");
    assert!(
        !report.contains("dangling entry \"inner\""),
        "the repair dropped the damaged directory's entries:\n{report}"
    );
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert_eq!(std::fs::read(m.path("dir/inner")).unwrap(), b"in");
    assert_eq!(std::fs::read(m.path("negative")).unwrap(), b"hello\n");
    let typeless = std::fs::metadata(m.path("typeless")).unwrap();
    assert_eq!(typeless.mode(), 0o100644);
    assert_eq!(std::fs::metadata(m.path("unowned")).unwrap().uid(), 0);
    assert_eq!(
        std::fs::read_link(m.path("link")).unwrap(),
        Path::new("target")
    );
    // The chunk whose index was negative is a hole; the others read as written.
    let f = std::fs::File::open(m.path("chunked")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 3 * MIB as u64);
    let mut read = vec![0; 3 * MIB];
    f.read_exact_at(&mut read, 0).unwrap();
    let written = content(3, 3 * MIB);
    assert!(read[..MIB] == written[..MIB] && read[2 * MIB..] == written[2 * MIB..]);
    assert!(read[MIB..2 * MIB].iter().all(|&b| b == 0));
    drop(f);
    m.unmount();
}

#[test]
fn small_files_write_no_object() {
    let volume = Volume::format("inline");
    let m = volume.mount(&[]);
    for i in 0..100 {
        std::fs::write(m.path(&format!("small{i}")), content(i, KIB)).unwrap();
    }
    std::fs::write(m.path("at-limit"), content(1, 64 * KIB)).unwrap();
    assert_eq!(block_files(&volume.data), Vec::<PathBuf>::new());
    std::fs::write(m.path("over-limit"), content(2, 64 * KIB + 1)).unwrap();
    assert_eq!(block_files(&volume.data).len(), 1);
    // Growing an inline file past the limit moves it to a block; the old bytes stay.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.path("small0"))
        .unwrap();
    f.write_all(&content(9, 100 * KIB)).unwrap();
    drop(f);
    let mut want = content(0, KIB);
    want.extend(content(9, 100 * KIB));
    assert_eq!(std::fs::read(m.path("small0")).unwrap(), want);
    assert_eq!(block_files(&volume.data).len(), 2);
    let status = String::from_utf8_lossy(&lanefs(&["status", volume.source()]).stdout).into_owned();
    assert!(status.contains("inline files   100"), "{status}");
    assert!(status.contains(&format!("pid {}", m.pid)), "{status}");
    m.unmount();
    volume.assert_clean();
}

/// Changes are committed by whichever caller finds the committer free, or by the writer
/// thread when one is busy: creates, writes and unlinks racing from many threads must all
/// land (none left in the queue, none answered twice), here and after a remount.
#[test]
fn concurrent_creates_from_many_threads_all_land() {
    const THREADS: usize = 8;
    const FILES: usize = 300;
    let volume = Volume::format("combine");
    let m = volume.mount(&[]);
    let dir = m.path("d");
    std::fs::create_dir(&dir).unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                for i in 0..FILES {
                    let n = t * FILES + i;
                    std::fs::write(dir.join(format!("f{n}")), content(n, 100)).unwrap();
                    if i.is_multiple_of(3) {
                        std::fs::remove_file(dir.join(format!("f{n}"))).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let check = |dir: &Path| {
        let mut names = 0;
        for n in 0..THREADS * FILES {
            let path = dir.join(format!("f{n}"));
            if (n % FILES).is_multiple_of(3) {
                assert!(!path.exists(), "{n} was unlinked");
            } else {
                assert_eq!(std::fs::read(&path).unwrap(), content(n, 100), "file {n}");
                names += 1;
            }
        }
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), names);
    };
    check(&dir);
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    check(&m.path("d"));
    m.unmount();
    volume.assert_clean();
}

#[test]
fn parallel_direct_writes_to_one_file_land() {
    let volume = Volume::format("pwrite");
    let m = volume.mount(&[]);
    let path = m.path("shared");
    std::fs::write(&path, vec![0u8; 4 * MIB]).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                use std::os::unix::fs::{FileExt, OpenOptionsExt};
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .unwrap();
                // 4 KiB-aligned buffers for O_DIRECT: the pages of a larger allocation.
                let mut buf = vec![0u8; 64 * KIB + 4096];
                let at = buf.as_ptr().align_offset(4096);
                for k in 0..16usize {
                    let piece = &mut buf[at..at + 64 * KIB];
                    piece.fill((t * 16 + k) as u8);
                    f.write_all_at(piece, ((t * 16 + k) * 64 * KIB) as u64)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let data = std::fs::read(&path).unwrap();
    for (n, piece) in data.chunks(64 * KIB).enumerate() {
        assert!(
            piece.iter().all(|b| *b == n as u8),
            "64 KiB piece {n} is wrong"
        );
    }
    m.unmount();
    volume.assert_clean();
}

/// Every file of a volume on the host (database, its -wal and -shm, data directory, block
/// directories and blocks, intent logs) is readable by the mount's user alone, whatever the
/// umask: the mount's modes and ACLs guard the users' files, and a block or a database
/// readable on the host let any local user read past them (a 0600 file's bytes were in a
/// 0644 block, small files' in a 0644 database). A volume made before is narrowed when
/// mounted.
#[test]
fn a_volumes_host_files_are_its_users_alone() {
    let dir = TempDir::new("vol-private");
    let db = dir.path().join("vol.db");
    let data = dir.path().join("data");
    run_ok(Command::new("sh").arg("-c").arg(format!(
        "umask 022 && {} format {} --data {}",
        common::lanefs(),
        db.display(),
        data.display()
    )));
    let volume = Volume {
        dir,
        db,
        data,
        pg: None,
    };
    let open_to_others = |volume: &Volume| {
        let mut open = Vec::new();
        let mut stack = vec![volume.data.clone(), volume.intent_dir()];
        for suffix in ["", "-wal", "-shm"] {
            let mut p = volume.db.clone().into_os_string();
            p.push(suffix);
            stack.push(PathBuf::from(p));
        }
        while let Some(path) = stack.pop() {
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.mode() & 0o077 != 0 {
                open.push(format!("{} {:o}", path.display(), meta.mode() & 0o7777));
            }
            if meta.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
        }
        open
    };
    let write = |volume: &Volume| {
        let m = volume.mount(&[]);
        std::fs::write(m.path("secret"), content(3, 3 << 20)).unwrap();
        std::fs::write(m.path("small"), b"inline").unwrap();
        let blocks = std::fs::read_dir(volume.data.join("blocks"))
            .unwrap()
            .count();
        let open = open_to_others(volume);
        m.unmount();
        assert!(blocks > 0, "no block was written");
        open
    };
    // Under the mount's own umask (022 in the test's shell), `mount --daemon` too.
    let open = write(&volume);
    assert!(open.is_empty(), "readable by others: {open:?}");
    // A volume an older lanefs made: its files as they were.
    run_ok(Command::new("chmod").arg("0644").arg(&volume.db));
    run_ok(
        Command::new("chmod")
            .arg("0755")
            .arg(volume.data.join("blocks")),
    );
    let m = volume.mount(&[]);
    let (db_mode, blocks_mode) = (
        std::fs::metadata(&volume.db).unwrap().mode() & 0o777,
        std::fs::metadata(volume.data.join("blocks"))
            .unwrap()
            .mode()
            & 0o777,
    );
    m.unmount();
    assert_eq!((db_mode, blocks_mode), (0o600, 0o700));
    volume.assert_clean();
}

/// A volume's uuid names a local directory (a shared volume's intent logs) and is matched
/// against its data's volume-id object: one that is not the 32 hex digits format writes
/// (`../../etc/x`, written by anyone who can write the database) is damage, refused before
/// anything is made from it.
#[test]
fn a_volume_whose_uuid_is_a_path_is_refused() {
    let volume = Volume::format("uuid");
    let id_file = volume.data.join("lanefs-volume-id");
    let forged = "../../../forged";
    rusqlite::Connection::open(&volume.db)
        .unwrap()
        .execute(
            "UPDATE settings SET value = ?1 WHERE name = 'uuid'",
            [forged],
        )
        .unwrap();
    std::fs::write(&id_file, forged).unwrap();
    let mp = TempDir::new("vol-uuid-mp");
    let out = lanefs(&[
        "mount",
        "--daemon",
        volume.source(),
        mp.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(!is_mounted(mp.path()));
    assert!(
        stderr(&out).contains("is damaged: its uuid \"../../../forged\" is not 32 hex digits"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_second_mount_and_bad_volumes_are_refused_with_one_sentence() {
    let volume = Volume::format("refuse");
    let m = volume.mount(&[]);
    let other = TempDir::new("vol-refuse-mp");
    let out = lanefs(&[
        "mount",
        "--daemon",
        volume.source(),
        other.path().to_str().unwrap(),
    ]);
    let msg = stderr(&out);
    assert!(!out.status.success());
    assert!(
        msg.contains("is already mounted") && msg.contains(&format!("pid {}", m.pid)),
        "{msg}"
    );
    assert!(!is_mounted(other.path()));
    let out = lanefs(&["fsck", volume.source()]);
    assert!(
        !out.status.success() && stderr(&out).contains("already mounted"),
        "{}",
        stderr(&out)
    );
    let out = lanefs(&["format", volume.source(), "--data", "/tmp/x"]);
    assert!(
        stderr(&out).contains("exists; add --force"),
        "{}",
        stderr(&out)
    );
    let out = lanefs(&[
        "format",
        "--force",
        volume.source(),
        "--data",
        volume.data.to_str().unwrap(),
    ]);
    assert!(stderr(&out).contains("already mounted"), "{}", stderr(&out));
    m.unmount();

    let dir = TempDir::new("vol-bad");
    let mp = dir.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let refused = |source: &Path, expected: &str| {
        let out = lanefs(&[
            "mount",
            "--daemon",
            source.to_str().unwrap(),
            mp.to_str().unwrap(),
        ]);
        let msg = stderr(&out);
        assert!(!out.status.success(), "{} was mounted", source.display());
        assert!(
            msg.contains(expected),
            "mounting {}: {msg:?} lacks {expected:?}",
            source.display()
        );
        assert_eq!(msg.trim().lines().count(), 1, "more than one line: {msg}");
        assert!(!is_mounted(&mp));
    };
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a volume").unwrap();
    refused(&text, "is a file but not a lanefs volume");
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    refused(&foreign, "an SQLite database but not a lanefs volume");
    // Refused before any change: it was not switched to WAL for good, nor "upgraded" where
    // it has a table of the name lanefs keeps its format in (another tool's migrations).
    let mode: String = rusqlite::Connection::open(&foreign)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        mode, "delete",
        "a refused mount changed another program's database"
    );
    let migrated = dir.path().join("migrated.db");
    rusqlite::Connection::open(&migrated)
        .unwrap()
        .execute_batch(
            "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, dirty BOOLEAN);
             INSERT INTO schema_migrations VALUES (3, 0);",
        )
        .unwrap();
    refused(&migrated, "an SQLite database but not a lanefs volume");
    // A newer format.
    let newer = Volume::format("newer");
    rusqlite::Connection::open(&newer.db)
        .unwrap()
        .execute(
            "INSERT INTO schema_migrations (version, applied_ns) VALUES (99, 0)",
            [],
        )
        .unwrap();
    refused(&newer.db, "made by a newer lanefs (format 99");
    // A missing data directory.
    let lost = Volume::format("lost");
    std::fs::rename(&lost.data, lost.dir.path().join("moved")).unwrap();
    refused(&lost.db, "is missing");
    // A data directory that lost its volume-id object (nothing to hold: said, not locked).
    let unmarked = Volume::format("unmarked");
    std::fs::remove_file(unmarked.data.join("lanefs-volume-id")).unwrap();
    refused(&unmarked.db, "has lost its lanefs-volume-id object");
    // Another volume's data directory.
    let mixed = Volume::format("mixed");
    rusqlite::Connection::open(&mixed.db)
        .unwrap()
        .execute(
            "UPDATE settings SET value = ? WHERE name = 'data'",
            [volume.data.to_str().unwrap()],
        )
        .unwrap();
    refused(&mixed.db, "belongs to another volume");
    // fsck and status say the same sentences.
    let out = lanefs(&["status", foreign.to_str().unwrap()]);
    assert!(
        stderr(&out).contains("not a lanefs volume"),
        "{}",
        stderr(&out)
    );
    // The good volume is untouched by all this.
    volume.assert_clean();
}

/// What makes a volume of this binary's format (2) one of format 1: step 2 (the locks
/// table) undone. Step 1 is the same text in both binaries.
/// The newest volume format.
const NEWEST_FORMAT: i64 = lanefs_volume::schema::FORMAT_VERSION;
/// Takes a new volume back to format 1: undoes steps 2 to 4 of the schema.
const BACK_TO_FORMAT_1: &str =
    "DROP TABLE intent_logs; DROP TABLE slices; DROP TABLE locks; DROP TABLE holds;
     ALTER TABLE orphans DROP COLUMN since_ns; DROP INDEX leases_by_session;
     ALTER TABLE leases DROP COLUMN recalled; DELETE FROM schema_migrations WHERE version >= 2;
     UPDATE settings SET value = '1' WHERE name = 'format_version';";

/// A volume of format 1 (made before the locks table) is upgraded when it is mounted, and
/// works: a file written, read back after a remount, fsck clean.
#[test]
fn a_format_1_volume_is_upgraded_at_mount() {
    let volume = Volume::format("v1");
    rusqlite::Connection::open(&volume.db)
        .unwrap()
        .execute_batch(BACK_TO_FORMAT_1)
        .unwrap();
    let status = lanefs(&["status", volume.source()]);
    assert!(
        stderr(&status).contains("format 1"),
        "status of a format-1 volume: {}",
        stderr(&status)
    );
    let m = volume.mount(&[]);
    std::fs::write(m.path("f"), b"after the upgrade").unwrap();
    m.unmount();
    let conn = rusqlite::Connection::open(&volume.db).unwrap();
    let newest: i64 = conn
        .query_row("SELECT max(version) FROM schema_migrations", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(newest, NEWEST_FORMAT);
    let locks: i64 = conn
        .query_row("SELECT count(*) FROM locks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(locks, 0);
    let slices: i64 = conn
        .query_row("SELECT count(*) FROM slices", [], |r| r.get(0))
        .unwrap();
    assert_eq!(slices, 0);
    drop(conn);
    let status = lanefs(&["status", volume.source()]);
    assert!(
        String::from_utf8_lossy(&status.stdout)
            .contains(&format!("format         {NEWEST_FORMAT}")),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    let m = volume.mount(&[]);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"after the upgrade");
    m.unmount();
    volume.assert_clean();
}

#[test]
fn mount_8_form_mounts_a_volume_with_a_capacity() {
    let volume = Volume::format("fstab");
    let dir = TempDir::new("vol-fstab-mnt");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new("mount")
        .args(["-t", "fuse"])
        .arg(format!("{}#{}", common::lanefs(), volume.db.display()))
        .arg(&mnt)
        .args(["-o", "capacity=1G"])
        .output()
        .unwrap();
    let _guard = LazyUnmount(&mnt);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(mnt.join("hello"), b"hello").unwrap();
    let df = run_ok(Command::new("df").args(["-B1", "--output=size"]).arg(&mnt));
    assert_eq!(
        df.lines().last().unwrap().trim(),
        (1u64 << 30).to_string(),
        "{df}"
    );
    // Another test of this process that forks may hold our fds for a moment: busy, retry
    // (as the harness's Mount::unmount does).
    let unmounted = wait_until(Duration::from_secs(5), || {
        Command::new(common::lanefs())
            .arg("umount")
            .arg(&mnt)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(unmounted, "lanefs umount {} kept failing", mnt.display());
    // The daemon lets go of the volume before `lanefs umount` returns: no wait.
    assert!(volume.fsck(false).0, "fsck right after lanefs umount");
    volume.assert_clean();
}

#[test]
fn a_full_data_directory_gives_enospc_at_fsync_and_loses_nothing_acknowledged() {
    let tmpfs = common::Tmpfs::new("3M");
    let dir = TempDir::new("vol-full");
    let db = dir.path().join("vol.db");
    common::volume::format_volume(&db, &tmpfs.path.join("data"));
    let m = common::Mount::start(db.to_str().unwrap(), &[]);
    let mut kept = std::fs::File::create(m.path("kept")).unwrap();
    kept.write_all(&content(1, MIB)).unwrap();
    kept.sync_all().unwrap();
    drop(kept);
    let mut big = std::fs::File::create(m.path("big")).unwrap();
    big.write_all(&content(2, 4 * MIB)).unwrap();
    let err = big.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(big);
    std::fs::remove_file(m.path("big")).unwrap();
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), content(1, MIB));
    // Room again: writes work.
    let mut again = std::fs::File::create(m.path("again")).unwrap();
    again.write_all(&content(3, MIB)).unwrap();
    if let Err(e) = again.sync_all() {
        let listing = Command::new("find")
            .args([tmpfs.path.to_str().unwrap(), "-printf", "%s %p\n"])
            .output()
            .unwrap();
        panic!(
            "fsync with room again: {e}; the data directory holds:\n{}",
            String::from_utf8_lossy(&listing.stdout)
        );
    }
    drop(again);
    m.unmount();
    let out = lanefs(&["fsck", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

#[test]
fn a_busy_database_is_waited_for_with_a_log_line() {
    let volume = Volume::format("busy");
    let log = volume.dir.path().join("daemon.log");
    // Creates wait for their commit here (with early answers only the mount's first one
    // would, for its range of inode numbers).
    let m = volume.mount(&["--log", log.to_str().unwrap(), "--no-async-dirops"]);
    // Another process's write transaction holds SQLite's write lock for a while.
    let holder = rusqlite::Connection::open(&volume.db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let creator = {
        let path = m.path("made-while-busy");
        std::thread::spawn(move || std::fs::write(path, b"x"))
    };
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !creator.is_finished(),
        "the create did not wait for the lock"
    );
    holder.execute_batch("COMMIT").unwrap();
    creator.join().unwrap().unwrap();
    assert_eq!(std::fs::read(m.path("made-while-busy")).unwrap(), b"x");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("the database is busy"), "{logged}");
    m.unmount();
    volume.assert_clean();
}

#[test]
fn gc_deletes_blocks_no_file_refers_to() {
    let volume = Volume::format("gc");
    let m = volume.mount(&[]);
    std::fs::write(m.path("kept"), content(5, 2 * MIB)).unwrap();
    m.unmount();
    let stray = block_path(&volume.data, 0x0abc);
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"left by a crash").unwrap();
    let out = lanefs(&["gc", volume.source()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deleted 1 unreferenced blocks"
    );
    assert!(!stray.exists());
    assert_eq!(block_files(&volume.data).len(), 2);
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), content(5, 2 * MIB));
    m.unmount();
}

#[test]
fn a_full_metadata_disk_gives_enospc_and_the_volume_goes_on_after() {
    full_metadata_disk(false);
}

/// With creates answered before their commit, the commit that finds the disk full reports
/// at the file's fsync: every file whose fsync succeeded is there after, and the volume goes
/// on once there is room.
#[test]
fn a_full_metadata_disk_fails_the_fsync_of_an_early_answered_create() {
    full_metadata_disk(true);
}

fn full_metadata_disk(async_dirops: bool) {
    let tmpfs = common::Tmpfs::new("1M");
    let dir = TempDir::new("vol-dbfull");
    let db = tmpfs.path.join("vol.db");
    let data = dir.path().join("data");
    let out = lanefs(&[
        "format",
        db.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The intent log lives elsewhere: the metadata's disk is what fills.
    let intent_dir = dir.path().join("intent");
    let args: &[&str] = if async_dirops {
        &["--intent-dir", intent_dir.to_str().unwrap()]
    } else {
        &["--no-async-dirops"]
    };
    let m = common::Mount::start(db.to_str().unwrap(), args);
    // Long names fill the metadata quickly.
    let name = |i: usize| format!("{i:06}-{}", "n".repeat(200));
    let mut made = 0;
    let err = loop {
        let made_one = std::fs::File::create(m.path(&name(made))).and_then(|f| {
            if async_dirops {
                f.sync_all()?;
            }
            Ok(())
        });
        match made_one {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100_000, "the metadata never filled 1 MiB");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let early = m.counter("async_dirops");
    if async_dirops {
        assert!(
            early >= made as u64,
            "{early} creates answered early of {made}"
        );
    } else {
        assert_eq!(early, 0);
    }
    run_ok(
        Command::new("mount")
            .args(["-o", "remount,size=64M"])
            .arg(&tmpfs.path),
    );
    std::fs::File::create(m.path("after")).unwrap();
    for i in 0..made {
        assert!(m.path(&name(i)).exists(), "file {i} of {made} is gone");
    }
    m.unmount();
    let out = lanefs(&["fsck", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

/// A change answered before its commit whose commit then fails (a trigger planted in the
/// database refuses one name) is never silent: the file's fsync and close fail, so does the
/// directory's fsync for an unlink, the log names it, `lanefs stats` counts it, and the name
/// is as the database has it (the create's gone, the unlinked file back).
#[test]
fn an_early_answered_change_that_fails_at_commit_fails_fsync_and_close() {
    early_change_failing_at_commit(None);
}

/// The same in a directory this mount made, whose names it answers from its own listing:
/// after the failures the listing is not trusted (the create's name gone, the file back).
#[test]
fn an_early_answered_change_that_fails_in_a_new_directory_leaves_its_names_right() {
    early_change_failing_at_commit(Some("new"));
}

/// `dir`: where the changes happen (None: the root, made by format; a name: a directory the
/// mount makes first).
fn early_change_failing_at_commit(dir: Option<&str>) {
    use std::os::fd::IntoRawFd;
    let volume = Volume::format("early-fail");
    let log = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log.to_str().unwrap()]);
    let at = |name: &str| match dir {
        Some(dir) => format!("{dir}/{name}"),
        None => name.to_owned(),
    };
    if let Some(dir) = dir {
        std::fs::create_dir(m.path(dir)).unwrap();
    }
    std::fs::write(m.path(&at("kept")), b"kept").unwrap();
    std::fs::File::open(m.path(&at("kept")))
        .unwrap()
        .sync_all()
        .unwrap();
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_doomed BEFORE INSERT ON entries WHEN NEW.name = CAST('doomed' AS BLOB)
             BEGIN SELECT RAISE(ABORT, 'injected by the test'); END;
         CREATE TRIGGER refuse_unlink BEFORE DELETE ON entries WHEN OLD.name = CAST('kept' AS BLOB)
             BEGIN SELECT RAISE(ABORT, 'injected by the test'); END;",
    )
    .unwrap();
    let before = m.counter("async_dirops");
    // Answered at once (nothing was wrong with it as far as the mount could tell)...
    let mut doomed = std::fs::File::create(m.path(&at("doomed"))).unwrap();
    assert_eq!(m.counter("async_dirops"), before + 1, "not answered early");
    doomed.write_all(b"lost").unwrap();
    // ...and refused at the commit: fsync and close say so.
    let err = doomed.sync_all().unwrap_err();
    assert!(err.raw_os_error().is_some(), "{err}");
    let fd = doomed.into_raw_fd();
    // SAFETY: fd came from into_raw_fd above and is closed once, here.
    let closed = unsafe { libc::close(fd) };
    assert_eq!(closed, -1, "close of a file whose create failed succeeded");
    assert_eq!(m.counter("async_dirop_errors"), 1);
    let gone = wait_until(Duration::from_secs(5), || !m.path(&at("doomed")).exists());
    assert!(gone, "the failed create's name is still there");
    // An unlink answered early and refused at the commit: the directory's fsync fails once,
    // and the file is back with its bytes.
    std::fs::remove_file(m.path(&at("kept"))).unwrap();
    let root = std::fs::File::open(m.path(dir.unwrap_or(""))).unwrap();
    assert!(root.sync_all().is_err(), "fsync of the directory succeeded");
    root.sync_all().unwrap();
    drop(root);
    assert_eq!(m.counter("async_dirop_errors"), 2);
    let back = wait_until(Duration::from_secs(5), || m.path(&at("kept")).exists());
    assert!(back, "the file whose unlink failed is not back");
    assert_eq!(std::fs::read(m.path(&at("kept"))).unwrap(), b"kept");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("\"doomed\""), "{logged}");
    assert!(logged.contains("\"kept\""), "{logged}");
    db.execute_batch("DROP TRIGGER refuse_doomed; DROP TRIGGER refuse_unlink;")
        .unwrap();
    drop(db);
    // The volume goes on: the same names work now.
    std::fs::write(m.path(&at("doomed")), b"now").unwrap();
    std::fs::remove_file(m.path(&at("kept"))).unwrap();
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert_eq!(std::fs::read(m.path(&at("doomed"))).unwrap(), b"now");
    assert!(!m.path(&at("kept")).exists());
    m.unmount();
}

/// A change answered early whose commit failed on its own (and was reported at fsync) is
/// finished: a replay after a kill -9 does not apply it again. Its batch's watermark was
/// rolled back with it, so a replay unlinked the file that the failed unlink had brought
/// back, with the bytes its owner had seen return.
#[test]
fn a_change_that_failed_at_its_commit_is_not_replayed_after_a_kill_9() {
    let volume = Volume::format("failed-replay");
    let m = volume.mount(&[]);
    std::fs::write(m.path("kept"), b"kept").unwrap();
    std::fs::File::open(m.path("")).unwrap().sync_all().unwrap();
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_unlink BEFORE DELETE ON entries WHEN OLD.name = CAST('kept' AS BLOB)
             BEGIN SELECT RAISE(ABORT, 'injected by the test'); END;",
    )
    .unwrap();
    std::fs::remove_file(m.path("kept")).unwrap();
    // The unlink commits (and fails) alone in its batch, before the fsync below queues.
    assert!(wait_until(Duration::from_secs(5), || m
        .path("kept")
        .exists()));
    assert!(
        std::fs::File::open(m.path("")).unwrap().sync_all().is_err(),
        "fsync of the directory succeeded"
    );
    db.execute_batch("DROP TRIGGER refuse_unlink").unwrap();
    // A change whose commit is held back keeps its batch, which would write the watermark
    // past the failed unlink, from committing before the kill.
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::fs::File::create(m.path("later")).unwrap();
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    drop(m);
    let m = volume.mount(&[]);
    assert_eq!(
        std::fs::read(m.path("kept")).ok().as_deref(),
        Some(&b"kept"[..]),
        "the failed unlink was applied by the replay"
    );
    assert!(
        m.path("later").exists(),
        "the held-back create was not replayed"
    );
    m.unmount();
    volume.assert_clean();
}

/// `rm -rf` of a tree this mount made is answered without waiting for the database: a
/// directory whose complete listing this mount holds is removed early once its names are,
/// as its files are. Before, every rmdir waited for the commit of everything queued before
/// it (2.4 ms each on PostgreSQL; a kernel tree has 16,739 directories); here the test holds
/// the database's write lock, and the old rmdirs failed after their busy retries. After
/// kill -9 with all of it uncommitted, the next mount's replay removes the whole tree.
#[test]
fn rm_rf_of_a_tree_this_mount_made_is_answered_without_the_database() {
    let volume = Volume::format("early-rmdir");
    let m = volume.mount(&[]);
    let mut dirs = vec![m.path("t")];
    std::fs::create_dir(m.path("t")).unwrap();
    for d in 0..4 {
        for s in 0..3 {
            let dir = m.path(&format!("t/d{d}/s{s}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..4 {
                std::fs::write(dir.join(format!("f{f}")), b"file").unwrap();
            }
            dirs.push(dir);
        }
        dirs.push(m.path(&format!("t/d{d}")));
    }
    // Committed, so that rm's listings of them wait for nothing.
    for dir in &dirs {
        std::fs::File::open(dir).unwrap().sync_all().unwrap();
    }
    std::fs::File::open(m.path("")).unwrap().sync_all().unwrap();
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    run_ok(Command::new("rm").arg("-rf").arg(m.path("t")));
    assert!(!m.path("t").exists(), "rm -rf left the tree");
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    drop(m);
    let m = volume.mount(&[]);
    assert!(
        !m.path("t").exists(),
        "the tree removed before kill -9 is back after the replay"
    );
    m.unmount();
    volume.assert_clean();
}

/// A replay whose record fails outright (here the database refuses its watermark's
/// update) stops the mount, and the next mount applies that record: the records after it,
/// each committed with the watermark computed past everything before it, made it look
/// applied, and the file it created was never made.
#[test]
fn a_record_that_failed_its_replay_is_applied_by_the_next_one() {
    let volume = Volume::format("replay-fails");
    let m = volume.mount(&[]);
    // Record 1, committed with its watermark.
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::File::open(m.path("")).unwrap().sync_all().unwrap();
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Records 2 to 6, answered and never committed.
    for i in 0..5 {
        std::fs::File::create(m.path(&format!("d/f{i}"))).unwrap();
    }
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    db.execute_batch("ROLLBACK").unwrap();
    drop(m);
    // The replay of record 4 (f2) fails at its watermark.
    db.execute_batch(
        "CREATE TRIGGER refuse_watermark BEFORE UPDATE ON intent_logs WHEN NEW.applied = 4
             BEGIN SELECT RAISE(ABORT, 'injected by the test'); END;",
    )
    .unwrap();
    let mp = TempDir::new("vol-replay-fails-mp");
    let out = lanefs(&[
        "mount",
        "--daemon",
        volume.source(),
        mp.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "mounted with a failed replay");
    assert!(!is_mounted(mp.path()));
    assert!(
        stderr(&out).contains("the log stays for the next mount"),
        "{}",
        stderr(&out)
    );
    db.execute_batch("DROP TRIGGER refuse_watermark").unwrap();
    drop(db);
    let m = volume.mount(&[]);
    assert_eq!(sorted_names(&m.path("d")), ["f0", "f1", "f2", "f3", "f4"]);
    m.unmount();
    volume.assert_clean();
}

/// A new small file's bytes are committed after its close returns; a commit that then
/// fails (a trigger refuses those bytes) is counted, logged, and reported: by the close if it
/// failed by then, and by the file's next fsync, which no close takes it from (another
/// descriptor of the file closed first, as a child that inherited it closes it at exec).
#[test]
fn a_new_files_bytes_that_fail_at_commit_after_close_are_reported_to_fsync() {
    use std::os::fd::IntoRawFd;
    let volume = Volume::format("early-data-fail");
    let log = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log.to_str().unwrap()]);
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_bytes BEFORE UPDATE OF inline_data ON inodes
             WHEN NEW.inline_data = CAST('refused' AS BLOB)
             BEGIN SELECT RAISE(ABORT, 'injected by the test'); END;",
    )
    .unwrap();
    let before = m.counter("async_dirops");
    let mut f = std::fs::File::create(m.path("f")).unwrap();
    f.write_all(b"refused").unwrap();
    let fd = f.into_raw_fd();
    // SAFETY: fd came from into_raw_fd above and is closed once, here.
    let close_reported = unsafe { libc::close(fd) } != 0;
    std::fs::write(m.path("g"), b"accepted").unwrap();
    // Both creates and both files' bytes were answered before their commits.
    assert_eq!(m.counter("async_dirops"), before + 4);
    let f = std::fs::File::open(m.path("f")).unwrap();
    // Waits for the commit (the open reads the file), so the failure is known by now.
    drop(f.try_clone().unwrap());
    let fsync_reported = f.sync_all().is_err();
    assert!(
        fsync_reported,
        "reported by close: {close_reported}, not by fsync; errors counted {}; the daemon's \
         log:\n{}",
        m.counter("async_dirop_errors"),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Taken by that fsync: neither the next one nor a close returns it again.
    f.sync_all().unwrap();
    let dup = f.try_clone().unwrap().into_raw_fd();
    // SAFETY: dup came from into_raw_fd above and is closed once, here.
    assert_eq!(
        unsafe { libc::close(dup) },
        0,
        "a close after the fsync failed"
    );
    drop(f);
    assert_eq!(m.counter("async_dirop_errors"), 1);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("committed after its close returned"),
        "{logged}"
    );
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"accepted");
    db.execute_batch("DROP TRIGGER refuse_bytes").unwrap();
    drop(db);
    m.unmount();
    volume.assert_clean();
}

/// An attribute change of a file the mount made and has not committed yet (the chmod and
/// utimes that tar and cp -a send after each create) is answered at once from the mount's
/// own state: it does not wait for the commits queued before it. One that then fails at its
/// commit is reported by the file's fsync, and the file has the volume's attributes again.
#[test]
fn an_attribute_change_of_an_uncommitted_file_is_answered_before_its_commit() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let volume = Volume::format("early-setattr");
    let log = volume.dir.path().join("daemon.log");
    let m = volume.mount(&["--log", log.to_str().unwrap()]);
    // The first create takes the range of inode numbers the others use (a commit).
    std::fs::write(m.path("warm"), b"w").unwrap();
    std::fs::File::open(m.path("warm"))
        .unwrap()
        .sync_all()
        .unwrap();
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_mode BEFORE UPDATE OF mode ON inodes WHEN NEW.mode & 4095 = 384
             BEGIN SELECT RAISE(ABORT, 'injected by the test'); END;",
    )
    .unwrap();
    let set_times = |name: &str, secs: i64| {
        let path = std::ffi::CString::new(m.path(name).as_os_str().as_bytes()).unwrap();
        let times = [libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        }; 2];
        // SAFETY: a NUL-terminated path and two timespecs, both alive for the call.
        unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) }
    };
    // Nothing commits while the test holds the volume's write lock (the committer waits,
    // retrying), so whatever is answered meanwhile was answered before its commit.
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = m.counter("async_dirops");
    std::fs::write(m.path("kept"), b"kept").unwrap();
    std::fs::set_permissions(m.path("kept"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(set_times("kept", 1_000_000_000), 0, "utimensat failed");
    std::fs::write(m.path("doomed"), b"doomed").unwrap();
    std::fs::set_permissions(m.path("doomed"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // tar's order, as root: the bytes, then chown (which looks for a capability to drop),
    // chmod and futimens on the open file (its bytes are queued before the new mtime).
    let mut tarred = std::fs::File::create(m.path("tarred")).unwrap();
    tarred.write_all(b"tarred").unwrap();
    std::os::unix::fs::fchown(&tarred, Some(1000), Some(1000)).unwrap();
    tarred
        .set_permissions(std::fs::Permissions::from_mode(0o604))
        .unwrap();
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    tarred.set_modified(mtime).unwrap();
    drop(tarred);
    // Three creates, their bytes, and six attribute changes.
    assert_eq!(m.counter("async_dirops"), before + 12, "not answered early");
    let kept = std::fs::symlink_metadata(m.path("kept")).unwrap();
    assert_eq!(kept.mode() & 0o7777, 0o640);
    assert_eq!(kept.mtime(), 1_000_000_000);
    assert_eq!(kept.len(), 4);
    let tarred = |m: &common::Mount| {
        let t = std::fs::symlink_metadata(m.path("tarred")).unwrap();
        (t.uid(), t.gid(), t.mode() & 0o7777, t.mtime(), t.len())
    };
    let tarred_wanted = (1000, 1000, 0o604, 2_000_000_000, 6);
    assert_eq!(tarred(&m), tarred_wanted);
    db.execute_batch("COMMIT").unwrap();
    let doomed = std::fs::File::open(m.path("doomed")).unwrap();
    // Another descriptor's close (a child that inherited it, at its exec) does not take the
    // error from the fsync (it did, in CI, when another test's spawn came at this point).
    drop(doomed.try_clone().unwrap());
    assert!(
        doomed.sync_all().is_err(),
        "the refused chmod went unreported"
    );
    doomed.sync_all().unwrap();
    drop(doomed);
    assert_eq!(m.counter("async_dirop_errors"), 1);
    let back = wait_until(Duration::from_secs(5), || {
        std::fs::symlink_metadata(m.path("doomed")).is_ok_and(|d| d.mode() & 0o7777 == 0o644)
    });
    assert!(back, "the refused mode is still shown");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains(": an attribute change, answered before its commit"),
        "{logged}"
    );
    db.execute_batch("DROP TRIGGER refuse_mode").unwrap();
    drop(db);
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    let kept = std::fs::symlink_metadata(m.path("kept")).unwrap();
    assert_eq!(
        (kept.mode() & 0o7777, kept.mtime(), kept.len()),
        (0o640, 1_000_000_000, 4)
    );
    assert_eq!(tarred(&m), tarred_wanted);
    assert_eq!(std::fs::read(m.path("tarred")).unwrap(), b"tarred");
    assert_eq!(std::fs::read(m.path("doomed")).unwrap(), b"doomed");
    m.unmount();
}

/// fio writes 4 KiB blocks at random into one stored file from two jobs, each fsync'ing
/// every 4 writes (every flush then stores slices, every 17th of a chunk compacts it, and
/// the last close compacts what is left), and checks crc32c of every block it wrote; after
/// a remount (nothing cached) the same blocks are checked again from the store, and fsck
/// finds nothing.
#[test]
fn fio_verify_of_fsynced_random_rewrites_reads_back_after_remount() {
    let volume = Volume::format("fio-slices");
    let m = volume.mount(&[]);
    std::fs::write(m.path("f"), content(4, 16 * MIB)).unwrap();
    let args = |m: &common::Mount, verify_only: bool| -> Vec<String> {
        let mut args = vec![
            "--name=slices".into(),
            format!("--filename={}", m.path("f").display()),
            "--ioengine=psync".into(),
            "--rw=randwrite".into(),
            "--bs=4k".into(),
            "--size=8M".into(),
            "--offset_increment=8M".into(),
            "--numjobs=2".into(),
            "--fsync=4".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--verify_state_save=0".into(),
            "--group_reporting".into(),
        ];
        if verify_only {
            args.push("--verify_only".into());
        }
        args
    };
    let report = common::fio(&args(&m, false));
    assert_eq!(report["jobs"][0]["error"], 0, "{report}");
    assert_eq!(
        report["jobs"][0]["read"]["io_bytes"].as_u64(),
        Some(16 * MIB as u64),
        "the verification read"
    );
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    let report = common::fio(&args(&m, true));
    assert_eq!(report["jobs"][0]["error"], 0, "{report}");
    assert_eq!(
        report["jobs"][0]["read"]["io_bytes"].as_u64(),
        Some(16 * MIB as u64),
        "the verification read after the remount"
    );
    m.unmount();
    volume.assert_clean();
}

/// Blocks released by overwrites are kept as spares and written over by the next flush
/// (`blocks_written_over`); a kill -9 while spares are kept leaves nothing for fsck once the
/// next mount has cleaned up after the dead session, and a clean unmount deletes them (fsck
/// finds no block that nothing refers to).
#[test]
fn released_blocks_are_written_over_and_a_kill_9_leaves_none_behind() {
    // On a tmpfs of its own: the reaper keeps spares after a sync of the database, which
    // on a disk busy with another test's writes (the kernel tree) waited over a minute.
    let tmpfs = common::Tmpfs::new("256M");
    let db = tmpfs.path.join("vol.db");
    common::volume::format_volume(&db, &tmpfs.path.join("data"));
    let mount = || common::Mount::start(db.to_str().unwrap(), &[]);
    let m = mount();
    let rewrite = |m: &common::Mount, i: usize| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(m.path("f"))
            .unwrap();
        std::io::Write::write_all(&mut &f, &content(i, 8 * MIB)).unwrap();
        f.sync_all().unwrap();
    };
    rewrite(&m, 1);
    // The second version releases the first one's blocks: kept once their release is
    // durable. (How many flushes a version takes, and so how many spares each uses and
    // leaves, depends on the timing of the kernel's requests: a loaded run took ten puts
    // for the eight chunks. The counts are therefore checked as some, not as eight.)
    rewrite(&m, 2);
    let spares_kept =
        |m: &common::Mount| wait_until(Duration::from_secs(30), || m.counter("spare_blocks") > 0);
    assert!(
        spares_kept(&m),
        "spares kept: {}",
        m.counter("spare_blocks")
    );
    rewrite(&m, 3);
    assert!(m.counter("blocks_written_over") > 0);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), content(3, 8 * MIB));
    assert!(spares_kept(&m));
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    drop(m);

    // The next mount deletes the dead session's spares with its other uncommitted blocks;
    // a clean unmount deletes its own: fsck finds no block that nothing refers to.
    let m = mount();
    assert_eq!(std::fs::read(m.path("f")).unwrap(), content(3, 8 * MIB));
    rewrite(&m, 4);
    assert!(spares_kept(&m));
    m.unmount();
    let fsck = lanefs(&["fsck", db.to_str().unwrap()]);
    let report = format!("{}{}", String::from_utf8_lossy(&fsck.stdout), stderr(&fsck));
    assert!(
        fsck.status.success() && report.contains("clean"),
        "{report}"
    );
}

/// A file fsync'd in small pieces gathers slices over its chunk; its last close compacts them
/// in the background (off the queue, after close returned): soon after, the chunk has no
/// slices in the database, and the file reads back the same, also after a remount.
#[test]
fn a_fragmented_files_last_close_compacts_it() {
    use std::os::unix::fs::FileExt;
    let volume = Volume::format("compact-close");
    let m = volume.mount(&[]);
    let mut want = content(5, 2 * MIB);
    std::fs::write(m.path("log"), &want).unwrap();
    let slices = |db: &rusqlite::Connection| -> i64 {
        db.query_row("SELECT count(*) FROM slices", [], |r| r.get(0))
            .unwrap()
    };
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path("log"))
            .unwrap();
        for i in 0..6u8 {
            let at = i as usize * 8192 + 100;
            f.write_all_at(&[i + 1; 8192], at as u64).unwrap();
            want[at..at + 8192].fill(i + 1);
            f.sync_all().unwrap();
        }
        assert_eq!(slices(&db), 6, "each fsync'd rewrite a slice");
    }
    assert!(
        wait_until(Duration::from_secs(10), || slices(&db) == 0),
        "the last close did not compact the file ({} slices left)",
        slices(&db)
    );
    drop(db);
    assert!(std::fs::read(m.path("log")).unwrap() == want);
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert!(std::fs::read(m.path("log")).unwrap() == want);
    m.unmount();
}

/// stress-ng's file-system stressors (the passthrough's sets: directories, links, renames,
/// xattrs, locks, fallocate, mmap, sync_file_range, hdd and io with verification) pass on a
/// volume, and leave it consistent (fsck clean).
#[test]
fn stress_ng_file_system_stressors_pass_on_a_volume() {
    let volume = Volume::format("stress");
    let m = volume.mount(&[]);
    common::stress_ng_file_system(&m.mountpoint);
    m.unmount();
    volume.assert_clean();
}

/// What a mount answered before its commit survives a kill -9 of its daemon: creates,
/// mkdir, symlink, small files' bytes, chmod of new files and unlinks, answered while the
/// test holds the database's write lock (so none of them committed), are in the session's
/// intent log, and the next mount applies them before it serves anything. A change that
/// committed before the kill is not applied again (the watermark): a new file's chmod,
/// committed and then changed by a synchronous chmod, keeps the later mode. The log is gone
/// after the replay and after a clean unmount, and fsck finds nothing to repair.
#[test]
fn changes_answered_before_their_commit_survive_a_kill_9() {
    use std::os::unix::fs::PermissionsExt;
    let volume = Volume::format("intent-log");
    let m = volume.mount(&[]);
    std::fs::write(m.path("doomed"), b"doomed").unwrap();
    // A new file's chmod is answered early and logged; its commit passes the watermark; the
    // chmod after it is synchronous (the file has committed) and is not in the log.
    std::fs::write(m.path("moded"), b"moded").unwrap();
    std::fs::set_permissions(m.path("moded"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::File::open(m.path("")).unwrap().sync_all().unwrap();
    std::fs::set_permissions(m.path("moded"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let logs = |dir: &Path| -> Vec<String> {
        match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    };
    assert_eq!(
        logs(&volume.intent_dir()).len(),
        1,
        "the mount keeps one log"
    );

    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    for i in 0..40 {
        std::fs::write(m.path(&format!("dir/f{i}")), format!("file {i}\n")).unwrap();
    }
    std::fs::set_permissions(m.path("dir/f3"), std::fs::Permissions::from_mode(0o604)).unwrap();
    std::os::unix::fs::symlink("f1", m.path("dir/link")).unwrap();
    std::fs::create_dir(m.path("dir/sub")).unwrap();
    std::fs::write(m.path("dir/sub/deep"), b"deep").unwrap();
    std::fs::remove_file(m.path("dir/f9")).unwrap();
    std::fs::remove_file(m.path("doomed")).unwrap();
    common::kill_9_and_wait(m.pid);
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    drop(m);
    let status = String::from_utf8_lossy(&lanefs(&["status", volume.source()]).stdout).into_owned();
    assert!(
        status.contains("intent log") && status.contains("changes a crashed mount answered"),
        "status names the log waiting for its replay: {status}"
    );
    let (clean, out) = volume.fsck(false);
    assert!(
        clean && out.contains("fsck: note:") && out.contains("changes a crashed mount answered"),
        "fsck names the log waiting for its replay and finds the database itself clean: {out}"
    );

    let m = volume.mount(&[]);
    let mut names: Vec<String> = std::fs::read_dir(m.path("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = (0..40)
        .filter(|&i| i != 9)
        .map(|i| format!("f{i}"))
        .chain(["link".into(), "sub".into()])
        .collect();
    expected.sort();
    assert_eq!(names, expected, "the names answered before the kill");
    for i in (0..40).filter(|&i| i != 9) {
        assert_eq!(
            std::fs::read_to_string(m.path(&format!("dir/f{i}"))).unwrap(),
            format!("file {i}\n")
        );
    }
    let mode = |p: &str| std::fs::metadata(m.path(p)).unwrap().mode() & 0o7777;
    assert_eq!(
        mode("dir/f3"),
        0o604,
        "a new file's chmod answered before the kill"
    );
    assert_eq!(
        std::fs::read_link(m.path("dir/link")).unwrap(),
        Path::new("f1")
    );
    assert_eq!(std::fs::read(m.path("dir/sub/deep")).unwrap(), b"deep");
    assert!(
        !m.path("doomed").exists(),
        "an unlink answered before the kill"
    );
    assert_eq!(mode("moded"), 0o640, "a committed change was applied again");
    assert_eq!(
        logs(&volume.intent_dir()).len(),
        1,
        "the dead mount's log is gone after its replay, the new mount's is there"
    );
    m.unmount();
    assert_eq!(
        logs(&volume.intent_dir()),
        Vec::<String>::new(),
        "a clean unmount leaves no log"
    );
    volume.assert_clean();
}

/// A replay applies only logs the volume recorded, in a directory only the mounting user may
/// write to: a log planted beside the database (a setuid file's create) is left alone, and a
/// log directory others may write to stops the mount with one sentence.
#[test]
fn a_planted_intent_log_is_never_applied() {
    use std::os::unix::fs::PermissionsExt;
    let volume = Volume::format("intent-planted");
    volume.mount(&[]).unmount();
    let dir = volume.intent_dir();
    {
        let planted = lanefs_volume::intent::IntentLog::create(&dir, 999_999).unwrap();
        let node = lanefs_volume::meta::NewNode {
            ino: Some(1 << 40),
            parent: lanefs_volume::meta::ROOT_INO,
            name: b"planted".to_vec(),
            mode: libc::S_IFREG | 0o4755,
            ..Default::default()
        };
        planted.append(lanefs_volume::intent::record_of_create(&node), |_| {});
    }
    let m = volume.mount(&[]);
    assert!(!m.path("planted").exists(), "a planted log was applied");
    m.unmount();
    assert!(
        dir.join("999999.log").exists(),
        "a log not this volume's was removed"
    );

    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = lanefs(&["mount", volume.source(), "/nonexistent-mountpoint"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only it may write to"),
        "a log directory others may write to: {}",
        stderr(&out)
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    volume.mount(&[]).unmount();
    volume.assert_clean();
}

/// A mount whose intent log cannot be made (its disk is full) still mounts, and answers
/// every change after its commit instead of before (an early answer without its record
/// would be lost with the daemon); what it made is there after a remount.
#[test]
fn a_mount_without_room_for_its_intent_log_answers_after_commits() {
    let tmpfs = common::Tmpfs::new("1M");
    let volume = Volume::format("no-intent-room");
    let intent_dir = tmpfs.path.join("intent");
    let m = volume.mount(&["--intent-dir", intent_dir.to_str().unwrap()]);
    for i in 0..20 {
        std::fs::write(m.path(&format!("f{i}")), format!("{i}")).unwrap();
    }
    std::fs::create_dir(m.path("d")).unwrap();
    assert_eq!(
        m.counter("async_dirops"),
        0,
        "changes answered early without a log"
    );
    m.unmount();
    let m = volume.mount(&[]);
    assert_eq!(std::fs::read_to_string(m.path("f19")).unwrap(), "19");
    assert!(m.path("d").is_dir());
    // With room for its log, the same volume answers early again.
    std::fs::write(m.path("g"), "g").unwrap();
    assert!(m.counter("async_dirops") > 0);
    m.unmount();
    volume.assert_clean();
}

/// Changes answered before their commit wake the commit thread once per gathering, not
/// once each: before, every create and every small file's bytes woke the thread (a futex
/// wake and two context switches) while it was gathering, for nothing; an untar's daemon
/// spent a quarter of its CPU there.
#[test]
fn early_changes_wake_the_commit_thread_once_per_batch() {
    let volume = Volume::format("wakes");
    let m = volume.mount(&[]);
    std::fs::create_dir(m.path("d")).unwrap();
    let (early, batches, wakes) = (
        m.counter("async_dirops"),
        m.counter("commit_batches"),
        m.counter("commit_wakes"),
    );
    for i in 0..1000 {
        std::fs::write(m.path(&format!("d/f{i}")), b"small").unwrap();
    }
    std::fs::File::open(m.path("d"))
        .unwrap()
        .sync_all()
        .unwrap();
    let early = m.counter("async_dirops") - early;
    let batches = m.counter("commit_batches") - batches;
    let wakes = m.counter("commit_wakes") - wakes;
    eprintln!("{early} changes answered early, {batches} batches, {wakes} wakes");
    assert!(early >= 1000, "the creates were answered early ({early})");
    // A wake that finds the queue already taken by a caller's own commit runs no batch;
    // a few such (the fsync, a heartbeat) are all there may be.
    assert!(
        wakes <= batches + batches / 10 + 10,
        "{wakes} wakes of the commit thread for {batches} batches of {early} early changes"
    );
    m.unmount();
    volume.assert_clean();
}

/// Two writers to one file past its 64 MiB of unflushed bytes: the writes that pass the
/// limit wait for a flush (`flush_waits`), a writer that waited while the other's flush ran
/// does not flush again unless the file is still past it (the unit test
/// `a_writer_past_the_limit_flushes_only_while_the_file_is_still_past_it` checks that
/// rule), and every byte of both is there after a remount.
#[test]
fn two_writers_past_the_dirty_limit_keep_every_byte() {
    use std::os::unix::fs::FileExt;
    let volume = Volume::format("overlimit");
    let m = volume.mount(&[]);
    let waits = m.counter("flush_waits");
    let file = std::sync::Arc::new(std::fs::File::create(m.path("shared")).unwrap());
    const MIB: usize = 1 << 20;
    const EACH: usize = 48;
    let block = |writer: usize, i: usize| vec![(writer * EACH + i) as u8 ^ 0x5a; MIB];
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let file = file.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let at = ((writer * EACH + i) * MIB) as u64;
                    file.write_all_at(&block(writer, i), at).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    drop(file);
    let waits = m.counter("flush_waits") - waits;
    assert!(waits >= 1, "96 MiB written with no flush waited for");
    m.unmount();
    let m = volume.mount(&[]);
    let got = std::fs::read(m.path("shared")).unwrap();
    assert_eq!(got.len(), 2 * EACH * MIB);
    for writer in 0..2 {
        for i in 0..EACH {
            let at = (writer * EACH + i) * MIB;
            assert!(
                got[at..at + MIB] == block(writer, i)[..],
                "MiB {} differs after the remount",
                writer * EACH + i
            );
        }
    }
    m.unmount();
    volume.assert_clean();
}

/// A read that moves a file's atime (relatime: atime not after mtime) is answered before the
/// atime's commit: it does not wait while the test holds the database's write lock (the old
/// code committed first and waited out the busy retries, ~6 s), and a stat right after it
/// sees the new atime. Once the lock is let go the atime is committed (seen after a
/// remount); an explicit atime set after a read wins over the read's; and an fsync after a
/// read makes that read's atime survive a kill -9.
#[test]
fn reads_move_atime_without_waiting_for_its_commit() {
    use common::sys;
    let volume = Volume::format("atime-early");
    let m = volume.mount(&["-o", "attr_timeout=0"]);
    let (past, mtime) = (1_000_000_000, 1_500_000_000);
    for name in ["locked", "explicit", "fsynced"] {
        std::fs::write(m.path(name), name).unwrap();
        sys::utimens(&m.path(name), sys::ts(past, 0), sys::ts(mtime, 0), 0).unwrap();
    }
    std::fs::File::open(m.path("locked"))
        .unwrap()
        .sync_all()
        .unwrap();
    let atime = |p: &Path| sys::stat(p).unwrap().st_atime;

    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let read = {
        let path = m.path("locked");
        std::thread::spawn(move || std::fs::read(path).unwrap())
    };
    let answered = wait_until(Duration::from_secs(3), || read.is_finished());
    let seen = atime(&m.path("locked"));
    db.execute_batch("COMMIT").unwrap();
    assert!(answered, "a read waited for its atime's commit");
    assert_eq!(read.join().unwrap(), b"locked");
    assert!(seen > mtime, "the stat after the read saw atime {seen}");

    std::fs::read(m.path("explicit")).unwrap();
    assert!(atime(&m.path("explicit")) > mtime);
    sys::utimens(
        &m.path("explicit"),
        sys::ts(1_200_000_000, 0),
        sys::ts(mtime, 0),
        0,
    )
    .unwrap();
    assert_eq!(atime(&m.path("explicit")), 1_200_000_000);
    m.unmount();

    let m = volume.mount(&["-o", "attr_timeout=0"]);
    assert!(
        atime(&m.path("locked")) > mtime,
        "the read's atime was not committed"
    );
    assert_eq!(
        atime(&m.path("explicit")),
        1_200_000_000,
        "the read's atime was committed after the explicit one"
    );
    let file = std::fs::File::open(m.path("fsynced")).unwrap();
    std::io::Read::read_to_end(&mut &file, &mut Vec::new()).unwrap();
    file.sync_all().unwrap();
    drop(file);
    common::kill_9_and_wait(m.pid);
    drop(m);
    let m = volume.mount(&[]);
    assert!(
        atime(&m.path("fsynced")) > mtime,
        "an fsync after a read did not make its atime durable"
    );
    m.unmount();
    volume.assert_clean();
}

/// READDIRPLUS tells the kernel its entries' attributes, which it takes as the files' own
/// (with no validity of their own it still sets the size from them). A listing read in
/// several requests must not undo what changed while it was open: a file written and
/// closed must keep its new size and bytes, and a file read must keep the atime the read
/// gave it, also once that atime is committed and no longer kept in memory (two commits
/// later). (Each getdents64 below holds one entry: each is one READDIR request, whose
/// entries the kernel all takes.)
#[test]
fn a_listing_does_not_undo_what_changed_while_it_was_open() {
    use common::sys;
    use std::os::fd::AsRawFd;
    let volume = Volume::format("listing-changes");
    let m = volume.mount(&[]);
    sys::mkdir(&m.path("d"), 0o755).unwrap();
    let (past, mtime) = (1_000_000_000, 1_500_000_000);
    for name in ["a", "b", "c"] {
        let path = m.path("d").join(name);
        std::fs::write(&path, name).unwrap();
        // atime before mtime: relatime moves it at the next read.
        sys::utimens(&path, sys::ts(past, 0), sys::ts(mtime, 0), 0).unwrap();
    }
    m.unmount();

    let m = volume.mount(&[]);
    let [a, b, c] = ["a", "b", "c"].map(|name| m.path("d").join(name));
    let dir = sys::open(&m.path("d"), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    let getdents_one = || {
        let mut buf = [0u8; 32];
        // SAFETY: buf is writable for its length; the kernel writes at most that.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        assert!(n > 0, "getdents64: {n} ({})", sys::Errno::last().name());
    };
    // The listing is read here: "b" with atime `past`, "c" one byte long.
    getdents_one();
    // Two atime commits, b's then a's (a read moves atime, fsync commits it), and c
    // rewritten longer.
    for path in [&b, &a] {
        let file = std::fs::File::open(path).unwrap();
        std::io::Read::read_to_end(&mut &file, &mut Vec::new()).unwrap();
        file.sync_all().unwrap();
    }
    let rewritten = b"c, rewritten while the listing was open".to_vec();
    std::fs::write(&c, &rewritten).unwrap();
    let atime = |p: &Path| sys::stat(p).unwrap().st_atime;
    let moved = atime(&b);
    assert!(
        moved > mtime,
        "the read of b did not move its atime: {moved}"
    );
    // The rest of the listing: "..", then "a", "b" and "c" as READDIRPLUS entries.
    getdents_one();
    getdents_one();
    assert_eq!(
        sys::stat(&c).unwrap().st_size as usize,
        rewritten.len(),
        "c's size went back after the listing went on"
    );
    assert_eq!(std::fs::read(&c).unwrap(), rewritten);
    assert_eq!(
        atime(&b),
        moved,
        "b's atime went back after the listing went on"
    );
    drop(dir);
    m.unmount();
    volume.assert_clean();
}

/// `cp -a` onto a volume sends, after each create, the file's owner and times and its access
/// ACL, which for a file with none says only its mode: all of it is answered before its
/// commit (nothing waits while the test holds the database's write lock), and lands as
/// `cp -a` meant: the modes and times of the source, and no ACL xattr. A file with a real
/// ACL carries it over once the lock is let go.
#[test]
fn cp_a_of_files_without_acls_waits_for_no_commit() {
    use std::os::unix::fs::PermissionsExt;
    let volume = Volume::format("cp-a-acl");
    let m = volume.mount(&[]);
    std::fs::write(m.path("warm"), b"w").unwrap();
    std::fs::File::open(m.path("warm"))
        .unwrap()
        .sync_all()
        .unwrap();
    let src = TempDir::new("cp-a-src");
    let tree = src.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..20u32 {
        let f = tree.join(format!("f{i}"));
        std::fs::write(&f, format!("file {i}")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600 | (i % 8) << 3))
            .unwrap();
    }
    let db = rusqlite::Connection::open(&volume.db).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = m.counter("async_dirops");
    let copy = {
        let (from, to) = (tree.clone(), m.path("t"));
        std::thread::spawn(move || {
            Command::new("cp")
                .arg("-a")
                .arg(from)
                .arg(to)
                .status()
                .is_ok_and(|s| s.success())
        })
    };
    let copied = wait_until(Duration::from_secs(20), || copy.is_finished());
    // What cp sends, directly: a minimal ACL on a new file, and the removal of a new
    // directory's default ACL, which it does not have.
    let direct = m.path("direct");
    std::fs::write(&direct, b"d").unwrap();
    let mut minimal = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(1u16, 6u16), (4, 4), (0x20, 0)] {
        minimal.extend_from_slice(&tag.to_le_bytes());
        minimal.extend_from_slice(&perm.to_le_bytes());
        minimal.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    let hex: String = minimal.iter().map(|b| format!("{b:02x}")).collect();
    let early_before = m.counter("async_dirops");
    let set = Command::new("setfattr")
        .args(["-n", "system.posix_acl_access", "-v"])
        .arg(format!("0x{hex}"))
        .arg(&direct)
        .status()
        .unwrap();
    std::fs::create_dir(m.path("direct-dir")).unwrap();
    let removed = Command::new("setfattr")
        .args(["-x", "system.posix_acl_default"])
        .arg(m.path("direct-dir"))
        .output()
        .unwrap();
    let early_after = m.counter("async_dirops");
    db.execute_batch("COMMIT").unwrap();
    assert!(
        copied,
        "cp -a waited for a commit while the database was locked"
    );
    assert!(copy.join().unwrap(), "cp -a failed");
    assert!(set.success(), "setting a minimal ACL failed");
    assert!(
        String::from_utf8_lossy(&removed.stderr).contains("No such attribute"),
        "removing an absent default ACL: {removed:?}"
    );
    // The mkdir, and the ACL set as a chmod.
    assert!(
        early_after >= early_before + 2,
        "answered early: {}",
        early_after - early_before
    );
    assert_eq!(
        std::fs::metadata(&direct).unwrap().mode() & 0o777,
        0o640,
        "the minimal ACL's mode"
    );
    // Everything committed before the rows are counted.
    std::fs::File::open(&direct).unwrap().sync_all().unwrap();
    // The directory, 20 files with their bytes, and each one's times and ACL.
    assert!(
        m.counter("async_dirops") >= before + 1 + 20 * 4,
        "answered early: {}",
        m.counter("async_dirops") - before
    );
    let acl_rows: i64 = db
        .query_row(
            "SELECT count(*) FROM xattrs WHERE name LIKE 'system.posix_acl%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(acl_rows, 0, "a minimal ACL was stored as an xattr");
    let (native, mounted) = (
        common::tree_snapshot(&tree),
        common::tree_snapshot(&m.path("t")),
    );
    assert_eq!(native, mounted);
    for i in 0..20u32 {
        let a = std::fs::metadata(tree.join(format!("f{i}"))).unwrap();
        let b = std::fs::metadata(m.path(&format!("t/f{i}"))).unwrap();
        assert_eq!(
            (a.mode(), a.mtime(), a.mtime_nsec()),
            (b.mode(), b.mtime(), b.mtime_nsec())
        );
    }
    run_ok(
        Command::new("setfacl")
            .args(["-m", "u:65534:r"])
            .arg(tree.join("f1")),
    );
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(tree.join("f1"))
            .arg(m.path("with-acl")),
    );
    let acl = run_ok(
        Command::new("getfacl")
            .args(["-c", "-p"])
            .arg(m.path("with-acl")),
    );
    assert!(acl.contains("user:nobody:r--"), "{acl}");
    std::fs::File::open(m.path("with-acl"))
        .unwrap()
        .sync_all()
        .unwrap();
    let acl_rows: i64 = db
        .query_row(
            "SELECT count(*) FROM xattrs WHERE name LIKE 'system.posix_acl%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(acl_rows, 1, "the copied ACL's row");
    drop(db);
    m.unmount();
    volume.assert_clean();
}

/// Threads making, renaming and removing trees of their own and sharing one directory, all
/// with changes answered before their commit: every step sees its own result, and what is
/// left is exactly what the threads left, in the overlay and in the database after a remount.
#[test]
fn trees_made_renamed_and_removed_by_many_threads_under_early_answers() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 12;
    let volume = Volume::format("early-load");
    let m = volume.mount(&[]);
    std::fs::create_dir(m.path("shared")).unwrap();
    let workers: Vec<_> = (0..THREADS)
        .map(|k| {
            let root = m.mountpoint.clone();
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let tree = root.join(format!("t{k}"));
                    std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
                    for i in 0..15 {
                        std::fs::write(tree.join(format!("a/b/f{i}")), format!("{k}.{round}.{i}"))
                            .unwrap();
                    }
                    assert_eq!(std::fs::read_dir(tree.join("a/b")).unwrap().count(), 16);
                    let moved = root.join(format!("r{k}"));
                    std::fs::rename(&tree, &moved).unwrap();
                    assert_eq!(
                        std::fs::read_to_string(moved.join("a/b/f3")).unwrap(),
                        format!("{k}.{round}.3")
                    );
                    std::fs::remove_dir_all(&moved).unwrap();
                    assert!(!moved.exists());
                    // The shared directory: each round leaves one name per thread behind.
                    let shared = root.join("shared");
                    std::fs::write(shared.join(format!("{k}-{round}")), b"kept").unwrap();
                    std::fs::write(shared.join(format!("{k}-gone")), b"x").unwrap();
                    std::fs::remove_file(shared.join(format!("{k}-gone"))).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let listed = |root: &Path| sorted_names(&root.join("shared"));
    let mut want: Vec<String> = (0..THREADS)
        .flat_map(|k| (0..ROUNDS).map(move |r| format!("{k}-{r}")))
        .collect();
    want.sort();
    assert_eq!(listed(&m.mountpoint), want);
    assert_eq!(std::fs::read_dir(&m.mountpoint).unwrap().count(), 1);
    assert!(m.counter("async_dirops") > (THREADS * ROUNDS * 20) as u64);
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert_eq!(listed(&m.mountpoint), want);
    m.unmount();
}

/// Trees made and removed with changes answered before their commit: each step sees the
/// last one's result at once (link counts, listings, names reused), and the database has
/// it all after a remount; `--no-async-dirops` answers none early.
#[test]
fn trees_made_and_removed_with_early_answers_read_back_exactly() {
    let volume = Volume::format("early-trees");
    let m = volume.mount(&[]);
    let before = m.counter("async_dirops");
    std::fs::create_dir_all(m.path("a/b/c/d")).unwrap();
    assert_eq!(std::fs::metadata(m.path("a/b")).unwrap().nlink(), 3);
    for i in 0..200 {
        std::fs::write(m.path(&format!("a/b/f{i}")), format!("{i}")).unwrap();
    }
    std::os::unix::fs::symlink("f7", m.path("a/b/link")).unwrap();
    assert_eq!(
        std::fs::read_link(m.path("a/b/link")).unwrap(),
        Path::new("f7")
    );
    assert_eq!(std::fs::read_dir(m.path("a/b")).unwrap().count(), 202);
    for i in (0..200).step_by(2) {
        std::fs::remove_file(m.path(&format!("a/b/f{i}"))).unwrap();
        // The name is free again at once, for a new inode.
        std::fs::write(m.path(&format!("a/b/f{i}")), b"again").unwrap();
    }
    std::fs::remove_dir(m.path("a/b/c/d")).unwrap();
    assert_eq!(std::fs::metadata(m.path("a/b/c")).unwrap().nlink(), 2);
    assert_eq!(
        std::fs::remove_dir(m.path("a/b"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    std::fs::rename(m.path("a/b"), m.path("moved")).unwrap();
    std::fs::create_dir(m.path("a/b")).unwrap();
    let early = m.counter("async_dirops") - before;
    assert!(early >= 400, "only {early} changes answered early");
    m.unmount();
    volume.assert_clean();
    let m = volume.mount(&["--no-async-dirops"]);
    for i in 0..200 {
        let want = if i % 2 == 0 {
            "again".to_string()
        } else {
            i.to_string()
        };
        assert_eq!(
            std::fs::read_to_string(m.path(&format!("moved/f{i}"))).unwrap(),
            want
        );
    }
    assert!(m.path("moved/c").is_dir() && !m.path("moved/c/d").exists());
    assert!(m.path("a/b").is_dir());
    std::fs::remove_dir_all(m.path("moved")).unwrap();
    assert_eq!(m.counter("async_dirops"), 0);
    m.unmount();
    volume.assert_clean();
}

/// A listing read while a closed file's bytes commit must not carry the attributes from
/// before the commit: the kernel takes a listing's attributes (READDIRPLUS) as the file's,
/// and a size of 0 there made the file read back empty (found by the POSIX suite on
/// PostgreSQL). Each close is followed by a listing after a varying pause, so that some
/// listings meet the commit of what the close queued.
fn listings_race_the_commit_of_closed_files(volume: &Volume) {
    let m = volume.mount(&[]);
    let dirs = 16;
    for d in 0..dirs {
        std::fs::create_dir(m.path(&format!("d{d}"))).unwrap();
    }
    // The directories themselves committed: their listings read the database.
    std::fs::File::open(m.path("d0"))
        .unwrap()
        .sync_all()
        .unwrap();
    let bytes = vec![7u8; 10_000];
    let mut wrong = Vec::new();
    for i in 0..1200 {
        let dir = m.path(&format!("d{}", i % dirs));
        let file = dir.join(format!("f{i}"));
        std::fs::write(&file, &bytes).unwrap();
        std::thread::sleep(Duration::from_micros((i as u64 * 37) % 900));
        let listed = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(listed, i / dirs + 1);
        let size = std::fs::metadata(&file).unwrap().len();
        if size != bytes.len() as u64 {
            wrong.push((i, size));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} files showed a wrong size after a listing (file, size): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    m.unmount();
    volume.assert_clean();
}

#[test]
fn a_listing_racing_the_commit_of_a_closed_file_shows_its_size() {
    listings_race_the_commit_of_closed_files(&Volume::format("listing-race"));
}

#[test]
fn dump_and_load_round_trip_is_identical() {
    let src = TempDir::new("vol-dump-src");
    let tree = src.path().join("tree");
    make_tree(&tree, 150);
    let volume = Volume::format("dump");
    let m = volume.mount(&[]);
    run_ok(Command::new("cp").arg("-a").arg(&tree).arg(&m.mountpoint));
    run_ok(
        Command::new("setfattr")
            .args(["-n", "user.note", "-v", "kept"])
            .arg(m.path("tree/hard-f2")),
    );
    // A file with a slice over its chunk (a small rewrite, fsync'd).
    let mut sliced = content(9, MIB + 500);
    std::fs::write(m.path("sliced"), &sliced).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path("sliced"))
            .unwrap();
        f.write_all_at(b"rewritten", 1000).unwrap();
        f.sync_all().unwrap();
    }
    sliced[1000..1009].copy_from_slice(b"rewritten");
    m.unmount();
    let (copy_volume, dump) = dump_and_load(&volume, "vol-dump-unused");
    assert!(
        String::from_utf8_lossy(&dump).contains("\"slices\":{\"columns\""),
        "the dump has no slices"
    );
    copy_volume.assert_clean();
    let m = copy_volume.mount(&[]);
    diff_r(&tree, &m.path("tree"));
    assert!(std::fs::read(m.path("sliced")).unwrap() == sliced);
    let note = run_ok(
        Command::new("getfattr")
            .args(["--only-values", "-n", "user.note"])
            .arg(m.path("tree/hard-f2")),
    );
    assert_eq!(note, "kept");
    m.unmount();
    // Refused: an existing file, and input that is not a dump.
    let out = load(&copy_volume.db, &dump);
    assert!(stderr(&out).contains("exists"), "{}", stderr(&out));
    let out = load(&volume.dir.path().join("other.db"), b"{\"x\": 1}");
    assert!(
        stderr(&out).contains("not a lanefs volume dump"),
        "{}",
        stderr(&out)
    );
    assert!(!volume.dir.path().join("other.db").exists());
    // The copy took the data directory over: the dumped volume is refused there, and so is
    // a second load of the same dump.
    let out = lanefs(&["fsck", volume.source()]);
    assert!(
        stderr(&out).contains("belongs to another volume"),
        "{}",
        stderr(&out)
    );
    let out = load(&volume.dir.path().join("again.db"), &dump);
    assert!(
        stderr(&out).contains("belongs to another volume now"),
        "{}",
        stderr(&out)
    );
    assert!(!volume.dir.path().join("again.db").exists());
    // A dump of format 3 (before slices) loads: it has no slices table.
    let fresh = Volume::format("dump-3");
    let out = lanefs(&["dump", fresh.source()]);
    let mut old: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let doc = old.as_object_mut().unwrap();
    doc.remove("slices");
    doc.insert("lanefs_volume_dump".into(), 3.into());
    let out = load(
        &fresh.dir.path().join("from-3.db"),
        &serde_json::to_vec(&old).unwrap(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A loaded volume takes its data location over, so that two volume files never use one:
/// each deletes the blocks it releases and gc the blocks it does not know, and both numbered
/// new blocks from the same session counter, so a write through one overwrote the other's
/// blocks. The copy numbers its sessions past every session that stored a block there, the
/// dumped volume's later ones too; a load while the dumped volume is mounted is refused.
#[test]
fn a_loaded_volume_takes_its_data_location_over() {
    let volume = Volume::format("takeover");
    let m = volume.mount(&[]);
    std::fs::write(m.path("before"), content(1, 2 * MIB)).unwrap();
    m.unmount();
    let dump = lanefs(&["dump", volume.source()]);
    assert!(dump.status.success(), "{}", stderr(&dump));
    // The dumped volume goes on after the dump: sessions whose blocks the dump never saw.
    let m = volume.mount(&[]);
    std::fs::write(m.path("after"), content(2, 2 * MIB)).unwrap();
    let copy = volume.dir.path().join("copy.db");
    let out = load(&copy, &dump.stdout);
    assert!(
        !out.status.success() && stderr(&out).contains("in use by another volume file"),
        "{}",
        stderr(&out)
    );
    assert!(!copy.exists());
    m.unmount();
    let blocks_before: std::collections::BTreeSet<PathBuf> = walk_files(&volume.data);
    let out = load(&copy, &dump.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    let copy = Volume {
        pg: None,
        dir: TempDir::new("vol-takeover-copy"),
        db: copy,
        data: volume.data.clone(),
    };
    let m = copy.mount(&[]);
    assert_eq!(
        std::fs::read(m.path("before")).unwrap(),
        content(1, 2 * MIB)
    );
    std::fs::write(m.path("new"), content(3, 2 * MIB)).unwrap();
    m.unmount();
    // Its blocks are of sessions of its own (blocks/SESSION/XX/ID), none of the dumped
    // volume's: it wrote over none of their blocks.
    let session_of = |p: &Path| {
        p.strip_prefix(volume.data.join("blocks"))
            .ok()
            .and_then(|rel| rel.components().next())
            .map(|c| c.as_os_str().to_owned())
    };
    let old_sessions: std::collections::BTreeSet<_> =
        blocks_before.iter().filter_map(|p| session_of(p)).collect();
    let new_sessions: std::collections::BTreeSet<_> = walk_files(&volume.data)
        .iter()
        .filter(|p| !blocks_before.contains(*p))
        .filter_map(|p| session_of(p))
        .collect();
    assert!(old_sessions.len() >= 2, "{old_sessions:?}");
    assert!(!new_sessions.is_empty());
    assert!(
        new_sessions.is_disjoint(&old_sessions),
        "the copy wrote blocks of the dumped volume's sessions: {new_sessions:?}"
    );
    let out = lanefs(&["fsck", volume.source()]);
    assert!(
        stderr(&out).contains("belongs to another volume"),
        "{}",
        stderr(&out)
    );
    // The blocks of what the dumped volume wrote after the dump are no file's in the copy:
    // gc's to delete, as in any restore.
    copy.assert_clean_after_gc();
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> std::collections::BTreeSet<PathBuf> {
    let mut files = std::collections::BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        match std::fs::read_dir(&path) {
            Ok(entries) => stack.extend(entries.map(|e| e.unwrap().path())),
            Err(_) => {
                files.insert(path);
            }
        }
    }
    files
}

#[test]
fn format_force_checks_everything_before_deleting_the_old_volume() {
    let volume = Volume::format("reformat");
    let m = volume.mount(&[]);
    std::fs::write(m.path("kept"), b"still here").unwrap();
    m.unmount();
    // A data directory that is not ours: refused, and the old volume is untouched.
    let other = TempDir::new("vol-reformat-other");
    std::fs::write(other.path().join("precious"), b"not a block").unwrap();
    let out = lanefs(&[
        "format",
        volume.source(),
        "--data",
        other.path().to_str().unwrap(),
        "--force",
    ]);
    assert!(!out.status.success(), "format --force replaced the volume");
    assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(other.path().join("precious")).unwrap(),
        b"not a block"
    );
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"still here");
}

#[test]
fn two_volume_files_sharing_a_data_directory_are_not_mounted_at_once() {
    let volume = Volume::format("shared-data");
    // A copy of the volume file (cp; a load takes the data directory over instead) names
    // the same data directory.
    let copy = volume.dir.path().join("copy.db");
    std::fs::copy(&volume.db, &copy).unwrap();
    let m = volume.mount(&[]);
    std::fs::write(m.path("big"), content(9, 2 * MIB)).unwrap();
    let other = TempDir::new("vol-shared-data-mp");
    // Should the second mount go ahead after all, it goes at the end of the test.
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            if is_mounted(self.0) {
                let _ = Command::new(common::lanefs())
                    .arg("umount")
                    .arg(self.0)
                    .status();
            }
        }
    }
    let _guard = Unmount(other.path());
    for args in [
        vec![
            "mount",
            "--daemon",
            copy.to_str().unwrap(),
            other.path().to_str().unwrap(),
        ],
        vec!["fsck", copy.to_str().unwrap()],
        vec!["gc", copy.to_str().unwrap()],
    ] {
        let out = lanefs(&args);
        assert!(!out.status.success(), "{args:?} went ahead");
        assert!(
            stderr(&out).contains("is in use by another volume file"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!is_mounted(other.path()));
    assert_eq!(std::fs::read(m.path("big")).unwrap(), content(9, 2 * MIB));
    m.unmount();
    volume.assert_clean();
}

/// A dump that does not make a consistent volume with its data location is refused before
/// anything is taken over: the dumped volume stays usable, and no file is left behind.
/// Before, a table whose rows went missing loaded empty (its blocks then the first gc's to
/// delete), a name given as text loaded as a name never found, and an entry naming no inode
/// or a chunk naming a deleted block loaded as they were; each took the data location over.
#[test]
fn a_damaged_dump_is_refused_and_the_dumped_volume_stays_usable() {
    let volume = Volume::format("damaged-dump");
    let m = volume.mount(&[]);
    std::fs::write(m.path("big"), content(3, 2 * MIB)).unwrap();
    std::fs::write(m.path("small"), b"small").unwrap();
    m.unmount();
    let out = lanefs(&["dump", volume.source()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let column = |table: &str, name: &str| {
        dump[table]["columns"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c == name)
            .unwrap()
    };
    let (entry_name, entry_ino) = (column("entries", "name"), column("entries", "ino"));
    let chunk_block = column("chunks", "block");
    let size = column("inodes", "size");
    type Damage = Box<dyn Fn(&mut serde_json::Value)>;
    let damages: Vec<(&str, Damage, &str)> = vec![
        (
            "chunks without rows",
            Box::new(|d| {
                d["chunks"].as_object_mut().unwrap().remove("rows");
            }),
            "table chunks has no list of rows",
        ),
        (
            "a name as text",
            Box::new(move |d| d["entries"]["rows"][0][entry_name] = "big".into()),
            "entries.name holds \"big\", not a byte string",
        ),
        (
            "a size that is not an integer",
            Box::new(move |d| d["inodes"]["rows"][1][size] = 1.5.into()),
            "inodes.size holds 1.5, not a 64-bit integer",
        ),
        (
            "a short row",
            Box::new(|d| {
                d["inodes"]["rows"][0].as_array_mut().unwrap().pop();
            }),
            "values for",
        ),
        (
            "an entry naming no inode",
            Box::new(move |d| d["entries"]["rows"][0][entry_ino] = 999_999.into()),
            "does not make a consistent volume",
        ),
        (
            "a chunk naming a block that is gone",
            Box::new(move |d| d["chunks"]["rows"][0][chunk_block] = 12_345.into()),
            "is missing from the data directory",
        ),
    ];
    for (what, damage, expected) in damages {
        let mut doc = dump.clone();
        damage(&mut doc);
        let target = volume.dir.path().join("damaged.db");
        let out = load(&target, &serde_json::to_vec(&doc).unwrap());
        assert!(!out.status.success(), "{what}: loaded");
        assert!(stderr(&out).contains(expected), "{what}: {}", stderr(&out));
        for suffix in ["", "-wal", "-shm"] {
            let left = volume.dir.path().join(format!("damaged.db{suffix}"));
            assert!(!left.exists(), "{what}: {} left behind", left.display());
        }
    }
    // Nothing was taken over: the dumped volume is clean and reads its files.
    volume.assert_clean();
    let m = volume.mount(&[]);
    assert!(std::fs::read(m.path("big")).unwrap() == content(3, 2 * MIB));
    m.unmount();
    // The volume goes on after the dump: `big`'s block is deleted with it, `later` stores one
    // the dump does not know. The stale dump is refused, and loads with --repair: `big`
    // reads zeros where its block was, the block the dump does not know is let go of.
    let m = volume.mount(&[]);
    std::fs::remove_file(m.path("big")).unwrap();
    std::fs::write(m.path("later"), content(4, 2 * MIB)).unwrap();
    m.unmount();
    let mut doc = dump.clone();
    // And a counter behind the inodes the dump holds, which the load moves past them.
    let next_inode = doc["counters"]["rows"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r[0] == "next_inode")
        .unwrap();
    next_inode[1] = 2.into();
    let stale = serde_json::to_vec(&doc).unwrap();
    let copy = volume.dir.path().join("copy.db");
    let out = load(&copy, &stale);
    assert!(
        !out.status.success() && stderr(&out).contains("is missing from the data directory"),
        "a stale dump: {}",
        stderr(&out)
    );
    assert!(!copy.exists());
    let out = load_with(&copy, &stale, &["--repair"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("repaired: block"), "{}", stderr(&out));
    let copy = Volume {
        pg: None,
        dir: TempDir::new("damaged-dump-copy"),
        db: copy,
        data: volume.data.clone(),
    };
    copy.assert_clean();
    let m = copy.mount(&[]);
    for i in 0..20 {
        std::fs::write(m.path(&format!("new{i}")), b"new").unwrap();
    }
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"small");
    assert!(std::fs::read(m.path("big")).unwrap() == vec![0; 2 * MIB]);
    assert!(!m.path("later").exists());
    m.unmount();
    copy.assert_clean();
}

/// A volume a killed mount left holds work only a mount finishes (changes answered before
/// their commit, files open after their last unlink): a dump of it is refused until a mount
/// and unmount have finished that work, so that loading a dump never loses what was
/// answered.
#[test]
fn a_dump_of_a_volume_a_killed_mount_left_waits_for_a_mount() {
    let volume = Volume::format("dump-killed");
    let m = volume.mount(&[]);
    for i in 0..200 {
        std::fs::write(m.path(&format!("f{i}")), b"answered").unwrap();
    }
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    drop(m);
    let out = lanefs(&["dump", volume.source()]);
    assert!(!out.status.success(), "a dump after kill -9 went ahead");
    assert!(
        stderr(&out).contains("was not unmounted cleanly"),
        "{}",
        stderr(&out)
    );
    volume.mount(&[]).unmount();
    let (copy, _) = dump_and_load(&volume, "dump-killed-copy");
    let m = copy.mount(&[]);
    for i in 0..200 {
        assert_eq!(
            std::fs::read(m.path(&format!("f{i}"))).unwrap(),
            b"answered"
        );
    }
    m.unmount();
}

/// `lanefs load` of `input` into a new volume file `db`.
fn load(db: &Path, input: &[u8]) -> std::process::Output {
    load_with(db, input, &[])
}

/// `lanefs load ARGS` of `input` into a new volume file `db`.
fn load_with(db: &Path, input: &[u8], args: &[&str]) -> std::process::Output {
    let mut child = Command::new(common::lanefs())
        .arg("load")
        .args(args)
        .arg(db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A refused load may exit before reading its input.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

#[test]
fn dump_and_load_keep_any_bytes_in_names_and_xattr_values() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let names: [&[u8]; 4] = [
        "naïve-ünïcödé-名前.txt".as_bytes(),
        b"raw-\xff\xfe\x80-bytes",
        b"\xc3(-broken-utf8",
        "emoji-🦀".as_bytes(),
    ];
    // Values as setfattr's hex: non-UTF-8 bytes, a NUL, UTF-8 text.
    let values = ["0xff00fe80c328", "0x6e61c3af7665", "0x00"];
    let volume = Volume::format("dump-bytes");
    let m = volume.mount(&[]);
    for (i, name) in names.iter().enumerate() {
        let path = m.mountpoint.join(OsStr::from_bytes(name));
        std::fs::write(&path, content(i, 100)).unwrap();
        run_ok(
            Command::new("setfattr")
                .args(["-n", &format!("user.v{i}"), "-v", values[i % values.len()]])
                .arg(&path),
        );
    }
    m.unmount();
    let (copy_volume, dump) = dump_and_load(&volume, "vol-dump-bytes-unused");
    let m = copy_volume.mount(&[]);
    for (i, name) in names.iter().enumerate() {
        let path = m.mountpoint.join(OsStr::from_bytes(name));
        assert_eq!(std::fs::read(&path).unwrap(), content(i, 100), "{path:?}");
        let attr = format!("user.v{i}");
        let listing = run_ok(
            Command::new("getfattr")
                .args(["--absolute-names", "-e", "hex", "-n", &attr])
                .arg(&path),
        );
        let value = listing
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{attr}=")))
            .unwrap_or_else(|| panic!("no {attr} in {listing}"));
        assert_eq!(value, values[i % values.len()], "{path:?}");
    }
    m.unmount();
    // Hex that is not ASCII (a slice through a character panicked here) or not hex: refused
    // with a sentence.
    let text = String::from_utf8(dump).unwrap();
    for bad in ["aé0", "zz", "abc"] {
        let broken = text.replacen("{\"hex\":\"", &format!("{{\"hex\":\"{bad}"), 1);
        let db = volume.dir.path().join("bad.db");
        let out = load(&db, broken.as_bytes());
        assert!(!out.status.success(), "loaded {bad:?}");
        assert!(
            stderr(&out).contains("load: a hex value"),
            "{bad:?}: {}",
            stderr(&out)
        );
        assert!(!db.exists());
    }
}

/// Address space the daemon gets in the punch test (with two malloc arenas, so that the
/// figure does not grow with the machine's CPUs): a punch that allocated memory for each byte
/// of its range (1 TiB) would die of it.
const PUNCH_DAEMON_AS_BYTES: u64 = 4 << 30;

#[test]
fn punching_a_terabyte_hole_in_a_sparse_file_costs_no_memory_for_the_range() {
    use std::os::unix::fs::FileExt;
    const TIB: u64 = 1 << 40;
    let volume = Volume::format("punch");
    let limit = format!("--as={PUNCH_DAEMON_AS_BYTES}");
    let m = common::Mount::start_wrapped(
        &["env", "MALLOC_ARENA_MAX=2", "prlimit", &limit],
        volume.source(),
        &[],
    );
    let path = m.path("sparse");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(2 * TIB).unwrap();
    let spots = [0, 1 << 30, TIB - 3, TIB + 5];
    for (i, at) in spots.iter().enumerate() {
        file.write_all_at(&content(i, 100), *at).unwrap();
    }
    file.sync_all().unwrap();
    let started = std::time::Instant::now();
    run_ok(
        Command::new("fallocate")
            .args(["--punch-hole", "--offset", "5", "--length"])
            .arg(TIB.to_string())
            .arg(&path),
    );
    eprintln!("punch of 1 TiB: {:?}", started.elapsed());
    file.sync_all().unwrap();
    drop(file);
    let file = std::fs::File::open(&path).unwrap();
    let read = |at: u64, len: usize| {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, at).unwrap();
        buf
    };
    assert_eq!(read(0, 5), content(0, 100)[..5]);
    assert!(read(5, 95).iter().all(|b| *b == 0));
    assert!(read(1 << 30, 100).iter().all(|b| *b == 0));
    assert!(read(TIB - 3, 8).iter().all(|b| *b == 0));
    assert_eq!(read(TIB + 5, 100), content(3, 100));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * TIB);
    drop(file);
    m.unmount();
    volume.assert_clean();
}

/// The volume is free the moment `lanefs umount` returns, even when the daemon is slow to
/// exit after it: here the daemon's log is a pipe the test has filled, so the daemon blocks
/// at its last log line ("unmounted; exiting"), after its control socket closed (which is
/// what `lanefs umount` waits for). A daemon that let go of the volume only when it exited
/// would still hold it.
#[test]
fn the_volume_is_free_as_soon_as_lanefs_umount_returns() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let volume = Volume::format("umount-free");
    let fifo = volume.dir.path().join("log.fifo");
    run_ok(Command::new("mkfifo").arg(&fifo));
    let mut reader = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let m = volume.mount(&["--log", fifo.to_str().unwrap()]);
    std::fs::write(m.path("f"), content(1, 2 * MIB)).unwrap();
    // Fill the pipe: the daemon's next log line blocks until the test reads.
    let mut filler = std::fs::File::options()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    for piece in [4096, 1] {
        while filler.write(&vec![b'.'; piece]).is_ok() {}
    }
    // (`lanefs umount` waits out a busy mount for 1 s: a child that another test forked
    // while this one had its file open holds a copy of the fd until it execs, and on a
    // loaded CI machine that once took longer, under /dev/fuse. Another try or two covers
    // it; a mount that stays busy still fails.)
    let mut out = lanefs(&["umount", m.mountpoint.to_str().unwrap()]);
    for _ in 0..5 {
        if out.status.success() || !stderr(&out).contains("busy") {
            break;
        }
        out = lanefs(&["umount", m.mountpoint.to_str().unwrap()]);
    }
    assert!(out.status.success(), "{}", stderr(&out));
    let (clean, report) = volume.fsck(false);
    // Let the daemon finish its log and exit.
    let mut sink = vec![0u8; 1 << 16];
    assert!(wait_until(Duration::from_secs(10), || {
        while reader.read(&mut sink).is_ok_and(|n| n > 0) {}
        !process_alive(m.pid)
    }));
    assert!(clean, "fsck right after lanefs umount:\n{report}");
    drop(m);
    volume.assert_clean();
}

/// Pages of `path` the page cache holds and has not yet written to the disk (cachestat(2),
/// Linux 6.5+, not in the libc crate for x86_64 yet).
fn unwritten_pages(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    /// cachestat's answer: cached, dirty, writeback, evicted, recently evicted pages.
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat([u64; 5]);
    const SYS_CACHESTAT: libc::c_long = 451;
    let file = std::fs::File::open(path).unwrap();
    let range = [0u64, 0u64]; // offset 0, length 0: the whole file
    let mut stat = CacheStat::default();
    // SAFETY: cachestat reads `range` (two u64) and fills `stat` (five u64); both live across
    // the call, and the fd is open.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            range.as_ptr(),
            &mut stat as *mut CacheStat,
            0u32,
        )
    };
    assert_eq!(rc, 0, "cachestat: {}", std::io::Error::last_os_error());
    stat.0[1] + stat.0[2]
}

/// fsync of a file whose data a close already flushed puts that data and the metadata on the
/// disk: nothing of the WAL or of the file's blocks is left only in the page cache.
#[test]
fn fsync_after_close_puts_data_and_metadata_on_the_disk() {
    let volume = Volume::format("fsync-disk");
    let m = volume.mount(&[]);
    std::fs::write(m.path("f"), content(1, 3 * MIB)).unwrap();
    let blocks = block_files(&volume.data);
    assert_eq!(blocks.len(), 3);
    std::fs::File::open(m.path("f"))
        .unwrap()
        .sync_all()
        .unwrap();
    let mut wal = volume.db.clone().into_os_string();
    wal.push("-wal");
    assert_eq!(
        unwritten_pages(Path::new(&wal)),
        0,
        "the WAL is not on the disk after fsync"
    );
    for block in blocks {
        assert_eq!(
            unwritten_pages(&block),
            0,
            "{} is not on the disk after fsync",
            block.display()
        );
    }
    m.unmount();
    volume.assert_clean();
}

/// fsync of a file with writes not yet flushed commits them durably, in one commit with
/// everything before it (no sync after it): nothing of the WAL or of the new blocks is
/// left only in the page cache, and a second fsync (nothing to flush) keeps it so.
#[test]
fn fsync_of_unflushed_writes_puts_them_on_the_disk() {
    let volume = Volume::format("fsync-dirty");
    let m = volume.mount(&[]);
    let mut f = std::fs::File::create(m.path("f")).unwrap();
    f.write_all(&content(2, 3 * MIB)).unwrap();
    f.sync_all().unwrap();
    let mut wal = volume.db.clone().into_os_string();
    wal.push("-wal");
    let on_disk = || {
        assert_eq!(
            unwritten_pages(Path::new(&wal)),
            0,
            "the WAL is not on the disk after fsync"
        );
        let blocks = block_files(&volume.data);
        assert!(blocks.len() >= 3, "{} blocks for 3 MiB", blocks.len());
        for block in blocks {
            assert_eq!(
                unwritten_pages(&block),
                0,
                "{} is not on the disk after fsync",
                block.display()
            );
        }
    };
    on_disk();
    f.write_all(b"more").unwrap();
    f.sync_data().unwrap();
    on_disk();
    drop(f);
    m.unmount();
    let m = volume.mount(&[]);
    let mut expected = content(2, 3 * MIB);
    expected.extend_from_slice(b"more");
    assert!(std::fs::read(m.path("f")).unwrap() == expected);
    m.unmount();
    volume.assert_clean();
}

/// Dumps `volume`, loads the dump into copy.db beside it and checks that the copy dumps the
/// same; the copy, sharing `volume`'s data directory (`tag` names its unused temp dir), and
/// the dump.
fn dump_and_load(volume: &Volume, tag: &str) -> (Volume, Vec<u8>) {
    let first = lanefs(&["dump", volume.source()]);
    assert!(first.status.success(), "{}", stderr(&first));
    let copy = volume.dir.path().join("copy.db");
    let out = load(&copy, &first.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    let second = lanefs(&["dump", copy.to_str().unwrap()]);
    // The same but for the volume id, which the copy takes over with the data location.
    let uuid_of = |dump: &[u8]| -> (String, serde_json::Value) {
        let mut doc: serde_json::Value = serde_json::from_slice(dump).unwrap();
        let rows = doc["settings"]["rows"].as_array_mut().unwrap();
        let row = rows.iter_mut().find(|r| r[0] == "uuid").unwrap();
        let uuid = row[1].as_str().unwrap().to_owned();
        row[1] = "".into();
        (uuid, doc)
    };
    let ((old_id, old_doc), (new_id, new_doc)) = (uuid_of(&first.stdout), uuid_of(&second.stdout));
    assert_ne!(old_id, new_id, "the loaded volume kept the dumped one's id");
    assert!(old_doc == new_doc, "the loaded volume dumps differently");
    let copy = Volume {
        pg: None,
        dir: TempDir::new(tag),
        db: copy,
        data: volume.data.clone(),
    };
    (copy, first.stdout)
}

/// How long a killed mount's session takes to be ended by a live mount at most: the live one
/// must have beaten for SESSION_EXPIRY (15 s) itself, the dead one been silent as long, and
/// heartbeats come every 2 s.
const SESSION_END_WAIT: Duration = Duration::from_secs(40);

/// Waits until the volume on PostgreSQL has `live` session rows (a mount ended the others).
fn wait_for_sessions(volume: &Volume, live: usize) {
    let server = volume.server();
    let ended = wait_until(SESSION_END_WAIT, || {
        server.psql("vol", "SELECT count(*) FROM sessions") == live.to_string()
    });
    assert!(
        ended,
        "the killed mounts' sessions were not ended: {}",
        server.psql("vol", "SELECT id, heartbeat_ns FROM sessions")
    );
}

/// The volume with its metadata on a PostgreSQL server of the test's own (issue 14).
/// `path`'s attributes as the daemon answers a GETATTR now (statx with
/// AT_STATX_FORCE_SYNC: the kernel's cached copy is not used).
fn statx_of_the_store(path: &Path) -> libc::statx {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a statx buffer the call fills.
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS,
            &mut stx,
        );
        assert_eq!(rc, 0, "statx: {}", std::io::Error::last_os_error());
        stx
    }
}

mod on_postgres {
    use super::*;

    /// A mount that starts while fsck or gc works on the volume is refused (it could
    /// otherwise store a block after gc listed the store and commit its reference after gc
    /// read them: gc would delete the block of a file it never saw), and fsck and gc are
    /// refused while a mount is starting. Played with the lock they share, held by a psql
    /// session as a check holds it.
    #[test]
    fn mounts_and_checks_keep_out_of_each_others_way() {
        let Some(volume) = Volume::format_on_postgres("maintenance") else {
            return;
        };
        let server = volume.server();
        let checking = server.hold("vol", "SELECT pg_advisory_xact_lock(7809644610626715649)");
        let mp = TempDir::new("pg-maintenance-mp");
        let intent = volume.intent_dir();
        let out = lanefs(&[
            "mount",
            "--daemon",
            "--intent-dir",
            intent.to_str().unwrap(),
            volume.source(),
            mp.path().to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        assert!(!is_mounted(mp.path()));
        assert!(
            stderr(&out).contains("is working on this volume; mount it when that is done"),
            "{}",
            stderr(&out)
        );
        for command in ["fsck", "gc"] {
            let out = lanefs(&[command, volume.source()]);
            assert!(
                !out.status.success()
                    && stderr(&out)
                        .contains("another lanefs fsck, gc or format is working on this volume"),
                "{command}: {}",
                stderr(&out)
            );
        }
        drop(checking);
        let m = volume.mount(&[]);
        std::fs::write(m.path("f"), b"after the check").unwrap();
        m.unmount();
        volume.assert_clean();
    }

    /// fsck's checks of inode columns and data rows on PostgreSQL, which fails a whole
    /// statement on a BIGINT overflow (`pos + len` of a crafted slice) and has its own
    /// functions: the repaired sizes are the end of each file's data.
    #[test]
    fn fsck_repairs_sizes_and_rows_out_of_range() {
        let Some(volume) = Volume::format_on_postgres("fsck-ranges") else {
            return;
        };
        let m = volume.mount(&[]);
        std::fs::write(m.path("chunked"), content(4, 2 * MIB)).unwrap();
        std::fs::write(m.path("inline"), b"hello\n").unwrap();
        std::os::unix::fs::symlink("target", m.path("link")).unwrap();
        m.unmount();
        let server = volume.server();
        server.psql(
            "vol",
            "UPDATE inodes SET size = -1 WHERE ino IN (SELECT ino FROM entries);
             UPDATE inodes SET mode = 61440 | 420 WHERE ino = (SELECT ino FROM entries WHERE name = 'inline');
             INSERT INTO slices (ino, idx, seq, pos, len, block, crc)
               SELECT ino, 0, 99, 9223372036854775000, 5000, block, crc FROM chunks WHERE idx = 0;
             INSERT INTO chunks (ino, idx, block, len, crc)
               SELECT ino, 5, -1, 10, crc FROM chunks WHERE idx = 0;",
        );
        let (ok, report) = volume.fsck(false);
        assert!(!ok, "fsck passed a damaged volume:\n{report}");
        for expected in [
            "has a slice out of range",
            "has a chunk out of range",
            "has mode 61860, out of range; mode 100644 at repair",
            "has a size out of range; set to 2097152",
            "has a size out of range; set to 6",
        ] {
            assert!(report.contains(expected), "no {expected:?} in\n{report}");
        }
        let (ok, report) = volume.fsck(true);
        assert!(ok, "{report}");
        volume.assert_clean();
        let m = volume.mount(&[]);
        assert!(std::fs::read(m.path("chunked")).unwrap() == content(4, 2 * MIB));
        assert_eq!(std::fs::read(m.path("inline")).unwrap(), b"hello\n");
        assert_eq!(
            std::fs::read_link(m.path("link")).unwrap(),
            Path::new("target")
        );
        m.unmount();
    }

    /// A mount killed with changes it answered under its directory's lease and could not
    /// commit (the test holds a lock that blocks every insert into `inodes`) leaves them in
    /// its intent log; the next mount on the machine (the same intent directory) drops the
    /// dead session's leases, applies them before it serves, and the files are there with
    /// their bytes.
    #[test]
    fn a_killed_mounts_intent_log_is_applied_by_the_next_mount() {
        let Some(volume) = Volume::format_on_postgres("intent") else {
            return;
        };
        let a = volume.mount(&[]);
        // Made here, so `a` holds its lease from birth; committed before the lock.
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::File::open(a.path("")).unwrap().sync_all().unwrap();
        let held = volume
            .server()
            .hold("vol", "LOCK TABLE inodes IN EXCLUSIVE MODE");
        let writer = {
            let d = a.path("d");
            std::thread::spawn(move || {
                for i in 0..20 {
                    std::fs::write(d.join(format!("f{i}")), format!("file {i}")).unwrap();
                }
                std::fs::remove_file(d.join("f5")).unwrap();
                // A directory made early, leased from its birth, and what is made in it.
                std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
                std::fs::write(d.join("sub/deeper/g"), b"nested").unwrap();
            })
        };
        assert!(
            wait_until(Duration::from_secs(10), || writer.is_finished()),
            "creates in a leased directory waited for their commit"
        );
        writer.join().unwrap();
        common::kill_9_and_wait(a.pid);
        drop(held);
        drop(a);

        let b = volume.mount(&[]);
        let expected: Vec<String> = {
            let mut names: Vec<String> = (0..20)
                .filter(|&i| i != 5)
                .map(|i| format!("f{i}"))
                .chain(["sub".to_string()])
                .collect();
            names.sort();
            names
        };
        assert_eq!(sorted_names(&b.path("d")), expected);
        assert_eq!(std::fs::read(b.path("d/sub/deeper/g")).unwrap(), b"nested");
        for i in (0..20).filter(|&i| i != 5) {
            assert_eq!(
                std::fs::read_to_string(b.path(&format!("d/f{i}"))).unwrap(),
                format!("file {i}")
            );
        }
        wait_for_sessions(&volume, 1);
        b.unmount();
        volume.assert_clean();
    }

    /// A killed mount's change that it answered early and never committed (an unlink) is
    /// not applied by a replay that comes after its directory's lease ran out: another mount
    /// may have changed the directory since, here putting a new file under the name and
    /// fsyncing it, and the old unlink would remove that file (the replay removed whatever
    /// the name held). Not acknowledged by any fsync, the unlink is dropped with a log line.
    #[test]
    fn a_replay_after_the_lease_ran_out_leaves_the_other_mounts_changes() {
        let Some(volume) = Volume::format_on_postgres("stale-replay") else {
            return;
        };
        let a = volume.mount(&[]);
        // Made here, so `a` holds its lease; y committed before the lock.
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::write(a.path("d/y"), b"old").unwrap();
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        std::fs::File::open(a.path("")).unwrap().sync_all().unwrap();
        let held = volume
            .server()
            .hold("vol", "LOCK TABLE inodes IN EXCLUSIVE MODE");
        let unlink = {
            let y = a.path("d/y");
            std::thread::spawn(move || std::fs::remove_file(y).unwrap())
        };
        assert!(
            wait_until(Duration::from_secs(10), || unlink.is_finished()),
            "an unlink in a leased directory waited for its commit"
        );
        unlink.join().unwrap();
        common::kill_daemon_leaving_a_dead_mount(a.pid, &a.mountpoint);
        drop(held);
        drop(a);

        // Another machine's mount: intent logs of its own. Its first change in d waits out
        // the dead mount's lease.
        let elsewhere = volume.dir.path().join("intent-elsewhere");
        let b = common::Mount::start(
            volume.source(),
            &["--intent-dir", elsewhere.to_str().unwrap()],
        );
        std::fs::write(b.path("d/y.new"), b"important").unwrap();
        std::fs::rename(b.path("d/y.new"), b.path("d/y")).unwrap();
        std::fs::File::open(b.path("d/y"))
            .unwrap()
            .sync_all()
            .unwrap();
        std::fs::File::open(b.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();

        // The dead mount's machine mounts again and finds its log.
        let log = volume.dir.path().join("replay.log");
        let a = volume.mount(&["--log", log.to_str().unwrap()]);
        assert_eq!(
            std::fs::read(a.path("d/y")).ok().as_deref(),
            Some(&b"important"[..]),
            "the replay undid the other mount's fsynced file"
        );
        assert_eq!(std::fs::read(b.path("d/y")).unwrap(), b"important");
        let logged = std::fs::read_to_string(&log).unwrap();
        assert!(
            logged.contains("is dropped: its directory's lease ran out before this replay"),
            "{logged}"
        );
        wait_for_sessions(&volume, 2);
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// A backlog that fills on a database that commits slows creates to the database's
    /// pace instead of turning them synchronous: each waits for room (a commit), then is
    /// answered early. Sending each such create the synchronous way (as before) queued it
    /// behind the whole backlog: 26 of these 300 creates waited for a drain.
    #[test]
    fn creates_that_fill_the_backlog_wait_for_room_not_for_their_commit() {
        let Some(volume) = Volume::format_on_postgres("room") else {
            return;
        };
        let a = volume.mount(&["--async-backlog", "20"]);
        std::fs::create_dir(a.path("d")).unwrap();
        for i in 0..300 {
            std::fs::File::create(a.path(&format!("d/f{i}"))).unwrap();
        }
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        let (waits, held_back) = (a.counter("async_room_waits"), a.counter("async_held_back"));
        eprintln!("300 creates: {waits} waited for room, {held_back} for their commit");
        assert!(waits > 0, "the backlog of 20 never filled");
        // A commit that takes over a second (a stalled machine) may send one the slow way.
        assert!(
            held_back <= 3,
            "{held_back} creates waited for their commit"
        );
        a.unmount();
        let m = volume.mount(&[]);
        assert_eq!(std::fs::read_dir(m.path("d")).unwrap().count(), 300);
        m.unmount();
    }

    /// With the database unable to commit (the test holds a lock that blocks every insert
    /// into `inodes`), a mount answers `--async-backlog` creates before their commit and
    /// no more: the next one waits for its commit, which comes once the lock is let go, and
    /// nothing is lost. Without the bound, creates would be answered (and kept in memory
    /// and the intent log) for as long as the database does not commit.
    #[test]
    fn creates_past_the_async_backlog_wait_for_their_commit() {
        let Some(volume) = Volume::format_on_postgres("backlog") else {
            return;
        };
        let a = volume.mount(&["--async-backlog", "20"]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::File::open(a.path("")).unwrap().sync_all().unwrap();
        let held = volume
            .server()
            .hold("vol", "LOCK TABLE inodes IN EXCLUSIVE MODE");
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (d, answered) = (a.path("d"), answered.clone());
            std::thread::spawn(move || {
                for i in 0..30 {
                    std::fs::File::create(d.join(format!("f{i}"))).unwrap();
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        let count = || answered.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            wait_until(Duration::from_secs(10), || count() >= 20),
            "creates in a leased directory waited for their commit before the backlog was full ({} answered)",
            count()
        );
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            count(),
            20,
            "answered while the database could not commit: as many as the backlog allows"
        );
        // It waited for room first, a second in vain.
        assert!(a.counter("async_room_waits") >= 1);
        assert!(a.counter("async_held_back") >= 1);
        assert_eq!(a.counter("async_backlog"), 20);
        assert_eq!(a.counter("database_gone"), 0);
        drop(held);
        assert!(
            wait_until(Duration::from_secs(30), || writer.is_finished()),
            "creates did not go on once the database could commit again"
        );
        writer.join().unwrap();
        a.unmount();
        let b = volume.mount(&[]);
        let mut expected: Vec<String> = (0..30).map(|i| format!("f{i}")).collect();
        expected.sort();
        assert_eq!(sorted_names(&b.path("d")), expected);
        b.unmount();
        volume.assert_clean();
    }

    /// PostgreSQL stopped for good: creates are answered before their commit up to the
    /// backlog, then fail with EIO once `--db-wait` passed, each later one at once (not
    /// after another wait), rather than being answered without end; once the server is
    /// back, changes commit again by themselves, and what fsync acknowledged before the
    /// stop is there, and nothing of what failed.
    #[test]
    fn with_the_database_gone_changes_fail_at_once_after_the_wait() {
        let Some(volume) = Volume::format_on_postgres("gone") else {
            return;
        };
        let a = volume.mount(&["--async-backlog", "20", "--db-wait", "2"]);
        std::fs::create_dir(a.path("d")).unwrap();
        {
            let mut kept = std::fs::File::create(a.path("d/kept")).unwrap();
            kept.write_all(b"fsynced before the stop").unwrap();
            kept.sync_all().unwrap();
        }
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        volume.server().stop();
        let mut outcomes = Vec::new();
        for i in 0..60 {
            let started = std::time::Instant::now();
            let created = std::fs::File::create(a.path(&format!("d/f{i}")));
            outcomes.push((
                created.map(drop).map_err(|e| e.raw_os_error()),
                started.elapsed(),
            ));
            if outcomes
                .iter()
                .rev()
                .take(10)
                .filter(|(r, _)| r.is_err())
                .count()
                == 10
            {
                break;
            }
        }
        let answered = outcomes.iter().filter(|(r, _)| r.is_ok()).count();
        assert!(
            answered <= 20,
            "{answered} creates answered with the database gone: {outcomes:?}"
        );
        let first_error = outcomes
            .iter()
            .position(|(r, _)| r.is_err())
            .unwrap_or_else(|| panic!("no create failed with the database gone: {outcomes:?}"));
        eprintln!(
            "{answered} creates answered early; the first EIO after {:?}, then {} more, the slowest in {:?}",
            outcomes[first_error].1,
            outcomes.len() - first_error - 1,
            outcomes[first_error + 1..].iter().map(|(_, t)| *t).max()
        );
        assert_eq!(outcomes[first_error].0, Err(Some(libc::EIO)));
        for (r, took) in &outcomes[first_error + 1..] {
            assert_eq!(*r, Err(Some(libc::EIO)), "{outcomes:?}");
            assert!(
                *took < Duration::from_secs(1),
                "a create waited {took:?} for a database already found gone"
            );
        }
        assert_eq!(a.counter("database_gone"), 1);
        volume.server().start_again();
        let back = wait_until(Duration::from_secs(30), || {
            std::fs::File::create(a.path("d/back")).is_ok_and(|f| f.sync_all().is_ok())
        });
        assert!(
            back,
            "changes did not commit again once PostgreSQL was back"
        );
        assert_eq!(a.counter("database_gone"), 0);
        assert_eq!(a.counter("async_backlog"), 0);
        assert_eq!(
            std::fs::read(a.path("d/kept")).unwrap(),
            b"fsynced before the stop"
        );
        a.unmount();
        let b = volume.mount(&[]);
        assert_eq!(sorted_names(&b.path("d")), vec!["back", "kept"]);
        b.unmount();
        volume.assert_clean();
    }

    #[test]
    fn a_listing_racing_the_commit_of_a_closed_file_shows_its_size() {
        if let Some(volume) = Volume::format_on_postgres("listing-race") {
            listings_race_the_commit_of_closed_files(&volume);
        }
    }

    #[test]
    fn untar_of_a_tree_matches_with_diff_and_after_remount() {
        let Some(volume) = Volume::format_on_postgres("untar") else {
            return;
        };
        let src = TempDir::new("pgvol-tree-src");
        let tree = src.path().join("tree");
        make_tree(&tree, 300);
        run_ok(
            Command::new("tar")
                .arg("cf")
                .arg(src.path().join("tree.tar"))
                .arg("-C")
                .arg(src.path())
                .arg("tree"),
        );
        untar_round_trip(&volume, src.path(), &tree);
    }

    #[test]
    fn kill_9_at_random_points_of_an_untar_keeps_every_fsynced_file() {
        let Some(volume) = Volume::format_on_postgres("kill9") else {
            return;
        };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        eprintln!("kill -9 runs on PostgreSQL: seed {seed}");
        kill_9_group(&volume, 0..5, seed, &mut Rng(seed));
    }

    /// What one mount creates, renames, writes and closes, and unlinks, the other sees within
    /// the shared volume's cache lifetime (1 s); an open after the other's close sees its
    /// bytes at once (close-to-open: no page cache kept across opens).
    #[test]
    fn two_mounts_of_one_volume_see_each_others_changes() {
        let Some(volume) = Volume::format_on_postgres("two") else {
            return;
        };
        // noatime: otherwise a read that must move atime drops the page cache anyway.
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        let soon = Duration::from_secs(3);
        std::fs::write(a.path("f"), b"AAAA").unwrap();
        assert_eq!(std::fs::read(b.path("f")).unwrap(), b"AAAA");
        // Same length, so only the page cache could hide the change from b.
        std::fs::write(a.path("f"), b"BBBB").unwrap();
        assert_eq!(
            std::fs::read(b.path("f")).unwrap(),
            b"BBBB",
            "an open on b after a's close read stale bytes"
        );
        std::fs::write(b.path("f"), b"written on b, longer").unwrap();
        assert_eq!(std::fs::read(a.path("f")).unwrap(), b"written on b, longer");
        std::fs::rename(a.path("f"), a.path("g")).unwrap();
        assert!(
            wait_until(soon, || !b.path("f").exists() && b.path("g").exists()),
            "b does not see a's rename"
        );
        std::fs::create_dir(b.path("d")).unwrap();
        std::fs::remove_file(b.path("g")).unwrap();
        assert!(
            wait_until(soon, || !a.path("g").exists() && a.path("d").is_dir()),
            "a does not see b's unlink and mkdir"
        );
        assert_eq!(sorted_names(&a.mountpoint), ["d"]);
        assert_eq!(sorted_names(&b.mountpoint), ["d"]);
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// With kernel caches that would last a minute, what one mount changes still reaches
    /// the other within a moment: the other reads the change log every 100 ms and sends its
    /// kernel FUSE invalidations (attributes, pages, names).
    /// A file open on one mount (`tail -f`) that another mount appends to: the open mount's
    /// stat and fstat show the new size, and reads through the open descriptor return the
    /// new bytes, within the change log's bound. The open state answered its own old size
    /// to every GETATTR, and capped reads at it, for as long as the open lasted.
    #[test]
    fn an_open_file_shows_another_mounts_appends() {
        use std::io::{Read, Seek};
        let Some(volume) = Volume::format_on_postgres("open-appends") else {
            return;
        };
        let long = ["-o", "attr_timeout=60,entry_timeout=60", "--noatime"];
        let a = volume.mount(&long);
        let b = volume.mount(&long);
        let soon = Duration::from_secs(3);
        std::fs::write(a.path("log"), b"first\n").unwrap();
        let mut tail = std::fs::File::open(b.path("log")).unwrap();
        let mut seen = String::new();
        tail.read_to_string(&mut seen).unwrap();
        assert_eq!(seen, "first\n");
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(a.path("log"))
            .unwrap();
        for round in 1..=3 {
            log.write_all(format!("line {round}\n").as_bytes()).unwrap();
            log.sync_all().unwrap();
            let want = 6 + 7 * round as u64;
            assert!(
                wait_until(soon, || tail.metadata().unwrap().len() == want),
                "round {round}: b's fstat of its open file kept size {} (want {want})",
                tail.metadata().unwrap().len()
            );
            assert_eq!(std::fs::metadata(b.path("log")).unwrap().len(), want);
            // A chmod's answer carries the attributes too.
            tail.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o640 + round))
                .unwrap();
            assert_eq!(
                tail.metadata().unwrap().len(),
                want,
                "round {round}: after chmod"
            );
            let mut more = String::new();
            tail.read_to_string(&mut more).unwrap();
            assert_eq!(more, format!("line {round}\n"), "round {round}: tail read");
        }
        tail.rewind().unwrap();
        let mut all = String::new();
        tail.read_to_string(&mut all).unwrap();
        assert_eq!(all, "first\nline 1\nline 2\nline 3\n");
        drop((tail, log));
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    #[test]
    fn the_change_log_invalidates_the_other_mounts_caches() {
        let Some(volume) = Volume::format_on_postgres("changelog") else {
            return;
        };
        let long = ["-o", "attr_timeout=60,entry_timeout=60", "--noatime"];
        let a = volume.mount(&long);
        let b = volume.mount(&long);
        let soon = Duration::from_secs(2);
        std::fs::write(a.path("f"), b"1234").unwrap();
        assert_eq!(std::fs::metadata(b.path("f")).unwrap().len(), 4);
        std::fs::write(a.path("f"), b"12345678").unwrap();
        assert!(
            wait_until(soon, || std::fs::metadata(b.path("f")).unwrap().len() == 8),
            "b's kernel kept a's old size"
        );
        assert_eq!(std::fs::read(b.path("f")).unwrap(), b"12345678");
        std::fs::rename(a.path("f"), a.path("g")).unwrap();
        assert!(
            wait_until(soon, || !b.path("f").exists() && b.path("g").exists()),
            "b's kernel kept the name a renamed"
        );
        std::fs::set_permissions(
            b.path("g"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        assert!(
            wait_until(soon, || {
                std::fs::metadata(a.path("g")).unwrap().mode() & 0o777 == 0o600
            }),
            "a's kernel kept b's old mode"
        );
        // xattrs, which b answers from the names it read (ls -l's two questions): an open
        // on b after a's change reads it at once (close-to-open), and without an open the
        // change log brings a's set and removal within the same bound.
        let selinux = || common::sys::lgetxattr(&b.path("g"), "security.selinux", 64);
        let get = |name: &str| common::sys::getxattr(&b.path("g"), name, 64).map(|(_, v)| v);
        let names = || common::sys::listxattr(&b.path("g"), 4096).map(|(_, names)| names);
        let no_data = || Some(common::sys::Errno(libc::ENODATA));
        assert_eq!(selinux().err(), no_data());
        assert_eq!(get("user.k").err(), no_data());
        common::sys::setxattr(&a.path("g"), "user.k", b"v1", 0).unwrap();
        let opened = std::fs::File::open(b.path("g")).unwrap();
        assert_eq!(
            get("user.k"),
            Ok(b"v1".to_vec()),
            "b's open did not read a's new xattr"
        );
        drop(opened);
        common::sys::setxattr(&a.path("g"), "user.j", b"v2", 0).unwrap();
        assert!(
            wait_until(soon, || get("user.j") == Ok(b"v2".to_vec())),
            "b kept answering that g has no user.j: {:?}",
            get("user.j")
        );
        assert_eq!(
            names(),
            Ok(vec!["user.j".to_string(), "user.k".to_string()])
        );
        common::sys::removexattr(&a.path("g"), "user.k").unwrap();
        common::sys::removexattr(&a.path("g"), "user.j").unwrap();
        assert!(
            wait_until(soon, || names() == Ok(Vec::new())),
            "b kept a's removed xattrs: {:?}",
            names()
        );
        assert_eq!(get("user.k").err(), no_data());
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// A directory's attributes, kept by a mount from its own commit that changed it (its
    /// creates and unlinks there), are never answered past a later change: this mount's
    /// own (a chmod) at once, another mount's once the change log shows it. statx with
    /// AT_STATX_FORCE_SYNC makes each look a GETATTR; the kernel's caches would last a
    /// minute.
    #[test]
    fn directory_attributes_kept_from_a_create_follow_later_changes() {
        let Some(volume) = Volume::format_on_postgres("dirattrs") else {
            return;
        };
        let long = ["-o", "attr_timeout=60,entry_timeout=60"];
        let a = volume.mount(&long);
        let b = volume.mount(&long);
        let mode_on =
            |m: &common::Mount| u32::from(statx_of_the_store(&m.path("d")).stx_mode) & 0o7777;
        let chmod = |m: &common::Mount, mode: u32| {
            std::fs::set_permissions(
                m.path("d"),
                std::os::unix::fs::PermissionsExt::from_mode(mode),
            )
            .unwrap();
        };
        std::fs::create_dir(a.path("d")).unwrap();
        chmod(&a, 0o755);
        for i in 0..3 {
            std::fs::write(a.path(&format!("d/f{i}")), b"x").unwrap();
        }
        std::fs::remove_file(a.path("d/f0")).unwrap();
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        assert_eq!(mode_on(&a), 0o755);
        chmod(&a, 0o750);
        assert_eq!(
            mode_on(&a),
            0o750,
            "a answered its create's attributes past its chmod"
        );
        std::fs::write(a.path("d/f3"), b"x").unwrap();
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        chmod(&b, 0o700);
        assert!(
            wait_until(Duration::from_secs(3), || mode_on(&a) == 0o700),
            "a kept answering its own create's attributes after b's chmod"
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Two mounts creating files in one directory at once, some names by both with O_EXCL:
    /// each answers early under the directory's lease while it holds it, and recalls the
    /// other's before changing the directory; every name ends up there once, each shared
    /// name made by exactly one of them, with the bytes its maker wrote; fsck clean.
    #[test]
    fn two_mounts_creating_in_one_directory_recall_each_others_leases() {
        let Some(volume) = Volume::format_on_postgres("leases") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::create_dir(a.path("d")).unwrap();
        const OWN: usize = 150;
        const SHARED: usize = 40;
        let make = |m: &common::Mount, tag: &'static str| {
            let d = m.path("d");
            move || {
                let mut won = Vec::new();
                for i in 0..OWN.max(SHARED) {
                    if i < OWN {
                        let name = d.join(format!("{tag}-{i}"));
                        if let Err(e) = std::fs::write(&name, format!("{tag} {i}")) {
                            panic!("writing {}: {e}", name.display());
                        }
                    }
                    if i < SHARED {
                        let name = d.join(format!("shared-{i}"));
                        match std::fs::File::create_new(&name) {
                            Ok(mut f) => {
                                f.write_all(tag.as_bytes()).unwrap();
                                won.push(i);
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                            Err(e) => panic!("create of {}: {e}", name.display()),
                        }
                    }
                }
                won
            }
        };
        let on_a = std::thread::spawn(make(&a, "a"));
        let on_b = std::thread::spawn(make(&b, "b"));
        let (won_a, won_b) = (on_a.join().unwrap(), on_b.join().unwrap());
        let mut winners = vec![None; SHARED];
        for (tag, won) in [("a", &won_a), ("b", &won_b)] {
            for &i in won {
                assert!(winners[i].is_none(), "shared-{i} created by both mounts");
                winners[i] = Some(tag);
            }
        }
        let mut expected: Vec<String> = (0..OWN)
            .flat_map(|i| [format!("a-{i}"), format!("b-{i}")])
            .chain((0..SHARED).map(|i| format!("shared-{i}")))
            .collect();
        expected.sort();
        for m in [&a, &b] {
            let names = sorted_names(&m.path("d"));
            assert_eq!(names, expected, "listing on {}", m.mountpoint.display());
            for (i, winner) in winners.iter().enumerate() {
                let winner = winner.unwrap_or_else(|| panic!("shared-{i} created by neither"));
                assert_eq!(
                    std::fs::read(m.path(&format!("d/shared-{i}"))).unwrap(),
                    winner.as_bytes()
                );
            }
            assert_eq!(std::fs::read(m.path("d/a-7")).unwrap(), b"a 7");
            assert_eq!(std::fs::read(m.path("d/b-7")).unwrap(), b"b 7");
        }
        // Answered early under leases, and the leases changed hands at recalls.
        assert!(a.counter("async_dirops") > 0 && a.counter("leases_taken") > 0);
        let recalled = a.counter("leases_let_go_at_recall") + b.counter("leases_let_go_at_recall");
        let waited =
            a.counter("waits_for_other_mounts_leases") + b.counter("waits_for_other_mounts_leases");
        assert!(
            recalled > 0 && waited > 0,
            "let go {recalled}, waits {waited}"
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// One mount removes empty directories while the other creates a file in each at the
    /// same moment: the rmdir is answered early once the directory is found empty, the
    /// create early under the directory's lease. Exactly one of them may succeed, and what
    /// was answered holds: never both answered (the create lost at its commit, or the
    /// rmdir refused at its commit with the directory left behind), never a create whose
    /// fsync fails after its open succeeded; fsck clean.
    #[test]
    fn an_rmdir_racing_a_create_in_the_directory_on_another_mount_is_answered_once() {
        rmdir_racing_creates_on_another_mount(&["--noatime"]);
    }

    /// As above, with the rmdirs waiting for their commit (the remover answers nothing
    /// early): the directory's lease, taken by the creating mount after the rmdir looked,
    /// must still stop the rmdir's commit.
    #[test]
    fn a_synchronous_rmdir_racing_a_create_in_the_directory_on_another_mount_is_answered_once() {
        rmdir_racing_creates_on_another_mount(&["--noatime", "--no-async-dirops"]);
    }

    /// One mount renames files into a directory, waiting for each commit, while the other
    /// creates the same names there with O_EXCL, answered early under the directory's
    /// lease: every create whose open succeeded keeps its fsync's promise, and a name both
    /// succeeded on holds the renamed file (the rename came second and replaced it).
    #[test]
    fn a_rename_racing_a_create_of_its_new_name_on_another_mount_is_answered_once() {
        let Some(volume) = Volume::format_on_postgres("rename-race") else {
            return;
        };
        let a = volume.mount(&["--noatime", "--no-async-dirops"]);
        let b = volume.mount(&["--noatime", "--entry-timeout", "600"]);
        const NAMES: usize = 120;
        std::fs::create_dir(a.path("from")).unwrap();
        std::fs::create_dir(a.path("to")).unwrap();
        for i in 0..NAMES {
            std::fs::write(a.path(&format!("from/f-{i}")), b"renamed").unwrap();
        }
        std::fs::metadata(b.path("to")).unwrap();
        let (from, to) = (a.path("from"), a.path("to"));
        let (renamed, created) = race_creates(
            NAMES,
            move |i| {
                std::fs::rename(from.join(format!("f-{i}")), to.join(format!("f-{i}"))).is_ok()
            },
            |i| b.path(&format!("to/f-{i}")),
            std::io::ErrorKind::AlreadyExists,
        );
        std::fs::File::open(a.path("to"))
            .unwrap()
            .sync_all()
            .unwrap();
        for i in 0..NAMES {
            assert!(renamed[i], "rename of f-{i} failed");
            let held = std::fs::read(a.path(&format!("to/f-{i}"))).unwrap();
            assert_eq!(
                held, b"renamed",
                "to/f-{i} (created there too: {})",
                created[i]
            );
        }
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Creates in a directory that an earlier mount made (no listing of it here from its own
    /// mkdir) are answered from a listing of it read from the database once, under its
    /// lease. That listing knows every name stored there, every change pending there when
    /// it was read (they commit after the read: the test holds them back), and what another
    /// mount made there while it held the lease: each lookup (no kernel cache: entry timeout
    /// 0) finds what is there, and each O_EXCL create of a taken name fails (one answered
    /// early over a taken name would fail only at its commit, and the file would be lost).
    #[test]
    fn a_listing_read_under_a_lease_knows_every_stored_and_pending_name() {
        let Some(volume) = Volume::format_on_postgres("listing") else {
            return;
        };
        const OLD: usize = 40;
        const REMOVED: usize = 10;
        let first = volume.mount(&["--noatime"]);
        std::fs::create_dir(first.path("d")).unwrap();
        for i in 0..OLD {
            std::fs::write(first.path(&format!("d/old-{i}")), b"old").unwrap();
        }
        // A second name: unlinking old-20 then waits for its commit (its link count).
        std::fs::hard_link(first.path("d/old-20"), first.path("linked")).unwrap();
        first.unmount();
        let a = volume.mount(&["--noatime", "--entry-timeout", "0"]);
        let b = volume.mount(&["--noatime"]);
        let create_new = |path: PathBuf| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map(drop)
        };
        let exists = |path: PathBuf| match std::fs::symlink_metadata(&path) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => panic!("{}: {e}", path.display()),
        };
        // A create that takes the lease and a range of inode numbers (both commit), then
        // removes and creates answered early and held back from their commit (reads of the
        // table go on) until the listing is read.
        create_new(a.path("d/first")).unwrap();
        let held = volume
            .server()
            .hold("vol", "LOCK TABLE entries IN EXCLUSIVE MODE");
        for i in 0..REMOVED {
            std::fs::remove_file(a.path(&format!("d/old-{i}"))).unwrap();
        }
        let mut new = 0;
        while a.counter("listings_read") == 0 {
            assert!(new < 100, "no listing read after {new} creates");
            create_new(a.path(&format!("d/new-{new}"))).unwrap();
            new += 1;
        }
        assert!(a.counter("async_backlog") > 0, "nothing was pending");
        drop(held);
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        // The count goes down once the committer is done with the batch, just after it
        // answered the fsync's wait.
        assert!(
            common::wait_until(Duration::from_secs(5), || a.counter("async_backlog") == 0),
            "{} changes left after the directory's fsync",
            a.counter("async_backlog")
        );
        // All committed: the overlay has nothing left of them, the listing answers.
        for i in 0..OLD {
            assert_eq!(
                exists(a.path(&format!("d/old-{i}"))),
                i >= REMOVED,
                "old-{i}"
            );
        }
        for i in 0..new {
            assert!(exists(a.path(&format!("d/new-{i}"))), "new-{i}");
        }
        for i in 0..OLD {
            let again = create_new(a.path(&format!("d/old-{i}")));
            if i < REMOVED {
                again.unwrap_or_else(|e| panic!("old-{i}, removed, created again: {e}"));
            } else {
                let e = again.expect_err(&format!("old-{i}, stored, created again"));
                assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "old-{i}");
            }
        }
        for i in 0..new {
            let e = create_new(a.path(&format!("d/new-{i}")))
                .expect_err(&format!("new-{i}, pending at the read, created again"));
            assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "new-{i}");
        }
        // A remove the synchronous way keeps the listing right (it follows the commit).
        let listed = a.counter("listings_read");
        std::fs::remove_file(a.path("d/old-20")).unwrap();
        assert!(!exists(a.path("d/old-20")), "old-20, removed, still found");
        create_new(a.path("d/old-20")).expect("old-20, removed, created again");
        assert_eq!(
            a.counter("listings_read"),
            listed,
            "the listing was read again"
        );
        // Another mount makes names there (it recalls the lease), then this one again.
        for i in 0..5 {
            create_new(b.path(&format!("d/b-{i}"))).unwrap();
        }
        for i in 0..5 {
            let e = create_new(a.path(&format!("d/b-{i}")))
                .expect_err(&format!("b-{i}, made on the other mount, created again"));
            assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "b-{i}");
        }
        create_new(a.path("d/a-last")).unwrap();
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        a.unmount();
        b.unmount();
        let m = volume.mount(&[]);
        let mut names: Vec<String> = std::fs::read_dir(m.path("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let mut expected: Vec<String> = (0..OLD)
            .map(|i| format!("old-{i}"))
            .chain((0..new).map(|i| format!("new-{i}")))
            .chain((0..5).map(|i| format!("b-{i}")))
            .chain(["first".to_owned(), "a-last".to_owned()])
            .collect();
        expected.sort();
        assert_eq!(names, expected);
        m.unmount();
        volume.assert_clean();
    }

    /// `count` rounds, each started on both sides at once: `other(i)` on a thread of its own,
    /// and here an O_EXCL create of `create_at(i)`, a write and an fsync; what `other`
    /// returned, and which creates were made (a create refused with `refused` was not). A
    /// create whose open succeeded and whose fsync then failed panics: its answer was lost.
    fn race_creates<T: Send + 'static>(
        count: usize,
        other: impl Fn(usize) -> T + Send + 'static,
        create_at: impl Fn(usize) -> PathBuf,
        refused: std::io::ErrorKind,
    ) -> (Vec<T>, Vec<bool>) {
        let go = Arc::new(std::sync::Barrier::new(2));
        let other = {
            let go = go.clone();
            std::thread::spawn(move || {
                (0..count)
                    .map(|i| {
                        go.wait();
                        other(i)
                    })
                    .collect::<Vec<_>>()
            })
        };
        let created = (0..count)
            .map(|i| {
                go.wait();
                let name = create_at(i);
                match std::fs::File::create_new(&name) {
                    Ok(mut f) => {
                        f.write_all(b"created").unwrap();
                        if let Err(e) = f.sync_all() {
                            panic!("{}: open succeeded, then fsync: {e}", name.display());
                        }
                        true
                    }
                    Err(e) if e.kind() == refused => false,
                    Err(e) => panic!("create of {}: {e}", name.display()),
                }
            })
            .collect();
        (other.join().unwrap(), created)
    }

    fn rmdir_racing_creates_on_another_mount(remover_args: &[&str]) {
        let Some(volume) = Volume::format_on_postgres("rmdir-race") else {
            return;
        };
        let a = volume.mount(remover_args);
        // b keeps the directories' names cached, so its creates go straight to them.
        let b = volume.mount(&["--noatime", "--entry-timeout", "600"]);
        const DIRS: usize = 120;
        std::fs::create_dir(a.path("p")).unwrap();
        for i in 0..DIRS {
            std::fs::create_dir(a.path(&format!("p/d-{i}"))).unwrap();
        }
        std::fs::File::open(a.path("p"))
            .unwrap()
            .sync_all()
            .unwrap();
        for i in 0..DIRS {
            std::fs::metadata(b.path(&format!("p/d-{i}"))).unwrap();
        }
        // b's lookups recalled a's lease on p; a takes it again once it cooled down, and
        // answers its rmdirs there early.
        std::thread::sleep(Duration::from_millis(2500));
        let p = a.path("p");
        let (removed, created) = race_creates(
            DIRS,
            move |i| std::fs::remove_dir(p.join(format!("d-{i}"))).map_err(|e| e.kind()),
            |i| b.path(&format!("p/d-{i}/f")),
            std::io::ErrorKind::NotFound,
        );
        std::fs::File::open(a.path("p"))
            .unwrap()
            .sync_all()
            .unwrap();
        let mut both = Vec::new();
        for i in 0..DIRS {
            let gone = match removed[i] {
                Ok(()) => true,
                Err(std::io::ErrorKind::DirectoryNotEmpty) => false,
                Err(e) => panic!("rmdir of d-{i}: {e}"),
            };
            if gone == created[i] {
                both.push(i);
            }
            let kept = a.path(&format!("p/d-{i}/f")).exists();
            assert_eq!(
                kept, created[i],
                "d-{i}/f: created {}, there {kept}",
                created[i]
            );
            assert_eq!(a.path(&format!("p/d-{i}")).exists(), !gone, "d-{i}");
        }
        assert!(
            both.is_empty(),
            "rmdir and create both answered (or neither) for d-{both:?}"
        );
        assert!(b.counter("async_dirops") > 0);
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// One mount renames new files over a name while the other unlinks that name, both
    /// synchronously, so that a rename can commit between the unlink's statements (its link
    /// count dropped where the name pointed, then the name deleted): every unlink answers
    /// done or ENOENT, never EIO, and every inode's link count matches its names (each file
    /// also has a second name that keeps it alive); fsck clean.
    #[test]
    fn unlinks_racing_renames_over_the_name_on_another_mount_keep_link_counts() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let Some(volume) = Volume::format_on_postgres("unlink-race") else {
            return;
        };
        let a = volume.mount(&["--no-async-dirops"]);
        // No name cached: every unlink on b asks the volume.
        let b = volume.mount(&["--no-async-dirops", "--entry-timeout", "0"]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::create_dir(a.path("keep")).unwrap();
        const FILES: usize = 400;
        let done = Arc::new(AtomicBool::new(false));
        let renamer = {
            let (d, keep, done) = (a.path("d"), a.path("keep"), done.clone());
            std::thread::spawn(move || {
                for i in 0..FILES {
                    let new = d.join(format!("t{i}"));
                    std::fs::write(&new, i.to_string()).unwrap();
                    std::fs::hard_link(&new, keep.join(format!("k{i}"))).unwrap();
                    std::fs::rename(&new, d.join("x")).unwrap();
                }
                done.store(true, Ordering::Release);
            })
        };
        let x = b.path("d/x");
        let (mut unlinked, mut absent) = (0, 0);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        while !done.load(Ordering::Acquire) {
            // Paced at varying intervals, so that the name is often there when a rename
            // over it begins and unlinks land at every point of renames.
            std::thread::sleep(Duration::from_micros(rng.below(30_000)));
            match std::fs::remove_file(&x) {
                Ok(()) => unlinked += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent += 1,
                Err(e) => panic!("unlink on b while a renames over the name: {e}"),
            }
        }
        renamer.join().unwrap();
        eprintln!("unlinked {unlinked}, absent {absent}");
        assert!(
            unlinked > 0,
            "no unlink ever found the name: the race was not run"
        );
        a.unmount();
        b.unmount();
        // A fresh mount, so that no kernel cache of either answers.
        let c = volume.mount(&[]);
        let survivor = std::fs::metadata(c.path("d/x")).ok().map(|m| m.ino());
        for i in 0..FILES {
            let keep = c.path(&format!("keep/k{i}"));
            let meta = std::fs::metadata(&keep).unwrap_or_else(|e| {
                panic!(
                    "keep/k{i}: {e}; keep holds {:?}; entries {}",
                    sorted_names(&c.path("keep")).len(),
                    volume.server().psql("vol", &format!("SELECT e.parent, e.ino, i.nlink FROM entries e LEFT JOIN inodes i USING (ino) WHERE name = 'k{i}'"))
                )
            });
            let names = 1 + u64::from(survivor == Some(meta.ino()));
            assert_eq!(meta.nlink(), names, "keep/k{i}'s link count");
            assert_eq!(std::fs::read(&keep).unwrap(), i.to_string().as_bytes());
        }
        c.unmount();
        volume.assert_clean();
    }

    /// One mount moves directory X into Y; the other, whose kernel still sees X where it
    /// was (it holds X open), then moves Y into X, which its own cache shows as no loop: the
    /// volume refuses it (EINVAL), as one mount's kernel would, instead of leaving X and Y
    /// a loop that no path reaches. So too for RENAME_EXCHANGE of a directory with one
    /// inside it.
    #[test]
    fn a_directory_moved_into_itself_through_another_mounts_move_is_refused() {
        use std::os::fd::AsRawFd;
        let Some(volume) = Volume::format_on_postgres("rename-loop") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        for dir in ["p", "p/X", "q", "q/Y", "r", "r/S", "u", "u/T"] {
            std::fs::create_dir(a.path(dir)).unwrap();
        }
        let open_dir = |path: PathBuf| std::fs::File::open(path).unwrap();
        // b's handles, taken before a moves anything.
        let (q_on_b, x_on_b) = (open_dir(b.path("q")), open_dir(b.path("p/X")));
        let (r_on_b, u_on_b) = (open_dir(b.path("r")), open_dir(b.path("u")));
        std::fs::rename(a.path("p/X"), a.path("q/Y/X")).unwrap();
        std::fs::rename(a.path("u"), a.path("r/S/u")).unwrap();
        let renameat2 = |from: &std::fs::File, name: &str, to: &std::fs::File, new: &str, flags| {
            let (name, new) = (
                std::ffi::CString::new(name).unwrap(),
                std::ffi::CString::new(new).unwrap(),
            );
            // SAFETY: open descriptors and NUL-terminated names that outlive the call.
            let rc = unsafe {
                libc::renameat2(
                    from.as_raw_fd(),
                    name.as_ptr(),
                    to.as_raw_fd(),
                    new.as_ptr(),
                    flags,
                )
            };
            if rc == 0 {
                0
            } else {
                std::io::Error::last_os_error().raw_os_error().unwrap()
            }
        };
        // Y into X, which is inside Y now.
        assert_eq!(renameat2(&q_on_b, "Y", &x_on_b, "Y", 0), libc::EINVAL);
        // S swapped with T would go into u, which is inside S now.
        assert_eq!(
            renameat2(&r_on_b, "S", &u_on_b, "T", libc::RENAME_EXCHANGE),
            libc::EINVAL
        );
        // A move that is no loop still goes through on b.
        assert_eq!(renameat2(&u_on_b, "T", &q_on_b, "T", 0), 0);
        drop((q_on_b, x_on_b, r_on_b, u_on_b));
        a.unmount();
        b.unmount();
        let c = volume.mount(&[]);
        for dir in ["q/Y/X", "r/S/u", "q/T"] {
            assert!(c.path(dir).is_dir(), "{dir} is not there");
        }
        assert_eq!(sorted_names(&c.mountpoint), ["p", "q", "r"]);
        c.unmount();
        volume.assert_clean();
    }

    /// A file opened on b while it was small (its bytes inline in the metadata) grows into
    /// chunks on a; b then writes and closes it, storing its own (small) view inline: the
    /// chunks a stored go, so that no later growth of the file shows a's old bytes where
    /// there must be zeros.
    #[test]
    fn a_small_files_close_drops_chunks_another_mount_stored_meanwhile() {
        use std::os::unix::fs::FileExt;
        let Some(volume) = Volume::format_on_postgres("inline-stale") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"0123456789").unwrap();
        let on_b = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(b.path("f"))
            .unwrap();
        std::fs::write(a.path("f"), vec![0xa5; 300 << 10]).unwrap();
        on_b.write_all_at(b"BBBBB", 0).unwrap();
        drop(on_b);
        a.unmount();
        b.unmount();
        // b stored its view inline: no chunk row may be left beside it (a file is inline or
        // chunked, never both; a chunk row left would be read back by a later open's view).
        let server = volume.server();
        let inline = server.psql(
            "vol",
            "SELECT count(*) FROM inodes WHERE inline_data IS NOT NULL AND ino IN (SELECT ino FROM chunks)",
        );
        assert_eq!(inline, "0", "an inline file kept chunk rows");
        let c = volume.mount(&[]);
        let len = std::fs::metadata(c.path("f")).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(c.path("f"))
            .unwrap()
            .set_len(300 << 10)
            .unwrap();
        let bytes = std::fs::read(c.path("f")).unwrap();
        let head = len as usize;
        eprintln!("b stored {head} bytes");
        assert!(
            bytes[head..].iter().all(|&b| b == 0),
            "{} non-zero bytes past the {head} b stored (a's old chunks)",
            bytes[head..].iter().filter(|&&b| b != 0).count()
        );
        c.unmount();
        volume.assert_clean();
    }

    /// The PostgreSQL connection sends a transaction's BEGIN and the statements whose
    /// answer the logic does not wait for (`Tx::execute_later`) with the next statement or
    /// the COMMIT: a failure among them is that statement's or that COMMIT's (the whole
    /// transaction rolled back), and a savepoint's rollback takes what its change left
    /// unsent along; nothing of a failed transaction is committed.
    #[test]
    fn statements_sent_later_fail_their_transaction_and_commit_with_it() {
        use lanefs_volume::postgres::PgTarget;
        use lanefs_volume::sql::{Arg, DbError, Tx};
        use lanefs_volume::store::Conn;
        let Some(server) = common::postgres::PgServer::start("later") else {
            return;
        };
        let url = server.createdb("later");
        let mut conn = PgTarget::parse(&url).unwrap().connect().unwrap();
        conn.batch_sql("CREATE TABLE t (k BIGINT PRIMARY KEY)")
            .unwrap();
        const INSERT: &str = "INSERT INTO t (k) VALUES (?)";
        const KEYS: &str = "SELECT k FROM t ORDER BY k";
        let keys = |conn: &mut lanefs_volume::postgres::PgConn| -> Vec<i64> {
            let rows = conn.query(KEYS, &[]).unwrap();
            rows.iter().map(|r| r.int(0).unwrap()).collect()
        };
        // Sent with COMMIT: committed with it.
        conn.begin(false).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(1)]).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(2)]).unwrap();
        conn.commit(false).unwrap();
        assert_eq!(keys(&mut conn), [1, 2]);
        // A taken key sent with COMMIT: the COMMIT fails, and nothing of it is kept.
        conn.begin(false).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(3)]).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(1)]).unwrap();
        assert_eq!(conn.commit(false), Err(DbError::Unique));
        conn.rollback();
        assert_eq!(keys(&mut conn), [1, 2]);
        // A taken key sent with the next statement: that statement fails.
        conn.begin(false).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(2)]).unwrap();
        assert_eq!(conn.query(KEYS, &[]).map(|r| r.len()), Err(DbError::Unique));
        conn.rollback();
        // Inside a savepoint: its RELEASE fails, its rollback takes the change back (and
        // what it left unsent), and the transaction goes on to commit the rest.
        conn.begin(false).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(4)]).unwrap();
        conn.batch("SAVEPOINT op").unwrap();
        conn.execute_later(INSERT, &[Arg::Int(5)]).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(1)]).unwrap();
        assert_eq!(conn.batch("RELEASE op"), Err(DbError::Unique));
        conn.batch("ROLLBACK TO op; RELEASE op").unwrap();
        conn.batch("SAVEPOINT op").unwrap();
        conn.execute_later(INSERT, &[Arg::Int(6)]).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(2)]).unwrap();
        conn.batch("ROLLBACK TO op; RELEASE op").unwrap();
        conn.execute_later(INSERT, &[Arg::Int(7)]).unwrap();
        conn.commit(false).unwrap();
        assert_eq!(keys(&mut conn), [1, 2, 4, 7]);
        // A transaction rolled back before anything went out leaves nothing behind either.
        conn.begin(false).unwrap();
        conn.execute_later(INSERT, &[Arg::Int(8)]).unwrap();
        conn.rollback();
        assert_eq!(keys(&mut conn), [1, 2, 4, 7]);
    }

    /// A mount killed with kill -9 while it holds a directory's lease: the other mount's
    /// create there waits for the lease to expire (no longer), then goes on; what the
    /// killed mount answered before an fsync that returned is there, fsck clean.
    #[test]
    fn a_killed_holders_lease_expires_and_what_its_fsync_covered_is_kept() {
        let Some(volume) = Volume::format_on_postgres("leasekill") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::create_dir(a.path("d")).unwrap();
        for i in 0..20 {
            std::fs::write(a.path(&format!("d/f{i}")), format!("{i}")).unwrap();
        }
        let mut kept = std::fs::File::create(a.path("d/kept")).unwrap();
        kept.write_all(b"kept").unwrap();
        kept.sync_all().unwrap();
        drop(kept);
        // Used just before the kill: the lease is live then.
        std::fs::write(a.path("d/unsynced"), b"maybe").unwrap();
        assert!(a.counter("leases_taken") > 0);
        common::kill_daemon_leaving_a_dead_mount(a.pid, &a.mountpoint);
        drop(a);
        let started = std::time::Instant::now();
        std::fs::write(b.path("d/after"), b"after").unwrap();
        let waited = started.elapsed();
        // For d's lease, and the root's if a still held it (from its mkdir of d).
        assert!(b.counter("waits_for_other_mounts_leases") >= 1);
        assert!(
            waited < Duration::from_secs(20),
            "waited {waited:?} for a dead mount's lease"
        );
        assert_eq!(std::fs::read(b.path("d/kept")).unwrap(), b"kept");
        for i in 0..20 {
            assert_eq!(
                std::fs::read(b.path(&format!("d/f{i}"))).unwrap(),
                format!("{i}").as_bytes(),
                "f{i}, answered before the fsync, is lost"
            );
        }
        // b ends the dead session (fsck wants no live one).
        wait_for_sessions(&volume, 1);
        b.unmount();
        volume.assert_clean();
    }

    /// A dead mount's leases hold no queue of a live one: requests that wait for them (up
    /// to the leases' expiry, 10 s) wait off the queues, so a lookup elsewhere from the same
    /// CPU is answered at once. The old volume waited on the queue's worker: over io_uring
    /// that CPU's requests all waited with it, and over /dev/fuse on 2 CPUs the waits took
    /// both workers.
    #[test]
    fn waits_for_a_dead_mounts_lease_hold_no_queue() {
        use std::os::fd::AsRawFd;
        let Some(volume) = Volume::format_on_postgres("leasequeue") else {
            return;
        };
        let a = volume.mount(&[]);
        // Long timeouts: b's kernel keeps d/g's entry, so its truncate by path goes
        // straight to a SETATTR, whose read of the file meets the lease.
        let b = volume.mount(&["-o", "attr_timeout=60,entry_timeout=60"]);
        std::fs::create_dir(b.path("elsewhere")).unwrap();
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::write(a.path("d/g"), b"g to be truncated").unwrap();
        // b's lookup recalls a's lease on d; a's next create there takes it again.
        assert_eq!(std::fs::metadata(b.path("d/g")).unwrap().len(), 17);
        let taken = a.counter("leases_taken");
        std::fs::write(a.path("d/f"), b"f").unwrap();
        let mut more = 0;
        assert!(
            wait_until(Duration::from_secs(8), || {
                more += 1;
                std::fs::write(a.path(&format!("d/more-{more}")), b"m").unwrap();
                a.counter("leases_taken") > taken
            }),
            "a never took d's lease again after b's recall"
        );
        // Opened before the kill: what the probes look up in them is the only lookup.
        let leased = std::fs::File::open(b.path("d")).unwrap();
        let free = std::fs::File::open(b.path("elsewhere")).unwrap();
        common::kill_daemon_leaving_a_dead_mount(a.pid, &a.mountpoint);
        drop(a);
        let lookup = |dir: &std::fs::File, name: &str| -> i32 {
            let name = std::ffi::CString::new(name).unwrap();
            // SAFETY: the fd is open and `st` is written by the call.
            unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                match libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, 0) {
                    0 => 0,
                    _ => *libc::__errno_location(),
                }
            }
        };
        let pin = common::pin_to_cpu;
        let started = std::time::Instant::now();
        let mut waiters: Vec<_> = (0..4)
            .map(|i| {
                let leased = leased.try_clone().unwrap();
                std::thread::spawn(move || {
                    pin(i % 2);
                    lookup(&leased, &format!("absent-{i}"))
                })
            })
            .collect();
        let g =
            std::ffi::CString::new(b.path("d/g").into_os_string().into_encoded_bytes()).unwrap();
        let truncater = std::thread::spawn(move || {
            pin(0);
            // SAFETY: a NUL-terminated path we own.
            match unsafe { libc::truncate(g.as_ptr(), 0) } {
                0 => 0,
                // SAFETY: reads this thread's errno.
                _ => unsafe { *libc::__errno_location() },
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "a lookup in the dead mount's leased directory did not wait"
        );
        assert!(
            !truncater.is_finished(),
            "a truncate of a file in the dead mount's leased directory did not wait"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            pin(0);
            let _ = tx.send(lookup(&free, "absent"));
        });
        let probe = rx.recv_timeout(Duration::from_secs(2));
        for w in waiters.drain(..) {
            assert_eq!(w.join().unwrap(), libc::ENOENT);
        }
        assert_eq!(truncater.join().unwrap(), 0, "the truncate by path");
        let waited = started.elapsed();
        assert_eq!(
            probe,
            Ok(libc::ENOENT),
            "a lookup from CPU 0 elsewhere waited for the dead mount's lease (behind a lookup \
             or a truncate that waited on the queue)"
        );
        assert!(b.counter("waits_for_other_mounts_leases") >= 1);
        assert!(waited < Duration::from_secs(20), "waited {waited:?}");
        assert_eq!(std::fs::read(b.path("d/f")).unwrap(), b"f".to_vec());
        assert_eq!(std::fs::metadata(b.path("d/g")).unwrap().len(), 0);
        drop(leased);
        wait_for_sessions(&volume, 1);
        b.unmount();
        volume.assert_clean();
    }

    /// A mount killed with kill -9 leaves its session row, its inode range and a file it
    /// held open after unlinking it; the live mount ends that session after the heartbeat
    /// timeout (frees the file, drops the range and the row) and keeps its own.
    #[test]
    fn a_killed_mounts_session_is_ended_by_the_other() {
        let Some(volume) = Volume::format_on_postgres("expiry") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        let a_session = server.psql("vol", "SELECT min(id) FROM sessions");
        let b_session = server.psql("vol", "SELECT max(id) FROM sessions");
        let mut held = std::fs::File::create(a.path("held")).unwrap();
        held.write_all(&content(1, 200 * KIB)).unwrap();
        held.sync_all().unwrap();
        std::fs::remove_file(a.path("held")).unwrap();
        std::fs::write(a.path("kept"), b"kept").unwrap();
        assert_eq!(server.psql("vol", "SELECT count(*) FROM orphans"), "1");
        let ranges = format!("SELECT count(*) FROM inode_ranges WHERE session = {a_session}");
        // Its committer's range, and the one it hands out early answers from.
        assert_ne!(server.psql("vol", &ranges), "0");
        common::kill_daemon_leaving_a_dead_mount(a.pid, &a.mountpoint);
        drop(held);
        drop(a);
        wait_for_sessions(&volume, 1);
        assert_eq!(server.psql("vol", "SELECT id FROM sessions"), b_session);
        assert_eq!(server.psql("vol", "SELECT count(*) FROM orphans"), "0");
        assert_eq!(server.psql("vol", &ranges), "0");
        // The live mount goes on, and sees what the dead one committed.
        assert_eq!(std::fs::read(b.path("kept")).unwrap(), b"kept");
        std::fs::write(b.path("after"), b"x").unwrap();
        b.unmount();
        volume.assert_clean();
    }

    /// Creates `path` holding `bytes`, and fsyncs it.
    fn create_fsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut file = std::fs::File::create(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }

    /// The end of a test whose mount `a` was fenced after it fsynced `before`, and then
    /// tried to create `after`: `b` reads the one and not the other, and the volume is clean.
    fn fenced_mount_kept_only_before(a: common::Mount, b: common::Mount, volume: &Volume) {
        a.unmount();
        assert_eq!(std::fs::read(b.path("before")).unwrap(), b"before");
        assert!(!b.path("after").exists(), "the refused create is there");
        b.unmount();
        volume.assert_clean();
    }

    /// A mount whose session the others ended (its daemon stopped for longer than the
    /// expiry: a paused VM, a long stall) refuses every change once it runs again, since
    /// what it would commit could refer to the blocks, orphans or locks the others freed
    /// with its session; what it committed before stays, and the volume stays clean.
    #[test]
    fn a_mount_whose_session_was_ended_refuses_changes() {
        let Some(volume) = Volume::format_on_postgres("fenced") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        // fsynced: a create answered before its commit is not yet a's to keep when it stops.
        create_fsynced(&a.path("before"), b"before").unwrap();
        let signal = |sig: &str| run_ok(Command::new("kill").arg(sig).arg(a.pid.to_string()));
        signal("-STOP");
        wait_for_sessions(&volume, 1);
        signal("-CONT");
        // Its heartbeat (every 2 s) finds the session gone.
        std::thread::sleep(Duration::from_secs(3));
        let err = create_fsynced(&a.path("after"), &content(2, 200 * KIB))
            .expect_err("a mount whose session had ended committed a change");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        fenced_mount_kept_only_before(a, b, &volume);
    }

    /// A change that reaches the database after another mount ended this mount's session
    /// (its heartbeat late: a long stall, a backlog of changes ahead of the heartbeat) is
    /// not committed, though this mount's own heartbeat has not noticed yet: every batch
    /// takes a share lock on the session's row, which the ending deletes. (Before, only
    /// the next heartbeat fenced the mount, and the batches queued ahead of it committed:
    /// chunk rows referring to blocks the other mount's cleanup of the ended session had
    /// just deleted.) The other mount's deletion of the row is played by psql, right after
    /// one of this mount's heartbeats, two seconds before its next.
    #[test]
    fn a_change_that_reaches_the_database_after_its_session_ended_is_refused() {
        let Some(volume) = Volume::format_on_postgres("fenced-batch") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        create_fsynced(&a.path("before"), b"before").unwrap();
        let a_session = server.psql("vol", "SELECT min(id) FROM sessions");
        let beat = format!("SELECT heartbeat_ns FROM sessions WHERE id = {a_session}");
        let last = server.psql("vol", &beat);
        assert!(
            wait_until(Duration::from_secs(10), || server.psql("vol", &beat)
                != last),
            "no heartbeat of the first mount in 10 s"
        );
        server.psql(
            "vol",
            &format!("DELETE FROM sessions WHERE id = {a_session}"),
        );
        let deleted = std::time::Instant::now();
        let err = create_fsynced(&a.path("after"), &content(2, 200 * KIB))
            .expect_err("a change of an ended session was committed");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        if deleted.elapsed() > Duration::from_millis(1800) {
            // The mount's next heartbeat may have come first, and fenced it as before.
            eprintln!(
                "note: the refused change took {:?}; this run does not tell the batch's check from the heartbeat's",
                deleted.elapsed()
            );
        }
        fenced_mount_kept_only_before(a, b, &volume);
    }

    /// On a slow database (a trigger makes each inode row cost 5 ms: under 200 creates a
    /// second) a mount creating files as fast as it can is answered early only while its
    /// backlog is a few seconds of commits, its heartbeat stays fresh, and another mount's
    /// listing in the middle (which recalls the directory's lease, and waits for the
    /// holder to commit what it answered there) is complete and comes within seconds.
    /// Before, the backlog grew to 32k changes whatever they cost: past the lease's expiry
    /// (a recalled lease is not renewed), so the other mount listed the directory without
    /// the names still queued; and the heartbeat waited behind the backlog (and behind the
    /// commit of whatever the heartbeat thread also did), so once it was 15 s late the
    /// other mount ended this live session and every change still queued was refused. And
    /// each create waited for the whole backlog: the read of its directory's default ACL
    /// waited for every pending change of the directory.
    #[test]
    fn on_a_slow_database_the_backlog_stays_short_and_the_heartbeat_fresh() {
        let Some(volume) = Volume::format_on_postgres("slow-db") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::File::open(a.path("")).unwrap().sync_all().unwrap();
        let a_session = server.psql("vol", "SELECT min(id) FROM sessions");
        server.psql(
            "vol",
            "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.005); RETURN NEW; END $$; \
             CREATE TRIGGER slow_inodes BEFORE INSERT ON inodes \
             FOR EACH ROW EXECUTE FUNCTION slow_row()",
        );
        let files = 3000;
        let listed_at = 2500;
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (d, answered) = (a.path("d"), answered.clone());
            std::thread::spawn(move || {
                for i in 0..files {
                    std::fs::File::create(d.join(format!("f{i}"))).unwrap();
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        let age_sql = format!(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint - heartbeat_ns \
             FROM sessions WHERE id = {a_session}"
        );
        let started = std::time::Instant::now();
        let mut oldest = Duration::ZERO;
        let mut listing = None;
        while (!writer.is_finished() || a.counter("async_backlog") > 0)
            && started.elapsed() < Duration::from_secs(180)
        {
            let age = server.psql("vol", &age_sql);
            let age: u64 = age.parse().unwrap_or_else(|_| {
                panic!("the mount's session was ended while its backlog committed (row: {age:?})")
            });
            oldest = oldest.max(Duration::from_nanos(age));
            let before = answered.load(std::sync::atomic::Ordering::SeqCst);
            if listing.is_none() && before >= listed_at {
                let asked = std::time::Instant::now();
                let names = sorted_names(&b.path("d"));
                listing = Some((before, names, asked.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let took = started.elapsed();
        writer.join().unwrap();
        eprintln!(
            "{files} creates committed in {took:?}; the heartbeat was at most {oldest:?} old"
        );
        assert_eq!(a.counter("async_backlog"), 0, "the backlog never committed");
        assert!(
            took > Duration::from_secs(15),
            "the creates committed in {took:?}: the trigger did not slow them past the session expiry"
        );
        // Its interval is 2 s, a batch of 256 creates takes 1.3 s here, and the expiry is
        // 15 s: the margin is for a busy machine's stalls.
        assert!(
            oldest < Duration::from_secs(10),
            "the mount's heartbeat was {oldest:?} old while its backlog committed"
        );
        let (before, names, waited) = listing.expect("never listed");
        eprintln!("the other mount's listing after {before} creates took {waited:?}");
        let missing: Vec<String> = (0..before)
            .map(|i| format!("f{i}"))
            .filter(|name| names.binary_search(name).is_err())
            .collect();
        assert!(
            missing.is_empty(),
            "the other mount's listing misses {} of the {before} names answered before it",
            missing.len()
        );
        assert!(
            waited < Duration::from_secs(8),
            "the listing waited {waited:?}"
        );
        server.psql("vol", "DROP TRIGGER slow_inodes ON inodes");
        a.unmount();
        assert_eq!(sorted_names(&b.path("d")).len(), files);
        b.unmount();
        volume.assert_clean();
    }

    /// A mount that starts as soon as the database server is back from an outage longer
    /// than the session expiry does not end the sessions of the mounts that lived through
    /// it: their heartbeats are stale only because they could not beat (before, it ended
    /// them, which fenced them: EIO for every change until a remount). The live mount is
    /// stopped while the new one starts, so that its reconnect cannot beat first.
    #[test]
    fn a_mount_started_right_after_a_long_database_outage_ends_no_live_session() {
        let Some(volume) = Volume::format_on_postgres("outage") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&[]);
        create_fsynced(&a.path("before"), b"before").unwrap();
        let signal = |sig: &str| run_ok(Command::new("kill").arg(sig).arg(a.pid.to_string()));
        server.stop();
        signal("-STOP");
        std::thread::sleep(Duration::from_secs(17));
        server.start_again();
        let b = volume.mount(&[]);
        signal("-CONT");
        create_fsynced(&a.path("after"), b"after")
            .expect("the mount that lived through the outage was fenced");
        assert_eq!(std::fs::read(b.path("after")).unwrap(), b"after");
        assert_eq!(server.psql("vol", "SELECT count(*) FROM sessions"), "2");
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Two mounts whose wall clocks are a minute apart (one runs under faketime, 60 s
    /// ahead) share the volume as mounts on one clock do, since both time sessions and
    /// leases by the database server's clock: the one ahead recalls the other's live
    /// directory lease instead of taking it as expired (which would leave the other
    /// answering from a listing that misses its names), and does not end the other's live
    /// session as stale (which would fence it: every change EIO). `lanefs status` run with
    /// the clock ahead calls no live session stopped.
    #[test]
    fn mounts_whose_clocks_are_a_minute_apart_keep_leases_and_sessions() {
        let Some(volume) = Volume::format_on_postgres("skew") else {
            return;
        };
        // libfaketime preloaded as is: the `faketime` wrapper would outlive the daemon and
        // hold its output open. The monotonic clock stays true (timeouts keep their length).
        const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
        const AHEAD: &[&str] = &[
            "env",
            "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
            "FAKETIME=+60s",
            "FAKETIME_DONT_FAKE_MONOTONIC=1",
        ];
        assert!(
            Path::new(FAKETIME_LIB).exists(),
            "this test needs {FAKETIME_LIB} (Debian's faketime; scripts/setup.sh installs it)"
        );
        let server = volume.server();
        let a = volume.mount(&[]);
        let intent_dir = volume.intent_dir();
        let b = common::Mount::start_wrapped(
            AHEAD,
            volume.source(),
            &["--intent-dir", intent_dir.to_str().unwrap()],
        );
        let b_mounted = std::time::Instant::now();
        // b's wall clock is ahead: the mtime it gives a file shows it.
        std::fs::write(b.path("probe"), b"b").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let ahead = std::fs::metadata(a.path("probe")).unwrap().mtime() - now;
        assert!(
            ahead >= 50,
            "faketime did not move b's clock ({ahead} s ahead)"
        );

        std::fs::create_dir(a.path("d")).unwrap();
        for i in 0..20 {
            std::fs::write(a.path(&format!("d/a-{i}")), b"a").unwrap();
        }
        assert!(a.counter("leases_taken") > 0);
        std::fs::write(b.path("d/b-0"), b"b").unwrap();
        assert!(
            b.counter("waits_for_other_mounts_leases") > 0,
            "b took a's live lease on d without recalling it"
        );
        let listed = |m: &common::Mount| sorted_names(&m.path("d"));
        let mut expected: Vec<String> = (0..20).map(|i| format!("a-{i}")).collect();
        expected.push("b-0".into());
        expected.sort();
        assert_eq!(listed(&a), expected, "a's listing of d");
        assert_eq!(listed(&b), expected, "b's listing of d");

        // Past the expiry as b judges it (b ends stale sessions once it has itself been
        // beating for SESSION_EXPIRY = 15 s, every 2 s): a's session lives on.
        let past_expiry = Duration::from_secs(22);
        std::thread::sleep(past_expiry.saturating_sub(b_mounted.elapsed()));
        assert_eq!(
            server.psql("vol", "SELECT count(*) FROM sessions"),
            "2",
            "a session was ended while its mount was live"
        );
        for (m, name) in [(&a, "a-late"), (&b, "b-late")] {
            let mut f = std::fs::File::create(m.path(name)).unwrap();
            f.write_all(b"late").unwrap();
            f.sync_all()
                .unwrap_or_else(|e| panic!("fsync of {name} after the expiry: {e}"));
        }
        let status = run_ok(
            Command::new(AHEAD[0])
                .args(&AHEAD[1..])
                .arg(common::lanefs())
                .arg("status")
                .arg(volume.source()),
        );
        assert!(!status.contains("heartbeat stopped"), "{status}");
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// PostgreSQL stopped (as a crash: immediate) and started again while files are written
    /// and fsynced: operations wait for it (or fail), every file whose fsync returned is
    /// there byte for byte, and writes go on by themselves once it is back.
    #[test]
    fn a_postgres_restart_in_the_middle_of_writes_loses_nothing_fsynced() {
        restart_in_the_middle_of_writes(&[]);
    }

    /// The same with commits that do not wait for PostgreSQL's WAL flush: an fsync's does.
    #[test]
    fn with_async_commits_a_postgres_restart_loses_nothing_fsynced() {
        restart_in_the_middle_of_writes(&["--async-commit"]);
    }

    fn restart_in_the_middle_of_writes(mount_args: &[&str]) {
        let Some(volume) = Volume::format_on_postgres("restart") else {
            return;
        };
        let m = volume.mount(mount_args);
        let dir = m.path("w");
        std::fs::create_dir(&dir).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (dir, stop, acked, failed) =
                (dir.clone(), stop.clone(), acked.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = dir.join(format!("f{i}"));
                    let written = std::fs::File::create(&p).and_then(|mut f| {
                        f.write_all(&content(i, size_of(i)))?;
                        f.sync_all()
                    });
                    match written {
                        Ok(()) => acked.lock().unwrap().push(i),
                        Err(_) => {
                            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    i += 1;
                }
            })
        };
        std::thread::sleep(Duration::from_millis(700));
        let before = acked.lock().unwrap().len();
        volume.server().restart(Duration::from_secs(1));
        let resumed = wait_until(Duration::from_secs(30), || {
            acked.lock().unwrap().len() > before + 20
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(resumed, "writes did not resume after PostgreSQL came back");
        let acked = acked.lock().unwrap().clone();
        eprintln!(
            "{} files fsynced ({before} before the restart), {} failed",
            acked.len(),
            failed.load(std::sync::atomic::Ordering::Relaxed)
        );
        m.unmount();
        let m = volume.mount(&[]);
        for i in &acked {
            let got = std::fs::read(m.path(&format!("w/f{i}")))
                .unwrap_or_else(|e| panic!("fsynced file {i} after the restart: {e}"));
            assert!(got == content(*i, size_of(*i)), "fsynced file {i} differs");
        }
        m.unmount();
        // A write that failed while PostgreSQL was away may have left its blocks to gc.
        volume.assert_clean_after_gc();
    }

    /// Inode numbers past 2^32 (a long-lived shared volume's) go through every statement:
    /// PostgreSQL binds each parameter to the type it inferred for it, which must never be
    /// a 32-bit one for a number.
    #[test]
    fn inode_numbers_past_32_bits_work() {
        let Some(volume) = Volume::format_on_postgres("bigino") else {
            return;
        };
        let big: u64 = (1 << 40) + 7;
        volume.server().psql(
            "vol",
            &format!("UPDATE counters SET value = {big} WHERE name = 'next_inode'"),
        );
        let m = volume.mount(&[]);
        std::fs::create_dir_all(m.path("a/sub")).unwrap();
        std::fs::create_dir(m.path("b")).unwrap();
        std::fs::write(m.path("a/sub/f"), b"data").unwrap();
        assert!(std::fs::metadata(m.path("a/sub/f")).unwrap().ino() >= big);
        std::fs::hard_link(m.path("a/sub/f"), m.path("b/g")).unwrap();
        std::fs::rename(m.path("a/sub"), m.path("b/sub")).unwrap();
        assert_eq!(
            std::fs::metadata(m.path("b/sub/..")).unwrap().ino(),
            std::fs::metadata(m.path("b")).unwrap().ino(),
            "a moved directory's .. does not follow it"
        );
        xattr_set(&m.path("b/g"), "user.k", b"v");
        std::fs::remove_file(m.path("b/sub/f")).unwrap();
        assert_eq!(std::fs::read(m.path("b/g")).unwrap(), b"data");
        std::fs::remove_dir(m.path("b/sub")).unwrap();
        std::fs::remove_dir(m.path("a")).unwrap();
        m.unmount();
        volume.assert_clean();
    }

    fn xattr_set(path: &Path, name: &str, value: &[u8]) {
        run_ok(
            Command::new("setfattr")
                .args(["-n", name, "-v", std::str::from_utf8(value).unwrap()])
                .arg(path),
        );
    }

    /// What format, mount and fsck refuse on PostgreSQL, each with one sentence.
    #[test]
    fn bad_urls_and_databases_are_refused_with_one_sentence() {
        let Some(volume) = Volume::format_on_postgres("refusals") else {
            return;
        };
        let server = volume.server();
        let url = volume.source();
        let data = volume.dir.path().join("other-data");
        let out = lanefs(&["format", url, "--data", data.to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("add --force"), "{}", stderr(&out));
        let with_password = url.replace("postgres@", "postgres:secret@");
        let out = lanefs(&["format", &with_password, "--data", data.to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("PGPASSWORD") && !stderr(&out).contains("secret"),
            "{}",
            stderr(&out)
        );
        let other = server.createdb("notavolume");
        let mnt = TempDir::new("pg-refusal-mnt");
        let out = lanefs(&["mount", &other, mnt.path().to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("is a PostgreSQL database but not a lanefs volume"),
            "{}",
            stderr(&out)
        );
        let m = volume.mount(&[]);
        // The mount's source shows the URL as given (it has no password).
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(mounts.contains(&format!("{url} {}", m.mountpoint.display())));
        let out = lanefs(&["fsck", url]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("is mounted"), "{}", stderr(&out));
        let out = lanefs(&["dump", url]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("does not work on a volume on PostgreSQL yet"),
            "{}",
            stderr(&out)
        );
        m.unmount();
        volume.assert_clean();
    }

    /// `flock -n PATH true` from a separate process: whether it got the lock at once.
    fn flock_free(path: &Path) -> bool {
        Command::new("flock")
            .arg("-n")
            .arg(path)
            .arg("true")
            .status()
            .unwrap()
            .success()
    }

    /// Two processes holding shared flocks of one file (one on each mount) that both ask
    /// to upgrade to an exclusive one: one gets it at once, the other once the first lets
    /// go, as on Linux, where a conversion drops the old lock before it waits. (Before,
    /// each upgrade kept its shared lock while it waited for the other's: both waited for
    /// ever.)
    #[test]
    fn two_shared_flocks_upgrading_at_once_both_get_it_in_turn() {
        let Some(volume) = Volume::format_on_postgres("flock-upgrade") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"x").unwrap();
        let upgrader = |path: PathBuf| {
            use std::os::unix::process::CommandExt;
            Command::new("bash")
                .process_group(0)
                .arg("-c")
                .arg("exec 9<\"$1\" && flock -s 9 && sleep 0.5 && flock -x 9 && echo got && sleep 0.5")
                .arg("upgrader")
                .arg(path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let mut both = [upgrader(a.path("f")), upgrader(b.path("f"))];
        let ended = wait_until(Duration::from_secs(10), || {
            both.iter_mut().all(|p| p.try_wait().unwrap().is_some())
        });
        for p in &both {
            // SAFETY: kill(2) of the process group the upgrader leads; no memory is passed.
            unsafe { libc::kill(-(p.id() as i32), libc::SIGKILL) };
        }
        let got: Vec<String> = both
            .into_iter()
            .map(|p| String::from_utf8_lossy(&p.wait_with_output().unwrap().stdout).into_owned())
            .collect();
        assert!(ended, "the two upgrades waited for each other: {got:?}");
        assert_eq!(got, ["got\n", "got\n"]);
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    fn flock_ex(file: &std::fs::File) -> i32 {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor the File owns; no memory is passed.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }
    }

    /// F_SETLK (`cmd` F_SETLK or F_GETLK) of `typ` on [start, start + len) through `file`;
    /// the call's result (errno on failure) and the lock structure as the kernel left it.
    fn fcntl_lock(
        file: &std::fs::File,
        cmd: i32,
        typ: i32,
        start: i64,
        len: i64,
    ) -> (Result<(), i32>, libc::flock) {
        use std::os::fd::AsRawFd;
        // SAFETY: an all-zero flock is a valid value of the plain C struct.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = typ as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = start;
        fl.l_len = len;
        // SAFETY: fcntl with a lock command and a pointer to a flock we own for the call.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
        let result = if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        };
        (result, fl)
    }

    /// flock taken through one mount holds on the other: `flock -n` there fails while it is
    /// held, a blocking `flock` there waits and gets it once the first is closed.
    #[test]
    fn flock_holds_across_mounts() {
        let Some(volume) = Volume::format_on_postgres("flock") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"x").unwrap();
        let held = std::fs::File::open(a.path("f")).unwrap();
        assert_eq!(flock_ex(&held), 0);
        assert!(!flock_free(&b.path("f")), "b took a flock that a holds");
        // A second open on a (another open file) conflicts too.
        let other = std::fs::File::open(a.path("f")).unwrap();
        assert_eq!(flock_ex(&other), -1);
        drop(other);
        // A waiter killed while it waits goes at once (INTERRUPT answers it EINTR); the
        // kernel would otherwise hold the dying process until the lock came free.
        let mut killed = Command::new("flock")
            .arg(b.path("f"))
            .arg("true")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(killed.try_wait().unwrap().is_none());
        killed.kill().unwrap();
        assert!(
            wait_until(Duration::from_secs(3), || killed
                .try_wait()
                .unwrap()
                .is_some()),
            "a waiting flock killed with SIGKILL did not exit while the lock was held"
        );
        let mut waiter = Command::new("flock")
            .arg(b.path("f"))
            .arg("true")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "a blocking flock on b returned while a holds the lock"
        );
        drop(held);
        let got = wait_until(Duration::from_secs(5), || {
            waiter.try_wait().unwrap().is_some()
        });
        assert!(
            got,
            "a blocking flock on b did not get the lock after a closed"
        );
        assert!(waiter.wait().unwrap().success());
        // A flock goes with the RELEASE of its open file, which the kernel sends after
        // close(2) returned (it keeps no flock of its own to drop there, the server holds
        // them): each probe's lock may still be there for a moment after it exited, so the
        // next probe waits for it (CI: b's probe's RELEASE came after a's probe ran).
        let free_soon = |path: &Path| wait_until(Duration::from_secs(5), || flock_free(path));
        assert!(free_soon(&b.path("f")));
        assert!(free_soon(&a.path("f")));
        let server = volume.server();
        assert!(
            wait_until(Duration::from_secs(5), || server
                .psql("vol", "SELECT count(*) FROM locks")
                == "0"),
            "flocks left in the table after every holder closed"
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// POSIX record locks: a write lock through one mount makes F_SETLK on an overlapping
    /// range through the other fail with EAGAIN (and a disjoint one succeed), F_GETLK there
    /// reports it, and closing the file (FLUSH) releases it.
    #[test]
    fn posix_locks_conflict_across_mounts() {
        let Some(volume) = Volume::format_on_postgres("posix") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), vec![0u8; 4096]).unwrap();
        let rw = |p: PathBuf| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap()
        };
        let on_a = rw(a.path("f"));
        let on_b = rw(b.path("f"));
        assert_eq!(
            fcntl_lock(&on_a, libc::F_SETLK, libc::F_WRLCK, 100, 100).0,
            Ok(())
        );
        assert_eq!(
            fcntl_lock(&on_b, libc::F_SETLK, libc::F_RDLCK, 150, 10).0,
            Err(libc::EAGAIN),
            "b took a read lock inside a's write lock"
        );
        assert_eq!(
            fcntl_lock(&on_b, libc::F_SETLK, libc::F_WRLCK, 200, 50).0,
            Ok(())
        );
        let (r, fl) = fcntl_lock(&on_b, libc::F_GETLK, libc::F_WRLCK, 0, 0);
        assert_eq!(r, Ok(()));
        assert_eq!(
            fl.l_type,
            libc::F_WRLCK as i16,
            "F_GETLK on b misses a's lock"
        );
        assert_eq!((fl.l_start, fl.l_len), (100, 100));
        // a unlocks half of its range: b gets that half, not the other.
        assert_eq!(
            fcntl_lock(&on_a, libc::F_SETLK, libc::F_UNLCK, 100, 50).0,
            Ok(())
        );
        assert_eq!(
            fcntl_lock(&on_b, libc::F_SETLK, libc::F_WRLCK, 100, 50).0,
            Ok(())
        );
        assert_eq!(
            fcntl_lock(&on_b, libc::F_SETLK, libc::F_WRLCK, 150, 1).0,
            Err(libc::EAGAIN)
        );
        // Closing a's file drops its locks (FLUSH with its lock owner).
        drop(on_a);
        assert_eq!(
            fcntl_lock(&on_b, libc::F_SETLK, libc::F_WRLCK, 0, 0).0,
            Ok(())
        );
        let (_, fl) = fcntl_lock(&rw(a.path("f")), libc::F_GETLK, libc::F_RDLCK, 0, 0);
        assert_eq!(
            fl.l_type,
            libc::F_WRLCK as i16,
            "F_GETLK on a misses b's lock"
        );
        drop(on_b);
        let server = volume.server();
        assert_eq!(server.psql("vol", "SELECT count(*) FROM locks"), "0");
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// A blocking flock killed (SIGKILL) at any moment of its wait ends at once. Once the
    /// kernel has sent its INTERRUPT it waits for the answer uninterruptibly, and before,
    /// an INTERRUPT that came while the request was still at its first try (a commit) was
    /// dropped: the killed process hung, unkillable, until the holder let go.
    #[test]
    fn a_lock_wait_killed_at_any_moment_ends_at_once() {
        let Some(volume) = Volume::format_on_postgres("lock-kill") else {
            return;
        };
        let a = volume.mount(&[]);
        std::fs::write(a.path("f"), b"x").unwrap();
        let held = std::fs::File::open(a.path("f")).unwrap();
        assert_eq!(flock_ex(&held), 0);
        let mut stuck = Vec::new();
        for i in 0..150u64 {
            let mut waiter = Command::new("flock")
                .arg(a.path("f"))
                .arg("true")
                .spawn()
                .unwrap();
            // From before its request is sent to well into its wait, most often around its
            // first try.
            std::thread::sleep(Duration::from_micros(100 * (i % 50)));
            waiter.kill().unwrap();
            // A hung one ends only when the holder lets go, so a bound well past a busy
            // machine's delays loses nothing (2 s failed once in a full run here).
            if !wait_until(Duration::from_secs(10), || {
                waiter.try_wait().unwrap().is_some()
            }) {
                stuck.push(waiter);
            }
        }
        let hung = stuck.len();
        // The holder lets go: whatever hung gets its answer, and ends.
        drop(held);
        for mut waiter in stuck {
            waiter.wait().unwrap();
        }
        assert_eq!(
            hung, 0,
            "of 150 killed flock waits, {hung} hung until the holder let go"
        );
        a.unmount();
        volume.assert_clean();
    }

    /// A lock whose release failed (the database gone past `--db-wait` when its owner
    /// closed the file) goes at the file's last close on the mount, once the database is
    /// back. Before, the owner was forgotten at the failed release and nothing tried again:
    /// the lock stayed until the mount ended, and no other mount could take it.
    #[test]
    fn a_lock_whose_release_failed_goes_at_the_last_close() {
        let Some(volume) = Volume::format_on_postgres("lock-release") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&["--db-wait", "1"]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"x").unwrap();
        // Another process keeps the file open on a until its stdin closes.
        let mut keeper = Command::new("bash")
            .arg("-c")
            .arg("exec 8<\"$1\" && read -r _")
            .arg("keeper")
            .arg(a.path("f"))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let locker = std::fs::File::open(a.path("f")).unwrap();
        assert_eq!(flock_ex(&locker), 0);
        assert!(!flock_free(&b.path("f")));
        server.stop();
        // Its RELEASE (after the close) lets the flock go: that fails after the 1 s wait.
        drop(locker);
        std::thread::sleep(Duration::from_secs(3));
        server.start_again();
        assert!(
            !flock_free(&b.path("f")),
            "the release during the outage went through"
        );
        drop(keeper.stdin.take());
        keeper.wait().unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || flock_free(&b.path("f"))),
            "the lock whose release failed outlived the file's last close"
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// One user blocking on a lock from many processes fills at most a quarter of the
    /// mount's wait list: another user's blocking lock still waits, and gets the lock once
    /// it is let go, instead of failing with ENOLCK at once. (Before, 256 waiters of one
    /// user shut every other user out of blocking locks on the mount.)
    #[test]
    fn one_users_lock_waiters_leave_room_for_anothers() {
        let Some(volume) = Volume::format_on_postgres("lock-users") else {
            return;
        };
        let a = volume.mount(&[]);
        let f = a.path("f");
        std::fs::write(&f, b"x").unwrap();
        let holder = std::fs::File::open(&f).unwrap();
        assert_eq!(flock_ex(&holder), 0);
        let flock_as = |uid: u32, args: &[&str]| {
            Command::new("setpriv")
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .args(["--clear-groups", "flock"])
                .args(args)
                .arg(&f)
                .args(["echo", "got"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("setpriv and flock are installed")
        };
        let mut flooders: Vec<_> = (0..256).map(|_| flock_as(65534, &[])).collect();
        // Those past the user's share fail at once; the others wait.
        let waiting = |flooders: &mut Vec<std::process::Child>| {
            flooders
                .iter_mut()
                .map(|c| usize::from(c.try_wait().unwrap().is_none()))
                .sum::<usize>()
        };
        wait_until(Duration::from_secs(10), || waiting(&mut flooders) <= 64);
        std::thread::sleep(Duration::from_millis(500));
        let flooding = waiting(&mut flooders);
        let mut other = flock_as(65533, &["-w", "60"]);
        std::thread::sleep(Duration::from_secs(1));
        let refused = other.try_wait().unwrap().is_some();
        drop(holder);
        let got = other.wait_with_output().unwrap();
        for child in flooders {
            child.wait_with_output().unwrap();
        }
        assert!(
            !refused,
            "another user's blocking lock was refused with {flooding} of one user's waiting"
        );
        assert_eq!(String::from_utf8_lossy(&got.stdout), "got\n");
        assert!(flooding <= 64, "{flooding} of one user's requests waited");
        a.unmount();
        volume.assert_clean();
    }

    /// Another process's open and close of a locked file leaves the lock (and an OFD lock
    /// of another open) in place. Before, every open whose reads move no atime (all of
    /// them under noatime) shared handle 0, and the RELEASE of any of them dropped the
    /// POSIX locks last taken through any other, as if they were that open's OFD locks.
    #[test]
    fn another_processs_close_of_a_locked_file_keeps_the_lock() {
        let Some(volume) = Volume::format_on_postgres("lock-handles") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::write(a.path("f"), vec![0u8; 4096]).unwrap();
        let rw = |p: PathBuf| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap()
        };
        let held = rw(a.path("f"));
        assert_eq!(
            fcntl_lock(&held, libc::F_SETLK, libc::F_WRLCK, 0, 100).0,
            Ok(())
        );
        let ofd = rw(a.path("f"));
        assert_eq!(
            fcntl_lock(&ofd, libc::F_OFD_SETLK, libc::F_WRLCK, 1000, 100).0,
            Ok(())
        );
        // Another process opens, reads and closes the file on the same mount.
        run_ok(
            Command::new("cat")
                .arg(a.path("f"))
                .stdout(std::process::Stdio::null()),
        );
        let on_b = rw(b.path("f"));
        for (start, what) in [(0, "the POSIX lock"), (1000, "the OFD lock")] {
            assert_eq!(
                fcntl_lock(&on_b, libc::F_SETLK, libc::F_WRLCK, start, 10).0,
                Err(libc::EAGAIN),
                "{what} was dropped by another process's close"
            );
        }
        drop(held);
        drop(ofd);
        // The OFD lock goes at its open's RELEASE, which the kernel sends after the close.
        assert!(
            wait_until(Duration::from_secs(5), || fcntl_lock(
                &on_b,
                libc::F_SETLK,
                libc::F_WRLCK,
                0,
                0
            )
            .0 == Ok(())),
            "the locks outlived their closes"
        );
        drop(on_b);
        assert_eq!(
            volume.server().psql("vol", "SELECT count(*) FROM locks"),
            "0"
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    #[test]
    fn a_killed_mounts_locks_go_with_its_session() {
        let Some(volume) = Volume::format_on_postgres("lockexpiry") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"x").unwrap();
        let held = std::fs::File::open(a.path("f")).unwrap();
        assert_eq!(flock_ex(&held), 0);
        assert!(!flock_free(&b.path("f")));
        assert_eq!(server.psql("vol", "SELECT count(*) FROM locks"), "1");
        common::kill_daemon_leaving_a_dead_mount(a.pid, &a.mountpoint);
        drop(held);
        drop(a);
        wait_for_sessions(&volume, 1);
        assert_eq!(server.psql("vol", "SELECT count(*) FROM locks"), "0");
        assert!(
            flock_free(&b.path("f")),
            "the dead mount's flock still holds"
        );
        b.unmount();
        volume.assert_clean();
    }

    /// A shared volume of format 1 is upgraded by its first mount; a second mount then
    /// finds it current, and locks work across them.
    #[test]
    fn a_format_1_volume_is_upgraded_at_mount() {
        let Some(volume) = Volume::format_on_postgres("v1") else {
            return;
        };
        let server = volume.server();
        server.psql("vol", super::BACK_TO_FORMAT_1);
        assert_eq!(
            server.psql("vol", "SELECT max(version) FROM schema_migrations"),
            "1"
        );
        let a = volume.mount(&[]);
        assert_eq!(
            server.psql("vol", "SELECT max(version) FROM schema_migrations"),
            NEWEST_FORMAT.to_string()
        );
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"x").unwrap();
        let held = std::fs::File::open(a.path("f")).unwrap();
        assert_eq!(flock_ex(&held), 0);
        assert!(!flock_free(&b.path("f")));
        drop(held);
        // close() does not wait for the RELEASE that lets the flock go (the kernel sends it
        // after the close returned).
        assert!(wait_until(Duration::from_secs(5), || flock_free(
            &b.path("f")
        )));
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Close-to-open for a file that stays open on b: an open on b after a's close sees
    /// a's bytes, though b's first open loaded the file before a wrote (a's write is a
    /// slice over a block b still has, so only a stale view could read the old bytes).
    #[test]
    fn an_open_sees_another_mounts_close_while_the_file_is_open_already() {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let Some(volume) = Volume::format_on_postgres("reopen") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        let mut data = content(5, 2 * 1024 * KIB);
        std::fs::write(a.path("f"), &data).unwrap();
        let held = std::fs::File::open(b.path("f")).unwrap();
        let mut first = vec![0; 4096];
        held.read_exact_at(&mut first, 0).unwrap();
        assert!(first == data[..4096]);
        let patch = b"written on a while b had the file open";
        let on_a = std::fs::OpenOptions::new()
            .write(true)
            .open(a.path("f"))
            .unwrap();
        on_a.write_all_at(patch, 100).unwrap();
        drop(on_a);
        data[100..100 + patch.len()].copy_from_slice(patch);
        // O_DIRECT: read from b's daemon, not from pages b's kernel may still hold.
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(b.path("f"))
            .unwrap();
        let mut read = vec![0; data.len()];
        reopened.read_exact_at(&mut read, 0).unwrap();
        assert!(
            read[..4096] == data[..4096],
            "an open on b after a's close read {:?}",
            String::from_utf8_lossy(&read[100..100 + patch.len()])
        );
        assert!(read == data);
        drop((held, reopened));
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Close-to-open for a small file b made and wrote in a directory it holds the lease
    /// of, and keeps open: b's close queued the bytes' commit without waiting and kept them
    /// in memory, where they stayed after the commit; an open on b after a rewrote the
    /// file (recalling the lease) read b's old bytes from there, at b's old size.
    #[test]
    fn an_open_sees_another_mounts_rewrite_of_a_file_it_wrote_early() {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let Some(volume) = Volume::format_on_postgres("reopen-early") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::create_dir(b.path("d")).unwrap();
        let written = std::fs::File::create(b.path("d/f")).unwrap();
        let held = std::fs::File::open(b.path("d/f")).unwrap();
        (&written).write_all(b"written on b").unwrap();
        drop(written);
        let rewrite = b"rewritten on a, longer than b's";
        std::fs::write(a.path("d/f"), rewrite).unwrap();
        // O_DIRECT: read from b's daemon, not from pages b's kernel may still hold.
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(b.path("d/f"))
            .unwrap();
        let mut read = vec![0; 4096];
        let n = (&reopened).read(&mut read).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&read[..n]),
            String::from_utf8_lossy(rewrite),
            "an open on b after a's rewrite"
        );
        drop((held, reopened));
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// chattr flags are the volume's, not a mount's: what root sets on one mount is
    /// enforced on the other within the change log's poll (each mount loaded them once,
    /// at its start, and never again), and a change on the other holds on the first.
    #[test]
    fn chattr_flags_set_on_one_mount_hold_on_the_other() {
        let Some(volume) = Volume::format_on_postgres("chattr") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::write(a.path("f"), b"kept").unwrap();
        let chattr = |p: PathBuf, change: &str| {
            let out = Command::new("chattr").arg(change).arg(&p).output().unwrap();
            assert!(out.status.success(), "chattr {change}: {}", stderr(&out));
        };
        let opens_for_writing = |p: PathBuf| match std::fs::OpenOptions::new().write(true).open(p) {
            Ok(_) => Ok(()),
            Err(e) => Err(e.raw_os_error()),
        };
        chattr(a.path("f"), "+i");
        assert!(
            wait_until(Duration::from_secs(3), || {
                opens_for_writing(b.path("f")) == Err(Some(libc::EPERM))
            }),
            "b opens for writing a file a made immutable"
        );
        assert!(std::fs::remove_file(b.path("f")).is_err());
        chattr(b.path("f"), "-i");
        assert!(
            wait_until(Duration::from_secs(3), || opens_for_writing(a.path("f"))
                .is_ok()),
            "a still refuses a file b made mutable again"
        );
        assert_eq!(std::fs::read(a.path("f")).unwrap(), b"kept");
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// An O_CREAT open on b of a name b's kernel holds as free (a negative entry) that a
    /// has just taken: b's kernel sent CREATE, and b's daemon opened a's file and answered
    /// as if it had made it, so the kernel skipped the permission check: nobody got a
    /// read-write descriptor of root's 0600 file. Now the kernel looks the name up again
    /// and opens it as open(2) does.
    #[test]
    fn an_o_creat_open_of_a_name_another_mount_just_took_checks_permissions() {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let Some(volume) = Volume::format_on_postgres("creat-race") else {
            return;
        };
        let a = volume.mount(&[]);
        let b = volume.mount(&[]);
        std::fs::create_dir(a.path("shared")).unwrap();
        std::fs::set_permissions(a.path("shared"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        let mut opened = Vec::new();
        for i in 0..20 {
            let name = format!("shared/secret{i}");
            // A negative entry on b, kept for the entry timeout.
            assert!(!b.path(&name).exists());
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(a.path(&name))
                .unwrap()
                .write_all(b"secret")
                .unwrap();
            let script = format!("exec 3<> '{}'", b.path(&name).display());
            if common::sh_as(65534, 65534, &script).status.success() {
                opened.push(i);
            }
        }
        assert!(
            opened.is_empty(),
            "nobody opened root's 0600 files read-write on b: {opened:?}"
        );
        for i in 0..20 {
            let name = format!("shared/secret{i}");
            assert_eq!(std::fs::read(b.path(&name)).unwrap(), b"secret");
        }
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Another mount changes a directory's group, set-group-ID bit and default ACL while
    /// this mount creates files in it under its lease: each change recalls the lease, and
    /// the files this mount creates once the change returned take the new group and the
    /// new default ACL's mode, on both mounts: those created during the cooldown after the
    /// recall (their transaction reads the directory's default ACL again) and those created
    /// under the lease taken again after it (the take makes this mount read the directory
    /// again). A holder that kept answering from its own record of the directory gave them
    /// the old ones until that record aged.
    #[test]
    fn a_directorys_attribute_change_on_another_mount_recalls_its_lease() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let Some(volume) = Volume::format_on_postgres("dir-attrs") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::write(a.path("d/before"), b"x").unwrap();
        let group_and_mode = |m: &common::Mount, name: &str| {
            let meta = std::fs::metadata(m.path(&format!("d/{name}"))).unwrap();
            (meta.gid(), meta.mode() & 0o7777)
        };
        // A file's mode without a default ACL: 0666 less the umask.
        let plain = group_and_mode(&a, "before").1;
        let setfacl = |args: &[&str]| {
            common::run_ok(
                std::process::Command::new("setfacl")
                    .args(args)
                    .arg(b.path("d")),
            );
        };
        let chgrp = |gid: u32| {
            std::os::unix::fs::chown(b.path("d"), None, Some(gid)).unwrap();
            std::fs::set_permissions(b.path("d"), std::fs::Permissions::from_mode(0o2777)).unwrap();
        };
        type Change<'a> = Box<dyn Fn() + 'a>;
        let rounds: [(Change, (u32, u32)); 5] = [
            (Box::new(|| chgrp(4321)), (4321, plain)),
            (Box::new(|| chgrp(4322)), (4322, plain)),
            (
                Box::new(|| setfacl(&["-d", "-m", "u::rw,g::r,o::-"])),
                (4322, 0o640),
            ),
            (
                Box::new(|| setfacl(&["-d", "-m", "u::rw,g::-,o::-"])),
                (4322, 0o600),
            ),
            (Box::new(|| setfacl(&["-k"])), (4322, plain)),
        ];
        let recalls_before = a.counter("leases_let_go_at_recall");
        let mut expected_before = (0, plain);
        for (round, (change, expected)) in rounds.iter().enumerate() {
            // a answers creates in d early again: the cooldown after the last recall is over.
            let mut warm = 0;
            assert!(
                common::wait_until(Duration::from_secs(10), || {
                    let early = a.counter("async_dirops");
                    warm += 1;
                    std::fs::write(a.path(&format!("d/warm{round}-{warm}")), b"x").unwrap();
                    a.counter("async_dirops") > early
                }),
                "a never answered a create in d early again"
            );
            // Made under the lease a took again: the state before this round's change
            // (looked at on a: a look on b would recall the lease).
            if round > 0 {
                assert_eq!(
                    group_and_mode(&a, &format!("warm{round}-{warm}")),
                    expected_before,
                    "round {round}: a file created under a's new lease"
                );
            }
            change();
            for i in 0..30 {
                std::fs::write(a.path(&format!("d/round{round}-{i}")), b"x").unwrap();
            }
            for i in [0, 29] {
                let file = format!("round{round}-{i}");
                for m in [&a, &b] {
                    assert_eq!(
                        group_and_mode(m, &file),
                        *expected,
                        "{file}'s group and mode on {}",
                        m.mountpoint.display()
                    );
                }
            }
            expected_before = *expected;
        }
        let round_count = rounds.len() as u64;
        drop(rounds);
        // Each change recalled a's lease.
        assert!(
            a.counter("leases_let_go_at_recall") >= recalls_before + round_count,
            "a let go {} leases at recalls",
            a.counter("leases_let_go_at_recall") - recalls_before
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Another mount's chmod of a directory that takes away a user's write permission while
    /// this mount answers that user's creates there early, under its lease: the user's
    /// creates stop within the bound of the kernel's attribute cache and the change-log
    /// poll. (The chmod also recalls the lease, so that this mount's own record of the
    /// directory, which answers the kernel's permission checks while creates there are
    /// pending, goes; here the commits keep up, and the record goes without the recall too.)
    #[test]
    fn a_directorys_chmod_on_another_mount_stops_creates_there_within_a_bound() {
        use std::os::unix::fs::PermissionsExt;
        let Some(volume) = Volume::format_on_postgres("chmod-recall") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::set_permissions(a.path("d"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = a.path("d");
        let script = format!(
            "i=0; while [ $i -lt 50000 ]; do true > '{}'/f$i 2>/dev/null || exit 3; i=$((i+1)); done",
            dir.display()
        );
        let creating = std::thread::spawn(move || {
            let status = common::sh_as(65534, 65534, &script).status;
            (status, std::time::Instant::now())
        });
        assert!(
            common::wait_until(Duration::from_secs(10), || a.counter("async_dirops") > 200),
            "the creates of uid 65534 were not answered early"
        );
        std::fs::set_permissions(b.path("d"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let changed = std::time::Instant::now();
        let (status, ended) = creating.join().unwrap();
        assert_eq!(status.code(), Some(3), "the creates never failed");
        let after = ended.saturating_duration_since(changed);
        assert!(
            after < Duration::from_secs(3),
            "creates went on for {after:?} after the chmod returned"
        );
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// A create that takes its directory's lease after another mount changed the directory's
    /// default ACL, before this mount heard of the change (its change-log poll comes every
    /// 100 ms, and it remembers the default ACL for the attribute timeout): the create is
    /// answered early with the mode the new default ACL gives, read under the lease, not the
    /// one this mount remembered.
    #[test]
    fn a_create_that_takes_the_lease_inherits_the_default_acl_under_it() {
        use std::os::unix::fs::MetadataExt;
        let Some(volume) = Volume::format_on_postgres("acl-take") else {
            return;
        };
        let a = volume.mount(&["--noatime", "-o", "attr_timeout=60,entry_timeout=60"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::write(a.path("d/before"), b"x").unwrap();
        let mode =
            |m: &common::Mount, name: &str| std::fs::metadata(m.path(name)).unwrap().mode() & 0o777;
        let plain = mode(&a, "d/before");
        assert_ne!(plain, 0o640);
        // b's look in d recalls a's lease; past the cooldown after it, a may take it again.
        assert!(b.path("d/before").exists());
        std::thread::sleep(Duration::from_millis(2500));
        common::run_ok(
            std::process::Command::new("setfacl")
                .args(["-d", "-m", "u::rw,g::r,o::-"])
                .arg(b.path("d")),
        );
        let early = a.counter("async_dirops");
        std::fs::write(a.path("d/after"), b"x").unwrap();
        assert!(a.counter("async_dirops") > early, "not answered early");
        assert_eq!(mode(&a, "d/after"), 0o640, "the mode a answered");
        assert_eq!(mode(&b, "d/after"), 0o640, "the mode stored");
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// Creates answered early commit in batches in which a directory's row, locked by the
    /// batch's first create there, is updated by the others without waiting for the answer,
    /// as is a new file's row by its bytes: the directory's link count and times as a
    /// answers them (from its own copy of the row) are the database's, which b reads, the
    /// files' bytes are there, and fsck finds the link counts right.
    #[test]
    fn creates_committed_together_leave_the_directory_as_their_statements_do() {
        use std::os::unix::fs::MetadataExt;
        let Some(volume) = Volume::format_on_postgres("unwaited") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        std::fs::create_dir(a.path("d")).unwrap();
        std::fs::write(a.path("d/first"), b"takes the lease").unwrap();
        // Held back from their commit, so that they commit together after.
        let held = volume
            .server()
            .hold("vol", "LOCK TABLE entries IN EXCLUSIVE MODE");
        for i in 0..400 {
            if i % 4 == 0 {
                std::fs::create_dir(a.path(&format!("d/sub{i}"))).unwrap();
            } else {
                std::fs::write(a.path(&format!("d/f{i}")), format!("file {i}")).unwrap();
            }
        }
        assert!(a.counter("async_backlog") > 0, "nothing was pending");
        drop(held);
        // An fsync of the directory waits for the changes in it to commit.
        std::fs::File::open(a.path("d"))
            .unwrap()
            .sync_all()
            .unwrap();
        assert!(
            a.counter("commit_updates_unwaited") > 0,
            "no batch sent an update without waiting for it"
        );
        // As a's daemon answers them (the kernel's and the overlay's copies are older).
        let on_a = statx_of_the_store(&a.path("d"));
        let on_b = std::fs::metadata(b.path("d")).unwrap();
        assert_eq!((on_a.stx_nlink, on_b.nlink()), (102, 102));
        let time = |t: libc::statx_timestamp| (t.tv_sec, i64::from(t.tv_nsec));
        assert_eq!(
            (time(on_a.stx_mtime), time(on_a.stx_ctime)),
            (
                (on_b.mtime(), on_b.mtime_nsec()),
                (on_b.ctime(), on_b.ctime_nsec())
            )
        );
        for i in (1..400).filter(|i| i % 4 != 0) {
            assert_eq!(
                std::fs::read(b.path(&format!("d/f{i}"))).unwrap(),
                format!("file {i}").as_bytes()
            );
        }
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// A file open on b while a rewrites it: a frees the blocks b's view of the file still
    /// names. b's next read of them reads the file's view again from the database and
    /// returns a's bytes (close-to-open asks no more of an open file, and no less than the
    /// bytes that were there: never EIO).
    #[test]
    fn a_read_of_blocks_another_mount_replaced_reads_the_new_ones() {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let Some(volume) = Volume::format_on_postgres("replaced") else {
            return;
        };
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        let old = content(3, 3 * 1024 * KIB);
        std::fs::write(a.path("f"), &old).unwrap();
        let old_blocks = block_files(&volume.data);
        assert!(old_blocks.len() >= 3, "{old_blocks:?}");
        // O_DIRECT: every read reaches b's daemon, none is answered from b's page cache.
        let on_b = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(b.path("f"))
            .unwrap();
        let new = content(4, old.len());
        std::fs::OpenOptions::new()
            .write(true)
            .open(a.path("f"))
            .unwrap()
            .write_all_at(&new, 0)
            .unwrap();
        let freed = wait_until(Duration::from_secs(10), || {
            old_blocks.iter().all(|path| !path.exists())
        });
        assert!(
            freed,
            "a kept the blocks it replaced: {:?}",
            block_files(&volume.data)
        );
        let mut read = vec![0; old.len()];
        on_b.read_exact_at(&mut read, 0)
            .expect("reading on b blocks that a replaced");
        assert!(read == new, "b read other bytes than a wrote");
        drop(on_b);
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }

    /// A file unlinked on one mount while open on another stays readable there until that
    /// close (the other mount holds the orphan), and is freed after it; an unlinked file no
    /// mount has open is freed after the grace period.
    #[test]
    fn a_file_unlinked_on_one_mount_stays_readable_where_it_is_open() {
        let Some(volume) = Volume::format_on_postgres("unlinked") else {
            return;
        };
        let server = volume.server();
        let a = volume.mount(&["--noatime"]);
        let b = volume.mount(&["--noatime"]);
        let data = content(7, 3 * 1024 * KIB);
        std::fs::write(a.path("f"), &data).unwrap();
        // Opened, nothing read: every byte must come from the blocks after the unlink.
        let mut on_b = std::fs::File::open(b.path("f")).unwrap();
        std::fs::remove_file(a.path("f")).unwrap();
        std::fs::write(a.path("g"), &data).unwrap();
        std::fs::remove_file(a.path("g")).unwrap();
        // Past the grace period and two heartbeats (sweeps) of a.
        std::thread::sleep(Duration::from_secs(7));
        let mut read = Vec::new();
        std::io::Read::read_to_end(&mut on_b, &mut read).expect("reading on b what a unlinked");
        assert!(read == data, "b read other bytes from the file a unlinked");
        assert_eq!(server.psql("vol", "SELECT count(*) FROM orphans"), "1");
        assert_eq!(server.psql("vol", "SELECT count(*) FROM holds"), "1");
        drop(on_b);
        let freed = wait_until(Duration::from_secs(10), || {
            server.psql("vol", "SELECT count(*) FROM orphans") == "0"
        });
        assert!(freed, "the unlinked file was not freed after b closed it");
        assert_eq!(server.psql("vol", "SELECT count(*) FROM holds"), "0");
        a.unmount();
        b.unmount();
        volume.assert_clean();
    }
}

/// Bytes written through a shared mapping after close(2) (munmap writes them back, after
/// the FLUSH, before the RELEASE) are what an open racing with that RELEASE reads, from
/// another CPU, and what is stored: the last release flushes them while its open still
/// counts, so a new open shares that state rather than reading the record without them.
#[test]
fn bytes_mapped_after_close_are_read_by_an_open_racing_the_release() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // Chunked files and inline ones (committed early) in turn.
    let len = |i: u8| if i.is_multiple_of(2) { 256 * KIB } else { 3000 };
    let volume = Volume::format("mmap-after-close");
    let m = volume.mount(&[]);
    let pin = common::pin_to_cpu;
    let (to_reader, files) = std::sync::mpsc::channel::<(PathBuf, u8, usize)>();
    let (to_writer, verdicts) = std::sync::mpsc::channel::<Result<(), String>>();
    let reader = std::thread::spawn(move || {
        pin(1);
        for (path, fill, len) in files {
            // O_DIRECT: read from the daemon, not from pages the mapping left cached.
            let got = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .and_then(|mut f| {
                    let mut got = Vec::new();
                    std::io::Read::read_to_end(&mut f, &mut got).map(|_| got)
                })
                .map_err(|e| e.to_string());
            let verdict = got.and_then(|got| match got.iter().position(|&b| b != fill) {
                None if got.len() == len => Ok(()),
                None => Err(format!("{} bytes", got.len())),
                Some(at) => Err(format!("byte {at} is {} (fill {fill})", got[at])),
            });
            to_writer.send(verdict).unwrap();
        }
    });
    pin(0);
    for i in 0..60u8 {
        let path = m.path(&format!("mapped-{i}"));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let n = len(i);
        f.set_len(n as u64).unwrap();
        // SAFETY: a fresh shared mapping of n bytes of an open file, unmapped below; the
        // slice is used only while it is mapped.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(at, libc::MAP_FAILED, "mmap");
            drop(f);
            std::slice::from_raw_parts_mut(at as *mut u8, n).fill(i + 1);
            assert_eq!(libc::munmap(at, n), 0, "munmap");
        }
        to_reader.send((path, i + 1, n)).unwrap();
        if let Err(why) = verdicts.recv().unwrap() {
            panic!("mapped-{i}, read by an open racing its release: {why}");
        }
    }
    drop(to_reader);
    reader.join().unwrap();
    m.unmount();
    let m = volume.mount(&[]);
    for i in 0..60u8 {
        let got = std::fs::read(m.path(&format!("mapped-{i}"))).unwrap();
        assert!(
            got.len() == len(i) && got.iter().all(|&b| b == i + 1),
            "mapped-{i} after a remount"
        );
    }
    m.unmount();
    volume.assert_clean();
}

/// A chmod that sets the set-user-ID bit of a file another user is writing, with
/// asynchronous direct writes in flight (the kernel releases the inode's lock once they are
/// sent, so they reach the daemon alongside the chmod): the writes that follow drop the bit,
/// as natively. A write that read the mode while the chmod was being committed must not
/// leave this mount remembering the file as without set-ID bits.
#[test]
fn writes_racing_a_chmod_that_sets_set_user_id_drop_it() {
    let volume = Volume::format("setid-race");
    let m = volume.mount(&[]);
    let f = m.path("shared");
    std::fs::write(&f, vec![7u8; MIB]).unwrap();
    let mode = |bits: u32| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(bits));
    use std::os::unix::fs::PermissionsExt;
    mode(0o666).unwrap();
    let mut writer = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "fio"])
        .args(["--name=w", "--rw=randwrite", "--bs=4k", "--direct=1"])
        .args([
            "--ioengine=libaio",
            "--iodepth=16",
            "--size=1M",
            "--time_based",
        ])
        .args(["--runtime=8", "--output-format=terse"])
        .arg(format!("--filename={}", f.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("setpriv and fio are installed");
    std::thread::sleep(Duration::from_millis(500));
    // Rounds for 4 s of fio's 8, each waiting up to 500 ms for a write to drop the bit (a
    // fixed 80 ms was not always enough on a loaded machine: fio as nobody may not write
    // in that time, and then the bit is rightly still set; under the mount's 1 s write-back
    // tick, so that only a write can have dropped it).
    let started = std::time::Instant::now();
    let mut round = 0;
    while round < 25 && started.elapsed() < Duration::from_secs(4) {
        mode(0o4666).unwrap();
        let mode_now = || std::fs::metadata(&f).unwrap().mode();
        let dropped = wait_until(Duration::from_millis(500), || {
            mode_now() & libc::S_ISUID == 0
        });
        assert!(
            writer.try_wait().unwrap().is_none(),
            "fio as nobody ended before round {round}"
        );
        assert!(
            dropped,
            "round {round}: 500 ms of writes by nobody after chmod 04666 kept the \
             set-user-ID bit (mode {:o})",
            mode_now()
        );
        round += 1;
    }
    assert!(writer.wait().unwrap().success(), "fio as nobody failed");
    m.unmount();
    volume.assert_clean();
}
