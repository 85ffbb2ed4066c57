//! The FUSE mount: a directory of the namespace as a POSIX directory (`tidemark mount`), on the
//! `fuser` crate (no libfuse at build time; `fusermount3` mounts it where unprivileged).
//!
//! It is a client of the filer like the shell. What it has read (entries, listings) it keeps,
//! and the kernel keeps attributes, names and pages, until the filer's change log — followed
//! with the long poll every client has — says a path changed: then both are invalidated
//! (FUSE `notify_inval_entry` / `notify_inval_inode`). So an object put in the bucket shows in
//! `ls` as soon as its event is applied, while unchanged metadata costs no filer call.

mod fuse;
pub mod inodes;
#[cfg(test)]
mod model_test;
mod open;
mod ops;
mod read;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, INodeNo, MountOption, SessionACL};

use tidemark_core::{Error, Filer};

pub use ops::{Caller, Counters, Opened, Options, SetAttr, TidemarkFs};

#[derive(Debug, Clone)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    /// The namespace directory shown at the mount's root.
    pub root: String,
    pub read_only: bool,
    pub allow_other: bool,
    pub ttl: Duration,
    pub timeout: Duration,
    /// Let the kernel read files opened read-only straight from the filer's files when they are
    /// on this machine (FUSE passthrough).
    pub passthrough: bool,
    /// Where the bytes of a file whose last close could not store them are kept (see
    /// [`fs::Options::unsaved_dir`]).
    pub unsaved_dir: PathBuf,
}

/// The default `--unsaved-dir`: `$XDG_STATE_HOME/tidemark/unsaved`, else
/// `~/.local/state/tidemark/unsaved`, else `/var/tmp/tidemark-unsaved`.
pub fn default_unsaved_dir() -> PathBuf {
    let state = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).filter(|p| p.is_absolute()).or_else(|| {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")).filter(|p| p.is_absolute())
    });
    match state {
        Some(s) => s.join("tidemark/unsaved"),
        None => PathBuf::from("/var/tmp/tidemark-unsaved"),
    }
}

/// Why a mount point cannot be used, with what to do about it.
pub fn check_mountpoint(p: &Path) -> Result<(), String> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{}: not a directory", p.display())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(format!(
            "{} is left over from a mount whose process died (\"{e}\"): clear it with `fusermount3 -u {}` (or `umount {}` as root)",
            p.display(),
            p.display(),
            p.display()
        )),
        Err(e) => Err(format!("{}: {e} (create the directory first)", p.display())),
    }
}

/// What the kernel must forget of one changed path.
struct Invalidation {
    entry: Option<(u64, String)>,
    own: Option<u64>,
}

/// Tells the kernel, on a thread of its own: a notification can wait on a directory lock that
/// an operation in flight holds, and that operation may need the async runtime to finish.
fn notify_thread(notifier: fuser::Notifier) -> std::sync::mpsc::Sender<Invalidation> {
    let (tx, rx) = std::sync::mpsc::channel::<Invalidation>();
    std::thread::spawn(move || {
        for inv in rx {
            // Errors here only mean the kernel did not hold the name or inode.
            if let Some((parent, name)) = &inv.entry {
                let _ = notifier.inval_entry(INodeNo(*parent), name.as_ref());
                let _ = notifier.inval_inode(INodeNo(*parent), 0, 0);
            }
            if let Some(ino) = inv.own {
                let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
            }
        }
    });
    tx
}

