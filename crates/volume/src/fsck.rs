//! `lanefs fsck`: checks a volume that is not mounted, and repairs it with `repair`. Both
//! make the repairs in one transaction; a check rolls it back, so that it reports what a
//! repair would do (a later check sees what an earlier repair changed).
//!
//! Found and repaired, in this order (a repair may create work for a later check):
//! inode rows numbered 0 or below (freed) and inode columns no attribute can have (a mode
//! of no known type, owners and device numbers past 32 bits, a negative parent: set, see
//! `repaired_column`); entries naming a missing
//! inode or a parent that is not a directory (removed); inodes no entry names, orphans of
//! ended sessions included (freed); directories no path from the root reaches (named in the
//! root as `lost+found-INO`); wrong link counts and wrong `..` of directories (set); rows of
//! symlinks, xattrs, chunks and slices whose inode is gone (removed); data rows out of
//! range, which reads refuse (removed: holes); chunks and slices of a file whose bytes are
//! inline (removed); sizes out of range (set to the end of the data); entry names no file
//! can have (renamed); chunks whose block is missing from the block store (made holes),
//! slices whose block is (removed: the chunk reads as it did before them); blocks nothing
//! refers to (deleted). The checks are written once over [`Tx`] and run on SQLite and
//! PostgreSQL alike.

use std::collections::HashSet;
use std::path::Path;

use crate::blocks::{BlockStore, ObjectBlockStore};
use crate::file::{CHUNK_BYTES, MAX_FILE_BYTES};
use crate::meta::ROOT_INO;
use crate::ops;
use crate::postgres::{self, PgConn, PgTarget};
use crate::sql::{Arg, DbError, Tx, args};
use crate::sqlite::SqliteConn;
use crate::store::Conn;
use crate::volume::{self, Settings, VolumeLock};

#[derive(Debug, Default)]
pub struct Report {
    /// One line per problem found.
    pub problems: Vec<String>,
    pub repaired: bool,
    pub inodes: u64,
    pub blocks: u64,
}

impl Report {
    pub fn problems(&self) -> usize {
        self.problems.len()
    }

    pub fn summary(&self) -> String {
        match (self.problems.len(), self.repaired) {
            (0, _) => format!("clean: {} inodes, {} blocks", self.inodes, self.blocks),
            (n, true) => format!(
                "repaired {n} problems ({} inodes, {} blocks)",
                self.inodes, self.blocks
            ),
            (n, false) => format!(
                "{n} problems ({} inodes, {} blocks)",
                self.inodes, self.blocks
            ),
        }
    }
}

fn sql(e: DbError) -> String {
    format!("fsck: {e}")
}

