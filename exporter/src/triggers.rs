//! What wakes the agent up, and how bursts become one scan.
//!
//! Every source sends into one unbounded channel, so no event is ever dropped (RTE's rate
//! limiter drops overflow). The coalescer waits for a short quiet period after the first event,
//! bounded by a maximum delay, and hands the whole batch to one scan. Events that arrive while a
//! scan runs stay queued and cause the next one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Why a scan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trigger {
    /// First scan after start.
    Startup,
    /// The periodic resync timer.
    Resync,
    /// An event on the kubelet's Watch stream.
    KubeletWatch,
    /// `Get` showed the kubelet admitted a pod the last List did not have.
    KubeletGet,
    /// A pod of this node was added, changed or deleted in the API server.
    PodWatch,
    /// The notify file was written (runtime hook).
    NotifyFile,
    /// Our object was deleted or changed by someone else.
    ObjectChanged,
    /// What is known of the kubelet's configuration changed (a source answered differently).
    KubeletConfig,
    /// A retry after a failed scan or publish.
    Retry,
    /// Our allocator sent a device list to the kubelet: allocatable is read again.
    DevicesDelivered,
    /// The Node's allocatable changed for an extended resource: allocatable is read again.
    NodeAllocatable,
    /// Expected devices are not in allocatable yet: read it again (bounded, with backoff).
    AllocatableRetry,
}

impl Trigger {
    /// Metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Trigger::Startup => "startup",
            Trigger::Resync => "resync",
            Trigger::KubeletWatch => "kubelet_watch",
            Trigger::KubeletGet => "kubelet_get",
            Trigger::PodWatch => "pod_watch",
            Trigger::NotifyFile => "notify_file",
            Trigger::ObjectChanged => "object_changed",
            Trigger::KubeletConfig => "kubelet_config",
            Trigger::Retry => "retry",
            Trigger::DevicesDelivered => "devices_delivered",
            Trigger::NodeAllocatable => "node_allocatable",
            Trigger::AllocatableRetry => "allocatable_retry",
        }
    }

    /// Whether the trigger is an event (as opposed to the timer), for the RTE-style
    /// `reactive`/`periodic` distinction.
    pub const fn is_reactive(self) -> bool {
        !matches!(
            self,
            Trigger::Resync | Trigger::Startup | Trigger::Retry | Trigger::AllocatableRetry
        )
    }
}

/// Sending side, cloned into every source.
#[derive(Clone, Debug)]
pub struct Triggers(mpsc::UnboundedSender<Trigger>);

impl Triggers {
    /// Signals one event. Returns false once the agent is shutting down.
    pub fn send(&self, t: Trigger) -> bool {
        self.0.send(t).is_ok()
    }
}

/// A coalesced set of triggers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The distinct triggers.
    pub triggers: BTreeSet<Trigger>,
    /// When the first one arrived.
    pub first_at: Instant,
}

impl Batch {
    /// The label of the batch: the most specific trigger (reactive ones first).
    pub fn label(&self) -> &'static str {
        self.triggers
            .iter()
            .find(|t| t.is_reactive())
            .or_else(|| self.triggers.iter().next())
            .map_or("none", |t| t.as_str())
    }
}

/// Receiving side: turns bursts into batches.
pub struct Coalescer {
    rx: mpsc::UnboundedReceiver<Trigger>,
    quiet: Duration,
    max_delay: Duration,
    /// The batch being gathered, kept here rather than in the future of [`Self::next`]: the
    /// agent's loop races `next` against other branches (the heartbeat) in `select!`, and a
    /// dropped future must not take triggers it already received with it.
    pending: Option<Batch>,
}

/// A connected sender and coalescer.
pub fn channel(quiet: Duration, max_delay: Duration) -> (Triggers, Coalescer) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Triggers(tx),
        Coalescer {
            rx,
            quiet,
            max_delay,
            pending: None,
        },
    )
}

