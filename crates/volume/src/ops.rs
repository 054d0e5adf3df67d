//! Every metadata operation's transaction logic, written once over [`Tx`] for both engines.
//! Reads take any connection; changes take the committer's [`Writer`] inside a transaction
//! (they may be run again when PostgreSQL gives up on the transaction, so they read
//! everything they decide on inside it and change rows relative to what is there:
//! `nlink = nlink - 1 … RETURNING nlink`, never a count read earlier).

use crate::acl;
use crate::meta::*;
use crate::schema::counter;
use crate::sql::{Arg, DbError, Row, Tx, args};
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

/// Inode numbers taken from the counter at a time (one row in `inode_ranges` each).
pub const INODE_RANGE: u64 = 1024;
/// A change-log row's seq is its session << this | the session's own count, so each
/// session's rows are in its commit order (one committer) and need no shared counter.
pub const CHANGE_SEQ_SESSION_SHIFT: u32 = 40;
/// A session's change-log rows are deleted (by its heartbeat) once this old: the other mounts
/// read them within a poll interval; one that has not by then has lost contact anyway.
pub const CHANGE_LOG_KEEP_NS: i64 = 60_000_000_000;

// `col = CAST(? AS BIGINT)` where a statement also has an ORDER BY: SQLite (3.4x) plans such
// a statement by the value bound to a plain `col = ?` and prepares it again whenever the
// binding changes, which rusqlite's statement cache does at every use (clearing bindings):
// every OPEN's chunk and slice reads, every LISTXATTR and READDIR were parsed and planned
// anew (5 % of a worker's time in `cp -a` off a volume; test
// `reads_are_never_prepared_again`). The cast makes the value opaque to the planner, the
// index is used the same, and PostgreSQL takes the cast as the parameter's type.

/// An inode's columns as `attr_from_row` reads them; a macro so that the statements below are
/// `const` text (no string is built per lookup or getattr).
macro_rules! attr_columns {
    () => {
        "i.ino, i.mode, i.uid, i.gid, i.rdev, i.nlink, i.size, i.atime_ns, i.mtime_ns, i.ctime_ns, i.parent"
    };
}
const GETATTR_SQL: &str = concat!("SELECT ", attr_columns!(), " FROM inodes i WHERE i.ino = ?");
/// How many inodes one `GETATTRS_SQL` or `XATTR_NAMES_SQL` reads (unused places are given
/// inode 0, which no inode has): a fixed count, so that each statement is prepared once per
/// connection.
const INODES_PER_STATEMENT: usize = 64;
/// `IN (?, ?, …)` with `INODES_PER_STATEMENT` places.
fn inode_places() -> String {
    vec!["?"; INODES_PER_STATEMENT].join(", ")
}
/// The records of up to `INODES_PER_STATEMENT` inodes (a READDIRPLUS answer's entries).
static GETATTRS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM inodes i WHERE i.ino IN ({})",
        attr_columns!(),
        inode_places()
    )
});
/// The xattr names of up to `INODES_PER_STATEMENT` inodes.
static XATTR_NAMES_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT ino, name FROM xattrs WHERE ino IN ({})",
        inode_places()
    )
});
/// `attr_columns!`'s count: the column after them is at this index.
const ATTR_COLUMN_COUNT: usize = 11;
/// An open's read of a file: its attributes and inline bytes in one row.
const LOAD_FILE_SQL: &str = concat!(
    "SELECT ",
    attr_columns!(),
    ", i.inline_data FROM inodes i WHERE i.ino = ?"
);
/// The same columns, unqualified, for a RETURNING clause of a statement on `inodes`.
macro_rules! returning_attr_columns {
    () => {
        " RETURNING ino, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns, ctime_ns, parent"
    };
}
/// A change of a directory's entries: its times (and link count), its row as left.
const TOUCH_DIR_RETURNING_SQL: &str = concat!(
    "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE ino = ? AND nlink > 0",
    returning_attr_columns!()
);
/// `TOUCH_DIR_RETURNING_SQL` without its answer.
const TOUCH_DIR_SQL: &str =
    "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE ino = ? AND nlink > 0";
/// Another session's lease on a directory, live at a time: (dir, me, at_ns). A change that
/// must not pass other mounts' leases runs it as a statement of its own after the one that
/// took the directory's row lock: on PostgreSQL each statement reads what committed before
/// it began, so it sees a lease whose take held that lock first (`take_lease` takes it),
/// which a condition inside the locking statement would not.
const FOREIGN_LEASE_SQL: &str =
    "SELECT session FROM leases WHERE dir = ? AND session <> 0 AND session <> ? AND expires_ns > ?";
/// A directory's default ACL, as its xattr holds it (None: it has none).
type DefaultAcl = Option<Vec<u8>>;

/// An inode's xattr's value: (ino, name).
const XATTR_VALUE_SQL: &str = "SELECT value FROM xattrs WHERE ino = ? AND name = ?";
/// A row if the directory `?` (4th) is the directory `?` (1st) or one of its ancestors: the
/// walk up the `parent` column stops at the root (2nd) or at that directory (3rd), and after
/// 100,000 steps should a damaged volume hold a loop.
const ANCESTOR_SQL: &str = "WITH RECURSIVE up (ino, depth) AS (
         SELECT CAST(? AS BIGINT), 0
         UNION ALL
         SELECT i.parent, up.depth + 1 FROM inodes i JOIN up ON i.ino = up.ino
         WHERE up.ino <> ? AND up.ino <> ? AND up.depth < 100000)
     SELECT 1 FROM up WHERE ino = ? LIMIT 1";
/// Takes a directory's row lock (see `Writer::entries_locked`).
const LOCK_DIR_SQL: &str = "UPDATE inodes SET nlink = nlink WHERE ino = ? AND nlink > 0";
/// The inode and mode a name holds; a subquery, not a join: see `LOOKUP_SQL`.
const ENTRY_SQL: &str = "SELECT i.ino, i.mode FROM inodes i
     WHERE i.ino = (SELECT ino FROM entries WHERE parent = ? AND name = ?)";
// A subquery, not a join: SQLite marks a join's parameters as able to change its plan, and
// then re-prepares the statement each time rusqlite's cache clears its bindings (16 µs a
// lookup instead of 2.5 µs, measured).
const LOOKUP_SQL: &str = concat!(
    "SELECT ",
    attr_columns!(),
    " FROM inodes i WHERE i.ino = (SELECT ino FROM entries WHERE parent = ? AND name = ?)"
);
// `lookup` and `foreign_lease` of the name's directory in one statement, for a shared
// volume (one round trip on PostgreSQL instead of two): the row tagged 0 is the name's
// inode, if any; the one tagged 1 holds the session with a live lease on the directory
// other than the caller's, if any (its other columns are fillers).
const LOOKUP_AND_LEASE_SQL: &str = concat!(
    "SELECT 0, ",
    attr_columns!(),
    " FROM inodes i WHERE i.ino = (SELECT ino FROM entries WHERE parent = ? AND name = ?)",
    " UNION ALL SELECT 1, session, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 FROM leases",
    " WHERE dir = ? AND session <> 0 AND session <> ? AND expires_ns > ?"
);
const READDIR_SQL: &str = concat!(
    "SELECT e.name, e.kind, ",
    attr_columns!(),
    " FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = CAST(? AS BIGINT) ORDER BY e.name"
);
/// A directory's names and their inodes, at most `?` of them (no attributes: see
/// `names_in`).
const NAMES_IN_SQL: &str =
    "SELECT name, ino FROM entries WHERE parent = CAST(? AS BIGINT) LIMIT CAST(? AS BIGINT)";
const LIST_XATTRS_SQL: &str = "SELECT name FROM xattrs WHERE ino = CAST(? AS BIGINT) ORDER BY name";
const CHUNKS_SQL: &str =
    "SELECT idx, block, len, crc FROM chunks WHERE ino = CAST(? AS BIGINT) ORDER BY idx";
const SLICES_SQL: &str =
    "SELECT idx, pos, len, block, crc FROM slices WHERE ino = CAST(? AS BIGINT) ORDER BY idx, seq";
/// A slice laid over the chunk's others (CAST: as `CHUNKS_SQL`'s; a max() over a key prefix
/// is planned by the bound values too).
const INSERT_SLICE_SQL: &str = "INSERT INTO slices (ino, idx, seq, pos, len, block, crc)
     SELECT ?, ?, coalesce(max(seq), 0) + 1, ?, ?, ?, ? FROM slices
     WHERE ino = CAST(? AS BIGINT) AND idx = CAST(? AS BIGINT)";
/// Hands every block of an inode's chunks and slices to gc and drops their rows, in one
/// statement (a small file's close on a shared volume, where four took a quarter of its
/// commit's statements). Data-modifying CTEs are PostgreSQL's: shared volumes only.
const DROP_EVERY_BLOCK_SHARED_SQL: &str =
    "WITH c AS (DELETE FROM chunks WHERE ino = ? RETURNING block),
          s AS (DELETE FROM slices WHERE ino = ? RETURNING block)
     INSERT INTO gc_blocks (block, since_ns)
     SELECT block, ? FROM (SELECT block FROM c UNION ALL SELECT block FROM s) b
     ON CONFLICT (block) DO NOTHING";
/// A freed inode's rows, besides its chunks.
const FREE_INODE_SQL: [&str; 4] = [
    "DELETE FROM inodes WHERE ino = ?",
    "DELETE FROM xattrs WHERE ino = ?",
    "DELETE FROM symlinks WHERE ino = ?",
    "DELETE FROM orphans WHERE ino = ?",
];
const INSERT_INODE_SQL: &str = "INSERT INTO inodes (ino, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns, ctime_ns, parent, inline_data)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const UPSERT_XATTR_SQL: &str = "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?)
     ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value";
const HEARTBEAT_SQL: &str = "UPDATE sessions SET heartbeat_ns = ? WHERE id = ?";
/// How long a directory lease lasts past the heartbeat that renewed it: how long the other
/// mounts wait for a holder that died (its changes answered early and not committed are
/// lost with it, as an unacknowledged write is). Five heartbeats of a shared volume.
pub const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// What a create checked against other mounts' leases (`NewNode::unleased_at_ns`) answers
/// when another mount holds a live lease on the directory: the caller waits for it to let go
/// and creates again. Negative: no errno; never sent to the kernel.
pub const FOREIGN_LEASE: Errno = -2;

/// The DT_ type of a mode, as entries.kind.
pub fn kind_of(mode: u32) -> i64 {
    ((mode & libc::S_IFMT) >> 12) as i64
}

/// Inserts an inode's row (sent with the transaction's next statement: a taken number is a
/// failure of the transaction, seen at the latest at its COMMIT).
pub fn insert_inode(tx: &mut dyn Tx, a: &InodeRec, inline: Option<&[u8]>) -> Result<(), DbError> {
    tx.execute_later(
        INSERT_INODE_SQL,
        &args![
            a.ino, a.mode, a.uid, a.gid, a.rdev, a.nlink, a.size, a.atime_ns, a.mtime_ns,
            a.ctime_ns, a.parent, inline
        ],
    )?;
    Ok(())
}

/// Settings and counters of a new volume, and its root directory (inside the caller's
/// transaction, after the schema).
pub fn initialize(
    tx: &mut dyn Tx,
    settings: &[(&str, String)],
    root: &InodeRec,
) -> Result<(), DbError> {
    for (name, value) in settings {
        tx.execute(
            "INSERT INTO settings (name, value) VALUES (?, ?)",
            &args![*name, value.as_str()],
        )?;
    }
    tx.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?), (?, ?)",
        &args![
            counter::NEXT_INODE,
            ROOT_INO + 1,
            counter::NEXT_SESSION,
            1i64
        ],
    )?;
    insert_inode(tx, root, None)
}

/// An inode row's columns as stored (`attr_columns!`, in that order), before they are
/// taken for attributes: a damaged or crafted row may hold any 64-bit value in each.
#[derive(Debug, Clone, Copy)]
pub struct StoredInode {
    pub ino: i64,
    pub mode: i64,
    pub uid: i64,
    pub gid: i64,
    pub rdev: i64,
    pub nlink: i64,
    pub size: i64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub parent: i64,
}

/// The file types an inode's mode may have.
const FILE_TYPES: [u32; 7] = [
    libc::S_IFREG,
    libc::S_IFDIR,
    libc::S_IFLNK,
    libc::S_IFCHR,
    libc::S_IFBLK,
    libc::S_IFIFO,
    libc::S_IFSOCK,
];

/// Whether `mode` is an inode's: 16 bits with a known file type.
pub fn is_inode_mode(mode: i64) -> bool {
    u16::try_from(mode).is_ok_and(|m| FILE_TYPES.contains(&(u32::from(m) & libc::S_IFMT)))
}

/// Whether `id` can be a file's owner or group: 32 bits, and not -1 (which chown takes as
/// "leave it", and the kernel as no id at all).
pub fn is_owner_id(id: i64) -> bool {
    u32::try_from(id).is_ok_and(|id| id != u32::MAX)
}

impl StoredInode {
    pub fn from_row(r: &Row, at: usize) -> Result<StoredInode, DbError> {
        Ok(StoredInode {
            ino: r.int(at)?,
            mode: r.int(at + 1)?,
            uid: r.int(at + 2)?,
            gid: r.int(at + 3)?,
            rdev: r.int(at + 4)?,
            nlink: r.int(at + 5)?,
            size: r.int(at + 6)?,
            atime_ns: r.int(at + 7)?,
            mtime_ns: r.int(at + 8)?,
            ctime_ns: r.int(at + 9)?,
            parent: r.int(at + 10)?,
        })
    }

