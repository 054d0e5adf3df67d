//! `lanefs dump` and `lanefs load`: a volume's metadata as one JSON document, and a new
//! volume database made from one. The blocks stay where they are: a loaded database uses the
//! data location of the dump, and takes it over (a restore): it gets a new volume id, which
//! the data location's volume-id object then holds, so the database dumped is refused there
//! from then on ("belongs to another volume"). Two databases using one data location would
//! destroy each other's files: each deletes the blocks it releases, gc deletes the blocks it
//! does not know, and both would number new blocks from the same session counter. The
//! loaded one numbers its sessions past every session that wrote a block there. Sessions,
//! their inode ranges and orphans are not dumped (the volume must not be mounted, and what
//! ended sessions left is freed).

use std::io::{Read, Write};
use std::path::Path;

use rusqlite::types::{Value, ValueRef};
use serde_json::{Map, json};

use crate::blocks::{BlockStore, ObjectBlockStore};
use crate::file::BLOCK_ID_SESSION_SHIFT;
use crate::fsck::Strays;
use crate::location::DataLocation;
use crate::schema::{FORMAT_VERSION, counter, setting};
use crate::sqlite::{self, SqliteConn};
use crate::volume::{self, VolumeLock};

/// The tables a dump holds, in the order a load inserts them.
const TABLES: &[&str] = &[
    "settings",
    "counters",
    "inodes",
    "entries",
    "symlinks",
    "xattrs",
    "chunks",
    "slices",
    "gc_blocks",
];

/// Tables a dump of an older format may lack (they came later and start empty).
const TABLES_SINCE: &[(&str, i64)] = &[("slices", 4)];

fn sql(e: rusqlite::Error) -> String {
    format!("dump: {e}")
}

/// An SQL value as JSON: integers and text as themselves, byte strings as {"hex": "..."}.
fn to_json(v: ValueRef<'_>) -> serde_json::Value {
    match v {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => json!(i),
        ValueRef::Real(f) => json!(f),
        ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
        ValueRef::Blob(b) => {
            json!({ "hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() })
        }
    }
}

fn from_json(v: &serde_json::Value) -> Result<Value, String> {
    Ok(match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Real(n.as_f64().unwrap_or(0.0)),
        },
        serde_json::Value::String(s) => Value::Text(s.clone()),
        serde_json::Value::Object(o) => {
            let hex = o
                .get("hex")
                .and_then(|h| h.as_str())
                .ok_or("load: an object value that is not {\"hex\": ...}")?;
            Value::Blob(from_hex(hex)?)
        }
        other => return Err(format!("load: unexpected value {other}")),
    })
}

/// The bytes a hex string spells. Works on bytes, not on the string's characters: a
/// non-ASCII character is an error, never a slice through the middle of one.
fn from_hex(hex: &str) -> Result<Vec<u8>, String> {
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err("load: a hex value of odd length".into());
    }
    let digit = |d: u8| {
        (d as char)
            .to_digit(16)
            .ok_or_else(|| "load: a hex value with a non-hex digit".to_owned())
    };
    digits
        .chunks_exact(2)
        .map(|pair| Ok((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

/// A column's declared type, as the schema names it.
#[derive(Clone, Copy)]
enum ColumnType {
    Integer,
    Bytes,
    Text,
}

/// The declared types of `table`'s `columns` (each must be one of the table's).
fn column_types(
    conn: &rusqlite::Connection,
    table: &str,
    columns: &[&str],
) -> Result<Vec<ColumnType>, String> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT name, type FROM pragma_table_info('{table}')"
        ))
        .map_err(sql)?;
    let declared: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(|rows| rows.collect())
        .map_err(sql)?;
    columns
        .iter()
        .map(|column| {
            let (_, typ) = declared
                .iter()
                .find(|(name, _)| name == column)
                .ok_or_else(|| format!("load: table {table} has no column {column}"))?;
            Ok(match typ.as_str() {
                "BIGINT" => ColumnType::Integer,
                "BLOB" => ColumnType::Bytes,
                _ => ColumnType::Text,
            })
        })
        .collect()
}

