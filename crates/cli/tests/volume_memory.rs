//! The memory a volume's unflushed writes hold: the writeback that stores what waited, and
//! the mount's cap on it. These tests watch counters that any FLUSH of their open files
//! would change, and every close of a copy of a descriptor is one: a fork by another test of
//! the same process (its child holds copies of every open descriptor until it execs or
//! exits) would commit their files' writes under them. So they live in a binary of their
//! own and take turns (`SERIAL`).

mod common;

use std::process::Command;
use std::sync::Mutex;

use common::volume::Volume;

static SERIAL: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A file kept open and written without fsync or close (a log, a download in progress) is
/// stored by the writeback within seconds of its first unflushed write: a kill -9 of the
/// daemon after that loses none of it. (Before the writeback, such bytes stayed in the
/// daemon's memory until the close, however long that took.) Each writer is a shell that
/// opens its file as its standard output, writes with the `printf` builtin and execs
/// `sleep`: it holds the file open without ever closing a copy of its descriptor, which
/// would be a FLUSH, and commit the writes itself (a fork's exit, a redirection's undoing).
#[test]
fn bytes_kept_open_unsynced_are_stored_by_the_writeback() {
    let _serial = one_at_a_time();
    let volume = Volume::format("writeback");
    let m = volume.mount(&[]);
    let hold_open = |name: &str, writes: &str| {
        Command::new("sh")
            .args([
                "-c",
                &format!(r#"exec >"$1"; {writes}; exec sleep 600"#),
                "sh",
            ])
            .arg(m.path(name))
            .spawn()
            .unwrap()
    };
    // 3 MiB in 48 writes of 64 KiB: chunks; and 4 bytes kept inline.
    let mut writers = [
        hold_open(
            "log",
            "s=0123456789abcdef; for _ in 1 2 3 4 5 6 7 8 9 10 11 12; do s=$s$s; done; \
             i=0; while [ $i -lt 48 ]; do printf %s \"$s\"; i=$((i + 1)); done",
        ),
        hold_open("note", "printf note"),
    ];
    let expect_log = b"0123456789abcdef".repeat(48 << 12);
    let written = common::wait_until(std::time::Duration::from_secs(30), || {
        std::fs::metadata(m.path("log")).is_ok_and(|md| md.len() == expect_log.len() as u64)
            && std::fs::metadata(m.path("note")).is_ok_and(|md| md.len() == 4)
    });
    assert!(written, "the shells did not write their files");
    // Both files whole in the store: two flushes, and nothing left in memory (one flush
    // of the log could have come while the shell was still writing it).
    let stored = common::wait_until(std::time::Duration::from_secs(30), || {
        m.counter("writeback_flushes") >= 2 && m.counter("dirty_held_bytes") == 0
    });
    let counters = m.stats()["counters"].clone();
    common::kill_9_and_wait(m.pid);
    for writer in &mut writers {
        let _ = writer.kill();
        let _ = writer.wait();
    }
    assert!(
        stored,
        "the writeback did not store the two open files in 30 s: {counters}"
    );
    drop(m);
    let m = volume.mount(&[]);
    assert!(
        std::fs::read(m.path("log")).unwrap() == expect_log,
        "the open file's bytes were lost with the daemon"
    );
    assert_eq!(std::fs::read(m.path("note")).unwrap(), b"note");
    m.unmount();
    volume.assert_clean();
}

/// The mount's cap on memory held by unflushed writes (`-o dirty_max`): files each under
/// their own limit, written together, make the writer that takes the mount past the cap
/// wait for the writeback (`dirty_cap_waits`); so do 4 KiB writes spread a chunk apart,
/// which hold a whole 1 MiB chunk each. The memory held stays under the cap, and every byte
/// is there after a remount.
#[test]
fn writers_wait_at_the_mounts_cap_on_unflushed_memory() {
    let _serial = one_at_a_time();
    use std::os::unix::fs::FileExt;
    const MIB: usize = 1 << 20;
    const CAP: u64 = 16 << 20;
    let volume = Volume::format("dirty-cap");
    let m = volume.mount(&["-o", "dirty_max=16M"]);
    assert_eq!(m.counter("dirty_cap_bytes"), CAP);
    let files: Vec<std::fs::File> = (0..6)
        .map(|i| std::fs::File::create(m.path(&format!("f{i}"))).unwrap())
        .collect();
    let block = |file: usize, i: usize| common::content(file * 100 + i, MIB);
    for i in 0..8 {
        for (n, file) in files.iter().enumerate() {
            file.write_all_at(&block(n, i), (i * MIB) as u64).unwrap();
            let held = m.counter("dirty_held_bytes");
            assert!(held <= CAP, "{held} bytes held past a cap of {CAP}");
        }
    }
    let waits = m.counter("dirty_cap_waits");
    assert!(
        waits >= 1,
        "48 MiB written under a 16 MiB cap and no writer waited"
    );
    // Then one small write in each chunk of every file, over the stored bytes.
    for i in 0..8 {
        for file in &files {
            file.write_all_at(b"spread", (i * MIB + 4096) as u64)
                .unwrap();
            let held = m.counter("dirty_held_bytes");
            assert!(held <= CAP, "{held} bytes held past a cap of {CAP}");
        }
    }
    assert!(
        m.counter("dirty_cap_waits") > waits,
        "48 chunks touched by small writes under a 16 MiB cap and no writer waited"
    );
    drop(files);
    m.unmount();
    let m = volume.mount(&[]);
    for n in 0..6 {
        let got = std::fs::read(m.path(&format!("f{n}"))).unwrap();
        assert_eq!(got.len(), 8 * MIB);
        for i in 0..8 {
            let mut want = block(n, i);
            want[4096..4096 + 6].copy_from_slice(b"spread");
            assert!(
                got[i * MIB..(i + 1) * MIB] == want[..],
                "f{n}: MiB {i} differs"
            );
        }
    }
    m.unmount();
    volume.assert_clean();
}