fn ids(
    tx: &mut dyn Tx,
    query: &'static str,
    params: &[crate::sql::Arg<'_>],
) -> Result<Vec<i64>, String> {
    tx.query(query, params)
        .map_err(sql)?
        .iter()
        .map(|r| r.int(0).map_err(sql))
        .collect()
}

/// A volume held for a check: its connection, block store and the lock (SQLite) that keeps
/// mounts away meanwhile.
struct Held<C> {
    conn: C,
    blocks: std::sync::Arc<ObjectBlockStore>,
    _lock: Option<VolumeLock>,
}

fn hold_sqlite(db: &Path) -> Result<Held<SqliteConn>, String> {
    let mut lock = VolumeLock::take(db)?;
    let (conn, settings) = volume::check(db, true)?;
    let blocks = lock.cover_and_open_blocks(db, &settings)?;
    Ok(Held {
        conn: SqliteConn(conn),
        blocks,
        _lock: Some(lock),
    })
}

/// A volume on PostgreSQL, refused while a mount of it is live (heartbeat within
/// `SESSION_EXPIRY`): other mounts would change it under the check.
fn hold_postgres(url: &str, command: &str) -> Result<Held<PgConn>, String> {
    let target = PgTarget::parse(url)?;
    let mut conn = target.connect()?;
    if postgres::volume_tables(&mut conn)? == 0 {
        return Err(format!(
            "{url} is a PostgreSQL database but not a lanefs volume"
        ));
    }
    // Live mounts first: the upgrade must not run under them; and none may start until the
    // connection closes, when the check is done.
    postgres::hold_maintenance_lock(&mut conn, url, command)?;
    let live = volume::live_sessions(&mut conn, url)?;
    if live > 0 {
        return Err(format!(
            "{url} is mounted ({live} live sessions); unmount it everywhere first (a killed mount's session ends {} s after its last heartbeat)",
            postgres::SESSION_EXPIRY.as_secs()
        ));
    }
    volume::migrate(&mut conn, "BYTEA", url)?;
    let settings: Settings = volume::check_settings(&mut conn, url, "a PostgreSQL")?;
    let blocks = volume::open_blocks(Path::new(url), &settings)?;
    Ok(Held {
        conn,
        blocks,
        _lock: None,
    })
}

/// Runs the checks; `progress` gets a line per phase and per problem.
pub fn run(db: &Path, repair: bool, progress: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let source = db.to_string_lossy();
    if postgres::is_url(&source) {
        let mut held = hold_postgres(&source, "fsck")?;
        // PostgreSQL's COMMIT is durable when it returns: nothing more to sync.
        return check_and_repair(&mut held, repair, progress, |_| Ok(()));
    }
    let mut held = hold_sqlite(db)?;
    for log in crate::intent::dead_logs(&volume::intent_dir_of(db), None)? {
        progress(&format!(
            "fsck: note: {} holds {} changes a crashed mount answered before their commit; the next mount applies those that did not commit (fsck checks the database as it is)",
            log.path.display(),
            log.records.len()
        ));
    }
    check_and_repair(&mut held, repair, progress, make_durable)
}

fn check_and_repair<C: Conn>(
    held: &mut Held<C>,
    repair: bool,
    progress: &mut dyn FnMut(&str),
    make_durable: fn(&mut C) -> Result<(), String>,
) -> Result<Report, String> {
    let mut report = Report {
        repaired: repair,
        ..Default::default()
    };
    let conn = &mut held.conn;
    conn.begin(false).map_err(sql)?;
    // The repairs are made in the transaction either way, and rolled back without
    // `repair`: what a check reports is what a repair would do (a later check sees the
    // earlier repairs, as in a repair).
    let result = check_all(conn, &*held.blocks, &mut report, progress, Strays::Problems);
    match result {
        Ok(unreferenced) if repair => {
            conn.commit(false).map_err(sql)?;
            make_durable(conn)?;
            // Deleted only after the commit that stopped referring to them is durable.
            for b in unreferenced {
                held.blocks
                    .delete(b)
                    .map_err(|e| format!("fsck: deleting block {b:016x}: {e}"))?;
            }
            conn.execute("DELETE FROM gc_blocks", &[]).map_err(sql)?;
        }
        Ok(_) => conn.rollback(),
        Err(e) => {
            conn.rollback();
            return Err(e);
        }
    }
    Ok(report)
}

fn exec(conn: &mut dyn Tx, q: &'static str, a: &[crate::sql::Arg<'_>]) -> Result<(), String> {
    conn.execute(q, a).map(|_| ()).map_err(sql)
}

fn problem(report: &mut Report, progress: &mut dyn FnMut(&str), line: String) {
    progress(&line);
    report.problems.push(line);
}