/// `v` if a column of type `typ` may hold it. SQLite would store any value in any column,
/// and a name stored as text is listed but never found (lookups compare bytes).
fn typed(v: Value, typ: ColumnType, table: &str, column: &str) -> Result<Value, String> {
    let fits = matches!(
        (&v, typ),
        (Value::Null, _)
            | (Value::Integer(_), ColumnType::Integer)
            | (Value::Blob(_), ColumnType::Bytes)
            | (Value::Text(_), ColumnType::Text)
    );
    if fits {
        return Ok(v);
    }
    let wanted = match typ {
        ColumnType::Integer => "a 64-bit integer",
        ColumnType::Bytes => "a byte string ({\"hex\": ...})",
        ColumnType::Text => "a string",
    };
    let held = match v {
        Value::Integer(i) => i.to_string(),
        Value::Real(f) => f.to_string(),
        Value::Text(t) => format!("{t:?}"),
        Value::Blob(_) => "a byte string".to_owned(),
        Value::Null => "null".to_owned(),
    };
    Err(format!("load: {table}.{column} holds {held}, not {wanted}"))
}

/// A column name from a dump, used in SQL: letters, digits and `_` only.
fn column_name(name: &str) -> Result<&str, String> {
    let plain = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        Ok(name)
    } else {
        Err(format!("load: {name:?} is not a column name"))
    }
}

/// Writes the volume's metadata to `out` as JSON.
pub fn dump(db: &Path, out: &mut dyn Write) -> Result<(), String> {
    let _lock = VolumeLock::take(db)?;
    let (conn, _settings) = volume::check(db, false)?;
    refuse_unclean(db, &conn)?;
    let mut doc = Map::new();
    doc.insert("lanefs_volume_dump".into(), json!(FORMAT_VERSION));
    for table in TABLES {
        // Every table has at least two columns; the order makes dumps comparable.
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2"))
            .map_err(sql)?;
        let columns: Vec<String> = stmt.column_names().map(|c| c.to_string()).collect();
        let mut rows = stmt.query([]).map_err(sql)?;
        let mut out_rows = Vec::new();
        while let Some(row) = rows.next().map_err(sql)? {
            let values: Vec<serde_json::Value> = (0..columns.len())
                .map(|i| row.get_ref(i).map(to_json))
                .collect::<rusqlite::Result<_>>()
                .map_err(sql)?;
            out_rows.push(serde_json::Value::Array(values));
        }
        doc.insert(
            (*table).to_owned(),
            json!({ "columns": columns, "rows": out_rows }),
        );
    }
    serde_json::to_writer(&mut *out, &serde_json::Value::Object(doc))
        .map_err(|e| format!("dump: writing: {e}"))?;
    writeln!(out).map_err(|e| format!("dump: writing: {e}"))
}

/// A volume a mount left without ending its session (killed, or its machine lost) still
/// has work only a mount finishes: changes it answered before their commit (in its intent
/// log, applied by the next mount) and files it held open after their last unlink (freed by
/// the next mount). A dump taken now would lose the first and keep the second for good.
fn refuse_unclean(db: &Path, conn: &rusqlite::Connection) -> Result<(), String> {
    let sessions: i64 = conn
        .query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))
        .map_err(sql)?;
    let logs = crate::intent::dead_logs(&volume::intent_dir_of(db), None)?;
    let pending: usize = logs.iter().map(|l| l.records.len()).sum();
    if sessions > 0 || pending > 0 {
        return Err(format!(
            "dump: {} was not unmounted cleanly ({sessions} sessions left, {pending} changes answered before their commit in its intent logs); mount it once and unmount it, which finishes their work, then dump",
            db.display()
        ));
    }
    Ok(())
}

