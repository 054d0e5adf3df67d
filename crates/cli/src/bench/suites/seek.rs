//! Seed 002: lseek without the inode lock. Reader threads do lseek(SEEK_END),
//! lseek(SEEK_HOLE) and a 4k pread on one file while a writer extends it; lanefs passthrough
//! over both transports against native tmpfs and disk, libfuse's passthrough_ll and
//! passthrough_hp (given by path).

use super::{
    SuitePlan, aim_line_all, bar, best_median, passthrough_hp, plans_for, volumes, workloads_of,
};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{Role, SuiteResult, Unit};
use crate::bench::runner::{Ctx, Settings};
use crate::bench::systems::{Mode, SystemSpec};
use crate::bench::workloads::{Caller, Kind, Metric, Workload};

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let cores = ctx.settings.cores;
    let mut result = SuiteResult::new(
        Suite::Seek,
        "Seeks that never wait",
        "Seed 002: N threads, each with its own open file, do lseek(SEEK_END), \
         lseek(SEEK_HOLE) and a 4k pread on one file while a writer extends it (64 KiB \
         appends from 16 to 64 MiB, then a truncate back). lseek calls per second and each \
         lseek's latency (p50, p99).",
    );
    let workloads: Vec<Workload> = Settings::powers_of_two(1, 2 * cores as u32)
        .into_iter()
        .map(|n| {
            let t = if n == 1 { "thread" } else { "threads" };
            let metric = |what: &str, unit| Metric {
                key: format!("{what}, {n} {t}"),
                family: what.to_owned(),
                unit,
            };
            Workload {
                metrics: vec![
                    metric("lseek+pread", Unit::SEEKS),
                    metric("lseek p50", Unit::MICROS),
                    metric("lseek p99", Unit::MICROS),
                ],
                numjobs: n,
                config: serde_json::json!({"tool": "lanefs bench seek load", "readers": n,
                    "writer": "64 KiB appends, 16..64 MiB"}),
                kind: Kind::Seek { readers: n },
                caller: Caller::Bench,
            }
        })
        .collect();
    let mut systems = vec![
        SystemSpec::NativeTmpfs,
        SystemSpec::NativeDisk,
        SystemSpec::Libfuse {
            example: Example::PassthroughLl,
            mode: Mode::Multi,
        },
    ];
    systems.extend(passthrough_hp(false));
    for uring_depth in [None, Some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH)] {
        systems.push(SystemSpec::LanefsPassthrough {
            queues: cores,
            parallel_writes: true,
            kernel_passthrough: true,
            uring_depth,
        });
    }
    systems.push(SystemSpec::LanefsNull {
        queues: cores,
        parallel_writes: true,
        size: Some("16M"),
    });
    systems.extend(volumes(cores));
    let plans = plans_for(systems, &workloads);
    result.note(
        "lanefs null keeps no data and has no holes: its SEEK_HOLE answers the end of the \
         file and the writer's appends only move its size. It still shows the cost of \
         SEEK_END (a size refresh) through the engine. passthrough_hp implements no lseek \
         (after its first ENOSYS the kernel answers SEEK_HOLE itself: no hole before the end) \
         and lets the kernel cache attributes for a day, so its lseeks never reach the server: \
         as the best anchor it sets a bar that skips the work.",
    );
    SuitePlan { result, plans }
}

/// Issue 12's aim for seed 002's tail: on each transport, lanefs passthrough's lseek p99 at
/// or below the best anchor's and within 2x native tmpfs', at every reader count.
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    for (workload, unit) in workloads_of(result) {
        if !workload.starts_with("lseek p99") {
            continue;
        }
        let anchor = best_median(result, &workload, |r| r.role == Role::Anchor);
        let native = best_median(result, &workload, |r| {
            r.role == Role::Native && !r.system.starts_with("native disk")
        });
        for uring in [false, true] {
            let ours = best_median(result, &workload, |r| {
                r.role == Role::Lanefs
                    && r.system.starts_with("lanefs passthrough")
                    && r.system.contains("io_uring") == uring
            });
            if let Some(ours) = &ours {
                lines.push(aim_line_all(
                    &workload,
                    ours,
                    &[
                        bar("anchor", anchor.as_ref(), 1.0),
                        bar("native tmpfs", native.as_ref(), 0.5),
                    ],
                    unit,
                    "p99 at or below the best anchor's and within 2x native tmpfs",
                ));
            }
        }
    }
    result.aims = lines;
}
