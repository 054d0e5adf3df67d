//! The volume's one SQL schema, for SQLite and PostgreSQL alike, and its migrations.
//!
//! Integer columns are `BIGINT` and byte strings `BYTES`; a store replaces `BYTES` with its
//! engine's name (`BLOB`, `BYTEA`) before running a step. Each step is applied once, in order,
//! and recorded in `schema_migrations`; a database whose newest step is above [`FORMAT_VERSION`]
//! was made by a newer lanefs and is refused.

/// The newest schema step this binary knows; also the volume's format version.
pub const FORMAT_VERSION: i64 = 5;

/// Step 1: the whole first schema (see ARCHITECTURE.md, "Volume", for what each table is).
const STEP_1: &str = "
CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE sessions (
    id BIGINT PRIMARY KEY, host TEXT NOT NULL, pid BIGINT NOT NULL, mountpoint TEXT NOT NULL,
    started_ns BIGINT NOT NULL, heartbeat_ns BIGINT NOT NULL);
CREATE TABLE inode_ranges (
    start_ino BIGINT PRIMARY KEY, end_ino BIGINT NOT NULL, session BIGINT NOT NULL);
CREATE TABLE inodes (
    ino BIGINT PRIMARY KEY, mode BIGINT NOT NULL, uid BIGINT NOT NULL, gid BIGINT NOT NULL,
    rdev BIGINT NOT NULL, nlink BIGINT NOT NULL, size BIGINT NOT NULL,
    atime_ns BIGINT NOT NULL, mtime_ns BIGINT NOT NULL, ctime_ns BIGINT NOT NULL,
    parent BIGINT NOT NULL, inline_data BYTES);
CREATE TABLE entries (
    parent BIGINT NOT NULL, name BYTES NOT NULL, ino BIGINT NOT NULL, kind BIGINT NOT NULL,
    PRIMARY KEY (parent, name));
CREATE TABLE symlinks (ino BIGINT PRIMARY KEY, target BYTES NOT NULL);
CREATE TABLE xattrs (
    ino BIGINT NOT NULL, name BYTES NOT NULL, value BYTES NOT NULL, PRIMARY KEY (ino, name));
CREATE TABLE chunks (
    ino BIGINT NOT NULL, idx BIGINT NOT NULL, block BIGINT NOT NULL, len BIGINT NOT NULL,
    crc BIGINT NOT NULL, PRIMARY KEY (ino, idx));
CREATE INDEX chunks_by_block ON chunks (block);
CREATE TABLE gc_blocks (block BIGINT PRIMARY KEY, since_ns BIGINT NOT NULL);
CREATE TABLE orphans (ino BIGINT PRIMARY KEY, session BIGINT NOT NULL);
CREATE TABLE changes (
    seq BIGINT PRIMARY KEY, ino BIGINT NOT NULL, parent BIGINT NOT NULL, name BYTES,
    kind BIGINT NOT NULL, at_ns BIGINT NOT NULL);
CREATE TABLE leases (
    dir BIGINT PRIMARY KEY, session BIGINT NOT NULL, epoch BIGINT NOT NULL,
    expires_ns BIGINT NOT NULL);
";

/// Step 2: flock and POSIX locks held across the mounts of a shared volume (issue 14). A row
/// is one granted lock: `kind` 1 = flock, 2 = POSIX; `typ` F_RDLCK / F_WRLCK; the range
/// [lock_start, lock_end] inclusive (flock: the whole file); `owner` the kernel's lock owner,
/// unique within its session only. Also a file unlinked on one mount while open on others:
/// `holds` (ino, session) says a mount still has the orphan open, and `orphans.since_ns`
/// when it lost its last name on a shared volume (0: a single mount's orphan, freed at its
/// last close), so that it is freed only a grace period later with no holds left.
const STEP_2: &str = "
CREATE TABLE locks (
    ino BIGINT NOT NULL, session BIGINT NOT NULL, owner BIGINT NOT NULL, kind BIGINT NOT NULL,
    typ BIGINT NOT NULL, lock_start BIGINT NOT NULL, lock_end BIGINT NOT NULL,
    pid BIGINT NOT NULL);
