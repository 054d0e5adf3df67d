//! One open file's data: its size (an atomic), its write gate, the chunk buffers written and
//! not yet flushed, and what the store holds (inline bytes, or the chunk map and the chunks'
//! slices). Flushing turns dirty chunks into new immutable blocks (a whole chunk, or the span
//! that changed as a slice) and commits them as one metadata change.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};

use bytes::Bytes;

use crate::blocks::{BlockStore, checksum};
use crate::meta::{
    self, ChunkRec, DataUpdate, Errno, FileRec, InlineUpdate, InodeRec, MetaStore, SliceRec,
};

/// A file is cut into chunks of this size; a chunk's content is one block and the slices
/// laid over it (see ARCHITECTURE.md, "Data", for why 1 MiB).
pub const CHUNK_BYTES: u64 = 1 << 20;
/// A flush stores the part of a stored chunk that writes changed as a slice (see schema step
/// 4) when that part is at most this long; a longer one rewrites the chunk's block.
pub const SLICE_MAX_BYTES: usize = 256 << 10;
/// A chunk's slices, at most: the flush that would add one more writes a new base block
/// instead, which drops them (compaction), so a read assembles at most this many pieces
/// over its base, and a log fsync'd every few KiB writes a whole block once per this many
/// fsyncs instead of at each.
pub const SLICES_PER_CHUNK_MAX: usize = 16;
/// A file's last close compacts its chunks that have at least this many slices, in the
/// background (`FileState::compact`).
pub const COMPACT_AT_CLOSE_SLICES: usize = 4;
/// Files up to this size with no chunks keep their bytes in the metadata.
pub const INLINE_MAX_BYTES: u64 = 64 << 10;
/// A file whose unflushed writes pass this is flushed by the write that passed it; so is one
/// whose dirty buffers hold more than this and a chunk (small writes spread over a large
/// file hold a whole stored chunk each: 4 KiB writes 1 MiB apart would otherwise hold 16 GiB
/// before they had written 64 MiB).
pub const FILE_DIRTY_MAX_BYTES: u64 = 64 << 20;
/// The mount's chunk buffers, at most, by default: an eighth of the machine's memory, within
/// [64 MiB, 1 GiB] (`-o dirty_max=SIZE` sets it).
const MOUNT_DIRTY_MAX_BYTES: u64 = 1 << 30;
const MOUNT_DIRTY_MIN_BYTES: u64 = FILE_DIRTY_MAX_BYTES;
/// The largest file (16 TiB, as ext4's): 16 M chunk rows. Writes and truncates past it get
/// EFBIG.
pub const MAX_FILE_BYTES: u64 = 16 << 40;
/// Holes in unflushed data are found at this granularity (SEEK_HOLE / SEEK_DATA).
const HOLE_GRAIN_BYTES: usize = 4096;
/// Blocks kept in memory after a read, at most (the local block cache).
pub const BLOCK_CACHE_BYTES: usize = 256 << 20;
/// Chunks fetched ahead of a sequential reader (4 MiB: four parallel gets in flight).
pub const READ_AHEAD_CHUNKS: u64 = 4;
const CACHE_SHARDS: usize = 16;
/// Block ids are the session id above this many bits and a per-session counter below.
pub const BLOCK_ID_SESSION_SHIFT: u32 = 40;

struct CacheShard {
    blocks: HashMap<u64, Bytes>,
    /// Insertion order, for eviction (first in, first out).
    order: VecDeque<u64>,
    bytes: usize,
    /// Blocks a read-ahead is fetching: not fetched again by another read-ahead, and a read
    /// that needs one waits for it rather than sending a second GET (at S3's latency every
    /// sequential read would otherwise re-request the 4 chunks ahead that are in flight).
    fetching: HashSet<u64>,
}

/// Recently read blocks, by id, at most BLOCK_CACHE_BYTES (first in, first out).
pub struct BlockCache {
    /// Each mutex protects one shard; held for a map operation only (never across I/O).
    /// Leaf locks. The condvar beside it wakes reads waiting for a block the shard's
    /// `fetching` holds.
    shards: Vec<(Mutex<CacheShard>, Condvar)>,
}

impl BlockCache {
    fn new() -> BlockCache {
        BlockCache {
            shards: (0..CACHE_SHARDS)
                .map(|_| {
                    let shard = CacheShard {
                        blocks: HashMap::new(),
                        order: VecDeque::new(),
                        bytes: 0,
                        fetching: HashSet::new(),
                    };
                    (Mutex::new(shard), Condvar::new())
                })
                .collect(),
        }
    }

    fn shard(&self, block: u64) -> std::sync::MutexGuard<'_, CacheShard> {
        lock(&self.shards[(block as usize) % CACHE_SHARDS].0)
    }

    /// Marks a block as being fetched, unless it is cached or already being fetched.
    fn begin_fetch(&self, block: u64) -> bool {
        let mut shard = self.shard(block);
        !shard.blocks.contains_key(&block) && shard.fetching.insert(block)
    }

    /// Ends a fetch begun by `begin_fetch`: caches what it got (if it is good) and wakes the
    /// reads waiting for it.
    fn end_fetch(&self, block: u64, data: Option<Bytes>) {
        if let Some(data) = data {
            self.insert(block, data);
        }
        let (mutex, fetched) = &self.shards[(block as usize) % CACHE_SHARDS];
        lock(mutex).fetching.remove(&block);
        fetched.notify_all();
    }

    /// The block, once a fetch in flight for it ended (None: no fetch, or it failed). The
    /// wait is bounded by the fetch's own (the block store's timeouts and retry bound).
    fn wait_for_fetch(&self, block: u64) -> Option<Bytes> {
        let (mutex, fetched) = &self.shards[(block as usize) % CACHE_SHARDS];
        let mut shard = lock(mutex);
        while shard.fetching.contains(&block) {
            shard = fetched.wait(shard).unwrap_or_else(|e| e.into_inner());
        }
        shard.blocks.get(&block).cloned()
    }

    fn get(&self, block: u64) -> Option<Bytes> {
        self.shard(block).blocks.get(&block).cloned()
    }

    fn insert(&self, block: u64, data: Bytes) {
        let mut shard = self.shard(block);
        let limit = BLOCK_CACHE_BYTES / CACHE_SHARDS;
        while shard.bytes + data.len() > limit {
            let Some(old) = shard.order.pop_front() else {
                break;
            };
            if let Some(b) = shard.blocks.remove(&old) {
                shard.bytes -= b.len();
            }
        }
        let len = data.len();
        if shard.blocks.insert(block, data).is_none() {
            shard.bytes += len;
            shard.order.push_back(block);
        }
    }

    fn forget(&self, block: u64) {
        let mut shard = self.shard(block);
        if let Some(b) = shard.blocks.remove(&block) {
            shard.bytes -= b.len();
            shard.order.retain(|id| *id != block);
        }
    }
}

/// Released blocks a local store keeps for new blocks to be written over: one flush past the
/// dirty limit (`FILE_DIRTY_MAX_BYTES` of 1 MiB chunks).
pub const SPARE_BLOCKS_MAX: usize = 64;
/// Reads of a chunk's stored pieces that a flush may overtake (replace a block under the
/// read) before the next one holds the view (see `FileState::read_stored`).
const STORED_READ_TRIES: u32 = 16;

/// How much memory the mount's unflushed writes hold, against its cap: the lengths of the
/// dirty chunk buffers, which are what was written plus, for a write into a stored chunk, the
/// chunk's bytes it read first (a 4 KiB write there holds the whole 1 MiB). Past the cap, writers wait for the writeback thread to flush the files holding most (the kernel's
/// `balance_dirty_pages` throttles writers to its flusher threads the same way), and flush
/// their own file if that does not bring the mount back under in `DIRTY_WAIT_MAX`.
pub struct DirtyBudget {
    /// Bytes held by every file of the mount. Changed with the file's own count
    /// (`FileState::held_bytes`), wherever a buffer's length changes or it enters or leaves
    /// a dirty map.
    held: AtomicU64,
    cap: u64,
    /// Writers waiting for the writeback to bring `held` under the cap: the mutex
    /// guards nothing but the condition's wait (a leaf lock, never held across I/O).
    under_cap: (Mutex<()>, Condvar),
}

/// How long a write past the mount's dirty cap waits for the writeback thread before it
/// flushes its own file.
pub const DIRTY_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

impl DirtyBudget {
    /// A budget of `cap` bytes; None: the default for this machine.
    pub fn new(cap: Option<u64>) -> DirtyBudget {
        let cap = cap.unwrap_or_else(|| {
            (physical_memory_bytes() / 8).clamp(MOUNT_DIRTY_MIN_BYTES, MOUNT_DIRTY_MAX_BYTES)
        });
        DirtyBudget {
            held: AtomicU64::new(0),
            cap,
            under_cap: (Mutex::new(()), Condvar::new()),
        }
    }

    /// The smallest cap `-o dirty_max` takes: one file's chunks between two flushes.
    pub const MIN_CAP_BYTES: u64 = 4 * CHUNK_BYTES;

    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn cap_bytes(&self) -> u64 {
        self.cap
    }

    pub fn over_cap(&self) -> bool {
        self.held_bytes() > self.cap
    }

    /// Whether the writeback, freeing the largest holders first, may stop: a quarter of the
    /// cap below it, so that writers do not meet the cap again at the next chunk.
    pub fn under_low_mark(&self) -> bool {
        self.held_bytes() <= self.cap - self.cap / 4
    }

    fn add(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }

    fn remove(&self, bytes: u64) {
        let before = self.held.fetch_sub(bytes, Ordering::Relaxed);
        if before > self.cap && before - bytes <= self.cap {
            let _waiting = lock(&self.under_cap.0);
            self.under_cap.1.notify_all();
        }
    }

    /// Waits until the mount is under its cap, at most `max`; whether it is.
    pub fn wait_under_cap(&self, max: std::time::Duration) -> bool {
        let waiting = lock(&self.under_cap.0);
        let (_waiting, waited) = self
            .under_cap
            .1
            .wait_timeout_while(waiting, max, |_| self.over_cap())
            .unwrap_or_else(|e| e.into_inner());
        !waited.timed_out()
    }
}

/// Nanoseconds since the first call, on a clock that setting the time of day does not move
/// (never 0, which stands for "none" where it is stored).
pub fn monotonic_ns() -> i64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as i64
        + 1
}

/// The machine's memory (0 if sysinfo(2) fails, which the clamp above turns into the least
/// cap).
fn physical_memory_bytes() -> u64 {
    // SAFETY: sysinfo(2) fills the struct it is given, which is plain data that all zeros
    // is a valid value of.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable sysinfo struct for the call's duration.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return 0;
    }
    (info.totalram as u64).saturating_mul(u64::from(info.mem_unit.max(1)))
}

/// The data path shared by all files: the block store, the block cache, block ids.
pub struct DataPath {
    /// The memory the mount's unflushed writes hold, and its cap.
    pub dirty: Arc<DirtyBudget>,
    pub blocks: Arc<dyn BlockStore>,
    cache: Arc<BlockCache>,
    next_block: AtomicU64,
    /// Released blocks kept by the store (`BlockStore::keep_as_spare`) under fresh ids of
    /// this session, for the next puts to write over: on a local store a new block file
    /// costs the allocation of its pages and a deleted one their freeing, which made 60 % of
    /// the block writers' CPU in seed 000's overwrite job (the data on tmpfs). Unreferenced
    /// blocks of this session, so a crash leaves nothing the next mount's cleanup of an
    /// ended session's blocks does not delete. Filled by the reaper, at most
    /// `SPARE_BLOCKS_MAX`, emptied when it idles and at unmount (`drop_spares`). The mutex
    /// protects the list, held for a push or a split only (never across I/O); leaf lock.
    /// Only where one mount holds the volume (`keep_spares`): another mount may be reading a
    /// released block it still knows, which a deletion leaves readable through its open
    /// file and a write over it would not.
    spares: Mutex<Vec<u64>>,
    keep_spares: bool,
    /// Blocks written over a spare since the mount (`lanefs stats`: blocks_written_over).
    written_over: AtomicU64,
}

impl DataPath {
    /// `keep_spares`: whether released blocks may be written over (see `spares`).
    /// `dirty_max`: the cap of the mount's unflushed writes (see [`DirtyBudget`]).
    pub fn new(
        blocks: Arc<dyn BlockStore>,
        session: u64,
        keep_spares: bool,
        dirty_max: Option<u64>,
    ) -> DataPath {
        DataPath {
            dirty: Arc::new(DirtyBudget::new(dirty_max)),
            keep_spares,
            blocks,
            cache: Arc::new(BlockCache::new()),
            next_block: AtomicU64::new(session << BLOCK_ID_SESSION_SHIFT),
            spares: Mutex::new(Vec::new()),
            written_over: AtomicU64::new(0),
        }
    }

