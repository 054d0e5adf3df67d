//! A volume as a whole: format, the checks and lock that come before a mount, status.
//! Every failure here is one sentence for the user (`String` errors), never a panic.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;

use crate::blocks::{BlockStore, ObjectBlockStore, VOLUME_ID_KEY};
use crate::file::{CHUNK_BYTES, DataPath, INLINE_MAX_BYTES};
use crate::fs::{VolumeFs, VolumeOptions};
use crate::location::DataLocation;
use crate::meta::{InodeRec, ROOT_INO};
use crate::now_ns;
use crate::postgres::{self, PgStore, PgTarget};
use crate::schema::{FORMAT_VERSION, STEPS, setting, step_for};
use crate::sql::{DbError, Tx, args};
use crate::sqlite::{self, SqliteConn, SqliteStore};
use crate::store::Conn;

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Whether `path` looks like a lanefs volume (an SQLite file): for telling sources apart.
pub fn looks_like_volume(path: &Path) -> bool {
    let mut head = [0u8; 16];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == SQLITE_MAGIC)
}

/// The exclusive hold of a volume by one process (a mount, fsck --repair, format --force):
/// flock on the database file, which SQLite's own fcntl locks do not touch. Released when
/// dropped (or when the process dies, kill -9 included).
pub struct VolumeLock {
    /// None for a volume on PostgreSQL, which many mounts share (sessions and heartbeats
    /// keep them apart, not a lock).
    file: Option<File>,
    /// The data directory's hold (flock on its volume-id object), once `cover_data` took it.
    data: Option<File>,
}

impl VolumeLock {
    pub fn take(db: &Path) -> Result<VolumeLock, String> {
        let file = File::open(db).map_err(|e| format!("{}: {e}", db.display()))?;
        // SAFETY: flock on an fd we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let holder = holder_of(db).unwrap_or_else(|| "by another process".into());
            return Err(format!(
                "{} is already mounted {holder}; one volume on SQLite takes one mount at a time (sharing needs PostgreSQL)",
                db.display()
            ));
        }
        Ok(VolumeLock {
            file: Some(file),
            data: None,
        })
    }

    /// No lock: a volume on PostgreSQL is shared by many mounts.
    pub fn shared() -> VolumeLock {
        VolumeLock {
            file: None,
            data: None,
        }
    }

    /// Lets go of the volume before the lock is dropped: at the very end of a mount's
    /// teardown, so that a command run as soon as the daemon says it is unmounted finds the
    /// volume free. The fd stays open until the drop (closing one of the database file's fds
    /// would not touch SQLite's fcntl locks, but there is no need to).
    pub fn release(&self) {
        for file in self.file.iter().chain(&self.data) {
            // SAFETY: flock on an fd we own; no memory is involved.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
    }

    /// Holds the volume's data directory too: two volume files can name one directory (a
    /// copy made by `lanefs load` does), and two mounts writing and deleting blocks in one
    /// directory would destroy each other's data. (An S3 prefix has no lock to take: there
    /// the volume file's lock is the only one.)
    pub fn cover_data(&mut self, data: &DataLocation) -> Result<(), String> {
        if let DataLocation::Dir(dir) = data {
            self.data = Some(lock_data_dir(dir)?);
        }
        Ok(())
    }

    /// `open_blocks` under the data directory's hold (`cover_data`): the volume-id is read
    /// once the hold is taken, so a `format --force` of the directory that ran in between
    /// (it holds the directory while it deletes and rewrites it) is seen, not mounted over.
    pub fn cover_and_open_blocks(
        &mut self,
        db: &Path,
        settings: &Settings,
    ) -> Result<Arc<ObjectBlockStore>, String> {
        match &settings.data {
            // Without its volume-id there is nothing to hold: `open_blocks` says what is
            // missing.
            DataLocation::Dir(dir) if !dir.join(VOLUME_ID_KEY).is_file() => {}
            data => self.cover_data(data)?,
        }
        open_blocks(db, settings)
    }
}

