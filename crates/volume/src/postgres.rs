//! PostgreSQL as the volume's metadata engine, for a volume that many mounts share: the
//! [`Conn`] that lets `store.rs` and `ops.rs` run on it (statements prepared once per
//! connection with `?` rewritten to `$n`, failures sorted into retry / reconnect / errno),
//! the connection settings (no password on a command line), format and open.
//!
//! Transactions run at READ COMMITTED: the operations change rows relative to what is there
//! and lock a directory's row before checking that it is empty (see `ops.rs`), so no
//! operation depends on a snapshot a concurrent commit could make stale. Deadlocks and
//! serialization failures are retried by the committer (`store.rs`, bounded). COMMIT is
//! durable when it returns (`synchronous_commit` on, PostgreSQL's default), so a sync only
//! has to wait for the changes queued before it; with `--async-commit` ordinary commits do
//! not wait for the WAL's flush and a sync's commit does (SQLite's NORMAL and FULL).

use std::collections::HashMap;
use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::future::{BoxFuture, FutureExt, join_all};
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::meta::InodeRec;
use crate::ops::{self, Writer};
use crate::schema;
use crate::sql::{Arg, DbError, Row, Tx, Val};
use crate::store::{Conn, EngineParts, SqlStore, VolumeClock};

/// Read connections of a mount (each a server process on the database's machine).
pub const READ_CONNECTIONS: usize = 4;
/// How often a mount of a shared volume rewrites its session's heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// A session whose heartbeat is older than this is ended by the others (seven missed
/// heartbeats), by a mount that has itself been beating for that long (see `store.rs`).
pub const SESSION_EXPIRY: Duration = Duration::from_secs(15);

/// The key of the advisory lock that keeps new mounts off a volume while `lanefs fsck`,
/// `gc` or `format --force` works on it ("lanefs" and 1). Those hold it exclusively for
/// their connection's life and only then look for live sessions; a mount holds it shared
/// in the transaction that registers its session. So a mount starting during a check is
/// either refused, or registered (committed) before the check looks, and seen: a check
/// never deletes blocks or rows that a mount which started meanwhile has just written.
const MAINTENANCE_LOCK: i64 = 0x6c61_6e65_6673_0001;

/// Takes the maintenance lock (`MAINTENANCE_LOCK`) on `conn` for `command`, until the
/// connection closes.
pub fn hold_maintenance_lock(conn: &mut PgConn, url: &str, command: &str) -> Result<(), String> {
    let held = conn
        .query_opt(
            "SELECT CASE WHEN pg_try_advisory_lock(?) THEN 1 ELSE 0 END",
            &crate::sql::args![MAINTENANCE_LOCK],
        )
        .and_then(|r| r.map_or(Ok(0), |r| r.int(0)))
        .map_err(|e| format!("{url}: {command}: {e}"))?;
    if held != 1 {
        return Err(format!(
            "{url}: {command}: another lanefs fsck, gc or format is working on this volume, or a mount of it is starting; try again when it is done"
        ));
    }
    Ok(())
}
/// How long a lost connection is tried again before the operations waiting on it get EIO,
/// by default (`--db-wait`): long enough for a restart with crash recovery on a loaded
/// machine. Once one such wait was in vain, the database counts as gone for the whole mount
/// (`PgTarget::gone`): every reconnect tries once, so that each operation fails at once
/// instead of waiting this long again, until a connection is made. It may outlast
/// `SESSION_EXPIRY`: every batch checks that the session still exists
/// (`ops::require_session`), so a mount the others ended meanwhile commits nothing.
pub const RECONNECT_WAIT_MAX: Duration = Duration::from_secs(30);
/// The wait between two tries at reconnecting.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(250);
/// One try at connecting gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection whose server stops answering is declared lost after this long without an
/// acknowledgement of what we sent (TCP_USER_TIMEOUT), or after idle keepalive probes:
/// without them a one-sided partition leaves a query blocked for TCP's ~15 minutes.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Server-side bounds on what one of our sessions can hold up for the others: a transaction
/// left idle (its mount frozen or cut off in the middle of a batch) is ended after this
/// long, letting go of the row locks it held (a create holds its parent directory's row
/// until COMMIT), and a statement waiting for a row lock gives up after `LOCK_TIMEOUT` and
/// its batch is run again (55P03 is a retry, as a deadlock is). Our transactions never sit
/// idle: their statements run back to back.
pub const SERVER_OPTIONS: &str =
    "-c idle_in_transaction_session_timeout=10000 -c lock_timeout=5000";

