//! The offload pool: where a file system sends work that can take long (fsync, a copy of
//! unbounded length, an open waiting for a host lease break, a write waiting behind a
//! truncate), so that it never holds a queue's worker. Over io_uring a worker serves every
//! request of its CPU one after another, so anything slow there makes that CPU's other
//! callers (stat, lseek) wait; over /dev/fuse it takes one of a few workers away.
//!
//! One pool per NUMA node: `THREADS_PER_NODE` threads, started on first use and kept
//! within the node's CPUs, and a queue of at most `QUEUE_PER_NODE` waiting jobs. A job goes
//! to the pool of the node its submitter runs on, so its memory stays local. The parked
//! request keeps its ring entry meanwhile, which the ring replaces (see `uring::serve_ring`).
//!
//! Back-pressure: when a node's queue is full, the job runs at once on the submitting
//! thread (the queue's worker): that CPU's requests wait behind it, as they would without
//! the pool, but nothing can deadlock. Neither the pool nor the inline run waits for a
//! ring or a queue: jobs wait only on the host (syscalls, the write gate, whose holders are
//! themselves host calls that finish), never on another request of ours being served. A
//! submitter is never blocked waiting for room, which could deadlock if every pool thread
//! waited on a request queued behind it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::topology::{self, Topology};

/// Threads per NUMA node: enough for a few slow operations at once (several fsyncs on
/// different files, a copy and a readdirplus), few enough to cost little when idle.
pub const THREADS_PER_NODE: usize = 4;
/// Jobs waiting per NUMA node beyond the running ones; a job that finds the queue full runs
/// on its submitter instead. Small: each waiting job holds a parked request (over io_uring,
/// a ring entry), and these must stay well below a ring's spare entries.
pub const QUEUE_PER_NODE: usize = 64;
/// Stack of a pool thread: jobs keep their buffers on the heap.
const STACK_BYTES: usize = 256 << 10;
/// How long dropping the pools waits for their threads to finish the jobs they have (a job
/// stuck on the host, an fsync on a dead network mount, must not keep the daemon from
/// exiting): the threads still busy after it are left to end with the process.
const DRAIN_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// Inline runs (queue full) between two log lines.
const FULL_LOG_EVERY: usize = 1000;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pools of every NUMA node of one session.
pub struct Offload {
    nodes: Box<[Arc<NodePool>]>,
    /// Pool index by CPU number (CPUs unknown to the topology use pool 0).
    pool_of_cpu: Box<[usize]>,
}

struct NodePool {
    id: usize,
    cpus: Vec<usize>,
    /// Jobs waiting for a thread, and the number of threads started. Lock: one per node,
    /// taken only to submit or take an offloaded job (never by an ordinary request); a leaf.
    state: Mutex<PoolState>,
    ready: Condvar,
    /// Jobs run on their submitter because the queue was full (for the log).
    ran_inline: AtomicUsize,
}

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    threads: usize,
    /// Threads waiting for a job.
    idle: usize,
    /// The threads started, joined when the session's pools are dropped.
    handles: Vec<std::thread::JoinHandle<()>>,
    /// The session is gone: threads finish the queued jobs and exit; new jobs run inline.
    closed: bool,
}

impl Offload {
    pub fn new(topology: &Topology) -> Offload {
        let nodes: Box<[Arc<NodePool>]> = topology
            .nodes
            .iter()
            .map(|(id, cpus)| {
                Arc::new(NodePool {
                    id: *id,
                    cpus: cpus.clone(),
                    state: Mutex::new(PoolState::default()),
                    ready: Condvar::new(),
                    ran_inline: AtomicUsize::new(0),
                })
            })
            .collect();
        let max_cpu = topology.possible.iter().copied().max().unwrap_or(0);
        let pool_of_cpu = (0..=max_cpu)
            .map(|cpu| {
                nodes
                    .iter()
                    .position(|n| n.cpus.contains(&cpu))
                    .unwrap_or(0)
            })
            .collect();
        Offload { nodes, pool_of_cpu }
    }