/// flock(LOCK_EX) on a data directory's volume-id object (every data directory of a volume
/// has one; `open_blocks` checks it).
fn lock_data_dir(data_dir: &Path) -> Result<File, String> {
    let path = data_dir.join(VOLUME_ID_KEY);
    let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on an fd we own; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "the data directory {} is in use by another volume file's mount or check (a copy made by `lanefs load` shares its data directory); one data directory serves one volume at a time",
            data_dir.display()
        ));
    }
    Ok(file)
}

/// "(pid N at MP)" from the sessions table, if it can be read.
fn holder_of(db: &Path) -> Option<String> {
    let conn = sqlite::connect(db, false).ok()?;
    conn.query_row(
        "SELECT pid, mountpoint FROM sessions ORDER BY id DESC LIMIT 1",
        [],
        |r| {
            Ok(format!(
                "(pid {} at {})",
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?
            ))
        },
    )
    .ok()
}

/// A volume's settings, read and checked.
pub struct Settings {
    pub uuid: String,
    pub data: DataLocation,
    pub format_version: i64,
    pub created_ns: i64,
}

/// Makes what this process creates on the host readable by its user alone (umask 077): a
/// volume's database, its -wal and -shm files, its data directory, blocks and intent logs
/// hold its users' bytes, names and attributes, which the mount's modes and ACLs guard;
/// left readable on the host (0644 under the usual umask), any local user could read past
/// them. For the commands that create a volume's files (format, load, mount, fsck, gc).
pub fn keep_host_files_private() {
    // SAFETY: umask has no preconditions; it only sets this process's file-creation mask.
    unsafe { libc::umask(0o077) };
}

/// Narrows a volume's host file or directory `path` that other users may read or enter
/// (made by a lanefs before 2026-11-29, or by hand) to its owner's bits, with a log line; a
/// path of another owner, or missing, is left as it is. See `keep_host_files_private`.
fn narrow_to_owner(path: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mode = meta.mode() & 0o7777;
    if meta.is_symlink() || meta.uid() != me || mode & 0o077 == 0 {
        return;
    }
    let narrowed = mode & !0o077;
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(narrowed)) {
        Ok(()) => tracing::warn!(
            "{}: narrowed its mode from {mode:o} to {narrowed:o}: other users could read the volume's files past their modes",
            path.display()
        ),
        Err(e) => tracing::warn!(
            "{}: other users may read it (mode {mode:o}), and narrowing it failed: {e}",
            path.display()
        ),
    }
}

/// Narrows what other users could read of an existing volume on this host: an SQLite
/// volume's database files (`db`) and a local data directory's blocks.
fn narrow_volume_files(db: Option<&Path>, data: &DataLocation) {
    if let Some(db) = db {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            narrow_to_owner(Path::new(&p));
        }
    }
    if let Some(dir) = data.local_dir() {
        narrow_to_owner(&dir.join("blocks"));
        narrow_to_owner(&dir.join(VOLUME_ID_KEY));
    }
}

/// Opens the database and checks that it is a volume this binary can use.
pub fn check(db: &Path, write: bool) -> Result<(Connection, Settings), String> {
    let shown = db.display();
    if !db.exists() {
        return Err(format!(
            "{shown} does not exist; make a volume with `lanefs format {shown} --data DIR`"
        ));
    }
    if !looks_like_volume(db) {
        return Err(format!(
            "{shown} is not a lanefs volume (not an SQLite database)"
        ));
    }
    let open = |write| {
        sqlite::connect(db, write).map_err(|e| format!("{shown}: cannot open the database: {e}"))
    };
    if write {
        // Recognised read-only first: opening for writing switches a database to WAL for
        // good, and an upgrade would run its steps on another program's database. A volume
        // of every format has a uuid setting and a format number; any trouble reading them
        // other than a missing table is the writing open's to name.
        let foreign = open(false).is_ok_and(|probe| {
            match probe.query_row(
                "SELECT (SELECT value FROM settings WHERE name = 'uuid'),
                        (SELECT max(version) FROM schema_migrations)",
                [],
                |r| Ok(r.get_ref(0)?.as_str().is_ok() && r.get_ref(1)?.as_i64().is_ok()),
            ) {
                Ok(ours) => !ours,
                Err(e) => e.to_string().contains("no such table"),
            }
        });
        if foreign {
            return Err(format!(
                "{shown} is an SQLite database but not a lanefs volume"
            ));
        }
    }
    let mut conn = SqliteConn(open(write)?);
    if write {
        migrate(&mut conn, "BLOB", &shown.to_string())?;
    }
    let settings = check_settings(&mut conn, &shown.to_string(), "an SQLite")?;
    Ok((conn.0, settings))
}

