//! Where the agent learns the kubelet's configuration, and what it does when it cannot.
//!
//! Sources, in order, the first that answers wins:
//! 1. `/configz` ([`crate::configz`]): the kubelet's effective configuration, with its
//!    command-line flags and drop-ins merged in; the only source on distributions that keep no
//!    config file where the agent could read it.
//! 2. The config file with its drop-in directory ([`kubelet_config::read_files`]): misses
//!    settings given as kubelet flags, but needs no API access.
//!
//! With no source configured at all, the flags (`--topology-manager-policy`, …) and the
//! kubelet's defaults are published, as the operator then says what the kubelet runs with.
//! With sources configured and none answering, the agent keeps running: it publishes what it
//! knows and leaves the Topology Manager and resource-manager attributes out (the scheduler
//! then treats the node as the kubelet defaults, which never rejects a pod the kubelet would
//! admit), records a `KubeletConfigUnavailable` Warning Event on the Node, and retries at the
//! resync. A source that fails after it answered keeps the last good settings: the kubelet
//! applies a new configuration only when it restarts.
//!
//! The reads run in their own task ([`Refresher`]), so a slow `/configz` never delays a scan.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::configz::ConfigzClient;
use crate::kubelet_config::{self, KubeletConfigError, ResourceManagerSettings};
use crate::metrics::Metrics;
use crate::publish::NodeEvents;
use crate::triggers::{Trigger, Triggers};

/// Where the known settings came from (the `source` label of
/// `numaplane_exporter_kubelet_config_source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Source {
    /// The kubelet's `/configz`.
    Configz,
    /// The kubelet config file (and drop-ins).
    File,
    /// No source configured: the flags and the kubelet defaults.
    Flags,
    /// Sources configured, none answered yet: unknown settings are left out.
    #[default]
    None,
}

impl Source {
    /// Every source, for zero-valued gauge series.
    pub const ALL: [Source; 4] = [Source::Configz, Source::File, Source::Flags, Source::None];

    /// Metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Configz => "configz",
            Source::File => "file",
            Source::Flags => "flags",
            Source::None => "none",
        }
    }
}

/// One source that did not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which.
    pub source: Source,
    /// Bounded reason (`forbidden`, `timeout`, `tls`, `read`, …), a metric label.
    pub reason: &'static str,
    /// The whole error chain.
    pub message: String,
}

/// The outcome of reading every source once.
#[derive(Clone, Debug)]
pub struct Reading {
    /// The settings of the first source that answered.
    pub settings: Option<ResourceManagerSettings>,
    /// That source ([`Source::Flags`] when none is configured, [`Source::None`] when none
    /// answered).
    pub source: Source,
    /// The sources tried before, that failed.
    pub failures: Vec<Failure>,
}

/// The configured sources.
pub struct Sources {
    /// `/configz`, when configured.
    pub configz: Option<ConfigzClient>,
    /// The kubelet config file.
    pub file: Option<PathBuf>,
    /// The kubelet's drop-in directory.
    pub dir: Option<PathBuf>,
    /// Timeout of one `/configz` read.
    pub timeout: Duration,
}

impl Sources {
    /// Whether no source is configured (the flags alone decide).
    pub fn is_empty(&self) -> bool {
        self.configz.is_none() && self.file.is_none() && self.dir.is_none()
    }