    /// Each column an attribute is taken from: its name, its value, and whether an
    /// attribute can have it (any timestamp can; a directory's parent of 0 is taken for the
    /// root, as listings do).
    fn columns(&self) -> [(&'static str, i64, bool); 7] {
        [
            ("mode", self.mode, is_inode_mode(self.mode)),
            ("uid", self.uid, is_owner_id(self.uid)),
            ("gid", self.gid, is_owner_id(self.gid)),
            ("rdev", self.rdev, u32::try_from(self.rdev).is_ok()),
            ("nlink", self.nlink, u32::try_from(self.nlink).is_ok()),
            (
                "size",
                self.size,
                u64::try_from(self.size).is_ok_and(|s| s <= crate::file::MAX_FILE_BYTES),
            ),
            ("parent", self.parent, self.parent >= 0),
        ]
    }

    /// The columns no attribute can have, by name, with their values: fsck reports them,
    /// and a mount refuses the inode over the first.
    pub fn out_of_range(&self) -> impl Iterator<Item = (&'static str, i64)> {
        self.columns()
            .into_iter()
            .filter(|(_, _, fits)| !fits)
            .map(|(name, value, _)| (name, value))
    }

    /// The attributes, or an error naming the inode and its first column out of range
    /// (the inode's requests fail with EIO and this goes to the log; the daemon goes on).
    pub fn record(&self) -> Result<InodeRec, DbError> {
        let damaged = |what: &str| {
            DbError::Other(format!(
                "inode {}: {what} is out of range (a damaged volume: see lanefs fsck)",
                self.ino
            ))
        };
        let ino = u64::try_from(self.ino)
            .ok()
            .filter(|&i| i > 0)
            .ok_or_else(|| damaged(&format!("inode number {}", self.ino)))?;
        if let Some((name, value)) = self.out_of_range().next() {
            return Err(damaged(&format!("{name} {value}")));
        }
        // Each checked above.
        let narrow = |v: i64| v as u32;
        Ok(InodeRec {
            ino,
            mode: narrow(self.mode),
            uid: narrow(self.uid),
            gid: narrow(self.gid),
            rdev: narrow(self.rdev),
            nlink: narrow(self.nlink),
            size: self.size as u64,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            parent: self.parent as u64,
        })
    }
}

pub fn attr_from_row(r: &Row, at: usize) -> Result<InodeRec, DbError> {
    StoredInode::from_row(r, at)?.record()
}

// ---- Reads -------------------------------------------------------------------------------

pub fn getattr(tx: &mut dyn Tx, ino: u64) -> Result<InodeRec, Errno> {
    let row = tx.query_opt(GETATTR_SQL, &args![ino])?;
    Ok(attr_from_row(&row.ok_or(libc::ENOENT)?, 0)?)
}

/// The rows `sql` (one of the `…_SQL` with `INODES_PER_STATEMENT` places) finds for
/// `inos`: one statement per `INODES_PER_STATEMENT` inodes, all sent at once.
fn rows_of_inodes(tx: &mut dyn Tx, sql: &'static str, inos: &[u64]) -> Result<Vec<Row>, DbError> {
    let args: Vec<[Arg<'_>; INODES_PER_STATEMENT]> = inos
        .chunks(INODES_PER_STATEMENT)
        .map(|chunk| {
            let mut args = [Arg::Int(0); INODES_PER_STATEMENT];
            for (arg, ino) in args.iter_mut().zip(chunk) {
                *arg = Arg::from(*ino);
            }
            args
        })
        .collect();
    let steps: Vec<_> = args.iter().map(|args| (sql, &args[..])).collect();
    Ok(tx.queries(&steps)?.into_iter().flatten().collect())
}

/// The records of those of `inos` that exist, in no particular order.
pub fn getattrs(tx: &mut dyn Tx, inos: &[u64]) -> Result<Vec<InodeRec>, Errno> {
    // A damaged row is left out (and logged), as an inode removed since: the others'
    // attributes still go with a READDIRPLUS answer.
    rows_of_inodes(tx, GETATTRS_SQL.as_str(), inos)?
        .iter()
        .filter_map(|row| match attr_from_row(row, 0) {
            Ok(rec) => Some(Ok(rec)),
            Err(e @ DbError::Other(_)) => {
                tracing::error!("volume metadata: {e}");
                None
            }
            Err(e) => Some(Err(e.into())),
        })
        .collect()
}

/// Each of `inos` with the names of its xattrs that callers see (most have none).
pub fn xattr_names_of(tx: &mut dyn Tx, inos: &[u64]) -> Result<InodesXattrNames, Errno> {
    let mut names: HashMap<u64, Vec<Vec<u8>>> = inos.iter().map(|&ino| (ino, Vec::new())).collect();
    for row in rows_of_inodes(tx, XATTR_NAMES_SQL.as_str(), inos)? {
        if let Some(of) = names.get_mut(&row.u64(0)?)
            && let Some(name) = callers_name(&row, 1)?
        {
            of.push(name);
        }
    }
    // In `listxattr`'s order, whichever read a LISTXATTR is answered from.
    names.values_mut().for_each(|of| of.sort());
    Ok(names.into_iter().collect())
}

pub fn lookup(tx: &mut dyn Tx, parent: u64, name: &[u8]) -> Result<InodeRec, Errno> {
    let row = tx.query_opt(LOOKUP_SQL, &args![parent, name])?;
    Ok(attr_from_row(&row.ok_or(libc::ENOENT)?, 0)?)
}

/// `lookup` of `name` in `parent`, and the session other than `me` holding a live lease on
/// `parent`, in one read.
pub fn lookup_and_foreign_lease(
    tx: &mut dyn Tx,
    me: u64,
    parent: u64,
    name: &[u8],
    now_ns: i64,
) -> Result<NameAndLease, Errno> {
    let mut found = Err(libc::ENOENT);
    let mut holder = None;
    for r in tx.query(
        LOOKUP_AND_LEASE_SQL,
        &args![parent, name, parent, me, now_ns],
    )? {
        match r.int(0)? {
            0 => found = Ok(attr_from_row(&r, 1)?),
            _ => holder = Some(r.u64(1)?),
        }
    }
    Ok((found, holder))
}

pub fn readdir(tx: &mut dyn Tx, dir: u64) -> Result<Vec<DirItem>, Errno> {
    let mut items = Vec::new();
    for r in tx.query(READDIR_SQL, &args![dir])? {
        let name = r.bytes(0)?;
        if !is_entry_name(&name) {
            // One bad row must not hide the rest: an empty or over-long answer ends a
            // listing, and the kernel fails a whole listing over a name with a '/'.
            tracing::error!(
                "volume: directory {dir} has an entry named {:?}, which no file can have; not listed (a damaged volume: see lanefs fsck)",
                String::from_utf8_lossy(&name)
            );
            continue;
        }
        let stored = StoredInode::from_row(&r, 2)?;
        // A damaged inode is listed by its entry, without attributes (READDIRPLUS then
        // gives no entry, and the name's own LOOKUP fails): it costs its file, not the
        // directory's listing (`ls`, `rm -rf` see it).
        let attr = stored
            .record()
            .inspect_err(|e| tracing::error!("volume metadata: {e}"))
            .ok();
        items.push(DirItem {
            name,
            // As stored: a d_ino of 0 hides the entry from some tools.
            ino: stored.ino as u64,
            kind: u32::try_from(r.int(1)?)
                .ok()
                .filter(|&k| k <= 0o17)
                .unwrap_or(u32::from(libc::DT_UNKNOWN)),
            attr,
        });
    }
    Ok(items)
}

/// `dir`'s names and the inodes they hold, or None when it has more than `max`.
pub fn names_in(tx: &mut dyn Tx, dir: u64, max: usize) -> Result<Option<NamesIn>, Errno> {
    let limit = max as u64 + 1;
    let mut names = HashMap::new();
    for r in tx.query(NAMES_IN_SQL, &args![dir, limit])? {
        names.insert(r.bytes(0)?, r.u64(1)?);
    }
    Ok((names.len() <= max).then_some(names))
}

/// Whether `name` can be a directory entry's: 1 to 255 bytes, no '/' or NUL, not "." or "..".
pub fn is_entry_name(name: &[u8]) -> bool {
    (1..=255).contains(&name.len())
        && !name.iter().any(|&b| b == b'/' || b == 0)
        && name != b"."
        && name != b".."
}

pub fn readlink(tx: &mut dyn Tx, ino: u64) -> Result<Vec<u8>, Errno> {
    let row = tx.query_opt("SELECT target FROM symlinks WHERE ino = ?", &args![ino])?;
    Ok(row.ok_or(libc::EINVAL)?.bytes(0)?)
}

pub fn getxattr(tx: &mut dyn Tx, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
    let row = tx.query_opt(XATTR_VALUE_SQL, &args![ino, name])?;
    Ok(row.ok_or(libc::ENODATA)?.bytes(0)?)
}

/// The names of the inode's xattrs that callers see (not its `chattr` flags' row).
pub fn listxattr(tx: &mut dyn Tx, ino: u64) -> Result<Vec<Vec<u8>>, Errno> {
    let rows = tx.query(LIST_XATTRS_SQL, &args![ino])?;
    Ok(callers_names(&rows, 0)?)
}

/// Column `at` of `row`, an xattr name, unless it is the row of the `chattr` flags
/// (`FILEATTR_XATTR`), which callers neither list nor get.
fn callers_name(row: &Row, at: usize) -> Result<Option<Vec<u8>>, DbError> {
    let name = row.bytes(at)?;
    Ok((name != FILEATTR_XATTR).then_some(name))
}

/// `callers_name` of each of `rows`.
fn callers_names(rows: &[Row], at: usize) -> Result<Vec<Vec<u8>>, DbError> {
    rows.iter()
        .filter_map(|row| callers_name(row, at).transpose())
        .collect()
}

/// The inode, its inline bytes, its chunk map, its slices and its xattr names (the caller
/// makes it one snapshot; they are read in one round trip): an open of a file on a shared
/// volume thus reads what another mount set before it at no cost of its own.
pub fn load_file(tx: &mut dyn Tx, ino: u64) -> Result<FileRec, Errno> {
    let rows = tx.queries(&[
        (LOAD_FILE_SQL, &args![ino][..]),
        (CHUNKS_SQL, &args![ino]),
        (SLICES_SQL, &args![ino]),
        (LIST_XATTRS_SQL, &args![ino]),
    ])?;
    let [inode, chunk_rows, slice_rows, xattr_rows] = <[Vec<Row>; 4]>::try_from(rows)
        .map_err(|_| DbError::Other("fewer answers than queries".into()))?;
    let inode = inode.first().ok_or(libc::ENOENT)?;
    let attr = attr_from_row(inode, 0)?;
    let inline = inode.opt_bytes(ATTR_COLUMN_COUNT)?;
    let chunks = chunk_rows
        .iter()
        .map(|r| {
            Ok(ChunkRec {
                idx: r.u64(0)?,
                block: r.u64(1)?,
                len: r.u64(2)?,
                crc: r.u32(3)?,
            })
        })
        .collect::<Result<_, DbError>>()?;
    let slices = slice_rows
        .iter()
        .map(|r| {
            Ok(SliceRec {
                idx: r.u64(0)?,
                pos: r.u64(1)?,
                len: r.u64(2)?,
                block: r.u64(3)?,
                crc: r.u32(4)?,
            })
        })
        .collect::<Result<_, DbError>>()?;
    let file = FileRec {
        attr,
        inline,
        chunks,
        slices,
        xattr_names: Some(callers_names(&xattr_rows, 0)?),
    };
    check_file_rows(&file).map_err(|why| {
        tracing::error!("volume: inode {ino}: {why} (a damaged volume: see lanefs fsck)");
        libc::EIO
    })?;
    Ok(file)
}

/// What a file's data rows must be for reads and writes to use them: chunks within the
/// largest file, pieces within their chunk, inline bytes within one chunk. A damaged or
/// crafted row otherwise becomes an allocation of its length or an offset past u64.
/// (Bytes past the size are cut when the view is made: `file::Committed`.)
pub fn check_file_rows(file: &FileRec) -> Result<(), String> {
    use crate::file::{CHUNK_BYTES, MAX_FILE_BYTES};
    let chunks = MAX_FILE_BYTES / CHUNK_BYTES;
    if file
        .inline
        .as_ref()
        .is_some_and(|b| b.len() as u64 > CHUNK_BYTES)
    {
        return Err("inline bytes longer than a chunk".into());
    }
    if let Some(c) = file
        .chunks
        .iter()
        .find(|c| c.idx >= chunks || c.len > CHUNK_BYTES)
    {
        return Err(format!(
            "chunk {} of {} bytes is out of range",
            c.idx, c.len
        ));
    }
    let bad_slice =
        |s: &&SliceRec| s.idx >= chunks || s.pos >= CHUNK_BYTES || s.len > CHUNK_BYTES - s.pos;
    if let Some(s) = file.slices.iter().find(bad_slice) {
        return Err(format!(
            "slice of chunk {} at {} of {} bytes is out of range",
            s.idx, s.pos, s.len
        ));
    }
    Ok(())
}

pub fn usage(tx: &mut dyn Tx) -> Result<Usage, Errno> {
    let row = tx
        .query_opt(
            "SELECT count(*), CAST(coalesce(sum(size), 0) AS BIGINT) FROM inodes",
            &[],
        )?
        .ok_or(libc::EIO)?;
    Ok(Usage {
        inodes: row.u64(0)?,
        bytes: row.u64(1)?,
    })
}

fn blocks_of(rows: Vec<Row>) -> Result<Vec<u64>, Errno> {
    Ok(rows.iter().map(|r| r.u64(0)).collect::<Result<_, _>>()?)
}

pub fn blocks_between(tx: &mut dyn Tx, lo: u64, hi: u64) -> Result<Vec<u64>, Errno> {
    blocks_of(tx.query(
        "SELECT block FROM chunks WHERE block >= ? AND block < ?
         UNION ALL SELECT block FROM slices WHERE block >= ? AND block < ?",
        &args![lo, hi, lo, hi],
    )?)
}

pub fn pending_gc(tx: &mut dyn Tx) -> Result<Vec<u64>, Errno> {
    blocks_of(tx.query("SELECT block FROM gc_blocks", &[])?)
}

pub fn fileattr_flags(tx: &mut dyn Tx) -> Result<Vec<(u64, u32)>, Errno> {
    let mut out = Vec::new();
    for r in tx.query(
        "SELECT ino, value FROM xattrs WHERE name = ?",
        &args![FILEATTR_XATTR],
    )? {
        out.push((r.u64(0)?, fileattr_flags_of(&r.bytes(1)?)));
    }
    Ok(out)
}

/// The flags a `FILEATTR_XATTR` value holds.
pub fn fileattr_flags_of(value: &[u8]) -> u32 {
    value
        .first_chunk::<4>()
        .map_or(0, |b| u32::from_le_bytes(*b))
}

// ---- The writer --------------------------------------------------------------------------

/// The state the committer owns: its connection, its session, its inode range.
pub struct Writer<C> {
    pub conn: C,
    pub session: u64,
    next_ino: u64,
    end_ino: u64,
    /// Changes are logged for other mounts (a shared volume).
    pub log_changes: bool,
    /// The session's change-log count (the low bits of seq).
    changes_logged: u64,
    /// What the running batch did to inodes' attributes, in order, on a shared volume: an
    /// inode's row as a statement left it (RETURNING: a directory a create changed), or
    /// None where it changed otherwise. The store publishes it at the batch's commit
    /// (`store::RecentDirs`) and drops it at a rollback; a change rolled back to its
    /// savepoint takes its part back (`truncate_attr_events`).
    pub attr_events: Vec<(u64, Option<InodeRec>)>,
    /// The session's row was found gone (another mount ended it after its heartbeat
    /// stopped, so it may have freed this session's orphans, locks and uncommitted blocks):
    /// every later change is refused with EIO, since committing it could refer to what was
    /// freed. The mount must be remounted.
    pub fenced: bool,
    /// The change-log rows of the batch running, written together at its end
    /// (`write_deferred_log`) when it runs without savepoints; None: each is written at
    /// once (a batch with savepoints, where rolling back to one must take its rows along).
    deferred_log: Option<Vec<LogRow>>,
    /// Directories whose row the running batch holds locked from a create's UPDATE …
    /// RETURNING, as that statement and the creates after it left them: a create there
    /// sends its UPDATE without waiting for its answer (`touch_dir_returning`), the same
    /// update applied to this copy. On PostgreSQL that round trip was a create's one wait
    /// inside a batch, and bounded the rate at which a shared volume commits creates
    /// answered early. Kept only while the batch's change-log rows are deferred (a batch
    /// without savepoints on a shared volume: a rollback to a savepoint would release the
    /// lock; the replay of a dead mount's intent log, which runs each change in a savepoint
    /// of its own inside such a batch, forgets them at its rollback: `roll_back_to`)
    /// and only for as long as no change-log row names the directory, as the inode
    /// changed or as the parent of a changed name: every change of a directory's row logs
    /// one of the two (the change log's own contract with the other mounts' caches), and
    /// the create that logs one takes the directory out before and puts it back after.
    locked_dirs: HashMap<u64, InodeRec>,
    /// Inodes the running batch created, kept as `locked_dirs` is (no change-log row has
    /// named them since their create's): their row is this transaction's, so a data update
    /// of one (a small file's bytes after its create) sends its UPDATE without waiting for
    /// the count of rows it changed.
    created_inodes: HashSet<u64>,
    /// Updates sent without waiting for their answer thanks to the two above, since the
    /// start (for `lanefs stats`).
    pub updates_unwaited: u64,
}

/// A change-log row not yet written.
struct LogRow {
    seq: u64,
    ino: u64,
    parent: u64,
    name: Option<Vec<u8>>,
    kind: i64,
    at_ns: i64,
}

/// Change-log rows written by one statement at a batch's end: a round trip and a statement's
/// overhead per row was a seventh of the statements of a create on PostgreSQL.
const LOG_ROWS_PER_INSERT: usize = 32;
const LOG_INSERT_SQL: &str =
    "INSERT INTO changes (seq, ino, parent, name, kind, at_ns) VALUES (?, ?, ?, ?, ?, ?)";

/// The statement that inserts `rows` change-log rows (1..=LOG_ROWS_PER_INSERT), made once.
fn log_insert_sql(rows: usize) -> &'static str {
    static TEXTS: [std::sync::OnceLock<String>; LOG_ROWS_PER_INSERT] =
        [const { std::sync::OnceLock::new() }; LOG_ROWS_PER_INSERT];
    TEXTS[rows - 1].get_or_init(|| {
        let mut sql = LOG_INSERT_SQL.to_string();
        for _ in 1..rows {
            sql.push_str(", (?, ?, ?, ?, ?, ?)");
        }
        sql
    })
}

impl<C: Tx> Writer<C> {
    pub fn new(conn: C, session: u64) -> Writer<C> {
        Writer {
            conn,
            session,
            next_ino: 0,
            end_ino: 0,
            log_changes: false,
            changes_logged: 0,
            attr_events: Vec::new(),
            fenced: false,
            deferred_log: None,
            locked_dirs: HashMap::new(),
            created_inodes: HashSet::new(),
            updates_unwaited: 0,
        }
    }