CREATE INDEX locks_by_ino ON locks (ino);
CREATE INDEX locks_by_session ON locks (session);
CREATE TABLE holds (ino BIGINT NOT NULL, session BIGINT NOT NULL, PRIMARY KEY (ino, session));
ALTER TABLE orphans ADD COLUMN since_ns BIGINT NOT NULL DEFAULT 0;
";

/// Step 3: directory leases of a shared volume (issue 15). A row is one directory's lease:
/// `session` holds it until `expires_ns` (renewed by its heartbeat); another mount that needs
/// the directory sets `recalled`, and the holder commits what it answered early there and
/// lets go. A row with `session` 0 is no lease: the directory was let go after a recall, and
/// nobody takes it before `expires_ns` (so that two mounts working in one directory do not
/// hand it back and forth on every change).
const STEP_3: &str = "
ALTER TABLE leases ADD COLUMN recalled BIGINT NOT NULL DEFAULT 0;
CREATE INDEX leases_by_session ON leases (session);
";

/// Step 4: slices (issue 13's compaction). A chunk's bytes are its base block (`chunks`,
/// none for a hole) overlaid, in `seq` order, by slices: [pos, pos + len) of the chunk read
/// from the first `len` bytes of `block` (whose whole object `crc` covers). A flush that
/// rewrote a small part of a stored chunk (an fsync'd 8 KiB append of a database's log)
/// stores just that part as a slice instead of a new 1 MiB block; a flush of a chunk with
/// `file::SLICES_PER_CHUNK_MAX` slices writes a new base instead, which drops them
/// (compaction). `seq` orders a chunk's slices by commit: each is max + 1 of its chunk's,
/// under the inode row's lock that every data commit takes first.
const STEP_4: &str = "
CREATE TABLE slices (
    ino BIGINT NOT NULL, idx BIGINT NOT NULL, seq BIGINT NOT NULL, pos BIGINT NOT NULL,
    len BIGINT NOT NULL, block BIGINT NOT NULL, crc BIGINT NOT NULL,
    PRIMARY KEY (ino, idx, seq));
CREATE INDEX slices_by_block ON slices (block);
";

/// Step 5: intent logs (issue 15). A row is one session's log of changes answered before
/// their commit, kept on local disk at `path` on `host`; which of them are finished
/// (`intent::Watermark`: every number up to `applied`, and the numbers listed in `above`,
/// separated by commas), written in the same transaction as the batch that committed them,
/// so a replay after a crash applies exactly the others. Only a mount on the log's machine
/// replays it and drops the row (after the file), so another machine's cleanup of a dead
/// session leaves the row alone.
const STEP_5: &str = "
CREATE TABLE intent_logs (
    session BIGINT PRIMARY KEY, host TEXT NOT NULL, path TEXT NOT NULL,
    applied BIGINT NOT NULL, above TEXT NOT NULL);
";

/// Every step, in order: `STEPS[i]` takes the schema from version `i` to `i + 1`.
pub const STEPS: &[&str] = &[STEP_1, STEP_2, STEP_3, STEP_4, STEP_5];

/// The step's text for an engine whose byte-string type is `bytes`.
pub fn step_for(step: &str, bytes: &str) -> String {
    step.replace("BYTES", bytes)
}

const _: () = assert!(STEPS.len() as i64 == FORMAT_VERSION);

/// Settings names.
pub mod setting {
    pub const FORMAT_VERSION: &str = "format_version";
    pub const UUID: &str = "uuid";
    pub const DATA: &str = "data";
    pub const CHUNK_BYTES: &str = "chunk_bytes";
    pub const INLINE_MAX_BYTES: &str = "inline_max_bytes";
    pub const CREATED_NS: &str = "created_ns";
}

/// Counter names.
pub mod counter {
    pub const NEXT_INODE: &str = "next_inode";
    pub const NEXT_SESSION: &str = "next_session";
}