    /// The sources in order, for the start-up log line.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(c) = &self.configz {
            parts.push(format!("/configz at {}", c.url()));
        }
        if let Some(f) = &self.file {
            parts.push(format!("file {}", f.display()));
        }
        if let Some(d) = &self.dir {
            parts.push(format!("drop-ins {}/*.conf", d.display()));
        }
        if parts.is_empty() {
            "none (the flags and the kubelet defaults)".to_owned()
        } else {
            parts.join(", then ")
        }
    }

    /// Reads the sources in order until one answers.
    pub async fn read(&self) -> Reading {
        let mut failures = Vec::new();
        if let Some(configz) = &self.configz {
            match configz.fetch(self.timeout).await {
                Ok(settings) => {
                    return Reading {
                        settings: Some(settings),
                        source: Source::Configz,
                        failures,
                    };
                }
                Err(e) => failures.push(Failure {
                    source: Source::Configz,
                    reason: e.reason(),
                    message: numaplane::error_chain(&e),
                }),
            }
        }
        if self.file.is_some() || self.dir.is_some() {
            match kubelet_config::read_files(self.file.as_deref(), self.dir.as_deref()) {
                Ok(settings) => {
                    return Reading {
                        settings: Some(settings),
                        source: Source::File,
                        failures,
                    };
                }
                Err(e) => failures.push(Failure {
                    source: Source::File,
                    reason: file_reason(&e),
                    message: numaplane::error_chain(&e),
                }),
            }
        }
        Reading {
            settings: None,
            source: if self.is_empty() {
                Source::Flags
            } else {
                Source::None
            },
            failures,
        }
    }
}

fn file_reason(e: &KubeletConfigError) -> &'static str {
    match e {
        KubeletConfigError::Read { .. } | KubeletConfigError::ReadDir { .. } => "read",
        KubeletConfigError::Parse { .. } => "parse",
        KubeletConfigError::InvalidValue { .. } => "invalid",
    }
}

/// What the agent knows, as the main loop reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known {
    /// The last good settings, if any source ever answered.
    pub settings: Option<ResourceManagerSettings>,
    /// Where they came from.
    pub source: Source,
}

impl Known {
    /// Whether sources are configured and none has answered: unknown attributes are left out.
    pub fn unknown(&self) -> bool {
        self.settings.is_none() && self.source == Source::None
    }
}

/// The effect of one reading.
#[derive(Debug, Default)]
pub struct Applied {
    /// The known settings (or their source) changed.
    pub changed: bool,
    /// The note of a Warning Event to record: nothing is known and this is new.
    pub event: Option<String>,
}

/// Keeps the last good settings across failed reads, says each distinct problem once, and
/// counts every failure.
#[derive(Debug)]
pub struct Tracker {
    known: Known,
    /// The last problem logged, so a persisting one is said once.
    said: Option<String>,
    /// When a source last answered.
    last_ok: Option<Instant>,
    /// The last read found nothing usable.
    failing: bool,
    /// A `KubeletConfigUnavailable` Event was recorded for the current unknown stretch.
    event_recorded: bool,
    /// How long settings read successfully are trusted before the next read.
    interval: Duration,
}