    /// Starts a batch's run: its change-log rows are kept for `write_deferred_log` when
    /// `defer`, else written one by one; rows kept by an earlier run are dropped (it was
    /// rolled back).
    pub fn defer_log(&mut self, defer: bool) {
        self.deferred_log = defer.then(Vec::new);
        self.forget_locked_rows();
    }

    /// Writes the change-log rows the batch kept (inside its transaction, before COMMIT).
    pub fn write_deferred_log(&mut self) -> Result<(), DbError> {
        let Some(rows) = self.deferred_log.take() else {
            return Ok(());
        };
        self.forget_locked_rows();
        for chunk in rows.chunks(LOG_ROWS_PER_INSERT) {
            let mut values = Vec::with_capacity(chunk.len() * 6);
            for r in chunk {
                values.extend(args![
                    r.seq,
                    r.ino,
                    r.parent,
                    r.name.as_deref(),
                    r.kind,
                    r.at_ns
                ]);
            }
            self.tx()
                .execute_later(log_insert_sql(chunk.len()), &values)?;
        }
        Ok(())
    }

    /// Refuses every later change (see `fenced`), with one log line.
    pub fn fence(&mut self) {
        if !self.fenced {
            tracing::error!(
                "volume: session {} was ended by another mount (its heartbeat stopped for longer than the expiry); every change is refused from now on: unmount and mount again",
                self.session
            );
        }
        self.fenced = true;
    }

    /// Logs a change for the other mounts (a shared volume only): one row.
    fn log(
        &mut self,
        kind: ChangeKind,
        ino: u64,
        parent: u64,
        name: Option<&[u8]>,
        now_ns: i64,
    ) -> Result<(), Errno> {
        if !self.locked_dirs.is_empty() {
            self.locked_dirs.remove(&ino);
            self.locked_dirs.remove(&parent);
        }
        if !self.created_inodes.is_empty() {
            self.created_inodes.remove(&ino);
        }
        if !self.log_changes {
            return Ok(());
        }
        self.attr_events.push((ino, None));
        if parent != 0 {
            self.attr_events.push((parent, None));
        }
        self.changes_logged += 1;
        let seq = (self.session << CHANGE_SEQ_SESSION_SHIFT) | self.changes_logged;
        if let Some(rows) = &mut self.deferred_log {
            rows.push(LogRow {
                seq,
                ino,
                parent,
                name: name.map(<[u8]>::to_vec),
                kind: kind as i64,
                at_ns: now_ns,
            });
            return Ok(());
        }
        self.tx().execute_later(
            LOG_INSERT_SQL,
            &args![seq, ino, parent, name, kind as i64, now_ns],
        )?;
        Ok(())
    }

    fn tx(&mut self) -> &mut dyn Tx {
        &mut self.conn
    }

