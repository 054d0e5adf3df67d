//! Seed 003: creates and untar. 10,000 `echo foobarbaz > $DIR/$i` in one bash; untar of
//! Debian's linux-source tarball (decompressed once into the cache, so decompression is not
//! timed) and `rm -rf` of the tree.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{
    SuitePlan, aim_line, best_median, is_on_postgres, passthrough_hp, plans_for, uring_lines,
    volume_target_lines, volumes, volumes_on_postgres, workloads_of,
};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::model::{Role, SuiteResult, Unit};
use crate::bench::runner::{Ctx, Plan};
use crate::bench::systems::{Mode, SystemSpec};
use crate::bench::workloads::{Caller, Kind, Metric, Workload};

/// The systems both suites compare: native, lanefs passthrough and volume, libfuse's
/// passthroughs (passthrough_hp given by path), and JuiceFS (given by path).
fn systems(ctx: &Ctx) -> Vec<SystemSpec> {
    let mut systems = vec![
        SystemSpec::NativeTmpfs,
        SystemSpec::NativeDisk,
        SystemSpec::Libfuse {
            example: Example::PassthroughLl,
            mode: Mode::Single,
        },
        SystemSpec::Libfuse {
            example: Example::PassthroughLl,
            mode: Mode::CloneFd,
        },
        SystemSpec::Libfuse {
            example: Example::PassthroughFh,
            mode: Mode::Multi,
        },
        SystemSpec::LanefsPassthrough {
            queues: ctx.settings.cores,
            parallel_writes: true,
            kernel_passthrough: true,
            uring_depth: None,
        },
        SystemSpec::LanefsPassthrough {
            queues: ctx.settings.cores,
            parallel_writes: true,
            kernel_passthrough: true,
            uring_depth: Some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH),
        },
    ];
    systems.extend(volumes(ctx.settings.cores));
    // Issue 15's A/B: every directory operation waiting for its commit.
    systems.push(SystemSpec::LanefsVolume {
        queues: ctx.settings.cores,
        uring: true,
        async_dirops: false,
    });
    systems.extend(volumes_on_postgres(ctx.settings.cores));
    systems.push(SystemSpec::LanefsVolumePg {
        queues: ctx.settings.cores,
        uring: true,
        async_commit: false,
        async_dirops: false,
        mounts: 1,
        s3: false,
    });
    systems.extend(passthrough_hp(false));
    systems.push(SystemSpec::JuiceFs);
    systems
}

/// Issue 13's create aim for the volume: this many creates within this many seconds.
const VOLUME_AIM_CREATES: u32 = 10_000;
const VOLUME_AIM_CREATE_SECONDS: f64 = 2.0;
/// Issue 14's for the volume on PostgreSQL: the same creates within this many seconds.
const POSTGRES_AIM_CREATE_SECONDS: f64 = 5.0;
/// Issue 15's for asynchronous directory operations on SQLite: the same creates within this
/// many seconds.
const ASYNC_AIM_CREATE_SECONDS: f64 = 1.0;
/// Issue 15's on PostgreSQL: creates and `rm -rf` at least this many times faster with
/// asynchronous directory operations than without.
const ASYNC_AIM_SPEEDUP_ON_POSTGRES: f64 = 5.0;
/// Issue 15's for the kernel untar on the volume: within this many times native tmpfs's time
/// (issue 13 asked 10x).
const ASYNC_AIM_UNTAR_SLOWDOWN: f64 = 6.0;
/// The label suffix of a volume row with asynchronous directory operations off.
const NO_ASYNC_DIROPS: &str = " no-async-dirops";
/// Issue 14's aim for two mounts creating in one directory: at least this many times one
/// mount's creates per second.
const TWO_MOUNTS_AIM_SPEEDUP: f64 = 1.5;
/// Files each mount creates in the shared-directory rows [quick: the second].
const SHARED_CREATE_FILES_EACH: (u32, u32) = (5000, 300);