/// The MetaStore on a PostgreSQL database.
pub type PgStore = SqlStore<PgConn>;

/// Whether a mount source or a volume argument names a PostgreSQL database.
pub fn is_url(source: &str) -> bool {
    source.starts_with("postgres://") || source.starts_with("postgresql://")
}

/// A volume's database: where it is, how to connect (with the password from the
/// environment or the password file, never from the URL).
#[derive(Clone)]
pub struct PgTarget {
    /// The URL as the user gave it (it has no password: such a URL is refused).
    pub url: String,
    config: Config,
    /// Commits return before PostgreSQL's WAL is on its disk (`synchronous_commit = off`
    /// for this connection); a sync's commit still waits for it (see `Conn::begin`).
    async_commit: bool,
    /// How long a reconnect waits for the database (see `RECONNECT_WAIT_MAX`).
    wait_max: Duration,
    /// Set when a reconnect waited `wait_max` in vain; cleared by the next connection
    /// made. Shared by the clones (every connection of a mount).
    gone: Arc<AtomicBool>,
}

impl std::fmt::Display for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

impl PgTarget {
    /// Parses a `postgres://user@host:port/db` URL. A password in it is refused (it would
    /// show in `ps`, /proc/mounts and the logs); it comes from PGPASSWORD or the password
    /// file (PGPASSFILE, else ~/.pgpass).
    pub fn parse(url: &str) -> Result<PgTarget, String> {
        // The URL is not echoed: a malformed one may carry a password.
        let mut config: Config = url.parse().map_err(|e| {
            format!("the PostgreSQL URL is malformed ({e}); give postgres://user@host:port/db")
        })?;
        if config.get_password().is_some() {
            return Err(
                "a PostgreSQL URL must not carry a password (ps and /proc/mounts would show it); put it in PGPASSWORD or ~/.pgpass (PGPASSFILE) instead"
                    .to_string(),
            );
        }
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER")
                .or_else(|_| std::env::var("USER"))
                .unwrap_or_else(|_| "postgres".into());
            config.user(&user);
        }
        if let Some(password) = password_for(&config) {
            config.password(password);
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
        config.keepalives(true);
        config.keepalives_idle(KEEPALIVE_IDLE);
        config.options(SERVER_OPTIONS);
        config.application_name("lanefs");
        Ok(PgTarget {
            url: url.to_string(),
            config,
            async_commit: false,
            wait_max: RECONNECT_WAIT_MAX,
            gone: Arc::default(),
        })
    }

    /// The same database, with reconnects that wait `wait_max` for it.
    pub fn with_wait_max(self, wait_max: Duration) -> PgTarget {
        PgTarget { wait_max, ..self }
    }

    /// The flag set while the database is found gone (see `gone`).
    pub fn gone_flag(&self) -> Arc<AtomicBool> {
        self.gone.clone()
    }

    /// The same database, for a committer whose commits do not wait for the WAL's flush.
    pub fn with_async_commit(&self) -> PgTarget {
        PgTarget {
            async_commit: true,
            ..self.clone()
        }
    }

    pub fn connect(&self) -> Result<PgConn, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("{}: cannot start the connection's runtime: {e}", self.url))?;
        let (client, connection) = runtime
            .block_on(self.config.connect(NoTls))
            .map_err(|e| format!("{}: cannot connect: {}", self.url, describe(&e)))?;
        // The connection's socket is read and written while a statement is awaited (the
        // runtime runs only inside `block_on`); its end shows as a closed client.
        runtime.spawn(connection);
        if self.async_commit {
            runtime
                .block_on(client.batch_execute("SET synchronous_commit = off"))
                .map_err(|e| format!("{}: {}", self.url, describe(&e)))?;
        }
        Ok(PgConn {
            runtime,
            client,
            target: self.clone(),
            statements: HashMap::new(),
            begin: None,
            later: Vec::new(),
            required: None,
            row_missing: false,
            failure: None,
            aborted: false,
            unflushed: false,
            maybe_lost: false,
        })
    }
}