/// Follows the change log from `after` and invalidates what changed, until `stop`.
async fn follow(
    filer: Arc<dyn Filer>,
    inodes: Arc<std::sync::Mutex<inodes::Inodes>>,
    notify: std::sync::mpsc::Sender<Invalidation>,
    counters: Arc<Counters>,
    mut after: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        let batch = tokio::select! {
            r = filer.changes(after, 1000, Duration::from_secs(25)) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let records = match batch {
            Ok(r) => {
                if failing {
                    tracing::info!("following the filer's change log again");
                    failing = false;
                }
                r
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot follow the filer's change log; retrying (what the mount shows may be stale until then)");
                    failing = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for r in records {
            after = after.max(r.seq);
            let (entry, own) = {
                let mut i = inodes.lock().unwrap_or_else(|p| p.into_inner());
                if !i.shows(&r.path) {
                    continue;
                }
                i.changed(&r.path)
            };
            counters.invalidations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = notify.send(Invalidation { entry, own });
        }
    }
}

/// Mounts, serves until `shutdown` resolves or the mount is unmounted from outside, then
/// unmounts. `counters` is called with the mount's counters whenever `report` fires.
pub async fn mount(
    filer: Arc<dyn Filer>,
    args: MountArgs,
    shutdown: impl std::future::Future<Output = ()> + Send,
    mut report: tokio::sync::mpsc::Receiver<()>,
) -> Result<(), String> {
    check_mountpoint(&args.mountpoint)?;
    let root = tidemark_core::path::normalize_user_path(&args.root).map_err(|e| e.to_string())?;
    match filer.stat(&root).await {
        Ok(Some(e)) if e.is_dir() => {}
        Ok(Some(_)) => return Err(format!("{root} is a file, not a directory of the namespace")),
        Ok(None) => return Err(format!("{root}: no such directory in the namespace")),
        Err(e) => return Err(format!("cannot reach the filer: {e}")),
    }
    // Follow from now: everything read after this point is invalidated when it changes.
    let after = filer.health().await.map_err(|e: Error| format!("cannot reach the filer: {e}"))?.last_seq;
    // Bytes an earlier mount could not store wait there for someone to notice.
    if let Ok(d) = std::fs::read_dir(&args.unsaved_dir) {
        let n = d.flatten().count();
        if n > 0 {
            tracing::warn!(
                dir = %args.unsaved_dir.display(),
                "{n} unsaved file(s) in {} (the bytes of files whose last close could not store them): copy them back into the mount, then remove them",
                args.unsaved_dir.display()
            );
        }
    }
    let opts = Options {
        read_only: args.read_only,
        ttl: args.ttl,
        timeout: args.timeout,
        passthrough: args.passthrough,
        unsaved_dir: args.unsaved_dir.clone(),
    };
    let fs = Arc::new(TidemarkFs::new(filer.clone(), tokio::runtime::Handle::current(), &root, opts));
    let inodes = fs.inodes.clone();
    let counters = fs.counters.clone();
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("tidemark:{root}")),
        MountOption::Subtype("tidemark".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        if args.read_only { MountOption::RO } else { MountOption::RW },
    ];
    if args.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(4);
    let mountpoint = args.mountpoint.clone();
    // (Before mounting: afterwards, resolving the path would ask the mount itself.)
    let canonical = std::fs::canonicalize(&mountpoint).unwrap_or_else(|_| mountpoint.clone());
    let session = fuser::Session::new(fuse::Fuse(fs), &mountpoint, &config).map_err(|e| {
        format!("cannot mount at {}: {e} (is fusermount3 installed, /dev/fuse there?)", mountpoint.display())
    })?;
    let notifier = session.notifier();
    let bg = session.spawn().map_err(|e| format!("cannot start the mount: {e}"))?;
    tokio::task::spawn_blocking(move || widen_read_ahead(&canonical));
    tracing::info!(root = %root, mountpoint = %mountpoint.display(), read_only = args.read_only, "mounted");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let follower = tokio::spawn(follow(filer, inodes, notify_thread(notifier), counters.clone(), after, stop_rx));
    let mut shutdown = std::pin::pin!(shutdown);
    // The session ends by itself when someone runs `fusermount3 -u`; check for that.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            () = shutdown.as_mut() => break,
            Some(()) = report.recv() => eprintln!("tidemark mount: {}", counters.line()),
            _ = tick.tick() => {
                if bg.guard.is_finished() {
                    tracing::info!("unmounted from outside");
                    let _ = stop_tx.send(true);
                    let _ = follower.await;
                    return Ok(());
                }
            }
        }
    }
    let _ = stop_tx.send(true);
    let _ = follower.await;
    eprintln!("tidemark mount: {}", counters.line());
    tokio::task::spawn_blocking(move || bg.umount_and_join())
        .await
        .map_err(|e| format!("unmounting: {e}"))?
        .map_err(|e| format!("unmounting {}: {e}", mountpoint.display()))?;
    tracing::info!("unmounted");
    Ok(())
}

