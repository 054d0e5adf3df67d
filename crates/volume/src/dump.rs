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
use crate::location::DataLocation;
use crate::schema::{FORMAT_VERSION, counter, setting};
use crate::sqlite;
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

/// Makes a new volume database at `db` from a dump read from `input`.
pub fn load(db: &Path, input: &mut dyn Read) -> Result<(), String> {
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
    volume::forget_intent_logs(db)?;
    let conn = rusqlite::Connection::open(db).map_err(|e| format!("{}: {e}", db.display()))?;
    let result = (|| -> Result<(), String> {
        conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
            .map_err(sql)?;
        conn.execute_batch("BEGIN IMMEDIATE").map_err(sql)?;
        sqlite::create_schema(&conn, crate::now_ns()).map_err(sql)?;
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
            let insert = format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                columns.join(", "),
                vec!["?"; columns.len()].join(", ")
            );
            let mut stmt = conn
                .prepare(&insert)
                .map_err(|e| format!("load: {table}: {e}"))?;
            for row in part["rows"].as_array().into_iter().flatten() {
                let values = row
                    .as_array()
                    .ok_or_else(|| format!("load: a row of {table} is not a list"))?
                    .iter()
                    .map(from_json)
                    .collect::<Result<Vec<Value>, String>>()?;
                stmt.execute(rusqlite::params_from_iter(values))
                    .map_err(|e| format!("load: {table}: {e}"))?;
            }
        }
        let takeover = take_over_data(db, &conn)?;
        conn.execute_batch("COMMIT").map_err(sql)?;
        takeover
            .blocks
            .put_volume_id(&takeover.uuid)
            .map_err(|e| format!("load: writing the data location's volume id: {e}"))
    })();
    if let Err(e) = result {
        drop(conn);
        for suffix in ["", "-wal", "-shm"] {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            let _ = std::fs::remove_file(&p);
        }
        return Err(e);
    }
    Ok(())
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
