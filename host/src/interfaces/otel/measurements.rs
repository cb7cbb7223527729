//! `wasi:otel/metrics`: the data points a guest exports, added to the host's `guest.*`
//! instruments ([`Metrics::observe_guest`]), so they are aggregated across requests, shown at
//! `/metrics` and pushed with the host's own.
//!
//! Each request's instance is new, so its guest's SDK starts from zero: a cumulative value is
//! what this request added (less what an earlier export of the same request already gave), a
//! delta is added as it is. Sums become counters (up-down counters when not monotonic), gauges
//! gauges. A histogram point of one measurement is recorded exactly; one of several is recorded
//! as that many measurements, each its bucket's nearest value to the point's mean, so its count
//! and buckets are exact and its sum close. Exponential histograms and exemplars are not kept.

use opentelemetry::KeyValue;
use wasmtime::StoreContextMut;
use wasmtime::component::{Lift, WasmList};

use super::OtelView;
use super::wire::{WireHistogram, WireMetric, WireMetricData, WirePoint, WireResourceMetrics};
use crate::interfaces::bindings::wasi::otel::metrics::{MetricNumber, Temporality};
use crate::interfaces::lift::{self, Allowance, InGuest};
use crate::observability::metrics::{GuestMeasurement, GuestValue, MAX_GUEST_METRIC_NAME};

/// Buckets one guest histogram point may have.
pub const MAX_HISTOGRAM_BOUNDS: usize = 64;
/// Measurements one request's histogram points may stand for, together, over all its exports:
/// each is recorded.
pub const MAX_HISTOGRAM_MEASUREMENTS_PER_REQUEST: u64 = 1024;
/// The longest attribute key of a metric data point: keys and values become label names and
/// values kept for the host's life, so they are short.
const MAX_METRIC_KEY_BYTES: usize = 64;
/// The longest attribute value of a metric data point (as JSON text).
const MAX_METRIC_VALUE_BYTES: usize = 128;
/// The longest unit kept (UCUM units are short).
const MAX_UNIT_BYTES: usize = 63;
/// The longest description kept.
const MAX_DESCRIPTION_BYTES: usize = 1024;

/// The last cumulative value of one series in this request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// A sum.
    Sum(f64),
    /// A histogram: its count, sum and bucket counts.
    Histogram {
        count: u64,
        sum: f64,
        buckets: Vec<u64>,
    },
}

/// What one export call dropped so far.
struct Budget {
    dropped: u64,
}

/// `export`: every data point the quotas hold, recorded; `Err` says how many were not.
pub(super) fn export<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    exported: &WireResourceMetrics,
) -> wasmtime::Result<Result<(), String>> {
    let (_, telemetry) = store.data_mut().otel();
    if telemetry.metrics().is_none() {
        return Ok(Ok(()));
    }
    let mut budget = Budget { dropped: 0 };
    within_quota(
        store,
        &exported.scope_metrics,
        &mut budget,
        0,
        |store, scope, budget| {
            within_quota(store, &scope.metrics, budget, 0, |store, metric, budget| {
                record_metric(store, &metric, budget)
            })
        },
    )?;
    let (_, telemetry) = store.data_mut().otel();
    telemetry.drop_metric_points(budget.dropped);
    Ok(if budget.dropped == 0 {
        Ok(())
    } else {
        Err(format!(
            "{} metric data points (or metrics) were dropped by the host's limits",
            budget.dropped
        ))
    })
}

/// Reads each item of `list` in turn and gives it to `each`, as long as the request's metric
/// quota allows: every item past the first `free` takes one off it, and those past the quota
/// are counted dropped in `budget`.
fn within_quota<T: OtelView, E: Lift + 'static>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<E>,
    budget: &mut Budget,
    free: usize,
    mut each: impl FnMut(&mut StoreContextMut<'_, T>, E, &mut Budget) -> wasmtime::Result<()>,
) -> wasmtime::Result<()> {
    for index in 0..list.len() {
        if index >= free {
            let (otel, _) = store.data_mut().otel();
            if otel.metric_points == 0 {
                budget.dropped += (list.len() - index) as u64;
                break;
            }
            otel.metric_points -= 1;
        }
        let Some(item) = list.get(&mut *store, index) else {
            break;
        };
        each(store, item?, budget)?;
    }
    Ok(())
}

