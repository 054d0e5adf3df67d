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

/// A generic (file-system independent) option of mount(8) and the MS_* flag it sets or
/// clears. `ro`, `suid`, `dev`, `exec` and `noatime` also have `--flags` of their own and
/// are kept in those fields; the rest live in `MountArgs::vfs_flags`.
struct Generic {
    name: &'static str,
    set: libc::c_ulong,
    clear: libc::c_ulong,
}

const fn generic(name: &'static str, set: libc::c_ulong, clear: libc::c_ulong) -> Generic {
    Generic { name, set, clear }
}

/// The atime flags: setting one of them clears the others, as mount(8) does.
const ATIME_FLAGS: libc::c_ulong = libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME;

const GENERIC: &[Generic] = &[
    generic("sync", libc::MS_SYNCHRONOUS, 0),
    generic("async", 0, libc::MS_SYNCHRONOUS),
    generic("dirsync", libc::MS_DIRSYNC, 0),
    generic("mand", libc::MS_MANDLOCK, 0),
    generic("nomand", 0, libc::MS_MANDLOCK),
    generic("diratime", 0, libc::MS_NODIRATIME),
    generic("nodiratime", libc::MS_NODIRATIME, 0),
    generic("relatime", libc::MS_RELATIME, ATIME_FLAGS),
    generic("norelatime", 0, libc::MS_RELATIME),
    generic("strictatime", libc::MS_STRICTATIME, ATIME_FLAGS),
    generic("nostrictatime", 0, libc::MS_STRICTATIME),
    generic("lazytime", libc::MS_LAZYTIME, 0),
    generic("nolazytime", 0, libc::MS_LAZYTIME),
    generic("iversion", libc::MS_I_VERSION, 0),
    generic("noiversion", 0, libc::MS_I_VERSION),
    generic("silent", libc::MS_SILENT, 0),
    generic("loud", 0, libc::MS_SILENT),
    generic("symfollow", 0, libc::MS_NOSYMFOLLOW),
    generic("nosymfollow", libc::MS_NOSYMFOLLOW, 0),
];

/// Options of the FUSE kernel module that lanefs sets itself; mount(8) passes them back (from
/// /proc/self/mountinfo) when it remounts, where they cannot change and are ignored.
const FUSE_KERNEL_OPTIONS: &[&str] = &[
    "user_id", "group_id", "rootmode", "max_read", "blksize", "fd", "subtype",
];

/// Applies `-o` options to the mount arguments. Generic mount options set or clear their
/// MS_* flag; those that only matter to mount(8), fstab or systemd (auto, nofail, _netdev,
/// x-*, ...) are accepted and ignored. `remount` makes the command change the flags of an
/// existing mount (mount(8) runs `lanefs SOURCE MOUNTPOINT -o remount,...`), and then
/// every other option it passes back is accepted: those that cannot change are ignored.
pub fn apply(args: &mut MountArgs, lists: &[String]) -> Result<(), String> {
    let options: Vec<String> = lists.iter().flat_map(|l| split_options(l)).collect();
    if options.iter().any(|o| o == "remount") {
        args.remount = true;
    }
    for option in &options {
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
        if let Some(g) = GENERIC.iter().find(|g| g.name == key && value.is_none()) {
            args.vfs_flags = (args.vfs_flags & !g.clear) | g.set;
            if g.set & ATIME_FLAGS != 0 {
                args.noatime = false;
            }
            continue;
        }
        match key {
            "remount" => {}
            k if args.remount && FUSE_KERNEL_OPTIONS.contains(&k) => {}
            "queues" => args.queues = Some(number("N")? as usize),
            "transport" => args.transport = Some(need("auto|uring|dev")?.parse()?),
            "queue_depth" => args.queue_depth = Some(number("N")? as usize),
            "pin" => args.pin = true,
            "no_parallel_writes" => args.no_parallel_writes = true,
            "size" => args.size = Some(parse_size(need("SIZE")?)?),
            "capacity" => args.capacity = Some(parse_size(need("SIZE")?)?),
            "dirty_max" => args.dirty_max = Some(parse_size(need("SIZE")?)?),
            "async_commit" => args.async_commit = true,
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
            "no_flush_on_close" | "noflush" => args.no_flush_on_close = true,
            "no_async_dirops" => args.no_async_dirops = true,
            "intent_dir" => args.intent_dir = Some(need("DIR")?.into()),
            "async_backlog" => args.async_backlog = Some(number("N")?),
            "db_wait" => args.db_wait = Some(parse_seconds(need("SECS")?)?),
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
            "atime" => args.noatime = false,
            "noatime" => {
                args.noatime = true;
                args.vfs_flags &= !ATIME_FLAGS;
            }
            // For mount(8), fstab and systemd only.
            "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner" | "group"
            | "_netdev" | "nofail" => {}
            // SELinux labels: FUSE has no security labels of its own.
            "context" | "fscontext" | "defcontext" | "rootcontext" => {
                tracing::warn!("mount option {key}: FUSE mounts carry no SELinux labels; ignored")
            }
            k if k.starts_with("x-") || k.starts_with("X-") || k.starts_with("comment") => {}
            _ => return Err(format!("unknown mount option {option:?}")),
        }
    }
    Ok(())
}

/// The MS_* flags of a mount: nosuid and nodev unless `suid`/`dev` were asked for (as
/// fusermount3 does), plus every generic flag but `mand`, which the kernel's FUSE refuses
/// (EINVAL) where other file systems warn and ignore it (`limits_of` says so).
pub fn mount_flags(args: &MountArgs) -> libc::c_ulong {
    let mut flags = args.vfs_flags & !libc::MS_MANDLOCK;
    for (set, flag) in [
        (!args.suid, libc::MS_NOSUID),
        (!args.dev, libc::MS_NODEV),
        (args.read_only, libc::MS_RDONLY),
        (args.noexec, libc::MS_NOEXEC),
        (args.noatime, libc::MS_NOATIME),
    ] {
        if set {
            flags |= flag;
        }
    }
    flags
}