/// Brings an older volume's schema up to [`FORMAT_VERSION`] (one transaction; `bytes` is the
/// engine's byte-string type). A database that is not a volume, or is newer, is left as it
/// is for `check_settings` to name. Two mounts upgrading at once: the second's insert into
/// `schema_migrations` hits the first's key, and it fails with a sentence; run it again.
pub fn migrate<C: Conn>(conn: &mut C, bytes: &str, shown: &str) -> Result<(), String> {
    let fail = |e: DbError| format!("{shown}: upgrading its format: {e}");
    let newest = |conn: &mut C| -> Option<i64> {
        conn.query_opt("SELECT max(version) FROM schema_migrations", &[])
            .ok()
            .flatten()
            .and_then(|r| r.int(0).ok())
    };
    match newest(conn) {
        Some(v) if (1..FORMAT_VERSION).contains(&v) => {}
        _ => return Ok(()),
    }
    conn.begin(false).map_err(fail)?;
    let result = (|| {
        // Read again inside the transaction: another mount may have upgraded meanwhile.
        let from = newest(conn).unwrap_or(FORMAT_VERSION);
        let now = now_ns();
        for version in from + 1..=FORMAT_VERSION {
            let step = STEPS[(version - 1) as usize];
            conn.batch(&step_for(step, bytes))?;
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_ns) VALUES (?, ?)",
                &args![version, now],
            )?;
        }
        conn.execute(
            "UPDATE settings SET value = ? WHERE name = ?",
            &args![FORMAT_VERSION.to_string().as_str(), setting::FORMAT_VERSION],
        )?;
        Ok(from)
    })();
    match result {
        Ok(from) => {
            conn.commit(false).map_err(fail)?;
            if from < FORMAT_VERSION {
                tracing::info!("{shown}: upgraded from format {from} to {FORMAT_VERSION}");
            }
            Ok(())
        }
        Err(e) => {
            conn.rollback();
            Err(fail(e))
        }
    }
}

/// Checks that a database holds a volume this binary can use and reads its settings;
/// `engine` names the kind of database for the sentence when it does not ("an SQLite").
pub fn check_settings(tx: &mut dyn Tx, shown: &str, engine: &str) -> Result<Settings, String> {
    let newest = tx
        .query_opt("SELECT max(version) FROM schema_migrations", &[])
        .map_err(|_| format!("{shown} is {engine} database but not a lanefs volume"))?
        .and_then(|r| r.int(0).ok())
        .unwrap_or(0);
    if newest > FORMAT_VERSION {
        return Err(format!(
            "{shown} was made by a newer lanefs (format {newest}; this one reads up to {FORMAT_VERSION}); upgrade lanefs"
        ));
    }
    if newest < 1 {
        return Err(format!(
            "{shown} has an incomplete schema (format {newest}); it is damaged"
        ));
    }
    if newest < FORMAT_VERSION {
        return Err(format!(
            "{shown} is of format {newest}; mount it or run `lanefs fsck` once to upgrade it to format {FORMAT_VERSION}"
        ));
    }
    let mut get = |name: &str| -> Result<String, String> {
        tx.query_opt("SELECT value FROM settings WHERE name = ?", &args![name])
            .map_err(|e| format!("{shown}: reading its settings: {e}"))?
            .and_then(|r| r.text(0).ok())
            .ok_or_else(|| format!("{shown} is damaged: its setting {name} is missing"))
    };
    let uuid = get(setting::UUID)?;
    // The uuid names a local directory (a shared volume's default intent-log directory)
    // and is matched against the data location's volume-id object: one that is not the
    // 32 hex digits `format` writes could lead a mount's files out of that directory.
    if uuid.len() != 32 || !uuid.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!(
            "{shown} is damaged: its uuid {uuid:?} is not 32 hex digits"
        ));
    }
    let settings = Settings {
        uuid,
        data: DataLocation::from_setting(&get(setting::DATA)?)
            .map_err(|e| format!("{shown} is damaged: {e}"))?,
        format_version: get(setting::FORMAT_VERSION)?.parse().unwrap_or(0),
        created_ns: get(setting::CREATED_NS)?.parse().unwrap_or(0),
    };
    let chunk: u64 = get(setting::CHUNK_BYTES)?.parse().unwrap_or(0);
    if chunk != CHUNK_BYTES {
        return Err(format!(
            "{shown} uses chunks of {chunk} bytes; this lanefs reads {CHUNK_BYTES}"
        ));
    }
    Ok(settings)
}