/// The password for a connection: PGPASSWORD, else the first matching line of the password
/// file (`host:port:database:user:password`, `*` matching anything, as libpq reads it).
fn password_for(config: &Config) -> Option<Vec<u8>> {
    if let Ok(p) = std::env::var("PGPASSWORD") {
        return Some(p.into_bytes());
    }
    let path = std::env::var_os("PGPASSFILE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pgpass")))?;
    let text = std::fs::read_to_string(path).ok()?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_string(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let db = config.get_dbname().unwrap_or_default().to_string();
    let user = config.get_user().unwrap_or_default().to_string();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass(line);
            let [h, p, d, u, password] = fields.as_slice() else {
                return None;
            };
            let matches = |field: &str, value: &str| field == "*" || field == value;
            (matches(h, &host) && matches(p, &port) && matches(d, &db) && matches(u, &user))
                .then(|| password.clone().into_bytes())
        })
}

/// A password-file line's five fields (`\:` and `\\` escape).
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(field)) = (chars.next(), fields.last_mut()) {
                    field.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

/// `?` placeholders as `$1, $2, …` (outside quoted text).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let (mut n, mut quoted) = (0, false);
    for c in sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            c => out.push(c),
        }
    }
    out
}

/// A server error's message with its detail, or the client's.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => match e.source() {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

fn error_of(e: &tokio_postgres::Error) -> DbError {
    let text = describe(e);
    let Some(code) = e.code() else {
        // No SQLSTATE: the client's own failure. A closed connection or an I/O error is a
        // lost connection; anything else (a value the statement did not accept) is ours.
        let io = e.source().is_some_and(|s| s.is::<std::io::Error>());
        return if e.is_closed() || io {
            DbError::Lost(text)
        } else {
            DbError::Other(text)
        };
    };
    if *code == SqlState::UNIQUE_VIOLATION {
        DbError::Unique
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::LOCK_NOT_AVAILABLE
    {
        DbError::Retry(text)
    } else if *code == SqlState::DISK_FULL {
        DbError::Full(text)
    } else if *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
    {
        DbError::Lost(text)
    } else {
        DbError::Other(text)
    }
}

type SqlResult<T> = Result<T, Box<dyn std::error::Error + Sync + Send>>;

/// Arguments bind to whatever integer width, boolean or text type the server inferred for
/// the parameter (one statement text serves both engines).
impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> SqlResult<IsNull> {
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(v) if *ty == Type::INT8 => v.to_sql(ty, out),
            Arg::Int(v) if *ty == Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
            Arg::Int(v) if *ty == Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
            Arg::Int(v) if *ty == Type::BOOL => (v != 0).to_sql(ty, out),
            Arg::Int(v) => v.to_string().as_str().to_sql(ty, out),
            Arg::Bytes(b) => b.to_sql(ty, out),
            Arg::Text(t) => t.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        [
            Type::INT8,
            Type::INT4,
            Type::INT2,
            Type::BOOL,
            Type::BYTEA,
            Type::TEXT,
            Type::VARCHAR,
            Type::NAME,
        ]
        .contains(ty)
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for Val {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> SqlResult<Val> {
        Ok(if *ty == Type::INT8 {
            Val::Int(i64::from_sql(ty, raw)?)
        } else if *ty == Type::INT4 {
            Val::Int(i32::from_sql(ty, raw)?.into())
        } else if *ty == Type::INT2 {
            Val::Int(i16::from_sql(ty, raw)?.into())
        } else if *ty == Type::BOOL {
            Val::Int(bool::from_sql(ty, raw)?.into())
        } else if *ty == Type::BYTEA {
            Val::Bytes(raw.to_vec())
        } else {
            Val::Text(String::from_sql(ty, raw)?)
        })
    }

    fn from_sql_null(_: &Type) -> SqlResult<Val> {
        Ok(Val::Null)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INT8
            || *ty == Type::INT4
            || *ty == Type::INT2
            || *ty == Type::BOOL
            || *ty == Type::BYTEA
            || <String as FromSql>::accepts(ty)
    }
}

/// A connection to the volume's database. Statements are pipelined: a transaction's BEGIN
/// and the statements whose answer the logic does not wait for (`Tx::execute_later`) go out
/// with the next statement it does wait for, or with COMMIT, in one round trip. Each
/// statement keeps its own Sync, so PostgreSQL runs them in order and, after a failure,
/// refuses the rest of the transaction (its COMMIT becomes a ROLLBACK): the first failure is
/// the one reported.
pub struct PgConn {
    /// Runs the connection's I/O while a statement is awaited; current-thread, so the
    /// caller's thread does the work, as with a blocking client.
    runtime: Runtime,
    client: Client,
    target: PgTarget,
    /// Prepared statements by their text's address and length (every statement is a
    /// `&'static str`, so one address is one text).
    statements: HashMap<(usize, usize), Statement>,
    /// The transaction's BEGIN, not sent yet: it goes out with the first statement.
    begin: Option<&'static str>,
    /// Statements of the transaction not sent yet, in order (see `Tx::execute_later`).
    later: Vec<(Statement, Vec<Val>)>,
    /// A query the transaction requires a row of, not sent yet: it goes out after the BEGIN
    /// and ahead of `later` (see `Conn::require_row`).
    required: Option<(Statement, Vec<Val>)>,
    /// A `required` query found no row: the round trip that sent it failed.
    row_missing: bool,
    /// A retry or lost-connection failure in the current transaction (see `take_failure`).
    failure: Option<DbError>,
    /// A statement failed since the last savepoint rollback: the transaction is aborted,
    /// and PostgreSQL would answer its COMMIT with a silent ROLLBACK.
    aborted: bool,
    /// Commits answered without waiting for the WAL's flush since the last one that waited.
    unflushed: bool,
    /// The connection was lost while `unflushed`: a server crash may have lost those commits,
    /// so the next sync must not say they are durable.
    maybe_lost: bool,
}

/// The statement a round trip is for, after what waited to go with it.
enum Last<'a> {
    /// Plain SQL (transaction control, schema steps): no result.
    Plain(&'a str),
    /// A prepared statement: the rows it changed.
    Execute(Statement, &'a [Arg<'a>]),
    /// A prepared query: its rows.
    Query(Statement, &'a [Arg<'a>]),
}

