//! lanefs's volume: a file system whose metadata lives in a [`meta::MetaStore`] (SQLite now,
//! PostgreSQL next) and whose file data lives as immutable blocks in an object store (a local
//! directory now, S3 next). See ARCHITECTURE.md, "Volume".

pub mod blocks;
pub mod dump;
pub mod file;
pub mod fs;
pub mod fsck;
pub mod meta;
pub mod schema;
pub mod sqlite;
pub mod volume;

/// Now, in nanoseconds since the epoch (0 if the clock is before it).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}