    fn alloc_ino(&mut self) -> Result<u64, Errno> {
        if self.next_ino >= self.end_ino {
            // The batch's refill counts one number per change; never reached, but a wrong
            // count must cost a change EIO, not the mount.
            tracing::error!("volume: the inode range ran out inside a batch");
            return Err(libc::EIO);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        Ok(ino)
    }

    /// Makes sure `need` inode numbers are left in the range, taking a new range if not;
    /// whether it took one (in the caller's transaction: a rollback must forget it).
    pub fn refill(&mut self, need: u64) -> Result<bool, DbError> {
        if self.end_ino - self.next_ino >= need {
            return Ok(false);
        }
        (self.next_ino, self.end_ino) = self.take_range()?;
        Ok(true)
    }

    /// A new range of `INODE_RANGE` inode numbers for this session, [start, end): the
    /// counter moves past it and a row records whose it is (in the caller's transaction).
    pub fn take_range(&mut self) -> Result<(u64, u64), DbError> {
        let session = self.session;
        let end = self
            .tx()
            .query_opt(
                "UPDATE counters SET value = value + ? WHERE name = ? RETURNING value",
                &args![INODE_RANGE, counter::NEXT_INODE],
            )?
            .ok_or_else(|| DbError::Other("the next_inode counter is missing".into()))?
            .u64(0)?;
        let start = end.checked_sub(INODE_RANGE).ok_or_else(|| {
            DbError::Other(format!("the next_inode counter reads {end}: damaged"))
        })?;
        self.tx().execute(
            "INSERT INTO inode_ranges (start_ino, end_ino, session) VALUES (?, ?, ?)",
            &args![start, end, session],
        )?;
        Ok((start, end))
    }

    /// The batch's transaction was rolled back: the range it took (if any) went with it.
    pub fn forget_range(&mut self) {
        self.next_ino = 0;
        self.end_ino = 0;
    }

    /// Where the running batch's records stand (its attribute events and deferred
    /// change-log rows), for `roll_back_to` after a rollback to a savepoint taken here.
    pub fn mark(&self) -> (usize, usize) {
        (
            self.attr_events.len(),
            self.deferred_log.as_ref().map_or(0, Vec::len),
        )
    }

    /// A rollback to the savepoint taken at `mark`: what the changes since recorded goes.
    pub fn roll_back_to(&mut self, mark: (usize, usize)) {
        self.truncate_attr_events(mark.0);
        if let Some(rows) = &mut self.deferred_log {
            rows.truncate(mark.1);
        }
        self.forget_locked_rows();
    }

    /// Forgets `locked_dirs` and `created_inodes` (a rollback to a savepoint takes their
    /// locks and changes back).
    fn forget_locked_rows(&mut self) {
        self.locked_dirs.clear();
        self.created_inodes.clear();
    }

    /// `dir`'s row as the running batch left it, taken out of `locked_dirs` (None outside
    /// a batch that defers its change-log rows: nothing holds the lock then).
    fn locked_dir(&mut self, dir: u64) -> Option<InodeRec> {
        self.deferred_log.as_ref()?;
        self.locked_dirs.remove(&dir)
    }

    fn touch_dir(&mut self, dir: u64, now_ns: i64, nlink_delta: i64) -> Result<(), Errno> {
        // Its change logs the directory too; dropped here whatever the order.
        self.locked_dirs.remove(&dir);
        let n = self
            .tx()
            .execute(TOUCH_DIR_SQL, &args![now_ns, now_ns, nlink_delta, dir])?;
        if n == 0 { Err(libc::ENOENT) } else { Ok(()) }
    }

    /// As `touch_dir`, returning the directory's row as it left it (recorded in
    /// `attr_events`); with `unleased_at_ns`, only if no other mount's lease on it is live
    /// then (else `FOREIGN_LEASE`, changing nothing), and with its default ACL as it is
    /// once the row is locked (Some(None): none; None when not asked for, with
    /// `default_acl` false or no `unleased_at_ns`).
    /// `locked`: the directory's row as this batch left it, its lock held (`locked_dirs`):
    /// the update goes without waiting for its answer.
    #[allow(clippy::too_many_arguments)]
    fn touch_dir_returning(
        &mut self,
        dir: u64,
        now_ns: i64,
        nlink_delta: i64,
        unleased_at_ns: Option<i64>,
        default_acl: bool,
        locked: Option<InodeRec>,
    ) -> Result<(InodeRec, Option<DefaultAcl>), Errno> {
        let touch_args = args![now_ns, now_ns, nlink_delta, dir];
        if let (Some(mut rec), None) = (locked, unleased_at_ns) {
            self.tx().execute_later(TOUCH_DIR_SQL, &touch_args)?;
            self.updates_unwaited += 1;
            rec.mtime_ns = now_ns;
            rec.ctime_ns = now_ns;
            rec.nlink = (i64::from(rec.nlink) + nlink_delta) as u32;
            self.record_attr(rec.clone());
            self.locked_dirs.insert(dir, rec.clone());
            return Ok((rec, None));
        }
        let (row, default) = match unleased_at_ns {
            None => (
                self.tx().query_opt(TOUCH_DIR_RETURNING_SQL, &touch_args)?,
                None,
            ),
            Some(at_ns) => {
                // In one round trip, the lock first.
                let me = self.session;
                let lease_args = args![dir, me, at_ns];
                let acl_args = args![dir, acl::DEFAULT_XATTR];
                let mut steps = vec![
                    (TOUCH_DIR_RETURNING_SQL, &touch_args[..]),
                    (FOREIGN_LEASE_SQL, &lease_args[..]),
                ];
                if default_acl {
                    steps.push((XATTR_VALUE_SQL, &acl_args[..]));
                }
                let mut answers = self.tx().queries(&steps)?.into_iter();
                let (Some(touched), Some(leased)) = (answers.next(), answers.next()) else {
                    return Err(DbError::Other("fewer answers than queries".into()).into());
                };
                if !leased.is_empty() {
                    return Err(FOREIGN_LEASE);
                }
                let default = match answers.next() {
                    Some(rows) => Some(match rows.first() {
                        Some(row) => Some(row.bytes(0)?),
                        None => None,
                    }),
                    None => None,
                };
                (touched.into_iter().next(), default)
            }
        };
        let rec = attr_from_row(&row.ok_or(libc::ENOENT)?, 0)?;
        self.record_attr(rec.clone());
        if self.deferred_log.is_some() && self.log_changes {
            self.locked_dirs.insert(dir, rec.clone());
        }
        Ok((rec, default))
    }

    /// An inode's row as a statement of this transaction left it (see `attr_events`).
    fn record_attr(&mut self, rec: InodeRec) {
        if self.log_changes {
            self.attr_events.push((rec.ino, Some(rec)));
        }
    }

    /// Takes back what a change rolled back to its savepoint recorded in `attr_events`
    /// (`mark`: their length before it).
    pub fn truncate_attr_events(&mut self, mark: usize) {
        self.attr_events.truncate(mark);
    }

    /// (ino, mode) of the entry.
    /// What the names `(directory, name)` hold (inode and mode), read after taking the
    /// write locks of their directories' rows, in inode order, all in one round trip. Every
    /// change of a directory's names takes its row's lock before it reads them (create,
    /// unlink, rmdir and rename here; a link only adds a name, which the unique key guards),
    /// so on PostgreSQL, whose reads see what committed before each statement began, no
    /// other mount can change these names between this read and the commit.
    fn entries_locked<const N: usize>(
        &mut self,
        names: [(u64, &[u8]); N],
    ) -> Result<[Option<(u64, u32)>; N], Errno> {
        let mut dirs: Vec<u64> = names.iter().map(|&(dir, _)| dir).collect();
        dirs.sort_unstable();
        dirs.dedup();
        let lock_args: Vec<[Arg<'_>; 1]> = dirs.iter().map(|&dir| args![dir]).collect();
        let read_args: Vec<[Arg<'_>; 2]> =
            names.iter().map(|&(dir, name)| args![dir, name]).collect();
        let steps: Vec<(&'static str, &[Arg<'_>])> = lock_args
            .iter()
            .map(|a| (LOCK_DIR_SQL, &a[..]))
            .chain(read_args.iter().map(|a| (ENTRY_SQL, &a[..])))
            .collect();
        let answers = self.tx().queries(&steps)?;
        let mut read = answers.into_iter().skip(dirs.len());
        let mut found = [None; N];
        for slot in &mut found {
            let rows = read
                .next()
                .ok_or_else(|| DbError::Other("fewer answers than queries".into()))?;
            if let Some(r) = rows.first() {
                *slot = Some((r.u64(0)?, r.u32(1)?));
            }
        }
        Ok(found)
    }

    /// Inserts a name, sent with the transaction's next statement: a name taken is that
    /// statement's (or COMMIT's) `DbError::Unique`, which is EEXIST.
    fn insert_entry(&mut self, parent: u64, name: &[u8], ino: u64, mode: u32) -> Result<(), Errno> {
        self.tx().execute_later(
            "INSERT INTO entries (parent, name, ino, kind) VALUES (?, ?, ?, ?)",
            &args![parent, name, ino, kind_of(mode)],
        )?;
        Ok(())
    }

    fn delete_entry(&mut self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.tx().execute_later(
            "DELETE FROM entries WHERE parent = ? AND name = ?",
            &args![parent, name],
        )?;
        Ok(())
    }

    /// Whether any of `moves` (a directory, the directory it is to move into) would put a
    /// directory inside itself, read after taking the root directory's row lock. The kernel
    /// refuses such a rename by its own cache of names, which on a shared volume may not
    /// show another mount's moves yet (a mount that moved `a` into `b/` and one that moves
    /// `b` into `a/` each see no loop): every move of a directory to another parent takes
    /// this lock first (the kernel's `s_vfs_rename_mutex`, volume-wide; moves of files do
    /// not), so no other such move changes the ancestry read here before this one commits.
    /// A lock taken after the parents' (against inode order): a deadlock with another rename
    /// is possible, and PostgreSQL's detection runs one of the two again.
    fn lands_inside_itself(&mut self, moves: &[(u64, u64)]) -> Result<bool, Errno> {
        let lock_root = args![ROOT_INO];
        let walks: Vec<[Arg<'_>; 4]> = moves
            .iter()
            .map(|&(dir, into)| args![into, ROOT_INO, dir, dir])
            .collect();
        let steps: Vec<(&'static str, &[Arg<'_>])> =
            std::iter::once((LOCK_DIR_SQL, &lock_root[..]))
                .chain(walks.iter().map(|a| (ANCESTOR_SQL, &a[..])))
                .collect();
        let answers = self.tx().queries(&steps)?;
        Ok(answers.iter().skip(1).any(|rows| !rows.is_empty()))
    }

    /// Whether a directory is empty, after taking its inode row's write lock: on PostgreSQL
    /// a create in it (which updates that row) either committed before, and its entry is
    /// seen here, or waits for this transaction and then finds the directory gone.
    fn is_empty_dir_locked(&mut self, dir: u64) -> Result<bool, Errno> {
        // In one round trip: the server runs them in order, the lock first.
        let answers = self.tx().queries(&[
            ("UPDATE inodes SET nlink = nlink WHERE ino = ?", &args![dir]),
            (
                "SELECT 1 FROM entries WHERE parent = ? LIMIT 1",
                &args![dir],
            ),
        ])?;
        let entries = answers
            .get(1)
            .ok_or_else(|| DbError::Other("two queries, one answer".into()))?;
        Ok(entries.is_empty())
    }

    /// With `unleased_at_ns`: FOREIGN_LEASE if another mount's lease on one of `dirs` is
    /// live then. Run once this transaction holds those directories' row locks (see
    /// `FOREIGN_LEASE_SQL`): a mount that takes a lease waits for that lock (`take_lease`),
    /// so it either sees this change or this change sees its lease, and what it answers
    /// early under the lease never meets a change made past it.
    fn refuse_foreign_leases(
        &mut self,
        dirs: &[u64],
        unleased_at_ns: Option<i64>,
    ) -> Result<(), Errno> {
        let Some(at_ns) = unleased_at_ns else {
            return Ok(());
        };
        let me = self.session;
        // One read a directory, in one round trip.
        let step_args: Vec<[Arg<'_>; 3]> = dirs.iter().map(|&dir| args![dir, me, at_ns]).collect();
        let steps: Vec<(&'static str, &[Arg<'_>])> = step_args
            .iter()
            .map(|a| (FOREIGN_LEASE_SQL, &a[..]))
            .collect();
        if self
            .tx()
            .queries(&steps)?
            .iter()
            .any(|rows| !rows.is_empty())
        {
            return Err(FOREIGN_LEASE);
        }
        Ok(())
    }

    /// Moves chunks' blocks and their slices' to gc_blocks; returns them. `only`: one
    /// chunk; else every chunk from `from_idx` on.
    fn release_chunks(
        &mut self,
        ino: u64,
        from_idx: u64,
        only: Option<u64>,
        now_ns: i64,
    ) -> Result<Vec<u64>, Errno> {
        let (select, deletes, arg2) = match only {
            Some(idx) => (
                "SELECT block FROM chunks WHERE ino = ? AND idx = ?
                 UNION ALL SELECT block FROM slices WHERE ino = ? AND idx = ?",
                [
                    "DELETE FROM chunks WHERE ino = ? AND idx = ?",
                    "DELETE FROM slices WHERE ino = ? AND idx = ?",
                ],
                idx,
            ),
            None => (
                "SELECT block FROM chunks WHERE ino = ? AND idx >= ?
                 UNION ALL SELECT block FROM slices WHERE ino = ? AND idx >= ?",
                [
                    "DELETE FROM chunks WHERE ino = ? AND idx >= ?",
                    "DELETE FROM slices WHERE ino = ? AND idx >= ?",
                ],
                from_idx,
            ),
        };
        let blocks = blocks_of(self.tx().query(select, &args![ino, arg2, ino, arg2])?)?;
        if blocks.is_empty() {
            return Ok(blocks);
        }
        self.hand_to_gc(&blocks, now_ns)?;
        for delete in deletes {
            self.tx().execute_later(delete, &args![ino, arg2])?;
        }
        Ok(blocks)
    }

    /// Hands blocks to gc_blocks (sent with the next statement).
    fn hand_to_gc(&mut self, blocks: &[u64], now_ns: i64) -> Result<(), Errno> {
        for b in blocks {
            self.tx().execute_later(
                "INSERT INTO gc_blocks (block, since_ns) VALUES (?, ?) ON CONFLICT (block) DO NOTHING",
                &args![*b, now_ns],
            )?;
        }
        Ok(())
    }

    /// Deletes an inode and everything hanging off it; returns its released blocks.
    fn free_inode(&mut self, ino: u64, now_ns: i64) -> Result<Vec<u64>, Errno> {
        let released = self.release_chunks(ino, 0, None, now_ns)?;
        for sql in FREE_INODE_SQL {
            self.tx().execute_later(sql, &args![ino])?;
        }
        Ok(released)
    }

    /// Drops one link of a non-directory: at zero, orphan (open) or free. The count is
    /// decremented where it is (another mount may have changed it since it was read).
    fn drop_link(&mut self, ino: u64, now_ns: i64, is_open: &IsOpen) -> Result<Removed, Errno> {
        let left = self
            .tx()
            .query_opt(
                "UPDATE inodes SET nlink = nlink - 1, ctime_ns = ? WHERE ino = ? AND nlink > 0 RETURNING nlink",
                &args![now_ns, ino],
            )?
            .ok_or(libc::ENOENT)?
            .u64(0)?;
        self.after_dropping_link(ino, left, now_ns, is_open)
    }

    /// An inode's link count went down to `left`: at zero, orphan (open) or free.
    fn after_dropping_link(
        &mut self,
        ino: u64,
        left: u64,
        now_ns: i64,
        is_open: &IsOpen,
    ) -> Result<Removed, Errno> {
        let mut removed = Removed {
            ino,
            ..Default::default()
        };
        if left > 0 {
            return Ok(removed);
        }
        if self.log_changes {
            // A shared volume: other mounts may have it open and learn of the unlink only
            // from the change log, so it is always kept as an orphan, freed by this session's
            // sweep once `ORPHAN_GRACE` has passed with no holds and no open here.
            is_open(ino);
            let session = self.session;
            self.tx().execute_later(
                "INSERT INTO orphans (ino, session, since_ns) VALUES (?, ?, ?) ON CONFLICT (ino) DO NOTHING",
                &args![ino, session, now_ns],
            )?;
            removed.orphaned = true;
        } else if is_open(ino) {
            let session = self.session;
            self.tx().execute_later(
                "INSERT INTO orphans (ino, session) VALUES (?, ?) ON CONFLICT (ino) DO NOTHING",
                &args![ino, session],
            )?;
            removed.orphaned = true;
        } else {
            removed.released = self.free_inode(ino, now_ns)?;
        }
        Ok(removed)
    }

    fn attr(&mut self, ino: u64) -> Result<InodeRec, Errno> {
        getattr(self.tx(), ino)
    }

    fn set_ctime(&mut self, ino: u64, ctime_ns: i64) -> Result<u64, Errno> {
        Ok(self.tx().execute(
            "UPDATE inodes SET ctime_ns = ? WHERE ino = ?",
            &args![ctime_ns, ino],
        )?)
    }
}

// ---- Changes -----------------------------------------------------------------------------

pub fn create<C: Tx>(w: &mut Writer<C>, node: &NewNode) -> Result<InodeRec, Errno> {
    let remade;
    let mut node = node;
    let dir = node.mode & libc::S_IFMT == libc::S_IFDIR;
    let ino = match node.ino {
        Some(delegated) => delegated,
        None => w.alloc_ino()?,
    };
    // No name: an O_TMPFILE, an orphan from birth (a later link names it).
    let unnamed = node.name.is_empty();
    let (parent_mode, parent_gid) = if unnamed {
        // On a shared volume with its birth as the unlink time, for the sweep (see
        // `drop_link`); 0 elsewhere: freed at its last close.
        let (session, since_ns) = (w.session, if w.log_changes { node.now_ns } else { 0 });
        w.tx().execute(
            "INSERT INTO orphans (ino, session, since_ns) VALUES (?, ?, ?)",
            &args![ino, session, since_ns],
        )?;
        let parent = w.attr(node.parent)?;
        (parent.mode, parent.gid)
    } else {
        // Logged first: the directory's row as the statement below leaves it is then its
        // latest attribute event (see `Writer::attr_events`). The log forgets the
        // directory's locked row, taken before it.
        let locked = w.locked_dir(node.parent);
        w.log(
            ChangeKind::Entry,
            ino,
            node.parent,
            Some(&node.name),
            node.now_ns,
        )?;
        // The directory's row first: its mode and group make the new inode's, and the
        // name's row goes out with the statements that follow it.
        let (parent, default_there) = w.touch_dir_returning(
            node.parent,
            node.now_ns,
            dir as i64,
            node.unleased_at_ns,
            node.inherit.is_some(),
            locked,
        )?;
        w.insert_entry(node.parent, &node.name, ino, node.mode)?;
        // Another mount changed the directory's default ACL since this mount read it.
        if let (Some(inherit), Some(there)) = (&node.inherit, default_there)
            && there != inherit.default
        {
            let (mode, xattrs) = acl::inherit(there.as_deref(), inherit.mode, inherit.umask);
            remade = NewNode {
                mode,
                xattrs,
                ..node.clone()
            };
            node = &remade;
        }
        (parent.mode, parent.gid)
    };
    if parent_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(libc::ENOTDIR);
    }
    let attr = node.record(ino, parent_mode, parent_gid);
    insert_inode(w.tx(), &attr, None)?;
    if w.deferred_log.is_some() && w.log_changes {
        w.created_inodes.insert(ino);
    }
    if let Some(target) = &node.target {
        w.tx().execute_later(
            "INSERT INTO symlinks (ino, target) VALUES (?, ?)",
            &args![ino, target],
        )?;
    }
    for (name, value) in &node.xattrs {
        w.tx()
            .execute_later(UPSERT_XATTR_SQL, &args![ino, name, value])?;
    }
    if let Some(expires_ns) = node.lease_expires_ns
        && dir
    {
        let me = w.session;
        take_lease(w.tx(), me, ino, node.now_ns, expires_ns)?;
    }
    Ok(attr)
}

/// `unleased_at_ns`: the directory changes only if no other mount's lease on it is live
/// then (else `FOREIGN_LEASE`, changing nothing).
pub fn link<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    parent: u64,
    name: &[u8],
    now_ns: i64,
    unleased_at_ns: Option<i64>,
) -> Result<InodeRec, Errno> {
    let attr = w.attr(ino)?;
    if attr.is_dir() {
        return Err(libc::EPERM);
    }
    // The inode may be gone since (another mount removed its last name and freed it).
    let linked = w.tx().execute(
        "UPDATE inodes SET nlink = nlink + 1, ctime_ns = ? WHERE ino = ?",
        &args![now_ns, ino],
    )?;
    if linked == 0 {
        return Err(libc::ENOENT);
    }
    w.insert_entry(parent, name, ino, attr.mode)?;
    w.touch_dir(parent, now_ns, 0)?;
    w.refuse_foreign_leases(&[parent], unleased_at_ns)?;
    // Linked again: no longer an orphan (no row when it never was one).
    w.tx()
        .execute("DELETE FROM orphans WHERE ino = ?", &args![ino])?;
    w.log(ChangeKind::Entry, ino, parent, Some(name), now_ns)?;
    w.attr(ino)
}

/// `unleased_at_ns`: see `MetaStore::remove`; an rmdir checks the directory it removes too
/// (a create answered early in it would be lost).
pub fn remove<C: Tx>(
    w: &mut Writer<C>,
    parent: u64,
    name: &[u8],
    dir: bool,
    now_ns: i64,
    unleased_at_ns: Option<i64>,
    is_open: &IsOpen,
) -> Result<Removed, Errno> {
    if !dir {
        return unlink(w, parent, name, now_ns, unleased_at_ns, is_open);
    }
    let [entry] = w.entries_locked([(parent, name)])?;
    let (ino, mode) = entry.ok_or(libc::ENOENT)?;
    if mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(libc::ENOTDIR);
    }
    if !w.is_empty_dir_locked(ino)? {
        return Err(libc::ENOTEMPTY);
    }
    w.refuse_foreign_leases(&[parent, ino], unleased_at_ns)?;
    w.delete_entry(parent, name)?;
    w.touch_dir(parent, now_ns, -1)?;
    w.log(ChangeKind::Entry, ino, parent, Some(name), now_ns)?;
    w.free_inode(ino, now_ns)?;
    Ok(Removed {
        ino,
        ..Default::default()
    })
}