    /// For `lanefs stats`: blocks written over a spare since the mount, spares kept now, and
    /// the memory unflushed writes hold now, with its cap.
    pub fn counters(&self) -> [(&'static str, u64); 4] {
        [
            (
                "blocks_written_over",
                self.written_over.load(Ordering::Relaxed),
            ),
            ("spare_blocks", lock(&self.spares).len() as u64),
            ("dirty_held_bytes", self.dirty.held_bytes()),
            ("dirty_cap_bytes", self.dirty.cap_bytes()),
        ]
    }

    fn new_block_id(&self) -> u64 {
        self.next_block.fetch_add(1, Ordering::Relaxed)
    }

    /// Stores new blocks, written over kept spares as far as there are any.
    fn put_blocks(&self, puts: Vec<(u64, Bytes)>) -> std::io::Result<()> {
        let spares = {
            let mut spares = lock(&self.spares);
            let keep = spares.len().saturating_sub(puts.len());
            spares.split_off(keep)
        };
        let used = spares.len() as u64;
        self.blocks.put(puts, spares)?;
        self.written_over.fetch_add(used, Ordering::Relaxed);
        Ok(())
    }

    /// Gives up a block that a new one replaced, once its release is durable (the
    /// reaper's): kept as a spare while there are fewer than `SPARE_BLOCKS_MAX` and the store
    /// can keep it (more writes are likely to follow an overwrite; a deletion's blocks are
    /// deleted, so their space comes back at once), else deleted. A block already gone is no
    /// error.
    pub fn release_block(&self, id: u64) -> std::io::Result<()> {
        if self.keep_spares && lock(&self.spares).len() < SPARE_BLOCKS_MAX {
            let spare = self.new_block_id();
            match self.blocks.keep_as_spare(id, spare) {
                Ok(true) => {
                    lock(&self.spares).push(spare);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        self.blocks.delete(id)
    }

    /// Deletes the kept spares (the reaper when idle, and at unmount).
    pub fn drop_spares(&self) {
        let spares = std::mem::take(&mut *lock(&self.spares));
        if !spares.is_empty() {
            self.blocks.discard(spares);
        }
    }

    /// A block of chunk `idx` (its base or a slice), checked against its checksum; a
    /// failure is the caller's to report (`BlockFault::report`).
    fn read_block(&self, block: BlockRef) -> Result<Bytes, BlockFault> {
        let BlockRef { id, crc } = block;
        if let Some(b) = self.cache.get(id).or_else(|| self.cache.wait_for_fetch(id)) {
            return Ok(b);
        }
        let data = match self.blocks.get(id) {
            Ok(data) => data,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(BlockFault::Missing),
            Err(e) => return Err(BlockFault::Unreadable(e)),
        };
        if checksum(&data) != crc {
            return Err(BlockFault::Corrupt);
        }
        self.cache.insert(id, data.clone());
        Ok(data)
    }

    /// Starts fetching blocks into the cache in the background (read-ahead). A block that
    /// fails its checksum is not cached: the read that needs it fetches it again and reports.
    fn prefetch(&self, blocks: Vec<BlockRef>) {
        for BlockRef { id, crc } in blocks {
            if !self.cache.begin_fetch(id) {
                continue;
            }
            let cache = self.cache.clone();
            self.blocks.prefetch(
                id,
                Box::new(move |data| {
                    let good = data.ok().filter(|data| checksum(data) == crc);
                    cache.end_fetch(id, good);
                }),
            );
        }
    }

    fn forget_cached(&self, block: u64) {
        self.cache.forget(block);
    }
}

/// Why a block could not be read.
enum BlockFault {
    Missing,
    Corrupt,
    Unreadable(std::io::Error),
}

impl BlockFault {
    /// Logs the fault of block `id` of inode `ino`'s chunk `idx`: EIO for the reader.
    fn report(self, ino: u64, idx: u64, id: u64) -> Errno {
        match self {
            BlockFault::Missing => tracing::error!(
                "volume: block {id:016x} of inode {ino} (chunk {idx}) is missing from the block store"
            ),
            BlockFault::Corrupt => tracing::error!(
                "volume: block {id:016x} of inode {ino} (chunk {idx}) fails its checksum"
            ),
            BlockFault::Unreadable(e) => {
                tracing::error!("volume: reading block {id:016x} of inode {ino}: {e}")
            }
        }
        libc::EIO
    }
}

/// A stored block as a read needs it: its id and the checksum of the whole object.
#[derive(Clone, Copy)]
struct BlockRef {
    id: u64,
    crc: u32,
}

/// What the store holds for a file.
#[derive(Default)]
struct Committed {
    inline: Option<Bytes>,
    chunks: BTreeMap<u64, ChunkRec>,
    /// Chunk index → its slices, in commit order (laid over the base in this order).
    slices: BTreeMap<u64, Vec<SliceRec>>,
}

impl Committed {
    /// The view of `rec` (its rows checked by `ops::check_file_rows`). Bytes that rows
    /// hold past the file's size are not the file's (a later extension reads zeros
    /// there): they are cut here, so that no read or write can bring them back.
    fn of(rec: FileRec) -> Committed {
        let size = rec.attr.size;
        // How much of chunk `idx` lies within the size, from `pos` on.
        let room = |idx: u64, pos: u64| size.saturating_sub(idx * CHUNK_BYTES + pos);
        let mut c = Committed {
            inline: rec.inline.map(|mut b| {
                b.truncate(b.len().min(size as usize));
                Bytes::from(b)
            }),
            chunks: rec
                .chunks
                .into_iter()
                .filter(|c| room(c.idx, 0) > 0)
                .map(|c| {
                    let len = c.len.min(room(c.idx, 0));
                    (c.idx, ChunkRec { len, ..c })
                })
                .collect(),
            slices: BTreeMap::new(),
        };
        for slice in rec.slices {
            let room = room(slice.idx, slice.pos);
            if room > 0 {
                let len = slice.len.min(room);
                c.slices
                    .entry(slice.idx)
                    .or_default()
                    .push(SliceRec { len, ..slice });
            }
        }
        c
    }

    /// A committed change, applied here as the store applied it (same fields, same order).
    fn apply(&mut self, u: DataUpdate) {
        self.inline = u.inline.map(Bytes::from);
        if self.inline.is_some() {
            self.chunks.clear();
            self.slices.clear();
        }
        if let Some(keep) = u.drop_from {
            self.chunks.retain(|idx, _| *idx < keep);
            self.slices.retain(|idx, _| *idx < keep);
        }
        if let Some((idx, len)) = u.trim {
            if let Some(chunk) = self.chunks.get_mut(&idx) {
                chunk.len = chunk.len.min(len);
            }
            if let Some(slices) = self.slices.get_mut(&idx) {
                slices.retain(|s| s.pos < len);
                for s in slices.iter_mut() {
                    s.len = s.len.min(len - s.pos);
                }
            }
        }
        for idx in &u.holes {
            self.chunks.remove(idx);
            self.slices.remove(idx);
        }
        for chunk in u.set {
            self.slices.remove(&chunk.idx);
            self.chunks.insert(chunk.idx, chunk);
        }
        for slice in u.slices {
            self.slices.entry(slice.idx).or_default().push(slice);
        }
        self.slices.retain(|_, s| !s.is_empty());
    }

    /// Whether chunk `idx` holds anything stored (a base or slices).
    fn holds(&self, idx: u64) -> bool {
        self.chunks.contains_key(&idx) || self.slices.contains_key(&idx)
    }

    /// How far into chunk `idx` its stored bytes go.
    fn extent(&self, idx: u64) -> u64 {
        let base = self.chunks.get(&idx).map_or(0, |c| c.len);
        self.slices
            .get(&idx)
            .into_iter()
            .flatten()
            .map(|s| s.pos + s.len)
            .fold(base, u64::max)
    }

    /// The pieces of chunk `idx` to lay down in order: (where in the chunk, how many bytes,
    /// the block whose first bytes they are).
    fn pieces(&self, idx: u64) -> Vec<(u64, u64, BlockRef)> {
        let base = self.chunks.get(&idx).map(|c| {
            let block = BlockRef {
                id: c.block,
                crc: c.crc,
            };
            (0, c.len, block)
        });
        let slices = self.slices.get(&idx).into_iter().flatten().map(|s| {
            let block = BlockRef {
                id: s.block,
                crc: s.crc,
            };
            (s.pos, s.len, block)
        });
        base.into_iter().chain(slices).collect()
    }
}

/// One chunk's unflushed bytes, shared so that a flush hands them to the block store without
/// copying them: a write that finds a flush still holding them copies first (`Arc::make_mut`).
type ChunkBytes = Arc<Vec<u8>>;
type ChunkBuf = Arc<Mutex<DirtyChunk>>;

/// A chunk being written: all its bytes as they read now (up to the last one written or
/// stored; past them zeros), and the span that writes changed since they were read from the
/// store, which a flush may store as a slice instead of rewriting the chunk.
#[derive(Clone)]
struct DirtyChunk {
    bytes: ChunkBytes,
    written: Span,
}

impl Default for DirtyChunk {
    /// The whole chunk zeros (a hole punched over it).
    fn default() -> Self {
        DirtyChunk {
            bytes: ChunkBytes::default(),
            written: Span {
                lo: 0,
                hi: CHUNK_BYTES as usize,
            },
        }
    }
}

/// [lo, hi) within a chunk; empty when lo >= hi.
#[derive(Clone, Copy, Debug)]
struct Span {
    lo: usize,
    hi: usize,
}

impl Span {
    const EMPTY: Span = Span {
        lo: usize::MAX,
        hi: 0,
    };

    fn add(&mut self, lo: usize, hi: usize) {
        if lo < hi {
            self.lo = self.lo.min(lo);
            self.hi = self.hi.max(hi);
        }
    }
}

/// A chunk's bytes as the `Bytes` of a block to store, without a copy.
struct SharedChunk(ChunkBytes);

impl AsRef<[u8]> for SharedChunk {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// What a write asks of its caller once its bytes are in, before the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// Nothing: answer.
    None,
    /// The file passed its own limit: flush it (`flush_over_limit`).
    FlushFile,
    /// The mount's unflushed writes passed its cap: wait for the writeback
    /// ([`DirtyBudget::wait_under_cap`]), then flush the file if that was not enough.
    MountOverCap,
}

pub struct FileState {
    pub ino: u64,
    /// The file's size, written data included. Read without any lock (getattr, lseek).
    size: AtomicU64,
    /// mtime set by writes not yet flushed (0: none).
    dirty_mtime_ns: AtomicI64,
    /// One flush of the file at a time, across its block I/O and commit; truncate and
    /// fallocate take it too, so that their commits never interleave with a flush's. Before
    /// the gate.
    flushing: Mutex<()>,
    /// The write gate (seed 000): shared by writes ending within the size, exclusive for
    /// extending writes, truncate, and a flush's two short steps (taking its snapshot of the
    /// dirty chunks, and retiring them after its commit; not across its I/O). Before `dirty`
    /// and a chunk buffer; never held with another file's gate.
    gate: RwLock<()>,
    /// Writes so far: a flush that finds it moved since its snapshot leaves the file marked
    /// dirty. Changed under the gate.
    writes: AtomicU64,
    /// Opens of the inode on this mount; changed only under the open table's shard lock.
    pub opens: AtomicU32,
    /// Lost its last name while open: freed at the last release.
    pub orphaned: AtomicBool,
    /// Left the open table at its last release, after its last flush (`retire`): never
    /// flushed again. What a failed last flush left is lost (and was reported); a flush of
    /// it later, by a writeback pass that listed the state before, would commit those old
    /// bytes over whatever a newer open of the inode stored since.
    retired: AtomicBool,
    /// Another mount of a shared volume unlinked it while open here, and this mount's hold
    /// row keeps it: dropped at the last release.
    pub held_for_other_mount: AtomicBool,
    /// Known to have no `security.capability`: set when this mount created the inode (a
    /// new inode has no xattrs), cleared by any setxattr of that name. Nothing else sets
    /// one, so while it holds, the GETXATTR the kernel sends before the first write to a
    /// new file (a new FUSE inode is never S_NOSEC) needs no read of the store.
    pub capability_absent: AtomicBool,
    /// Bit 0: the load found no xattr a caller can list or get (see
    /// [`FileState::xattrs_absent`]). The bits above count the xattr changes begun and
    /// finished on the inode while this state lived: a load that raced one does not set
    /// bit 0 (its read may predate the change's commit).
    xattrs_known: AtomicU64,
    /// The directory this mount's create made it in (its state never read from the store;
    /// 0: not made here): its closes may commit its bytes without waiting (see
    /// `VolumeFs::flush_new_early`).
    pub created_in: AtomicU64,
    /// Another mount of a shared volume changed the inode since this state's view was read
    /// (set from the change log, cleared as a reload begins): its size and bytes are read
    /// again before they are answered, unless this mount has writes of its own to flush
    /// (which then win, as the last writer's do).
    changed_elsewhere: AtomicBool,
    /// The load from the store, done by the first open.
    loaded: OnceLock<Result<(), Errno>>,
    /// Chunk index → buffer of written, unflushed bytes (past its end: zeros). The mutex
    /// protects the map and is held only to find or insert a buffer; a buffer's own mutex is
    /// held while bytes are copied in or out. Order: gate → dirty → buffer.
    dirty: Mutex<BTreeMap<u64, ChunkBuf>>,
    /// Bytes written since the last flush (the sequential writer's limit, see `write`).
    dirty_bytes: AtomicU64,
    /// The lengths of the buffers in `dirty`, counted in the mount's budget too: changed as
    /// a buffer enters the map or leaves it (under the map's mutex) and as a write lengthens
    /// one (under the buffer's).
    held_bytes: AtomicU64,
    budget: Arc<DirtyBudget>,
    /// When the file's oldest unflushed write came (0: none): the writeback flushes a file
    /// whose writes waited `DIRTY_EXPIRE`, however often it is written.
    dirty_since_ns: AtomicI64,
    /// Where the last read ended: a read starting there is sequential and reads ahead.
    last_read_end: AtomicU64,
    /// What the store holds. Written only under the gate held exclusive (after a commit);
    /// read by reads and lseek. Leaf lock, held across I/O only by a read that flushes
    /// overtook many times (`read_stored`), which a flush's apply then waits for.
    committed: RwLock<Committed>,
    /// The commit of the file's bytes last queued without waiting (`flush_early`).
    early: Arc<EarlyCommit>,
}

/// A small file's bytes queued for commit without waiting for it (`FileState::flush_early`).
/// The bytes stay dirty in memory (they are what reads see until the file's state goes), so
/// a flush with no write since has nothing to do, and one after a failed commit commits them
/// again.
struct EarlyCommit {
    /// `FileState::writes` when it was queued; `NO_EARLY_COMMIT`: none (or forgotten: a
    /// truncate, a hole punched, or a commit of the usual kind since).
    writes: AtomicU64,
    /// Its commit failed (set by its completion on the committer).
    failed: AtomicBool,
    /// How many have been queued, and the number (in that count) of the last whose commit
    /// finished: equal when the last one queued has committed (an older one finishing
    /// late does not vouch for it, nor for a punch or truncate between, which are no
    /// writes).
    queued: AtomicU64,
    finished: AtomicU64,
}

const NO_EARLY_COMMIT: u64 = u64::MAX;

impl EarlyCommit {
    /// Whether a commit queued early covers the file's bytes as of `writes`.
    fn covers(&self, writes: u64) -> bool {
        self.writes.load(Ordering::Acquire) == writes && !self.failed.load(Ordering::Acquire)
    }

    /// Whether the store holds the file's bytes as of `writes`: a commit queued early
    /// covers them and has finished.
    fn stored(&self, writes: u64) -> bool {
        self.covers(writes)
            && self.finished.load(Ordering::Acquire) == self.queued.load(Ordering::Acquire)
    }

    fn forget(&self) {
        self.writes.store(NO_EARLY_COMMIT, Ordering::Release);
    }
}

/// Reads the file's record from the store again (`FileState::read`).
pub type Reload<'a> = &'a dyn Fn() -> Result<FileRec, Errno>;

/// Queues a file's data change for commit without waiting; the callback runs with its
/// outcome.
pub type QueueEarly<'a> = &'a dyn Fn(InlineUpdate, Box<dyn FnOnce(Result<(), Errno>) + Send>);

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for FileState {
    /// Buffers a failed flush left (their loss was reported to the close that failed) leave
    /// the mount's budget with the state.
    fn drop(&mut self) {
        let held = *self.held_bytes.get_mut();
        if held != 0 {
            self.budget.remove(held);
        }
    }
}

impl FileState {
    /// `budget`: the mount's, which the state's chunk buffers count in.
    pub fn new(ino: u64, budget: Arc<DirtyBudget>) -> FileState {
        FileState {
            ino,
            size: AtomicU64::new(0),
            dirty_mtime_ns: AtomicI64::new(0),
            flushing: Mutex::new(()),
            gate: RwLock::new(()),
            writes: AtomicU64::new(0),
            opens: AtomicU32::new(0),
            orphaned: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            held_for_other_mount: AtomicBool::new(false),
            capability_absent: AtomicBool::new(false),
            xattrs_known: AtomicU64::new(0),
            created_in: AtomicU64::new(0),
            changed_elsewhere: AtomicBool::new(false),
            loaded: OnceLock::new(),
            dirty: Mutex::new(BTreeMap::new()),
            dirty_bytes: AtomicU64::new(0),
            held_bytes: AtomicU64::new(0),
            budget,
            dirty_since_ns: AtomicI64::new(0),
            last_read_end: AtomicU64::new(0),
            committed: RwLock::new(Committed::default()),
            early: Arc::new(EarlyCommit {
                writes: AtomicU64::new(NO_EARLY_COMMIT),
                failed: AtomicBool::new(false),
                queued: AtomicU64::new(0),
                finished: AtomicU64::new(0),
            }),
        }
    }

    /// Loads the file from the store once (the first open); later calls return its outcome.
    pub fn load(&self, fetch: impl FnOnce() -> Result<FileRec, Errno>) -> Result<(), Errno> {
        *self.loaded.get_or_init(|| {
            let changes_before = self.xattrs_known.load(Ordering::SeqCst) & !1;
            let rec = fetch()?;
            if rec.xattr_names.as_ref().is_some_and(Vec::is_empty) {
                // Fails if an xattr change began or ended since the read started.
                let _ = self.xattrs_known.compare_exchange(
                    changes_before,
                    changes_before | 1,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            self.size.store(rec.attr.size, Ordering::Relaxed);
            *write_lock(&self.committed) = Committed::of(rec);
            Ok(())
        })
    }

    /// Replaces the committed view with the store's current one, `reload`'s read, and
    /// returns the inode's attributes as read with it. On a shared volume another mount may
    /// have changed the file since this mount's first open loaded it: a later open (close-
    /// to-open) and a read of a block the other mount replaced and deleted call this. Waits
    /// for a flush in progress (so the read cannot predate one of this mount's commits that
    /// the view has), and takes the size too when nothing is unflushed here. Bytes a close
    /// committed early (`flush_early`) and kept are dropped once that commit has finished:
    /// the store has them, or what another mount wrote over them since.
    pub fn reload(&self, reload: Reload<'_>) -> Result<InodeRec, Errno> {
        let _flushing = lock(&self.flushing);
        // Cleared before the read: a change that comes during it marks the state again. A
        // failed read leaves it as it found it.
        let was_stale = self.changed_elsewhere.swap(false, Ordering::SeqCst);
        let rec = match reload() {
            Ok(rec) => rec,
            Err(e) => {
                if was_stale {
                    self.changed_elsewhere.store(true, Ordering::SeqCst);
                }
                return Err(e);
            }
        };
        let _gate = write_lock(&self.gate);
        let (attr, size) = (rec.attr.clone(), rec.attr.size);
        // The view first, the dirty bytes it replaces after: reads and lseek take neither
        // the gate nor both locks at once, and one between the two would find neither.
        // (Not both held: a flush takes the view, then the dirty map.)
        *write_lock(&self.committed) = Committed::of(rec);
        let mut dirty = lock(&self.dirty);
        if !dirty.is_empty() && self.early.stored(self.writes.load(Ordering::Relaxed)) {
            self.unhold(dirty.values().map(|buf| lock(buf).bytes.len() as u64).sum());
            dirty.clear();
            self.dirty_bytes.store(0, Ordering::Relaxed);
            self.clean();
            self.early.forget();
        }
        if dirty.is_empty() {
            self.size.store(size, Ordering::Relaxed);
        }
        Ok(attr)
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Another mount changed the inode (its change log says so).
    pub fn changed_elsewhere(&self) {
        self.changed_elsewhere.store(true, Ordering::SeqCst);
    }

    /// Whether this state's size and view are older than another mount's change and no
    /// write of this mount is waiting to go over it: the store's answer is the newer one.
    pub fn stale(&self) -> bool {
        self.changed_elsewhere.load(Ordering::SeqCst)
            && (self.dirty_mtime().is_none()
                || self.early.stored(self.writes.load(Ordering::Relaxed)))
    }

    /// Whether the inode had no xattr a caller can list or get when its state was loaded,
    /// and no xattr change has begun on it since. Only a mount that alone changes the
    /// volume may answer from it: another mount's setxattr does not clear it.
    pub fn xattrs_absent(&self) -> bool {
        self.xattrs_known.load(Ordering::SeqCst) & 1 != 0
    }

    /// An xattr change of the inode begins or has committed: `xattrs_absent` no longer
    /// holds, and a load racing the change does not make it hold.
    pub fn xattrs_changing(&self) {
        let _ = self
            .xattrs_known
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| Some((w + 2) & !1));
    }

    /// Whether a flush has anything to commit: writes since the last commit that no
    /// queued early commit covers.
    pub fn unflushed(&self) -> bool {
        self.dirty_mtime().is_some() && !self.early.covers(self.writes.load(Ordering::Relaxed))
    }

    /// The mtime of writes not yet flushed, if any.
    pub fn dirty_mtime(&self) -> Option<i64> {
        match self.dirty_mtime_ns.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// The bytes the store holds for a chunk (empty: a hole).
    fn base(&self, dp: &DataPath, idx: u64) -> Result<Vec<u8>, Errno> {
        let extent = {
            let c = read_lock(&self.committed);
            if idx == 0
                && let Some(inline) = &c.inline
            {
                return Ok(inline.to_vec());
            }
            c.extent(idx)
        };
        let mut bytes = vec![0; extent as usize];
        self.read_stored(dp, idx, 0, &mut bytes, None)?;
        Ok(bytes)
    }

    /// Fills `dst` (zeros) with the stored bytes of chunk `idx` from `within` on: the
    /// inline bytes, or its base and then its slices in order, each where it overlaps.
    ///
    /// The pieces are read from a copy of the committed view, without its lock: a flush of
    /// the chunk may commit meanwhile and the reaper give the old blocks up (delete them, or
    /// write a new block over one kept as a spare). A block that fails to read and that the
    /// view no longer holds was such a replaced one: the read starts again from the new
    /// view (each time after a commit of this chunk; past `STORED_READ_TRIES`, holding it).
    /// One that the view still holds may have been replaced by another mount of a shared
    /// volume: with `reload`, the view is read again from the store once, and the read
    /// starts again from it; a block that the store's view names and that fails is lost.
    fn read_stored(
        &self,
        dp: &DataPath,
        idx: u64,
        within: usize,
        dst: &mut [u8],
        mut reload: Option<Reload<'_>>,
    ) -> Result<(), Errno> {
        let mut tries = 0;
        'view: loop {
            let view = read_lock(&self.committed);
            let inline = if idx == 0 { view.inline.clone() } else { None };
            let pieces = view.pieces(idx);
            // Overtaken `STORED_READ_TRIES` times, the read holds the view across its
            // fetches: a flush applies its view (and only then gives the old blocks up)
            // once the read is done, so a stream of flushes cannot starve it into an error.
            let mut held = (tries >= STORED_READ_TRIES).then_some(view);
            if let Some(inline) = inline {
                copy_part(dst, &inline, within);
                return Ok(());
            }
            let end = within + dst.len();
            for (pos, len, block) in pieces {
                let (pos, len) = (pos as usize, len as usize);
                let (lo, hi) = (pos.max(within), (pos + len).min(end));
                if lo >= hi {
                    continue;
                }
                let bytes = match dp.read_block(block) {
                    Ok(bytes) => bytes,
                    Err(fault) => {
                        tries += 1;
                        // Held, the view cannot have changed: the block is not a replaced
                        // one. Let go before anything below takes the lock again.
                        let was_held = held.take().is_some();
                        let replaced = !was_held
                            && !read_lock(&self.committed)
                                .pieces(idx)
                                .iter()
                                .any(|(_, _, b)| b.id == block.id);
                        if replaced {
                            continue 'view;
                        }
                        if !replaced && let Some(reload) = reload.take() {
                            match self.reload(reload) {
                                Ok(_) => continue 'view,
                                Err(e) => tracing::warn!(
                                    "volume: reading inode {} again from the store: {}",
                                    self.ino,
                                    std::io::Error::from_raw_os_error(e)
                                ),
                            }
                        }
                        return Err(fault.report(self.ino, idx, block.id));
                    }
                };
                let to = &mut dst[lo - within..hi - within];
                // A block shorter than its piece reads as zeros past its end.
                let from = &bytes[(lo - pos).min(bytes.len())..(hi - pos).min(bytes.len())];
                to[..from.len()].copy_from_slice(from);
                to[from.len()..].fill(0);
            }
            return Ok(());
        }
    }

    fn chunk_buf(&self, dp: &DataPath, idx: u64, whole: bool) -> Result<ChunkBuf, Errno> {
        if let Some(buf) = lock(&self.dirty).get(&idx) {
            return Ok(buf.clone());
        }
        // Read the chunk's current bytes outside the map's lock (it may be a block fetch).
        let base = if whole {
            Vec::new()
        } else {
            self.base(dp, idx)?
        };
        let mut dirty = lock(&self.dirty);
        let buf = dirty.entry(idx).or_insert_with(|| {
            self.hold(base.len() as u64);
            Arc::new(Mutex::new(DirtyChunk {
                bytes: Arc::new(base),
                written: Span::EMPTY,
            }))
        });
        Ok(buf.clone())
    }

    /// The state left the open table: no flush runs after this returns (one running now
    /// ends first).
    pub fn retire(&self) {
        let _flushing = lock(&self.flushing);
        self.retired.store(true, Ordering::Relaxed);
    }

    /// `bytes` more in the dirty buffers.
    /// Nothing for none: a write over bytes a buffer holds already (seed 000's writers, in
    /// parallel on one file) touches neither the file's count nor the mount's, whose cache
    /// line every writer of the mount would otherwise take in turn.
    fn hold(&self, bytes: u64) {
        if bytes != 0 {
            self.held_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.budget.add(bytes);
        }
    }

    /// `bytes` fewer in the dirty buffers.
    fn unhold(&self, bytes: u64) {
        if bytes != 0 {
            self.held_bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.budget.remove(bytes);
        }
    }

    /// The bytes the file's dirty buffers hold.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// The file has unflushed writes, the last at `now_ns`.
    fn dirtied(&self, now_ns: i64) {
        self.dirty_mtime_ns.store(now_ns, Ordering::Relaxed);
        let _ = self.dirty_since_ns.compare_exchange(
            0,
            monotonic_ns(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Nothing unflushed any more.
    fn clean(&self) {
        self.dirty_mtime_ns.store(0, Ordering::Relaxed);
        self.dirty_since_ns.store(0, Ordering::Relaxed);
    }

    /// When the oldest unflushed write came (`monotonic_ns`), if there is one.
    pub fn dirty_since(&self) -> Option<i64> {
        match self.dirty_since_ns.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// Writes `data` at `offset`; what the caller does before it answers (see
    /// [`Backpressure`]).
    pub fn write(
        &self,
        dp: &DataPath,
        offset: u64,
        data: &[u8],
        parallel: bool,
        now_ns: i64,
    ) -> Result<Backpressure, Errno> {
        let end = offset.checked_add(data.len() as u64).ok_or(libc::EFBIG)?;
        if end > MAX_FILE_BYTES {
            return Err(libc::EFBIG);
        }
        let _gate = if parallel && end <= self.size() {
            let shared = read_lock(&self.gate);
            if end <= self.size() {
                Gate::Shared(shared)
            } else {
                drop(shared);
                Gate::Exclusive(write_lock(&self.gate))
            }
        } else {
            Gate::Exclusive(write_lock(&self.gate))
        };
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let idx = pos / CHUNK_BYTES;
            let within = (pos % CHUNK_BYTES) as usize;
            let n = rest.len().min(CHUNK_BYTES as usize - within);
            let whole = within == 0 && n == CHUNK_BYTES as usize;
            let buf = match self.chunk_buf(dp, idx, whole) {
                Ok(buf) => buf,
                Err(e) => {
                    // The chunks before this one have their bytes (reads see them): they
                    // are flushed like any write's.
                    if pos > offset {
                        self.writes.fetch_add(1, Ordering::Relaxed);
                        self.dirtied(now_ns);
                    }
                    return Err(e);
                }
            };
            let mut guard = lock(&buf);
            guard.written.add(within, within + n);
            let before = guard.bytes.len();
            put_bytes(Arc::make_mut(&mut guard.bytes), within, &rest[..n]);
            self.hold((guard.bytes.len() - before) as u64);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.size.fetch_max(end, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.dirtied(now_ns);
        let dirty = self
            .dirty_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed)
            + data.len() as u64;
        // Past the limit, the flush waits for a write that ends a chunk, up to one chunk
        // more: a direct write of 1 MiB from a buffer that is not page-aligned comes as two
        // requests (the kernel's max_pages cuts the first a few bytes short), and a flush
        // between the two would store the chunk without its last bytes, and those later as
        // a slice of their own (one more object, and one more piece for every read).
        let sequential_limit = dirty > FILE_DIRTY_MAX_BYTES
            && (end.is_multiple_of(CHUNK_BYTES) || dirty > FILE_DIRTY_MAX_BYTES + CHUNK_BYTES);
        Ok(if sequential_limit || self.over_memory_limit() {
            Backpressure::FlushFile
        } else if self.budget.over_cap() {
            Backpressure::MountOverCap
        } else {
            Backpressure::None
        })
    }

    /// Whether the file's buffers hold more than a sequential writer's limit lets them
    /// (which stores its last chunk once it is whole: one more).
    fn over_memory_limit(&self) -> bool {
        self.held_bytes() > FILE_DIRTY_MAX_BYTES + CHUNK_BYTES
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file).
    /// Reads `len` bytes at `offset`. On a shared volume the caller passes `reload`, the
    /// store's current record of the file (see `read_stored`).
    pub fn read(
        &self,
        dp: &DataPath,
        offset: u64,
        len: u32,
        reload: Option<Reload<'_>>,
    ) -> Result<Vec<u8>, Errno> {
        let size = self.size();
        if offset >= size {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        if self.last_read_end.swap(end, Ordering::Relaxed) == offset {
            self.read_ahead(dp, end);
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK_BYTES;
            let within = (pos % CHUNK_BYTES) as usize;
            let n = ((end - pos) as usize).min(CHUNK_BYTES as usize - within);
            let dst = &mut out[(pos - offset) as usize..(pos - offset) as usize + n];
            let dirty = lock(&self.dirty).get(&idx).cloned();
            if let Some(buf) = dirty {
                copy_part(dst, &lock(&buf).bytes, within);
            } else {
                self.read_stored(dp, idx, within, dst, reload)?;
            }
            pos += n as u64;
        }
        Ok(out)
    }

    /// Prefetches the stored chunks after `from` that are not being rewritten.
    fn read_ahead(&self, dp: &DataPath, from: u64) {
        let first = from / CHUNK_BYTES;
        let wanted: Vec<(u64, BlockRef)> = {
            let c = read_lock(&self.committed);
            let stored: BTreeSet<u64> = c
                .chunks
                .range(first..first + READ_AHEAD_CHUNKS)
                .map(|(idx, _)| *idx)
                .chain(
                    c.slices
                        .range(first..first + READ_AHEAD_CHUNKS)
                        .map(|(idx, _)| *idx),
                )
                .collect();
            stored
                .into_iter()
                .flat_map(|idx| c.pieces(idx).into_iter().map(move |(_, _, b)| (idx, b)))
                .collect()
        };
        if wanted.is_empty() {
            return;
        }
        let dirty = lock(&self.dirty);
        let wanted = wanted
            .into_iter()
            .filter(|(idx, _)| !dirty.contains_key(idx))
            .map(|(_, block)| block)
            .collect();
        drop(dirty);
        dp.prefetch(wanted);
    }

    /// Commits the unflushed writes: new blocks for dirty chunks (or the inline bytes), made
    /// durable, then one metadata change referring to them (durable at the next sync; see
    /// ARCHITECTURE.md, "Durability"). Returns the blocks the change released (to delete from
    /// the block store once the change is durable).
    ///
    /// Writes wait for it only while it takes its snapshot and while it retires what it
    /// flushed, not across its block I/O and commit: the snapshot holds a reference to each
    /// dirty chunk's bytes, so a write meanwhile copies the chunk (`Arc::make_mut`) and the
    /// flush, seeing a different buffer afterwards, leaves that chunk dirty.
    pub fn flush(&self, dp: &DataPath, store: &dyn MetaStore) -> Result<Vec<u64>, Errno> {
        self.flush_with(dp, store, false)
            .map(|(released, _)| released)
    }

    /// `flush`, whose change, with `durable` (an fsync's), commits durably with everything
    /// committed before it: one commit where a flush and then a sync took two. Also whether
    /// such a commit happened (if not, an fsync still syncs).
    pub fn flush_with(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
        durable: bool,
    ) -> Result<(Vec<u64>, bool), Errno> {
        self.flush_dirty(dp, store, durable, false)
    }

    /// The flush of a write that passed [`FILE_DIRTY_MAX_BYTES`] (back-pressure): nothing,
    /// when a flush it waited for brought the file back under the limit. Writers to one
    /// file that all pass the limit while one flush runs then wait for that flush, rather
    /// than each flushing the chunk or two written meanwhile, one after another (a block
    /// put, its fsync and a commit each).
    pub fn flush_over_limit(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
    ) -> Result<Vec<u64>, Errno> {
        self.flush_dirty(dp, store, false, true)
            .map(|(released, _)| released)
    }

    fn flush_dirty(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
        durable: bool,
        only_over_limit: bool,
    ) -> Result<(Vec<u64>, bool), Errno> {
        let _flushing = lock(&self.flushing);
        if self.retired.load(Ordering::Relaxed)
            || (only_over_limit
                && self.dirty_bytes.load(Ordering::Relaxed) <= FILE_DIRTY_MAX_BYTES
                && !self.over_memory_limit())
        {
            return Ok((Vec::new(), false));
        }
        let snapshot_ns = monotonic_ns();
        let (dirty, writes, flushed_bytes, mtime, size, inline, stored_any) = {
            let _gate = write_lock(&self.gate);
            let Some(mtime) = self.dirty_mtime() else {
                return Ok((Vec::new(), false));
            };
            // Queued already, with nothing written since: the store commits it in order
            // (an fsync's sync waits for it and reports its failure).
            if self.early.covers(self.writes.load(Ordering::Relaxed)) {
                return Ok((Vec::new(), false));
            }
            self.early.forget();
            let c = read_lock(&self.committed);
            // Each dirty chunk with what the store holds of it: None, nothing; else how
            // many slices it has.
            let dirty: Vec<(u64, DirtyChunk, Option<usize>)> = lock(&self.dirty)
                .iter()
                .map(|(i, b)| {
                    let stored = c.holds(*i).then(|| c.slices.get(i).map_or(0, Vec::len));
                    (*i, lock(b).clone(), stored)
                })
                .collect();
            (
                dirty,
                self.writes.load(Ordering::Relaxed),
                self.dirty_bytes.load(Ordering::Relaxed),
                mtime,
                self.size(),
                c.inline.clone(),
                !c.chunks.is_empty() || !c.slices.is_empty(),
            )
        };
        let mut update = DataUpdate {
            ino: self.ino,
            size,
            mtime_ns: mtime,
            ctime_ns: mtime,
            durable,
            ..Default::default()
        };
        let mut uploaded = Vec::new();
        if !stored_any && size <= INLINE_MAX_BYTES {
            let mut content = match dirty.iter().find(|(i, ..)| *i == 0) {
                Some((_, chunk, _)) => chunk.bytes.to_vec(),
                None => inline.map(|b| b.to_vec()).unwrap_or_default(),
            };
            content.truncate(size as usize);
            update.inline = Some(content);
        } else {
            let mut pieces: Vec<(u64, Bytes, Span, Option<usize>)> = dirty
                .iter()
                .map(|(i, chunk, stored)| {
                    let bytes = Bytes::from_owner(SharedChunk(chunk.bytes.clone()));
                    (*i, bytes, chunk.written, *stored)
                })
                .collect();
            if let Some(inline) = inline
                && !dirty.iter().any(|(i, ..)| *i == 0)
            {
                // The inline bytes become chunk 0's block.
                pieces.push((0, inline, DirtyChunk::default().written, None));
            }
            let mut puts = Vec::new();
            for (idx, bytes, written, stored) in pieces {
                let start = idx * CHUNK_BYTES;
                if start >= size {
                    continue;
                }
                let in_file = (size - start).min(CHUNK_BYTES) as usize;
                let bytes = bytes.slice(..bytes.len().min(in_file));
                // (Past the buffer's end the chunk reads as zeros: a span written there is
                // zeros that a flush must store too.)
                let changed = (written.lo, written.hi.min(in_file));
                if changed.0 >= changed.1 && stored.is_some() {
                    // Nothing within the file changed since it was read from the store.
                    continue;
                }
                // A change over all the chunk holds (a punch to its end) goes the whole-chunk
                // way, where zeros become a hole that frees the block.
                let covers_all = changed.0 == 0 && changed.1 >= bytes.len();
                if let Some(slices) = stored
                    && !covers_all
                    && slices < SLICES_PER_CHUNK_MAX
                    && changed.1 - changed.0 <= SLICE_MAX_BYTES
                {
                    // Only what changed, laid over what the store holds.
                    let piece = if changed.1 <= bytes.len() {
                        bytes.slice(changed.0..changed.1)
                    } else {
                        let mut padded = bytes[changed.0.min(bytes.len())..].to_vec();
                        padded.resize(changed.1 - changed.0, 0);
                        Bytes::from(padded)
                    };
                    let block = dp.new_block_id();
                    update.slices.push(SliceRec {
                        idx,
                        pos: changed.0 as u64,
                        len: piece.len() as u64,
                        block,
                        crc: checksum(&piece),
                    });
                    puts.push((block, piece));
                    uploaded.push(block);
                    continue;
                }
                // The whole chunk as a new block (dropping any slices: compaction).
                stage_whole_chunk(dp, idx, bytes, &mut update, &mut puts, &mut uploaded);
            }
            self.store_blocks(dp, puts, &uploaded)?;
        }
        let (applied, released) = self.commit_data(dp, store, update, &uploaded)?;
        let _gate = write_lock(&self.gate);
        write_lock(&self.committed).apply(applied);
        // Retire the chunks no write touched since the snapshot; the others stay dirty.
        {
            let mut map = lock(&self.dirty);
            let mut retired = 0;
            for (idx, chunk, _) in &dirty {
                if map
                    .get(idx)
                    .is_some_and(|buf| Arc::ptr_eq(&lock(buf).bytes, &chunk.bytes))
                {
                    map.remove(idx);
                    retired += chunk.bytes.len() as u64;
                }
            }
            self.unhold(retired);
        }
        self.dirty_bytes.fetch_sub(flushed_bytes, Ordering::Relaxed);
        if self.writes.load(Ordering::Relaxed) == writes {
            self.clean();
        } else {
            // Written during the flush: due for the writeback as of the flush's snapshot.
            self.dirty_since_ns.store(snapshot_ns, Ordering::Relaxed);
        }
        for b in &released {
            dp.forget_cached(*b);
        }
        Ok((released, durable))
    }

    /// Writes new blocks and makes them durable, before the commit that refers to them:
    /// SQLite's WAL may reach the disk at any time after (the kernel's writeback, a
    /// checkpoint, the next sync's fsync), and a row must never outlive its block. On failure
    /// they are discarded.
    fn store_blocks(
        &self,
        dp: &DataPath,
        puts: Vec<(u64, Bytes)>,
        uploaded: &[u64],
    ) -> Result<(), Errno> {
        let stored = dp
            .put_blocks(puts)
            .map_err(|e| ("writing", e))
            .and_then(|()| dp.blocks.sync(uploaded).map_err(|e| ("syncing", e)));
        stored.map_err(|(what, e)| {
            tracing::error!("volume: {what} blocks of inode {}: {e}", self.ino);
            self.discard(dp, uploaded);
            e.raw_os_error().unwrap_or(libc::EIO)
        })
    }

    /// Commits `update`, whose new blocks are `uploaded` (deleted if the commit fails): what
    /// the committed view applies, and the blocks the commit released.
    fn commit_data(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
        update: DataUpdate,
        uploaded: &[u64],
    ) -> Result<(DataUpdate, Vec<u64>), Errno> {
        let applied = update.clone();
        match meta::wait(|done| store.update_data(update, done)) {
            Ok(released) => Ok((applied, released)),
            Err(e) => {
                self.discard_unreferenced(dp, store, uploaded);
                Err(e)
            }
        }
    }

    /// Whether a stored chunk has at least `slices` slices (and nothing unflushed over it).
    pub fn fragmented(&self, slices: usize) -> bool {
        let c = read_lock(&self.committed);
        let dirty = lock(&self.dirty);
        c.slices
            .iter()
            .any(|(idx, s)| s.len() >= slices && !dirty.contains_key(idx))
    }

    /// Background compaction: each stored chunk with at least `slices` slices and nothing
    /// unflushed over it is stored again as one block, its base and slices released; the
    /// file's bytes, size and times stay as they are. A write meanwhile makes its own dirty
    /// chunk from what it reads then (the same bytes either way), and its flush waits for
    /// this one (`flushing`). Returns the released blocks.
    pub fn compact(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
        slices: usize,
    ) -> Result<Vec<u64>, Errno> {
        let _flushing = lock(&self.flushing);
        let wanted: Vec<u64> = {
            let c = read_lock(&self.committed);
            let dirty = lock(&self.dirty);
            c.slices
                .iter()
                .filter(|(idx, s)| s.len() >= slices && !dirty.contains_key(idx))
                .map(|(idx, _)| *idx)
                .collect()
        };
        let size = self.size();
        let mut update = DataUpdate {
            ino: self.ino,
            size,
            keep_times: true,
            ..Default::default()
        };
        let (mut puts, mut uploaded) = (Vec::new(), Vec::new());
        for idx in wanted {
            let start = idx * CHUNK_BYTES;
            if start >= size {
                continue;
            }
            let mut bytes = self.base(dp, idx)?;
            bytes.truncate((size - start).min(CHUNK_BYTES) as usize);
            let bytes = Bytes::from(bytes);
            stage_whole_chunk(dp, idx, bytes, &mut update, &mut puts, &mut uploaded);
        }
        if update.set.is_empty() && update.holes.is_empty() {
            return Ok(Vec::new());
        }
        self.store_blocks(dp, puts, &uploaded)?;
        let (applied, released) = self.commit_data(dp, store, update, &uploaded)?;
        // (A file with slices has no inline bytes: the update's none leaves it so.)
        let _gate = write_lock(&self.gate);
        write_lock(&self.committed).apply(applied);
        for b in &released {
            dp.forget_cached(*b);
        }
        Ok(released)
    }

    /// Queues the commit of a small file's bytes (inline: no block to write) through `queue`
    /// without waiting for it, for a close that need not wait (see `dirops`); false when the
    /// file is not such a file (the caller flushes as usual). Its bytes stay dirty here: a
    /// later flush with no write since does nothing, and commits them again if this commit
    /// failed.
    pub fn flush_early(&self, queue: QueueEarly<'_>) -> bool {
        let _flushing = lock(&self.flushing);
        let _gate = write_lock(&self.gate);
        let Some(mtime) = self.dirty_mtime() else {
            return true;
        };
        let writes = self.writes.load(Ordering::Relaxed);
        if self.early.covers(writes) {
            return true;
        }
        let size = self.size();
        let content = {
            let c = read_lock(&self.committed);
            if !c.chunks.is_empty() || !c.slices.is_empty() || size > INLINE_MAX_BYTES {
                return false;
            }
            let dirty = lock(&self.dirty);
            let mut content = match dirty.get(&0) {
                Some(buf) => lock(buf).bytes.to_vec(),
                None => c.inline.as_ref().map(|b| b.to_vec()).unwrap_or_default(),
            };
            content.truncate(size as usize);
            content
        };
        let update = InlineUpdate {
            ino: self.ino,
            size,
            mtime_ns: mtime,
            ctime_ns: mtime,
            bytes: content,
        };
        let number = self.early.queued.fetch_add(1, Ordering::AcqRel) + 1;
        self.early.failed.store(false, Ordering::Release);
        self.early.writes.store(writes, Ordering::Release);
        let early = self.early.clone();
        queue(
            update,
            Box::new(move |outcome| match outcome {
                Ok(()) => _ = early.finished.fetch_max(number, Ordering::AcqRel),
                Err(_) => early.failed.store(true, Ordering::Release),
            }),
        );
        true
    }

    /// Blocks written for a change whose commit failed. The store answers EIO also when
    /// the connection was lost at COMMIT, whose outcome is unknown (PostgreSQL may have
    /// committed the rows that refer to them): only the blocks no row refers to are
    /// discarded, and when that cannot be read, none (gc deletes them later).
    fn discard_unreferenced(&self, dp: &DataPath, store: &dyn MetaStore, uploaded: &[u64]) {
        let (Some(&lo), Some(&hi)) = (uploaded.iter().min(), uploaded.iter().max()) else {
            return;
        };
        match store.blocks_between(lo, hi + 1) {
            Ok(referenced) => {
                let referenced: HashSet<u64> = referenced.into_iter().collect();
                let unreferenced: Vec<u64> = uploaded
                    .iter()
                    .copied()
                    .filter(|b| !referenced.contains(b))
                    .collect();
                self.discard(dp, &unreferenced);
            }
            Err(e) => tracing::warn!(
                "volume: the blocks of inode {} whose commit failed are left for gc (errno {e} reading whether a row refers to them)",
                self.ino
            ),
        }
    }

    /// Blocks written for a change that did not commit: nothing refers to them.
    fn discard(&self, dp: &DataPath, blocks: &[u64]) {
        if !blocks.is_empty() {
            dp.blocks.discard(blocks.to_vec());
        }
    }

    /// Zeros [start, end) within the size, in memory (a flush turns it into holes), at a cost
    /// in time and memory proportional to the chunks that hold data there, not to the range
    /// (a punch of 1 TiB over a sparse file touches a few chunks): the partial chunks at the
    /// two ends are zeroed in their buffers, and every whole chunk in between that holds
    /// data (stored or unflushed) gets an empty buffer, which reads as zeros.
    fn zero_range(&self, dp: &DataPath, start: u64, end: u64, now_ns: i64) -> Result<(), Errno> {
        let _flushing = lock(&self.flushing);
        let _gate = write_lock(&self.gate);
        self.early.forget();
        let end = end.min(self.size());
        if start >= end {
            return Ok(());
        }
        let first_whole = start.div_ceil(CHUNK_BYTES);
        let end_whole = end / CHUNK_BYTES;
        // The partial chunks: at most two, each zeroed within its buffer (past a buffer's
        // end is zeros already).
        let mut edges = vec![(start, end.min(first_whole * CHUNK_BYTES))];
        if end_whole >= first_whole {
            edges.push(((end_whole * CHUNK_BYTES).max(start), end));
        }
        for (from, to) in edges {
            if from >= to {
                continue;
            }
            let idx = from / CHUNK_BYTES;
            let within = (from % CHUNK_BYTES) as usize;
            let buf = self.chunk_buf(dp, idx, false)?;
            let mut guard = lock(&buf);
            let stop = guard.bytes.len().min(within + (to - from) as usize);
            if within < stop {
                guard.written.add(within, stop);
                Arc::make_mut(&mut guard.bytes)[within..stop].fill(0);
            }
        }
        if first_whole < end_whole {
            let holding: Vec<u64> = {
                let c = read_lock(&self.committed);
                let inline = c.inline.is_some() && first_whole == 0;
                inline
                    .then_some(0)
                    .into_iter()
                    .chain(c.chunks.range(first_whole..end_whole).map(|(i, _)| *i))
                    .chain(c.slices.range(first_whole..end_whole).map(|(i, _)| *i))
                    .collect()
            };
            let mut dirty = lock(&self.dirty);
            for buf in dirty.range(first_whole..end_whole).map(|(_, b)| b) {
                let mut chunk = lock(buf);
                self.unhold(chunk.bytes.len() as u64);
                *chunk = DirtyChunk::default();
            }
            for idx in holding {
                dirty.entry(idx).or_default();
            }
        }
        self.dirtied(now_ns);
        Ok(())
    }

    /// fallocate: `zero` writes zeros over [offset, offset+len) (within the size when
    /// `keep_size`); without `keep_size` the size grows to cover the range. Nothing is
    /// preallocated: blocks are written at flush, and all-zero chunks become holes.
    pub fn fallocate(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
        range: Fallocate,
        now_ns: i64,
    ) -> Result<(), Errno> {
        let Fallocate {
            offset,
            len,
            zero,
            keep_size,
        } = range;
        let end = offset.checked_add(len).ok_or(libc::EFBIG)?;
        if end > MAX_FILE_BYTES {
            return Err(libc::EFBIG);
        }
        if zero {
            self.zero_range(dp, offset, end, now_ns)?;
        }
        if !keep_size && end > self.size() {
            // Growing by truncate keeps the new range a hole.
            self.truncate(dp, store, end, now_ns)?;
        }
        Ok(())
    }

    /// Sets the size; bytes past it are gone (a later extension reads zeros).
    pub fn truncate(
        &self,
        dp: &DataPath,
        store: &dyn MetaStore,
        size: u64,
        now_ns: i64,
    ) -> Result<Vec<u64>, Errno> {
        let _flushing = lock(&self.flushing);
        let _gate = write_lock(&self.gate);
        self.early.forget();
        let rem = size % CHUNK_BYTES;
        let keep = size.div_ceil(CHUNK_BYTES);
        let (inline, trim) = {
            let c = read_lock(&self.committed);
            let inline = c
                .inline
                .as_ref()
                .map(|b| b[..(b.len() as u64).min(size) as usize].to_vec());
            // Sent whether or not this mount knows of a longer chunk there (another mount may
            // have stored one since); it only ever shortens one.
            let trim = (rem != 0 && inline.is_none()).then_some((size / CHUNK_BYTES, rem));
            (inline, trim)
        };
        let update = DataUpdate {
            ino: self.ino,
            size,
            mtime_ns: now_ns,
            ctime_ns: now_ns,
            inline,
            drop_from: Some(keep),
            trim,
            ..Default::default()
        };
        let applied = update.clone();
        let released = meta::wait(|done| store.update_data(update, done))?;
        write_lock(&self.committed).apply(applied);
        // The unflushed bytes past the new size go only once the store agreed (the gate,
        // held throughout, keeps anyone from seeing the two disagree): a failed truncate
        // leaves them as they were, and with them the file its old size.
        {
            let mut dirty = lock(&self.dirty);
            let mut dropped = 0;
            dirty.retain(|idx, buf| {
                if *idx >= keep {
                    dropped += lock(buf).bytes.len() as u64;
                }
                *idx < keep
            });
            self.unhold(dropped);
            if rem != 0
                && let Some(buf) = dirty.get(&(size / CHUNK_BYTES))
            {
                let mut chunk = lock(buf);
                self.unhold((chunk.bytes.len() as u64).saturating_sub(rem));
                Arc::make_mut(&mut chunk.bytes).truncate(rem as usize);
                chunk.written.hi = chunk.written.hi.min(rem as usize);
            }
        }
        self.size.store(size, Ordering::Relaxed);
        for b in &released {
            dp.forget_cached(*b);
        }
        Ok(released)
    }

    /// Where data is: sorted, merged [start, end) ranges. A stored chunk is data up to its
    /// length; in bytes we hold (inline, unflushed) zero pages count as holes.
    fn data_ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let dirty: Vec<(u64, ChunkBuf)> = lock(&self.dirty)
            .iter()
            .map(|(i, b)| (*i, b.clone()))
            .collect();
        {
            let c = read_lock(&self.committed);
            if let Some(inline) = &c.inline
                && !dirty.iter().any(|(i, _)| *i == 0)
            {
                nonzero_pages(inline, 0, &mut ranges);
            }
            let stored: BTreeSet<u64> = c.chunks.keys().chain(c.slices.keys()).copied().collect();
            for idx in stored {
                if dirty.iter().any(|(i, _)| *i == idx) {
                    continue;
                }
                let start = idx * CHUNK_BYTES;
                ranges.push((start, start + c.extent(idx)));
            }
        }
        for (idx, buf) in dirty {
            nonzero_pages(&lock(&buf).bytes, idx * CHUNK_BYTES, &mut ranges);
        }
        ranges.retain(|(s, e)| e > s);
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }

    /// SEEK_DATA / SEEK_HOLE from `offset`; never waits on the write gate.
    pub fn seek(&self, offset: u64, whence: i32) -> Result<u64, Errno> {
        let size = self.size();
        if offset >= size {
            return Err(libc::ENXIO);
        }
        let ranges = self.data_ranges();
        match whence {
            libc::SEEK_DATA => ranges
                .iter()
                .find(|(_, e)| *e > offset)
                .map(|(s, _)| (*s).max(offset))
                .filter(|p| *p < size)
                .ok_or(libc::ENXIO),
            libc::SEEK_HOLE => {
                let mut pos = offset;
                for (s, e) in &ranges {
                    if *s <= pos && pos < *e {
                        pos = *e;
                    }
                }
                Ok(pos.min(size))
            }
            _ => Err(libc::EINVAL),
        }
    }
}

/// What a fallocate asks for.
#[derive(Debug, Clone, Copy)]
pub struct Fallocate {
    pub offset: u64,
    pub len: u64,
    /// Zero the range (PUNCH_HOLE, ZERO_RANGE).
    pub zero: bool,
    /// Leave the size as it is (KEEP_SIZE).
    pub keep_size: bool,
}

enum Gate<'a> {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] std::sync::RwLockWriteGuard<'a, ()>),
}

/// Adds the ranges of `bytes` (at file offset `base`) that are not all-zero pages.
fn nonzero_pages(bytes: &[u8], base: u64, ranges: &mut Vec<(u64, u64)>) {
    for (i, page) in bytes.chunks(HOLE_GRAIN_BYTES).enumerate() {
        if page.iter().any(|b| *b != 0) {
            let start = base + (i * HOLE_GRAIN_BYTES) as u64;
            ranges.push((start, start + page.len() as u64));
        }
    }
}

/// Copies `src[within..]` into `dst` as far as it goes; the rest of `dst` stays zero.
fn copy_part(dst: &mut [u8], src: &[u8], within: usize) {
    if within < src.len() {
        let n = dst.len().min(src.len() - within);
        dst[..n].copy_from_slice(&src[within..within + n]);
    }
}

/// Puts `src` at `within` in a chunk's bytes, growing them as needed: zeros only in a gap
/// before `within`, never under what is copied (a whole new chunk is one copy, not a fill
/// and a copy).
fn put_bytes(buf: &mut Vec<u8>, within: usize, src: &[u8]) {
    if buf.len() < within {
        buf.resize(within, 0);
    }
    let over = (buf.len() - within).min(src.len());
    buf[within..within + over].copy_from_slice(&src[..over]);
    buf.extend_from_slice(&src[over..]);
}

/// Stages chunk `idx`'s whole content `bytes` for a flush or a compaction: a new block (in
/// `update.set`, `puts` and `uploaded`), or a hole when it is all zeros, whether or not this
/// mount knows of a chunk there (on a shared volume another mount may have stored one since
/// this one read the file).
fn stage_whole_chunk(
    dp: &DataPath,
    idx: u64,
    bytes: Bytes,
    update: &mut DataUpdate,
    puts: &mut Vec<(u64, Bytes)>,
    uploaded: &mut Vec<u64>,
) {
    if bytes.iter().all(|b| *b == 0) {
        update.holes.push(idx);
        return;
    }
    let block = dp.new_block_id();
    update.set.push(ChunkRec {
        idx,
        block,
        len: bytes.len() as u64,
        crc: checksum(&bytes),
    });
    puts.push((block, bytes));
    uploaded.push(block);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{InodeRec, NewNode, ROOT_INO, wait};
    use crate::volume;

    /// A formatted volume in a temp dir, opened as a mount would (real SQLite, real blocks).
    struct Fixture {
        dir: std::path::PathBuf,
        store: Arc<crate::sqlite::SqliteStore>,
        data: DataPath,
    }

    impl Fixture {
        fn new(tag: &str) -> Fixture {
            Fixture::with_dirty_max(tag, None)
        }

        /// With the mount's unflushed writes capped at `dirty_max` bytes.
        fn with_dirty_max(tag: &str, dirty_max: Option<u64>) -> Fixture {
            let dir =
                std::env::temp_dir().join(format!("lanefs-unit-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let db = dir.join("v.db");
            volume::format(&db, &dir.join("data"), false).unwrap();
            let (_, settings) = volume::check(&db, true).unwrap();
            let blocks = volume::open_blocks(&db, &settings).unwrap();
            let store =
                Arc::new(crate::sqlite::SqliteStore::open(&db, "test", "/none", 1).unwrap());
            let data = DataPath::new(blocks, store.session, true, dirty_max);
            Fixture { dir, store, data }
        }

        fn new_file(&self, name: &str) -> FileState {
            let rec: InodeRec = wait(|done| {
                self.store.create(
                    NewNode {
                        ino: None,
                        parent: ROOT_INO,
                        name: name.as_bytes().to_vec(),
                        mode: libc::S_IFREG | 0o644,
                        uid: 0,
                        gid: 0,
                        rdev: 0,
                        target: None,
                        now_ns: 1,
                        lease_expires_ns: None,
                        unleased_at_ns: None,
                        xattrs: Vec::new(),
                        inherit: None,
                    },
                    done,
                )
            })
            .unwrap();
            let state = FileState::new(rec.ino, self.data.dirty.clone());
            state.load(|| self.store.load_file(0, rec.ino)).unwrap();
            state
        }

        /// The file as a fresh open would see it.
        fn reopen(&self, ino: u64) -> FileState {
            let state = FileState::new(ino, self.data.dirty.clone());
            state.load(|| self.store.load_file(0, ino)).unwrap();
            state
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.store.close();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn writes_across_chunks_read_back_before_and_after_flush() {
        let f = Fixture::new("chunks");
        let file = f.new_file("a");
        let data = pattern(3 * CHUNK_BYTES as usize + 100, 1);
        file.write(&f.data, 10, &data, true, 5).unwrap();
        let expect = |state: &FileState| {
            let got = state
                .read(&f.data, 0, data.len() as u32 + 50, None)
                .unwrap();
            assert_eq!(got.len(), data.len() + 10);
            assert!(got[..10].iter().all(|b| *b == 0));
            assert!(got[10..] == data[..]);
        };
        expect(&file);
        file.flush(&f.data, &*f.store).unwrap();
        expect(&file);
        expect(&f.reopen(file.ino));
        // A small overwrite in the middle is stored as a slice of its chunk: no block goes.
        file.write(&f.data, CHUNK_BYTES + 7, b"xyz", true, 6)
            .unwrap();
        let released = file.flush(&f.data, &*f.store).unwrap();
        assert_eq!(released.len(), 0);
        let got = f
            .reopen(file.ino)
            .read(&f.data, CHUNK_BYTES + 7, 3, None)
            .unwrap();
        assert_eq!(got, b"xyz");
    }

    /// A small rewrite of a stored chunk is stored as a slice (no block released), laid over
    /// the chunk in order, also past the base's end; the file reads as written before and
    /// after a reopen; the flush that would make `SLICES_PER_CHUNK_MAX` + 1 rewrites the
    /// chunk's block instead and releases the old one and every slice (compaction); a large
    /// rewrite is a new block at once; a truncate drops slices past it and shortens the one
    /// across it, and an extension after it reads zeros; SEEK_DATA and SEEK_HOLE see slices.
    #[test]
    fn small_rewrites_of_stored_chunks_are_slices_until_compacted() {
        let f = Fixture::new("slices");
        let file = f.new_file("s");
        let mut model = pattern(CHUNK_BYTES as usize + 300_000, 3);
        file.write(&f.data, 0, &model, true, 1).unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        let slices_of = |idx: u64| {
            f.store
                .load_file(0, file.ino)
                .unwrap()
                .slices
                .iter()
                .filter(|s| s.idx == idx)
                .count()
        };
        let check = |model: &[u8], what: &str| {
            for state in [&file, &f.reopen(file.ino)] {
                assert_eq!(state.size(), model.len() as u64, "{what}");
                let got = state
                    .read(&f.data, 0, model.len() as u32 + 10, None)
                    .unwrap();
                assert!(got == model, "{what}: bytes differ");
                // Unaligned reads across slice edges.
                let got = state.read(&f.data, 36_990, 5000, None).unwrap();
                assert!(got[..] == model[36_990..41_990], "{what}: a partial read");
            }
        };
        let write = |model: &mut Vec<u8>, at: usize, bytes: &[u8], t: i64| {
            file.write(&f.data, at as u64, bytes, true, t).unwrap();
            if model.len() < at + bytes.len() {
                model.resize(at + bytes.len(), 0);
            }
            model[at..at + bytes.len()].copy_from_slice(bytes);
            file.flush(&f.data, &*f.store).unwrap()
        };
        for i in 0..SLICES_PER_CHUNK_MAX {
            let at = i * 37_000 + 5;
            let released = write(&mut model, at, &pattern(4096 + i, i as u8), 2 + i as i64);
            assert!(released.is_empty(), "slice {i} released {released:?}");
            check(&model, &format!("after slice {i}"));
        }
        assert_eq!(slices_of(0), SLICES_PER_CHUNK_MAX);
        // Compaction: one more rewrites the block and drops the slices.
        let released = write(&mut model, 900_000, b"compacted", 100);
        assert_eq!(released.len(), SLICES_PER_CHUNK_MAX + 1);
        assert_eq!(slices_of(0), 0);
        check(&model, "after compaction");
        // An append past chunk 1's base, and a rewrite across its end.
        let end = model.len();
        assert!(write(&mut model, end, &pattern(8192, 40), 101).is_empty());
        assert!(write(&mut model, end - 100, &pattern(300, 41), 102).is_empty());
        assert_eq!(slices_of(1), 2);
        check(&model, "after appends");
        // A rewrite larger than a slice may be is a new block.
        let released = write(&mut model, 10, &pattern(SLICE_MAX_BYTES + 1, 42), 103);
        assert_eq!(released.len(), 1);
        check(&model, "after a large rewrite");
        // Truncate into chunk 1's second slice: the first (past the cut) goes, the second
        // is shortened.
        let cut = end - 50;
        let released = file.truncate(&f.data, &*f.store, cut as u64, 104).unwrap();
        assert_eq!(released.len(), 1, "the slice past the cut");
        assert_eq!(slices_of(1), 1);
        model.truncate(cut);
        check(&model, "after truncate");
        assert!(write(&mut model, cut + 1000, b"past", 105).is_empty());
        check(&model, "after extending past the cut");
        let reopened = f.reopen(file.ino);
        assert_eq!(
            reopened.seek(CHUNK_BYTES, libc::SEEK_HOLE).unwrap(),
            model.len() as u64
        );
        assert_eq!(reopened.seek(5, libc::SEEK_DATA).unwrap(), 5);
    }

    /// Every file under `dir`, recursively.
    fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files_under(&path, out);
            } else {
                out.push(path);
            }
        }
    }

    /// A released block's file is kept under a fresh id of the session and the next put
    /// writes over it (same inode, its new length, the spare's name gone); spares are
    /// deleted by `drop_spares`, and the store then lists only live blocks.
    #[test]
    fn a_released_blocks_file_is_written_over_by_the_next_put() {
        use std::os::unix::fs::MetadataExt;
        let f = Fixture::new("spares");
        let dp = &f.data;
        let path = |id: u64| {
            let mut all = Vec::new();
            files_under(&f.dir.join("data").join("blocks"), &mut all);
            all.into_iter()
                .find(|p| p.file_name().unwrap().to_string_lossy() == format!("{id:016x}"))
        };
        let (old, new) = (dp.new_block_id(), dp.new_block_id());
        dp.put_blocks(vec![(old, Bytes::from(pattern(CHUNK_BYTES as usize, 1)))])
            .unwrap();
        let inode = std::fs::metadata(path(old).unwrap()).unwrap().ino();
        dp.release_block(old).unwrap();
        assert!(path(old).is_none(), "the released block's name is gone");
        let spare = *lock(&dp.spares).first().expect("kept as a spare");
        assert_eq!(spare >> BLOCK_ID_SESSION_SHIFT, f.store.session);
        assert_eq!(
            std::fs::metadata(path(spare).unwrap()).unwrap().ino(),
            inode
        );

        let shorter = pattern(5000, 2);
        dp.put_blocks(vec![(new, Bytes::from(shorter.clone()))])
            .unwrap();
        let written = path(new).unwrap();
        assert_eq!(std::fs::metadata(&written).unwrap().ino(), inode);
        assert_eq!(std::fs::read(&written).unwrap(), shorter);
        assert!(path(spare).is_none() && lock(&dp.spares).is_empty());
        assert_eq!(dp.counters()[0], ("blocks_written_over", 1));
        assert_eq!(dp.blocks.get(new).unwrap(), shorter);

        dp.release_block(new).unwrap();
        dp.release_block(new).unwrap();
        assert_eq!(
            lock(&dp.spares).len(),
            1,
            "a block already gone is no error"
        );
        dp.drop_spares();
        assert_eq!(dp.blocks.list(None).unwrap(), Vec::<u64>::new());
    }

    /// The local block store, each block read starting 5 ms late: the time for a flush to
    /// replace the block and the old one to be given up between a read's look at the
    /// committed view and its fetch.
    struct LateReads(Arc<dyn BlockStore>);

    impl BlockStore for LateReads {
        fn put(&self, blocks: Vec<(u64, Bytes)>, spares: Vec<u64>) -> std::io::Result<()> {
            self.0.put(blocks, spares)
        }
        fn keep_as_spare(&self, id: u64, spare: u64) -> std::io::Result<bool> {
            self.0.keep_as_spare(id, spare)
        }
        fn get(&self, id: u64) -> std::io::Result<Bytes> {
            std::thread::sleep(std::time::Duration::from_millis(5));
            self.0.get(id)
        }
        fn delete(&self, id: u64) -> std::io::Result<()> {
            self.0.delete(id)
        }
        fn discard(&self, ids: Vec<u64>) {
            self.0.discard(ids)
        }
        fn prefetch(&self, id: u64, done: Box<dyn FnOnce(std::io::Result<Bytes>) + Send>) {
            self.0.prefetch(id, done)
        }
        fn list(&self, session: Option<u64>) -> std::io::Result<Vec<u64>> {
            self.0.list(session)
        }
        fn sync(&self, ids: &[u64]) -> std::io::Result<()> {
            self.0.sync(ids)
        }
        fn get_volume_id(&self) -> std::io::Result<Option<String>> {
            self.0.get_volume_id()
        }
        fn put_volume_id(&self, id: &str) -> std::io::Result<()> {
            self.0.put_volume_id(id)
        }
    }

    /// Reads of a stored chunk while flushes replace its block and the old blocks are given
    /// up at once (kept as spares and written over by the next flush, as the reaper does),
    /// each read's fetch late enough to miss the block it looked up: every read succeeds and
    /// returns one version whole.
    #[test]
    fn reads_racing_flushes_that_replace_their_blocks_see_whole_versions() {
        let f = Fixture::new("read-race");
        let data = DataPath::new(
            Arc::new(LateReads(f.data.blocks.clone())),
            f.store.session,
            true,
            None,
        );
        let file = f.new_file("r");
        let version = |i: u8| vec![i; CHUNK_BYTES as usize];
        let store_version = |i: u8| {
            file.write(&data, 0, &version(i), true, i as i64).unwrap();
            for b in file.flush(&data, &*f.store).unwrap() {
                data.release_block(b).unwrap();
            }
        };
        store_version(1);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut reads = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let got = file
                                .read(&data, 0, CHUNK_BYTES as u32, None)
                                .expect("a read racing a flush");
                            assert!(got.iter().all(|b| *b == got[0]), "a torn read");
                            reads += 1;
                        }
                        reads
                    })
                })
                .collect();
            for i in 2..=100 {
                store_version(i);
            }
            stop.store(true, Ordering::Relaxed);
            for reader in readers {
                assert!(reader.join().unwrap() > 0);
            }
        });
        assert!(data.counters()[0].1 > 90, "{:?}", data.counters());
    }

    /// A flush that is not an fsync (close, the dirty limit, before a setattr) still writes
    /// its blocks to the disk before committing the rows that refer to them: the WAL may
    /// reach the disk before any later fsync, and a row must never outlive its block.
    #[test]
    fn every_flush_makes_its_blocks_durable_before_committing_them() {
        let f = Fixture::new("durable");
        let file = f.new_file("d");
        file.write(
            &f.data,
            0,
            &pattern(3 * CHUNK_BYTES as usize + 5, 7),
            true,
            1,
        )
        .unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        let names: Vec<String> = f
            .store
            .load_file(0, file.ino)
            .unwrap()
            .chunks
            .iter()
            .map(|c| format!("{:016x}", c.block))
            .collect();
        assert_eq!(names.len(), 4);
        let mut blocks = Vec::new();
        files_under(&f.dir.join("data").join("blocks"), &mut blocks);
        for name in names {
            let path = blocks
                .iter()
                .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == name))
                .unwrap_or_else(|| panic!("block {name} is not in the data directory"));
            assert_eq!(
                crate::testing::unwritten_pages(path),
                0,
                "block {name} was committed while its bytes were only in the page cache"
            );
        }
    }