/// One sentence for each generic flag that FUSE accepts but cannot give its full meaning.
pub fn limits_of(flags: libc::c_ulong) -> Vec<&'static str> {
    [
        (
            libc::MS_MANDLOCK,
            "mand: Linux has no mandatory locking since 5.15; ignored, as for any file system",
        ),
        (
            libc::MS_DIRSYNC,
            "dirsync: FUSE does not make directory changes synchronous itself; the daemon applies \
             them to the host before answering, so they are as durable as the host's mount makes them",
        ),
        (
            libc::MS_LAZYTIME,
            "lazytime: FUSE keeps no timestamps to write back lazily (the daemon's host does); \
             the flag is set but changes nothing",
        ),
        (
            libc::MS_I_VERSION,
            "iversion: FUSE keeps no inode change counter; the kernel ignores the flag",
        ),
    ]
    .into_iter()
    .filter(|(flag, _)| flags & flag != 0)
    .map(|(_, why)| why)
    .collect()
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
    fn no_flush_on_close_in_both_spellings() {
        for spelling in ["no_flush_on_close", "noflush"] {
            let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
            assert!(!w.args.no_flush_on_close);
            apply(&mut w.args, &[format!("rw,{spelling}")]).unwrap();
            assert!(w.args.no_flush_on_close, "{spelling}");
        }
        let w = Wrapper::parse_from(["t", "--no-flush-on-close", "/srv", "/mnt"]);
        assert!(w.args.no_flush_on_close);
    }

    #[test]
    fn no_async_dirops_as_flag_and_option() {
        let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
        assert!(!w.args.no_async_dirops);
        apply(&mut w.args, &["rw,no_async_dirops".into()]).unwrap();
        assert!(w.args.no_async_dirops);
        let w = Wrapper::parse_from(["t", "--no-async-dirops", "/srv", "/mnt"]);
        assert!(w.args.no_async_dirops);
    }

    #[test]
    fn intent_dir_as_flag_and_option() {
        let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
        assert_eq!(w.args.intent_dir, None);
        apply(&mut w.args, &["rw,intent_dir=/var/tmp/il".into()]).unwrap();
        assert_eq!(
            w.args.intent_dir.as_deref(),
            Some(std::path::Path::new("/var/tmp/il"))
        );
        let w = Wrapper::parse_from(["t", "--intent-dir", "/l", "/srv", "/mnt"]);
        assert_eq!(
            w.args.intent_dir.as_deref(),
            Some(std::path::Path::new("/l"))
        );
    }

    #[test]
    fn async_backlog_and_db_wait_as_flags_and_options() {
        let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
        assert_eq!((w.args.async_backlog, w.args.db_wait), (None, None));
        apply(&mut w.args, &["async_backlog=100,db_wait=2.5".into()]).unwrap();
        assert_eq!(
            (w.args.async_backlog, w.args.db_wait),
            (Some(100), Some(2.5))
        );
        assert!(apply(&mut w.args, &["async_backlog=many".into()]).is_err());
        assert!(apply(&mut w.args, &["db_wait=-1".into()]).is_err());
        let w = Wrapper::parse_from(["t", "--async-backlog", "7", "--db-wait", "1", "/s", "/m"]);
        assert_eq!((w.args.async_backlog, w.args.db_wait), (Some(7), Some(1.0)));
    }

    #[test]
    fn generic_options_set_and_clear_their_flags() {
        let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
        apply(
            &mut w.args,
            &["noatime,sync,dirsync,nodiratime,lazytime,iversion,nosymfollow,mand,suid".into()],
        )
        .unwrap();
        let flags = mount_flags(&w.args);
        for flag in [
            libc::MS_NOATIME,
            libc::MS_SYNCHRONOUS,
            libc::MS_DIRSYNC,
            libc::MS_NODIRATIME,
            libc::MS_LAZYTIME,
            libc::MS_I_VERSION,
            libc::MS_NOSYMFOLLOW,
            libc::MS_NODEV,
        ] {
            assert_ne!(flags & flag, 0, "{flag:#x}");
        }
        // FUSE refuses mand: never passed, but said.
        assert_eq!(flags & (libc::MS_MANDLOCK | libc::MS_NOSUID), 0);
        assert_eq!(limits_of(w.args.vfs_flags).len(), 4);
        apply(&mut w.args, &["strictatime,async,diratime".into()]).unwrap();
        let flags = mount_flags(&w.args);
        assert_eq!(
            flags & (ATIME_FLAGS | libc::MS_SYNCHRONOUS | libc::MS_NODIRATIME),
            libc::MS_STRICTATIME
        );
        apply(&mut w.args, &["relatime".into()]).unwrap();
        assert_eq!(mount_flags(&w.args) & ATIME_FLAGS, libc::MS_RELATIME);
        assert!(!w.args.remount);
    }

    #[test]
    fn remount_accepts_what_mount_8_passes_back() {
        let mut w = Wrapper::parse_from(["t", "/srv", "/mnt"]);
        // user_id and friends are lanefs's own business on a new mount.
        assert!(apply(&mut w.args, &["user_id=0".into()]).is_err());
        apply(
            &mut w.args,
            &["ro,nosuid,nodev,noatime,remount,user_id=0,group_id=0,default_permissions,allow_other,queues=2".into()],
        )
        .unwrap();
        assert!(w.args.remount && w.args.read_only && w.args.noatime);
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
