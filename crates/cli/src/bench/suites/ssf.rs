//! Seed 000: 1 MiB direct randwrite:256 to one shared file and to a file per job, numjobs
//! 1, 2, 4 ... 2x cores; lanefs null, and passthrough served by the daemon, with parallel
//! writes on and off (the seed's patched and unpatched kernels); lanefs passthrough with
//! kernel passthrough (which O_DIRECT opens now take), native tmpfs, libfuse's passthrough_ll
//! and passthrough_hp (given by path).

use super::{SuitePlan, aim_line, fio_seed000, passthrough_hp, volumes};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{Status, SuiteResult};
use crate::bench::runner::{Ctx, Plan, Settings};
use crate::bench::systems::{Mode, SystemSpec};

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let cores = ctx.settings.cores;
    let mut result = SuiteResult::new(
        Suite::Ssf,
        "Parallel direct writes to one file",
        "Seed 000: fio 1 MiB direct writes (randwrite:256, rw_sequencer=sequential), one \
         shared file and file-per-job, numjobs 1 up to 2x the cores. The seed disabled the \
         backend's writes; here null drops them and passthrough lands them on tmpfs.",
    );
    let numjobs = Settings::powers_of_two(1, 2 * cores as u32);
    let shared: Vec<_> = numjobs
        .iter()
        .map(|&nj| fio_seed000(true, nj, quick))
        .collect();
    let both: Vec<_> = shared
        .iter()
        .cloned()
        .chain(numjobs.iter().map(|&nj| fio_seed000(false, nj, quick)))
        .collect();
    let mut plans = vec![
        Plan {
            system: SystemSpec::NativeTmpfs,
            workloads: both.clone(),
        },
        Plan {
            system: SystemSpec::Libfuse {
                example: Example::PassthroughLl,
                mode: Mode::Multi,
            },
            workloads: both.clone(),
        },
    ];
    for parallel_writes in [true, false] {
        plans.push(Plan {
            system: SystemSpec::LanefsNull {
                queues: cores,
                parallel_writes,
                size: None,
            },
            workloads: shared.clone(),
        });
    }
    for system in passthrough_hp(false) {
        plans.push(Plan {
            system,
            workloads: both.clone(),
        });
    }
    // With kernel passthrough the kernel writes the backing file itself (parallel writes
    // are the daemon's); without it, the seed's comparison of parallel writes on and off.
    for (kernel_passthrough, parallel_writes) in [(true, true), (false, true), (false, false)] {
        plans.push(Plan {
            system: SystemSpec::LanefsPassthrough {
                queues: cores,
                parallel_writes,
                kernel_passthrough,
                uring_depth: None,
            },
            workloads: both.clone(),
        });
    }
    for system in volumes(cores) {
        plans.push(Plan {
            system,
            workloads: both.clone(),
        });
    }
    result.skip("lanefs null, file per job: null has one file (data) and creates none");
    result.note(format!(
        "lanefs runs with {cores} queues (one per core). libfuse passthrough_ll runs as \
         shipped (multi-threaded, cache=auto) over a tmpfs directory; it does not set \
         parallel direct writes. O_DIRECT opens on lanefs passthrough go through kernel \
         passthrough where it is on, so \"no-pw\" changes only the rows without it."
    ));
    SuitePlan { result, plans }
}

/// Issue 13's aim for seed 000 inside the volume: one file written by 2 jobs at >= 1.6x one
/// job, on each transport.
pub fn aims(result: &mut SuiteResult) {
    let one = fio_seed000(true, 1, false).metrics[0].key.clone();
    let two = fio_seed000(true, 2, false).metrics[0].key.clone();
    let median = |workload: &str, system: &str| {
        result
            .row(workload, system)
            .filter(|r| r.status == Status::Ok)
            .and_then(|r| Some((system.to_owned(), r.summary?.median, r.unit)))
    };
    let mut lines = Vec::new();
    let systems: Vec<String> = result
        .rows
        .iter()
        .filter(|r| r.workload == two && r.system.starts_with("lanefs volume"))
        .map(|r| r.system.clone())
        .collect();
    for system in systems {
        if let (Some((_, two_jobs, unit)), Some((_, one_job, _))) =
            (median(&two, &system), median(&one, &system))
        {
            lines.extend(aim_line(
                &format!("{two} against 1 job"),
                &(system.clone(), two_jobs),
                &(format!("{system}, 1 job"), one_job),
                unit,
                1.6,
                ">= 1.6x one job",
            ));
        }
    }
    result.aims = lines;
}