    /// Background compaction stores a chunk's base and slices as one block again: the same
    /// bytes (also after a reopen), its size and times unchanged, the old blocks released;
    /// a chunk with fewer slices than asked for is left alone.
    #[test]
    fn compaction_stores_a_fragmented_chunk_as_one_block_keeping_its_times() {
        let f = Fixture::new("compact");
        let file = f.new_file("c");
        let mut model = pattern(CHUNK_BYTES as usize + 5000, 8);
        file.write(&f.data, 0, &model, true, 1).unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        for i in 0..6 {
            let at = i * 50_000 + 7;
            let bytes = pattern(100, 20 + i as u8);
            file.write(&f.data, at as u64, &bytes, true, 2 + i as i64)
                .unwrap();
            model[at..at + 100].copy_from_slice(&bytes);
            file.flush(&f.data, &*f.store).unwrap();
        }
        // Chunk 1: two slices, fewer than asked for.
        for i in 0..2 {
            let at = CHUNK_BYTES as usize + 10 + i * 100;
            file.write(&f.data, at as u64, b"kept", true, 9).unwrap();
            model[at..at + 4].copy_from_slice(b"kept");
            file.flush(&f.data, &*f.store).unwrap();
        }
        let before = f.store.getattr(0, file.ino).unwrap();
        assert!(file.fragmented(4));
        let released = file.compact(&f.data, &*f.store, 4).unwrap();
        assert_eq!(released.len(), 7, "chunk 0's base and its six slices");
        assert!(!file.fragmented(4));
        let rec = f.store.load_file(0, file.ino).unwrap();
        assert_eq!(rec.slices.iter().filter(|s| s.idx == 0).count(), 0);
        assert_eq!(rec.slices.iter().filter(|s| s.idx == 1).count(), 2);
        let after = f.store.getattr(0, file.ino).unwrap();
        assert_eq!(
            (after.size, after.mtime_ns, after.ctime_ns),
            (before.size, before.mtime_ns, before.ctime_ns)
        );
        for state in [&file, &f.reopen(file.ino)] {
            let got = state.read(&f.data, 0, model.len() as u32, None).unwrap();
            assert!(got == model, "bytes differ after compaction");
        }
    }

