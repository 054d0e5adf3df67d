//! SQLite as the volume's metadata engine: connections with the volume's settings, the
//! schema's creation, and the [`Conn`] that lets `store.rs` and `ops.rs` run on it. Reads run
//! on the caller's thread on a read connection of its own queue; every change runs on the
//! one write connection, which SQLite allows one of at a time anyway.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, params};

use crate::meta::InodeRec;
use crate::ops::{self, Writer};
use crate::schema;
use crate::sql::{Arg, DbError, Row, Tx, Val};
use crate::store::{Conn, EngineParts, SqlStore};

/// Read connections; a queue uses `queue % READ_CONNECTIONS` (or any idle one).
pub const READ_CONNECTIONS: usize = 8;
/// Prepared statements a connection keeps (more than the volume's statements in all).
pub const STATEMENT_CACHE_CAPACITY: usize = 256;
/// Attempts at BEGIN IMMEDIATE while another process holds the write lock.
pub const BUSY_RETRIES: u32 = 50;
/// SQLite's own wait on a lock before it reports BUSY to us.
pub const BUSY_TIMEOUT: Duration = Duration::from_millis(100);
/// Our wait between BUSY retries grows by this much each time (50 tries: ~6 s in all).
pub const BUSY_BACKOFF_STEP: Duration = Duration::from_millis(5);

/// How often the checkpointer folds the WAL into the database. The writer never checkpoints
/// (`wal_autocheckpoint=0`): a checkpoint fsyncs the database file, which would stall every
/// change queued behind it; in its own thread and connection it runs beside the commits.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// The MetaStore on an SQLite file.
pub type SqliteStore = SqlStore<SqliteConn>;

/// Opens a connection with the volume's settings: WAL, synchronous=NORMAL (see
/// ARCHITECTURE.md, "Durability"), a busy timeout, foreign keys not used.
pub fn connect(path: &Path, write: bool) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    flags |= if write {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    };
    let conn = Connection::open_with_flags(path, flags)?;
    // rusqlite keeps 16 prepared statements by default, fewer than one create's and its
    // batch's, so statements were parsed again all the time; ops.rs has ~130 in all.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    conn.busy_timeout(BUSY_TIMEOUT)?;
    if write {
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(rusqlite::Error::InvalidQuery);
        }
    }
    conn.execute_batch("PRAGMA synchronous=NORMAL")?;
    Ok(conn)
}

/// Creates every table of the newest schema in an empty database (inside the caller's
/// transaction), recording each step.
pub fn create_schema(conn: &Connection, now_ns: i64) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_ns BIGINT NOT NULL)",
    )?;
    for (i, step) in schema::STEPS.iter().enumerate() {
        conn.execute_batch(&schema::step_for(step, "BLOB"))?;
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_ns) VALUES (?, ?)",
            params![i as i64 + 1, now_ns],
        )?;
    }
    Ok(())
}

/// Creates the schema and the root directory in an empty database.
pub fn initialize(
    conn: Connection,
    settings: &[(&str, String)],
    root: &InodeRec,
) -> Result<(), String> {
    let mut conn = SqliteConn(conn);
    conn.0
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| e.to_string())?;
    let result = create_schema(&conn.0, root.ctime_ns)
        .map_err(|e| e.to_string())
        .and_then(|()| ops::initialize(&mut conn, settings, root).map_err(|e| e.to_string()));
    match result {
        Ok(()) => conn.0.execute_batch("COMMIT").map_err(|e| e.to_string()),
        Err(e) => {
            let _ = conn.0.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn error_of(e: rusqlite::Error) -> DbError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::ConstraintViolation => DbError::Unique,
            ErrorCode::DiskFull => DbError::Full(e.to_string()),
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => DbError::Retry(e.to_string()),
            _ => DbError::Other(e.to_string()),
        },
        _ => DbError::Other(e.to_string()),
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(v) => ValueRef::Integer(v),
            Arg::Bytes(b) => ValueRef::Blob(b),
            Arg::Text(t) => ValueRef::Text(t.as_bytes()),
        }))
    }
}