/// One metric's points, each recorded or counted as dropped.
fn record_metric<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    metric: &WireMetric,
    budget: &mut Budget,
) -> wasmtime::Result<()> {
    let passed = points(&metric.data);
    let (otel, _) = store.data_mut().otel();
    let mut bytes = otel.metric_bytes;
    // Each string spends what it is, and one over its limit spends the rest, before the next
    // is read: a refused name costs the request's later metrics their reading too.
    let name = lift::metered_text(
        &InGuest::new(&metric.name, store),
        MAX_GUEST_METRIC_NAME,
        &mut bytes,
    )?;
    let unit = lift::metered_text(
        &InGuest::new(&metric.unit, store),
        MAX_UNIT_BYTES,
        &mut bytes,
    )?;
    let description = lift::text(&InGuest::new(&metric.description, store), &mut bytes)?;
    store.data_mut().otel().0.metric_bytes = bytes;
    let (Some(name), Some(unit)) = (name, unit) else {
        budget.dropped += passed;
        return Ok(());
    };
    let description = description
        .map(|text| text[..text.floor_char_boundary(MAX_DESCRIPTION_BYTES)].to_string())
        .unwrap_or_default();
    let kind = |value| GuestMeasurement {
        name: &name,
        description: &description,
        unit: &unit,
        value,
    };
    match &metric.data {
        WireMetricData::F64Gauge(gauge)
        | WireMetricData::U64Gauge(gauge)
        | WireMetricData::S64Gauge(gauge) => {
            each_point(store, &name, &gauge.data_points, budget, |_, _, value| {
                Some(kind(GuestValue::Gauge(number(value))))
            })?;
        }
        WireMetricData::F64Sum(sum) | WireMetricData::U64Sum(sum) | WireMetricData::S64Sum(sum) => {
            let monotonic = sum.is_monotonic;
            let cumulative = match sum.temporality {
                Temporality::Cumulative => true,
                Temporality::Delta => false,
                // Delta for counters, cumulative for up-down counters.
                Temporality::LowMemory => !monotonic,
            };
            each_point(
                store,
                &name,
                &sum.data_points,
                budget,
                |last, series, value| {
                    let value = number(value);
                    let added = if cumulative {
                        let before = match last.get(series) {
                            Some(Seen::Sum(before)) => *before,
                            _ => 0.0,
                        };
                        value - before
                    } else {
                        value
                    };
                    if !added.is_finite() || (monotonic && added < 0.0) {
                        return None;
                    }
                    if cumulative {
                        last.insert(series.to_string(), Seen::Sum(value));
                    }
                    Some(kind(GuestValue::Sum { monotonic, added }))
                },
            )?;
        }
        WireMetricData::F64Histogram(histogram)
        | WireMetricData::U64Histogram(histogram)
        | WireMetricData::S64Histogram(histogram) => {
            record_histogram(store, &name, histogram, budget, &kind)?;
        }
        WireMetricData::F64ExponentialHistogram(_)
        | WireMetricData::U64ExponentialHistogram(_)
        | WireMetricData::S64ExponentialHistogram(_) => budget.dropped += passed,
    }
    Ok(())
}

/// A histogram's points, each as the measurements it stands for.
fn record_histogram<'a, T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    name: &str,
    histogram: &WireHistogram,
    budget: &mut Budget,
    kind: &impl Fn(GuestValue) -> GuestMeasurement<'a>,
) -> wasmtime::Result<()> {
    let cumulative = !matches!(
        histogram.temporality,
        Temporality::Delta | Temporality::LowMemory
    );
    // A metric's first point was paid for with the metric.
    within_quota(
        store,
        &histogram.data_points,
        budget,
        1,
        |store, point, budget| {
            let bounds = numbers(store, &point.bounds, MAX_HISTOGRAM_BOUNDS)?;
            let counts = numbers(store, &point.bucket_counts, MAX_HISTOGRAM_BOUNDS + 1)?;
            let attributes = attributes(store, name, &point.attributes)?;
            let (Some(bounds), Some(counts), Some((attributes, series))) =
                (bounds, counts, attributes)
            else {
                budget.dropped += 1;
                return Ok(());
            };
            let seen = Seen::Histogram {
                count: point.count,
                sum: number(point.sum),
                buckets: counts,
            };
            let (otel, _) = store.data_mut().otel();
            let before = cumulative.then(|| otel.last_values.get(&series)).flatten();
            let Ok(values) = added_measurements(&bounds, &seen, before) else {
                budget.dropped += 1;
                return Ok(());
            };
            let measurements: u64 = values.iter().map(|(_, times)| times).sum();
            if measurements > otel.histogram_measurements {
                budget.dropped += 1;
                return Ok(());
            }
            otel.histogram_measurements -= measurements;
            if cumulative {
                otel.last_values.insert(series, seen);
            }
            if !values.is_empty() {
                observe(
                    store,
                    kind(GuestValue::Histogram { bounds, values }),
                    &attributes,
                    budget,
                );
            }
            Ok(())
        },
    )
}

/// A histogram point that is not one: bounds not ascending and finite, not one bucket count
/// per bound plus one, counts not adding up to its count, a sum not finite.
#[derive(Debug, PartialEq)]
pub(crate) struct Malformed;

