//! What a user sees when something is wrong: every refusal reaches the terminal whichever
//! form started the mount, `lanefs umount` of a dead mount returns at once, logs that are not
//! a terminal carry no colour codes, and `--help` describes every argument.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Mount, TempDir, is_mounted};

fn lanefs(args: &[&str]) -> Output {
    Command::new(common::lanefs()).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An invalid option in daemon mode (and in the mount(8) form, which always daemonizes) is
/// explained on the terminal, as in the foreground: not "the daemon exited".
#[test]
fn invalid_options_are_explained_in_every_form() {
    let dir = TempDir::new("badopt");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let mp = mp.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["mount", "--daemon", "--max-write", "4M", "null:", mp],
            "--max-write",
        ),
        (
            &["mount", "--daemon", "--queues", "0", "null:", mp],
            "--queues 0",
        ),
        (
            &["mount", "--daemon", "-o", "queue_depth=0", "null:", mp],
            "--queue-depth 0",
        ),
        (&["null:", mp, "-o", "queue_depth=0"], "--queue-depth 0"),
        (&["null:", mp, "-o", "max_write=3000"], "--max-write"),
    ];
    for (args, reason) in cases {
        let out = lanefs(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} mounted");
        assert!(err.contains(reason), "{args:?}: {err}");
        assert!(!err.contains("exited"), "{args:?}: {err}");
        assert!(!is_mounted(std::path::Path::new(mp)));
    }
}

/// A failure that only the daemon can see (here: the mount point vanished after the parent
/// checked the options) still reaches the terminal with its reason.
#[test]
fn a_failure_inside_the_daemon_reaches_the_terminal() {
    let dir = TempDir::new("daemonfail");
    let missing = dir.path().join("missing");
    let out = lanefs(&["mount", "--daemon", "null:", missing.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn a_forgotten_colon_gets_a_hint() {
    let dir = TempDir::new("colon");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    for daemon in [false, true] {
        let mut args = vec!["mount"];
        if daemon {
            args.push("--daemon");
        }
        args.extend(["null", mp.to_str().unwrap()]);
        let out = Command::new(common::lanefs())
            .args(&args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("did you mean `null:`"),
            "{}",
            stderr(&out)
        );
    }
}

/// The daemon of a dead mount was killed (and may be a zombie its parent has not reaped):
/// `lanefs umount` must not wait for it.
#[test]
fn umount_of_a_dead_mount_returns_at_once() {
    let m = Mount::null(&[]);
    common::kill_daemon_leaving_a_dead_mount(m.pid, &m.mountpoint);
    let start = Instant::now();
    let out = lanefs(&["umount", m.mountpoint.to_str().unwrap()]);
    let took = start.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("has not exited"), "{}", stderr(&out));
    // The old code waited out its whole 10 s bound for the dead daemon's socket.
    assert!(took < Duration::from_secs(3), "lanefs umount took {took:?}");
    assert!(!is_mounted(&m.mountpoint));
}

/// A log that is a file gets plain text, no ANSI colour sequences.
#[test]
fn a_log_file_has_no_colour_codes() {
    let dir = TempDir::new("log");
    let log = dir.path().join("lanefs.log");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let out = Command::new(common::lanefs())
        .args(["mount", "--daemon", "--log", log.to_str().unwrap(), "null:"])
        .arg(&mp)
        .env("LANEFS_LOG", "debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::metadata(mp.join("data"));
    let umount = lanefs(&["umount", mp.to_str().unwrap()]);
    assert!(umount.status.success(), "{}", stderr(&umount));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.is_empty(), "debug logging wrote nothing");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in the log: {text:?}"
    );
}

#[test]
fn mount_help_describes_every_argument() {
    let out = lanefs(&["mount", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    // An entry (`  -x, --name <V>` or `  <ARG>`) has its description after it on the same
    // line or, in clap's long layout, on the next, more deeply indented line.
    let lines: Vec<&str> = help.lines().collect();
    let mut entries = 0;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        // `  -d, --daemon`, `      --transport <T>` (no short form), `  <SOURCE>`.
        if !(indent == 2 || indent == 6) || !(trimmed.starts_with('-') || trimmed.starts_with('<'))
        {
            continue;
        }
        entries += 1;
        let same_line = trimmed
            .split_once("  ")
            .is_some_and(|(_, d)| !d.trim().is_empty());
        let next_line = lines.get(i + 1).is_some_and(|next| {
            let t = next.trim_start();
            next.len() - t.len() > 6 && !t.is_empty()
        });
        assert!(
            same_line || next_line,
            "`{trimmed}` has no description:\n{help}"
        );
    }
    assert!(entries > 20, "no entries found in:\n{help}");
    assert!(help.contains("/dev/fuse transport: pin"), "{help}");
}