/// Makes a new volume database at `db` from a dump read from `input`; returns the problems
/// `repair` repaired. Nothing is taken over unless the whole dump loads into a volume that
/// fsck finds consistent with its data location: a damaged or stale dump (one naming blocks
/// the volume let go of after it) is refused, and the dumped volume stays usable, unless
/// `repair` asks for fsck's repairs (a file whose block is gone then reads zeros there).
pub fn load(db: &Path, input: &mut dyn Read, repair: bool) -> Result<Vec<String>, String> {
    if db.exists() {
        return Err(format!(
            "{} exists; load makes a new volume file",
            db.display()
        ));
    }
    let doc: serde_json::Value = serde_json::from_reader(input)
        .map_err(|e| format!("load: the input is not a dump: {e}"))?;
    let version = match doc.get("lanefs_volume_dump").and_then(|v| v.as_i64()) {
        // Format 2 added only the locks table, which a dump leaves out (locks live with
        // mounts): a dump of format 1 loads as it is.
        Some(v) if (1..=FORMAT_VERSION).contains(&v) => v,
        Some(v) => {
            return Err(format!(
                "load: the dump is of format {v}; this lanefs loads formats 1 to {FORMAT_VERSION}"
            ));
        }
        None => return Err("load: the input is not a lanefs volume dump".into()),
    };
    // Made here, never found: a load or format racing this one on the same path fails here
    // instead of both writing one file, and a failed load removes only what it made.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(db)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                format!("{} exists; load makes a new volume file", db.display())
            }
            _ => format!("{}: {e}", db.display()),
        })?;
    let result = (|| -> Result<Vec<String>, String> {
        volume::forget_intent_logs(db)?;
        let mut conn = SqliteConn(
            rusqlite::Connection::open(db).map_err(|e| format!("{}: {e}", db.display()))?,
        );
        let shown = db.display().to_string();
        conn.0
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
            .map_err(sql)?;
        conn.0.execute_batch("BEGIN IMMEDIATE").map_err(sql)?;
        sqlite::create_schema(&conn.0, crate::now_ns()).map_err(sql)?;
        for table in TABLES {
            let newer = TABLES_SINCE
                .iter()
                .any(|(t, since)| t == table && version < *since);
            let part = match doc.get(*table) {
                Some(part) => part,
                None if newer => continue,
                None => return Err(format!("load: the dump has no table {table}")),
            };
            let columns: Vec<&str> = part["columns"]
                .as_array()
                .ok_or_else(|| format!("load: table {table} has no columns"))?
                .iter()
                .map(|c| column_name(c.as_str().unwrap_or("")))
                .collect::<Result<_, String>>()?;
            let types = column_types(&conn.0, table, &columns)?;
            let insert = format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                columns.join(", "),
                vec!["?"; columns.len()].join(", ")
            );
            let mut stmt = conn
                .0
                .prepare(&insert)
                .map_err(|e| format!("load: {table}: {e}"))?;
            // Required: a table whose rows went missing would load empty, and its blocks
            // would then be the first gc's to delete.
            let rows = part
                .get("rows")
                .and_then(|r| r.as_array())
                .ok_or_else(|| format!("load: table {table} has no list of rows"))?;
            for (n, row) in rows.iter().enumerate() {
                let row = row
                    .as_array()
                    .ok_or_else(|| format!("load: row {n} of {table} is not a list"))?;
                if row.len() != columns.len() {
                    return Err(format!(
                        "load: row {n} of {table} has {} values for {} columns",
                        row.len(),
                        columns.len()
                    ));
                }
                let values = row
                    .iter()
                    .zip(&columns)
                    .zip(&types)
                    .map(|((v, column), typ)| typed(from_json(v)?, *typ, table, column))
                    .collect::<Result<Vec<Value>, String>>()?;
                stmt.execute(rusqlite::params_from_iter(values))
                    .map_err(|e| format!("load: {table}: {e}"))?;
            }
        }
        for name in [counter::NEXT_INODE, counter::NEXT_SESSION] {
            conn.0
                .query_row("SELECT value FROM counters WHERE name = ?1", [name], |_| {
                    Ok(())
                })
                .map_err(|e| format!("load: the dump's counter {name}: {e}"))?;
        }
        // Past every inode the dump holds, whatever its counter says: a create would
        // otherwise fail on a number in use.
        conn.0
            .execute(
                "UPDATE counters SET value = MAX(value, (SELECT COALESCE(MAX(ino), 0) + 1 FROM inodes)) WHERE name = ?1",
                [counter::NEXT_INODE],
            )
            .map_err(sql)?;
        volume::check_settings(&mut conn, &shown, "an SQLite").map_err(|e| format!("load: {e}"))?;
        let takeover = take_over_data(db, &conn.0)?;
        let mut report = crate::fsck::Report::default();
        let strays = crate::fsck::check_all(
            &mut conn,
            &takeover.blocks,
            &mut report,
            &mut |_| {},
            Strays::Expected,
        )?;
        if let (Some(first), false) = (report.problems.first(), repair) {
            return Err(format!(
                "load: the dump does not make a consistent volume with its data location ({} problems; the first: {first}); nothing was loaded and the data location is as it was (`lanefs load --repair` loads it with fsck's repairs)",
                report.problems()
            ));
        }
        // What the dumped volume wrote after the dump: blocks the loaded one lets go of, as
        // it does of those it releases (the reaper and gc delete them; fsck expects them).
        let now = crate::now_ns();
        for block in strays {
            conn.0
                .execute(
                    "INSERT INTO gc_blocks (block, since_ns) VALUES (?1, ?2) ON CONFLICT (block) DO NOTHING",
                    rusqlite::params![block as i64, now],
                )
                .map_err(sql)?;
        }
        conn.0.execute_batch("COMMIT").map_err(sql)?;
        takeover
            .blocks
            .put_volume_id(&takeover.uuid)
            .map_err(|e| format!("load: writing the data location's volume id: {e}"))?;
        Ok(report.problems)
    })();
    if result.is_err() {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            let _ = std::fs::remove_file(&p);
        }
    }
    result
}

