//! Object names of the archive: `date=YYYY-MM-DD/hour=HH/` partitions of event time (UTC).

/// The partition of event time `ts_ms`: `date=2026-01-01/hour=07`.
pub fn partition(ts_ms: i64) -> String {
    let secs = ts_ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let hour = secs.rem_euclid(86_400) / 3600;
    let (y, m, d) = civil_from_days(days);
    format!("date={y:04}-{m:02}-{d:02}/hour={hour:02}")
}

pub use caudal::calendar::civil_from_days;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(partition(0), "date=1970-01-01/hour=00");
        assert_eq!(partition(1_767_225_600_000), "date=2026-01-01/hour=00");
        assert_eq!(partition(1_767_225_600_000 + 7 * 3_600_000 + 59 * 60_000), "date=2026-01-01/hour=07");
        assert_eq!(partition(951_782_400_000), "date=2000-02-29/hour=00"); // leap day
        assert_eq!(partition(-1), "date=1969-12-31/hour=23");
        assert_eq!(partition(4_102_444_799_000), "date=2099-12-31/hour=23");
    }

    proptest::proptest! {
        #[test]
        fn consecutive_days_are_consecutive_dates(day in -1_000_000_i64..1_000_000) {
            let (y0, m0, d0) = civil_from_days(day);
            let (y1, m1, d1) = civil_from_days(day + 1);
            let next_day = (y1, m1, d1) == (y0, m0, d0 + 1);
            let next_month = d1 == 1 && ((y1 == y0 && m1 == m0 + 1) || (y1 == y0 + 1 && m0 == 12 && m1 == 1));
            proptest::prop_assert!(next_day || next_month, "{day}: {:?} -> {:?}", (y0, m0, d0), (y1, m1, d1));
        }
    }
}
