//! lanefs's volume: a file system whose metadata lives in a [`meta::MetaStore`] (SQLite for
//! one mount, PostgreSQL for many) and whose file data lives as immutable blocks in an object
//! store (a local directory or an S3 bucket). See ARCHITECTURE.md, "Volume".

pub mod acl;
pub mod blocks;
pub mod dirops;
pub mod dump;
pub mod file;
pub mod fs;
pub mod fsck;
pub mod intent;
pub mod leases;
pub mod location;
pub mod meta;
pub mod ops;
pub mod postgres;
pub mod schema;
pub mod sql;
pub mod sqlite;
pub mod store;
pub mod volume;

/// Now, in nanoseconds since the epoch (0 if the clock is before it).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// What tests of durability observe.
#[cfg(test)]
mod testing {
    /// cachestat(2)'s answer (Linux 6.5+; not in the libc crate for x86_64 yet).
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat {
        cached: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;

    /// Pages of `path` the page cache holds and has not yet written to the disk.
    pub fn unwritten_pages(path: &std::path::Path) -> u64 {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).unwrap();
        let range = [0u64, 0u64]; // offset 0, length 0: the whole file
        let mut stat = CacheStat::default();
        // SAFETY: cachestat reads `range` (two u64) and fills `stat` (five u64); both live
        // across the call, and the fd is open.
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
        stat.dirty + stat.writeback
    }
}
