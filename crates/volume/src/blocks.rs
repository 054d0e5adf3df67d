//! Blocks: the immutable objects holding file data, behind [`BlockStore`], and
//! `ObjectBlockStore`, which keeps them in an `object_store`: a local directory, or an S3
//! bucket prefix (AWS or any S3-compatible server). The async runtime object_store needs
//! lives inside `ObjectBlockStore` and nowhere else: callers block on it from their own
//! thread. A local directory's reads, small writes and their fsyncs run on the caller's
//! own thread instead (`ObjectBlockStore::inline`), and a local directory keeps released
//! blocks' files for new blocks to be written over (`keep_as_spare`, `write_over`).

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};

use crate::file::BLOCK_ID_SESSION_SHIFT;
use crate::location::{DataLocation, S3Credentials, S3Location};

/// Threads of the runtime that drives the object store's requests.
pub const IO_THREADS: usize = 2;
/// fsyncs of block files run on at most this many threads at once (the runtime's blocking
/// pool): a flush of 64 MiB syncs 64 files, and the file system joins concurrent fsyncs
/// into one journal commit.
pub const SYNC_THREADS: usize = 16;
/// The object holding the id of the volume a data directory belongs to.
pub const VOLUME_ID_KEY: &str = "lanefs-volume-id";
const BLOCKS_PREFIX: &str = "blocks";
/// A local store's `put` of at most this many blocks (a small file's flush, an fsync'd
/// slice) runs on the caller's thread; larger ones run in parallel on the runtime.
pub const INLINE_PUT_BLOCKS: usize = 2;
/// At most this many block PUTs of one `put` are in flight at once: a flush of
/// `FILE_DIRTY_MAX_BYTES` = 64 MiB is 64 blocks, and 32 MiB in flight covers S3's latency
/// (~20-50 ms for a 1 MiB PUT) at well over 1 GB/s while keeping the sockets and the memory
/// in the HTTP client bounded.
pub const PUTS_IN_FLIGHT: usize = 32;

// S3 requests: how long each may take and how failures are retried (object_store's
// RetryConfig: 5xx, 429, connection errors and timeouts of idempotent requests, which all of
// ours are, are retried; 4xx such as 403 and 404 are not). A request that cannot succeed
// fails after at most about S3_RETRY_TIMEOUT + S3_REQUEST_TIMEOUT + S3_BACKOFF_MAX (65 s),
// and then the error reaches the caller as EIO: a server restart or a network blip of a few
// seconds is ridden out, a dead server is reported within a minute, never a hang.
/// Time to open a TCP connection (and TLS) to the server.
pub const S3_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for one whole request, body included: a 1 MiB block at 35 KB/s still fits.
pub const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// No new attempt of a request once this long has passed since its first: the bound on
/// retries is this time (a restarting MinIO refuses connections, then answers 503, for a few
/// seconds; object_store's default of 10 retries is over in ~2.5 s of jittered backoff)...
pub const S3_RETRY_TIMEOUT: Duration = Duration::from_secs(30);
/// ...with a cap on the count as well, that the backoff does not reach within that time.
pub const S3_RETRIES: usize = 100;
/// Exponential backoff between attempts (with jitter): from 100 ms, doubling, at most 5 s,
/// so the first retries come fast (a dropped connection) and later ones do not hammer a
/// server that is restarting.
pub const S3_BACKOFF_FIRST: Duration = Duration::from_millis(100);
pub const S3_BACKOFF_MAX: Duration = Duration::from_secs(5);

