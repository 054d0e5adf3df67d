//! The one interface both metadata engines (SQLite, PostgreSQL) offer the volume's
//! transaction logic: [`Tx`] runs a statement with [`Arg`]s and gives back [`Row`]s of
//! [`Val`]s. Statements are `&'static str` with `?` placeholders, written once in `ops.rs`;
//! an engine prepares each once per connection (PostgreSQL rewrites `?` to `$n` then).

use crate::meta::Errno;

/// A statement's argument.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Bytes(&'a [u8]),
    Text(&'a str),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl From<u64> for Arg<'_> {
    /// Inode, block and session numbers and sizes are below 2^63 (files stop at 16 TiB,
    /// block ids are session << 40): stored as BIGINT as they are.
    fn from(v: u64) -> Self {
        Arg::Int(v as i64)
    }
}

impl From<u32> for Arg<'_> {
    fn from(v: u32) -> Self {
        Arg::Int(v as i64)
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Int(v as i64)
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a> From<&'a Vec<u8>> for Arg<'a> {
    fn from(v: &'a Vec<u8>) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::Null, Into::into)
    }
}

impl Arg<'_> {
    /// The argument as an owned value, for a statement sent later.
    pub fn to_val(&self) -> Val {
        match *self {
            Arg::Null => Val::Null,
            Arg::Int(v) => Val::Int(v),
            Arg::Bytes(b) => Val::Bytes(b.to_vec()),
            Arg::Text(t) => Val::Text(t.to_string()),
        }
    }
}

/// `args![a, b, …]`: a statement's arguments as `[Arg; N]`.
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$($crate::sql::Arg::from($a)),*] };
}
pub(crate) use args;

/// A column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    Null,
    Int(i64),
    Bytes(Vec<u8>),
    Text(String),
}

impl Val {
    /// The value as a statement's argument.
    pub fn as_arg(&self) -> Arg<'_> {
        match self {
            Val::Null => Arg::Null,
            Val::Int(v) => Arg::Int(*v),
            Val::Bytes(b) => Arg::Bytes(b),
            Val::Text(t) => Arg::Text(t),
        }
    }
}

/// One result row.
#[derive(Debug, Clone)]
pub struct Row(pub Vec<Val>);

impl Row {
    fn at(&self, i: usize) -> Result<&Val, DbError> {
        self.0
            .get(i)
            .ok_or_else(|| DbError::Other(format!("no column {i} in a result row")))
    }

    pub fn int(&self, i: usize) -> Result<i64, DbError> {
        match self.at(i)? {
            Val::Int(v) => Ok(*v),
            other => Err(DbError::Other(format!(
                "column {i}: an integer expected, found {other:?}"
            ))),
        }
    }

    /// An unsigned column (inode, block, mode…): a negative value is damage, not a number.
    pub fn u64(&self, i: usize) -> Result<u64, DbError> {
        let v = self.int(i)?;
        u64::try_from(v).map_err(|_| DbError::Other(format!("column {i}: negative value {v}")))
    }

    pub fn u32(&self, i: usize) -> Result<u32, DbError> {
        let v = self.int(i)?;
        u32::try_from(v).map_err(|_| DbError::Other(format!("column {i}: {v} is out of range")))
    }

    pub fn bytes(&self, i: usize) -> Result<Vec<u8>, DbError> {
        self.opt_bytes(i)?
            .ok_or_else(|| DbError::Other(format!("column {i}: NULL where bytes were expected")))
    }

    pub fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, DbError> {
        match self.at(i)? {
            Val::Null => Ok(None),
            Val::Bytes(b) => Ok(Some(b.clone())),
            Val::Text(t) => Ok(Some(t.as_bytes().to_vec())),
            other => Err(DbError::Other(format!(
                "column {i}: bytes expected, found {other:?}"
            ))),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, DbError> {
        match self.at(i)? {
            Val::Text(t) => Ok(t.clone()),
            Val::Int(v) => Ok(v.to_string()),
            other => Err(DbError::Other(format!(
                "column {i}: text expected, found {other:?}"
            ))),
        }
    }
}

/// Why a statement failed, in the terms the transaction logic acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbError {
    /// A unique key is taken (an entry's name: EEXIST).
    Unique,
    /// The engine gave up on this transaction (busy, serialization failure, deadlock): the
    /// whole transaction may be run again.
    Retry(String),
    /// The connection to the database is gone (server restarted, network): reconnect.
    Lost(String),
    /// The database's disk is full.
    Full(String),
    Other(String),
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Unique => write!(f, "a unique key is taken"),
            DbError::Retry(e) => write!(f, "transaction to retry: {e}"),
            DbError::Lost(e) => write!(f, "connection lost: {e}"),
            DbError::Full(e) => write!(f, "disk full: {e}"),
            DbError::Other(e) => write!(f, "{e}"),
        }
    }
}

impl DbError {
    pub fn errno(&self) -> Errno {
        match self {
            DbError::Full(_) => libc::ENOSPC,
            DbError::Unique => libc::EEXIST,
            _ => libc::EIO,
        }
    }
}

/// An error inside an operation becomes its errno. Other errors are logged here, once;
/// retries and lost connections are the committer's to log (they are not the operation's
/// fault, and it runs the operation again).
impl From<DbError> for Errno {
    fn from(e: DbError) -> Errno {
        if let DbError::Other(_) | DbError::Full(_) = &e {
            tracing::error!("volume metadata: {e}");
        }
        e.errno()
    }
}

/// A connection inside a transaction (or in autocommit, for reads).
pub trait Tx {
    /// Runs a statement; the rows it changed.
    fn execute(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64, DbError>;
    /// Runs a statement whose answer the logic does not look at, only that it succeeds: an
    /// engine with round trips sends it with the transaction's next statement or its
    /// COMMIT, and its failure is that statement's (or COMMIT's) failure; an embedded one
    /// runs it now.
    fn execute_later(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<(), DbError> {
        self.execute(sql, args).map(drop)
    }
    /// Runs a query; all its rows.
    fn query(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Vec<Row>, DbError>;
    /// Runs a query; its first row, if any.
    fn query_opt(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Option<Row>, DbError>;
    /// Runs queries one after the other, none of which needs another's answer to be asked:
    /// all their rows, or the first failure. An engine with round trips sends them in one.
    fn queries(&mut self, steps: &[(&'static str, &[Arg<'_>])]) -> Result<Vec<Vec<Row>>, DbError> {
        steps
            .iter()
            .map(|&(sql, args)| self.query(sql, args))
            .collect()
    }
}