/// A statement's arguments as the client takes them.
fn params<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

/// What the last statement of a round trip answered.
enum Answer {
    Done,
    Changed(u64),
    Rows(Vec<tokio_postgres::Row>),
}

impl PgConn {
    fn failed(&mut self, e: tokio_postgres::Error) -> DbError {
        let e = error_of(&e);
        self.aborted = true;
        if let DbError::Retry(_) | DbError::Lost(_) = e
            && self.failure.is_none()
        {
            self.failure = Some(e.clone());
        }
        e
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, DbError> {
        let key = (sql.as_ptr() as usize, sql.len());
        if let Some(s) = self.statements.get(&key) {
            return Ok(s.clone());
        }
        let prepared = self.runtime.block_on(self.client.prepare(&numbered(sql)));
        let s = prepared.map_err(|e| self.failed(e))?;
        self.statements.insert(key, s.clone());
        Ok(s)
    }

    /// One round trip: the pending BEGIN, the statements waiting to go, then `last` (whose
    /// answers are wanted, in order); the first failure among them, else `last`'s answers.
    fn round_trip(&mut self, last: &[Last<'_>]) -> Result<Vec<Answer>, DbError> {
        let begin = self.begin.take();
        let required = self.required.take();
        let later = std::mem::take(&mut self.later);
        let later_args: Vec<Vec<Arg<'_>>> = later
            .iter()
            .map(|(_, vals)| vals.iter().map(Val::as_arg).collect())
            .collect();
        let later_params: Vec<Vec<&(dyn ToSql + Sync)>> =
            later_args.iter().map(|a| params(a)).collect();
        let required_args: Option<Vec<Arg<'_>>> = required
            .as_ref()
            .map(|(_, vals)| vals.iter().map(Val::as_arg).collect());
        let required_params = required_args.as_deref().map(params);
        let last_params: Vec<Vec<&(dyn ToSql + Sync)>> = last
            .iter()
            .map(|l| match l {
                Last::Execute(_, args) | Last::Query(_, args) => params(args),
                Last::Plain(_) => Vec::new(),
            })
            .collect();
        let client = &self.client;
        let mut steps: Vec<BoxFuture<'_, Result<Answer, tokio_postgres::Error>>> =
            Vec::with_capacity(later.len() + last.len() + 1);
        if let Some(begin) = begin {
            steps.push(
                client
                    .batch_execute(begin)
                    .map(|r| r.map(|()| Answer::Done))
                    .boxed(),
            );
        }
        let required_at = steps.len();
        if let (Some((statement, _)), Some(p)) = (&required, &required_params) {
            steps.push(
                client
                    .query(statement, p)
                    .map(|r| r.map(Answer::Rows))
                    .boxed(),
            );
        }
        for ((statement, _), p) in later.iter().zip(&later_params) {
            steps.push(
                client
                    .execute(statement, p)
                    .map(|r| r.map(Answer::Changed))
                    .boxed(),
            );
        }
        for (l, p) in last.iter().zip(&last_params) {
            steps.push(match l {
                Last::Plain(sql) => client
                    .batch_execute(sql)
                    .map(|r| r.map(|()| Answer::Done))
                    .boxed(),
                Last::Execute(s, _) => client.execute(s, p).map(|r| r.map(Answer::Changed)).boxed(),
                Last::Query(s, _) => client.query(s, p).map(|r| r.map(Answer::Rows)).boxed(),
            });
        }
        // join_all polls the steps in order the first time, and each sends its messages at
        // its first poll: they reach the server in this order.
        let answers = self.runtime.block_on(join_all(steps));
        let mut answered = Vec::with_capacity(last.len());
        let skip = answers.len() - last.len();
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(a) if i >= skip => answered.push(a),
                // What ran after it is in a transaction that must not commit: rolled back.
                Ok(Answer::Rows(rows))
                    if required.is_some() && i == required_at && rows.is_empty() =>
                {
                    self.row_missing = true;
                    self.aborted = true;
                    return Err(DbError::Other(
                        "a row the transaction requires is gone".into(),
                    ));
                }
                Ok(_) => {}
                // Later failures follow from the first (the transaction is aborted).
                Err(e) => return Err(self.failed(e)),
            }
        }
        Ok(answered)
    }