/// What a histogram point added since `before` (the same series' last cumulative point), as
/// (value, times) measurements (none when nothing was added).
pub(crate) fn added_measurements(
    bounds: &[f64],
    now: &Seen,
    before: Option<&Seen>,
) -> Result<Vec<(f64, u64)>, Malformed> {
    let Seen::Histogram {
        count,
        sum,
        buckets,
    } = now
    else {
        return Err(Malformed);
    };
    let well_formed = bounds.iter().all(|bound| bound.is_finite())
        && bounds.windows(2).all(|pair| pair[0] < pair[1])
        && buckets.len() == bounds.len() + 1
        && buckets
            .iter()
            .try_fold(0u64, |total, count| total.checked_add(*count))
            == Some(*count)
        && sum.is_finite();
    if !well_formed {
        return Err(Malformed);
    }
    let (count, sum, buckets): (u64, f64, Vec<u64>) = match before {
        Some(Seen::Histogram {
            count: before_count,
            sum: before_sum,
            buckets: before_buckets,
        }) if before_buckets.len() == buckets.len() && before_count <= count => (
            count - before_count,
            sum - before_sum,
            buckets
                .iter()
                .zip(before_buckets)
                .map(|(now, before)| now.saturating_sub(*before))
                .collect(),
        ),
        _ => (*count, *sum, buckets.clone()),
    };
    if count == 0 {
        return Ok(Vec::new());
    }
    if !sum.is_finite() {
        return Err(Malformed);
    }
    let mean = sum / count as f64;
    if count == 1 {
        return Ok(vec![(mean, 1)]);
    }
    Ok(buckets
        .iter()
        .enumerate()
        .filter(|(_, times)| **times > 0)
        .map(|(index, times)| {
            let lower = index.checked_sub(1).map(|below| bounds[below]);
            let upper = bounds.get(index).copied();
            (nearest_in_bucket(mean, lower, upper), *times)
        })
        .collect())
}

/// The value nearest `mean` inside the bucket (`lower`, `upper`] (open at either end when
/// `None`).
fn nearest_in_bucket(mean: f64, lower: Option<f64>, upper: Option<f64>) -> f64 {
    match (lower, upper) {
        (Some(lower), _) if mean <= lower => lower.next_up(),
        (_, Some(upper)) if mean > upper => upper,
        _ => mean,
    }
}

/// Gauge and sum points: each read (its attributes within the limits) and, if `value_of` makes
/// a measurement of it, recorded.
fn each_point<'a, T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    name: &str,
    points: &WasmList<WirePoint>,
    budget: &mut Budget,
    mut value_of: impl FnMut(
        &mut std::collections::HashMap<String, Seen>,
        &str,
        MetricNumber,
    ) -> Option<GuestMeasurement<'a>>,
) -> wasmtime::Result<()> {
    // A metric's first point was paid for with the metric.
    within_quota(store, points, budget, 1, |store, point, budget| {
        let Some((attributes, series)) = attributes(store, name, &point.attributes)? else {
            budget.dropped += 1;
            return Ok(());
        };
        let (otel, _) = store.data_mut().otel();
        match value_of(&mut otel.last_values, &series, point.value) {
            Some(measurement) => observe(store, measurement, &attributes, budget),
            None => budget.dropped += 1,
        }
        Ok(())
    })
}

/// Records `measurement` in the host's instruments, or counts it dropped.
fn observe<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    measurement: GuestMeasurement<'_>,
    attributes: &[KeyValue],
    budget: &mut Budget,
) {
    let (_, telemetry) = store.data_mut().otel();
    let recorded = telemetry
        .metrics()
        .is_some_and(|metrics| metrics.observe_guest(measurement, attributes));
    if !recorded {
        budget.dropped += 1;
    }
}

/// A point's attributes, if there are at most [`super::MAX_ATTRIBUTES_PER_POINT`] and all fit
/// the request's metric bytes; and the series they name (with the metric's name, for
/// [`Seen`]).
fn attributes<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    metric: &str,
    list: &WasmList<super::wire::WireKeyValue>,
) -> wasmtime::Result<Option<(Vec<KeyValue>, String)>> {
    if list.len() > super::MAX_ATTRIBUTES_PER_POINT {
        return Ok(None);
    }
    let mut bytes: Allowance = store.data_mut().otel().0.metric_bytes;
    let lifted = super::key_values(store, list, &mut bytes)?;
    store.data_mut().otel().0.metric_bytes = bytes;
    let too_long = lifted.attributes.iter().any(|attribute| {
        attribute.key.len() > MAX_METRIC_KEY_BYTES
            || matches!(&attribute.value, crate::interfaces::bindings::telemetry::Value::Text(text) if text.len() > MAX_METRIC_VALUE_BYTES)
    });
    if lifted.dropped > 0 || too_long {
        return Ok(None);
    }
    let mut attributes: Vec<KeyValue> = lifted
        .attributes
        .into_iter()
        .map(|attribute| {
            let value = match attribute.value {
                crate::interfaces::bindings::telemetry::Value::Text(text) => super::any_value(text),
                _ => opentelemetry::Value::from(""),
            };
            KeyValue::new(attribute.key, value)
        })
        .collect();
    attributes.sort_by(|a, b| a.key.cmp(&b.key));
    let series = std::iter::once(metric.to_string())
        .chain(
            attributes
                .iter()
                .map(|attribute| format!("{}={}", attribute.key, attribute.value)),
        )
        .collect::<Vec<_>>()
        .join("\u{0}");
    Ok(Some((attributes, series)))
}