impl Coalescer {
    /// Waits for the next batch: the first event, then every event until `quiet` passes without
    /// one or `max_delay` after the first. `None` when every sender is gone. Cancel-safe: a
    /// batch interrupted by dropping the future is resumed by the next call.
    pub async fn next(&mut self) -> Option<Batch> {
        if self.pending.is_none() {
            let first = self.rx.recv().await?;
            self.pending = Some(Batch {
                triggers: BTreeSet::from([first]),
                first_at: Instant::now(),
            });
        }
        let deadline = self.pending.as_ref().map(|b| b.first_at + self.max_delay)?;
        loop {
            let quiet_end = (Instant::now() + self.quiet).min(deadline);
            match tokio::time::timeout_at(quiet_end, self.rx.recv()).await {
                Ok(Some(t)) => {
                    if let Some(b) = self.pending.as_mut() {
                        b.triggers.insert(t);
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        let mut batch = self.pending.take()?;
        // Whatever is already queued belongs to this batch too: it happened before the scan.
        while let Ok(t) = self.rx.try_recv() {
            batch.triggers.insert(t);
        }
        Some(batch)
    }
}

/// Sends [`Trigger::Resync`] every `period` (0 disables it).
pub fn spawn_resync_timer(triggers: Triggers, period: Duration) -> Option<tokio::task::JoinHandle<()>> {
    if period.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut timer = tokio::time::interval_at(Instant::now() + period, period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            if !triggers.send(Trigger::Resync) {
                return;
            }
        }
    }))
}

/// Errors setting up the notify file.
#[derive(Debug, thiserror::Error)]
pub enum NotifyFileError {
    /// The file exists but is not an empty regular file (RTE's rule: never reuse something that
    /// may belong to someone else).
    #[error("notify file {path} exists and is not an empty regular file")]
    Occupied {
        /// The path.
        path: PathBuf,
    },
    /// The file cannot be created.
    #[error("cannot create notify file {path}")]
    Create {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The directory cannot be watched.
    #[error("cannot watch notify file {path}")]
    Watch {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: notify::Error,
    },
}

/// Creates the notify file and sends [`Trigger::NotifyFile`] whenever it is written, touched or
/// recreated. The returned watcher must be kept alive.
pub fn watch_notify_file(
    path: &Path,
    triggers: Triggers,
) -> Result<notify::RecommendedWatcher, NotifyFileError> {
    match std::fs::metadata(path) {
        Ok(m) if !(m.is_file() && m.len() == 0) => {
            return Err(NotifyFileError::Occupied {
                path: path.to_owned(),
            });
        }
        Ok(_) => {}
        Err(_) => {
            std::fs::File::create(path).map_err(|source| NotifyFileError::Create {
                path: path.to_owned(),
                source,
            })?;
        }
    }
    let target = path.to_owned();
    watch_dirs(
        &[parent_dir(path)],
        move |p| p == target,
        move || {
            triggers.send(Trigger::NotifyFile);
        },
        path,
    )
}

/// Calls `on_change` whenever the kubelet config file or a drop-in of its directory (`*.conf`)
/// is written, replaced, created or removed. Directories are watched, not the files: config
/// management replaces files, and a bind mount of a file itself would keep the old inode. A
/// directory that cannot be watched (not there yet) is skipped with a warning; the error is for
/// no directory watched at all. The returned watcher must be kept alive.
pub fn watch_kubelet_config(
    file: Option<&Path>,
    dir: Option<&Path>,
    on_change: impl Fn() + Send + 'static,
) -> Result<notify::RecommendedWatcher, NotifyFileError> {
    let (target, drop_ins) = (file.map(Path::to_owned), dir.map(Path::to_owned));
    let relevant = move |p: &Path| {
        target.as_deref() == Some(p)
            || (drop_ins.as_deref().is_some_and(|d| p.parent() == Some(d))
                && p.extension().is_some_and(|e| e == "conf"))
    };
    let dirs: Vec<&Path> = file.map(parent_dir).into_iter().chain(dir).collect();
    let name = file.or(dir).unwrap_or(Path::new("."));
    watch_dirs(&dirs, relevant, on_change, name)
}

fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Calls `on_event` whenever a path of `dirs` for which `relevant` holds is written, touched,
/// replaced or recreated. `name` names the watch in errors. A directory that cannot be watched
/// is skipped with a warning while another one is watched; with none watched, it is the error.
fn watch_dirs(
    dirs: &[&Path],
    relevant: impl Fn(&Path) -> bool + Send + 'static,
    on_event: impl Fn() + Send + 'static,
    name: &Path,
) -> Result<notify::RecommendedWatcher, NotifyFileError> {
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
        Ok(event) => {
            if !matches!(event.kind, notify::EventKind::Access(_)) && event.paths.iter().any(|p| relevant(p))
            {
                on_event();
            }
        }
        Err(e) => tracing::warn!(error = %e, "file watch error"),
    })
    .map_err(|source| NotifyFileError::Watch {
        path: name.to_owned(),
        source,
    })?;
    let mut watched = 0;
    let mut last_error = None;
    for dir in dirs {
        match watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
            Ok(()) => watched += 1,
            Err(source) => {
                tracing::warn!(dir = %dir.display(), error = %source, "cannot watch directory");
                last_error = Some(NotifyFileError::Watch {
                    path: dir.to_path_buf(),
                    source,
                });
            }
        }
    }
    match last_error {
        Some(e) if watched == 0 => Err(e),
        _ => Ok(watcher),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_becomes_one_batch_after_the_quiet_period() {
        let (tx, mut rx) = channel(Duration::from_millis(10), Duration::from_millis(100));
        let start = Instant::now();
        tx.send(Trigger::PodWatch);
        let tx2 = tx.clone();
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                tx2.send(Trigger::KubeletWatch);
            }
        });
        let batch = rx.next().await.unwrap();
        assert_eq!(
            batch.triggers,
            BTreeSet::from([Trigger::KubeletWatch, Trigger::PodWatch])
        );
        // Last event at 25 ms, quiet 10 ms.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(35) && waited < Duration::from_millis(40),
            "{waited:?}"
        );
        assert_eq!(batch.label(), "kubelet_watch");
    }

    #[tokio::test(start_paused = true)]
    async fn an_endless_stream_is_cut_at_the_maximum_delay_and_nothing_is_lost() {
        let (tx, mut rx) = channel(Duration::from_millis(10), Duration::from_millis(50));
        let tx2 = tx.clone();
        tokio::spawn(async move {
            for i in 0..40u32 {
                tx2.send(if i == 39 {
                    Trigger::NotifyFile
                } else {
                    Trigger::PodWatch
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let start = Instant::now();
        let first = rx.next().await.unwrap();
        assert!(start.elapsed() <= Duration::from_millis(51));
        assert_eq!(first.triggers, BTreeSet::from([Trigger::PodWatch]));
        // The last event (sent at 195 ms) must come out in a later batch.
        let mut seen_last = false;
        while !seen_last {
            let b = rx.next().await.unwrap();
            seen_last = b.triggers.contains(&Trigger::NotifyFile);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_interrupted_by_another_select_branch_is_not_lost() {
        let (tx, mut rx) = channel(Duration::from_millis(10), Duration::from_millis(100));
        tx.send(Trigger::Startup);
        tx.send(Trigger::PodWatch);
        // As the agent's loop does with its heartbeat: another branch wins while `next` waits
        // for the quiet period, after it took both triggers off the channel.
        tokio::select! {
            biased;
            _ = rx.next() => panic!("the batch cannot be complete before the quiet period"),
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
        let b = tokio::time::timeout(Duration::from_secs(1), rx.next())
            .await
            .expect("the interrupted batch is lost")
            .unwrap();
        assert_eq!(b.triggers, BTreeSet::from([Trigger::Startup, Trigger::PodWatch]));
    }

    #[tokio::test(start_paused = true)]
    async fn resync_timer_fires_periodically_and_zero_disables_it() {
        let (tx, mut rx) = channel(Duration::from_millis(1), Duration::from_millis(5));
        assert!(spawn_resync_timer(tx.clone(), Duration::ZERO).is_none());
        let handle = spawn_resync_timer(tx, Duration::from_secs(10)).unwrap();
        let start = Instant::now();
        let b = rx.next().await.unwrap();
        assert_eq!(b.triggers, BTreeSet::from([Trigger::Resync]));
        assert!(start.elapsed() >= Duration::from_secs(10));
        handle.abort();
    }

    #[test]
    fn notify_file_is_created_and_an_occupied_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let (tx, _rx) = channel(Duration::from_millis(1), Duration::from_millis(5));
        let _w = watch_notify_file(&path, tx.clone()).unwrap();
        assert!(path.is_file());
        let busy = dir.path().join("busy");
        std::fs::write(&busy, "someone else's").unwrap();
        let err = watch_notify_file(&busy, tx).unwrap_err();
        assert!(matches!(err, NotifyFileError::Occupied { .. }), "{err}");
    }

    #[tokio::test]
    async fn writing_the_notify_file_triggers_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let (tx, mut rx) = channel(Duration::from_millis(1), Duration::from_millis(5));
        let _w = watch_notify_file(&path, tx).unwrap();
        std::fs::write(&path, "").unwrap();
        let b = tokio::time::timeout(Duration::from_secs(5), rx.next())
            .await
            .unwrap()
            .unwrap();
        assert!(b.triggers.contains(&Trigger::NotifyFile));
    }
}