/// The remove of a name that must not be a directory, in one round trip before the COMMIT's:
/// the directory's times change, returning its row (and taking its lock first, see
/// `Writer::entries_locked`), the link count of the inode the name holds goes down, and the
/// name's row is deleted, saying what it named; a directory's name fails the change, which
/// rolls all back. With `unleased_at_ns`, the directory changes only if no other mount's
/// lease on it is live (else `FOREIGN_LEASE`).
fn unlink<C: Tx>(
    w: &mut Writer<C>,
    parent: u64,
    name: &[u8],
    now_ns: i64,
    unleased_at_ns: Option<i64>,
    is_open: &IsOpen,
) -> Result<Removed, Errno> {
    let me = w.session;
    let touch_args = args![now_ns, now_ns, 0i64, parent];
    let lease_args = args![parent, me, unleased_at_ns.unwrap_or(0)];
    let drop_args = args![now_ns, parent, name];
    let delete_args = args![parent, name];
    // The lease check, when asked for, right after the lock (see `FOREIGN_LEASE_SQL`).
    let lease_step = unleased_at_ns.map(|_| (FOREIGN_LEASE_SQL, &lease_args[..]));
    let steps: Vec<(&'static str, &[Arg<'_>])> = [(TOUCH_DIR_RETURNING_SQL, &touch_args[..])]
        .into_iter()
        .chain(lease_step)
        .chain([
            (
                "UPDATE inodes SET nlink = nlink - 1, ctime_ns = ?
                 WHERE ino = (SELECT ino FROM entries WHERE parent = ? AND name = ?) AND nlink > 0
                 RETURNING ino, nlink",
                &drop_args[..],
            ),
            (
                "DELETE FROM entries WHERE parent = ? AND name = ? RETURNING ino, kind",
                &delete_args[..],
            ),
        ])
        .collect();
    let mut answers = w.tx().queries(&steps)?;
    if answers.len() != steps.len() {
        return Err(DbError::Other("fewer answers than queries".into()).into());
    }
    let [touched, dropped, deleted] =
        [0, answers.len() - 2, answers.len() - 1].map(|i| std::mem::take(&mut answers[i]));
    if unleased_at_ns.is_some() && !answers[1].is_empty() {
        return Err(FOREIGN_LEASE);
    }
    let Some(touched) = touched.first() else {
        return Err(libc::ENOENT);
    };
    let (dropped, deleted) = (dropped.first(), deleted.first());
    let deleted = deleted.ok_or(libc::ENOENT)?;
    let (ino, kind) = (deleted.u64(0)?, deleted.int(1)?);
    if kind == kind_of(libc::S_IFDIR) {
        return Err(libc::EISDIR);
    }
    w.log(ChangeKind::Entry, ino, parent, Some(name), now_ns)?;
    w.record_attr(attr_from_row(touched, 0)?);
    // The count that went down should be the deleted name's inode's. Otherwise the name
    // points at a missing inode (damage, for fsck: `drop_link` answers ENOENT), or a writer
    // changed it between the two statements without the directory's lock (fsck's repair;
    // never a mount's change): the old inode gets its link back, the named one loses one.
    match dropped {
        Some(row) if row.u64(0)? == ino => {
            return w.after_dropping_link(ino, row.u64(1)?, now_ns, is_open);
        }
        Some(row) => {
            w.tx().execute(
                "UPDATE inodes SET nlink = nlink + 1 WHERE ino = ?",
                &args![row.u64(0)?],
            )?;
        }
        None => {}
    }
    w.drop_link(ino, now_ns, is_open)
}

/// `unleased_at_ns`: only if no other mount's lease is live then on either directory, nor
/// on a directory renamed over (else `FOREIGN_LEASE`, changing nothing).
#[allow(clippy::too_many_arguments)]
pub fn rename<C: Tx>(
    w: &mut Writer<C>,
    parent: u64,
    name: &[u8],
    newparent: u64,
    newname: &[u8],
    flags: u32,
    now_ns: i64,
    unleased_at_ns: Option<i64>,
    is_open: &IsOpen,
) -> Result<Renamed, Errno> {
    let [src, dst] = w.entries_locked([(parent, name), (newparent, newname)])?;
    let parents: &[u64] = if parent == newparent {
        &[parent]
    } else {
        &[parent, newparent]
    };
    w.refuse_foreign_leases(parents, unleased_at_ns)?;
    let (src, src_mode) = src.ok_or(libc::ENOENT)?;
    let src_dir = src_mode & libc::S_IFMT == libc::S_IFDIR;
    let mut renamed = Renamed::default();
    if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
        return Err(libc::EEXIST);
    }
    if parent != newparent {
        // Directories that change parents: the source, and with RENAME_EXCHANGE the target.
        let is_dir = |mode: u32| mode & libc::S_IFMT == libc::S_IFDIR;
        let exchanged_dir =
            dst.filter(|&(_, mode)| flags & libc::RENAME_EXCHANGE != 0 && is_dir(mode));
        let moves: Vec<(u64, u64)> = [
            src_dir.then_some((src, newparent)),
            exchanged_dir.map(|(dst, _)| (dst, parent)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !moves.is_empty() && w.lands_inside_itself(&moves)? {
            return Err(libc::EINVAL);
        }
    }
    // Both names change (a failure below rolls these rows back with the rest).
    w.log(ChangeKind::Entry, src, parent, Some(name), now_ns)?;
    let dst_ino = dst.map_or(src, |(ino, _)| ino);
    w.log(ChangeKind::Entry, dst_ino, newparent, Some(newname), now_ns)?;
    if flags & libc::RENAME_EXCHANGE != 0 {
        let (dst, dst_mode) = dst.ok_or(libc::ENOENT)?;
        let dst_dir = dst_mode & libc::S_IFMT == libc::S_IFDIR;
        for (p, n, ino, mode) in [
            (parent, name, dst, dst_mode),
            (newparent, newname, src, src_mode),
        ] {
            w.tx().execute(
                "UPDATE entries SET ino = ?, kind = ? WHERE parent = ? AND name = ?",
                &args![ino, kind_of(mode), p, n],
            )?;
        }
        if parent != newparent {
            for (ino, is_dir, now_in) in [(src, src_dir, newparent), (dst, dst_dir, parent)] {
                if is_dir {
                    w.tx().execute(
                        "UPDATE inodes SET parent = ? WHERE ino = ?",
                        &args![now_in, ino],
                    )?;
                }
            }
            let delta = src_dir as i64 - dst_dir as i64;
            w.touch_dir(parent, now_ns, -delta)?;
            w.touch_dir(newparent, now_ns, delta)?;
        } else {
            w.touch_dir(parent, now_ns, 0)?;
        }
        for ino in [src, dst] {
            w.set_ctime(ino, now_ns)?;
        }
        return Ok(renamed);
    }
    if let Some((dst, dst_mode)) = dst {
        if dst == src {
            return Ok(renamed);
        }
        let dst_dir = dst_mode & libc::S_IFMT == libc::S_IFDIR;
        match (src_dir, dst_dir) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            _ => {}
        }
        if dst_dir && !w.is_empty_dir_locked(dst)? {
            return Err(libc::ENOTEMPTY);
        }
        if dst_dir {
            w.refuse_foreign_leases(&[dst], unleased_at_ns)?;
        }
        w.delete_entry(newparent, newname)?;
        if dst_dir {
            w.touch_dir(newparent, now_ns, -1)?;
            w.free_inode(dst, now_ns)?;
            renamed.replaced = Some(Removed {
                ino: dst,
                ..Default::default()
            });
        } else {
            renamed.replaced = Some(w.drop_link(dst, now_ns, is_open)?);
        }
    }
    w.delete_entry(parent, name)?;
    w.insert_entry(newparent, newname, src, src_mode)?;
    let moved_dir = src_dir && parent != newparent;
    w.touch_dir(parent, now_ns, -(moved_dir as i64))?;
    if parent != newparent {
        w.touch_dir(newparent, now_ns, moved_dir as i64)?;
    }
    // A directory's `..` follows it; NULL (a non-directory) keeps the column as it is.
    let new_dotdot = src_dir.then_some(newparent);
    w.tx().execute(
        "UPDATE inodes SET ctime_ns = ?, parent = coalesce(?, parent) WHERE ino = ?",
        &args![now_ns, new_dotdot, src],
    )?;
    Ok(renamed)
}