impl Tracker {
    /// Nothing known yet; settings that were read are read again after `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            known: Known::default(),
            said: None,
            last_ok: None,
            failing: false,
            event_recorded: false,
            interval,
        }
    }

    /// What is known.
    pub fn known(&self) -> &Known {
        &self.known
    }

    /// Whether a periodic read is due: after a failure at once (the caller asks at the resync),
    /// else once the last good read is `interval` old.
    pub fn due(&self, now: Instant) -> bool {
        self.failing
            || self
                .last_ok
                .is_none_or(|t| now.duration_since(t) >= self.interval)
    }

    /// Takes in one reading: metrics, logs, and what changed.
    pub fn apply(&mut self, reading: Reading, metrics: &Metrics, node: &str) -> Applied {
        for f in &reading.failures {
            metrics.kubelet_config_error(f.source.as_str(), f.reason);
        }
        let problem = (!reading.failures.is_empty()).then(|| {
            reading
                .failures
                .iter()
                .map(|f| format!("{}: {}", f.source.as_str(), f.message))
                .collect::<Vec<_>>()
                .join("; ")
        });
        let new_problem = problem.is_some() && problem != self.said;
        let mut applied = Applied::default();
        match reading.settings {
            Some(settings) => {
                self.failing = false;
                self.last_ok = Some(Instant::now());
                if new_problem {
                    // An earlier source failed and a later one answered: worth knowing (the file
                    // misses kubelet flags), not worth an Event.
                    tracing::info!(
                        node,
                        source = reading.source.as_str(),
                        error = problem.as_deref().unwrap_or_default(),
                        "kubelet configuration read from a fallback source"
                    );
                }
                let known = Known {
                    settings: Some(settings),
                    source: reading.source,
                };
                applied.changed = known != self.known;
                if applied.changed {
                    let s = known.settings.as_ref();
                    tracing::info!(
                        node,
                        source = reading.source.as_str(),
                        policy = s.and_then(|s| s.policy.as_deref()).unwrap_or("(default)"),
                        scope = s.and_then(|s| s.scope.as_deref()).unwrap_or("(default)"),
                        "kubelet configuration read"
                    );
                }
                self.known = known;
                self.event_recorded = false;
            }
            None if reading.source == Source::Flags => {
                self.failing = false;
                self.last_ok = Some(Instant::now());
                let known = Known {
                    settings: None,
                    source: Source::Flags,
                };
                applied.changed = known != self.known;
                self.known = known;
            }
            None => {
                self.failing = true;
                let msg = problem.clone().unwrap_or_default();
                if self.known.settings.is_some() {
                    if new_problem {
                        metrics.error("kubelet_config");
                        tracing::warn!(
                            node,
                            error = %msg,
                            "cannot read the kubelet configuration; keeping the last settings"
                        );
                    }
                } else {
                    if new_problem {
                        metrics.error("kubelet_config");
                        tracing::warn!(
                            node,
                            error = %msg,
                            "cannot read the kubelet configuration from any source; publishing \
                             without the Topology Manager and CPU/memory manager attributes, \
                             retrying at the resync"
                        );
                    }
                    let known = Known::default();
                    applied.changed = known != self.known;
                    self.known = known;
                    if !self.event_recorded {
                        self.event_recorded = true;
                        applied.event = Some(format!(
                            "numaplane-exporter cannot read the kubelet configuration; the \
                             NodeResourceTopology is published without the Topology Manager and \
                             CPU/memory manager attributes until it can: {msg}"
                        ));
                    }
                }
            }
        }
        self.said = problem;
        metrics.set_kubelet_config_source(self.known.source.as_str(), Source::ALL.iter().map(|s| s.as_str()));
        applied
    }
}

/// A request to the [`Refresher`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// The resync: read if the last read failed or is old.
    Periodic,
    /// Read now: the file changed, or the kubelet came back (it may have restarted with a new
    /// configuration).
    Now,
}

/// Reads the sources when asked, outside the main loop, and publishes what is known.
pub struct Refresher {
    sources: Sources,
    tracker: Tracker,
    known: watch::Sender<Known>,
    triggers: Triggers,
    metrics: Arc<Metrics>,
    events: Option<NodeEvents>,
    node: String,
}

impl Refresher {
    /// A refresher; nothing is read until [`Self::refresh`] or [`Self::run`].
    pub fn new(
        sources: Sources,
        interval: Duration,
        triggers: Triggers,
        metrics: Arc<Metrics>,
        events: Option<NodeEvents>,
        node: String,
    ) -> (Self, watch::Receiver<Known>) {
        let (known, rx) = watch::channel(Known::default());
        (
            Self {
                sources,
                tracker: Tracker::new(interval),
                known,
                triggers,
                metrics,
                events,
                node,
            },
            rx,
        )
    }

    /// Reads every source once (bounded by the `/configz` timeout), records the outcome and
    /// publishes what is known; returns whether it changed.
    pub async fn refresh(&mut self) -> bool {
        let reading = self.sources.read().await;
        let applied = self.tracker.apply(reading, &self.metrics, &self.node);
        if applied.changed {
            self.known.send_replace(self.tracker.known().clone());
        }
        if let (Some(note), Some(events)) = (applied.event, &self.events) {
            events
                .warn(
                    &self.metrics,
                    "KubeletConfigUnavailable",
                    "ReadKubeletConfig",
                    note,
                )
                .await;
        }
        applied.changed
    }