/// The device (`major:minor`) of the newest FUSE mount at `mountpoint` in `mountinfo`
/// (`/proc/self/mountinfo`'s text: its fifth field the mount point, octal-escaped, its third
/// the device, and after ` - ` the file system type).
fn device_of(mountinfo: &str, mountpoint: &str) -> Option<(u32, u32)> {
    let escaped = mountpoint.replace('\\', "\\134").replace(' ', "\\040").replace('\t', "\\011").replace('\n', "\\012");
    mountinfo
        .lines()
        .rev()
        .filter(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let fstype = l.split(" - ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap_or("");
            f.get(4) == Some(&escaped.as_str()) && fstype.starts_with("fuse")
        })
        .find_map(|l| {
            let (major, minor) = l.split(' ').nth(2)?.split_once(':')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
}

/// How far ahead the kernel reads a file of the mount, in KiB. Its default for FUSE, 128 KiB,
/// has a sequential read arrive as 128 KiB requests; 1 MiB makes them FUSE's largest, and the
/// mount answers an eighth as many (`tidemark-bench mount`: a 1 GiB file 20–40 % faster).
/// More than that gained nothing: the kernel then sends several at once, out of order.
const READ_AHEAD_KB: u32 = 1024;

/// Sets the mount's read-ahead: its device's `read_ahead_kb` in sysfs, which only root may
/// write (elsewhere the kernel's default stays). The device is found in `/proc/self/mountinfo`,
/// not by a `stat` of the mountpoint: that would be a request to this very process, and a
/// mount killed while it was in flight could never exit (its thread waits in the kernel for an
/// answer no thread is left to give, and the kernel aborts the connection only when the process
/// has exited).
fn widen_read_ahead(mountpoint: &std::path::Path) {
    let Some((major, minor)) = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| device_of(&info, &mountpoint.to_string_lossy()))
    else {
        return tracing::debug!(mountpoint = %mountpoint.display(), "read-ahead left as the kernel's: the mount is not in mountinfo");
    };
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&knob, READ_AHEAD_KB.to_string()) {
        Ok(()) => tracing::debug!(knob, kb = READ_AHEAD_KB, "read-ahead set"),
        Err(e) => tracing::info!(knob, error = %e, "read-ahead left as the kernel's (128 KiB): large reads are slower"),
    }
}

#[cfg(test)]
mod tests {
    use super::device_of;

    /// The mount's device comes from mountinfo: the newest FUSE mount at the path, its name
    /// escaped as the kernel escapes it; other file systems and other paths are not it.
    #[test]
    fn the_mounts_device_is_read_from_mountinfo() {
        let info = "\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
97 22 0:51 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:50 - fuse.tidemark tidemark:/ rw,user_id=0,group_id=0
98 22 0:52 / /tmp/other rw,nosuid shared:51 - fuse.tidemark tidemark:/ rw
99 97 0:60 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:52 - fuse.tidemark tidemark:/ rw
100 22 0:61 / /tmp/disk rw shared:53 - ext4 /dev/vdb rw
";
        assert_eq!(device_of(info, "/tmp/a b"), Some((0, 60)), "the newest mount there, name unescaped");
        assert_eq!(device_of(info, "/tmp/other"), Some((0, 52)));
        assert_eq!(device_of(info, "/tmp/disk"), None, "not a FUSE mount");
        assert_eq!(device_of(info, "/tmp/none"), None);
    }
}