pub fn plan_create(ctx: &Ctx) -> SuitePlan {
    let files: u32 = if ctx.settings.quick { 1000 } else { 10_000 };
    let mut result = SuiteResult::new(
        Suite::Create,
        "Creating small files",
        "Seed 003: `for i in `seq 1 N`; do echo \"foobarbaz\" > $DIR/$i; done` in one bash \
         (real time); then `ls -l` of the N files, as a user looks at what was made \
         (READDIRPLUS, and two getxattrs per file: its SELinux label and its ACL).",
    );
    let mut plans = plans_for(systems(ctx), &[create_and_list_workload(files)]);
    let files_each = if ctx.settings.quick {
        SHARED_CREATE_FILES_EACH.1
    } else {
        SHARED_CREATE_FILES_EACH.0
    };
    // One volume mounted twice: one mount creating alone, then both at once.
    plans.extend(plans_for(
        [SystemSpec::LanefsVolumePg {
            queues: ctx.settings.cores,
            // Cloned fds: there wherever the bench runs (io_uring may be off).
            uring: false,
            async_commit: false,
            async_dirops: true,
            mounts: 2,
            s3: false,
        }],
        &[
            shared_create_workload(files_each, 1),
            shared_create_workload(files_each, 2),
        ],
    ));
    result.skip("lanefs null: it cannot create files");
    result.note(format!(
        "Two mounts of one volume on PostgreSQL (two daemons): {files_each} files per mount \
         in one directory, by one mount alone and by both at once (one bash each, names \
         prefixed per mount), as aggregate creates/s; its server CPU is not shown (two \
         daemons)."
    ));
    result.note(
        "libfuse's passthrough examples, passthrough_hp and lanefs passthrough serve a \
         directory on the bench's tmpfs; passthrough_fh mirrors all of / and is used through \
         that path.",
    );
    result.note(
        "`ls -l` asks every file for two xattrs (security.selinux, system.posix_acl_access). \
         libfuse's passthrough_ll runs without `-o xattr`: it answers the first GETXATTR \
         ENOSYS, after which the kernel sends none at all, so its listing pays no per-file \
         round trips where lanefs, which serves xattrs and POSIX ACLs, pays two. No issue \
         sets an aim for this row.",
    );
    SuitePlan { result, plans }
}

/// Seed 003's create loop over `files` files, timed.
pub fn create_workload(files: u32) -> Workload {
    Workload {
        metrics: vec![Metric {
            key: format!("{files} x echo foobarbaz > $i"),
            family: "create".into(),
            unit: Unit::SECONDS,
        }],
        numjobs: 1,
        config: serde_json::json!({"tool": "bash", "files": files}),
        kind: Kind::Create {
            files,
            then_list: false,
        },
        caller: Caller::Bench,
    }
}

/// `create_workload`, then `ls -l` of the files, timed apart.
fn create_and_list_workload(files: u32) -> Workload {
    let mut workload = create_workload(files);
    workload.metrics.push(Metric {
        key: format!("ls -l of the {files} files"),
        family: "list".into(),
        unit: Unit::SECONDS,
    });
    workload.config["then"] = "ls -l".into();
    workload.kind = Kind::Create {
        files,
        then_list: true,
    };
    workload
}

/// Creates in one directory of one volume by `mounts` of its mounts at once.
fn shared_create_workload(files_each: u32, mounts: usize) -> Workload {
    let who = if mounts == 1 {
        "1 mount".to_owned()
    } else {
        format!("{mounts} mounts at once")
    };
    Workload {
        metrics: vec![Metric {
            key: format!("{SHARED_CREATE_PREFIX}{who}, {files_each} files each"),
            family: "create, mounts of one volume".into(),
            unit: Unit::CREATES,
        }],
        numjobs: 1,
        config: serde_json::json!({"tool": "bash", "files_each": files_each, "mounts": mounts}),
        kind: Kind::CreateShared { files_each, mounts },
        caller: Caller::Bench,
    }
}

/// The start of the shared-directory rows' workload names.
const SHARED_CREATE_PREFIX: &str = "creates in one directory by ";

/// Issue 14's two-mount aim: per system, both mounts' aggregate rate against one mount's.
fn two_mount_lines(result: &SuiteResult) -> Vec<String> {
    let workloads = workloads_of(result);
    let named = |by: &str| {
        workloads
            .iter()
            .find(|(w, _)| w.starts_with(&format!("{SHARED_CREATE_PREFIX}{by}")))
            .map(|(w, _)| w.clone())
    };
    let (Some(one), Some(two)) = (named("1 mount"), named("2 mounts")) else {
        return Vec::new();
    };
    let mut systems: Vec<&str> = result
        .rows
        .iter()
        .filter(|r| r.workload == two)
        .map(|r| r.system.as_str())
        .collect();
    systems.dedup();
    systems
        .into_iter()
        .filter_map(|system| {
            let median = |w: &str| best_median(result, w, |r| r.system == system);
            aim_line(
                &format!("{system}: creates in one directory"),
                &("2 mounts at once".to_owned(), median(&two)?.1),
                &("1 mount".to_owned(), median(&one)?.1),
                Unit::CREATES,
                TWO_MOUNTS_AIM_SPEEDUP,
                ">= 1.5x",
            )
        })
        .collect()
}