    /// A punch over the whole stored part of a chunk (to the end of the file) frees its
    /// block and leaves a hole, as before slices: not a slice of zeros over it.
    #[test]
    fn punching_to_the_end_of_a_stored_chunk_makes_a_hole() {
        let f = Fixture::new("punch-end");
        let file = f.new_file("p");
        let len = CHUNK_BYTES + 100 * 1024;
        file.write(&f.data, 0, &pattern(len as usize, 4), true, 1)
            .unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        let punch = Fallocate {
            offset: CHUNK_BYTES,
            len: len - CHUNK_BYTES,
            zero: true,
            keep_size: true,
        };
        file.fallocate(&f.data, &*f.store, punch, 2).unwrap();
        let released = file.flush(&f.data, &*f.store).unwrap();
        assert_eq!(released.len(), 1, "chunk 1's block");
        let rec = f.store.load_file(0, file.ino).unwrap();
        assert!(rec.slices.is_empty(), "{:?}", rec.slices);
        assert_eq!(rec.chunks.len(), 1);
        let again = f.reopen(file.ino);
        assert_eq!(again.size(), len);
        assert_eq!(again.seek(CHUNK_BYTES, libc::SEEK_DATA), Err(libc::ENXIO));
        assert!(
            again
                .read(&f.data, CHUNK_BYTES, 4096, None)
                .unwrap()
                .iter()
                .all(|b| *b == 0)
        );
    }