/// A list of numbers, if it has at most `max`.
fn numbers<T: 'static, N>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<N>,
    max: usize,
) -> wasmtime::Result<Option<Vec<N>>>
where
    N: wasmtime::component::Lift + 'static,
{
    if list.len() > max {
        return Ok(None);
    }
    list.iter(&mut *store)?
        .collect::<wasmtime::Result<Vec<N>>>()
        .map(Some)
}

/// How many data points a metric carries (what is dropped with it).
fn points(data: &WireMetricData) -> u64 {
    let count = match data {
        WireMetricData::F64Gauge(gauge)
        | WireMetricData::U64Gauge(gauge)
        | WireMetricData::S64Gauge(gauge) => gauge.data_points.len(),
        WireMetricData::F64Sum(sum) | WireMetricData::U64Sum(sum) | WireMetricData::S64Sum(sum) => {
            sum.data_points.len()
        }
        WireMetricData::F64Histogram(histogram)
        | WireMetricData::U64Histogram(histogram)
        | WireMetricData::S64Histogram(histogram) => histogram.data_points.len(),
        WireMetricData::F64ExponentialHistogram(histogram)
        | WireMetricData::U64ExponentialHistogram(histogram)
        | WireMetricData::S64ExponentialHistogram(histogram) => histogram.data_points.len(),
    };
    count as u64
}

/// A metric number as an f64.
fn number(value: MetricNumber) -> f64 {
    match value {
        MetricNumber::F64(number) => number,
        MetricNumber::S64(number) => number as f64,
        MetricNumber::U64(number) => number as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(count: u64, sum: f64, buckets: &[u64]) -> Seen {
        Seen::Histogram {
            count,
            sum,
            buckets: buckets.to_vec(),
        }
    }

    #[test]
    fn one_measurement_is_recorded_exactly() {
        let now = histogram(1, 0.003, &[0, 1, 0]);
        assert_eq!(
            added_measurements(&[0.001, 0.01], &now, None),
            Ok(vec![(0.003, 1)])
        );
    }

    #[test]
    fn several_measurements_keep_their_buckets_and_count() {
        // Mean 2.0, but one measurement fell at or below 1 and two above 5.
        let now = histogram(3, 6.0, &[1, 0, 2]);
        let values = added_measurements(&[1.0, 5.0], &now, None).unwrap();
        assert_eq!(values.len(), 2);
        assert_eq!(values[0], (1.0, 1));
        assert!(values[1].0 > 5.0 && values[1].1 == 2);
    }

    #[test]
    fn a_second_cumulative_export_adds_only_what_is_new() {
        let before = histogram(2, 2.0, &[2, 0]);
        let now = histogram(3, 9.0, &[2, 1]);
        assert_eq!(
            added_measurements(&[5.0], &now, Some(&before)),
            Ok(vec![(7.0, 1)])
        );
        // Exported again unchanged: nothing new, and nothing wrong.
        assert_eq!(added_measurements(&[5.0], &now, Some(&now)), Ok(vec![]));
    }

    #[test]
    fn a_malformed_point_records_nothing() {
        let counts_do_not_add_up = histogram(5, 1.0, &[1, 1]);
        assert_eq!(
            added_measurements(&[1.0], &counts_do_not_add_up, None),
            Err(Malformed)
        );
        let bounds_not_ascending = histogram(2, 1.0, &[1, 1, 0]);
        assert_eq!(
            added_measurements(&[2.0, 1.0], &bounds_not_ascending, None),
            Err(Malformed)
        );
        let infinite_sum = histogram(1, f64::INFINITY, &[1]);
        assert_eq!(added_measurements(&[], &infinite_sum, None), Err(Malformed));
        let before = histogram(1, -f64::MAX, &[1]);
        let overflowing = histogram(2, f64::MAX, &[2]);
        assert_eq!(
            added_measurements(&[], &overflowing, Some(&before)),
            Err(Malformed)
        );
    }
}