/// Issue 15's A/B on PostgreSQL: each volume row with asynchronous directory operations off
/// against the same configuration with them on (its label without the suffix).
fn async_speedup_lines(result: &SuiteResult, workload: &str, unit: Unit) -> Vec<String> {
    result
        .rows
        .iter()
        .filter(|r| r.workload == workload && is_on_postgres(&r.system))
        .filter_map(|r| r.system.strip_suffix(NO_ASYNC_DIROPS))
        .filter_map(|on| {
            let median = |system: &str| best_median(result, workload, |r| r.system == system);
            aim_line(
                &format!("{workload}, asynchronous vs synchronous directory operations"),
                &median(on)?,
                &median(&format!("{on}{NO_ASYNC_DIROPS}"))?,
                unit,
                ASYNC_AIM_SPEEDUP_ON_POSTGRES,
                ">= 5x on PostgreSQL (issue 15)",
            )
        })
        .collect()
}

/// Issue 3's aims for creates and untar: lanefs within 5x of native and at least 1.5x faster
/// than libfuse's passthrough_ll; io_uring faster than cloned fds (issue 4). Issue 13's for
/// the volume: 10,000 creates within 2 s, the untar within 10x native tmpfs; issue 15's:
/// the creates within 1 s and the untar within 6x with asynchronous directory operations, and
/// on PostgreSQL creates and `rm -rf` 5x faster with them than without.
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    for (workload, unit) in workloads_of(result) {
        // No issue sets an aim for the listing (see the suite's note).
        if workload.starts_with("ls -l ") {
            continue;
        }
        if workload == create_workload(VOLUME_AIM_CREATES).metrics[0].key {
            lines.extend(volume_target_lines(
                result,
                &workload,
                false,
                VOLUME_AIM_CREATE_SECONDS,
                "within 2 s (JuiceFS on SQLite: 13-24 s here)",
            ));
            lines.extend(volume_target_lines(
                result,
                &workload,
                true,
                POSTGRES_AIM_CREATE_SECONDS,
                "within 5 s on PostgreSQL (JuiceFS on PostgreSQL: 5.4 s per 1,000 here)",
            ));
            let async_on_sqlite = best_median(result, &workload, |r| {
                r.system.starts_with("lanefs volume")
                    && !is_on_postgres(&r.system)
                    && !r.system.ends_with(NO_ASYNC_DIROPS)
            });
            if let Some(ours) = &async_on_sqlite {
                lines.extend(aim_line(
                    &workload,
                    ours,
                    &("the aim".to_owned(), ASYNC_AIM_CREATE_SECONDS),
                    unit,
                    1.0,
                    "within 1.0 s with asynchronous directory operations (issue 15)",
                ));
            }
        }
        if workload == create_workload(VOLUME_AIM_CREATES).metrics[0].key
            || workload.starts_with("rm -rf ")
        {
            lines.extend(async_speedup_lines(result, &workload, unit));
        }
        if workload.starts_with("untar ") {
            let native = best_median(result, &workload, |r| {
                r.role == Role::Native && !r.system.starts_with("native disk")
            });
            let volume = best_median(result, &workload, |r| {
                r.system.starts_with("lanefs volume")
                    && !is_on_postgres(&r.system)
                    && !r.system.ends_with(NO_ASYNC_DIROPS)
            });
            if let (Some(volume), Some(native)) = (&volume, &native) {
                lines.extend(aim_line(
                    &workload,
                    volume,
                    native,
                    unit,
                    0.1,
                    "volume within 10x (>= 0.1x) of native tmpfs",
                ));
                lines.extend(aim_line(
                    &workload,
                    volume,
                    native,
                    unit,
                    1.0 / ASYNC_AIM_UNTAR_SLOWDOWN,
                    "volume within 6x (>= 0.17x) of native tmpfs (issue 15)",
                ));
            }
        }
        let ours = best_median(result, &workload, |r| {
            r.role == Role::Lanefs && !r.system.starts_with("lanefs volume")
        });
        let native = best_median(result, &workload, |r| {
            r.role == Role::Native && !r.system.starts_with("native disk")
        });
        let anchor = best_median(result, &workload, |r| r.system.contains("passthrough_ll"));
        if let Some(ours) = &ours {
            if let Some(native) = &native {
                lines.extend(aim_line(
                    &workload,
                    ours,
                    native,
                    unit,
                    0.2,
                    "within 5x (>= 0.2x) of native",
                ));
            }
            if let Some(anchor) = &anchor {
                lines.extend(aim_line(&workload, ours, anchor, unit, 1.5, ">= 1.5x"));
            }
        }
        lines.extend(uring_lines(result, &workload, unit, 1.0, ">= 1x"));
    }
    lines.extend(two_mount_lines(result));
    result.aims = lines;
}