    /// One round trip whose last statement is `last`: its answer.
    fn round_trip_one(&mut self, last: Last<'_>) -> Result<Answer, DbError> {
        self.round_trip(std::slice::from_ref(&last))?
            .pop()
            .ok_or_else(|| DbError::Other("a round trip without an answer".into()))
    }

    fn rows(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Vec<Row>, DbError> {
        let s = self.statement(sql)?;
        match self.round_trip_one(Last::Query(s, args))? {
            Answer::Rows(rows) => rows_of(&rows),
            _ => Err(DbError::Other("a query answered no rows".into())),
        }
    }

    /// Runs plain SQL (schema steps, transaction control), after what waits to go.
    pub fn batch_sql(&mut self, sql: &str) -> Result<(), DbError> {
        self.round_trip_one(Last::Plain(sql)).map(drop)
    }

    /// Forgets what was not sent (the transaction ends in a rollback); whether its BEGIN
    /// went out, that is, whether there is a transaction on the server to roll back.
    fn drop_unsent(&mut self) -> bool {
        self.later.clear();
        self.required = None;
        self.begin.take().is_none()
    }
}

impl Tx for PgConn {
    fn execute(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64, DbError> {
        let s = self.statement(sql)?;
        match self.round_trip_one(Last::Execute(s, args))? {
            Answer::Changed(n) => Ok(n),
            _ => Err(DbError::Other("a statement answered no count".into())),
        }
    }

    fn execute_later(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<(), DbError> {
        let s = self.statement(sql)?;
        self.later.push((s, args.iter().map(Arg::to_val).collect()));
        Ok(())
    }

    fn query(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Vec<Row>, DbError> {
        self.rows(sql, args)
    }

    fn query_opt(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Option<Row>, DbError> {
        Ok(self.rows(sql, args)?.into_iter().next())
    }

    fn queries(&mut self, steps: &[(&'static str, &[Arg<'_>])]) -> Result<Vec<Vec<Row>>, DbError> {
        let mut last = Vec::with_capacity(steps.len());
        for &(sql, args) in steps {
            last.push(Last::Query(self.statement(sql)?, args));
        }
        self.round_trip(&last)?
            .iter()
            .map(|answer| match answer {
                Answer::Rows(rows) => rows_of(rows),
                _ => Err(DbError::Other("a query answered no rows".into())),
            })
            .collect()
    }
}

/// The client's rows as ours.
fn rows_of(rows: &[tokio_postgres::Row]) -> Result<Vec<Row>, DbError> {
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.try_get::<_, Val>(i))
                .collect::<Result<Vec<_>, _>>()
                .map(Row)
                .map_err(|e| DbError::Other(describe(&e)))
        })
        .collect()
}

impl Conn for PgConn {
    fn begin(&mut self, sync: bool) -> Result<(), DbError> {
        self.failure = None;
        self.aborted = false;
        self.row_missing = false;
        self.later.clear();
        self.required = None;
        // Sent with the transaction's first statement.
        self.begin = Some(if sync && self.target.async_commit {
            // This commit waits for the WAL up to its own record, which follows every
            // earlier commit's: they are all on the disk when it returns.
            "BEGIN; SET LOCAL synchronous_commit = on"
        } else {
            "BEGIN"
        });
        Ok(())
    }