/// What a repair sets an inode's `column` (out of range in `stored`) to: the statement, the
/// value, and its description. Modes keep their permission bits, less set-ID ones, with the
/// type the inode's directory entry gives (a regular file's without one); owners become
/// root (no one else gains a file by it); a parent is the directory that names the inode.
fn repaired_column(
    conn: &mut dyn Tx,
    stored: &ops::StoredInode,
    column: &str,
) -> Result<(&'static str, i64, String), String> {
    let named_by = |conn: &mut dyn Tx, what: &'static str| {
        conn.query_opt(what, &args![stored.ino])
            .map_err(sql)?
            .map(|r| r.int(0))
            .transpose()
            .map_err(sql)
    };
    Ok(match column {
        "mode" => {
            // A directory if anything is in it (the root always: no entry names it, and a
            // file's type would drop everything in the volume as dangling).
            let holds_entries = stored.ino == ROOT_INO as i64
                || named_by(conn, "SELECT 1 FROM entries WHERE parent = ? LIMIT 1")?.is_some();
            let named_kind = named_by(
                conn,
                "SELECT kind FROM entries WHERE ino = ? ORDER BY kind LIMIT 1",
            )?
            .map(|k| k << 12)
            .filter(|&m| ops::is_inode_mode(m));
            let kind = match named_kind {
                _ if holds_entries => i64::from(libc::S_IFDIR),
                Some(kind) => kind,
                None => i64::from(libc::S_IFREG),
            };
            let mode = kind | (stored.mode & 0o1777);
            let set = "UPDATE inodes SET mode = ? WHERE ino = ?";
            (set, mode, format!("mode {mode:o}"))
        }
        "uid" => ("UPDATE inodes SET uid = ? WHERE ino = ?", 0, "uid 0".into()),
        "gid" => ("UPDATE inodes SET gid = ? WHERE ino = ?", 0, "gid 0".into()),
        "rdev" => (
            "UPDATE inodes SET rdev = ? WHERE ino = ?",
            0,
            "rdev 0".into(),
        ),
        _ => {
            let parent = named_by(
                conn,
                "SELECT parent FROM entries WHERE ino = ? ORDER BY parent LIMIT 1",
            )?
            .unwrap_or(ROOT_INO as i64);
            let set = "UPDATE inodes SET parent = ? WHERE ino = ?";
            (set, parent, format!("parent {parent}"))
        }
    })
}

/// The end of the data an inode still has (a regular file's inline bytes, chunks and
/// slices; a symlink's target), for a size out of range; 0 for any other; None for an inode
/// an earlier repair freed.
fn end_of_data(conn: &mut dyn Tx, ino: i64) -> Result<Option<i64>, String> {
    let Some(row) = conn
        .query_opt(
            // Rows in range only (a check without repair leaves the others): products of
            // theirs cannot overflow.
            "SELECT i.mode, coalesce(length(i.inline_data), 0),
               coalesce((SELECT max(idx * ? + len) FROM chunks WHERE ino = i.ino
                 AND idx >= 0 AND idx < ? AND len >= 0 AND len <= ?), 0),
               coalesce((SELECT max(idx * ? + pos + len) FROM slices WHERE ino = i.ino
                 AND idx >= 0 AND idx < ? AND pos >= 0 AND pos < ? AND len >= 0 AND len <= ?), 0),
               coalesce((SELECT length(target) FROM symlinks WHERE ino = i.ino), 0)
             FROM inodes i WHERE i.ino = ?",
            &args![
                CHUNK_BYTES,
                MAX_FILE_BYTES / CHUNK_BYTES,
                CHUNK_BYTES,
                CHUNK_BYTES,
                MAX_FILE_BYTES / CHUNK_BYTES,
                CHUNK_BYTES,
                CHUNK_BYTES,
                ino
            ],
        )
        .map_err(sql)?
    else {
        return Ok(None);
    };
    let int = |i| row.int(i).map_err(sql);
    Ok(Some(match int(0)? & i64::from(libc::S_IFMT) {
        t if t == i64::from(libc::S_IFREG) => int(1)?.max(int(2)?).max(int(3)?),
        t if t == i64::from(libc::S_IFLNK) => int(4)?,
        _ => 0,
    }))
}

/// Deletes an inode's rows, its blocks to gc.
fn free_inode(conn: &mut dyn Tx, ino: i64) -> Result<(), String> {
    exec(
        conn,
        "INSERT INTO gc_blocks (block, since_ns) SELECT block, 0 FROM chunks WHERE ino = ?
         UNION SELECT block, 0 FROM slices WHERE ino = ? ON CONFLICT (block) DO NOTHING",
        &args![ino, ino],
    )?;
    for q in DELETE_INODE_ROWS {
        exec(conn, q, &args![ino])?;
    }
    Ok(())
}

/// `name` if `dir` has no entry by that name, else the first of `name-1`, `name-2`, … it
/// has none by (a repair's name taken by a file already failed the repair).
fn free_name(conn: &mut dyn Tx, dir: i64, name: String) -> Result<String, String> {
    let mut candidate = name.clone();
    for n in 1.. {
        let taken = conn
            .query_opt(
                "SELECT 1 FROM entries WHERE parent = ? AND name = ?",
                &args![dir, candidate.as_bytes()],
            )
            .map_err(sql)?
            .is_some();
        if !taken {
            break;
        }
        candidate = format!("{name}-{n}");
    }
    Ok(candidate)
}

