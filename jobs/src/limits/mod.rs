//! Dynamic anomaly limits (public API only): the −50 < °C < 60 bounds of the anomaly filter,
//! changed per latitude band while the job runs from a control stream (`--limits-file`,
//! `--limits-topic`), kept in broadcast state.
//!
//! **In:** readings keyed by sensor, and [`LimitChange`]s broadcast to every subtask.
//! **Out:** the readings within the limits in force at their event time.
//!
//! A change names its band (a latitude range) and the event time it takes effect from. A
//! reading waits in keyed state until the watermark — the minimum of the readings' and
//! the control stream's — passes its event time, so every change that takes effect at or
//! before it has arrived; it is then judged by the change of its band in force at that time
//! (the latest with `from_ts` ≤ its time), or by the default −50/60 outside every band. The
//! control stream goes idle when no change came for a while ([`CONTROL_IDLENESS`]), so a
//! quiet control stream does not hold the readings back: a change that comes later applies
//! to the readings not yet judged.

mod file;
mod filter;
mod input_end;

pub use file::{LimitLine, LimitsFile, SplitRejected, REJECTED_LIMITS};
pub use filter::LimitsFilter;
pub use input_end::{EndsWith, InputEnd, UntilInputEnds};

use caudal::types::MIN_WATERMARK;
use caudal::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The control stream is idle after this long without a change.
pub const CONTROL_IDLENESS: Duration = Duration::from_millis(500);

/// The bounds outside every band.
pub const DEFAULT_BOUNDS: (f64, f64) = (-50.0, 60.0);

/// A change of one band's limits: a line of `--limits-file` or a JSON record of
/// `--limits-topic`, e.g.
/// `{"band": "tropics", "lat_min": -23.5, "lat_max": 23.5, "min_c": -10, "max_c": 45, "from_ts": 1767225615000}`.
/// Readings with `lat_min ≤ lat < lat_max` and event time ≥ `from_ts` (ms since the epoch;
/// left out: from the beginning) are kept when `min_c < °C < max_c`. Checked when read: a
/// change that is not one (bad JSON, a field missing, `min_c ≥ max_c`, a latitude out of
/// range) is never applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "LimitFields")]
pub struct LimitChange {
    /// The band's name; a later change of the same name replaces it from its `from_ts` on.
    pub band: String,
    /// Southern edge, degrees (inclusive).
    pub lat_min: f64,
    /// Northern edge, degrees (exclusive).
    pub lat_max: f64,
    /// Lowest plausible °C (exclusive).
    pub min_c: f64,
    /// Highest plausible °C (exclusive).
    pub max_c: f64,
    /// Event time it takes effect from.
    pub from_ts: Timestamp,
}

/// The fields as read, checked into a [`LimitChange`]. The same fields in the same order as
/// `LimitChange` serializes them: state and checkpoints (bincode) read what they wrote.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitFields {
    band: String,
    lat_min: f64,
    lat_max: f64,
    min_c: f64,
    max_c: f64,
    #[serde(default = "from_the_beginning")]
    from_ts: Timestamp,
}

fn from_the_beginning() -> Timestamp {
    MIN_WATERMARK
}

impl TryFrom<LimitFields> for LimitChange {
    type Error = String;

    fn try_from(f: LimitFields) -> Result<Self, String> {
        if f.band.trim().is_empty() {
            return Err("band: must not be empty".into());
        }
        let finite = [f.lat_min, f.lat_max, f.min_c, f.max_c].iter().all(|v| v.is_finite());
        if !finite {
            return Err("lat_min, lat_max, min_c and max_c must be numbers".into());
        }
        if !(-90.0..=90.0).contains(&f.lat_min)
            || !(-90.0..=90.0).contains(&f.lat_max)
            || f.lat_min >= f.lat_max
        {
            return Err(format!("need -90 <= lat_min < lat_max <= 90, got {} .. {}", f.lat_min, f.lat_max));
        }
        if f.min_c >= f.max_c {
            return Err(format!("need min_c < max_c, got {} and {}", f.min_c, f.max_c));
        }
        Ok(LimitChange {
            band: f.band,
            lat_min: f.lat_min,
            lat_max: f.lat_max,
            min_c: f.min_c,
            max_c: f.max_c,
            from_ts: f.from_ts,
        })
    }
}

impl LimitChange {
    /// Parses one change (a line of the limits file).
    pub fn parse(text: &str) -> Result<LimitChange, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}

/// Every band's changes, oldest first: what is in force at any event time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    bands: BTreeMap<String, Vec<LimitChange>>,
}

impl Limits {
    /// The limits of these bands' change lists (as kept in broadcast state).
    pub fn from_bands(bands: impl IntoIterator<Item = (String, Vec<LimitChange>)>) -> Self {
        Limits { bands: bands.into_iter().collect() }
    }

    /// Adds `change` to its band's list (one taking effect at the same time replaces the
    /// earlier one); returns the band's list.
    pub fn apply(&mut self, change: LimitChange) -> &Vec<LimitChange> {
        let list = self.bands.entry(change.band.clone()).or_default();
        match list.binary_search_by_key(&change.from_ts, |c| c.from_ts) {
            Ok(i) => list[i] = change,
            Err(i) => list.insert(i, change),
        }
        list
    }

    /// The (min, max) °C bounds for a reading at `lat` and event time `ts`: those of the
    /// first band (by name) whose change in force at `ts` covers `lat`, else
    /// [`DEFAULT_BOUNDS`].
    pub fn bounds(&self, lat: f64, ts: Timestamp) -> (f64, f64) {
        self.bands
            .values()
            .filter_map(|changes| changes.iter().rev().find(|c| c.from_ts <= ts))
            .find(|c| c.lat_min <= lat && lat < c.lat_max)
            .map_or(DEFAULT_BOUNDS, |c| (c.min_c, c.max_c))
    }

    /// Whether `temp_c` at `lat` and `ts` is within the limits then.
    pub fn plausible(&self, lat: f64, ts: Timestamp, temp_c: f64) -> bool {
        let (min, max) = self.bounds(lat, ts);
        temp_c > min && temp_c < max
    }
}

#[cfg(test)]
mod tests;
