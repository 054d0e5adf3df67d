//! Issue 2's benchmark: fio 4k randread/randwrite (psync 1 and 2 jobs, libaio iodepth 16) and
//! seed 000's shared-file job (1 and 2 jobs) on lanefs null with 1, 2 and N /dev/fuse queues
//! and over io_uring (issue 4), against libfuse's null example single-threaded,
//! multi-threaded and with clone_fd.

use super::{SuitePlan, distinct, fio_4k, fio_seed000};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{Role, Status, SuiteResult, Unit, better, speedup};
use crate::bench::runner::{Ctx, Plan};
use crate::bench::systems::{Mode, SystemSpec};

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let cores = ctx.settings.cores as u32;
    let mut result = SuiteResult::new(
        Suite::Engine,
        "The engine: lanefs null against libfuse's null example",
        "Issue 2's benchmark; its last job is seed 000's (1 MiB direct randwrite:256 to one \
         shared file). The null servers drop writes and read zeros, so this measures the FUSE \
         round trip and the server's own overhead.",
    );
    let mut fourk = Vec::new();
    for rw in ["randread", "randwrite"] {
        for nj in [1, 2] {
            fourk.push(fio_4k(rw, "psync", nj, quick));
        }
    }
    for rw in ["randread", "randwrite"] {
        fourk.push(fio_4k(rw, "libaio", 1, quick));
    }
    let shared: Vec<_> = [1, 2]
        .into_iter()
        .map(|nj| fio_seed000(true, nj, quick))
        .collect();
    let all: Vec<_> = fourk.iter().chain(&shared).cloned().collect();

    let mut plans = vec![Plan {
        system: SystemSpec::NativeTmpfs,
        workloads: all.clone(),
    }];
    for mode in Mode::ALL {
        plans.push(Plan {
            system: SystemSpec::Libfuse {
                example: Example::Null,
                mode,
            },
            workloads: all.clone(),
        });
    }
    result.skip(
        "libfuse hello_ll (-s, mt, mt clone_fd): its only file, hello, is 13 bytes and \
         read-only, so fio can run no 4k or 1 MiB job on it (\"blocksize is larger than data \
         set range\") and it takes no writes; libfuse's null example is the data-path anchor",
    );
    for queues in distinct(vec![1, 2, cores]) {
        plans.push(Plan {
            system: SystemSpec::LanefsNull {
                queues: queues as usize,
                parallel_writes: true,
                size: None,
            },
            workloads: all.clone(),
        });
        plans.push(Plan {
            system: SystemSpec::LanefsNull {
                queues: queues as usize,
                parallel_writes: false,
                size: None,
            },
            workloads: shared.clone(),
        });
    }
    // The transport as a dimension: the same null server over one io_uring per CPU.
    plans.push(Plan {
        system: SystemSpec::LanefsNullUring {
            depth: lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH,
        },
        workloads: all.clone(),
    });
    result.note(
        "Native is a file on the bench's tmpfs: the kernel's own limit for the same syscalls. \
         libfuse's null example opens without FOPEN_DIRECT_IO (fio's O_DIRECT still reaches \
         it) and without parallel direct writes; lanefs null answers FOPEN_DIRECT_IO with \
         FOPEN_PARALLEL_DIRECT_WRITES unless --no-parallel-writes (\"no-pw\").",
    );
    SuitePlan { result, plans }
}

/// Issue 2's aims, from the medians: lanefs at least 1.3x the best libfuse configuration on
/// 4k IOPS; the shared-file write at 2 jobs at least 1.6x 1 job with parallel writes, about
/// 1x without.
pub fn aims(result: &mut SuiteResult) {
    let median = |workload: &str, system: &str| {
        result
            .row(workload, system)
            .filter(|r| r.status == Status::Ok)
            .and_then(|r| r.summary.map(|s| s.median))
    };
    let mut lines = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in &result.rows {
        if r.unit == Unit::IOPS && !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for w in workloads {
        let best = |role: Role| {
            result
                .rows
                .iter()
                .filter(|r| r.workload == w && r.role == role)
                .filter_map(|r| r.summary.map(|s| (r.system.as_str(), s.median)))
                .fold(None::<(&str, f64)>, |b, (s, m)| match b {
                    Some((_, bm)) if !better(m, bm, Unit::IOPS) => b,
                    _ => Some((s, m)),
                })
        };
        if let (Some((ls, lm)), Some((asys, am))) = (best(Role::Lanefs), best(Role::Anchor)) {
            let ratio = speedup(lm, am, Unit::IOPS).unwrap_or(0.0);
            lines.push(format!(
                "{w}: best lanefs ({ls}, {lm:.0} IOPS) = **{ratio:.2}x** the best libfuse \
                 ({asys}, {am:.0} IOPS); aim >= 1.3x: {}",
                if ratio >= 1.3 { "met" } else { "NOT met" }
            ));
        }
    }
    let one = "1M randwrite:256 shared file, 1 job";
    let two = "1M randwrite:256 shared file, 2 jobs";
    let mut systems: Vec<String> = result
        .rows
        .iter()
        .filter(|r| r.role == Role::Lanefs && r.workload == one)
        .map(|r| r.system.clone())
        .collect();
    systems.dedup();
    for s in systems {
        if let (Some(a), Some(b)) = (median(one, &s), median(two, &s)) {
            let ratio = b / a;
            let (aim, met) = if s.ends_with("no-pw") {
                ("about 1x", (0.8..=1.25).contains(&ratio))
            } else {
                (">= 1.6x", ratio >= 1.6)
            };
            lines.push(format!(
                "shared-file write on {s}: 2 jobs = **{ratio:.2}x** 1 job ({b:.0} vs {a:.0} \
                 MiB/s); aim {aim}: {}",
                if met { "met" } else { "NOT met" }
            ));
        }
    }
    result.aims = lines;
}
