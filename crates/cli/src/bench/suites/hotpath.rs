//! Issue 11's hot path: the requests the passthrough serves itself (no kernel passthrough:
//! every 4k read and write reaches the daemon, so what a request costs in the daemon shows),
//! by root and by an unprivileged caller, over both transports. A short suite, meant for
//! comparing two builds in one sitting (`--lanefs` names the other build).

use super::{SuitePlan, caller_lines, fio_4k_io, uring_lines, workloads_of};
use crate::bench::Suite;
use crate::bench::model::SuiteResult;
use crate::bench::runner::{Ctx, Plan};
use crate::bench::systems::SystemSpec;
use crate::bench::workloads::UNPRIVILEGED_ID;

use super::files::create_workload;

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let result = SuiteResult::new(
        Suite::Hotpath,
        "The passthrough's own request path, by root and by another user",
        &format!(
            "Issue 11's hot path: fio 4k direct randread and randwrite (psync, 1 and 2 jobs) \
             on one shared file and 10,000 creates, each by root and by uid {UNPRIVILEGED_ID}, \
             on lanefs passthrough without kernel passthrough (every request reaches the \
             daemon) over each transport; tmpfs source."
        ),
    );
    let mut workloads = Vec::new();
    for rw in ["randread", "randwrite"] {
        for nj in [1, 2] {
            let fio = fio_4k_io(rw, "psync", nj, quick, true);
            workloads.push(fio.clone());
            workloads.push(fio.by_unprivileged_user());
        }
    }
    let creates = create_workload(if quick { 1000 } else { 10_000 });
    workloads.push(creates.clone());
    workloads.push(creates.by_unprivileged_user());
    let plans = [None, Some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH)]
        .map(|uring_depth| Plan {
            system: SystemSpec::LanefsPassthrough {
                queues: ctx.settings.cores,
                parallel_writes: true,
                kernel_passthrough: false,
                uring_depth,
            },
            workloads: workloads.clone(),
        })
        .into();
    SuitePlan { result, plans }
}

/// No aims: the rows are for comparing builds and callers.
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    for (workload, unit) in workloads_of(result) {
        lines.extend(uring_lines(result, &workload, unit, 1.0, ">= 1x"));
    }
    lines.extend(caller_lines(result));
    result.aims = lines;
}