    /// Serves refresh requests until every sender is gone; a change triggers a scan.
    pub async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Refresh>) {
        while let Some(first) = requests.recv().await {
            // Requests queued during a read are one more read, not one each.
            let mut now = first == Refresh::Now;
            while let Ok(r) = requests.try_recv() {
                now |= r == Refresh::Now;
            }
            if !now && !self.tracker.due(Instant::now()) {
                continue;
            }
            if self.refresh().await && !self.triggers.send(Trigger::KubeletConfig) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(settings: Option<&str>, source: Source, failures: &[(Source, &'static str)]) -> Reading {
        Reading {
            settings: settings.map(|p| ResourceManagerSettings {
                policy: Some(p.to_owned()),
                ..Default::default()
            }),
            source,
            failures: failures
                .iter()
                .map(|(source, reason)| Failure {
                    source: *source,
                    reason,
                    message: format!("{reason} happened"),
                })
                .collect(),
        }
    }

    fn source_gauge(m: &Metrics, s: Source) -> i64 {
        m.kubelet_config_source
            .get_or_create(&crate::metrics::SourceLabels {
                source: s.as_str().to_owned(),
            })
            .get()
    }

    #[test]
    fn nothing_known_is_one_event_and_failures_are_counted_every_time() {
        let m = Metrics::new();
        let mut t = Tracker::new(Duration::from_secs(60));
        let none = || {
            reading(
                None,
                Source::None,
                &[(Source::Configz, "forbidden"), (Source::File, "read")],
            )
        };
        let a = t.apply(none(), &m, "n");
        assert!(t.known().unknown());
        assert!(
            a.event.as_deref().unwrap().contains("forbidden happened"),
            "{a:?}"
        );
        assert_eq!(source_gauge(&m, Source::None), 1);
        // Still nothing: no second Event, but every failure counts.
        let a = t.apply(none(), &m, "n");
        assert!(a.event.is_none() && !a.changed);
        assert!(
            t.due(Instant::now()),
            "a failed read is retried at the next resync"
        );
        let forbidden = m
            .kubelet_config_errors
            .get_or_create(&crate::metrics::KubeletConfigErrorLabels {
                source: "configz".into(),
                reason: "forbidden".into(),
            })
            .get();
        assert_eq!(forbidden, 2);
        // It recovers: settings known, gauge moves, not due until the interval passes.
        let a = t.apply(reading(Some("restricted"), Source::Configz, &[]), &m, "n");
        assert!(a.changed && a.event.is_none());
        assert_eq!(t.known().source, Source::Configz);
        assert_eq!(
            (source_gauge(&m, Source::None), source_gauge(&m, Source::Configz)),
            (0, 1)
        );
        assert!(!t.due(Instant::now()));
    }

    #[test]
    fn a_failure_after_success_keeps_the_last_settings_without_an_event() {
        let m = Metrics::new();
        let mut t = Tracker::new(Duration::from_secs(60));
        t.apply(reading(Some("restricted"), Source::Configz, &[]), &m, "n");
        let a = t.apply(
            reading(None, Source::None, &[(Source::Configz, "timeout")]),
            &m,
            "n",
        );
        assert!(!a.changed && a.event.is_none());
        assert_eq!(
            t.known().settings.as_ref().unwrap().policy.as_deref(),
            Some("restricted")
        );
        assert_eq!(source_gauge(&m, Source::Configz), 1);
        // A fallback answering differently is a change.
        let a = t.apply(
            reading(
                Some("single-numa-node"),
                Source::File,
                &[(Source::Configz, "timeout")],
            ),
            &m,
            "n",
        );
        assert!(a.changed);
        assert_eq!(t.known().source, Source::File);
    }

    #[test]
    fn no_source_configured_is_the_flags() {
        let m = Metrics::new();
        let mut t = Tracker::new(Duration::from_secs(60));
        let a = t.apply(reading(None, Source::Flags, &[]), &m, "n");
        assert!(a.changed && a.event.is_none());
        assert!(!t.known().unknown());
        assert_eq!(source_gauge(&m, Source::Flags), 1);
    }
}