    fn commit(&mut self, sync: bool) -> Result<(), DbError> {
        if self.aborted {
            return Err(DbError::Other(
                "the transaction was aborted by a failed statement".into(),
            ));
        }
        if sync && self.maybe_lost {
            self.maybe_lost = false;
            self.unflushed = false;
            return Err(DbError::Other(
                "the connection to PostgreSQL was lost while changes answered without waiting for its disk (--async-commit) were not yet on it; a crash of the server may have lost them, so this sync fails".into(),
            ));
        }
        if self.required.is_some() {
            // Its answer decides whether to commit: it cannot go with the COMMIT.
            return Err(DbError::Other(
                "a required row was not checked before the COMMIT (send_required)".into(),
            ));
        }
        self.batch_sql("COMMIT")?;
        if self.target.async_commit {
            self.unflushed = !sync;
        }
        Ok(())
    }

    fn rollback(&mut self) {
        if self.drop_unsent() {
            let _ = self.runtime.block_on(self.client.batch_execute("ROLLBACK"));
        }
        self.aborted = false;
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        if sql.starts_with("ROLLBACK TO") {
            // What the savepoint's change left unsent is rolled back with it.
            self.later.clear();
            self.batch_sql(sql)?;
            // The transaction goes on as it was before the statement that failed.
            self.aborted = false;
            return Ok(());
        }
        self.batch_sql(sql)
    }