    /// Runs `job` on a pool thread of the calling thread's NUMA node, or at once on the
    /// calling thread when that pool's queue is full (or no thread can be started).
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        let pool = topology::current_cpu()
            .and_then(|cpu| self.pool_of_cpu.get(cpu).copied())
            .unwrap_or(0);
        let Some(node) = self.nodes.get(pool) else {
            return job();
        };
        if let Err(job) = node.submit(Box::new(job)) {
            let count = node.ran_inline.fetch_add(1, Ordering::Relaxed);
            if count.is_multiple_of(FULL_LOG_EVERY) {
                tracing::warn!(
                    node = node.id,
                    "the offload pool of node {} is full ({THREADS_PER_NODE} threads busy, \
                     {QUEUE_PER_NODE} jobs waiting): running a slow request on its queue's \
                     worker ({} times so far)",
                    node.id,
                    count + 1
                );
            }
            job();
        }
    }

    /// Threads started and jobs waiting, per node.
    #[cfg(test)]
    fn load(&self) -> Vec<(usize, usize)> {
        self.nodes
            .iter()
            .map(|n| {
                let state = n.lock();
                (state.threads, state.queue.len())
            })
            .collect()
    }
}

/// The session's pools go with it: each thread finishes the jobs already queued (their
/// answers go to a connection that has ended, which is harmless) and exits, and is joined,
/// except the dropping thread itself (a job's `Reply` can hold the last reference) and
/// threads still busy after `DRAIN_MAX`.
impl Drop for Offload {
    fn drop(&mut self) {
        let me = std::thread::current().id();
        let deadline = std::time::Instant::now() + DRAIN_MAX;
        for node in self.nodes.iter() {
            let handles = {
                let mut state = node.lock();
                state.closed = true;
                std::mem::take(&mut state.handles)
            };
            node.ready.notify_all();
            for handle in handles {
                if handle.thread().id() == me {
                    continue;
                }
                while !handle.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                if !handle.is_finished() {
                    tracing::warn!(
                        node = node.id,
                        "an offload thread is still busy after {DRAIN_MAX:?}; leaving it"
                    );
                } else if handle.join().is_err() {
                    tracing::warn!(node = node.id, "an offload thread ended by a panic");
                }
            }
        }
    }
}