fn val_of(v: ValueRef<'_>) -> Val {
    match v {
        ValueRef::Null => Val::Null,
        ValueRef::Integer(i) => Val::Int(i),
        // No column of the schema is REAL; one would be damage, read as its integer part.
        ValueRef::Real(f) => Val::Int(f as i64),
        ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Val::Bytes(b.to_vec()),
    }
}

fn row_of(r: &rusqlite::Row<'_>, columns: usize) -> rusqlite::Result<Row> {
    (0..columns)
        .map(|i| r.get_ref(i).map(val_of))
        .collect::<rusqlite::Result<_>>()
        .map(Row)
}

/// A connection to the volume's SQLite file.
pub struct SqliteConn(pub Connection);

impl Tx for SqliteConn {
    fn execute(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64, DbError> {
        self.0
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(rusqlite::params_from_iter(args)))
            .map(|n| n as u64)
            .map_err(error_of)
    }

    fn query(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Vec<Row>, DbError> {
        self.0
            .prepare_cached(sql)
            .and_then(|mut s| {
                let columns = s.column_count();
                s.query_map(rusqlite::params_from_iter(args), |r| row_of(r, columns))?
                    .collect()
            })
            .map_err(error_of)
    }

    fn query_opt(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Option<Row>, DbError> {
        self.0
            .prepare_cached(sql)
            .and_then(|mut s| {
                let columns = s.column_count();
                let mut rows = s.query(rusqlite::params_from_iter(args))?;
                rows.next()?.map(|r| row_of(r, columns)).transpose()
            })
            .map_err(error_of)
    }
}

impl Conn for SqliteConn {
    fn begin(&mut self, sync: bool) -> Result<(), DbError> {
        if sync {
            self.run("PRAGMA synchronous=FULL")?;
        }
        let mut tries = 0;
        let begun = loop {
            match self.run("BEGIN IMMEDIATE") {
                Err(DbError::Retry(_)) if tries < BUSY_RETRIES => {
                    tries += 1;
                    if tries == 1 || tries % 10 == 0 {
                        tracing::warn!(
                            "volume: the database is busy (another process holds its write lock); try {tries} of {BUSY_RETRIES}"
                        );
                    }
                    std::thread::sleep(BUSY_BACKOFF_STEP * tries);
                }
                // Still busy after all tries: the batch fails (EIO), it is not run again.
                Err(DbError::Retry(e)) => break Err(DbError::Other(e)),
                other => break other,
            }
        };
        if begun.is_err() && sync {
            self.normal();
        }
        begun
    }

    fn commit(&mut self, sync: bool) -> Result<(), DbError> {
        let committed = self.run("COMMIT");
        if sync {
            self.normal();
        }
        committed
    }

    fn rollback(&mut self) {
        let _ = self.run("ROLLBACK");
        self.normal();
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        if sql.contains(';') {
            self.0.execute_batch(sql).map_err(error_of)
        } else {
            self.run(sql)
        }
    }

    fn begin_read(&mut self) -> Result<(), DbError> {
        self.run("BEGIN")
    }

    fn end_read(&mut self) {
        let _ = self.run("COMMIT");
    }

    /// A batch's statements run under BEGIN IMMEDIATE, which holds the write lock: nothing
    /// inside it is worth running again.
    fn take_failure(&mut self) -> Option<DbError> {
        None
    }

    fn reconnect(&mut self) -> bool {
        false
    }

    fn server_now_ns(&mut self) -> Option<Result<i64, DbError>> {
        None
    }
}

impl SqliteConn {
    /// Runs one statement of ours from the connection's cache of prepared statements:
    /// `execute_batch` would parse it again each time (BEGIN and COMMIT of every read and
    /// batch, the committer's SAVEPOINTs: 4 % of a worker's time in `cp -a` off a volume).
    /// A PRAGMA acts when it is prepared, so a cached one would do nothing the second time
    /// (a sync commit's `synchronous=FULL` among them): those are parsed each time.
    fn run(&mut self, sql: &str) -> Result<(), DbError> {
        if sql.starts_with("PRAGMA") {
            return self.0.execute_batch(sql).map_err(error_of);
        }
        self.0
            .prepare_cached(sql)
            .and_then(|mut s| s.raw_execute())
            .map(drop)
            .map_err(error_of)
    }

    fn normal(&mut self) {
        if let Err(e) = self.run("PRAGMA synchronous=NORMAL") {
            tracing::warn!("volume: PRAGMA synchronous=NORMAL: {e}");
        }
    }
}

/// Unmounted: folds the WAL into the database, so the file is whole on its own.
fn final_checkpoint(conn: &mut SqliteConn) {
    if let Err(e) = conn.0.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
        tracing::warn!("volume: final checkpoint: {e}");
    }
}

impl SqlStore<SqliteConn> {
    /// Opens the volume's database for a mount (which holds the volume's lock): registers a
    /// session, frees what earlier sessions left (their orphans, ranges, rows: with the lock
    /// held, every other session is dead), starts the committer and the checkpointer.
    pub fn open(
        path: &Path,
        host: &str,
        mountpoint: &str,
        now_ns: i64,
    ) -> Result<SqliteStore, String> {
        let sql = |e: rusqlite::Error| e.to_string();
        let mut conn = SqliteConn(connect(path, true).map_err(sql)?);
        conn.begin(false).map_err(|e| e.to_string())?;
        let session =
            ops::register_session(&mut conn, host, mountpoint, now_ns).map_err(|e| e.to_string());
        let mut w = match session {
            Ok(session) => Writer::new(conn, session),
            Err(e) => {
                conn.rollback();
                return Err(e);
            }
        };
        let crashed = match ops::expire_sessions(&mut w, i64::MAX, now_ns) {
            Ok(crashed) => crashed,
            Err(e) => {
                w.conn.rollback();
                return Err(std::io::Error::from_raw_os_error(e).to_string());
            }
        };
        w.conn.commit(false).map_err(|e| e.to_string())?;
        let mut readers = Vec::with_capacity(READ_CONNECTIONS);
        for _ in 0..READ_CONNECTIONS {
            readers.push(SqliteConn(connect(path, false).map_err(sql)?));
        }
        w.conn
            .0
            .execute_batch("PRAGMA wal_autocheckpoint=0")
            .map_err(sql)?;
        let checkpoints = connect(path, true).map_err(sql)?;
        let (stop_checkpoints, stop_rx) = channel::<()>();
        let checkpointer = std::thread::Builder::new()
            .name("lanefs-checkpoint".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(CHECKPOINT_INTERVAL)
                {
                    if let Err(e) = checkpoints.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::warn!("volume: checkpoint: {e}");
                    }
                }
            })
            .map_err(|e| format!("starting the checkpointer: {e}"))?;
        SqlStore::start(EngineParts {
            writer: w,
            readers,
            crashed,
            background: Some((stop_checkpoints, checkpointer)),
            clock: crate::store::VolumeClock::local(),
            session_expiry: None,
            at_close: final_checkpoint,
            // One mount: every read is in-process, nothing to save.
            recent_dir_ttl: None,
            database_gone: Arc::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{Done, Errno, MetaStore, ROOT_INO, wait};
    use crate::sql::args;
    use crate::volume;

    /// A formatted volume in a temp dir, opened as a mount would; removed when dropped.
    struct Fixture {
        dir: std::path::PathBuf,
        db: std::path::PathBuf,
        store: SqliteStore,
    }

    impl Fixture {
        fn new(tag: &str) -> Fixture {
            let dir =
                std::env::temp_dir().join(format!("lanefs-sqlite-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let db = dir.join("v.db");
            volume::format(&db, &dir.join("data"), false).unwrap();
            let store = SqliteStore::open(&db, "test", "/none", 1).unwrap();
            Fixture { dir, db, store }
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.store.close();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A panic in a change or in its answer costs that change (EIO), not the writer: the
    /// changes around it and after it are committed and answered.
    #[test]
    fn a_panicking_change_or_answer_leaves_the_writer_running() {
        let f = Fixture::new("panic");
        let beat = |store: &SqliteStore| {
            wait(|done| {
                store.submit(
                    false,
                    |w| {
                        Tx::execute(&mut w.conn, "UPDATE sessions SET heartbeat_ns = 7", &[])?;
                        Ok(())
                    },
                    done,
                )
            })
        };
        let failed = wait(|done: Done<()>| {
            f.store.submit(
                false,
                |_| -> Result<(), Errno> { panic!("a bug in a change") },
                done,
            )
        });
        assert_eq!(failed, Err(libc::EIO));
        assert_eq!(beat(&f.store), Ok(()));
        let (tx, rx) = std::sync::mpsc::channel();
        f.store.submit(
            false,
            |_| Ok(()),
            Box::new(|_: Result<(), Errno>| panic!("a bug in an answer")),
        );
        f.store.submit(
            false,
            |_| Ok(()),
            Box::new(move |r: Result<(), Errno>| {
                let _ = tx.send(r);
            }),
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(Ok(())));
        assert_eq!(
            beat(&f.store),
            Ok(()),
            "the writer died with the answer's panic"
        );
    }

    /// Changes committed together whose middle one fails (after a statement that went
    /// through, and with a statement the database refuses): the others commit and are
    /// answered Ok, the failing ones get their own errno, and nothing of them is left. A
    /// batch runs without savepoints first, so this is the run again with them.
    #[test]
    fn a_failing_change_in_a_batch_costs_that_change_alone() {
        use std::sync::mpsc::Sender;
        let f = Fixture::new("isolate");
        let store = &f.store;
        let (started_tx, started) = channel::<()>();
        let (release, release_rx) = channel::<()>();
        let (answers_tx, answers) = channel::<(u32, Result<(), Errno>)>();
        let answer = |n: u32, tx: &Sender<(u32, Result<(), Errno>)>| -> Done<()> {
            let tx = tx.clone();
            Box::new(move |r| {
                let _ = tx.send((n, r));
            })
        };
        let set = |name: &'static str, fail: Option<Errno>| {
            move |w: &mut Writer<SqliteConn>| -> Result<(), Errno> {
                Tx::execute(
                    &mut w.conn,
                    "INSERT INTO settings (name, value) VALUES (?, 'x')",
                    &crate::sql::args![name],
                )?;
                match fail {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        };
        std::thread::scope(|scope| {
            // Holds the committer while the others queue, so that they commit as one batch.
            let holder = scope.spawn(move || {
                let release_rx = std::sync::Mutex::new(release_rx);
                wait(|done| {
                    store.submit(
                        false,
                        move |_| {
                            let _ = started_tx.send(());
                            let rx = release_rx.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = rx.recv_timeout(Duration::from_secs(10));
                            Ok(())
                        },
                        done,
                    )
                })
            });
            started.recv_timeout(Duration::from_secs(10)).unwrap();
            store.submit(false, set("first", None), answer(1, &answers_tx));
            store.submit(
                false,
                set("second", Some(libc::ENOENT)),
                answer(2, &answers_tx),
            );
            // A unique violation: the statement itself fails (on PostgreSQL it aborts the
            // transaction).
            store.submit(false, set("first", None), answer(3, &answers_tx));
            store.submit(false, set("fourth", None), answer(4, &answers_tx));
            release.send(()).unwrap();
            assert_eq!(holder.join().unwrap(), Ok(()));
        });
        let mut got: Vec<_> = (0..4)
            .map(|_| answers.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort_by_key(|(n, _)| *n);
        assert!(got[0].1.is_ok() && got[3].1.is_ok(), "{got:?}");
        assert_eq!(got[1].1, Err(libc::ENOENT));
        assert!(got[2].1.is_err(), "a duplicate row was accepted: {got:?}");
        let names = store
            .read(0, |c| {
                let rows = c.query(
                    "SELECT name FROM settings WHERE value = 'x' ORDER BY name",
                    &[],
                )?;
                rows.iter()
                    .map(|r| r.text(0))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(Errno::from)
            })
            .unwrap();
        assert_eq!(names, ["first", "fourth"]);
    }

    /// A recalled lease is never extended: its holder's heartbeat leaves it out of the
    /// renewal and the holder's own take is refused until the lease expired, so the mount
    /// waiting for the directory gets it within `LEASE_TTL` even from a holder that never
    /// looks at its recalls. Once expired, the holder may take it afresh (recall cleared).
    #[test]
    fn a_recalled_lease_is_neither_renewed_nor_taken_again_by_its_holder() {
        use crate::meta::LeaseChange;
        let f = Fixture::new("recall");
        // The root: a lease is taken only on a directory that exists.
        let steps = wait(|done| {
            f.store.submit(
                false,
                |w| {
                    let take = |now_ns: i64| LeaseChange::Take {
                        dir: ROOT_INO,
                        now_ns,
                        expires_ns: now_ns + 100,
                    };
                    let holder = w.session;
                    Ok((
                        ops::change_lease(w, take(100))?,
                        ops::renew_leases(w, 300)?,
                        ops::change_lease(
                            w,
                            LeaseChange::Recall {
                                dir: ROOT_INO,
                                holder,
                            },
                        )?,
                        ops::renew_leases(w, 400)?,
                        ops::change_lease(w, take(200))?,
                        ops::change_lease(w, take(301))?,
                        ops::renew_leases(w, 500)?,
                    ))
                },
                done,
            )
        });
        let (taken, renewed, recalled, renewed_recalled, retaken_live, retaken_expired, after) =
            steps.unwrap();
        assert!(taken && recalled);
        assert_eq!(renewed, vec![ROOT_INO]);
        assert_eq!(
            renewed_recalled,
            Vec::<u64>::new(),
            "a recalled lease was renewed"
        );
        assert!(
            !retaken_live,
            "the holder took its recalled lease again before it expired"
        );
        assert!(
            retaken_expired,
            "the expired lease could not be taken afresh"
        );
        assert_eq!(after, vec![ROOT_INO], "a fresh take kept the old recall");
    }

    /// A lease is taken only on a directory that exists: one removed after a mount's
    /// recall and before its take gets none (the take waits for the remove's row lock).
    #[test]
    fn no_lease_is_taken_on_a_directory_that_is_gone() {
        let f = Fixture::new("gone");
        let take = |dir| crate::meta::LeaseChange::Take {
            dir,
            now_ns: 100,
            expires_ns: 200,
        };
        let taken = wait(|done| {
            f.store.submit(
                false,
                move |w| {
                    Ok((
                        ops::change_lease(w, take(ROOT_INO + 1000))?,
                        ops::change_lease(w, take(ROOT_INO))?,
                    ))
                },
                done,
            )
        });
        assert_eq!(taken.unwrap(), (false, true));
    }

    /// Takes the root directory's lease for the writer's session, from 100 to 200 ns.
    fn take_root_lease(w: &mut Writer<SqliteConn>) -> Result<(), Errno> {
        let take = crate::meta::LeaseChange::Take {
            dir: ROOT_INO,
            now_ns: 100,
            expires_ns: 200,
        };
        assert!(ops::change_lease(w, take)?);
        Ok(())
    }

    /// A regular file `name` to create in the root directory.
    fn root_file(name: &[u8], unleased_at_ns: Option<i64>) -> crate::meta::NewNode {
        crate::meta::NewNode {
            ino: None,
            parent: ROOT_INO,
            name: name.to_vec(),
            mode: libc::S_IFREG | 0o640,
            uid: 7,
            gid: 8,
            rdev: 0,
            target: None,
            now_ns: 5,
            lease_expires_ns: None,
            unleased_at_ns,
            xattrs: Vec::new(),
            inherit: None,
        }
    }

    /// A create outside this mount's lease (`unleased_at_ns`) makes its mode and ACLs
    /// again from the directory's default ACL as its transaction finds it when the caller
    /// built them from another one (another mount changed it since this mount read it); one
    /// built from the default ACL there, or made under a lease, is stored as built.
    #[test]
    fn an_unleased_create_inherits_the_default_acl_its_transaction_reads() {
        use crate::meta::{Inherit, NewNode, XattrSet};
        let f = Fixture::new("inheritacl");
        // u::rw-, g::r--, o::--- (each entry: tag, permissions, id; the id undefined).
        let mut default = 2u32.to_le_bytes().to_vec();
        for (tag, perm) in [(0x01u16, 6u16), (0x04, 4), (0x20, 0)] {
            default.extend(tag.to_le_bytes());
            default.extend(perm.to_le_bytes());
            default.extend(u32::MAX.to_le_bytes());
        }
        let set = XattrSet {
            name: crate::acl::DEFAULT_XATTR.to_vec(),
            value: default.clone(),
            flags: 0,
            kill_sgid: false,
        };
        wait(|done| f.store.setxattr(ROOT_INO, set, None, done)).unwrap();
        // Built as if the directory had no default ACL: 0666 less the umask 022.
        let node = |name: &[u8], kind: u32, known: Option<&[u8]>, unleased: bool| NewNode {
            mode: kind | 0o644,
            inherit: Some(Inherit {
                mode: kind | 0o666,
                umask: 0o022,
                default: known.map(<[u8]>::to_vec),
            }),
            ..root_file(name, unleased.then_some(150))
        };
        let create = |n: NewNode| wait(|done| f.store.create(n, done)).unwrap();
        let stale = create(node(b"stale", libc::S_IFREG, None, true));
        assert_eq!(stale.mode, libc::S_IFREG | 0o640);
        assert_eq!(f.store.getattr(0, stale.ino).unwrap().mode, stale.mode);
        let leased = create(node(b"leased", libc::S_IFREG, None, false));
        assert_eq!(leased.mode, libc::S_IFREG | 0o644);
        let current = create(node(b"current", libc::S_IFREG, Some(&default), true));
        assert_eq!(current.mode, libc::S_IFREG | 0o644);
        // A directory also takes the default ACL itself.
        let dir = create(node(b"dir", libc::S_IFDIR, None, true));
        assert_eq!(dir.mode & 0o777, 0o640);
        assert_eq!(
            f.store
                .getxattr(0, dir.ino, crate::acl::DEFAULT_XATTR)
                .unwrap(),
            default
        );
    }

    /// A create or an unlink checked against other mounts' leases (`NewNode::unleased_at_ns`,
    /// `MetaStore::remove`'s: the synchronous ones on a shared volume) is refused with
    /// `FOREIGN_LEASE`, changing nothing, while another session's lease on the directory is
    /// live; once that lease has expired it is made.
    #[test]
    fn a_create_or_unlink_checked_against_leases_is_refused_while_another_sessions_is_live() {
        let f = Fixture::new("createlease");
        let other = f.store.session + 1;
        wait(|done| {
            f.store.submit(
                false,
                move |w| {
                    take_root_lease(w)?;
                    w.conn.execute(
                        "UPDATE leases SET session = ? WHERE dir = ?",
                        &args![other, ROOT_INO],
                    )?;
                    Ok(())
                },
                done,
            )
        })
        .unwrap();
        let node = |unleased_at_ns| root_file(b"a", Some(unleased_at_ns));
        let root = f.store.getattr(0, ROOT_INO).unwrap();
        let refused = wait(|done| f.store.create(node(150), done));
        assert_eq!(refused, Err(ops::FOREIGN_LEASE));
        assert_eq!(f.store.lookup(0, ROOT_INO, b"a"), Err(libc::ENOENT));
        assert_eq!(f.store.getattr(0, ROOT_INO).unwrap(), root);
        let made = wait(|done| f.store.create(node(250), done)).unwrap();
        assert_eq!(f.store.lookup(0, ROOT_INO, b"a").unwrap(), made);
        // The unlink likewise.
        let unlink = |at_ns| {
            wait(|done| {
                f.store.remove(
                    ROOT_INO,
                    b"a".to_vec(),
                    false,
                    9,
                    Some(at_ns),
                    std::sync::Arc::new(|_| false),
                    done,
                )
            })
        };
        let root = f.store.getattr(0, ROOT_INO).unwrap();
        assert_eq!(unlink(150).map(|r| r.ino), Err(ops::FOREIGN_LEASE));
        assert_eq!(f.store.lookup(0, ROOT_INO, b"a").unwrap(), made);
        assert_eq!(f.store.getattr(0, ROOT_INO).unwrap(), root);
        assert_eq!(unlink(250).map(|r| r.ino), Ok(made.ino));
        assert_eq!(f.store.lookup(0, ROOT_INO, b"a"), Err(libc::ENOENT));
        assert_eq!(f.store.getattr(0, made.ino), Err(libc::ENOENT));
    }

    /// The lookup with the lease check in one statement answers what `lookup` and
    /// `foreign_lease` answer apart: a name present and absent; the directory's lease held
    /// by another session (live, then expired) or by the asker.
    #[test]
    fn a_lookup_with_its_lease_check_answers_as_the_two_reads_apart() {
        let f = Fixture::new("lookuplease");
        let made = wait(|done| f.store.create(root_file(b"a", None), done)).unwrap();
        let holder = f.store.session;
        let answers = wait(|done| {
            f.store.submit(
                false,
                move |w| {
                    take_root_lease(w)?;
                    let other = holder + 1;
                    let both = |w: &mut Writer<SqliteConn>, me: u64, name: &[u8], now: i64| {
                        let apart = (
                            ops::lookup(&mut w.conn, ROOT_INO, name),
                            ops::foreign_lease(&mut w.conn, me, ROOT_INO, now)?,
                        );
                        let together =
                            ops::lookup_and_foreign_lease(&mut w.conn, me, ROOT_INO, name, now)?;
                        Ok::<_, Errno>((apart, together))
                    };
                    Ok(vec![
                        both(w, other, b"a", 150)?,
                        both(w, other, b"absent", 150)?,
                        both(w, other, b"a", 250)?,
                        both(w, holder, b"a", 150)?,
                    ])
                },
                done,
            )
        })
        .unwrap();
        for (apart, together) in &answers {
            assert_eq!(apart, together);
        }
        let holders: Vec<Option<u64>> = answers.iter().map(|(_, (_, h))| *h).collect();
        assert_eq!(holders, vec![Some(holder), Some(holder), None, None]);
        assert_eq!(answers[0].1.0.as_ref().unwrap(), &made);
        assert_eq!(answers[1].1.0, Err(libc::ENOENT));
    }

    /// After a sync, no page of the WAL is only in the page cache: the commits before it are
    /// on the disk.
    #[test]
    fn a_sync_writes_the_wal_to_the_disk() {
        let f = Fixture::new("walsync");
        let mut wal = f.db.clone().into_os_string();
        wal.push("-wal");
        let wal = std::path::PathBuf::from(wal);
        let unwritten = || crate::testing::unwritten_pages(&wal);
        let change = |i: u8| {
            wait(|done| {
                f.store.setxattr(
                    ROOT_INO,
                    crate::meta::XattrSet {
                        name: b"user.x".to_vec(),
                        value: vec![i; 100],
                        flags: 0,
                        kill_sgid: false,
                    },
                    None,
                    done,
                )
            })
            .unwrap()
        };
        // A change committed with synchronous=NORMAL leaves WAL pages to write (the
        // checkpointer may have written them meanwhile: then once more).
        let mut i = 0;
        while {
            change(i);
            i += 1;
            unwritten() == 0 && i < 10
        } {}
        assert!(
            unwritten() > 0,
            "a commit left nothing to write: this test shows nothing"
        );
        wait(|done| f.store.sync(done)).unwrap();
        assert_eq!(unwritten(), 0, "the WAL is not on the disk after a sync");
    }

    /// A sync must commit something: SQLite fsyncs the WAL at a FULL commit only when the
    /// commit writes frames, and another connection's `data_version` changes exactly when a
    /// commit wrote pages.
    #[test]
    fn sync_commits_a_frame_so_the_wal_is_fsynced() {
        let f = Fixture::new("sync");
        let other = connect(&f.db, false).unwrap();
        let version = |c: &Connection| -> i64 {
            c.query_row("PRAGMA data_version", [], |r| r.get(0))
                .unwrap()
        };
        // The first batch of a session takes a range of inode numbers (a write of its own).
        wait(|done| f.store.sync(done)).unwrap();
        let before = version(&other);
        wait(|done| f.store.sync(done)).unwrap();
        assert_ne!(
            version(&other),
            before,
            "a sync committed no frame: nothing was fsynced"
        );
    }
}
