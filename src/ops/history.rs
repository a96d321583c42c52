//! The last hour of the operators' figures: one reading of every metric a
//! minute, kept in memory (this instance's, gone at a restart, as its
//! counters are), and the charts the operators' page draws from them.
//! Counters become "how many in each minute", gauges stay levels, and
//! latencies become each minute's mean.

use crate::ui::figures::{Chart, OperationsView};
use chrono::{DateTime, Utc};
use prometheus::proto::MetricFamily;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// An hour of readings, one a minute, and the one that starts the hour.
const KEPT: usize = 61;

/// A latency's running total: seconds summed and requests counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sum {
    pub seconds: f64,
    pub count: f64,
}

/// Every figure at one moment. Counters are totals since the start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    pub at: DateTime<Utc>,
    pub steps: f64,
    pub unknowns: f64,
    /// Unknowns given their real outcome, by how (lookup, second look, person).
    pub settled: BTreeMap<String, f64>,
    pub reconcile: Sum,
    pub in_flight: f64,
    /// Execute requests' answer time, by system.
    pub latency: BTreeMap<String, Sum>,
    pub compensations: f64,
    pub unwinds: f64,
    pub approvals_expired: f64,
    pub approvals_waiting: f64,
    pub approvals_oldest_seconds: f64,
    pub corrections_pending: f64,
    pub db_in_use: f64,
    pub db_max: f64,
    /// Each limit's use by its busiest scope, as a share of its maximum.
    pub limit_used: BTreeMap<String, f64>,
}

impl Reading {
    /// The figures in a gathering of the registry.
    pub fn of(families: &[MetricFamily]) -> Reading {
        let mut reading = Reading {
            at: Utc::now(),
            ..Reading::default()
        };
        for family in families {
            for metric in family.get_metric() {
                let label = |name: &str| {
                    metric
                        .get_label()
                        .iter()
                        .find(|pair| pair.name() == name)
                        .map(|pair| pair.value().to_owned())
                        .unwrap_or_default()
                };
                let counter = metric.get_counter().get_value();
                let gauge = metric.get_gauge().get_value();
                let histogram = metric.get_histogram();
                let sum = Sum {
                    seconds: histogram.get_sample_sum(),
                    count: histogram.get_sample_count() as f64,
                };
                match family.name() {
                    "saga_steps_total" => reading.steps += counter,
                    "saga_unknown_outcomes_total" => reading.unknowns += counter,
                    "saga_unknowns_settled_total" => {
                        *reading.settled.entry(label("how")).or_default() += counter
                    }
                    "saga_reconcile_seconds" => {
                        reading.reconcile.seconds += sum.seconds;
                        reading.reconcile.count += sum.count;
                    }
                    "saga_calls_in_flight" => reading.in_flight += gauge,
                    "saga_system_request_seconds" if label("request") == "execute" => {
                        let system = reading.latency.entry(label("system")).or_default();
                        system.seconds += sum.seconds;
                        system.count += sum.count;
                    }
                    "saga_compensations_total" => reading.compensations += counter,
                    "saga_unwinds_total" => reading.unwinds += counter,
                    "saga_approvals_expired_total" => reading.approvals_expired += counter,
                    "saga_approvals_waiting" => reading.approvals_waiting += gauge,
                    "saga_approvals_oldest_wait_seconds" => {
                        reading.approvals_oldest_seconds =
                            reading.approvals_oldest_seconds.max(gauge)
                    }
                    "saga_corrections_pending" => reading.corrections_pending += gauge,
                    "saga_db_connections" if label("state") == "in_use" => {
                        reading.db_in_use += gauge
                    }
                    "saga_db_connections_max" => reading.db_max = gauge,
                    "saga_limit_used_ratio" => {
                        reading.limit_used.insert(label("limit"), gauge);
                    }
                    _ => {}
                }
            }
        }
        reading
    }
}

/// The readings of the last hour, oldest first.
#[derive(Default)]
pub struct History {
    readings: Mutex<VecDeque<Reading>>,
}

impl History {
    pub fn record(&self, reading: Reading) {
        let mut readings = self.readings.lock().unwrap_or_else(|e| e.into_inner());
        readings.push_back(reading);
        while readings.len() > KEPT {
            readings.pop_front();
        }
    }