    /// A punch of 1 TiB over a sparse file costs what the chunks holding data there cost,
    /// not the range: the old code made a zeroed 1 MiB buffer per chunk of the range.
    #[test]
    fn punching_a_terabyte_touches_only_the_chunks_that_hold_data() {
        const TIB: u64 = 1 << 40;
        let f = Fixture::new("punch");
        let file = f.new_file("sparse");
        file.truncate(&f.data, &*f.store, 2 * TIB, 1).unwrap();
        let spots = [0, 7 * CHUNK_BYTES + 3, TIB / 2, TIB - 10, TIB + 5];
        for (i, at) in spots.iter().enumerate() {
            file.write(&f.data, *at, &pattern(20, i as u8 + 1), true, 2)
                .unwrap();
        }
        file.flush(&f.data, &*f.store).unwrap();
        // One more unflushed write inside the range.
        file.write(&f.data, 3 * CHUNK_BYTES, &pattern(10, 9), true, 3)
            .unwrap();
        let punch = Fallocate {
            offset: 5,
            len: TIB,
            zero: true,
            keep_size: true,
        };
        file.fallocate(&f.data, &*f.store, punch, 4).unwrap();
        let held: usize = lock(&file.dirty)
            .values()
            .map(|b| lock(b).bytes.capacity())
            .sum();
        assert!(
            held <= 2 * CHUNK_BYTES as usize,
            "the punch holds {held} bytes in memory"
        );
        assert!(lock(&file.dirty).len() <= spots.len() + 2);
        file.flush(&f.data, &*f.store).unwrap();
        let again = f.reopen(file.ino);
        assert_eq!(again.size(), 2 * TIB);
        assert_eq!(again.read(&f.data, 0, 5, None).unwrap(), pattern(5, 1));
        for at in [5, 7 * CHUNK_BYTES + 3, 3 * CHUNK_BYTES, TIB / 2, TIB - 10] {
            assert!(
                again
                    .read(&f.data, at, 15, None)
                    .unwrap()
                    .iter()
                    .all(|b| *b == 0),
                "data left at {at}"
            );
        }
        // The punch ends at TIB + 5, where the last write begins: it stays.
        assert_eq!(
            again.read(&f.data, TIB + 5, 20, None).unwrap(),
            pattern(20, 5)
        );
        // Stored chunks are data up to their length (chunk 0 keeps its 20 bytes, 15 of them
        // zeros); everything punched in between is a hole.
        assert_eq!(again.seek(20, libc::SEEK_DATA), Ok(TIB));
    }