/// Debian's linux-source tarball, if installed.
fn kernel_tarball() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-source-") && n.ends_with(".tar.xz"))
        })
        .collect();
    found.sort();
    found.pop()
}

fn tarball_dir(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("tarballs")
}

fn untar_workload(label: &str, tar: PathBuf, what: &str) -> Workload {
    let metric = |verb: &str| Metric {
        key: format!("{verb} {label}"),
        family: verb.to_owned(),
        unit: Unit::SECONDS,
    };
    Workload {
        metrics: vec![metric("untar"), metric("rm -rf")],
        numjobs: 1,
        config: serde_json::json!({"tool": "tar xf, then rm -rf", "tarball": tar,
            "what": what}),
        kind: Kind::Untar { tar, entries: None },
        caller: Caller::Bench,
    }
}

/// The generated tarball's file count.
fn generated_files(quick: bool) -> u32 {
    if quick { 2000 } else { 20_000 }
}

pub fn plan_untar(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let mut result = SuiteResult::new(
        Suite::Untar,
        "Untar and rm -rf of a source tree",
        "Seed 003: untar of a Linux kernel tarball (uncompressed beforehand), then rm -rf of \
         the tree; real time of each.",
    );
    let mut workloads = Vec::new();
    match (quick, kernel_tarball()) {
        (false, Some(xz)) => {
            let name = kernel_tar_name(&xz);
            workloads.push(untar_workload(
                &name.replace(".tar", ""),
                tarball_dir(ctx).join(&name),
                "Debian's linux-source",
            ));
        }
        (false, None) => {
            result.skip(
                "the kernel untar: Debian's linux-source is not installed (apt-get install \
                 linux-source puts /usr/src/linux-source-*.tar.xz in place); a generated \
                 tree stands in below",
            );
        }
        (true, _) => result.note("--quick: a small generated tarball instead of the kernel's"),
    }
    if quick || workloads.is_empty() {
        let n = generated_files(quick);
        workloads.push(untar_workload(
            &format!("generated tree ({n} files)"),
            generated_tarball(ctx, n),
            "generated by lanefs bench: files of 0..16 KiB in directories of 50",
        ));
    }
    let plans = plans_for(systems(ctx), &workloads);
    result.skip("lanefs null: it cannot create files");
    result.note(format!(
        "libfuse's passthrough_ll keeps an open fd per inode the kernel knows: on a kernel \
         tree it can run into the open-file limit (here {}) and tar fails (EMFILE, or errors \
         that follow from it); a failed run is reported with tar's error, and no workaround \
         (such as dropping the inode caches during the untar) is applied.",
        ctx.machine.open_file_limit
    ));
    SuitePlan { result, plans }
}

/// Makes the tarballs the plan needs (decompressing or generating them once, into the
/// cache) and counts their members; a workload whose tarball cannot be had is dropped with a
/// note.
pub fn prepare_tarballs(
    ctx: &mut Ctx,
    result: &mut SuiteResult,
    mut plans: Vec<Plan>,
) -> Vec<Plan> {
    let mut failed: Vec<PathBuf> = Vec::new();
    let mut tars: Vec<PathBuf> = Vec::new();
    for p in &plans {
        for w in &p.workloads {
            if let Kind::Untar { tar, .. } = &w.kind
                && !tars.contains(tar)
            {
                tars.push(tar.clone());
            }
        }
    }
    let mut entries: Vec<(PathBuf, u64)> = Vec::new();
    for tar in tars {
        match make_tarball(ctx, &tar).and_then(|()| tar_members(&tar)) {
            Ok(n) => entries.push((tar, n)),
            Err(e) => {
                result.skip(format!("untar of {}: {e}", tar.display()));
                failed.push(tar);
            }
        }
    }
    for p in &mut plans {
        p.workloads
            .retain(|w| !matches!(&w.kind, Kind::Untar { tar, .. } if failed.contains(tar)));
        for w in &mut p.workloads {
            if let Kind::Untar { tar, entries: n } = &mut w.kind {
                *n = entries.iter().find(|(t, _)| t == tar).map(|(_, n)| *n);
            }
        }
    }
    plans
}

