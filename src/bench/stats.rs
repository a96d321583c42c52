//! Figures and their rounds: every number the benchmark reports is the
//! median of one value per round, with the spread the rounds showed.
//! Ratios are taken round by round (both sides measured minutes apart on
//! the same noisy machine), then their median.

use serde_json::{json, Map, Value};

/// Which way a figure improves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

#[derive(Clone, Debug)]
pub struct Figure {
    pub key: String,
    pub unit: &'static str,
    pub better: Better,
    /// One value per round that measured it.
    pub rounds: Vec<f64>,
}

impl Figure {
    pub fn median(&self) -> Option<f64> {
        median(&self.rounds)
    }

    fn min(&self) -> Option<f64> {
        self.rounds.iter().copied().reduce(f64::min)
    }

    fn max(&self) -> Option<f64> {
        self.rounds.iter().copied().reduce(f64::max)
    }

    /// Half the range of the rounds, as a share of the median.
    pub fn spread(&self) -> Option<f64> {
        let median = self.median()?;
        if median == 0.0 {
            return None;
        }
        Some((self.max()? - self.min()?) / 2.0 / median)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "unit": self.unit,
            "better": match self.better { Better::Lower => "lower", Better::Higher => "higher" },
            "median": self.median(),
            "min": self.min(),
            "max": self.max(),
            "spread": self.spread(),
            "rounds": self.rounds,
        })
    }
}

/// Every figure, in the order first measured.
#[derive(Default)]
pub struct Figures {
    figures: Vec<Figure>,
    /// Why a figure or a whole group could not be measured.
    pub notes: Map<String, Value>,
}

impl Figures {
    pub fn record(&mut self, key: &str, unit: &'static str, better: Better, value: f64) {
        match self.figures.iter_mut().find(|f| f.key == key) {
            Some(figure) => figure.rounds.push(value),
            None => self.figures.push(Figure {
                key: key.to_owned(),
                unit,
                better,
                rounds: vec![value],
            }),
        }
    }

    pub fn note(&mut self, key: &str, why: impl Into<String>) {
        self.notes.insert(key.to_owned(), Value::String(why.into()));
    }

    pub fn get(&self, key: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.key == key)
    }

    pub fn all(&self) -> &[Figure] {
        &self.figures
    }

    /// The median over rounds of `a / b`, pairing values by round. Both
    /// figures must have been measured in the same rounds.
    pub fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        let (a, b) = (self.get(a)?, self.get(b)?);
        if a.rounds.len() != b.rounds.len() {
            return None;
        }
        let ratios: Vec<f64> = a
            .rounds
            .iter()
            .zip(&b.rounds)
            .filter(|(_, b)| **b != 0.0)
            .map(|(a, b)| a / b)
            .collect();
        median(&ratios)
    }
}

pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if !sorted.len().is_multiple_of(2) {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// The `p`-th percentile (0–100) by nearest rank.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles_by_nearest_rank() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 50.0), 50.0);
        assert_eq!(percentile(&hundred, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn ratios_pair_values_by_round() {
        let mut figures = Figures::default();
        for (a, b) in [(1.0, 2.0), (3.0, 3.0), (10.0, 5.0)] {
            figures.record("a", "ms", Better::Lower, a);
            figures.record("b", "ms", Better::Lower, b);
        }
        assert_eq!(figures.ratio("a", "b"), Some(1.0));
    }
}
