//! Per-queue request statistics: count, errors and a latency histogram per operation.
//!
//! Each queue owns its counters; they are merged only when someone reads them (`lanefs
//! stats`). The histogram table of a queue sits behind that queue's own mutex, which is taken
//! by whichever thread answers one of its requests (almost always the queue's worker), so it is
//! uncontended on the request path and no lock is shared by all queues.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::abi::opcode;

/// Longest latency the histograms resolve (longer ones are clamped to it).
const LATENCY_MAX_NS: u64 = 600_000_000_000;
/// Significant decimal digits of the histograms (2: 1% precision, ~20 KiB per op per queue).
const LATENCY_SIGNIFICANT_DIGITS: u8 = 2;

struct OpCounters {
    count: u64,
    errors: u64,
    latency_ns: Histogram<u64>,
}

/// The statistics of one queue.
pub struct QueueStats {
    pub id: usize,
    /// The CPU the queue's worker is pinned to, if any.
    pub cpu: Option<usize>,
    /// The NUMA node of that CPU, if known.
    pub node: Option<usize>,
    /// Requests read from this queue (answered or not).
    requests: AtomicU64,
    /// Protects the per-op table. Lock order: a leaf; nothing is taken while holding it.
    ops: Mutex<Vec<Option<OpCounters>>>,
}

impl QueueStats {
    pub fn new(id: usize, cpu: Option<usize>, node: Option<usize>) -> Self {
        let mut ops = Vec::with_capacity(opcode::COUNT);
        ops.resize_with(opcode::COUNT, || None);
        QueueStats {
            id,
            cpu,
            node,
            requests: AtomicU64::new(0),
            ops: Mutex::new(ops),
        }
    }

    /// Counts a request read from the queue.
    pub fn received(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Records an answered (or answer-less) request.
    pub fn record(&self, op: u32, elapsed: Duration, error: bool) {
        let slot = (op as usize).min(opcode::COUNT - 1);
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let counters = ops[slot].get_or_insert_with(|| OpCounters {
            count: 0,
            errors: 0,
            latency_ns: Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGNIFICANT_DIGITS)
                .expect("static histogram bounds are valid"),
        });
        counters.count += 1;
        counters.errors += error as u64;
        counters
            .latency_ns
            .saturating_record(elapsed.as_nanos().min(LATENCY_MAX_NS as u128) as u64);
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// One operation's merged figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpSnapshot {
    pub op: String,
    pub count: u64,
    pub errors: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub id: usize,
    /// What the queue is: an `io_uring` ring, or a `/dev/fuse` fd.
    #[serde(default)]
    pub transport: String,
    pub cpu: Option<usize>,
    pub node: Option<usize>,
    pub requests: u64,
}

/// Everything `lanefs stats` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsSnapshot {
    pub source: String,
    pub mountpoint: String,
    pub filesystem: String,
    pub transport: String,
    pub protocol: String,
    pub flags: String,
    pub max_write: u32,
    pub queues: Vec<QueueSnapshot>,
    pub ops: Vec<OpSnapshot>,
    /// Extra counters a file system reports (e.g. fd cache hits), name and value.
    pub counters: Vec<(String, u64)>,
}

/// Merges the per-op figures of several queues.
pub fn merge_ops(queues: &[&QueueStats]) -> Vec<OpSnapshot> {
    let mut merged: Vec<Option<OpCounters>> = Vec::new();
    merged.resize_with(opcode::COUNT, || None);
    for queue in queues {
        let ops = queue.ops.lock().unwrap_or_else(|e| e.into_inner());
        for (slot, counters) in ops.iter().enumerate() {
            let Some(c) = counters else { continue };
            match &mut merged[slot] {
                Some(m) => {
                    m.count += c.count;
                    m.errors += c.errors;
                    // Same bounds on both sides: adding cannot fail.
                    let _ = m.latency_ns.add(&c.latency_ns);
                }
                empty => {
                    *empty = Some(OpCounters {
                        count: c.count,
                        errors: c.errors,
                        latency_ns: c.latency_ns.clone(),
                    })
                }
            }
        }
    }
    merged
        .into_iter()
        .enumerate()
        .filter_map(|(op, c)| {
            let c = c?;
            let us = |ns: u64| ns as f64 / 1000.0;
            Some(OpSnapshot {
                op: opcode::name(op as u32).to_string(),
                count: c.count,
                errors: c.errors,
                p50_us: us(c.latency_ns.value_at_quantile(0.5)),
                p99_us: us(c.latency_ns.value_at_quantile(0.99)),
                max_us: us(c.latency_ns.max()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_adds_counts_and_keeps_quantiles() {
        let a = QueueStats::new(0, None, None);
        let b = QueueStats::new(1, Some(1), Some(0));
        for _ in 0..99 {
            a.record(opcode::READ, Duration::from_micros(10), false);
        }
        b.record(opcode::READ, Duration::from_millis(5), true);
        b.record(opcode::LOOKUP, Duration::from_micros(3), true);
        let ops = merge_ops(&[&a, &b]);
        let read = ops.iter().find(|o| o.op == "read").unwrap();
        assert_eq!((read.count, read.errors), (100, 1));
        assert!((read.p50_us - 10.0).abs() < 0.5, "{}", read.p50_us);
        assert!(read.max_us > 4900.0);
        let lookup = ops.iter().find(|o| o.op == "lookup").unwrap();
        assert_eq!((lookup.count, lookup.errors), (1, 1));
        assert_eq!(ops.len(), 2);
    }

    #[test]
    fn out_of_range_opcodes_and_latencies_are_clamped() {
        let q = QueueStats::new(0, None, None);
        q.record(100_000, Duration::from_secs(10_000), false);
        assert_eq!(merge_ops(&[&q]).len(), 1);
    }
}
