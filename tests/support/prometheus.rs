//! `/metrics` parsed with a real Prometheus text-format parser (`openmetrics-parser`).

use std::collections::HashMap;

use openmetrics_parser::PrometheusValue;

/// One counter, gauge or untyped sample: metric name, labels, value.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The metric family's name.
    pub name: String,
    /// Label names and values.
    pub labels: HashMap<String, String>,
    /// The value.
    pub value: f64,
}

/// Every counter, gauge and untyped sample of a scrape, and each histogram's `_count`, `_sum`
/// and `_bucket` (by `le`) series as samples of those names; panics if the text does not
/// parse.
pub fn parse(text: &str) -> Vec<Sample> {
    let exposition =
        openmetrics_parser::prometheus::parse_prometheus(text).unwrap_or_else(|error| {
            panic!("/metrics is not valid Prometheus text ({error:?}):\n{text}")
        });
    let mut samples = Vec::new();
    for (name, family) in &exposition.families {
        for sample in family.iter_samples() {
            let value = match &sample.value {
                PrometheusValue::Counter(counter) => counter.value.as_f64(),
                PrometheusValue::Gauge(number) | PrometheusValue::Unknown(number) => {
                    number.as_f64()
                }
                PrometheusValue::Histogram(histogram) => {
                    let labels: HashMap<String, String> = sample
                        .get_labelset()
                        .expect("labels parse")
                        .iter()
                        .map(|(name, value)| (name.clone(), value.clone()))
                        .collect();
                    samples.extend(histogram_samples(name, &labels, histogram));
                    continue;
                }
                PrometheusValue::Summary(_) => continue,
            };
            let labels = sample
                .get_labelset()
                .expect("labels parse")
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            samples.push(Sample {
                name: name.clone(),
                labels,
                value,
            });
        }
    }
    samples
}

/// A histogram's series as samples: `<name>_count`, `<name>_sum`, `<name>_bucket{le=...}`.
fn histogram_samples(
    name: &str,
    labels: &HashMap<String, String>,
    histogram: &openmetrics_parser::HistogramValue,
) -> Vec<Sample> {
    let sample = |suffix: &str, labels: HashMap<String, String>, value: f64| Sample {
        name: format!("{name}{suffix}"),
        labels,
        value,
    };
    let mut samples = vec![
        sample(
            "_count",
            labels.clone(),
            histogram.count.unwrap_or(0) as f64,
        ),
        sample(
            "_sum",
            labels.clone(),
            histogram.sum.as_ref().map_or(0.0, |sum| sum.as_f64()),
        ),
    ];
    for bucket in &histogram.buckets {
        let mut labels = labels.clone();
        let le = if bucket.upper_bound.is_infinite() {
            "+Inf".to_string()
        } else {
            bucket.upper_bound.to_string()
        };
        labels.insert("le".to_string(), le);
        samples.push(sample("_bucket", labels, bucket.count.as_f64()));
    }
    samples
}

/// The value of the sample `name` with exactly `labels`, or 0 when there is none yet.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|sample| {
            sample.name == name
                && sample.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
        })
        .map_or(0.0, |sample| sample.value)
}

/// The host's `/metrics` page as text.
pub async fn text(host: &super::Host) -> String {
    let response = super::client()
        .get(host.url("/metrics"))
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

/// A fresh scrape of the host's `/metrics`, parsed.
pub async fn scrape(host: &super::Host) -> Vec<Sample> {
    parse(&text(host).await)
}