pub trait BlockStore: Send + Sync + 'static {
    /// Stores the blocks (in parallel); all of them are stored when it returns Ok. The first
    /// `spares.len()` are written over those spares' files (released blocks this store kept,
    /// see `keep_as_spare`), which then take the new blocks' names; the spares are used up
    /// either way. Precondition: no more spares than blocks.
    fn put(&self, blocks: Vec<(u64, Bytes)>, spares: Vec<u64>) -> io::Result<()>;
    /// Keeps a released block's storage under the id `spare` instead of deleting it, so that
    /// a later `put` writes over it: true when kept (local stores, where a new file costs
    /// the allocation of its pages and the old one's deletion their freeing); false where
    /// there is nothing to keep (S3), and the caller deletes the block. A block already gone
    /// is NotFound.
    fn keep_as_spare(&self, id: u64, spare: u64) -> io::Result<bool>;
    /// A block's bytes; NotFound when it is missing.
    fn get(&self, id: u64) -> io::Result<Bytes>;
    /// Deletes a block; a block already gone is no error.
    fn delete(&self, id: u64) -> io::Result<()>;
    /// Deletes blocks nothing refers to (those of a flush that failed), logging what could
    /// not be deleted (fsck and gc find those). On a remote store in the background: the
    /// failure being reported may be the server's, and its answer must not wait for
    /// another round of retries.
    fn discard(&self, ids: Vec<u64>);
    /// Fetches a block in the background and hands it to `done` (read-ahead).
    fn prefetch(&self, id: u64, done: Box<dyn FnOnce(io::Result<Bytes>) + Send>);
    /// Every block id in the store, or only those a session wrote.
    fn list(&self, session: Option<u64>) -> io::Result<Vec<u64>>;
    /// Makes the blocks durable: their bytes and their names, up to the store's root (fsync
    /// of each file, of its directory, and of every directory above it created since the
    /// store was opened; nothing on S3, where an acknowledged PUT is durable). Called before
    /// the commit that refers to them.
    fn sync(&self, ids: &[u64]) -> io::Result<()>;
    fn get_volume_id(&self) -> io::Result<Option<String>>;
    fn put_volume_id(&self, id: &str) -> io::Result<()>;
}

/// A block's key: `blocks/SESSION/XX/ID`. The session that wrote it (the id's high bits)
/// comes first, so one listing finds what a crashed session may have left behind; the
/// low byte spreads a session's blocks over 256 directories.
fn key(id: u64) -> ObjectPath {
    ObjectPath::from(format!(
        "{}/{:02x}/{id:016x}",
        session_prefix(id >> BLOCK_ID_SESSION_SHIFT),
        id & 0xff
    ))
}

fn session_prefix(session: u64) -> String {
    format!("{BLOCKS_PREFIX}/{session:06x}")
}

/// The block id in a key made by [`key`].
fn id_of(location: &ObjectPath) -> Option<u64> {
    let name = location.filename()?;
    u64::from_str_radix(name, 16).ok()
}

/// An object_store error as an io::Error, keeping the OS errno (ENOSPC!) where there is one.
/// (A remote store's errors are `remote_error`'s: an OS error there is the HTTP client's,
/// ECONNREFUSED and the like, which mean EIO to a writer.)
fn io_error(e: object_store::Error) -> io::Error {
    if let object_store::Error::NotFound { .. } = e {
        return io::Error::new(io::ErrorKind::NotFound, e.to_string());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>()
            && let Some(code) = io.raw_os_error()
        {
            return io::Error::from_raw_os_error(code);
        }
        source = s.source();
    }
    io::Error::other(e.to_string())
}

/// A remote store's error: NotFound, PermissionDenied (403, 401) or other (EIO).
fn remote_error(e: object_store::Error) -> io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}

pub struct ObjectBlockStore {
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    /// The directory of a local store (for fsync); None for remote stores.
    local_root: Option<PathBuf>,
    /// Block directories (`blocks/SESSION/XX`) whose own name and whose parents' names are
    /// known durable: the first sync of a block in one also fsyncs `blocks/SESSION` and
    /// `blocks`, which `put` may have just created. The mutex protects the set, held for a
    /// lookup or an insert only (never across I/O); leaf lock.
    durable_dirs: Mutex<HashSet<PathBuf>>,
}

fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(IO_THREADS)
        .max_blocking_threads(SYNC_THREADS)
        .thread_name("lanefs-io")
        .enable_all()
        .build()
}

impl ObjectBlockStore {
    /// The store at a volume's data location (S3 credentials from the environment).
    pub fn open(location: &DataLocation) -> io::Result<ObjectBlockStore> {
        match location {
            DataLocation::Dir(dir) => ObjectBlockStore::local(dir),
            DataLocation::S3(s3) => {
                let credentials = crate::location::s3_credentials().map_err(io::Error::other)?;
                ObjectBlockStore::s3(s3, credentials)
            }
        }
    }