/// Opens the block store of a checked volume and checks it belongs to the volume.
pub fn open_blocks(db: &Path, settings: &Settings) -> Result<Arc<ObjectBlockStore>, String> {
    let data = &settings.data;
    let what = match data {
        DataLocation::Dir(dir) => {
            if !dir.is_dir() {
                return Err(format!(
                    "the data directory {} of volume {} is missing",
                    dir.display(),
                    db.display()
                ));
            }
            "data directory"
        }
        DataLocation::S3(_) => "data location",
    };
    let blocks = ObjectBlockStore::open(data).map_err(|e| format!("{what} {data}: {e}"))?;
    match blocks.get_volume_id() {
        Ok(Some(id)) if id == settings.uuid => Ok(Arc::new(blocks)),
        Ok(Some(_)) => Err(format!(
            "the {what} {data} belongs to another volume, not {}",
            db.display()
        )),
        Ok(None) => Err(format!(
            "the {what} {data} of volume {} has lost its {VOLUME_ID_KEY} object (is it the right place? on S3: does the bucket exist?)",
            db.display()
        )),
        Err(e) => Err(format!("{what} {data}: {e}")),
    }
}

pub(crate) fn random_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a new volume's blocks go, checked and made ready: a directory (created; empty, or an
/// earlier volume's blocks that --force allows deleting, locked meanwhile) or an S3 prefix
/// (the bucket exists and takes the credentials: one listing tells; empty, or an earlier
/// volume's objects that --force allows deleting). Nothing is deleted until `clear`.
struct NewData {
    location: DataLocation,
    /// The store listed at `prepare` (S3), for `clear`.
    listed: Option<ObjectBlockStore>,
    clear: bool,
    _lock: Option<File>,
}

