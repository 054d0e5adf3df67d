//! `lanefs fsck`: checks a volume that is not mounted, and repairs it with `repair`.
//!
//! Found and repaired, in this order (a repair may create work for a later check):
//! entries naming a missing inode or a parent that is not a directory (removed); inodes no
//! entry names, orphans of ended sessions included (freed); wrong link counts and wrong `..`
//! of directories (set); rows of symlinks, xattrs and chunks whose inode is gone (removed);
//! chunks whose block is missing from the block store (made holes); blocks nothing refers to
//! (deleted).

use std::collections::HashSet;
use std::path::Path;

use rusqlite::{Connection, params};

use crate::blocks::BlockStore;
use crate::meta::ROOT_INO;
use crate::volume::{self, VolumeLock};

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

fn sql(e: rusqlite::Error) -> String {
    format!("fsck: {e}")
}

fn ids(conn: &Connection, query: &str) -> Result<Vec<i64>, String> {
    let mut stmt = conn.prepare(query).map_err(sql)?;
    let rows = stmt.query_map([], |r| r.get(0)).map_err(sql)?;
    rows.collect::<rusqlite::Result<_>>().map_err(sql)
}

/// Runs the checks; `progress` gets a line per phase and per problem.
pub fn run(db: &Path, repair: bool, progress: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let mut lock = VolumeLock::take(db)?;
    let (conn, settings) = volume::check(db, true)?;
    let blocks = volume::open_blocks(db, &settings)?;
    lock.cover_data(&settings.data)?;
    let mut report = Report {
        repaired: repair,
        ..Default::default()
    };
    conn.execute_batch("BEGIN IMMEDIATE").map_err(sql)?;
    let result = check_all(&conn, &*blocks, repair, &mut report, progress);
    match result {
        Ok(unreferenced) if repair => {
            conn.execute_batch("COMMIT").map_err(sql)?;
            make_durable(&conn)?;
            // Deleted only after the commit that stopped referring to them is durable.
            for b in unreferenced {
                blocks
                    .delete(b)
                    .map_err(|e| format!("fsck: deleting block {b:016x}: {e}"))?;
            }
            conn.execute("DELETE FROM gc_blocks", []).map_err(sql)?;
        }
        Ok(_) => conn.execute_batch("ROLLBACK").map_err(sql)?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok(report)
}

fn problem(report: &mut Report, progress: &mut dyn FnMut(&str), line: String) {
    progress(&line);
    report.problems.push(line);
}

/// Returns the blocks to delete after the commit.
fn check_all(
    conn: &Connection,
    blocks: &dyn BlockStore,
    repair: bool,
    report: &mut Report,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<u64>, String> {
    progress("fsck: entries");
    let mut stmt = conn
        .prepare(
            "SELECT e.parent, e.name, e.ino FROM entries e LEFT JOIN inodes i ON i.ino = e.ino
             LEFT JOIN inodes p ON p.ino = e.parent
             WHERE i.ino IS NULL OR p.ino IS NULL OR (p.mode & ?) <> ?",
        )
        .map_err(sql)?;
    let dangling: Vec<(i64, Vec<u8>, i64)> = stmt
        .query_map(params![libc::S_IFMT as i64, libc::S_IFDIR as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(sql)?
        .collect::<rusqlite::Result<_>>()
        .map_err(sql)?;
    for (parent, name, ino) in dangling {
        problem(
            report,
            progress,
            format!(
                "dangling entry {:?} in directory {parent} names inode {ino}, which is missing or has no directory",
                String::from_utf8_lossy(&name)
            ),
        );
        if repair {
            conn.execute(
                "DELETE FROM entries WHERE parent = ? AND name = ?",
                params![parent, name],
            )
            .map_err(sql)?;
        }
    }

    progress("fsck: inodes");
    let unnamed = ids(
        conn,
        &format!(
            "SELECT ino FROM inodes i WHERE ino <> {ROOT_INO} AND NOT EXISTS (SELECT 1 FROM entries e WHERE e.ino = i.ino)"
        ),
    )?;
    for ino in &unnamed {
        problem(
            report,
            progress,
            format!("orphan inode {ino}: no directory entry names it"),
        );
        if repair {
            conn.execute(
                "INSERT INTO gc_blocks (block, since_ns) SELECT block, 0 FROM chunks WHERE ino = ? ON CONFLICT (block) DO NOTHING",
                [ino],
            )
            .map_err(sql)?;
            for table in ["chunks", "inodes", "xattrs", "symlinks", "orphans"] {
                conn.execute(&format!("DELETE FROM {table} WHERE ino = ?"), [ino])
                    .map_err(sql)?;
            }
        }
    }
    let stale_orphans = ids(conn, "SELECT ino FROM orphans")?;
    for ino in stale_orphans {
        problem(
            report,
            progress,
            format!("orphan row for inode {ino} left by an ended mount"),
        );
        if repair {
            conn.execute("DELETE FROM orphans WHERE ino = ?", [ino])
                .map_err(sql)?;
        }
    }

    progress("fsck: link counts");
    let mut stmt = conn
        .prepare(
            "SELECT i.ino, i.nlink, i.mode & ?,
                (SELECT count(*) FROM entries e WHERE e.ino = i.ino),
                (SELECT count(*) FROM entries e WHERE e.parent = i.ino AND e.kind = ?)
             FROM inodes i",
        )
        .map_err(sql)?;
    let counts: Vec<(i64, i64, i64, i64, i64)> = stmt
        .query_map(
            params![libc::S_IFMT as i64, (libc::S_IFDIR >> 12) as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .map_err(sql)?
        .collect::<rusqlite::Result<_>>()
        .map_err(sql)?;
    report.inodes = counts.len() as u64;
    for (ino, nlink, kind, names, subdirs) in counts {
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
            if repair {
                conn.execute(
                    "UPDATE inodes SET nlink = ? WHERE ino = ?",
                    params![want, ino],
                )
                .map_err(sql)?;
            }
        }
    }
    let mut stmt = conn
        .prepare(
            "SELECT e.ino, e.parent, i.parent FROM entries e JOIN inodes i ON i.ino = e.ino
             WHERE e.kind = ? AND i.parent <> e.parent",
        )
        .map_err(sql)?;
    let wrong_parent: Vec<(i64, i64, i64)> = stmt
        .query_map([(libc::S_IFDIR >> 12) as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(sql)?
        .collect::<rusqlite::Result<_>>()
        .map_err(sql)?;
    for (ino, parent, recorded) in wrong_parent {
        problem(
            report,
            progress,
            format!("directory {ino} records parent {recorded}, but lives in {parent}"),
        );
        if repair {
            conn.execute(
                "UPDATE inodes SET parent = ? WHERE ino = ?",
                params![parent, ino],
            )
            .map_err(sql)?;
        }
    }

    progress("fsck: rows of missing inodes");
    for table in ["symlinks", "xattrs", "chunks"] {
        let stray = ids(
            conn,
            &format!(
                "SELECT DISTINCT t.ino FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = t.ino)"
            ),
        )?;
        for ino in stray {
            problem(
                report,
                progress,
                format!("{table} rows for missing inode {ino}"),
            );
            if repair {
                conn.execute(&format!("DELETE FROM {table} WHERE ino = ?"), [ino])
                    .map_err(sql)?;
            }
        }
    }

    progress("fsck: blocks");
    let stored: HashSet<u64> = blocks
        .list(None)
        .map_err(|e| format!("fsck: listing the data directory: {e}"))?
        .into_iter()
        .collect();
    let mut stmt = conn
        .prepare("SELECT ino, idx, block FROM chunks")
        .map_err(sql)?;
    let chunks: Vec<(i64, i64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(sql)?
        .collect::<rusqlite::Result<_>>()
        .map_err(sql)?;
    let mut referenced = HashSet::with_capacity(chunks.len());
    for (ino, idx, block) in chunks {
        let block = block as u64;
        if !stored.contains(&block) {
            problem(
                report,
                progress,
                format!(
                    "block {block:016x} of inode {ino} (chunk {idx}) is missing from the data directory; its bytes read as zeros after repair"
                ),
            );
            if repair {
                conn.execute(
                    "DELETE FROM chunks WHERE ino = ? AND idx = ?",
                    params![ino, idx],
                )
                .map_err(sql)?;
            }
        } else {
            referenced.insert(block);
        }
    }
    report.blocks = referenced.len() as u64;
    let released: HashSet<u64> = ids(conn, "SELECT block FROM gc_blocks")?
        .into_iter()
        .map(|b| b as u64)
        .collect();
    let mut unreferenced: Vec<u64> = stored.difference(&referenced).copied().collect();
    unreferenced.sort_unstable();
    for b in &unreferenced {
        if !released.contains(b) {
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
fn make_durable(conn: &rusqlite::Connection) -> Result<(), String> {
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(FULL)", [], |r| r.get(0))
        .map_err(sql)?;
    if busy != 0 {
        return Err("the database is busy (another process reads it); try again".into());
    }
    Ok(())
}

/// `lanefs gc`: deletes the blocks no file refers to (released ones whose deletion a crash
/// interrupted, and strays) from a volume that is not mounted. Returns how many it deleted.
pub fn gc(db: &Path) -> Result<usize, String> {
    let mut lock = VolumeLock::take(db)?;
    let (conn, settings) = volume::check(db, true)?;
    let blocks = volume::open_blocks(db, &settings)?;
    lock.cover_data(&settings.data)?;
    let stored = blocks
        .list(None)
        .map_err(|e| format!("gc: listing the data directory: {e}"))?;
    let referenced: HashSet<u64> = ids(&conn, "SELECT block FROM chunks")?
        .into_iter()
        .map(|b| b as u64)
        .collect();
    make_durable(&conn)?;
    let mut deleted = 0;
    for b in stored.into_iter().filter(|b| !referenced.contains(b)) {
        blocks
            .delete(b)
            .map_err(|e| format!("gc: deleting block {b:016x}: {e}"))?;
        deleted += 1;
    }
    conn.execute("DELETE FROM gc_blocks", []).map_err(sql)?;
    Ok(deleted)
}
