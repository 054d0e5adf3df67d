//! Issue 16: the applications users run. A PostgreSQL load and pgbench run, an SQLite
//! import, git (clone, status cold and warm, checkout between distant commits), `cp -a` of a
//! source tree onto the mount and back, and a C build; on native tmpfs, lanefs passthrough
//! (both transports, defaults), the volume (both transports), libfuse's passthrough_ll and
//! passthrough_hp (given by path), and JuiceFS (given by path).

use std::path::PathBuf;

use super::{SuitePlan, aim_line_all, bar, best_median, passthrough_hp, plans_for, volumes};
use crate::bench::Suite;
use crate::bench::anchors::Example;
use crate::bench::apps::{self, App};
use crate::bench::model::{Role, Status, SuiteResult, Unit};
use crate::bench::runner::{Ctx, Plan};
use crate::bench::systems::{Mode, SystemSpec};
use crate::bench::workloads::{Caller, Kind, Metric, Workload};

/// Commits in the git history made from the source tree (--quick: fewer).
const HISTORY_COMMITS: usize = 200;
const QUICK_HISTORY_COMMITS: usize = 10;
/// Rows of the SQLite import.
const SQLITE_ROWS: u64 = 1_000_000;
const QUICK_SQLITE_ROWS: u64 = 20_000;
/// The Debian source package built by the build row.
const BUILD_PACKAGE: &str = "fio";

fn metric(key: String, family: &str, unit: Unit) -> Metric {
    Metric {
        key,
        family: family.to_owned(),
        unit,
    }
}

fn app_workload(metrics: Vec<Metric>, app: App, config: serde_json::Value) -> Workload {
    Workload {
        metrics,
        numjobs: 1,
        config,
        kind: Kind::App(app),
        caller: Caller::Bench,
    }
}

fn apps_dir(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("apps")
}

/// The tree `cp -a` copies and git's history is made of: the kernel's (Debian's
/// linux-source) when installed and not --quick, else the generated one the untar suite
/// uses; as (name, tarball).
fn tree_source(ctx: &Ctx) -> (String, PathBuf) {
    super::files::tree_tarball(ctx)
}

pub fn plan(ctx: &Ctx) -> SuitePlan {
    let quick = ctx.settings.quick;
    let cores = ctx.settings.cores as u32;
    let mut result = SuiteResult::new(
        Suite::Apps,
        "Applications: a database, git, cp -a, a build",
        "Issue 16: PostgreSQL (data directory on the mount, fsync on) `pgbench -i` load time \
         and `pgbench -c 4 -j 2` TPS; an SQLite import of a generated table (WAL); git clone \
         of a local repository with a history, git status cold and warm, git checkout \
         between distant commits; cp -a of a source tree onto the mount and back; make -j \
         of a C project from Debian's source packages.",
    );
    let (scale, seconds) = if quick { (1, 2) } else { (20, 20) };
    let (tree_name, _) = tree_source(ctx);
    let commits = if quick {
        QUICK_HISTORY_COMMITS
    } else {
        HISTORY_COMMITS
    };
    let rows = if quick {
        QUICK_SQLITE_ROWS
    } else {
        SQLITE_ROWS
    };
    let dir = apps_dir(ctx);
    let build_name = if quick {
        "a generated C project (--quick)".to_owned()
    } else {
        format!("{BUILD_PACKAGE} (Debian source)")
    };
    let workloads = vec![
        app_workload(
            vec![
                metric(
                    format!("pgbench -i -s {scale} (load)"),
                    "pgbench load",
                    Unit::SECONDS,
                ),
                metric(
                    format!("pgbench -c 4 -j 2 -T {seconds}"),
                    "pgbench TPS",
                    Unit::TPS,
                ),
            ],
            App::Pgbench {
                scale,
                clients: 4,
                threads: 2,
                seconds,
            },
            serde_json::json!({"tool": "pgbench", "scale": scale, "clients": 4, "threads": 2,
                "seconds": seconds, "fsync": "on"}),
        ),
        app_workload(
            vec![metric(
                format!("sqlite3 import of {rows} rows (WAL)"),
                "sqlite import",
                Unit::SECONDS,
            )],
            App::SqliteImport {
                csv: dir.join(format!("rows-{rows}.csv")),
                rows,
            },
            serde_json::json!({"tool": "sqlite3 .import", "rows": rows, "journal": "WAL"}),
        ),
        app_workload(
            [
                "git clone",
                "git status, cold",
                "git status, warm",
                "git checkout, far and back",
            ]
            .into_iter()
            .map(|what| metric(format!("{what} ({tree_name})"), what, Unit::SECONDS))
            .collect(),
            App::Git {
                repo: dir.join(format!("history-{tree_name}-{commits}.git")),
                old: String::new(),
                files: 0,
            },
            serde_json::json!({"tool": "git", "tree": tree_name, "commits": commits}),
        ),
        app_workload(
            ["cp -a onto the mount", "cp -a back to tmpfs"]
                .into_iter()
                .map(|what| metric(format!("{what} ({tree_name})"), what, Unit::SECONDS))
                .collect(),
            App::CopyTree {
                tree: dir.join(format!("tree-{tree_name}")),
                files: 0,
            },
            serde_json::json!({"tool": "cp -a", "tree": tree_name}),
        ),
        app_workload(
            vec![metric(
                format!("make -j{cores} of {build_name}"),
                "build",
                Unit::SECONDS,
            )],
            App::Build {
                source: PathBuf::new(),
                jobs: cores,
            },
            serde_json::json!({"tool": "make", "jobs": cores, "project": build_name}),
        ),
    ];
    let mut systems = vec![SystemSpec::NativeTmpfs];
    for uring_depth in [None, Some(lanefs_fuse::uring::DEFAULT_QUEUE_DEPTH)] {
        systems.push(SystemSpec::LanefsPassthrough {
            queues: ctx.settings.cores,
            parallel_writes: true,
            kernel_passthrough: true,
            uring_depth,
        });
    }
    systems.extend(volumes(ctx.settings.cores));
    systems.push(SystemSpec::Libfuse {
        example: Example::PassthroughLl,
        mode: Mode::Multi,
    });
    systems.extend(passthrough_hp(false));
    systems.push(SystemSpec::JuiceFs);
    result.skip("lanefs null: it cannot create files");
    result.note(
        "Every system runs with its defaults (lanefs: no option beyond the transport). The \
         inputs are made once into the bench's cache on the native disk: the tree, its git \
         history (a commit per slice of the sorted file list, every tenth also changing a \
         file of each earlier slice), the CSV table and the build's source (`apt-get \
         source`). PostgreSQL runs as its own user, so mounts without allow_other (libfuse's \
         examples) cannot host it.",
    );
    SuitePlan {
        result,
        plans: plans_for(systems, &workloads),
    }
}

