//! Issue 3's data path: fio 4k randread/randwrite (psync 1 and 2 jobs, libaio iodepth 16),
//! buffered and direct, and seed 000's shared-file job, on lanefs passthrough with and
//! without kernel passthrough, against native tmpfs and libfuse's passthrough_ll
//! single-threaded and multi-threaded with clone_fd. Every source directory is on tmpfs.

use super::{
    SuitePlan, aim_line, best_median, fio_4k_io, fio_seed000, plans_for, uring_line, workloads_of,
};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{Role, SuiteResult};
use crate::bench::runner::Ctx;
use crate::bench::systems::{Mode, SystemSpec};

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let mut result = SuiteResult::new(
        Suite::Passthrough,
        "The passthrough file system's data path",
        "Issue 3's benchmark: fio 4k randread/randwrite with psync (1 and 2 jobs) and libaio \
         (iodepth 16) on one shared file, through the page cache (where kernel passthrough \
         applies) and with O_DIRECT (where every byte goes through the server), plus seed \
         000's 1 MiB shared-file job.",
    );
    let mut workloads = Vec::new();
    for direct in [false, true] {
        for rw in ["randread", "randwrite"] {
            for nj in [1, 2] {
                workloads.push(fio_4k_io(rw, "psync", nj, quick, direct));
            }
            workloads.push(fio_4k_io(rw, "libaio", 1, quick, direct));
        }
    }
    workloads.extend([1, 2].map(|nj| fio_seed000(true, nj, quick)));
    let mut systems = vec![SystemSpec::NativeTmpfs];
    for mode in [Mode::Single, Mode::CloneFd] {
        systems.push(SystemSpec::Libfuse {
            example: Example::PassthroughLl,
            mode,
        });
    }
    for kernel_passthrough in [true, false] {
        systems.push(SystemSpec::LanefsPassthrough {
            queues: ctx.settings.cores,
            parallel_writes: true,
            kernel_passthrough,
            uring_depth: None,
        });
    }
    // Issue 4: the same server over io_uring, with every byte through it.
    systems.push(SystemSpec::LanefsPassthrough {
        queues: ctx.settings.cores,
        parallel_writes: true,
        kernel_passthrough: false,
        uring_depth: Some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH),
    });
    let plans = plans_for(systems, &workloads);
    result.note(
        "lanefs passthrough hands opens without O_DIRECT to the kernel (FUSE passthrough) \
         when it runs as root on a kernel that offers it; O_DIRECT opens go through the \
         server with parallel direct writes. \"no-passthrough\" is `--no-passthrough`. \
         libfuse's passthrough_ll runs as shipped (cache=auto, no kernel passthrough).",
    );
    SuitePlan { result, plans }
}

/// Issue 3's aims: with kernel passthrough, buffered I/O within 10% of native; without it,
/// at least 1.2x passthrough_ll on every row. Issue 4's: io_uring at least matches cloned
/// fds.
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    for (workload, unit) in workloads_of(result) {
        let native = best_median(result, &workload, |r| r.role == Role::Native);
        let anchor = best_median(result, &workload, |r| r.role == Role::Anchor);
        let with = best_median(result, &workload, |r| {
            r.role == Role::Lanefs && !r.system.ends_with("no-passthrough")
        });
        let without = best_median(result, &workload, |r| {
            r.role == Role::Lanefs && r.system.ends_with("no-passthrough")
        });
        if workload.contains("buffered")
            && let (Some(ours), Some(native)) = (&with, &native)
        {
            lines.extend(aim_line(
                &workload,
                ours,
                native,
                unit,
                0.9,
                ">= 0.9x native",
            ));
        }
        if let (Some(ours), Some(anchor)) = (&without, &anchor) {
            lines.extend(aim_line(&workload, ours, anchor, unit, 1.2, ">= 1.2x"));
        }
        lines.extend(uring_line(result, &workload, unit, 1.0, ">= 1x"));
    }
    result.aims = lines;
}
