//! The `-o opt,opt=value` mount options (the form mount(8), mount.fuse3 and fstab pass), and
//! sizes written with binary suffixes.

use crate::mount_cmd::MountArgs;

/// Parses `4k`, `1M`, `1T`, `512` (binary multiples).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (examples: 4096, 64k, 1M, 1T)"))?;
    let shift = match suffix
        .to_ascii_lowercase()
        .trim_end_matches("ib")
        .trim_end_matches('b')
    {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => return Err(format!("{text:?}: unknown size suffix {suffix:?}")),
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a duration in seconds (`1`, `0.5`, `0`): finite, not negative, at most a year.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds (examples: 1, 0.5, 0)"))?;
    if !secs.is_finite() || !(0.0..=31_536_000.0).contains(&secs) {
        return Err(format!("{text:?}: use 0 to 31536000 seconds"));
    }
    Ok(secs)
}

/// Splits a `-o` value on commas, honouring backslash escapes.
fn split_options(list: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    out.last_mut().expect("never empty").push(next);
                }
            }
            ',' => out.push(String::new()),
            c => out.last_mut().expect("never empty").push(c),
        }
    }
    out.retain(|o| !o.is_empty());
    out
}

/// Applies `-o` options to the mount arguments. Generic mount options that only matter to
/// mount(8) or fstab (auto, nofail, _netdev, x-*, ...) are accepted and ignored.
pub fn apply(args: &mut MountArgs, lists: &[String]) -> Result<(), String> {
    for option in lists.iter().flat_map(|l| split_options(l)) {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option.as_str(), None),
        };
        let need = |what: &str| -> Result<&str, String> {
            value.ok_or_else(|| format!("mount option {key} needs a value ({key}={what})"))
        };
        let number = |what: &str| -> Result<u64, String> {
            need(what)?.parse().map_err(|_| {
                format!(
                    "mount option {key}: {:?} is not a number",
                    value.unwrap_or("")
                )
            })
        };
        match key {
            "queues" => args.queues = Some(number("N")? as usize),
            "transport" => args.transport = Some(need("auto|uring|dev")?.parse()?),
            "queue_depth" => args.queue_depth = Some(number("N")? as usize),
            "pin" => args.pin = true,
            "no_parallel_writes" => args.no_parallel_writes = true,
            "size" => args.size = Some(parse_size(need("SIZE")?)?),
            "capacity" => args.capacity = Some(parse_size(need("SIZE")?)?),
            "max_write" => args.max_write = Some(parse_size(need("SIZE")?)?),
            "poll_us" => args.poll_us = Some(number("MICROSECONDS")?),
            "max_background" => args.max_background = Some(number("N")? as u16),
            "log" => args.log = Some(need("FILE")?.into()),
            "direct_io" => args.direct_io = true,
            "no_passthrough" => args.no_passthrough = true,
            "attr_timeout" => args.attr_timeout = Some(parse_seconds(need("SECS")?)?),
            "entry_timeout" => args.entry_timeout = Some(parse_seconds(need("SECS")?)?),
            "fd_cache" => args.fd_cache = Some(number("N")? as usize),
            "no_killpriv_v2" => args.no_killpriv_v2 = true,
            "no_file_handles" => args.no_file_handles = true,
            "allow_other" => args.allow_other = true,
            "default_permissions" => args.default_permissions = true,
            "fsname" => args.fsname = Some(need("NAME")?.to_owned()),
            "ro" => args.read_only = true,
            "rw" => args.read_only = false,
            "suid" => args.suid = true,
            "nosuid" => args.suid = false,
            "dev" => args.dev = true,
            "nodev" => args.dev = false,
            "exec" => args.noexec = false,
            "noexec" => args.noexec = true,
            "atime" | "relatime" => args.noatime = false,
            "noatime" => args.noatime = true,
            // For mount(8), fstab and systemd only.
            "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner" | "_netdev"
            | "nofail" | "async" | "sync" => {}
            k if k.starts_with("x-") || k.starts_with("comment") => {}
            _ => return Err(format!("unknown mount option {option:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert!(parse_size("1x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999P").is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("1"), Ok(1.0));
        assert_eq!(parse_seconds("0.25"), Ok(0.25));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn passthrough_options() {
        let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
        apply(
            &mut w.args,
            &["direct_io,no_passthrough,attr_timeout=2.5,entry_timeout=0,fd_cache=10,no_killpriv_v2,no_file_handles".into()],
        )
        .unwrap();
        let a = &w.args;
        assert!(a.direct_io && a.no_passthrough && a.no_killpriv_v2 && a.no_file_handles);
        assert_eq!(
            (a.attr_timeout, a.entry_timeout, a.fd_cache),
            (Some(2.5), Some(0.0), Some(10))
        );
    }

    #[test]
    fn splits_with_escapes() {
        assert_eq!(split_options("a,b=1,,c\\,d"), vec!["a", "b=1", "c,d"]);
    }

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: MountArgs,
    }

    #[test]
    fn applies_mount_fuse3_options() {
        let mut w = Wrapper::parse_from(["t", "null:", "/mnt"]);
        apply(
            &mut w.args,
            &[
                "rw,nosuid,queues=4,pin,size=1G,no_parallel_writes,_netdev,x-systemd.automount"
                    .into(),
            ],
        )
        .unwrap();
        assert_eq!(w.args.queues, Some(4));
        assert!(w.args.pin && w.args.no_parallel_writes && !w.args.suid);
        assert_eq!(w.args.size, Some(1 << 30));
        assert!(
            apply(&mut w.args, &["frobnicate".into()])
                .unwrap_err()
                .contains("frobnicate")
        );
        assert!(
            apply(&mut w.args, &["queues".into()])
                .unwrap_err()
                .contains("queues=N")
        );
        assert!(apply(&mut w.args, &["queues=x".into()]).is_err());
        apply(&mut w.args, &["transport=uring,queue_depth=8".into()]).unwrap();
        assert_eq!(w.args.transport, Some(lanefs_fuse::Transport::Uring));
        assert_eq!(w.args.queue_depth, Some(8));
        assert!(apply(&mut w.args, &["transport=tcp".into()]).is_err());
    }
}