/// Data rows that no file can have: what each is, the inodes that have one, its deletion
/// (of the inode's, the inode first), and the limits both take.
const OUT_OF_RANGE_ROWS: [(&str, &str, &str, &[u64]); 3] = [
    (
        "a chunk",
        "SELECT DISTINCT ino FROM chunks WHERE idx < 0 OR idx >= ? OR len < 0 OR len > ? OR block < 0",
        "DELETE FROM chunks WHERE ino = ? AND (idx < 0 OR idx >= ? OR len < 0 OR len > ? OR block < 0)",
        &[MAX_FILE_BYTES / CHUNK_BYTES, CHUNK_BYTES],
    ),
    // pos + len is summed only once both are known small: SQL does not say in which order
    // an OR's terms run, and PostgreSQL fails the statement on a BIGINT overflow.
    (
        "a slice",
        "SELECT DISTINCT ino FROM slices WHERE CASE
             WHEN idx < 0 OR idx >= ? OR pos < 0 OR pos >= ? OR len < 0 OR len > ? OR block < 0 THEN 1
             WHEN pos + len > ? THEN 1 ELSE 0 END = 1",
        "DELETE FROM slices WHERE ino = ? AND CASE
             WHEN idx < 0 OR idx >= ? OR pos < 0 OR pos >= ? OR len < 0 OR len > ? OR block < 0 THEN 1
             WHEN pos + len > ? THEN 1 ELSE 0 END = 1",
        &[
            MAX_FILE_BYTES / CHUNK_BYTES,
            CHUNK_BYTES,
            CHUNK_BYTES,
            CHUNK_BYTES,
        ],
    ),
    (
        "inline bytes longer than a chunk",
        "SELECT ino FROM inodes WHERE length(inline_data) > ?",
        "UPDATE inodes SET inline_data = NULL WHERE ino = ? AND length(inline_data) > ?",
        &[CHUNK_BYTES],
    ),
];

/// Where a freed inode's rows are.
const DELETE_INODE_ROWS: [&str; 6] = [
    "DELETE FROM chunks WHERE ino = ?",
    "DELETE FROM slices WHERE ino = ?",
    "DELETE FROM inodes WHERE ino = ?",
    "DELETE FROM xattrs WHERE ino = ?",
    "DELETE FROM symlinks WHERE ino = ?",
    "DELETE FROM orphans WHERE ino = ?",
];

/// Rows of inodes that are gone, by table: (table, find, delete).
const STRAY_ROWS: [(&str, &str, &str); 4] = [
    (
        "symlinks",
        "SELECT DISTINCT t.ino FROM symlinks t WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = t.ino)",
        "DELETE FROM symlinks WHERE ino = ?",
    ),
    (
        "xattrs",
        "SELECT DISTINCT t.ino FROM xattrs t WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = t.ino)",
        "DELETE FROM xattrs WHERE ino = ?",
    ),
    (
        "chunks",
        "SELECT DISTINCT t.ino FROM chunks t WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = t.ino)",
        "DELETE FROM chunks WHERE ino = ?",
    ),
    (
        "slices",
        "SELECT DISTINCT t.ino FROM slices t WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = t.ino)",
        "DELETE FROM slices WHERE ino = ?",
    ),
];

/// `entries.kind` of a directory.
const DIR_KIND: i64 = (libc::S_IFDIR >> 12) as i64;

/// Directories (by inode row: mode & 3rd = 4th) that no chain of directory entries (kind
/// 2nd) from the root (1st) reaches, lowest first.
const UNREACHABLE_DIRS_SQL: &str = "WITH RECURSIVE reached (ino) AS (
         SELECT CAST(? AS BIGINT)
         UNION
         SELECT e.ino FROM entries e JOIN reached r ON e.parent = r.ino WHERE e.kind = ?)
     SELECT ino FROM inodes i WHERE (i.mode & ?) = ?
     AND ino NOT IN (SELECT ino FROM reached) ORDER BY ino";