impl NewData {
    fn prepare(data: DataLocation, force: bool) -> Result<NewData, String> {
        let mut lock = None;
        let (location, listed, clear) = match data {
            DataLocation::Dir(dir) => {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("data directory {}: {e}", dir.display()))?;
                let dir = dir
                    .canonicalize()
                    .map_err(|e| format!("data directory {}: {e}", dir.display()))?;
                let entries = std::fs::read_dir(&dir)
                    .map_err(|e| format!("data directory {}: {e}", dir.display()))?
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name())
                    .collect::<Vec<_>>();
                let ours = entries.iter().all(|n| n == "blocks" || n == VOLUME_ID_KEY);
                if !ours {
                    return Err(format!(
                        "the data directory {} is not empty; give an empty or new one",
                        dir.display()
                    ));
                }
                if !entries.is_empty() && !force {
                    return Err(format!(
                        "the data directory {} holds another volume's blocks; add --force to delete them",
                        dir.display()
                    ));
                }
                if dir.join(VOLUME_ID_KEY).exists() {
                    lock = Some(lock_data_dir(&dir)?);
                }
                (DataLocation::Dir(dir), None, !entries.is_empty())
            }
            s3 @ DataLocation::S3(_) => {
                let blocks = ObjectBlockStore::open(&s3).map_err(|e| format!("{s3}: {e}"))?;
                let keys = blocks.list_all().map_err(|e| s3_refusal(&s3, e))?;
                let ours = keys
                    .iter()
                    .all(|k| k == VOLUME_ID_KEY || k.starts_with("blocks/"));
                if !ours {
                    return Err(format!(
                        "{s3} holds other objects; give an empty or new prefix"
                    ));
                }
                if !keys.is_empty() && !force {
                    return Err(format!(
                        "{s3} holds another volume's blocks; add --force to delete them"
                    ));
                }
                (s3, Some(blocks), !keys.is_empty())
            }
        };
        Ok(NewData {
            location,
            listed,
            clear,
            _lock: lock,
        })
    }

    /// Deletes an earlier volume's blocks (everything was checked).
    fn clear(&self) -> Result<(), String> {
        if !self.clear {
            return Ok(());
        }
        match (&self.location, &self.listed) {
            (DataLocation::Dir(dir), _) => {
                let _ = std::fs::remove_dir_all(dir.join("blocks"));
                let _ = std::fs::remove_file(dir.join(VOLUME_ID_KEY));
                Ok(())
            }
            (s3, Some(blocks)) => blocks
                .delete_all()
                .map_err(|e| format!("{s3}: deleting the old volume's objects: {e}")),
            (s3, None) => Err(format!("{s3}: not listed before clearing")),
        }
    }

    /// Marks the location as the new volume's.
    fn write_volume_id(&self, uuid: &str) -> Result<(), String> {
        let data = &self.location;
        let blocks =
            ObjectBlockStore::open(data).map_err(|e| format!("data location {data}: {e}"))?;
        blocks
            .put_volume_id(uuid)
            .map_err(|e| format!("data location {data}: {e}"))
    }

    /// A new volume's settings and root directory.
    fn records(&self, uuid: &str, now: i64) -> (Vec<(&'static str, String)>, InodeRec) {
        let settings = vec![
            (setting::FORMAT_VERSION, FORMAT_VERSION.to_string()),
            (setting::UUID, uuid.to_string()),
            (setting::DATA, self.location.to_setting()),
            (setting::CHUNK_BYTES, CHUNK_BYTES.to_string()),
            (setting::INLINE_MAX_BYTES, INLINE_MAX_BYTES.to_string()),
            (setting::CREATED_NS, now.to_string()),
        ];
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let root = InodeRec {
            ino: ROOT_INO,
            mode: libc::S_IFDIR | 0o755,
            uid,
            gid,
            rdev: 0,
            nlink: 2,
            size: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            parent: ROOT_INO,
        };
        (settings, root)
    }
}

/// One sentence for an S3 error at format: the bucket is missing, the credentials are
/// refused, or what the server said.
fn s3_refusal(data: &DataLocation, e: std::io::Error) -> String {
    let DataLocation::S3(s3) = data else {
        return format!("{data}: {e}");
    };
    let text = e.to_string();
    if e.kind() == std::io::ErrorKind::NotFound || text.contains("NoSuchBucket") {
        format!(
            "the bucket {} does not exist on {}; create it first",
            s3.bucket,
            s3.endpoint.as_deref().unwrap_or("AWS S3")
        )
    } else if e.kind() == std::io::ErrorKind::PermissionDenied
        || text.contains("InvalidAccessKeyId")
        || text.contains("SignatureDoesNotMatch")
    {
        format!(
            "the S3 server refused the credentials (from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS profile) for the bucket {}",
            s3.bucket
        )
    } else {
        format!("{data}: {e}")
    }
}

/// `lanefs format`: a new, empty volume. Everything is checked (and the old volume locked)
/// before anything is deleted: a refusal leaves an existing volume as it was.
pub fn format(db: &Path, data: &Path, force: bool) -> Result<String, String> {
    format_at(db, DataLocation::Dir(data.to_owned()), force)
}

/// `lanefs format` of a volume file, its blocks in a directory or on S3.
pub fn format_at(db: &Path, data: DataLocation, force: bool) -> Result<String, String> {
    let shown = db.display();
    let mut _lock = None;
    let replace_db = db.exists();
    if replace_db {
        if !force {
            return Err(format!(
                "{shown} exists; add --force to replace it (everything in it is lost)"
            ));
        }
        if !db.is_file() {
            return Err(format!(
                "{shown} exists and is not a file; give a file's path"
            ));
        }
        _lock = Some(VolumeLock::take(db)?);
    }
    let data = NewData::prepare(data, force)?;
    let uuid = random_id()?;
    // Checked; now the old volume goes.
    if replace_db {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("removing {}: {e}", Path::new(&p).display())),
            }
        }
    }
    data.clear()?;
    forget_intent_logs(db)?;
    let now = now_ns();
    let conn = Connection::open(db).map_err(|e| format!("{shown}: {e}"))?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
        .map_err(|e| format!("{shown}: {e}"))?;
    let (settings, root) = data.records(&uuid, now);
    sqlite::initialize(conn, &settings, &root)
        .map_err(|e| format!("{shown}: writing the schema: {e}"))?;
    data.write_volume_id(&uuid)?;
    Ok(format!(
        "formatted {shown}: volume {uuid}, data in {}, format {FORMAT_VERSION}",
        data.location
    ))
}

