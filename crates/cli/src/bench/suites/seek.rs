//! Seed 002: lseek without the inode lock. Reader threads do lseek(SEEK_END),
//! lseek(SEEK_HOLE) and a 4k pread on one file while a writer extends it.

use super::{SuitePlan, plans_for};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{SuiteResult, Unit};
use crate::bench::runner::{Ctx, Settings};
use crate::bench::systems::{Mode, SystemSpec};
use crate::bench::workloads::{Kind, Metric, Workload};

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
            }
        })
        .collect();
    let systems = [
        SystemSpec::NativeTmpfs,
        SystemSpec::NativeDisk,
        SystemSpec::Libfuse {
            example: Example::PassthroughLl,
            mode: Mode::Multi,
        },
        SystemSpec::LanefsPassthrough {
            queues: cores,
            parallel_writes: true,
            kernel_passthrough: true,
            uring_depth: None,
        },
        SystemSpec::LanefsNull {
            queues: cores,
            parallel_writes: true,
            size: Some("16M"),
        },
    ];
    let plans = plans_for(systems, &workloads);
    result.note(
        "lanefs null keeps no data and has no holes: its SEEK_HOLE answers the end of the \
         file and the writer's appends only move its size. It still shows the cost of \
         SEEK_END (a size refresh) through the engine.",
    );
    SuitePlan { result, plans }
}