/// `unleased_at_ns`: see `MetaStore::setattr`; checked once the update holds the inode's
/// row lock (`Writer::refuse_foreign_leases`).
pub fn setattr<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    c: &AttrChange,
    unleased_at_ns: Option<i64>,
) -> Result<InodeRec, Errno> {
    let update = (
        "UPDATE inodes SET mode = coalesce(?, mode), uid = coalesce(?, uid), gid = coalesce(?, gid),
         atime_ns = coalesce(?, atime_ns), mtime_ns = coalesce(?, mtime_ns), ctime_ns = ? WHERE ino = ?
         RETURNING ino",
        args![c.mode, c.uid, c.gid, c.atime_ns, c.mtime_ns, c.ctime_ns, ino],
    );
    let Some(mode) = c.mode else {
        if w.tx().query(update.0, &update.1)?.is_empty() {
            return Err(libc::ENOENT);
        }
        w.refuse_foreign_leases(&[ino], unleased_at_ns)?;
        w.log(ChangeKind::Inode, ino, 0, None, c.ctime_ns)?;
        return w.attr(ino);
    };
    // A chmod changes the access ACL's owner, mask (or group) and other entries too
    // (posix_acl_chmod: the kernel leaves it to us under FUSE_POSIX_ACL); its read goes out
    // with the update.
    let [changed, acl] = <[Vec<Row>; 2]>::try_from(w.tx().queries(&[
        (update.0, &update.1),
        (XATTR_VALUE_SQL, &args![ino, acl::ACCESS_XATTR]),
    ])?)
    .map_err(|_| DbError::Other("two queries, not two answers".into()))?;
    if changed.is_empty() {
        return Err(libc::ENOENT);
    }
    w.refuse_foreign_leases(&[ino], unleased_at_ns)?;
    if let Some(row) = acl.first()
        && let Some(value) = acl::chmod(&row.bytes(0)?, mode)
    {
        w.tx().execute_later(
            "UPDATE xattrs SET value = ? WHERE ino = ? AND name = ?",
            &args![&value[..], ino, acl::ACCESS_XATTR],
        )?;
    }
    w.log(ChangeKind::Inode, ino, 0, None, c.ctime_ns)?;
    w.attr(ino)
}

pub fn update_data<C: Tx>(w: &mut Writer<C>, u: &DataUpdate) -> Result<Vec<u64>, Errno> {
    let (sql, args): (&'static str, Vec<Arg>) = if u.keep_times {
        // The inode row's lock only (it orders this against other data commits).
        (
            "UPDATE inodes SET nlink = nlink WHERE ino = ?",
            args![u.ino].into(),
        )
    } else {
        (
            "UPDATE inodes SET size = ?, mtime_ns = ?, ctime_ns = ?, inline_data = ? WHERE ino = ?",
            args![u.size, u.mtime_ns, u.ctime_ns, u.inline.as_ref(), u.ino].into(),
        )
    };
    // An inode this batch created is there: its row is this transaction's.
    if w.deferred_log.is_some() && w.created_inodes.contains(&u.ino) {
        w.tx().execute_later(sql, &args)?;
        w.updates_unwaited += 1;
    } else if w.tx().execute(sql, &args)? == 0 {
        return Err(libc::ENOENT);
    }
    w.log(ChangeKind::Inode, u.ino, 0, None, u.ctime_ns)?;
    if u.inline.is_some() && w.log_changes {
        // Inline bytes mean no chunks, whatever this mount's view of the file was: on a
        // shared volume another mount may have stored chunks since this one read it (the
        // inode's row, locked above, orders the two). Sent with the COMMIT.
        w.tx().execute_later(
            DROP_EVERY_BLOCK_SHARED_SQL,
            &args![u.ino, u.ino, u.ctime_ns],
        )?;
    }
    let mut released = Vec::new();
    if let Some(from) = u.drop_from {
        released.extend(w.release_chunks(u.ino, from, None, u.ctime_ns)?);
    }
    if let Some((idx, len)) = u.trim {
        w.tx().execute_later(
            "UPDATE chunks SET len = CASE WHEN len < ? THEN len ELSE ? END WHERE ino = ? AND idx = ?",
            &args![len, len, u.ino, idx],
        )?;
        // The chunk's slices past the new end go, one across it is shortened.
        let gone = blocks_of(w.tx().query(
            "SELECT block FROM slices WHERE ino = ? AND idx = ? AND pos >= ?",
            &args![u.ino, idx, len],
        )?)?;
        if !gone.is_empty() {
            w.hand_to_gc(&gone, u.ctime_ns)?;
            w.tx().execute_later(
                "DELETE FROM slices WHERE ino = ? AND idx = ? AND pos >= ?",
                &args![u.ino, idx, len],
            )?;
            released.extend(gone);
        }
        w.tx().execute_later(
            "UPDATE slices SET len = ? - pos WHERE ino = ? AND idx = ? AND pos + len > ?",
            &args![len, u.ino, idx, len],
        )?;
    }
    for idx in &u.holes {
        released.extend(w.release_chunks(u.ino, 0, Some(*idx), u.ctime_ns)?);
    }
    for c in &u.set {
        released.extend(w.release_chunks(u.ino, 0, Some(c.idx), u.ctime_ns)?);
        w.tx().execute(
            "INSERT INTO chunks (ino, idx, block, len, crc) VALUES (?, ?, ?, ?, ?)",
            &args![u.ino, c.idx, c.block, c.len, c.crc],
        )?;
    }
    for s in &u.slices {
        // Over the chunk's slices so far: its seq is theirs plus one (the inode's row,
        // updated first, orders two mounts' commits).
        w.tx().execute_later(
            INSERT_SLICE_SQL,
            &args![u.ino, s.idx, s.pos, s.len, s.block, s.crc, u.ino, s.idx],
        )?;
    }
    Ok(released)
}

/// `set.kill_sgid`: setting an access ACL also clears the set-group-ID bit (the kernel's
/// SETXATTR_ACL_KILL_SGID: the caller is neither in the file's group nor privileged).
/// `unleased_at_ns`: as `setattr`'s.
pub fn setxattr<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    set: &XattrSet,
    unleased_at_ns: Option<i64>,
) -> Result<(), Errno> {
    let (name, value, flags, kill_sgid) = (&set.name[..], &set.value[..], set.flags, set.kill_sgid);
    let now_ns = crate::now_ns();
    // An access ACL sets the mode's permission bits (posix_acl_update_mode), and one that
    // says no more than they do is kept as no ACL at all.
    let acl_mode = if name == acl::ACCESS_XATTR {
        Some(acl::mode_bits(value)?)
    } else {
        None
    };
    let keep_bits = !(0o777 | if kill_sgid { libc::S_ISGID } else { 0 }) as i64;
    let ctime: (&'static str, Vec<Arg>) = match acl_mode {
        Some((bits, _)) => (
            "UPDATE inodes SET ctime_ns = ?, mode = (mode & ?) | ? WHERE ino = ? RETURNING ino",
            args![now_ns, keep_bits, bits, ino].into(),
        ),
        None => (
            "UPDATE inodes SET ctime_ns = ? WHERE ino = ? RETURNING ino",
            args![now_ns, ino].into(),
        ),
    };
    // The inode's ctime first (one round trip with the look): its row's lock orders two
    // mounts' XATTR_CREATE or XATTR_REPLACE of one name, and a freed inode is ENOENT.
    let [changed, found] = <[Vec<Row>; 2]>::try_from(w.tx().queries(&[
        (ctime.0, &ctime.1),
        (
            "SELECT 1 FROM xattrs WHERE ino = ? AND name = ?",
            &args![ino, name],
        ),
    ])?)
    .map_err(|_| DbError::Other("two queries, not two answers".into()))?;
    if changed.is_empty() {
        return Err(libc::ENOENT);
    }
    w.refuse_foreign_leases(&[ino], unleased_at_ns)?;
    let exists = !found.is_empty();
    if flags & libc::XATTR_CREATE as u32 != 0 && exists {
        return Err(libc::EEXIST);
    }
    if flags & libc::XATTR_REPLACE as u32 != 0 && !exists {
        return Err(libc::ENODATA);
    }
    if let Some((_, false)) = acl_mode {
        w.tx().execute(
            "DELETE FROM xattrs WHERE ino = ? AND name = ?",
            &args![ino, name],
        )?;
    } else {
        w.tx().execute(UPSERT_XATTR_SQL, &args![ino, name, value])?;
    }
    w.log(ChangeKind::Inode, ino, 0, None, now_ns)
}

/// `unleased_at_ns`: as `setattr`'s.
pub fn removexattr<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    name: &[u8],
    unleased_at_ns: Option<i64>,
) -> Result<(), Errno> {
    if w.set_ctime(ino, crate::now_ns())? == 0 {
        return Err(libc::ENOENT);
    }
    w.refuse_foreign_leases(&[ino], unleased_at_ns)?;
    let n = w.tx().execute(
        "DELETE FROM xattrs WHERE ino = ? AND name = ?",
        &args![ino, name],
    )?;
    if n == 0 {
        return Err(libc::ENODATA);
    }
    w.log(ChangeKind::Inode, ino, 0, None, crate::now_ns())
}

pub fn free_orphan<C: Tx>(w: &mut Writer<C>, ino: u64) -> Result<Vec<u64>, Errno> {
    let nlink = w
        .tx()
        .query_opt("SELECT nlink FROM inodes WHERE ino = ?", &args![ino])?;
    free_unlinked(w, ino, nlink)
}

/// Frees `ino` if its row, read as `nlink` (its link count, or None: gone), says nothing
/// links it.
fn free_unlinked<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    nlink: Option<Row>,
) -> Result<Vec<u64>, Errno> {
    match nlink {
        // Linked again meanwhile (or never orphaned): nothing to free.
        Some(r) if r.int(0)? > 0 => Ok(Vec::new()),
        // Zero links, or no inode row (freed already, its orphan row and any other left).
        _ => w.free_inode(ino, crate::now_ns()),
    }
}

/// This mount has `ino` open and saw it unlinked on another: holds it if it is an orphan
/// (the inode row's lock orders this against the owner's sweep); whether it now holds it.
pub fn hold_orphan<C: Tx>(w: &mut Writer<C>, ino: u64) -> Result<bool, Errno> {
    let session = w.session;
    w.tx()
        .execute("UPDATE inodes SET nlink = nlink WHERE ino = ?", &args![ino])?;
    let n = w.tx().execute(
        "INSERT INTO holds (ino, session) SELECT ino, ? FROM orphans WHERE ino = ?
         ON CONFLICT (ino, session) DO NOTHING",
        &args![session, ino],
    )?;
    if n > 0 {
        return Ok(true);
    }
    Ok(w.tx()
        .query_opt(
            "SELECT 1 FROM holds WHERE ino = ? AND session = ?",
            &args![ino, session],
        )?
        .is_some())
}

/// The last close of an orphan this mount held for another's unlink.
pub fn release_hold<C: Tx>(w: &mut Writer<C>, ino: u64) -> Result<(), Errno> {
    let session = w.session;
    w.tx().execute(
        "DELETE FROM holds WHERE ino = ? AND session = ?",
        &args![ino, session],
    )?;
    Ok(())
}

/// Frees this session's orphans on a shared volume that lost their last name before
/// `before_ns`, that no mount holds and that are not open here; the blocks released.
pub fn sweep_orphans<C: Tx>(
    w: &mut Writer<C>,
    before_ns: i64,
    is_open: &IsOpen,
) -> Result<Vec<u64>, Errno> {
    let session = w.session;
    let due = blocks_of(w.tx().query(
        "SELECT ino FROM orphans o WHERE session = ? AND since_ns > 0 AND since_ns < ?
         AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.ino = o.ino)",
        &args![session, before_ns],
    )?)?;
    let mut released = Vec::new();
    for ino in due {
        if is_open(ino) {
            continue;
        }
        if let Some(blocks) = free_orphan_unless_held(w, ino)? {
            released.extend(blocks);
        }
    }
    Ok(released)
}

/// Frees an orphan unless a mount holds it (then `None`), decided under the inode row's
/// lock, which `hold_orphan` takes before it inserts its hold: a hold that commits meanwhile
/// is seen.
fn free_orphan_unless_held<C: Tx>(w: &mut Writer<C>, ino: u64) -> Result<Option<Vec<u64>>, Errno> {
    let [nlink, held] = <[Vec<Row>; 2]>::try_from(w.tx().queries(&[
        (
            "UPDATE inodes SET nlink = nlink WHERE ino = ? RETURNING nlink",
            &args![ino],
        ),
        ("SELECT 1 FROM holds WHERE ino = ? LIMIT 1", &args![ino]),
    ])?)
    .map_err(|_| DbError::Other("two queries, not two answers".into()))?;
    if !held.is_empty() {
        return Ok(None);
    }
    Ok(Some(free_unlinked(w, ino, nlink.into_iter().next())?))
}

pub fn forget_blocks<C: Tx>(w: &mut Writer<C>, blocks: &[u64]) -> Result<(), Errno> {
    for b in blocks {
        w.tx()
            .execute("DELETE FROM gc_blocks WHERE block = ?", &args![*b])?;
    }
    Ok(())
}

/// Rewrites the session's heartbeat (also what a sync commits: see the stores).
pub fn heartbeat<C: Tx>(w: &mut Writer<C>, now_ns: i64) -> Result<(), Errno> {
    let session = w.session;
    if w.tx().execute(HEARTBEAT_SQL, &args![now_ns, session])? == 0 {
        w.fence();
        return Err(libc::EIO);
    }
    Ok(())
}

/// Requires the session's row, read under a share lock, for the batch to commit: another
/// mount's expiry (which deletes it) then either waits for the batch or makes it fail
/// (PostgreSQL; run only for shared volumes). False, the session fenced, when the row is
/// known gone now; on PostgreSQL the answer comes with the batch's next statement, and the
/// committer asks `Conn::take_row_missing` after it.
pub fn require_session<C: crate::store::Conn>(w: &mut Writer<C>) -> bool {
    let session = w.session;
    match w.conn.require_row(
        "SELECT 1 FROM sessions WHERE id = ? FOR SHARE",
        &args![session],
    ) {
        Ok(true) => true,
        Ok(false) => {
            w.fence();
            false
        }
        Err(_) => false,
    }
}