/// `lanefs format postgres://…`: a new, empty volume in a PostgreSQL database. A database
/// that holds a volume already is refused without `force`, and with it while a mount of it
/// is live.
pub fn format_postgres(url: &str, data: DataLocation, force: bool) -> Result<String, String> {
    let target = PgTarget::parse(url)?;
    let mut conn = target.connect()?;
    let existing = postgres::volume_tables(&mut conn)?;
    if existing > 0 {
        if !force {
            return Err(format!(
                "{url} holds a lanefs volume already; add --force to replace it (everything in it is lost)"
            ));
        }
        postgres::hold_maintenance_lock(&mut conn, url, "format")?;
        let live = live_sessions(&mut conn, url)?;
        if live > 0 {
            return Err(format!(
                "{url} is mounted ({live} live sessions); unmount it everywhere before replacing it"
            ));
        }
    }
    let data = NewData::prepare(data, force)?;
    let uuid = random_id()?;
    data.clear()?;
    let (settings, root) = data.records(&uuid, now_ns());
    postgres::initialize(&mut conn, existing > 0, &settings, &root)
        .map_err(|e| format!("{url}: writing the schema: {e}"))?;
    data.write_volume_id(&uuid)?;
    Ok(format!(
        "formatted {url}: volume {uuid}, data in {}, format {FORMAT_VERSION}",
        data.location
    ))
}

/// Sessions of a shared volume whose heartbeat is recent by the server's clock (0 when there
/// is no sessions table). A failure to read them is an error, never "none": a caller goes on
/// to replace or repair.
pub fn live_sessions(tx: &mut dyn Tx, shown: &str) -> Result<u64, String> {
    let now = postgres::server_now_ns(tx).map_err(|e| format!("{shown}: {e}"))?;
    let recent = now - postgres::SESSION_EXPIRY.as_nanos() as i64;
    tx.query_opt(
        "SELECT count(*) FROM sessions WHERE heartbeat_ns >= ?",
        &args![recent],
    )
    .and_then(|r| r.map_or(Ok(0), |r| r.u64(0)))
    .map_err(|e| format!("{shown}: reading its sessions: {e}"))
}

/// Checks the volume, takes its lock, registers a session: the file system to serve, which
/// holds the volume until the end of its `destroy` (or until it is dropped).
pub fn open_for_mount(
    db: &Path,
    mountpoint: &Path,
    mut options: VolumeOptions,
) -> Result<Arc<VolumeFs>, String> {
    let db = &std::path::absolute(db).map_err(|e| format!("{}: {e}", db.display()))?;
    // The lock first: `check` upgrades an older format, which must not happen under a
    // mount that holds the volume (a missing or foreign file is named by `check`).
    let lock = if db.exists() && looks_like_volume(db) {
        Some(VolumeLock::take(db)?)
    } else {
        None
    };
    let (conn, settings) = check(db, true)?;
    drop(conn);
    let mut lock = match lock {
        Some(lock) => lock,
        None => VolumeLock::take(db)?,
    };
    let blocks = lock.cover_and_open_blocks(db, &settings)?;
    narrow_volume_files(Some(db), &settings.data);
    let store = SqliteStore::open(db, &hostname(), &mountpoint.to_string_lossy(), now_ns())
        .map_err(|e| format!("{}: starting a session: {e}", db.display()))?;
    let intent_dir = options
        .intent_dir
        .clone()
        .unwrap_or_else(|| intent_dir_of(db));
    start_intent_log(&store, &intent_dir, &mut options)?;
    let data = Arc::new(DataPath::new(
        blocks as Arc<dyn BlockStore>,
        store.session,
        true,
        options.dirty_max,
    ));
    Ok(VolumeFs::new(
        Arc::new(store),
        data,
        settings.data.local_dir().map(Path::to_owned),
        options,
        lock,
    ))
}