impl NodePool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, starting a thread if none is idle and the node has fewer than its
    /// threads; gives the job back when the queue is full.
    fn submit(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        let mut state = self.lock();
        if state.queue.len() >= QUEUE_PER_NODE || state.closed {
            return Err(job);
        }
        state.queue.push_back(job);
        if state.idle >= state.queue.len() {
            self.ready.notify_one();
            return Ok(());
        }
        if state.threads < THREADS_PER_NODE {
            let pool = self.clone();
            let started = std::thread::Builder::new()
                .name(format!("lanefs-offload{}", self.id))
                .stack_size(STACK_BYTES)
                .spawn(move || pool.serve());
            match started {
                Ok(handle) => {
                    state.threads += 1;
                    state.handles.push(handle);
                }
                Err(e) if state.threads == 0 => {
                    tracing::warn!("cannot start an offload thread: {e}");
                    return Err(state.queue.pop_back().expect("pushed above"));
                }
                Err(e) => tracing::warn!("cannot start another offload thread: {e}"),
            }
        }
        self.ready.notify_one();
        Ok(())
    }

    /// A pool thread: runs jobs as they come until the session's pools are dropped (an idle
    /// one costs a sleeping thread).
    fn serve(&self) {
        if !self.cpus.is_empty()
            && let Err(e) = topology::pin_current_thread_to(&self.cpus)
        {
            tracing::debug!(node = self.id, "keeping an offload thread on its node: {e}");
        }
        loop {
            let job = {
                let mut state = self.lock();
                loop {
                    if let Some(job) = state.queue.pop_front() {
                        break job;
                    }
                    if state.closed {
                        return;
                    }
                    state.idle += 1;
                    state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
                    state.idle -= 1;
                }
            };
            // A panicking job drops its Reply, which answers EIO; the thread goes on.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                tracing::error!("an offloaded request panicked; it was answered with EIO");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Holds a pool thread until the test lets go.
    fn blocker(release: &Arc<(Mutex<bool>, Condvar)>, running: &mpsc::Sender<()>) -> Job {
        let (release, running) = (release.clone(), running.clone());
        Box::new(move || {
            running.send(()).unwrap();
            let (lock, cond) = &*release;
            let mut go = lock.lock().unwrap();
            while !*go {
                go = cond.wait(go).unwrap();
            }
        })
    }

    #[test]
    fn a_node_runs_at_most_its_threads_queues_the_rest_and_runs_the_overflow_inline() {
        let offload = Offload::new(&Topology::single(1));
        assert_eq!(
            offload.load(),
            vec![(0, 0)],
            "no thread before the first job"
        );
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let (running_tx, running) = mpsc::channel();
        // More blocking jobs than threads: THREADS_PER_NODE run, the rest wait.
        for _ in 0..THREADS_PER_NODE + 2 {
            let job = blocker(&release, &running_tx);
            offload.run(job);
        }
        for _ in 0..THREADS_PER_NODE {
            running.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        assert!(running.recv_timeout(Duration::from_millis(200)).is_err());
        assert_eq!(offload.load(), vec![(THREADS_PER_NODE, 2)]);
        // Fill the queue; the next job finds it full and runs here, at once.
        let (done_tx, done) = mpsc::channel();
        for _ in 2..QUEUE_PER_NODE {
            let done_tx = done_tx.clone();
            offload.run(move || done_tx.send(std::thread::current().id()).unwrap());
        }
        assert_eq!(offload.load(), vec![(THREADS_PER_NODE, QUEUE_PER_NODE)]);
        let here = std::thread::current().id();
        offload.run(move || done_tx.send(std::thread::current().id()).unwrap());
        assert_eq!(
            done.try_recv().unwrap(),
            here,
            "the overflow runs on its submitter"
        );
        // Let go: every queued job runs, on pool threads.
        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        for _ in 2..QUEUE_PER_NODE {
            let ran_on = done.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_ne!(ran_on, here);
        }
        assert_eq!(offload.load(), vec![(THREADS_PER_NODE, 0)]);
    }

    /// Dropping the pools ends their threads (which hold the node's state): the old threads
    /// ran forever, one set per mount a process ever made.
    #[test]
    fn dropping_the_pools_ends_their_threads() {
        let offload = Offload::new(&Topology::single(1));
        let (tx, rx) = mpsc::channel();
        for _ in 0..THREADS_PER_NODE {
            let tx = tx.clone();
            offload.run(move || {
                std::thread::sleep(Duration::from_millis(20));
                tx.send(()).unwrap();
            });
        }
        assert!(offload.load()[0].0 > 0);
        let node = Arc::downgrade(&offload.nodes[0]);
        drop(offload);
        // Queued jobs still ran, and every thread has exited (dropped its share).
        for _ in 0..THREADS_PER_NODE {
            rx.try_recv()
                .expect("a queued job ran before its thread exited");
        }
        assert!(
            node.upgrade().is_none(),
            "an offload thread outlived its pools"
        );
    }

    #[test]
    fn a_panicking_job_leaves_the_pool_serving() {
        let offload = Offload::new(&Topology::single(1));
        for _ in 0..THREADS_PER_NODE {
            offload.run(|| panic!("a job's bug"));
        }
        let (tx, rx) = mpsc::channel();
        offload.run(move || tx.send(()).unwrap());
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(offload.load()[0].0 <= THREADS_PER_NODE);
    }
}