    pub fn readings(&self) -> Vec<Reading> {
        let readings = self.readings.lock().unwrap_or_else(|e| e.into_inner());
        readings.iter().cloned().collect()
    }
}

/// The page's charts from the hour's readings and one taken now: a point
/// for each interval between two readings (the last one the minute under
/// way).
pub fn view(mut readings: Vec<Reading>, now: Reading) -> OperationsView {
    let since = readings.first().map_or(now.at, |first| first.at);
    readings.push(now);
    let pairs: Vec<(&Reading, &Reading)> = readings.iter().zip(readings.iter().skip(1)).collect();
    let last = readings.last().expect("the reading taken now");
    let times: Vec<String> = pairs
        .iter()
        .map(|(_, to)| to.at.format("%H:%M").to_string())
        .collect();
    let per_minute = |figure: fn(&Reading) -> f64| -> Vec<Option<f64>> {
        pairs
            .iter()
            .map(|(from, to)| Some((figure(to) - figure(from)).max(0.0)))
            .collect()
    };
    let level = |figure: fn(&Reading) -> f64| -> Vec<Option<f64>> {
        pairs.iter().map(|(_, to)| Some(figure(to))).collect()
    };
    let mean = |figure: &dyn Fn(&Reading) -> Sum| -> Vec<Option<f64>> {
        pairs
            .iter()
            .map(|(from, to)| {
                let (a, b) = (figure(from), figure(to));
                let count = b.count - a.count;
                (count > 0.0).then(|| (b.seconds - a.seconds) / count)
            })
            .collect()
    };
    let total = |points: &[Option<f64>]| points.iter().flatten().sum::<f64>();
    let mut charts = Vec::new();
    let counted = |title: &str, points: Vec<Option<f64>>, what: &str| {
        let now = format!("{} {what} in the hour shown", total(&points));
        Chart::bars(title, now, points, &times)
    };
    charts.push(counted(
        "Steps per minute",
        per_minute(|r| r.steps),
        "steps",
    ));
    charts.push(counted(
        "Unknown outcomes per minute",
        per_minute(|r| r.unknowns),
        "unknown",
    ));
    let settled_by = |how: &'static str| {
        pairs
            .iter()
            .map(move |(from, to)| {
                let of = |r: &Reading| r.settled.get(how).copied().unwrap_or(0.0);
                (of(to) - of(from)).max(0.0)
            })
            .sum::<f64>()
    };
    let settled = per_minute(|r| r.settled.values().sum());
    let how = format!(
        "{} settled: {} by lookup, {} by a second look, {} by a person",
        total(&settled),
        settled_by("lookup"),
        settled_by("second_look"),
        settled_by("person"),
    );
    charts.push(Chart::bars(
        "Unknowns settled per minute",
        how,
        settled,
        &times,
    ));
    let reconcile = mean(&|r| r.reconcile);
    charts.push(Chart::line(
        "Reconcile time (mean, s)",
        latest_mean(&reconcile, "s"),
        reconcile,
        None,
        &times,
    ));
    charts.push(Chart::line(
        "Calls in flight",
        format!("{} now", last.in_flight),
        level(|r| r.in_flight),
        None,
        &times,
    ));
    for limit in last.limit_used.keys() {
        let points: Vec<Option<f64>> = pairs
            .iter()
            .map(|(_, to)| to.limit_used.get(limit).map(|ratio| ratio * 100.0))
            .collect();
        let now = last.limit_used.get(limit).copied().unwrap_or(0.0) * 100.0;
        charts.push(Chart::line(
            &format!("Limit “{limit}”: % used by its busiest agent, run or customer"),
            format!("{now:.0}% now"),
            points,
            Some(100.0),
            &times,
        ));
    }
    charts.push(Chart::line(
        "Approvals waiting",
        format!(
            "{} now; the oldest has waited {}",
            last.approvals_waiting,
            wait(last.approvals_oldest_seconds)
        ),
        level(|r| r.approvals_waiting),
        None,
        &times,
    ));
    charts.push(counted(
        "Approvals expired per minute",
        per_minute(|r| r.approvals_expired),
        "expired",
    ));
    charts.push(Chart::line(
        "Corrections waiting for sign-off",
        format!("{} now", last.corrections_pending),
        level(|r| r.corrections_pending),
        None,
        &times,
    ));
    charts.push(counted(
        "Unwinds per minute",
        per_minute(|r| r.unwinds),
        "unwinds",
    ));
    charts.push(counted(
        "Compensations per minute",
        per_minute(|r| r.compensations),
        "compensations",
    ));
    charts.push(Chart::line(
        "Database connections in use",
        format!("{} of {} now", last.db_in_use, last.db_max),
        level(|r| r.db_in_use),
        Some(last.db_max),
        &times,
    ));
    for system in last.latency.keys() {
        let points = mean(&|r: &Reading| r.latency.get(system).copied().unwrap_or_default());
        charts.push(Chart::line(
            &format!("{system}: answer time (mean, s)"),
            latest_mean(&points, "s"),
            points,
            None,
            &times,
        ));
    }
    OperationsView {
        since: since.format("%H:%M UTC").to_string(),
        minutes: pairs.len(),
        charts,
    }
}

