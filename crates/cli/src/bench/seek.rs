//! Seed 002's load: reader threads, each with its own open file (as separate processes would
//! have), doing lseek(SEEK_END), lseek(SEEK_HOLE) and a 4k pread on one file while a writer
//! keeps extending it. Measures lseeks per second and each lseek's latency.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// The file starts at this size; the writer extends it to `CAP`, then truncates it back.
const BASE: u64 = 16 << 20;
const CAP: u64 = 64 << 20;
const CHUNK: usize = 64 << 10;

#[derive(Serialize, Debug, Clone)]
pub struct SeekResult {
    pub readers: u32,
    pub seconds: f64,
    pub lseeks: u64,
    pub seeks_per_s: f64,
    pub preads: u64,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub max_ns: f64,
    /// SEEK_HOLE calls that failed with something other than ENXIO (past the end).
    pub hole_errors: u64,
    pub writer_extends: u64,
}

struct ReaderOut {
    hist: Histogram<u64>,
    lseeks: u64,
    preads: u64,
    hole_errors: u64,
}

/// Runs the load on `path` for `runtime`. `create`: make the file (else it must exist, as
/// null's `data` does).
pub fn run(
    path: &Path,
    create: bool,
    readers: u32,
    runtime: Duration,
) -> Result<SeekResult, String> {
    let shown = path.display();
    let writer = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(create)
        .open(path)
        .map_err(|e| format!("opening {shown}: {e}"))?;
    if create {
        let data = vec![0x5au8; 1 << 20];
        for i in 0..((BASE / 2) >> 20) {
            writer
                .write_all_at(&data, i << 20)
                .map_err(|e| format!("writing {shown}: {e}"))?;
        }
    }
    // A tail without data: a hole where the file system keeps holes.
    writer
        .set_len(BASE)
        .map_err(|e| format!("truncating {shown}: {e}"))?;
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let deadline = start + runtime;
    let (outs, extends) = std::thread::scope(|s| {
        let stop = &stop;
        let writer = &writer;
        let extender = s.spawn(move || {
            let chunk = vec![0xa5u8; CHUNK];
            let mut end = BASE;
            let mut extends = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if end >= CAP {
                    if writer.set_len(BASE).is_err() {
                        break;
                    }
                    end = BASE;
                }
                if writer.write_all_at(&chunk, end).is_err() {
                    break;
                }
                end += CHUNK as u64;
                extends += 1;
            }
            extends
        });
        let handles: Vec<_> = (0..readers)
            .map(|i| s.spawn(move || reader(path, deadline, u64::from(i) + 1)))
            .collect();
        let outs: Vec<Result<ReaderOut, String>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a reader panicked".into())))
            .collect();
        stop.store(true, Ordering::Relaxed);
        let extends = extender.join().unwrap_or(0);
        (outs, extends)
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let (mut lseeks, mut preads, mut hole_errors) = (0, 0, 0);
    for out in outs {
        let out = out?;
        hist.add(&out.hist).map_err(|e| e.to_string())?;
        lseeks += out.lseeks;
        preads += out.preads;
        hole_errors += out.hole_errors;
    }
    if lseeks == 0 {
        return Err("no lseek completed".into());
    }
    Ok(SeekResult {
        readers,
        seconds,
        lseeks,
        seeks_per_s: lseeks as f64 / seconds,
        preads,
        p50_ns: hist.value_at_quantile(0.5) as f64,
        p99_ns: hist.value_at_quantile(0.99) as f64,
        max_ns: hist.max() as f64,
        hole_errors,
        writer_extends: extends,
    })
}

fn reader(path: &Path, deadline: Instant, seed: u64) -> Result<ReaderOut, String> {
    let file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let fd = file.as_raw_fd();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut buf = vec![0u8; 4096];
    let (mut lseeks, mut preads, mut hole_errors) = (0u64, 0u64, 0u64);
    let mut now = Instant::now();
    while now < deadline {
        // SAFETY: lseek on a descriptor we own.
        let end = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
        let t = Instant::now();
        record(&mut hist, t - now);
        if end < 0 {
            return Err(format!(
                "lseek(SEEK_END): {}",
                std::io::Error::last_os_error()
            ));
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let off = (rng % (end as u64).max(4096)) & !4095;
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, off as libc::off_t, libc::SEEK_HOLE) };
        let t2 = Instant::now();
        record(&mut hist, t2 - t);
        if hole < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
            hole_errors += 1;
        }
        lseeks += 2;
        if file.read_at(&mut buf, off).is_ok() {
            preads += 1;
        }
        now = Instant::now();
    }
    Ok(ReaderOut {
        hist,
        lseeks,
        preads,
        hole_errors,
    })
}

fn record(hist: &mut Histogram<u64>, d: Duration) {
    let _ = hist.record((d.as_nanos() as u64).max(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_a_local_file() {
        let dir = std::env::temp_dir().join(format!("lanefs-seek-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = run(&dir.join("f"), true, 2, Duration::from_millis(100)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(r.lseeks > 0 && r.seeks_per_s > 0.0 && r.p99_ns >= r.p50_ns);
        assert_eq!(r.readers, 2);
    }
}