/// What `check_all` makes of blocks no file refers to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strays {
    /// Problems: a volume's own blocks are deleted when released, so a stray is a leftover.
    Problems,
    /// Expected: `lanefs load` of an older dump finds the blocks the dumped volume wrote
    /// after it (the loaded volume forgets them; gc deletes them).
    Expected,
}

/// Checks everything, making the repairs in the caller's transaction; returns the blocks of
/// the data location no file refers to (to delete after the commit).
pub(crate) fn check_all(
    conn: &mut dyn Tx,
    blocks: &dyn BlockStore,
    report: &mut Report,
    progress: &mut dyn FnMut(&str),
    strays: Strays,
) -> Result<Vec<u64>, String> {
    progress("fsck: inode columns");
    // First: the entries check takes an entry under a parent whose mode is not a
    // directory's for dangling, and would drop a damaged directory's whole content.
    let mut bad_sizes = Vec::new();
    for row in conn
        .query(
            "SELECT ino, mode, uid, gid, rdev, nlink, size, atime_ns, mtime_ns, ctime_ns, parent
             FROM inodes ORDER BY ino",
            &[],
        )
        .map_err(sql)?
    {
        let stored = ops::StoredInode::from_row(&row, 0).map_err(sql)?;
        if stored.ino <= 0 {
            // Refused by every mount; the entries naming it go as dangling below.
            problem(
                report,
                progress,
                format!(
                    "an inode row is numbered {}, which no inode can be; freed at repair",
                    stored.ino
                ),
            );
            free_inode(conn, stored.ino)?;
            continue;
        }
        // Link counts are set by their own check below.
        for (column, value) in stored.out_of_range() {
            if column == "nlink" {
                continue;
            }
            let ino = stored.ino;
            if column == "size" {
                bad_sizes.push(ino);
                continue;
            }
            let (set, to, described) = repaired_column(conn, &stored, column)?;
            problem(
                report,
                progress,
                format!("inode {ino} has {column} {value}, out of range; {described} at repair"),
            );
            exec(conn, set, &args![to, ino])?;
        }
    }

    progress("fsck: entries");
    let dangling = conn
        .query(
            "SELECT e.parent, e.name, e.ino FROM entries e LEFT JOIN inodes i ON i.ino = e.ino
             LEFT JOIN inodes p ON p.ino = e.parent
             WHERE i.ino IS NULL OR p.ino IS NULL OR (p.mode & ?) <> ?",
            &args![libc::S_IFMT, libc::S_IFDIR],
        )
        .map_err(sql)?;
    for r in dangling {
        let (parent, name, ino) = (
            r.int(0).map_err(sql)?,
            r.bytes(1).map_err(sql)?,
            r.int(2).map_err(sql)?,
        );
        problem(
            report,
            progress,
            format!(
                "dangling entry {:?} in directory {parent} names inode {ino}, which is missing or has no directory",
                String::from_utf8_lossy(&name)
            ),
        );
        exec(
            conn,
            "DELETE FROM entries WHERE parent = ? AND name = ?",
            &args![parent, &name],
        )?;
    }

    progress("fsck: inodes");
    let unnamed = ids(
        conn,
        // NOT IN a subquery: evaluated once into a set, where NOT EXISTS scanned entries (no
        // index by ino) once per inode.
        "SELECT ino FROM inodes WHERE ino <> ? AND ino NOT IN (SELECT ino FROM entries)",
        &args![ROOT_INO],
    )?;
    for ino in &unnamed {
        problem(
            report,
            progress,
            format!("orphan inode {ino}: no directory entry names it"),
        );
        free_inode(conn, *ino)?;
    }
    let stale_orphans = ids(conn, "SELECT ino FROM orphans", &[])?;
    for ino in stale_orphans {
        problem(
            report,
            progress,
            format!("orphan row for inode {ino} left by an ended mount"),
        );
        exec(conn, "DELETE FROM orphans WHERE ino = ?", &args![ino])?;
    }

    progress("fsck: directories reachable from the root");
    // Directories no path from the root reaches: a loop of directories whose names are in
    // each other (two mounts' crossing moves before those were checked against the volume).
    // Each is reported; the repair names the lowest-numbered one in the root as
    // `lost+found-INO` (its old name goes) and looks again, until every one is reached.
    let mut reported = HashSet::new();
    let mut repaired = HashSet::new();
    loop {
        let cut_off = ids(
            conn,
            UNREACHABLE_DIRS_SQL,
            &args![ROOT_INO, DIR_KIND, libc::S_IFMT, libc::S_IFDIR],
        )?;
        let new: Vec<i64> = cut_off
            .iter()
            .copied()
            .filter(|ino| reported.insert(*ino))
            .collect();
        for ino in &new {
            problem(
                report,
                progress,
                format!("directory {ino} is not reachable from the root (a loop of directories)"),
            );
        }
        let Some(&first) = cut_off.first() else { break };
        if !repaired.insert(first) {
            // Still cut off after its move: nothing more this repair can do.
            problem(
                report,
                progress,
                format!("directory {first} stays unreachable after its move to the root"),
            );
            break;
        }
        let name = free_name(conn, ROOT_INO as i64, format!("lost+found-{first}"))?;
        // A directory has one name: any others go (the link counts below follow), and
        // the one kept is a directory's entry (the walk above follows only those).
        exec(
            conn,
            "DELETE FROM entries WHERE ino = ? AND (parent, name) <>
                 (SELECT parent, name FROM entries WHERE ino = ? ORDER BY parent, name LIMIT 1)",
            &args![first, first],
        )?;
        let moved = conn
            .execute(
                "UPDATE entries SET parent = ?, name = ?, kind = ? WHERE ino = ?",
                &args![ROOT_INO, name.as_bytes(), DIR_KIND, first],
            )
            .map_err(sql)?;
        if moved == 0 {
            // No name at all: the unnamed inodes' check above frees such a directory.
            break;
        }
        exec(
            conn,
            "UPDATE inodes SET parent = ? WHERE ino = ?",
            &args![ROOT_INO, first],
        )?;
    }

    progress("fsck: link counts");
    let counts = conn
        .query(
            // Counted per name and per parent in one pass each (entries has no index by
            // ino: a count per inode read the whole table each time, 10 minutes for a
            // kernel tree).
            "SELECT i.ino, i.nlink, i.mode & ?, coalesce(n.names, 0), coalesce(d.subdirs, 0)
             FROM inodes i
             LEFT JOIN (SELECT ino, count(*) AS names FROM entries GROUP BY ino) n
                 ON n.ino = i.ino
             LEFT JOIN (SELECT parent, count(*) AS subdirs FROM entries WHERE kind = ?
                 GROUP BY parent) d ON d.parent = i.ino",
            &args![libc::S_IFMT, DIR_KIND],
        )
        .map_err(sql)?;
    report.inodes = counts.len() as u64;
    for r in counts {
        let col = |i| r.int(i).map_err(sql);
        let (ino, nlink, kind, names, subdirs) = (col(0)?, col(1)?, col(2)?, col(3)?, col(4)?);
        let want = if kind == libc::S_IFDIR as i64 {
            2 + subdirs
        } else {
            names
        };
        if nlink != want {
            problem(
                report,
                progress,
                format!("inode {ino} has link count {nlink}, should be {want}"),
            );
            exec(
                conn,
                "UPDATE inodes SET nlink = ? WHERE ino = ?",
                &args![want, ino],
            )?;
        }
    }
    let wrong_parent = conn
        .query(
            "SELECT e.ino, e.parent, i.parent FROM entries e JOIN inodes i ON i.ino = e.ino
             WHERE e.kind = ? AND i.parent <> e.parent",
            &args![DIR_KIND],
        )
        .map_err(sql)?;
    for r in wrong_parent {
        let col = |i| r.int(i).map_err(sql);
        let (ino, parent, recorded) = (col(0)?, col(1)?, col(2)?);
        problem(
            report,
            progress,
            format!("directory {ino} records parent {recorded}, but lives in {parent}"),
        );
        exec(
            conn,
            "UPDATE inodes SET parent = ? WHERE ino = ?",
            &args![parent, ino],
        )?;
    }

    progress("fsck: rows of missing inodes");
    for (table, find, delete) in STRAY_ROWS {
        for ino in ids(conn, find, &[])? {
            problem(
                report,
                progress,
                format!("{table} rows for missing inode {ino}"),
            );
            exec(conn, delete, &args![ino])?;
        }
    }

    progress("fsck: data rows out of range");
    // What `ops::check_file_rows` refuses at open (EIO): the rows go at repair, and the
    // range they claimed reads as a hole (their blocks, unreferenced, go below). Before the
    // next check: an oversized inline value dropped here leaves the file its chunks.
    for (what, find, delete, limits) in OUT_OF_RANGE_ROWS {
        let limits: Vec<Arg> = limits.iter().map(|&l| Arg::from(l)).collect();
        for ino in ids(conn, find, &limits)? {
            problem(
                report,
                progress,
                format!("inode {ino} has {what} out of range; dropped at repair"),
            );
            let args: Vec<Arg> = [Arg::from(ino)].into_iter().chain(limits.clone()).collect();
            exec(conn, delete, &args)?;
        }
    }

    progress("fsck: inline files with chunks");
    // A file is inline or chunked, never both; reads go by the inline bytes, so those stay.
    for ino in ids(
        conn,
        "SELECT c.ino FROM chunks c JOIN inodes i ON i.ino = c.ino WHERE i.inline_data IS NOT NULL
         UNION SELECT s.ino FROM slices s JOIN inodes i ON i.ino = s.ino WHERE i.inline_data IS NOT NULL",
        &[],
    )? {
        problem(
            report,
            progress,
            format!("inode {ino} has inline bytes and chunks; the chunks are dropped at repair"),
        );
        exec(
            conn,
            // Not a block another file's chunk refers to (damage may share one).
            "INSERT INTO gc_blocks (block, since_ns) SELECT block, 0 FROM chunks c WHERE ino = ?
             AND NOT EXISTS (SELECT 1 FROM chunks o WHERE o.block = c.block AND o.ino <> c.ino)
             UNION SELECT block, 0 FROM slices s WHERE ino = ?
             AND NOT EXISTS (SELECT 1 FROM slices o WHERE o.block = s.block AND o.ino <> s.ino)
             ON CONFLICT (block) DO NOTHING",
            &args![ino, ino],
        )?;
        exec(conn, "DELETE FROM chunks WHERE ino = ?", &args![ino])?;
        exec(conn, "DELETE FROM slices WHERE ino = ?", &args![ino])?;
    }

    progress("fsck: inode sizes");
    // After the data rows' checks: a size out of range becomes the end of the data the
    // file still has (a symlink's, its target's length; any other's, 0).
    for ino in bad_sizes {
        let Some(size) = end_of_data(conn, ino)? else {
            continue;
        };
        problem(
            report,
            progress,
            format!(
                "inode {ino} has a size out of range; set to {size}, the end of its data, at repair"
            ),
        );
        exec(
            conn,
            "UPDATE inodes SET size = ? WHERE ino = ?",
            &args![size, ino],
        )?;
    }

    progress("fsck: entry names");
    let misnamed = conn
        .query("SELECT parent, name, ino FROM entries", &[])
        .map_err(sql)?
        .into_iter()
        .map(|r| Ok((r.int(0)?, r.bytes(1)?, r.int(2)?)))
        .collect::<Result<Vec<_>, crate::sql::DbError>>()
        .map_err(sql)?
        .into_iter()
        .filter(|(_, name, _)| !ops::is_entry_name(name));
    for (n, (parent, name, ino)) in misnamed.enumerate() {
        let renamed = free_name(conn, parent, format!("bad-name-{ino}-{n}"))?;
        problem(
            report,
            progress,
            format!(
                "entry {:?} in directory {parent} (inode {ino}) is no file name; renamed {renamed} at repair",
                String::from_utf8_lossy(&name)
            ),
        );
        exec(
            conn,
            "UPDATE entries SET name = ? WHERE parent = ? AND name = ?",
            &args![renamed.as_bytes(), parent, &name],
        )?;
    }

    progress("fsck: blocks");
    let stored: HashSet<u64> = blocks
        .list(None)
        .map_err(|e| format!("fsck: listing the data directory: {e}"))?
        .into_iter()
        .collect();
    let chunks = conn
        .query("SELECT ino, idx, block FROM chunks", &[])
        .map_err(sql)?;
    let mut referenced = HashSet::with_capacity(chunks.len());
    for r in chunks {
        let (ino, idx, block) = (
            r.int(0).map_err(sql)?,
            r.int(1).map_err(sql)?,
            r.u64(2).map_err(sql)?,
        );
        if !stored.contains(&block) {
            problem(
                report,
                progress,
                format!(
                    "block {block:016x} of inode {ino} (chunk {idx}) is missing from the data directory; after repair its bytes read as zeros, but where the chunk's slices lie"
                ),
            );
            exec(
                conn,
                "DELETE FROM chunks WHERE ino = ? AND idx = ?",
                &args![ino, idx],
            )?;
        } else {
            referenced.insert(block);
        }
    }
    let slices = conn
        .query("SELECT ino, idx, seq, block FROM slices", &[])
        .map_err(sql)?;
    for r in slices {
        let (ino, idx, seq, block) = (
            r.int(0).map_err(sql)?,
            r.int(1).map_err(sql)?,
            r.int(2).map_err(sql)?,
            r.u64(3).map_err(sql)?,
        );
        if !stored.contains(&block) {
            problem(
                report,
                progress,
                format!(
                    "block {block:016x} of inode {ino} (chunk {idx}, slice {seq}) is missing from the data directory; the chunk reads without it after repair"
                ),
            );
            exec(
                conn,
                "DELETE FROM slices WHERE ino = ? AND idx = ? AND seq = ?",
                &args![ino, idx, seq],
            )?;
        } else {
            referenced.insert(block);
        }
    }
    report.blocks = referenced.len() as u64;
    let released: HashSet<u64> = ids(conn, "SELECT block FROM gc_blocks", &[])?
        .into_iter()
        .map(|b| b as u64)
        .collect();
    let mut unreferenced: Vec<u64> = stored.difference(&referenced).copied().collect();
    unreferenced.sort_unstable();
    for b in &unreferenced {
        if strays == Strays::Problems && !released.contains(b) {
            problem(
                report,
                progress,
                format!("block {b:016x} is in the data directory but no file refers to it"),
            );
        }
    }
    Ok(unreferenced)
}

