//! The operators' figures as the page draws them: a chart a figure, each
//! a point a minute. Built on the server from the hour's readings
//! (`ops::history::view`), drawn by `ui::operations`.

use serde::{Deserialize, Serialize};

/// One figure over the hour: a point a minute, oldest first; none where a
/// mean has nothing to average.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Chart {
    pub title: String,
    /// The figure in words, as it stands now.
    pub now: String,
    pub points: Vec<Option<f64>>,
    /// Each point's minute (`HH:MM`).
    pub times: Vec<String>,
    /// Counts a minute are bars; levels and means are a line.
    pub bars: bool,
    /// A limit drawn across the chart (the pool's size).
    pub ceiling: Option<f64>,
}

impl Chart {
    pub fn bars(title: &str, now: String, points: Vec<Option<f64>>, times: &[String]) -> Chart {
        Chart {
            title: title.to_owned(),
            now,
            points,
            times: times.to_vec(),
            bars: true,
            ceiling: None,
        }
    }

    pub fn line(
        title: &str,
        now: String,
        points: Vec<Option<f64>>,
        ceiling: Option<f64>,
        times: &[String],
    ) -> Chart {
        Chart {
            title: title.to_owned(),
            now,
            points,
            times: times.to_vec(),
            bars: false,
            ceiling,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationsView {
    /// When the first reading shown was taken.
    pub since: String,
    /// How many minutes the charts cover.
    pub minutes: usize,
    pub charts: Vec<Chart>,
}