    /// A write does not wait for a flush's block I/O and commit, and what it wrote while the
    /// flush ran stays dirty and reaches the store at the next flush.
    #[test]
    fn writes_go_on_while_a_flush_stores_blocks() {
        let f = Arc::new(Fixture::new("flushing"));
        let file = Arc::new(f.new_file("busy"));
        let chunks = 32;
        file.write(
            &f.data,
            0,
            &pattern(chunks * CHUNK_BYTES as usize, 1),
            true,
            1,
        )
        .unwrap();
        let flush_done = Arc::new(std::sync::OnceLock::new());
        let flusher = {
            let (f, file, flush_done) = (f.clone(), file.clone(), flush_done.clone());
            std::thread::spawn(move || {
                file.flush(&f.data, &*f.store).unwrap();
                flush_done.set(std::time::Instant::now()).unwrap();
            })
        };
        // Into the flush's I/O (32 MiB of puts and fsyncs), then a write within the size.
        std::thread::sleep(std::time::Duration::from_millis(20));
        file.write(&f.data, 5 * CHUNK_BYTES + 3, b"during", true, 2)
            .unwrap();
        let written = std::time::Instant::now();
        flusher.join().unwrap();
        assert!(
            written < *flush_done.get().unwrap(),
            "the write waited for the flush's I/O"
        );
        // The write's bytes are still to be flushed, then stored.
        assert_eq!(
            file.read(&f.data, 5 * CHUNK_BYTES + 3, 6, None).unwrap(),
            b"during"
        );
        assert!(
            file.dirty_mtime().is_some(),
            "the write during the flush was forgotten"
        );
        file.flush(&f.data, &*f.store).unwrap();
        let again = f.reopen(file.ino);
        assert_eq!(
            again.read(&f.data, 5 * CHUNK_BYTES + 3, 6, None).unwrap(),
            b"during"
        );
        let mut expect = pattern(chunks * CHUNK_BYTES as usize, 1);
        expect[5 * CHUNK_BYTES as usize + 3..][..6].copy_from_slice(b"during");
        let got = again
            .read(&f.data, 0, (chunks * CHUNK_BYTES as usize) as u32, None)
            .unwrap();
        assert!(got == expect, "the file differs after the two flushes");
    }