/// Makes the state just read or committed durable before blocks it no longer refers to are
/// deleted: the commits (and what WAL recovery replayed after a crash) may be in the page
/// cache only. A checkpoint fsyncs the WAL, copies it into the database and fsyncs that.
fn make_durable(conn: &mut SqliteConn) -> Result<(), String> {
    let busy = conn
        .query_opt("PRAGMA wal_checkpoint(FULL)", &[])
        .map_err(sql)?
        .map_or(Ok(0), |r| r.int(0))
        .map_err(sql)?;
    if busy != 0 {
        return Err("the database is busy (another process reads it); try again".into());
    }
    Ok(())
}

/// `lanefs gc`: deletes the blocks no file refers to (released ones whose deletion a crash
/// interrupted, and strays) from a volume that is not mounted. Returns how many it deleted.
pub fn gc(db: &Path) -> Result<usize, String> {
    let source = db.to_string_lossy();
    if postgres::is_url(&source) {
        let mut held = hold_postgres(&source, "gc")?;
        return collect(&mut held, |_| Ok(()));
    }
    let mut held = hold_sqlite(db)?;
    collect(&mut held, make_durable)
}

fn collect<C: Conn>(
    held: &mut Held<C>,
    make_durable: fn(&mut C) -> Result<(), String>,
) -> Result<usize, String> {
    let stored = held
        .blocks
        .list(None)
        .map_err(|e| format!("gc: listing the data directory: {e}"))?;
    let referenced: HashSet<u64> = ids(
        &mut held.conn,
        "SELECT block FROM chunks UNION ALL SELECT block FROM slices",
        &[],
    )?
    .into_iter()
    .map(|b| b as u64)
    .collect();
    make_durable(&mut held.conn)?;
    let mut deleted = 0;
    for b in stored.into_iter().filter(|b| !referenced.contains(b)) {
        held.blocks
            .delete(b)
            .map_err(|e| format!("gc: deleting block {b:016x}: {e}"))?;
        deleted += 1;
    }
    held.conn
        .execute("DELETE FROM gc_blocks", &[])
        .map_err(sql)?;
    Ok(deleted)
}