/// The newest minute's mean, in words.
fn latest_mean(points: &[Option<f64>], unit: &str) -> String {
    match points.iter().rev().flatten().next() {
        Some(mean) => format!("{mean:.3} {unit} in the latest minute with a request"),
        None => "no request in the hour shown".to_owned(),
    }
}

fn wait(seconds: f64) -> String {
    match seconds as u64 {
        0 => "nothing".to_owned(),
        s if s < 120 => format!("{s} s"),
        s => format!("{} min", s / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64, steps: f64, waiting: f64) -> Reading {
        Reading {
            at: DateTime::from_timestamp(1_800_000_000 + minute * 60, 0).unwrap(),
            steps,
            approvals_waiting: waiting,
            ..Reading::default()
        }
    }

    #[test]
    fn each_limit_is_a_line_in_percent_with_its_maximum_drawn() {
        let mut first = at(0, 0.0, 0.0);
        first.limit_used.insert("refunds".into(), 0.25);
        let mut now = at(1, 0.0, 0.0);
        now.limit_used.insert("refunds".into(), 0.5);
        let view = view(vec![first], now);
        let chart = view
            .charts
            .iter()
            .find(|c| c.title.contains("“refunds”"))
            .unwrap();
        assert_eq!(chart.points, vec![Some(50.0)]);
        assert_eq!(chart.now, "50% now");
        assert_eq!(chart.ceiling, Some(100.0));
    }

    #[test]
    fn counters_become_counts_per_minute_and_gauges_stay_levels() {
        let view = view(vec![at(0, 0.0, 0.0), at(1, 3.0, 1.0)], at(2, 10.0, 2.0));
        assert_eq!(view.minutes, 2);
        let steps = &view.charts[0];
        assert_eq!(steps.title, "Steps per minute");
        assert_eq!(steps.points, vec![Some(3.0), Some(7.0)]);
        assert_eq!(steps.now, "10 steps in the hour shown");
        let waiting = view
            .charts
            .iter()
            .find(|c| c.title == "Approvals waiting")
            .unwrap();
        assert_eq!(waiting.points, vec![Some(1.0), Some(2.0)]);
    }

    #[test]
    fn a_latency_is_each_minutes_mean_and_a_minute_without_requests_has_none() {
        let mut first = at(0, 0.0, 0.0);
        let mut second = at(1, 0.0, 0.0);
        let mut now = at(2, 0.0, 0.0);
        first.reconcile = Sum {
            seconds: 0.0,
            count: 0.0,
        };
        second.reconcile = Sum {
            seconds: 3.0,
            count: 2.0,
        };
        now.reconcile = second.reconcile;
        let view = view(vec![first, second], now);
        let reconcile = view
            .charts
            .iter()
            .find(|c| c.title.starts_with("Reconcile"))
            .unwrap();
        assert_eq!(reconcile.points, vec![Some(1.5), None]);
    }

    #[test]
    fn the_history_keeps_one_hour() {
        let history = History::default();
        for minute in 0..100 {
            history.record(at(minute, 0.0, 0.0));
        }
        let readings = history.readings();
        assert_eq!(readings.len(), KEPT);
        assert_eq!(readings[0].at, at(39, 0.0, 0.0).at);
    }
}
