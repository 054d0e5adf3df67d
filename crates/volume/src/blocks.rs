//! Blocks: the immutable objects holding file data, behind [`BlockStore`], and
//! `ObjectBlockStore`, which keeps them in an `object_store` (a local directory now; S3 is
//! issue 14). The async runtime object_store needs lives inside `ObjectBlockStore` and nowhere
//! else: callers block on it from their own thread.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::file::BLOCK_ID_SESSION_SHIFT;

/// Threads of the runtime that drives the object store's requests.
pub const IO_THREADS: usize = 2;
/// fsyncs of block files run on at most this many threads at once (the runtime's blocking
/// pool): a flush of 64 MiB syncs 64 files, and the file system joins concurrent fsyncs
/// into one journal commit.
pub const SYNC_THREADS: usize = 16;
/// The object holding the id of the volume a data directory belongs to.
pub const VOLUME_ID_KEY: &str = "lanefs-volume-id";
const BLOCKS_PREFIX: &str = "blocks";

pub trait BlockStore: Send + Sync + 'static {
    /// Stores the blocks (in parallel); all of them are stored when it returns Ok.
    fn put(&self, blocks: Vec<(u64, Bytes)>) -> io::Result<()>;
    /// A block's bytes; NotFound when it is missing.
    fn get(&self, id: u64) -> io::Result<Bytes>;
    fn delete(&self, id: u64) -> io::Result<()>;
    /// Fetches a block in the background and hands it to `done` (read-ahead).
    fn prefetch(&self, id: u64, done: Box<dyn FnOnce(io::Result<Bytes>) + Send>);
    /// Every block id in the store, or only those a session wrote.
    fn list(&self, session: Option<u64>) -> io::Result<Vec<u64>>;
    /// Makes the blocks durable: their bytes and their names, up to the store's root (fsync
    /// of each file, of its directory, and of every directory above it created since the
    /// store was opened). Called before the commit that refers to them.
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

impl ObjectBlockStore {
    /// A store in an existing local directory.
    pub fn local(dir: &Path) -> io::Result<ObjectBlockStore> {
        let store = LocalFileSystem::new_with_prefix(dir).map_err(io_error)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(IO_THREADS)
            .max_blocking_threads(SYNC_THREADS)
            .thread_name("lanefs-io")
            .enable_all()
            .build()?;
        Ok(ObjectBlockStore {
            store: Arc::new(store),
            runtime,
            local_root: Some(dir.to_owned()),
            durable_dirs: Mutex::new(HashSet::new()),
        })
    }
}

impl BlockStore for ObjectBlockStore {
    fn put(&self, blocks: Vec<(u64, Bytes)>) -> io::Result<()> {
        let store = &self.store;
        self.runtime.block_on(async {
            let puts = blocks
                .into_iter()
                .map(|(id, data)| async move { store.put(&key(id), PutPayload::from(data)).await });
            for result in futures::future::join_all(puts).await {
                result.map_err(io_error)?;
            }
            Ok(())
        })
    }

    fn get(&self, id: u64) -> io::Result<Bytes> {
        self.runtime
            .block_on(async { self.store.get(&key(id)).await?.bytes().await })
            .map_err(io_error)
    }

    fn delete(&self, id: u64) -> io::Result<()> {
        match self
            .runtime
            .block_on(self.store.delete(&key(id)))
            .map_err(io_error)
        {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn prefetch(&self, id: u64, done: Box<dyn FnOnce(io::Result<Bytes>) + Send>) {
        let store = self.store.clone();
        self.runtime.spawn(async move {
            let result = async { store.get(&key(id)).await?.bytes().await }.await;
            done(result.map_err(io_error));
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
                let meta = meta.map_err(io_error)?;
                if let Some(id) = id_of(&meta.location) {
                    ids.push(id);
                }
            }
            Ok(ids)
        })
    }

    fn sync(&self, ids: &[u64]) -> io::Result<()> {
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
            Err(e) => Err(io_error(e)),
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
            .map_err(io_error)
    }
}

impl ObjectBlockStore {
    /// fsync of each path, in parallel on the runtime's blocking threads.
    fn fsync_all(&self, paths: Vec<PathBuf>) -> io::Result<()> {
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

fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// CRC-32 of a block, as stored in `chunks.crc`.
pub fn checksum(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}