    /// A store in an existing local directory.
    pub fn local(dir: &Path) -> io::Result<ObjectBlockStore> {
        let store = LocalFileSystem::new_with_prefix(dir).map_err(io_error)?;
        Ok(ObjectBlockStore {
            store: Arc::new(store),
            runtime: runtime()?,
            local_root: Some(dir.to_owned()),
            durable_dirs: Mutex::new(HashSet::new()),
        })
    }

    /// A store under an S3 bucket prefix. Path-style requests (what MinIO and most
    /// S3-compatible servers expect, and AWS still serves); plain HTTP only when the user
    /// gave an http:// endpoint.
    pub fn s3(location: &S3Location, credentials: S3Credentials) -> io::Result<ObjectBlockStore> {
        let client = ClientOptions::new()
            .with_connect_timeout(S3_CONNECT_TIMEOUT)
            .with_timeout(S3_REQUEST_TIMEOUT)
            .with_allow_http(
                location
                    .endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://")),
            );
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: S3_BACKOFF_FIRST,
                max_backoff: S3_BACKOFF_MAX,
                base: 2.0,
            },
            max_retries: S3_RETRIES,
            retry_timeout: S3_RETRY_TIMEOUT,
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&location.bucket)
            .with_region(&location.region)
            .with_access_key_id(credentials.access_key_id)
            .with_secret_access_key(credentials.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_client_options(client)
            .with_retry(retry);
        if let Some(token) = credentials.session_token {
            builder = builder.with_token(token);
        }
        if let Some(endpoint) = &location.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let s3 = builder.build().map_err(remote_error)?;
        let store: Arc<dyn ObjectStore> = if location.prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(PrefixStore::new(s3, location.prefix.as_str()))
        };
        Ok(ObjectBlockStore {
            store,
            runtime: runtime()?,
            local_root: None,
            durable_dirs: Mutex::new(HashSet::new()),
        })
    }

    fn error(&self, e: object_store::Error) -> io::Error {
        match self.local_root {
            Some(_) => io_error(e),
            None => remote_error(e),
        }
    }

    /// Runs a local store's operation on this thread: object_store's local file system does
    /// its file I/O on tokio's blocking pool when called inside a runtime, and inline when
    /// not (`maybe_spawn_blocking`), so polling it here, outside the runtime, saves the
    /// thread hand-offs of each block read (open, then read) and write, and of the fsyncs
    /// after a small flush, which on a page-cached file cost about as much as the I/O (an
    /// fsync'd 8 KiB slice: FSYNC p50 240-254 → 158-171 µs). Callers are FUSE queue and
    /// offload threads, never the runtime's own (its tasks use `runtime`).
    fn inline<T>(&self, op: impl std::future::Future<Output = T>) -> T {
        futures::executor::block_on(op)
    }

    /// The keys of every object under the store's root (blocks and the volume id): for
    /// format, which must find the prefix empty or holding a volume's objects only.
    pub fn list_all(&self) -> io::Result<Vec<String>> {
        self.runtime.block_on(async {
            let mut stream = self.store.list(None);
            let mut keys = Vec::new();
            while let Some(meta) = stream.next().await {
                keys.push(meta.map_err(|e| self.error(e))?.location.to_string());
            }
            Ok(keys)
        })
    }

    /// Deletes every object under the store's root (format --force of a remote store).
    pub fn delete_all(&self) -> io::Result<()> {
        let keys = self.list_all()?;
        self.runtime.block_on(async {
            let paths = futures::stream::iter(keys.into_iter().map(|k| Ok(ObjectPath::from(k))));
            let mut deleted = self.store.delete_stream(paths.boxed());
            while let Some(result) = deleted.next().await {
                match result {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.error(e)),
                }
            }
            Ok(())
        })
    }
}

