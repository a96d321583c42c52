//! The scorecards as a person reads them in a terminal, as JUnit XML for a
//! CI system, and as JSON.

use super::score::Card;
use std::fmt::Write as _;

/// The columns of the terminal table, each a criterion's figure.
const COLUMNS: &[(&str, &str)] = &[
    ("doubled_effects", "doubled"),
    ("irreversible_before_pivot", "early-irrev"),
    ("compensations_of_nothing", "undo-none"),
    ("corrections_to_strangers", "corr-wrong"),
    ("unsettled_unknowns", "unsettled"),
];

/// The table, then each missed criterion under its scenario.
pub fn table(cards: &[Card]) -> String {
    let mut out = String::new();
    let width = cards
        .iter()
        .map(|c| c.scenario.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let _ = write!(out, "{:<width$}  {:<6}", "scenario", "result");
    for (_, head) in COLUMNS {
        let _ = write!(out, "  {head:>11}");
    }
    let _ = writeln!(out, "  {:>7}  {:>5}  {:>7}", "refused", "steps", "wall s");
    for card in cards {
        let _ = write!(
            out,
            "{:<width$}  {:<6}",
            card.scenario,
            if card.passed { "pass" } else { "FAIL" }
        );
        for (criterion, _) in COLUMNS {
            let _ = write!(
                out,
                "  {:>11}",
                card.figures.get(*criterion).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(
            out,
            "  {:>7}  {:>5}  {:>7.1}",
            refused(card),
            card.figures.get("max_steps").copied().unwrap_or(0),
            card.seconds
        );
    }
    for card in cards.iter().filter(|c| !c.passed) {
        let _ = writeln!(out, "\n{} failed:", card.scenario);
        for miss in &card.misses {
            let _ = writeln!(out, "  ✗ {}", miss.line());
        }
    }
    let failed = cards.iter().filter(|c| !c.passed).count();
    let _ = writeln!(
        out,
        "\n{} of {} scenarios passed",
        cards.len() - failed,
        cards.len()
    );
    out
}

fn refused(card: &Card) -> u64 {
    card.figures
        .iter()
        .filter(|(name, _)| name.starts_with("refused."))
        .map(|(_, n)| n)
        .sum()
}

/// One `testcase` per scenario; a `failure` naming each missed criterion
/// with its evidence.
pub fn junit(cards: &[Card]) -> String {
    let failures = cards.iter().filter(|c| !c.passed).count();
    let total: f64 = cards.iter().map(|c| c.seconds).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"saga-harness eval\" tests=\"{}\" failures=\"{failures}\" time=\"{total:.3}\">",
        cards.len()
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"saga-harness eval\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{total:.3}\">",
        cards.len()
    );
    for card in cards {
        let _ = write!(
            out,
            "    <testcase classname=\"eval\" name=\"{}\" time=\"{:.3}\"",
            xml(&card.scenario),
            card.seconds
        );
        if card.passed {
            out.push_str("/>\n");
            continue;
        }
        out.push_str(">\n");
        let lines: Vec<String> = card.misses.iter().map(|m| m.line()).collect();
        let _ = writeln!(
            out,
            "      <failure message=\"{}\" type=\"scorecard\">{}</failure>",
            xml(&format!(
                "missed: {}",
                card.misses
                    .iter()
                    .map(|m| m.criterion.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            xml(&lines.join("\n"))
        );
        out.push_str("    </testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 has no place for other control characters.
            c if c.is_control() && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_in_junit_is_escaped_and_control_characters_dropped() {
        assert_eq!(
            super::xml("a <b> & \"c\"\u{7}"),
            "a &lt;b&gt; &amp; &quot;c&quot; "
        );
    }
}