    fn begin_read(&mut self) -> Result<(), DbError> {
        // Sent with the read's first query.
        self.begin = Some("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
        Ok(())
    }

    fn end_read(&mut self) {
        if self.drop_unsent() {
            let _ = self.runtime.block_on(self.client.batch_execute("COMMIT"));
        }
        self.aborted = false;
    }

    fn take_failure(&mut self) -> Option<DbError> {
        self.failure.take()
    }

    fn require_row(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<bool, DbError> {
        let s = self.statement(sql)?;
        self.required = Some((s, args.iter().map(Arg::to_val).collect()));
        Ok(true)
    }

    fn send_required(&mut self) -> Result<(), DbError> {
        match self.required {
            Some(_) => self.round_trip(&[]).map(drop),
            None => Ok(()),
        }
    }

    fn take_row_missing(&mut self) -> bool {
        std::mem::take(&mut self.row_missing)
    }

    fn reconnect(&mut self) -> bool {
        let started = Instant::now();
        // Found gone by this mount already: one try, so that each operation fails at once.
        let wait_max = if self.target.gone.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            self.target.wait_max
        };
        let mut logged = false;
        loop {
            match self.target.connect() {
                Ok(fresh) => {
                    let maybe_lost = self.unflushed || self.maybe_lost;
                    *self = fresh;
                    self.maybe_lost = maybe_lost;
                    if self.target.gone.swap(false, Ordering::Relaxed) || logged {
                        tracing::warn!("volume: reconnected to {}", self.target);
                    }
                    return true;
                }
                // Another connection of the mount waited its longest meanwhile: this one
                // ends its wait with it, so no operation waits past the first give-up.
                Err(e)
                    if started.elapsed() >= wait_max
                        || self.target.gone.load(Ordering::Relaxed) =>
                {
                    if !self.target.gone.swap(true, Ordering::Relaxed) {
                        tracing::error!(
                            "volume: gave up reconnecting after {} s: {e}; until a connection is made, operations that need the database fail with EIO at once",
                            wait_max.as_secs_f64()
                        );
                    }
                    return false;
                }
                Err(e) => {
                    if !logged {
                        tracing::warn!(
                            "volume: waiting up to {} s for the database: {e}",
                            wait_max.as_secs_f64()
                        );
                        logged = true;
                    }
                    std::thread::sleep(RECONNECT_BACKOFF.min(wait_max));
                }
            }
        }
    }

    fn server_now_ns(&mut self) -> Option<Result<i64, DbError>> {
        Some(server_now_ns(self))
    }
}

/// The server's clock now, in ns since the epoch: the one clock the mounts of a shared
/// volume (and `status`, `fsck`) time sessions and leases by (see `store::VolumeClock`).
/// `clock_timestamp()`, not `now()`: the latter is the start of the transaction.
pub fn server_now_ns(tx: &mut dyn Tx) -> Result<i64, DbError> {
    tx.query_opt(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::BIGINT",
        &[],
    )?
    .ok_or_else(|| DbError::Other("the server's clock: no row".into()))?
    .int(0)
}

/// The names of the volume's tables (with `schema_migrations`), to find an existing volume.
const VOLUME_TABLES: &[&str] = &[
    "schema_migrations",
    "settings",
    "counters",
    "sessions",
    "inode_ranges",
    "inodes",
    "entries",
    "symlinks",
    "xattrs",
    "chunks",
    "slices",
    "gc_blocks",
    "orphans",
    "changes",
    "leases",
    "locks",
    "holds",
];

/// How many of the volume's tables the database's current schema has.
pub fn volume_tables(conn: &mut PgConn) -> Result<usize, String> {
    let rows = conn
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
            &[],
        )
        .map_err(|e| e.to_string())?;
    Ok(rows
        .iter()
        .filter_map(|r| r.text(0).ok())
        .filter(|t| VOLUME_TABLES.contains(&t.as_str()))
        .count())
}

/// Writes a new volume's schema, settings and root into the database (one transaction;
/// `replace`: drops the volume's tables first).
pub fn initialize(
    conn: &mut PgConn,
    replace: bool,
    settings: &[(&str, String)],
    root: &InodeRec,
) -> Result<(), String> {
    let text = |e: DbError| e.to_string();
    conn.batch_sql("BEGIN").map_err(text)?;
    let result = (|| {
        if replace {
            for table in VOLUME_TABLES {
                conn.batch_sql(&format!("DROP TABLE IF EXISTS {table}"))?;
            }
        }
        conn.batch_sql(
            "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_ns BIGINT NOT NULL)",
        )?;
        for (i, step) in schema::STEPS.iter().enumerate() {
            conn.batch_sql(&schema::step_for(step, "BYTEA"))?;
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_ns) VALUES (?, ?)",
                &crate::sql::args![i as i64 + 1, root.ctime_ns],
            )?;
        }
        ops::initialize(conn, settings, root)
    })();
    match result {
        Ok(()) => conn.batch_sql("COMMIT").map_err(text),
        Err(e) => {
            conn.rollback();
            Err(e.to_string())
        }
    }
}