/// Deletes this session's change-log rows older than `CHANGE_LOG_KEEP_NS`.
pub fn trim_change_log<C: Tx>(w: &mut Writer<C>, now_ns: i64) -> Result<(), Errno> {
    let lo = w.session << CHANGE_SEQ_SESSION_SHIFT;
    let hi = (w.session + 1) << CHANGE_SEQ_SESSION_SHIFT;
    w.tx().execute(
        "DELETE FROM changes WHERE seq >= ? AND seq < ? AND at_ns < ?",
        &args![lo, hi, now_ns - CHANGE_LOG_KEEP_NS],
    )?;
    Ok(())
}

/// The other sessions' change-log rows past `cursors` (session → last seq read), in each
/// session's order; cursors move past what was read, and only if all of it was read (a
/// failed read, or its retry after a reconnect, reads the same rows again). A session that
/// ended since the last read has its rows past its cursor read (its end leaves them), then
/// its cursor is dropped.
pub fn changes_since(
    tx: &mut dyn Tx,
    me: u64,
    cursors_read: &mut std::collections::HashMap<u64, u64>,
) -> Result<Vec<ChangeRec>, Errno> {
    let mut cursors = cursors_read.clone();
    let live = blocks_of(tx.query("SELECT id FROM sessions WHERE id <> ?", &args![me])?)?;
    let ended: Vec<u64> = cursors
        .keys()
        .filter(|s| !live.contains(s))
        .copied()
        .collect();
    let mut out = Vec::new();
    for &session in live.iter().chain(&ended) {
        let cursor = cursors
            .entry(session)
            .or_insert(session << CHANGE_SEQ_SESSION_SHIFT);
        let hi = (session + 1) << CHANGE_SEQ_SESSION_SHIFT;
        for r in tx.query(
            "SELECT seq, ino, parent, name, kind FROM changes WHERE seq > ? AND seq < ? ORDER BY seq",
            &args![*cursor, hi],
        )? {
            let change = ChangeRec {
                seq: r.u64(0)?,
                ino: r.u64(1)?,
                parent: r.u64(2)?,
                name: r.opt_bytes(3)?,
                kind: r.int(4)?,
            };
            *cursor = change.seq;
            out.push(change);
        }
    }
    for session in ended {
        cursors.remove(&session);
    }
    *cursors_read = cursors;
    Ok(out)
}

/// Sets the atimes of `atimes`' inodes (an inode gone since matches no row). One statement
/// each, sent together on PostgreSQL.
pub fn touch_atimes<C: Tx>(w: &mut Writer<C>, atimes: &[(u64, i64)]) -> Result<(), Errno> {
    for &(ino, atime_ns) in atimes {
        if w.log_changes {
            w.attr_events.push((ino, None));
        }
        // Not logged: its copy of a locked directory's row would keep the old atime.
        w.locked_dirs.remove(&ino);
        w.tx().execute_later(
            "UPDATE inodes SET atime_ns = ? WHERE ino = ?",
            &args![atime_ns, ino],
        )?;
    }
    Ok(())
}

pub fn set_fileattr_flags<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    flags: u32,
    may_guard: bool,
    ctime_ns: i64,
) -> Result<(), Errno> {
    // The inode's row first: a chattr of the same inode on another mount waits here, so
    // the flags read below are the ones this change replaces.
    if w.set_ctime(ino, ctime_ns)? == 0 {
        return Err(libc::ENOENT);
    }
    if !may_guard {
        let old = w
            .tx()
            .query_opt(XATTR_VALUE_SQL, &args![ino, FILEATTR_XATTR])?
            .map_or(Ok(0), |r| r.bytes(0).map(|v| fileattr_flags_of(&v)))?;
        if (old ^ flags) & lanefs_fuse::fileattr::GUARD_FLAGS != 0 {
            return Err(libc::EPERM);
        }
    }
    w.log(ChangeKind::Flags, ino, 0, None, ctime_ns)?;
    if flags == 0 {
        w.tx().execute(
            "DELETE FROM xattrs WHERE ino = ? AND name = ?",
            &args![ino, FILEATTR_XATTR],
        )?;
    } else {
        let value = flags.to_le_bytes();
        w.tx()
            .execute(UPSERT_XATTR_SQL, &args![ino, FILEATTR_XATTR, &value[..]])?;
    }
    Ok(())
}

// ---- Sessions ----------------------------------------------------------------------------

/// Registers a new session (inside the caller's transaction); its id.
pub fn register_session(
    tx: &mut dyn Tx,
    host: &str,
    mountpoint: &str,
    now_ns: i64,
) -> Result<u64, DbError> {
    let session = tx
        .query_opt(
            "UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value - 1",
            &args![counter::NEXT_SESSION],
        )?
        .ok_or_else(|| DbError::Other("the next_session counter is missing".into()))?
        .u64(0)?;
    // Block ids are the session's number shifted up (`file::BLOCK_ID_SESSION_SHIFT`): a
    // number past the bits left would share another session's ids (and overwrite its
    // blocks) or make them negative in the database.
    if session == 0 || session >= 1 << (63 - crate::file::BLOCK_ID_SESSION_SHIFT) {
        return Err(DbError::Other(format!(
            "the next_session counter holds {session}, past what block ids can number (a damaged volume)"
        )));
    }
    tx.execute(
        "INSERT INTO sessions (id, host, pid, mountpoint, started_ns, heartbeat_ns) VALUES (?, ?, ?, ?, ?, ?)",
        &args![session, host, std::process::id(), mountpoint, now_ns, now_ns],
    )?;
    Ok(session)
}

/// Ends the sessions other than `session` whose heartbeat is older than `stale_before_ns`
/// (i64::MAX: every other session, for an engine where one mount holds the volume): frees
/// their orphans, drops their inode ranges and their rows (inside the caller's transaction).
/// The sessions ended.
pub fn expire_sessions<C: Tx>(
    w: &mut Writer<C>,
    stale_before_ns: i64,
    now_ns: i64,
) -> Result<Vec<u64>, Errno> {
    let session = w.session;
    // The ended sessions' rows go first: the DELETE takes each row's lock and checks its
    // heartbeat again on the newest version, so a session whose heartbeat commits meanwhile
    // is not ended (and keeps all below, which asks which sessions are left), and one whose
    // heartbeat comes later finds no row and fences itself (`heartbeat`). On a shared volume
    // a row that a batch of its session holds under FOR SHARE (`require_session`) is skipped:
    // that session is ended by a later heartbeat, after its batch. Waiting for the lock
    // instead would hold this mount's committer (and its own heartbeat) for as long as the
    // other's batch stalls: up to PostgreSQL's idle-in-transaction timeout for a mount whose
    // machine froze in the middle of one.
    let dead = blocks_of(if w.log_changes {
        w.tx().query(
            "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions WHERE id <> ? AND heartbeat_ns < ? FOR UPDATE SKIP LOCKED) RETURNING id",
            &args![session, stale_before_ns],
        )
    } else {
        w.tx().query(
            "DELETE FROM sessions WHERE id <> ? AND heartbeat_ns < ? RETURNING id",
            &args![session, stale_before_ns],
        )
    }?)?;
    // Holds of sessions that are not live go; orphans of such sessions (rows left by an
    // earlier cleanup that failed half-way included) are freed, each under its inode row's
    // lock, or, held by a live mount, become this session's, freed by its sweep once the
    // holds are gone.
    w.tx().execute(
        "DELETE FROM holds WHERE session NOT IN (SELECT id FROM sessions)",
        &[],
    )?;
    let orphans = blocks_of(w.tx().query(
        "SELECT ino FROM orphans WHERE session NOT IN (SELECT id FROM sessions)",
        &[],
    )?)?;
    let mut freed = 0;
    for &ino in &orphans {
        if free_orphan_unless_held(w, ino)?.is_some() {
            freed += 1;
        } else {
            w.tx().execute(
                "UPDATE orphans SET session = ?, since_ns = ? WHERE ino = ?",
                &args![session, now_ns, ino],
            )?;
        }
    }
    if freed > 0 {
        tracing::info!("freed {freed} files left open-but-unlinked by ended mounts");
    }
    for sql in [
        "DELETE FROM locks WHERE session NOT IN (SELECT id FROM sessions)",
        "DELETE FROM inode_ranges WHERE session NOT IN (SELECT id FROM sessions)",
        "DELETE FROM leases WHERE session <> 0 AND session NOT IN (SELECT id FROM sessions)",
    ] {
        w.tx().execute(sql, &[])?;
    }
    Ok(dead)
}

/// Moves a session's intent-log watermark (see `intent`).
pub const INTENT_APPLIED_SQL: &str =
    "UPDATE intent_logs SET applied = ?, above = ? WHERE session = ?";
/// Drops a session's intent-log row, once its file is gone.
pub const DROP_INTENT_LOG_SQL: &str = "DELETE FROM intent_logs WHERE session = ?";

/// Ends this session (unmount): its locks, leases, ranges and row (inside the caller's
/// transaction).
pub fn end_session(tx: &mut dyn Tx, session: u64) -> Result<(), DbError> {
    tx.execute("DELETE FROM locks WHERE session = ?", &args![session])?;
    tx.execute("DELETE FROM leases WHERE session = ?", &args![session])?;
    tx.execute("DELETE FROM holds WHERE session = ?", &args![session])?;
    // Orphans another mount still holds go to one of those mounts, whose sweep frees them.
    tx.execute(
        "UPDATE orphans SET session = (SELECT min(h.session) FROM holds h WHERE h.ino = orphans.ino)
         WHERE session = ? AND EXISTS (SELECT 1 FROM holds h WHERE h.ino = orphans.ino)",
        &args![session],
    )?;
    tx.execute(
        "DELETE FROM inode_ranges WHERE session = ?",
        &args![session],
    )?;
    tx.execute("DELETE FROM sessions WHERE id = ?", &args![session])?;
    Ok(())
}

// ---- Directory leases (a shared volume, see `dirops`) --------------------------------------

/// The session other than `me` whose lease on `dir` is live at `now_ns`, if any.
pub fn foreign_lease(
    tx: &mut dyn Tx,
    me: u64,
    dir: u64,
    now_ns: i64,
) -> Result<Option<u64>, Errno> {
    let row = tx.query_opt(
        "SELECT session FROM leases WHERE dir = ? AND session <> 0 AND session <> ? AND expires_ns > ?",
        &args![dir, me, now_ns],
    )?;
    Ok(row.map(|r| r.u64(0)).transpose()?)
}

/// Directories whose lease `me` holds and another mount recalled.
pub fn recalled_leases(tx: &mut dyn Tx, me: u64) -> Result<Vec<u64>, Errno> {
    blocks_of(tx.query(
        "SELECT dir FROM leases WHERE session = ? AND recalled <> 0",
        &args![me],
    )?)
}

/// Takes, lets go or recalls a lease (see [`LeaseChange`]); whether the change took.
pub fn change_lease<C: Tx>(w: &mut Writer<C>, change: LeaseChange) -> Result<bool, Errno> {
    let me = w.session;
    let changed = match change {
        LeaseChange::Take {
            dir,
            now_ns,
            expires_ns,
        } => take_lease(w.tx(), me, dir, now_ns, expires_ns)?,
        LeaseChange::Release {
            dir,
            free_from_ns: Some(free_from_ns),
        } => w.tx().execute(
            // Only while recalled: a let-go queued from a recall read just before an earlier
            // let-go committed must not end a lease taken again since (a take clears it).
            "UPDATE leases SET session = 0, recalled = 0, expires_ns = ? WHERE dir = ? AND session = ? AND recalled <> 0",
            &args![free_from_ns, dir, me],
        )?,
        LeaseChange::Release {
            dir,
            free_from_ns: None,
        } => w.tx().execute(
            "DELETE FROM leases WHERE dir = ? AND session = ?",
            &args![dir, me],
        )?,
        LeaseChange::Recall { dir, holder } => w.tx().execute(
            "UPDATE leases SET recalled = 1 WHERE dir = ? AND session = ?",
            &args![dir, holder],
        )?,
    };
    Ok(changed == 1)
}

/// Takes `dir`'s lease for `me` until `expires_ns`, if nobody holds it, or its holder's
/// lease expired, or its cooldown after a let-go passed, or `me` holds it already and no
/// other mount recalled it (a recalled lease is never extended: neither by a take nor by
/// the heartbeat, so it expires at most `LEASE_TTL` after the recall even when its holder
/// never lets go); the rows taken (0 or 1).
fn take_lease(
    tx: &mut dyn Tx,
    me: u64,
    dir: u64,
    now_ns: i64,
    expires_ns: i64,
) -> Result<u64, Errno> {
    // The directory's row lock first, as every change of its names takes it: a change
    // that checks for other mounts' leases (`Writer::refuse_foreign_leases`) then either
    // committed before this take, and what is answered under the lease reads it, or sees the
    // lease. A directory removed meanwhile takes no lease.
    if tx.execute(
        "UPDATE inodes SET nlink = nlink WHERE ino = ? AND nlink > 0",
        &args![dir],
    )? == 0
    {
        return Ok(0);
    }
    Ok(tx.execute(
        "INSERT INTO leases (dir, session, epoch, expires_ns, recalled) VALUES (?, ?, 1, ?, 0)
         ON CONFLICT (dir) DO UPDATE SET session = excluded.session,
             epoch = leases.epoch + 1, expires_ns = excluded.expires_ns, recalled = 0
         WHERE (leases.session = excluded.session AND leases.recalled = 0)
             OR leases.expires_ns <= ?",
        &args![dir, me, expires_ns, now_ns],
    )?)
}