/// Checks a volume on PostgreSQL and registers a session: the file system to serve. No lock:
/// other mounts share the volume. `async_commit`: changes are answered before PostgreSQL's
/// WAL is on its disk (fsync, fsyncdir and syncfs still wait for it).
pub fn open_for_mount_postgres(
    url: &str,
    mountpoint: &Path,
    mut options: VolumeOptions,
    async_commit: bool,
) -> Result<Arc<VolumeFs>, String> {
    let mut target = PgTarget::parse(url)?;
    if let Some(wait) = options.database_wait {
        target = target.with_wait_max(wait);
    }
    let mut conn = target.connect()?;
    migrate(&mut conn, "BYTEA", url)?;
    let settings = check_settings(&mut conn, url, "a PostgreSQL")?;
    drop(conn);
    let blocks = open_blocks(Path::new(url), &settings)?;
    narrow_volume_files(None, &settings.data);
    let store = PgStore::open(
        &target,
        &hostname(),
        &mountpoint.to_string_lossy(),
        &settings.uuid,
        now_ns(),
        async_commit,
        options.attr_timeout,
    )?;
    let intent_dir = match options.intent_dir.clone() {
        Some(dir) => dir,
        None => default_shared_intent_dir(&settings.uuid)?,
    };
    start_intent_log(&store, &intent_dir, &mut options)?;
    let data = Arc::new(DataPath::new(
        blocks as Arc<dyn BlockStore>,
        store.session,
        false,
        options.dirty_max,
    ));
    options.shared = true;
    options.heartbeat_interval = postgres::HEARTBEAT_INTERVAL;
    Ok(VolumeFs::new(
        Arc::new(store),
        data,
        settings.data.local_dir().map(Path::to_owned),
        options,
        VolumeLock::shared(),
    ))
}

/// Where an SQLite volume's intent logs live: beside the database, as SQLite's own
/// `-wal` file is (`vol.db` → `vol.db-intent/`).
pub fn intent_dir_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-intent");
    PathBuf::from(name)
}

/// Removes what an earlier volume at `db` left in its intent log directory: a new database
/// there must not be handed the old one's changes.
pub fn forget_intent_logs(db: &Path) -> Result<(), String> {
    let dir = intent_dir_of(db);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", dir.display())),
    }
}

/// Where a shared volume's intent logs live on this machine when no `intent_dir` was given:
/// /var/lib/lanefs/intent/<volume id> for root, else under $XDG_STATE_HOME (or
/// ~/.local/state).
fn default_shared_intent_dir(uuid: &str) -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    let base = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/lib/lanefs")
    } else if let Some(state) = std::env::var_os("XDG_STATE_HOME") {
        PathBuf::from(state).join("lanefs")
    } else if let Some(home) = std::env::var_os("HOME") {
        PathBuf::from(home).join(".local/state/lanefs")
    } else {
        return Err(
            "no place for the volume's intent log: set -o intent_dir=DIR (a local directory)"
                .into(),
        );
    };
    Ok(base.join("intent").join(uuid))
}

