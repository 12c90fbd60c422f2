//! The source's budget for records that do not decode. Each one is counted, logged and
//! dead-lettered (when a topic is set) and the source goes on — until the records say that
//! the job cannot read its input at all, or more of them arrive than the job tolerates:
//! then the job fails, naming the cause, instead of finishing or running on with no output.
//!
//! - A bounded input of which every record this subtask read was bad fails at its end.
//! - [`ALL_BAD_LIMIT`] bad records with not one good one before them fail at once (an
//!   unbounded input written with a schema the job cannot read).
//! - With `max_bad_records_per_minute`, more than that many in any minute fail at once.

use caudal::{Error, Result};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Bad records with no good one before them after which the input is taken as unreadable.
pub(crate) const ALL_BAD_LIMIT: u64 = 1_000;

const MINUTE: Duration = Duration::from_secs(60);

/// Counts good and bad records of one source subtask against the budget.
#[derive(Debug)]
pub(crate) struct BadRecordBudget {
    topic: String,
    per_minute: Option<u64>,
    /// When the bad records of the last minute came (only with `per_minute`).
    recent: VecDeque<Instant>,
    good: u64,
    bad: u64,
    first_reason: Option<String>,
}

impl BadRecordBudget {
    pub(crate) fn new(topic: &str, per_minute: Option<u64>) -> Self {
        BadRecordBudget {
            topic: topic.to_owned(),
            per_minute,
            recent: VecDeque::new(),
            good: 0,
            bad: 0,
            first_reason: None,
        }
    }

    #[inline]
    pub(crate) fn good(&mut self) {
        self.good += 1;
    }

    /// A bad record at `now`: an error when it exhausts the budget.
    pub(crate) fn bad(&mut self, reason: &str, now: Instant) -> Result<()> {
        self.bad += 1;
        self.first_reason.get_or_insert_with(|| reason.to_owned());
        if self.good == 0 && self.bad >= ALL_BAD_LIMIT {
            return Err(self.unreadable(&format!("the first {} records read", self.bad)));
        }
        if let Some(limit) = self.per_minute {
            self.recent.push_back(now);
            while self.recent.front().is_some_and(|t| now.duration_since(*t) >= MINUTE) {
                self.recent.pop_front();
            }
            if self.recent.len() as u64 > limit {
                return Err(Error::BadRecord(format!(
                    "kafka source `{}`: {} records failed to decode within a minute, more than \
                     max_bad_records_per_minute ({limit}); the last: {reason}",
                    self.topic,
                    self.recent.len()
                )));
            }
        }
        Ok(())
    }

    /// The bounded input ended: an error when every record read was bad.
    pub(crate) fn at_end(&self) -> Result<()> {
        if self.bad > 0 && self.good == 0 {
            return Err(self.unreadable(&format!("all {} records read", self.bad)));
        }
        Ok(())
    }

    fn unreadable(&self, which: &str) -> Error {
        Error::BadRecord(format!(
            "kafka source `{}`: {which} failed to decode, not one succeeded: the job cannot read this \
             input (written with a schema it cannot resolve, or another format?). First: {}",
            self.topic,
            self.first_reason.as_deref().unwrap_or("unknown")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_input_of_bad_records_only_fails_at_its_end_naming_the_first_cause() {
        let mut b = BadRecordBudget::new("in", None);
        let now = Instant::now();
        b.bad("Missing field in record: \"ts\"", now).unwrap();
        b.bad("other", now).unwrap();
        let e = b.at_end().unwrap_err();
        assert!(!e.is_retryable());
        let e = e.to_string();
        assert!(e.contains("all 2 records") && e.contains("Missing field in record: \"ts\""), "{e}");
        // One good record is enough: the bad ones were skipped and counted, as configured.
        b.good();
        b.at_end().unwrap();
        assert!(BadRecordBudget::new("in", None).at_end().is_ok(), "an empty input is no error");
    }

    #[test]
    fn an_unreadable_unbounded_input_fails_after_the_limit_unless_a_record_was_good() {
        let now = Instant::now();
        let mut b = BadRecordBudget::new("in", None);
        for _ in 1..ALL_BAD_LIMIT {
            b.bad("x", now).unwrap();
        }
        assert!(b.bad("x", now).unwrap_err().to_string().contains("the first 1000 records"));
        let mut b = BadRecordBudget::new("in", None);
        b.good();
        for _ in 0..2 * ALL_BAD_LIMIT {
            b.bad("x", now).unwrap();
        }
    }

    #[test]
    fn more_bad_records_in_a_minute_than_the_budget_fail() {
        let t0 = Instant::now();
        let mut b = BadRecordBudget::new("in", Some(3));
        b.good();
        for i in 0..3 {
            b.bad("x", t0 + Duration::from_secs(i)).unwrap();
        }
        let e = b.bad("poison", t0 + Duration::from_secs(10)).unwrap_err().to_string();
        assert!(e.contains("4 records") && e.contains("(3)") && e.contains("poison"), "{e}");
        // Spread out, the same number is within the budget.
        let mut b = BadRecordBudget::new("in", Some(3));
        b.good();
        for i in 0..10 {
            b.bad("x", t0 + Duration::from_secs(30 * i)).unwrap();
        }
    }
}
