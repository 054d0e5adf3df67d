//! A shell that starts and stops the tests' servers (MinIO, PostgreSQL) for them, spawned
//! before any mount exists.
//!
//! Why not spawn them from the test itself: a child starts with a copy of the test's file
//! descriptors and closes them at exec (or exit), and each close of a file on a lanefs mount
//! is a FLUSH, which stores that file's unflushed data: in the very server a fault test has
//! just stopped. A test that started MinIO again while its writer thread held a file open
//! waited 30-120 s for the server (its exec waited for the FLUSH, the FLUSH for the server,
//! until the mount's retry bound gave up), and a call then took longer than its bound. The
//! launcher's copy of the descriptors was taken before the test opened anything on a mount.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Runs each line it reads as a shell command; at end of input, SIGKILLs the servers it
/// started in the background (`$servers`) and waits for them.
const SHELL: &str = r#"
servers=
while IFS= read -r command; do
    eval "$command"
done
[ -n "$servers" ] && kill -9 $servers 2>/dev/null
wait
"#;

pub struct Launcher {
    shell: Child,
    commands: Option<ChildStdin>,
    answers: BufReader<ChildStdout>,
}

/// `arg` quoted for the shell.
fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

fn quote_all(argv: &[&str]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

impl Launcher {
    /// A launcher whose commands all have `envs` in their environment.
    pub fn start(envs: &[(&str, &str)]) -> Result<Launcher, String> {
        let mut shell = Command::new("sh")
            .args(["-c", SHELL])
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting sh: {e}"))?;
        Ok(Launcher {
            commands: shell.stdin.take(),
            answers: BufReader::new(shell.stdout.take().unwrap()),
            shell,
        })
    }

    /// Sends one command line, which must echo one line, and returns that line; None when
    /// the launcher is gone (no panic: `run` serves drops).
    fn ask(&mut self, command: &str) -> Option<String> {
        writeln!(self.commands.as_mut()?, "{command}").ok()?;
        let mut answer = String::new();
        match self.answers.read_line(&mut answer) {
            Ok(n) if n > 0 => Some(answer.trim().to_owned()),
            _ => None,
        }
    }

    /// Runs `argv` in `dir` to its end, stdout and stderr into `output`; whether it succeeded
    /// (false, too, when the launcher is gone).
    pub fn run(&mut self, dir: &Path, argv: &[&str], output: &Path) -> bool {
        let status = self.ask(&format!(
            "(cd {} && exec {}) >{} 2>&1 </dev/null; echo $?",
            quote(utf8(dir)),
            quote_all(argv),
            quote(utf8(output))
        ));
        status.as_deref() == Some("0")
    }

    /// Starts `argv` in the background, stdout and stderr appended to `log`; its pid.
    pub fn spawn(&mut self, argv: &[&str], log: &Path) -> u32 {
        let pid = self.ask(&format!(
            "{} >>{} 2>&1 </dev/null & servers=\"$servers $!\"; echo $!",
            quote_all(argv),
            quote(utf8(log))
        ));
        let pid = pid.expect("the launcher ended");
        pid.parse()
            .unwrap_or_else(|_| panic!("the launcher answered {pid:?} for a pid"))
    }

    /// SIGKILLs a server `spawn` started (as a crash or a pulled cable would) and waits for
    /// it to be gone.
    pub fn kill(&mut self, pid: u32) {
        let answer = self.ask(&format!(
            "kill -9 {pid} 2>/dev/null; wait {pid} 2>/dev/null; left=; \
             for p in $servers; do [ \"$p\" = {pid} ] || left=\"$left $p\"; done; \
             servers=$left; echo killed"
        ));
        assert_eq!(
            answer.as_deref(),
            Some("killed"),
            "the launcher's answer to kill"
        );
    }
}

impl Drop for Launcher {
    /// Ends the launcher's input: it kills what it started and exits (pass or fail).
    fn drop(&mut self) {
        drop(self.commands.take());
        let _ = self.shell.wait();
    }
}