/// Makes the inputs the plan needs, once, into the cache; fills in what only making them
/// tells (file counts, the old commit); drops a workload whose input cannot be had, with a
/// note.
pub fn prepare(ctx: &mut Ctx, result: &mut SuiteResult, mut plans: Vec<Plan>) -> Vec<Plan> {
    let dir = apps_dir(ctx);
    let quick = ctx.settings.quick;
    let (tree_name, tarball) = tree_source(ctx);
    let made_tarball = super::files::make_tarball(ctx, &tarball);
    let tree_dir = dir.join(format!("tree-{tree_name}"));
    let tree = made_tarball.and_then(|()| apps::extracted_tree(&tarball, &tree_dir));
    let commits = if quick {
        QUICK_HISTORY_COMMITS
    } else {
        HISTORY_COMMITS
    };
    let history = tree.clone().and_then(|files| {
        let repo = dir.join(format!("history-{tree_name}-{commits}.git"));
        apps::history_repo(&tree_dir, &repo, commits).map(|old| (old, files))
    });
    let build = if quick {
        apps::small_c_project(&dir, 40)
    } else {
        apps::debian_source(&dir.join("source"), BUILD_PACKAGE)
    };
    let mut failed: Vec<String> = Vec::new();
    for p in &mut plans {
        p.workloads.retain_mut(|w| {
            let Kind::App(app) = &mut w.kind else {
                return true;
            };
            let made = match app {
                App::Pgbench { .. } => Ok(()),
                App::SqliteImport { csv, rows } => apps::csv_rows(csv, *rows),
                App::Git { old, files, .. } => history.clone().map(|(o, n)| {
                    *old = o;
                    *files = n;
                }),
                App::CopyTree { files, .. } => tree.clone().map(|n| *files = n),
                App::Build { source, .. } => build.clone().map(|s| *source = s),
            };
            match made {
                Ok(()) => true,
                Err(e) => {
                    let why = format!("{}: {e}", w.title());
                    if !failed.contains(&why) {
                        failed.push(why);
                    }
                    false
                }
            }
        });
    }
    for why in failed {
        result.skip(why);
    }
    plans
}

/// Issue 16's aims: lanefs passthrough within 1.2x native tmpfs on the database rows and 3x
/// on the rest, and faster than every anchor; the volume within 5x native, and 5x JuiceFS
/// on the rows its users complained of (git clone, cp -a, the build).
pub fn aims(result: &mut SuiteResult) {
    let mut lines = Vec::new();
    let workloads: Vec<(String, Unit)> = super::workloads_of(result);
    for (workload, unit) in workloads {
        let native = best_median(result, &workload, |r| r.role == Role::Native);
        let database = workload.starts_with("pgbench") || workload.starts_with("sqlite3");
        let anchors: Vec<(String, f64)> = result
            .rows
            .iter()
            .filter(|r| r.workload == workload && r.role == Role::Anchor && r.status == Status::Ok)
            .filter_map(|r| Some((r.system.clone(), r.summary?.median)))
            .collect();
        let juicefs = best_median(result, &workload, |r| r.system.starts_with("JuiceFS"));
        let complained = ["git clone", "cp -a onto", "make -j"]
            .iter()
            .any(|w| workload.starts_with(w));
        let ours: Vec<(String, f64)> = result
            .rows
            .iter()
            .filter(|r| r.workload == workload && r.role == Role::Lanefs && r.status == Status::Ok)
            .filter_map(|r| Some((r.system.clone(), r.summary?.median)))
            .collect();
        for row in &ours {
            if row.0.starts_with("lanefs passthrough") {
                let (at_least, within) = if database {
                    (1.0 / 1.2, "1.2x")
                } else {
                    (1.0 / 3.0, "3x")
                };
                let mut bars = vec![bar("native tmpfs", native.as_ref(), at_least)];
                bars.extend(anchors.iter().map(|a| bar(&a.0, Some(a), 1.0)));
                lines.push(aim_line_all(
                    &workload,
                    row,
                    &bars,
                    unit,
                    &format!("within {within} of native tmpfs and faster than every anchor"),
                ));
            } else if row.0.starts_with("lanefs volume") {
                let mut bars = vec![bar("native tmpfs", native.as_ref(), 0.2)];
                let mut aim = "within 5x of native tmpfs".to_owned();
                if complained {
                    bars.push(bar("JuiceFS", juicefs.as_ref(), 5.0));
                    aim.push_str(" and 5x JuiceFS");
                }
                lines.push(aim_line_all(&workload, row, &bars, unit, &aim));
            }
        }
    }
    result.aims = lines;
}
