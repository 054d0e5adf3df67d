//! Timestamps after writes through a shared mapping (issue 17 item 5), side by side with
//! native tmpfs. With kernel passthrough the mapping is the host file's: its mtime and ctime
//! move at the write fault and msync goes to the host, so nothing reaches the daemon, and
//! the old code let the kernel keep showing the attributes it had cached before the write.

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use common::sys;
use common::{Mount, Tmpfs};

const LEN: usize = 8192;

/// Writes through a shared mapping of `path` and says, after each step, whether mtime and
/// ctime moved: a write then msync, a write without msync, a write then msync to an
/// already-written page, and a write then munmap and close.
fn mapped_write_pattern(path: &Path) -> Vec<(bool, bool)> {
    std::fs::write(path, vec![0u8; LEN]).unwrap();
    let fd = sys::open(path, libc::O_RDWR, 0).unwrap();
    // SAFETY: a fresh shared mapping of LEN bytes of an fd open for reading and writing.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let map = map.cast::<u8>();
    let times = |st: libc::stat| (st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec);
    let moved = |a: (i64, i64, i64, i64), b: (i64, i64, i64, i64)| {
        ((a.0, a.1) != (b.0, b.1), (a.2, a.3) != (b.2, b.3))
    };
    let mut seen = Vec::new();
    for (step, (offset, sync)) in [(0, true), (1, false), (2, true)].into_iter().enumerate() {
        let before = times(sys::stat(path).unwrap());
        // Timestamps come from a coarse clock: let it tick.
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: offset < LEN, inside the mapping.
        unsafe { map.add(offset).write_volatile(step as u8 + 1) };
        if sync {
            // SAFETY: map is the start of a LEN-byte mapping.
            assert_eq!(unsafe { libc::msync(map.cast(), LEN, libc::MS_SYNC) }, 0);
        }
        seen.push(moved(before, times(sys::fstat(&fd).unwrap())));
    }
    let before = times(sys::stat(path).unwrap());
    std::thread::sleep(Duration::from_millis(30));
    // SAFETY: inside the mapping, which is then unmapped once.
    unsafe {
        map.add(LEN - 1).write_volatile(9);
        assert_eq!(libc::munmap(map.cast(), LEN), 0);
    }
    drop(fd);
    seen.push(moved(before, times(sys::stat(path).unwrap())));
    let mut data = std::fs::read(path).unwrap();
    data.truncate(3);
    assert_eq!(data, [1, 2, 3]);
    seen
}

#[test]
fn mapped_writes_move_mtime_and_ctime_as_on_tmpfs() {
    let native = Tmpfs::new("16M");
    let expected = mapped_write_pattern(&native.path.join("f"));
    assert_eq!(expected[0], (true, true), "tmpfs: {expected:?}");
    let source = Tmpfs::new("16M");
    // A long attribute timeout: the kernel must not answer stat from what it cached.
    let m = Mount::passthrough(&source.path, &["--attr-timeout", "60"]);
    let got = mapped_write_pattern(&m.path("f"));
    assert_eq!(got, expected, "lanefs (kernel passthrough) vs tmpfs");
    m.unmount();
}

/// The volume serves every write itself: the kernel writes the mapping's dirty pages back
/// (WRITE) at msync and at munmap + close, and the times it then shows are the volume's.
/// They move at each msync after a write and at munmap + close, as the issue asks and as
/// on a disk file system; tmpfs, which has no page_mkwrite, leaves them alone at a second
/// msync of a page written again (step 2), so the pattern is not compared with it.
#[test]
fn mapped_writes_move_mtime_and_ctime_on_the_volume() {
    let volume = common::volume::Volume::format("mmap");
    let m = volume.mount(&["--attr-timeout", "60"]);
    let got = mapped_write_pattern(&m.path("f"));
    assert_eq!(got[0], (true, true), "{got:?}");
    assert_eq!(got[2], (true, true), "{got:?}");
    assert_eq!(got[3], (true, true), "{got:?}");
    m.unmount();
    volume.assert_clean();
}

/// Without kernel passthrough the kernel writes the mapping's dirty pages back to the daemon
/// (WRITE), so the host's times move at msync or close rather than at the first write fault;
/// what a caller sees after msync and after munmap + close is the same as natively.
#[test]
fn mapped_writes_move_mtime_without_kernel_passthrough() {
    let source = Tmpfs::new("16M");
    let m = Mount::passthrough(&source.path, &["--no-passthrough", "--attr-timeout", "60"]);
    let got = mapped_write_pattern(&m.path("f"));
    assert_eq!(got[0], (true, true), "{got:?}");
    assert_eq!(got[3], (true, true), "{got:?}");
    m.unmount();
}