impl SqlStore<PgConn> {
    /// Opens the volume's database for a mount: registers a session, ends the sessions
    /// whose heartbeat stopped (`SESSION_EXPIRY`; live ones are never touched), starts the
    /// committer.
    /// `async_commit`: the committer's commits return before the WAL is flushed (a sync's
    /// still waits; see `PgTarget::with_async_commit`). `attr_timeout`: the mount's, how
    /// long directories' attributes from its own commits may answer (`store::RecentDirs`).
    /// `uuid`: the volume's, as the mount checked it before (see the registration).
    pub fn open(
        target: &PgTarget,
        host: &str,
        mountpoint: &str,
        uuid: &str,
        now_ns: i64,
        async_commit: bool,
        attr_timeout: Duration,
    ) -> Result<PgStore, String> {
        let writer_target = if async_commit {
            target.with_async_commit()
        } else {
            target.clone()
        };
        let mut conn = writer_target.connect()?;
        let text = |e: DbError| format!("{target}: {e}");
        // The session's times are the server's (this machine's `now_ns` stays for files).
        let clock = VolumeClock::of(&mut conn).map_err(text)?;
        let session_now_ns = clock.now_ns();
        conn.begin(false).map_err(text)?;
        // Shared with other mounts, until this transaction ends (`MAINTENANCE_LOCK`).
        let free = conn
            .query_opt(
                "SELECT CASE WHEN pg_try_advisory_xact_lock_shared(?) THEN 1 ELSE 0 END",
                &crate::sql::args![MAINTENANCE_LOCK],
            )
            .and_then(|r| r.map_or(Ok(0), |r| r.int(0)));
        if !matches!(free, Ok(1)) {
            conn.rollback();
            return Err(match free {
                Err(e) => text(e),
                Ok(_) => format!(
                    "{target}: `lanefs fsck`, `gc` or `format` is working on this volume; mount it when that is done"
                ),
            });
        }
        // The volume the mount checked (its settings, data location, schema) is the one it
        // registers in: a `format --force` between the two, before this lock, made another.
        let same = conn
            .query_opt("SELECT value FROM settings WHERE name = 'uuid'", &[])
            .and_then(|r| r.map(|r| r.text(0)).transpose());
        if !matches!(&same, Ok(Some(now)) if now == uuid) {
            conn.rollback();
            return Err(match same {
                Err(e) => text(e),
                Ok(_) => format!(
                    "{target}: the volume was replaced (`lanefs format --force`) while this mount started; mount it again"
                ),
            });
        }
        let session = match ops::register_session(&mut conn, host, mountpoint, session_now_ns) {
            Ok(session) => session,
            Err(e) => {
                conn.rollback();
                return Err(text(e));
            }
        };
        let mut w = Writer::new(conn, session);
        w.log_changes = true;
        // A server that started less than an expiry (and a heartbeat) ago may have been
        // down for longer than the expiry: the live mounts' heartbeats are stale because
        // they could not beat, and ending their sessions now would fence every one of them.
        // Their own heartbeats end the truly dead ones once they had that long to beat (the
        // heartbeat's `Contact` rule).
        let up_ns = w
            .conn
            .query_opt(
                "SELECT (extract(epoch FROM clock_timestamp() - pg_postmaster_start_time()) * 1e9)::bigint",
                &[],
            )
            .and_then(|r| r.map_or(Ok(i64::MAX), |r| r.int(0)));
        let up_ns = match up_ns {
            Ok(up) => up,
            Err(e) => {
                w.conn.rollback();
                return Err(text(e));
            }
        };
        let stale_before = if up_ns < (SESSION_EXPIRY + HEARTBEAT_INTERVAL).as_nanos() as i64 {
            tracing::info!(
                "volume: the database server started {} s ago: sessions that stopped beating are ended by the heartbeats once live mounts had the time to beat",
                up_ns / 1_000_000_000
            );
            i64::MIN
        } else {
            session_now_ns - SESSION_EXPIRY.as_nanos() as i64
        };
        let crashed = match ops::expire_sessions(&mut w, stale_before, now_ns) {
            Ok(crashed) => crashed,
            Err(e) => {
                w.conn.rollback();
                return Err(format!(
                    "{target}: ending expired sessions: {}",
                    std::io::Error::from_raw_os_error(e)
                ));
            }
        };
        w.conn.commit(false).map_err(text)?;
        if !crashed.is_empty() {
            tracing::info!("volume: ended sessions {crashed:?}: their heartbeat had stopped");
        }
        let readers = (0..READ_CONNECTIONS)
            .map(|_| target.connect())
            .collect::<Result<Vec<_>, _>>()?;
        SqlStore::start(EngineParts {
            writer: w,
            readers,
            crashed,
            background: None,
            session_expiry: Some(SESSION_EXPIRY),
            clock,
            at_close: |_| {},
            recent_dir_ttl: Some(attr_timeout),
            database_gone: target.gone_flag(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_outside_quotes() {
        assert_eq!(
            numbered("UPDATE t SET a = ?, b = '?' WHERE c = ? AND d = ?"),
            "UPDATE t SET a = $1, b = '?' WHERE c = $2 AND d = $3"
        );
    }

    #[test]
    fn a_malformed_url_is_not_echoed() {
        let Err(e) = PgTarget::parse("postgres://me:secret@host:notaport/db") else {
            panic!("a malformed URL was accepted");
        };
        assert!(!e.contains("secret"), "the refusal shows the password: {e}");
    }

    #[test]
    fn a_url_with_a_password_is_refused_with_where_to_put_it() {
        let Err(e) = PgTarget::parse("postgres://u:secret@127.0.0.1:5432/db") else {
            panic!("a URL with a password was accepted");
        };
        assert!(e.contains("PGPASSWORD"), "{e}");
        assert!(!e.contains("secret"), "the refusal shows the password: {e}");
    }

    #[test]
    fn the_password_file_is_read_with_wildcards_and_escapes() {
        assert_eq!(
            split_pgpass(r"db\:host:*:vol:me:pa\:ss:word"),
            ["db:host", "*", "vol", "me", "pa:ss:word"]
        );
    }
}