    /// Small writes a chunk apart over a stored file hold a whole chunk each (the stored bytes
    /// read in first): the file asks for its flush once they hold more than its limit, long
    /// before its bytes written reach `FILE_DIRTY_MAX_BYTES`, and the flush gives the memory
    /// back to the mount's budget.
    #[test]
    fn small_writes_spread_over_a_large_file_flush_at_the_memory_limit() {
        let f = Fixture::new("spread");
        let file = f.new_file("spread");
        let limit_chunks = FILE_DIRTY_MAX_BYTES / CHUNK_BYTES;
        let chunks = limit_chunks + 8;
        file.write(
            &f.data,
            0,
            &pattern((chunks * CHUNK_BYTES) as usize, 1),
            true,
            1,
        )
        .unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        assert_eq!(f.data.dirty.held_bytes(), 0, "a flushed file still counted");
        let file = f.reopen(file.ino);
        let mut asked_at = None;
        for idx in 0..chunks {
            let asked = file
                .write(&f.data, idx * CHUNK_BYTES + 4096, b"small", true, 2)
                .unwrap();
            if asked == Backpressure::FlushFile {
                asked_at = Some(idx);
                break;
            }
        }
        assert_eq!(
            asked_at,
            Some(limit_chunks + 1),
            "the file did not ask for a flush when its buffers passed the limit"
        );
        assert_eq!(f.data.dirty.held_bytes(), (limit_chunks + 2) * CHUNK_BYTES);
        file.flush_over_limit(&f.data, &*f.store).unwrap();
        assert_eq!(
            f.data.dirty.held_bytes(),
            0,
            "the flush kept its buffers counted"
        );
        let again = f.reopen(file.ino);
        assert_eq!(
            again
                .read(&f.data, 3 * CHUNK_BYTES + 4096, 5, None)
                .unwrap(),
            b"small"
        );
    }

