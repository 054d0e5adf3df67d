//! Seed 004: dd with 4 up to 8x cores processes writing, then reading, one mount in 1 MiB
//! blocks; aggregate MiB/s. And one stream: fio sequential 1 MiB writes, then reads, of one
//! file by one job (issue 13's bar for the volume: 1 GiB/s each way).

use super::{SuitePlan, passthrough_hp, plans_for, volume_target_lines, volumes};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::fio::FioJob;
use crate::bench::model::{SuiteResult, Unit};
use crate::bench::runner::{Ctx, Settings};
use crate::bench::systems::{Mode, SystemSpec};
use crate::bench::workloads::{Caller, Kind, Metric, Workload};

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let cores = ctx.settings.cores;
    let total_mib: u64 = if ctx.settings.quick { 64 } else { 4096 };
    let mut result = SuiteResult::new(
        Suite::Dd,
        "Many processes on one mount",
        "Seed 004: dd processes, 4 up to 8x the cores, each writing its own file (on null: its \
         own region of data) in 1 MiB blocks, then reading it back; aggregate MiB/s from the \
         first start to the last exit.",
    );
    let mut workloads: Vec<Workload> = Settings::powers_of_two(4, 8 * cores as u32)
        .into_iter()
        .map(|procs| {
            let mib_each = (total_mib / u64::from(procs)).max(1);
            let metric = |what: &str| Metric {
                key: format!("{what}, {procs} processes"),
                family: what.to_owned(),
                unit: Unit::MIBS,
            };
            Workload {
                metrics: vec![metric("dd write 1M"), metric("dd read 1M")],
                numjobs: procs,
                config: serde_json::json!({"tool": "dd", "bs": "1M", "processes": procs,
                    "mib_each": mib_each}),
                kind: Kind::Dd { procs, mib_each },
                caller: Caller::Bench,
            }
        })
        .collect();
    match &ctx.fio {
        Ok(_) => {
            workloads.extend(["write", "read"].map(|rw| sequential_1m(rw, ctx.settings.quick)))
        }
        Err(why) => result.skip(format!("fio sequential 1M rows: {why}")),
    }
    let mut systems = vec![
        SystemSpec::NativeTmpfs,
        SystemSpec::Libfuse {
            example: Example::Null,
            mode: Mode::Multi,
        },
        SystemSpec::Libfuse {
            example: Example::PassthroughLl,
            mode: Mode::Multi,
        },
        SystemSpec::LanefsNull {
            queues: cores,
            parallel_writes: true,
            size: None,
        },
        SystemSpec::LanefsPassthrough {
            queues: cores,
            parallel_writes: true,
            kernel_passthrough: true,
            uring_depth: None,
        },
    ];
    systems.extend(volumes(cores));
    systems.extend(passthrough_hp(false));
    let plans = plans_for(systems, &workloads);
    result.note(format!(
        "{total_mib} MiB in all per phase, split over the processes. dd is buffered as in the \
         seed: on tmpfs and libfuse passthrough_ll (no direct_io) the reads come from the page \
         cache; null servers see every block."
    ));
    SuitePlan { result, plans }
}

/// fio sequential 1 MiB `rw` ("write" or "read") through the page cache, one job, one file.
fn sequential_1m(rw: &str, quick: bool) -> Workload {
    Workload::fio(
        format!("fio sequential 1M {rw}, 1 job"),
        format!("sequential 1M {rw}"),
        Unit::MIBS,
        FioJob {
            rw: rw.into(),
            bs: "1M".into(),
            ioengine: "psync".into(),
            iodepth: 1,
            numjobs: 1,
            direct: false,
            shared_file: true,
            size: if quick { "64M" } else { "1G" }.into(),
            region: "1G".into(),
        },
    )
}

/// Issue 13's bar for the volume's one stream: sequential 1 MiB writes and reads at 1 GiB/s.
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    for rw in ["write", "read"] {
        let workload = sequential_1m(rw, false).metrics[0].key.clone();
        lines.extend(volume_target_lines(
            result,
            &workload,
            false,
            1024.0,
            ">= 1 GiB/s (1024 MiB/s)",
        ));
    }
    result.aims = lines;
}