/// Makes `tar` in the cache if it is not there: decompresses the kernel's, or generates a
/// tree.
pub(super) fn make_tarball(ctx: &mut Ctx, tar: &Path) -> Result<(), String> {
    if tar.exists() {
        Ok(())
    } else if tar
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("generated-"))
    {
        let files = generated_files(ctx.settings.quick);
        let scratch = ctx.work_path("tree");
        generate_tarball(&scratch, tar, files)
    } else {
        decompress_kernel(tar)
    }
}

/// The source tree the applications suite copies and makes its git history of: the kernel's
/// when installed (and not --quick), else the generated one; as (name, tarball).
pub(super) fn tree_tarball(ctx: &Ctx) -> (String, PathBuf) {
    let quick = ctx.settings.quick;
    match (quick, kernel_tarball()) {
        (false, Some(xz)) => {
            let name = kernel_tar_name(&xz);
            (name.replace(".tar", ""), tarball_dir(ctx).join(&name))
        }
        _ => {
            let n = generated_files(quick);
            (format!("generated-{n}"), generated_tarball(ctx, n))
        }
    }
}

/// The uncompressed name of Debian's kernel tarball.
fn kernel_tar_name(xz: &Path) -> String {
    xz.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("linux-source.tar.xz")
        .trim_end_matches(".xz")
        .to_owned()
}

/// Where the generated tree of `files` files is tarred in the cache.
fn generated_tarball(ctx: &Ctx, files: u32) -> PathBuf {
    tarball_dir(ctx).join(format!("generated-{files}.tar"))
}

/// How many members (files, directories, links) a tarball has: `tar -tf` lines.
fn tar_members(tar: &Path) -> Result<u64, String> {
    let out = Command::new("tar")
        .arg("-tf")
        .arg(tar)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("tar: {e}"))?;
    if !out.status.success() {
        return Err(format!("tar -tf failed ({})", out.status));
    }
    Ok(out.stdout.iter().filter(|&&b| b == b'\n').count() as u64)
}

fn decompress_kernel(tar: &Path) -> Result<(), String> {
    let name = tar
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("bad tarball name")?;
    let xz = Path::new("/usr/src").join(format!("{name}.xz"));
    std::fs::create_dir_all(tar.parent().unwrap_or(Path::new("."))).map_err(|e| e.to_string())?;
    let part = tar.with_extension("part");
    let out = std::fs::File::create(&part).map_err(|e| format!("{}: {e}", part.display()))?;
    let status = Command::new("xz")
        .arg("-dc")
        .arg(&xz)
        .stdout(out)
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("xz: {e} (apt-get install xz-utils)"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&part);
        return Err(format!("xz -dc {} failed ({status})", xz.display()));
    }
    std::fs::rename(&part, tar).map_err(|e| e.to_string())
}

/// A deterministic tree of `files` files (0..16 KiB) in directories of 50, tarred.
fn generate_tarball(scratch: &Path, tar: &Path, files: u32) -> Result<(), String> {
    let root = scratch.join("tree");
    let result = (|| -> std::io::Result<()> {
        let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
        let data = vec![b'x'; 16 << 10];
        for i in 0..files {
            let dir = root.join(format!("d{:03}/s{:02}", i / 1000, i / 50 % 20));
            if i % 50 == 0 {
                std::fs::create_dir_all(&dir)?;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % (16 << 10)) as usize;
            std::fs::write(dir.join(format!("f{i}.c")), &data[..len])?;
        }
        Ok(())
    })();
    let outcome = result
        .map_err(|e| format!("generating a tree: {e}"))
        .and_then(|()| {
            std::fs::create_dir_all(tar.parent().unwrap_or(Path::new(".")))
                .map_err(|e| e.to_string())?;
            let part = tar.with_extension("part");
            let status = Command::new("tar")
                .arg("-cf")
                .arg(&part)
                .arg("-C")
                .arg(&root)
                .arg(".")
                .status()
                .map_err(|e| format!("tar: {e}"))?;
            if !status.success() {
                return Err(format!("tar -cf failed ({status})"));
            }
            std::fs::rename(&part, tar).map_err(|e| e.to_string())
        });
    let _ = std::fs::remove_dir_all(scratch);
    outcome
}