    /// The mount's budget: a write that takes it past its cap asks its writer to wait for
    /// the writeback; truncating unflushed bytes away, punching a hole over them, or dropping
    /// a state that still holds some, gives them back.
    #[test]
    fn the_mounts_budget_counts_every_files_buffers() {
        let f = Fixture::with_dirty_max("budget", Some(8 * CHUNK_BYTES));
        let a = f.new_file("a");
        let b = f.new_file("b");
        let five = pattern(5 * CHUNK_BYTES as usize, 1);
        assert_eq!(
            a.write(&f.data, 0, &five, true, 1).unwrap(),
            Backpressure::None
        );
        assert_eq!(
            b.write(&f.data, 0, &five[..4 * CHUNK_BYTES as usize], true, 1)
                .unwrap(),
            Backpressure::MountOverCap,
            "nine chunks under a cap of eight did not ask the writer to wait"
        );
        assert!(f.data.dirty.over_cap());
        let under =
            |budget: &DirtyBudget| budget.wait_under_cap(std::time::Duration::from_millis(10));
        assert!(!under(&f.data.dirty));
        a.truncate(&f.data, &*f.store, 3 * CHUNK_BYTES + 100, 2)
            .unwrap();
        assert_eq!(f.data.dirty.held_bytes(), 7 * CHUNK_BYTES + 100);
        assert!(under(&f.data.dirty));
        let punch = Fallocate {
            offset: CHUNK_BYTES,
            len: 2 * CHUNK_BYTES,
            zero: true,
            keep_size: true,
        };
        a.fallocate(&f.data, &*f.store, punch, 3).unwrap();
        assert_eq!(f.data.dirty.held_bytes(), 5 * CHUNK_BYTES + 100);
        drop(b);
        assert_eq!(f.data.dirty.held_bytes(), CHUNK_BYTES + 100);
        a.flush(&f.data, &*f.store).unwrap();
        assert_eq!(f.data.dirty.held_bytes(), 0);
        assert!(a.dirty_since().is_none());
    }

    #[test]
    fn a_writer_past_the_limit_flushes_only_while_the_file_is_still_past_it() {
        let f = Fixture::new("overlimit");
        let file = f.new_file("big");
        let limit_chunks = (FILE_DIRTY_MAX_BYTES / CHUNK_BYTES) as usize;
        let big = pattern((limit_chunks + 1) * CHUNK_BYTES as usize, 1);
        assert_eq!(
            file.write(&f.data, 0, &big, true, 1).unwrap(),
            Backpressure::FlushFile,
            "65 MiB unflushed did not ask for a flush"
        );
        file.flush_over_limit(&f.data, &*f.store).unwrap();
        assert!(
            file.dirty_mtime().is_none(),
            "the writer past the limit did not flush"
        );
        // What a second writer finds once the flush it waited for has run: the file under
        // the limit, its own chunk left for the next flush.
        let at = (limit_chunks as u64 + 3) * CHUNK_BYTES;
        let tail = pattern(CHUNK_BYTES as usize, 2);
        file.write(&f.data, at, &tail, true, 2).unwrap();
        file.flush_over_limit(&f.data, &*f.store).unwrap();
        assert!(
            file.dirty_mtime().is_some(),
            "a writer flushed again though the file was back under the limit"
        );
        file.flush(&f.data, &*f.store).unwrap();
        let again = f.reopen(file.ino);
        assert!(again.read(&f.data, at, CHUNK_BYTES as u32, None).unwrap() == tail);
        assert!(again.read(&f.data, 0, big.len() as u32, None).unwrap() == big);
    }

    #[test]
    fn chunk_bytes_grow_with_zeros_only_in_gaps() {
        let mut buf = Vec::new();
        put_bytes(&mut buf, 0, b"abcd");
        assert_eq!(buf, b"abcd");
        put_bytes(&mut buf, 2, b"XYZW");
        assert_eq!(buf, b"abXYZW");
        put_bytes(&mut buf, 1, b"q");
        assert_eq!(buf, b"aqXYZW");
        put_bytes(&mut buf, 8, b"end");
        assert_eq!(buf, b"aqXYZW\0\0end");
    }

    #[test]
    fn small_files_stay_inline_and_grow_into_blocks() {
        let f = Fixture::new("inline");
        let file = f.new_file("s");
        file.write(&f.data, 0, b"hello", true, 1).unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        let rec = f.store.load_file(0, file.ino).unwrap();
        assert_eq!(rec.inline.as_deref(), Some(&b"hello"[..]));
        assert!(rec.chunks.is_empty());
        file.write(&f.data, INLINE_MAX_BYTES, b"!", true, 2)
            .unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        let rec = f.store.load_file(0, file.ino).unwrap();
        assert_eq!(rec.inline, None);
        assert_eq!(rec.chunks.len(), 1);
        let back = f.reopen(file.ino).read(&f.data, 0, 8, None).unwrap();
        assert_eq!(&back[..5], b"hello");
        assert_eq!(&back[5..], &[0, 0, 0]);
    }

    #[test]
    fn truncate_drops_and_zeroes_what_lies_past_the_new_size() {
        let f = Fixture::new("truncate");
        let file = f.new_file("t");
        file.write(&f.data, 0, &pattern(2 * CHUNK_BYTES as usize, 3), true, 1)
            .unwrap();
        file.flush(&f.data, &*f.store).unwrap();
        file.truncate(&f.data, &*f.store, 100, 2).unwrap();
        file.truncate(&f.data, &*f.store, 2 * CHUNK_BYTES, 3)
            .unwrap();
        let again = f.reopen(file.ino);
        assert_eq!(again.size(), 2 * CHUNK_BYTES);
        let got = again
            .read(&f.data, 0, 2 * CHUNK_BYTES as u32, None)
            .unwrap();
        assert!(got[..100] == pattern(100, 3)[..]);
        assert!(
            got[100..].iter().all(|b| *b == 0),
            "bytes past a truncate came back"
        );
        assert_eq!(again.seek(100, libc::SEEK_HOLE), Ok(100));
        assert_eq!(again.seek(100, libc::SEEK_DATA), Err(libc::ENXIO));
    }

    #[test]
    fn concurrent_creates_share_commits_and_get_unique_inodes() {
        let f = Fixture::new("group");
        let store = f.store.clone();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    (0..200)
                        .map(|i| {
                            wait(|done| {
                                store.create(
                                    NewNode {
                                        ino: None,
                                        parent: ROOT_INO,
                                        name: format!("t{t}-{i}").into_bytes(),
                                        mode: libc::S_IFREG | 0o600,
                                        uid: 0,
                                        gid: 0,
                                        rdev: 0,
                                        target: None,
                                        now_ns: 1,
                                        lease_expires_ns: None,
                                        unleased_at_ns: None,
                                        xattrs: Vec::new(),
                                        inherit: None,
                                    },
                                    done,
                                )
                            })
                            .unwrap()
                            .ino
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 1600);
        assert_eq!(f.store.readdir(0, ROOT_INO).unwrap().len(), 1600);
        // A name taken is EEXIST and changes nothing.
        let again = wait(|done| {
            f.store.create(
                NewNode {
                    ino: None,
                    parent: ROOT_INO,
                    name: b"t0-0".to_vec(),
                    mode: libc::S_IFREG | 0o600,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    target: None,
                    now_ns: 1,
                    lease_expires_ns: None,
                    unleased_at_ns: None,
                    xattrs: Vec::new(),
                    inherit: None,
                },
                done,
            )
        });
        assert_eq!(again.unwrap_err(), libc::EEXIST);
        assert_eq!(f.store.readdir(0, ROOT_INO).unwrap().len(), 1600);
    }
}