/// Renews the session's leases that no other mount recalled until `expires_ns` (with the
/// heartbeat); the directories renewed. A recalled lease is left to expire: its holder
/// lets go of it at its next look at the recalls, and if that never comes, the waiting
/// mount still gets the directory within `LEASE_TTL`.
pub fn renew_leases<C: Tx>(w: &mut Writer<C>, expires_ns: i64) -> Result<Vec<u64>, Errno> {
    let me = w.session;
    w.tx().execute(
        "UPDATE leases SET expires_ns = ? WHERE session = ? AND recalled = 0",
        &args![expires_ns, me],
    )?;
    blocks_of(w.tx().query(
        "SELECT dir FROM leases WHERE session = ? AND recalled = 0",
        &args![me],
    )?)
}

// ---- Locks (a shared volume) -------------------------------------------------------------

/// Reads the first lock of another owner (another session's, or another owner's here) that
/// conflicts with `req`: same inode and kind, overlapping range, and one of them a write lock.
pub fn lock_conflict(
    tx: &mut dyn Tx,
    session: u64,
    req: &LockReq,
) -> Result<Option<LockHolder>, Errno> {
    let row = tx.query_opt(
        "SELECT typ, lock_start, lock_end, pid FROM locks
         WHERE ino = ? AND kind = ? AND lock_end >= ? AND lock_start <= ?
           AND NOT (session = ? AND owner = ?) AND (typ = ? OR ? = ?) LIMIT 1",
        &args![
            req.ino,
            req.kind as i64,
            req.start,
            req.end,
            session,
            req.owner,
            LOCK_WRITE,
            req.typ,
            LOCK_WRITE
        ],
    )?;
    Ok(match row {
        Some(r) => Some(LockHolder {
            typ: r.int(0)?,
            start: r.int(1)?,
            end: r.int(2)?,
            pid: r.u32(3)?,
        }),
        None => None,
    })
}

/// SETLK: takes, changes or (typ F_UNLCK) drops the owner's lock on a range; the conflicting
/// lock instead when another owner holds one (nothing changed). Serialised per inode by the
/// inode row's lock, so two mounts cannot both find the range free and both take it.
pub fn set_lock<C: Tx>(w: &mut Writer<C>, req: &LockReq) -> Result<Option<LockHolder>, Errno> {
    let session = w.session;
    if req.typ != LOCK_UNLOCK {
        let found = w.tx().execute(
            "UPDATE inodes SET nlink = nlink WHERE ino = ?",
            &args![req.ino],
        )?;
        if found == 0 {
            return Err(libc::ENOENT);
        }
        if req.kind == LockKind::Flock {
            // flock(2) converts a lock as Linux does: the owner's old lock goes first, and
            // stays gone if the new one must wait or fails. (Kept until the new one was
            // granted, two shared holders upgrading at once waited for each other for ever.)
            w.tx().execute(
                "DELETE FROM locks WHERE ino = ? AND session = ? AND owner = ? AND kind = ?",
                &args![req.ino, session, req.owner, req.kind as i64],
            )?;
        }
        if let Some(holder) = lock_conflict(w.tx(), session, req)? {
            return Ok(Some(holder));
        }
    }
    // The owner's own locks in the range are replaced (POSIX: a new lock over an old one of
    // the same owner changes its type there); the parts outside the range stay.
    let mine = w.tx().query(
        "SELECT typ, lock_start, lock_end, pid FROM locks
         WHERE ino = ? AND session = ? AND owner = ? AND kind = ? AND lock_end >= ? AND lock_start <= ?",
        &args![req.ino, session, req.owner, req.kind as i64, req.start, req.end],
    )?;
    if !mine.is_empty() {
        w.tx().execute(
            "DELETE FROM locks
             WHERE ino = ? AND session = ? AND owner = ? AND kind = ? AND lock_end >= ? AND lock_start <= ?",
            &args![req.ino, session, req.owner, req.kind as i64, req.start, req.end],
        )?;
    }
    let mut keep = Vec::new();
    for r in &mine {
        let (typ, start, end, pid) = (r.int(0)?, r.int(1)?, r.int(2)?, r.int(3)?);
        if start < req.start {
            keep.push((typ, start, req.start - 1, pid));
        }
        if end > req.end {
            keep.push((typ, req.end + 1, end, pid));
        }
    }
    if req.typ != LOCK_UNLOCK {
        keep.push((req.typ, req.start, req.end, req.pid as i64));
    }
    for (typ, start, end, pid) in keep {
        w.tx().execute(
            "INSERT INTO locks (ino, session, owner, kind, typ, lock_start, lock_end, pid)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            &args![
                req.ino,
                session,
                req.owner,
                req.kind as i64,
                typ,
                start,
                end,
                pid
            ],
        )?;
    }
    Ok(None)
}

/// Drops this session's locks on an inode: one owner's of one kind, or (None) all of them.
pub fn release_locks<C: Tx>(
    w: &mut Writer<C>,
    ino: u64,
    owner: Option<(u64, LockKind)>,
) -> Result<(), Errno> {
    let session = w.session;
    match owner {
        Some((owner, kind)) => w.tx().execute(
            "DELETE FROM locks WHERE ino = ? AND session = ? AND owner = ? AND kind = ?",
            &args![ino, session, owner, kind as i64],
        )?,
        None => w.tx().execute(
            "DELETE FROM locks WHERE ino = ? AND session = ?",
            &args![ino, session],
        )?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_column_count_is_the_columns_attr_from_row_reads() {
        assert_eq!(ATTR_COLUMN_COUNT, attr_columns!().split(',').count());
    }

    /// How often SQLite prepared `sql` again in three uses from the statement cache, each
    /// with another inode (rusqlite clears the bindings when a statement goes back).
    fn prepared_again(conn: &rusqlite::Connection, sql: &str) -> i32 {
        for ino in 1..=3i64 {
            let mut statement = conn.prepare_cached(sql).unwrap();
            // The inode first, then 10 for any other parameter (a limit).
            let others = statement.parameter_count() - 1;
            let params = std::iter::once(ino).chain(std::iter::repeat_n(10, others));
            let mut rows = statement.query(rusqlite::params_from_iter(params)).unwrap();
            while rows.next().unwrap().is_some() {}
        }
        conn.prepare_cached(sql)
            .unwrap()
            .get_status(rusqlite::StatementStatus::RePrepare)
    }

    /// The reads every OPEN, LISTXATTR and READDIR (and an early rmdir) make, and a flush's
    /// slice insert, are planned once per connection (see `CHUNKS_SQL`'s comment); the plain
    /// `= ?` form of the same statement, which they used to be, is prepared again at every
    /// use.
    #[test]
    fn reads_are_never_prepared_again() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::sqlite::create_schema(&conn, 0).unwrap();
        for sql in [
            READDIR_SQL,
            NAMES_IN_SQL,
            LIST_XATTRS_SQL,
            CHUNKS_SQL,
            SLICES_SQL,
        ] {
            assert_eq!(prepared_again(&conn, sql), 0, "{sql}");
        }
        let plain = CHUNKS_SQL.replace("CAST(? AS BIGINT)", "?");
        assert!(
            prepared_again(&conn, &plain) > 0,
            "SQLite no longer prepares `{plain}` again: the casts can go"
        );
        // Every flush that lays a slice.
        for seq in 1..=3i64 {
            conn.prepare_cached(INSERT_SLICE_SQL)
                .unwrap()
                .execute([7, 0, 0, 4096, seq, 0, 7, 0])
                .unwrap();
        }
        assert_planned_once(&conn, INSERT_SLICE_SQL);
    }

    /// SQLite has not prepared `sql` (in the statement cache) again since it first did.
    fn assert_planned_once(conn: &rusqlite::Connection, sql: &str) {
        let statement = conn.prepare_cached(sql).unwrap();
        assert_eq!(
            statement.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "{sql}"
        );
    }

    /// A new volume's tables, in memory.
    fn memory_tx() -> crate::sqlite::SqliteConn {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::sqlite::create_schema(&conn, 0).unwrap();
        crate::sqlite::SqliteConn(conn)
    }

    /// A READDIRPLUS answer's reads: the records of the inodes that exist and every
    /// inode's xattr names, however many statements they take, each planned once per
    /// connection.
    #[test]
    fn getattrs_and_xattr_names_of_read_many_inodes_in_statements_planned_once() {
        let mut tx = memory_tx();
        let rec = |ino: u64| InodeRec {
            ino,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            size: ino * 3,
            parent: ROOT_INO,
            ..Default::default()
        };
        for ino in 100..300 {
            insert_inode(&mut tx, &rec(ino), None).unwrap();
        }
        // 150 asked: three statements, one of them partly filled; 140..150 and 400.. absent.
        let asked: Vec<u64> = (100..140).chain(400..410).chain(150..250).collect();
        for _ in 0..3 {
            let mut found = getattrs(&mut tx, &asked).unwrap();
            found.sort_by_key(|r| r.ino);
            let expected: Vec<InodeRec> = (100..140).chain(150..250).map(rec).collect();
            assert_eq!(found, expected);
        }
        assert!(getattrs(&mut tx, &[]).unwrap().is_empty());
        for (ino, name) in [(120u64, &b"user.a"[..]), (120, b"user.b"), (200, b"user.a")] {
            tx.execute(UPSERT_XATTR_SQL, &args![ino, name, &b"v"[..]])
                .unwrap();
        }
        let mut names = xattr_names_of(&mut tx, &asked).unwrap();
        names.sort();
        names.iter_mut().for_each(|(_, n)| n.sort());
        assert_eq!(names.len(), asked.len());
        let of = |ino: u64| names.iter().find(|(i, _)| *i == ino).unwrap().1.clone();
        assert_eq!(of(120), vec![b"user.a".to_vec(), b"user.b".to_vec()]);
        assert_eq!(of(200), vec![b"user.a".to_vec()]);
        assert!(of(121).is_empty() && of(405).is_empty());
        assert_planned_once(&tx.0, &GETATTRS_SQL);
        assert_planned_once(&tx.0, &XATTR_NAMES_SQL);
    }

    /// A session that ended between two reads of the change log: its last rows are read
    /// once (other mounts forget what they knew of those inodes), then its cursor goes.
    /// Without the capability, a change of immutable or append-only is refused against the
    /// flags the store holds (another mount may have set them since this mount's copy), and
    /// what does not touch them goes through.
    #[test]
    fn only_a_privileged_caller_changes_the_guard_flags_the_store_holds() {
        use lanefs_fuse::fileattr::{FS_IMMUTABLE_FL, FS_NODUMP_FL};
        let mut w = Writer::new(memory_tx(), 1);
        w.tx()
            .execute(
                "INSERT INTO inodes (ino, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns, ctime_ns, parent)
                 VALUES (7, 33188, 1000, 1000, 0, 1, 0, 0, 0, 0, 1)",
                &[],
            )
            .unwrap();
        let stored = |w: &mut Writer<crate::sqlite::SqliteConn>| fileattr_flags(w.tx()).unwrap();
        set_fileattr_flags(&mut w, 7, FS_IMMUTABLE_FL, true, 1).unwrap();
        // An owner's `chattr +d` computed from a copy that missed the +i.
        assert_eq!(
            set_fileattr_flags(&mut w, 7, FS_NODUMP_FL, false, 2),
            Err(libc::EPERM)
        );
        assert_eq!(stored(&mut w), [(7, FS_IMMUTABLE_FL)]);
        set_fileattr_flags(&mut w, 7, FS_IMMUTABLE_FL | FS_NODUMP_FL, false, 3).unwrap();
        assert_eq!(stored(&mut w), [(7, FS_IMMUTABLE_FL | FS_NODUMP_FL)]);
        set_fileattr_flags(&mut w, 7, 0, true, 4).unwrap();
        assert_eq!(stored(&mut w), []);
    }

    #[test]
    fn the_last_changes_of_a_session_that_ended_are_read() {
        let mut tx = memory_tx();
        let (me, other) = (1u64, 2u64);
        for id in [me, other] {
            tx.execute(
                "INSERT INTO sessions (id, host, pid, mountpoint, started_ns, heartbeat_ns) VALUES (?, 'h', 1, '/m', 0, 0)",
                &args![id],
            )
            .unwrap();
        }
        let change = |tx: &mut crate::sqlite::SqliteConn, n: u64, ino: u64| {
            let seq = (other << CHANGE_SEQ_SESSION_SHIFT) + n;
            tx.execute(
                "INSERT INTO changes (seq, ino, parent, name, kind, at_ns) VALUES (?, ?, 0, NULL, ?, 0)",
                &args![seq, ino, ChangeKind::Inode as i64],
            )
            .unwrap();
        };
        let mut cursors = std::collections::HashMap::new();
        change(&mut tx, 1, 10);
        let inos = |changes: Vec<ChangeRec>| changes.iter().map(|c| c.ino).collect::<Vec<_>>();
        assert_eq!(
            inos(changes_since(&mut tx, me, &mut cursors).unwrap()),
            [10]
        );
        // It changes inode 11, then ends before the next read.
        change(&mut tx, 2, 11);
        tx.execute("DELETE FROM sessions WHERE id = ?", &args![other])
            .unwrap();
        assert_eq!(
            inos(changes_since(&mut tx, me, &mut cursors).unwrap()),
            [11]
        );
        assert!(cursors.is_empty(), "the ended session's cursor stayed");
        assert!(changes_since(&mut tx, me, &mut cursors).unwrap().is_empty());
    }
}