/// Applies what crashed mounts of this machine left in their intent logs in `dir`, then,
/// when changes are to be answered before their commit, starts this session's. A mount
/// whose log cannot be made (its disk full) answers every change after its commit instead,
/// with a log line: an early answer without its record would be lost with the daemon.
fn start_intent_log<C: crate::store::Conn>(
    store: &crate::store::SqlStore<C>,
    dir: &Path,
    options: &mut VolumeOptions,
) -> Result<(), String> {
    // Absolute: the log's row names it by path, and a replay compares that path.
    let dir = &std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    store
        .replay_intent_logs(dir)
        .map_err(|e| format!("replaying the intent logs in {}: {e}", dir.display()))?;
    if options.async_dirops
        && let Err(e) = store.keep_intent_log(dir, &hostname(), options.async_backlog)
    {
        tracing::warn!(
            "volume: no intent log ({e}); creates, removes and new files' bytes are answered after their commit"
        );
        options.async_dirops = false;
    }
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

/// `lanefs status`: the volume, its sessions, its usage (works while mounted).
pub fn status(db: &Path) -> Result<String, String> {
    let source = db.to_string_lossy();
    if postgres::is_url(&source) {
        let target = PgTarget::parse(&source)?;
        let mut conn = target.connect()?;
        let settings = check_settings(&mut conn, &source, "a PostgreSQL")?;
        let now = postgres::server_now_ns(&mut conn).map_err(|e| format!("{source}: {e}"))?;
        let expired = now - postgres::SESSION_EXPIRY.as_nanos() as i64;
        return report(&mut conn, &source, &settings, &|heartbeat_ns| {
            if heartbeat_ns < expired {
                "; its heartbeat stopped: the other mounts end it"
            } else {
                ""
            }
        });
    }
    // Whether a mount holds the volume (taken and let go before SQLite opens the file: closing
    // another fd of the database would drop SQLite's own locks on it).
    let mounted = db.exists() && looks_like_volume(db) && VolumeLock::take(db).is_err();
    let (conn, settings) = check(db, false)?;
    let mut out = report(&mut SqliteConn(conn), &source, &settings, &|_| {
        if mounted {
            ""
        } else {
            "; ended without unmounting: the next mount cleans up after it"
        }
    })?;
    let dir = intent_dir_of(db);
    for log in crate::intent::dead_logs(&dir, None)? {
        out += &format!(
            "  intent log     {}: {} changes a crashed mount answered; the next mount applies those that did not commit\n",
            log.path.display(),
            log.records.len()
        );
    }
    Ok(out)
}

/// The status text; `note` says what a session with this heartbeat is.
fn report(
    tx: &mut dyn Tx,
    shown: &str,
    settings: &Settings,
    note: &dyn Fn(i64) -> &'static str,
) -> Result<String, String> {
    let mut q = |sql: &'static str| -> Result<i64, String> {
        tx.query_opt(sql, &[])
            .map_err(|e| format!("{shown}: {e}"))?
            .map_or(Ok(0), |r| r.int(0))
            .map_err(|e| format!("{shown}: {e}"))
    };
    let mut out = String::new();
    let secs = |ns: i64| ns / 1_000_000_000;
    out += &format!("volume {shown}\n");
    out += &format!("  id             {}\n", settings.uuid);
    out += &format!("  format         {}\n", settings.format_version);
    out += &format!("  data           {}\n", settings.data);
    out += &format!(
        "  created        {} (unix seconds)\n",
        secs(settings.created_ns)
    );
    out += &format!("  inodes         {}\n", q("SELECT count(*) FROM inodes")?);
    out += &format!(
        "  bytes          {}\n",
        q("SELECT CAST(coalesce(sum(size), 0) AS BIGINT) FROM inodes")?
    );
    out += &format!(
        "  inline files   {}\n",
        q("SELECT count(*) FROM inodes WHERE inline_data IS NOT NULL")?
    );
    out += &format!("  blocks         {}\n", q("SELECT count(*) FROM chunks")?);
    out += &format!("  slices         {}\n", q("SELECT count(*) FROM slices")?);
    out += &format!(
        "  blocks to gc   {}\n",
        q("SELECT count(*) FROM gc_blocks")?
    );
    out += &format!("  orphans        {}\n", q("SELECT count(*) FROM orphans")?);
    let rows = tx
        .query(
            "SELECT id, host, pid, mountpoint, heartbeat_ns FROM sessions ORDER BY id",
            &[],
        )
        .map_err(|e| format!("{shown}: {e}"))?;
    if rows.is_empty() {
        out += "  not mounted\n";
    }
    let now = now_ns();
    for r in rows {
        let line = (|| -> Result<String, crate::sql::DbError> {
            let heartbeat = r.int(4)?;
            Ok(format!(
                "  session {} on {} pid {} at {} (heartbeat {} s ago{})\n",
                r.int(0)?,
                r.text(1)?,
                r.int(2)?,
                r.text(3)?,
                (now - heartbeat) / 1_000_000_000,
                note(heartbeat)
            ))
        })()
        .map_err(|e| format!("{shown}: {e}"))?;
        out += &line;
    }
    Ok(out)
}
