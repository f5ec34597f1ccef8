//! In-process capture of the `metrics` crate's counters, gauges and histograms, so a run can
//! write its final values into [`crate::report::RunReport::metrics`] without an exporter.
//!
//! ```
//! let handle = envace::telemetry::install_metrics_recorder();
//! metrics::counter!("doc_rollouts").increment(3);
//! metrics::gauge!("doc_reward_mean", "role" => "act").set(0.5);
//! let snapshot = handle.snapshot();
//! assert_eq!(snapshot["doc_rollouts"], 3.0);
//! assert_eq!(snapshot["doc_reward_mean{role=act}"], 0.5);
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Key, Level, Metadata, Recorder};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// Reads the globally installed [`DebuggingRecorder`]; cheap to clone, all clones share state.
///
/// metrics-util's snapshots are destructive (they reset counters and gauges and drain
/// histograms), so the handle keeps running totals itself: every [`MetricsHandle::snapshot`]
/// reports values since the recorder was installed, not since the previous snapshot.
#[derive(Clone)]
pub struct MetricsHandle {
    recorder: &'static DebuggingRecorder,
    snapshotter: Snapshotter,
    totals: Arc<Mutex<Totals>>,
}

/// Values accumulated across destructive snapshots, keyed by [`flat_key`].
#[derive(Default)]
struct Totals {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    /// Sum and count of every value a histogram has recorded.
    histograms: BTreeMap<String, (f64, u64)>,
}

static HANDLE: OnceLock<MetricsHandle> = OnceLock::new();

/// Installs a [`DebuggingRecorder`] as the process-wide `metrics` recorder, once.
///
/// Idempotent: later calls return a handle to the same recorder. If some other recorder was
/// installed first, a warning is logged and the handle's snapshots stay empty.
pub fn install_metrics_recorder() -> MetricsHandle {
    install_metrics_recorder_with(None)
}

/// [`install_metrics_recorder`], with every metric also sent to `also` (the daemon's
/// Prometheus recorder) through a fan-out. Only the first install in a process takes effect:
/// `also` is dropped (with a warning) when a recorder is installed already.
pub fn install_metrics_recorder_with(
    also: Option<Box<dyn Recorder + Send + Sync>>,
) -> MetricsHandle {
    let mut also = also;
    let handle = HANDLE
        .get_or_init(|| {
            // Leaked so the handle can write gauges back into the very recorder `metrics` uses.
            let recorder: &'static DebuggingRecorder =
                Box::leak(Box::new(DebuggingRecorder::new()));
            let installed = match also.take() {
                Some(other) => metrics::set_global_recorder(
                    metrics_util::layers::FanoutBuilder::default()
                        .add_recorder(recorder)
                        .add_recorder(BoxedRecorder(other))
                        .build(),
                )
                .is_ok(),
                None => metrics::set_global_recorder(recorder).is_ok(),
            };
            if !installed {
                tracing::warn!(
                    "a metrics recorder was already installed; run report metrics stay empty"
                );
            }
            MetricsHandle {
                recorder,
                snapshotter: recorder.snapshotter(),
                totals: Arc::default(),
            }
        })
        .clone();
    if also.is_some() {
        tracing::warn!("a metrics recorder was already installed; the exporter gets no metrics");
    }
    handle
}

/// A boxed recorder as a `Sized` one, for the fan-out.
struct BoxedRecorder(Box<dyn Recorder + Send + Sync>);

impl Recorder for BoxedRecorder {
    fn describe_counter(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        d: metrics::SharedString,
    ) {
        self.0.describe_counter(key, unit, d)
    }
    fn describe_gauge(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        d: metrics::SharedString,
    ) {
        self.0.describe_gauge(key, unit, d)
    }
    fn describe_histogram(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        d: metrics::SharedString,
    ) {
        self.0.describe_histogram(key, unit, d)
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Counter {
        self.0.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Gauge {
        self.0.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Histogram {
        self.0.register_histogram(key, metadata)
    }
}

impl MetricsHandle {
    /// Current value of every metric, flattened to `name` or `name{k=v,...}` (labels sorted by
    /// key): counters as their total since install, gauges as their last value, histograms as
    /// the mean of all values recorded since install (omitted while empty). A counter and a
    /// gauge of the same name and labels share a key; the gauge wins.
    pub fn snapshot(&self) -> BTreeMap<String, f64> {
        // A poisoned lock only means another snapshot panicked; the totals are still usable.
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for (composite, _unit, _description, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = composite.into_parts();
            let flat = flat_key(&key);
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(delta)) => {
                    *totals.counters.entry(flat).or_default() += delta;
                }
                (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                    // The snapshot zeroed the gauge; put the value back so that later
                    // `increment`/`decrement` calls and snapshots continue from it.
                    static META: Metadata<'static> =
                        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));
                    self.recorder.register_gauge(&key, &META).set(v.0);
                    totals.gauges.insert(flat, v.0);
                }
                (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                    let entry = totals.histograms.entry(flat).or_default();
                    entry.0 += values.iter().map(|v| v.0).sum::<f64>();
                    entry.1 += values.len() as u64;
                }
                _ => {}
            }
        }
        let mut out: BTreeMap<String, f64> = totals
            .counters
            .iter()
            .map(|(k, &v)| (k.clone(), v as f64))
            .collect();
        out.extend(
            totals
                .histograms
                .iter()
                .filter(|(_, &(_, n))| n > 0)
                .map(|(k, &(sum, n))| (k.clone(), sum / n as f64)),
        );
        out.extend(totals.gauges.iter().map(|(k, &v)| (k.clone(), v)));
        out
    }
}

/// `name` alone, or `name{k1=v1,k2=v2}` with labels sorted by key so equal keys flatten equally.
fn flat_key(key: &Key) -> String {
    let mut labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
    if labels.is_empty() {
        return key.name().to_string();
    }
    labels.sort_unstable();
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}{{{}}}", key.name(), inner.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_metrics_snapshot_flattens_counters_gauges_and_histograms() {
        let handle = install_metrics_recorder();
        // Names are unique to this test: the recorder is process-wide and other tests share it.
        metrics::counter!("report_test_x").increment(2);
        metrics::gauge!("report_test_reward_mean", "role" => "act").set(0.75);
        metrics::gauge!("report_test_reward_mean", "split" => "a", "role" => "rehearse").set(-1.5);
        metrics::histogram!("report_test_wall_s").record(1.0);
        metrics::histogram!("report_test_wall_s").record(3.0);
        let snap = handle.snapshot();
        assert_eq!(snap.get("report_test_x"), Some(&2.0));
        assert_eq!(snap.get("report_test_reward_mean{role=act}"), Some(&0.75));
        assert_eq!(
            snap.get("report_test_reward_mean{role=rehearse,split=a}"),
            Some(&-1.5)
        );
        assert_eq!(snap.get("report_test_wall_s"), Some(&2.0));

        // Snapshots accumulate rather than reset, and a second install shares the state.
        let again = install_metrics_recorder();
        metrics::counter!("report_test_x").increment(3);
        metrics::gauge!("report_test_reward_mean", "role" => "act").increment(0.25);
        metrics::histogram!("report_test_wall_s").record(5.0);
        let snap = again.snapshot();
        assert_eq!(snap.get("report_test_x"), Some(&5.0));
        assert_eq!(snap.get("report_test_reward_mean{role=act}"), Some(&1.0));
        assert_eq!(snap.get("report_test_wall_s"), Some(&3.0));
        assert_eq!(handle.snapshot().get("report_test_x"), Some(&5.0));
    }
}