/// What `load` takes over once its database is committed: the data location, to mark with
/// the new volume id; held (a data directory's flock) meanwhile.
struct Takeover {
    blocks: ObjectBlockStore,
    uuid: String,
    _lock: VolumeLock,
}

/// Inside `load`'s transaction: checks that the dump's data location is the dumped volume's
/// and is not in use, gives the loaded volume a new id, and numbers its sessions past every
/// session that stored a block there (the dumped volume's sessions after the dump too).
fn take_over_data(db: &Path, conn: &rusqlite::Connection) -> Result<Takeover, String> {
    let get = |name: &str| -> Result<String, String> {
        conn.query_row("SELECT value FROM settings WHERE name = ?1", [name], |r| {
            r.get::<_, String>(0)
        })
        .map_err(|e| format!("load: the dump's setting {name}: {e}"))
    };
    let old_uuid = get(setting::UUID)?;
    let data = DataLocation::from_setting(&get(setting::DATA)?)
        .map_err(|e| format!("load: the dump's data location: {e}"))?;
    let mut lock = VolumeLock::take(db)?;
    lock.cover_data(&data)?;
    let blocks = ObjectBlockStore::open(&data)
        .map_err(|e| format!("load: the data location {data}: {e}"))?;
    match blocks.get_volume_id() {
        Ok(Some(id)) if id == old_uuid => {}
        Ok(Some(_)) => {
            return Err(format!(
                "load: the data location {data} belongs to another volume now (was the dump loaded before?)"
            ));
        }
        Ok(None) => {
            return Err(format!(
                "load: the data location {data} has no volume-id object (is it the dumped volume's?)"
            ));
        }
        Err(e) => return Err(format!("load: the data location {data}: {e}")),
    }
    let newest_session = blocks
        .list(None)
        .map_err(|e| format!("load: listing the data location {data}: {e}"))?
        .into_iter()
        .map(|id| id >> BLOCK_ID_SESSION_SHIFT)
        .max()
        .unwrap_or(0);
    let uuid = volume::random_id()?;
    conn.execute(
        "UPDATE settings SET value = ?1 WHERE name = ?2",
        rusqlite::params![uuid, setting::UUID],
    )
    .map_err(sql)?;
    conn.execute(
        "UPDATE counters SET value = MAX(value, ?1) WHERE name = ?2",
        rusqlite::params![newest_session as i64 + 1, counter::NEXT_SESSION],
    )
    .map_err(sql)?;
    Ok(Takeover {
        blocks,
        uuid,
        _lock: lock,
    })
}