impl BlockStore for ObjectBlockStore {
    fn put(&self, blocks: Vec<(u64, Bytes)>, spares: Vec<u64>) -> io::Result<()> {
        debug_assert!(spares.len() <= blocks.len());
        let store = &self.store;
        let error = |e| self.error(e);
        let inline = blocks.len() <= INLINE_PUT_BLOCKS;
        let spares = spares.into_iter().map(Some).chain(std::iter::repeat(None));
        let puts = blocks.into_iter().zip(spares);
        if let Some(root) = &self.local_root
            && inline
        {
            return self.inline(async {
                let mut result = Ok(());
                for ((id, data), spare) in puts {
                    result = match (&result, spare) {
                        // After a failure the spares left are used up all the same.
                        (Err(_), spare) => {
                            if let Some(spare) = spare {
                                let _ = std::fs::remove_file(root.join(key(spare).as_ref()));
                            }
                            continue;
                        }
                        (Ok(()), Some(spare)) => write_over(root, spare, id, &data),
                        (Ok(()), None) => store
                            .put(&key(id), PutPayload::from(data))
                            .await
                            .map(drop)
                            .map_err(error),
                    };
                }
                result
            });
        }
        let failed = AtomicBool::new(false);
        let failed = &failed;
        self.runtime.block_on(async {
            let mut puts = futures::stream::iter(puts.map(|((id, data), spare)| async move {
                if failed.load(Ordering::Relaxed) {
                    // (The spare is used up all the same: its file goes.)
                    if let (Some(spare), Some(root)) = (spare, &self.local_root) {
                        let _ = std::fs::remove_file(root.join(key(spare).as_ref()));
                    }
                    return Ok(());
                }
                match (spare, &self.local_root) {
                    (Some(spare), Some(root)) => {
                        let root = root.clone();
                        self.runtime
                            .spawn_blocking(move || write_over(&root, spare, id, &data))
                            .await
                            .map_err(|e| io::Error::other(e.to_string()))?
                    }
                    _ => store
                        .put(&key(id), PutPayload::from(data))
                        .await
                        .map(drop)
                        .map_err(error),
                }
            }))
            .buffer_unordered(PUTS_IN_FLIGHT);
            // After the first failure no new put starts, and those in flight are awaited,
            // not dropped: a dropped put may still land after the flush has discarded its
            // block (the local store writes in a blocking task that runs on when its future
            // is dropped; an S3 request may already be at the server), leaving a block that
            // nothing refers to on a disk that may be the full one.
            let mut first_error = None;
            while let Some(result) = puts.next().await {
                if let Err(e) = result {
                    failed.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    fn keep_as_spare(&self, id: u64, spare: u64) -> io::Result<bool> {
        let Some(root) = &self.local_root else {
            return Ok(false);
        };
        rename_into(
            &root.join(key(id).as_ref()),
            &root.join(key(spare).as_ref()),
        )?;
        Ok(true)
    }

    fn get(&self, id: u64) -> io::Result<Bytes> {
        let get = async { self.store.get(&key(id)).await?.bytes().await };
        match self.local_root {
            Some(_) => self.inline(get),
            None => self.runtime.block_on(get),
        }
        .map_err(|e| self.error(e))
    }

    fn delete(&self, id: u64) -> io::Result<()> {
        match self
            .runtime
            .block_on(self.store.delete(&key(id)))
            .map_err(|e| self.error(e))
        {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn discard(&self, ids: Vec<u64>) {
        let store = self.store.clone();
        let deletes = async move {
            for id in ids {
                match store.delete(&key(id)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => tracing::warn!(
                        "volume: removing unused block {id:016x}: {e} (fsck and gc will)"
                    ),
                }
            }
        };
        match self.local_root {
            Some(_) => self.runtime.block_on(deletes),
            None => drop(self.runtime.spawn(deletes)),
        }
    }

    fn prefetch(&self, id: u64, done: Box<dyn FnOnce(io::Result<Bytes>) + Send>) {
        let store = self.store.clone();
        let remote = self.local_root.is_none();
        self.runtime.spawn(async move {
            let result = async { store.get(&key(id)).await?.bytes().await }.await;
            done(result.map_err(if remote { remote_error } else { io_error }));
        });
    }

    fn list(&self, session: Option<u64>) -> io::Result<Vec<u64>> {
        self.runtime.block_on(async {
            let prefix = ObjectPath::from(match session {
                Some(s) => session_prefix(s),
                None => BLOCKS_PREFIX.to_owned(),
            });
            let mut stream = self.store.list(Some(&prefix));
            let mut ids = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| self.error(e))?;
                if let Some(id) = id_of(&meta.location) {
                    ids.push(id);
                }
            }
            Ok(ids)
        })
    }

    fn sync(&self, ids: &[u64]) -> io::Result<()> {
        // S3 (and compatible servers) acknowledge a PUT only once the object is durable:
        // nothing is left to sync.
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        let files: Vec<PathBuf> = ids.iter().map(|id| root.join(key(*id).as_ref())).collect();
        // Each block directory once per call: its entries for all the blocks above. A
        // directory seen for the first time brings its parents up to the root, which `put`
        // may have created for it (`blocks/SESSION/XX`).
        let mut dirs = BTreeSet::new();
        let mut new_dirs = Vec::new();
        for file in &files {
            if let Some(dir) = file.parent()
                && dirs.insert(dir.to_owned())
            {
                new_dirs.push(dir.to_owned());
            }
        }
        new_dirs.retain(|d| !lock(&self.durable_dirs).contains(d));
        for dir in &new_dirs {
            let mut above = dir.parent();
            while let Some(parent) = above
                && parent.starts_with(root)
            {
                dirs.insert(parent.to_owned());
                above = parent.parent();
            }
        }
        // Files and the directories naming them at once (no order between them is needed:
        // all are done before this returns, and the commit that refers to the blocks comes
        // after); concurrent fsyncs share the file system's journal commits.
        let mut paths = files;
        paths.extend(dirs);
        self.fsync_all(paths)?;
        lock(&self.durable_dirs).extend(new_dirs);
        Ok(())
    }

    fn get_volume_id(&self) -> io::Result<Option<String>> {
        let path = ObjectPath::from(VOLUME_ID_KEY);
        match self
            .runtime
            .block_on(async { self.store.get(&path).await?.bytes().await })
        {
            Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim().to_owned())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    fn put_volume_id(&self, id: &str) -> io::Result<()> {
        let path = ObjectPath::from(VOLUME_ID_KEY);
        self.runtime
            .block_on(
                self.store
                    .put(&path, PutPayload::from(Bytes::from(format!("{id}\n")))),
            )
            .map(|_| ())
            .map_err(|e| self.error(e))
    }
}

impl ObjectBlockStore {
    /// fsync of each path, in parallel on the runtime's blocking threads (on this thread
    /// when they are few: a small flush's one block and its directory).
    fn fsync_all(&self, paths: Vec<PathBuf>) -> io::Result<()> {
        if paths.len() <= 2 * INLINE_PUT_BLOCKS {
            return paths
                .iter()
                .try_for_each(|path| std::fs::File::open(path)?.sync_all());
        }
        self.runtime.block_on(async {
            let syncs = paths.into_iter().map(|path| {
                self.runtime
                    .spawn_blocking(move || std::fs::File::open(&path)?.sync_all())
            });
            for result in futures::future::join_all(syncs).await {
                result.map_err(|e| io::Error::other(e.to_string()))??;
            }
            Ok(())
        })
    }
}

/// Writes block `id` over the file of block `spare` (a local store's kept file: its pages
/// are overwritten, not allocated) and gives the file `id`'s name. On failure neither name
/// is left (what remains of either would be a block nothing refers to).
fn write_over(root: &Path, spare: u64, id: u64, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (from, to) = (root.join(key(spare).as_ref()), root.join(key(id).as_ref()));
    // (O_NOFOLLOW: the spare is a file this store renamed there; a link in its place is not
    // followed out of the data directory.)
    let written = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&from)
        .and_then(|mut file| {
            file.write_all(data)?;
            file.set_len(data.len() as u64)
        })
        .and_then(|()| rename_into(&from, &to));
    if written.is_err() {
        let _ = std::fs::remove_file(&from);
        let _ = std::fs::remove_file(&to);
    }
    written
}

/// rename(2), making the target's directory first when it is missing (a block directory
/// `blocks/SESSION/XX` is made by the first block stored in it). NotFound: `from` is gone.
fn rename_into(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && from.exists() => {
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::rename(from, to)
        }
        other => other,
    }
}

fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// CRC-32 of a block, as stored in `chunks.crc`.
pub fn checksum(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}
