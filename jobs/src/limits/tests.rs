use super::*;

fn change(band: &str, lat: (f64, f64), c: (f64, f64), from_ts: i64) -> LimitChange {
    LimitChange { band: band.into(), lat_min: lat.0, lat_max: lat.1, min_c: c.0, max_c: c.1, from_ts }
}

#[test]
fn a_change_parses_from_json_and_bad_ones_say_why() {
    let ok = LimitChange::parse(
        r#"{"band":"tropics","lat_min":-23.5,"lat_max":23.5,"min_c":-10,"max_c":45,"from_ts":5}"#,
    );
    assert_eq!(ok, Ok(change("tropics", (-23.5, 23.5), (-10.0, 45.0), 5)));
    let always = LimitChange::parse(r#"{"band":"b","lat_min":0,"lat_max":1,"min_c":0,"max_c":1}"#).unwrap();
    assert_eq!(always.from_ts, MIN_WATERMARK, "no from_ts: in force from the beginning");
    for (line, says) in [
        ("not json", "expected"),
        (r#"{"band":"b","lat_min":0,"lat_max":1,"min_c":0}"#, "max_c"),
        (r#"{"band":"b","lat_min":0,"lat_max":1,"min_c":5,"max_c":1}"#, "min_c < max_c"),
        (r#"{"band":"b","lat_min":10,"lat_max":1,"min_c":0,"max_c":1}"#, "lat_min < lat_max"),
        (r#"{"band":"b","lat_min":0,"lat_max":100,"min_c":0,"max_c":1}"#, "<= 90"),
        (r#"{"band":"","lat_min":0,"lat_max":1,"min_c":0,"max_c":1}"#, "band"),
        (r#"{"band":"b","lat_min":0,"lat_max":1,"min_c":0,"max_c":1,"extra":1}"#, "unknown field"),
    ] {
        let err = LimitChange::parse(line).expect_err(line);
        assert!(err.contains(says), "{line}: `{err}` does not say `{says}`");
    }
}

#[test]
fn the_change_in_force_at_an_event_time_decides() {
    let mut limits = Limits::default();
    assert_eq!(limits.bounds(10.0, 0), DEFAULT_BOUNDS);
    limits.apply(change("north", (0.0, 90.0), (-20.0, 30.0), 1_000));
    limits.apply(change("north", (0.0, 90.0), (-5.0, 10.0), 3_000));
    limits.apply(change("south", (-90.0, 0.0), (0.0, 40.0), MIN_WATERMARK));
    let cases = [
        // (lat, ts, bounds)
        (10.0, 999, DEFAULT_BOUNDS),
        (10.0, 1_000, (-20.0, 30.0)),
        (10.0, 2_999, (-20.0, 30.0)),
        (10.0, 3_000, (-5.0, 10.0)),
        (-10.0, 0, (0.0, 40.0)),
        (0.0, 5_000, (-5.0, 10.0)),
    ];
    for (lat, ts, want) in cases {
        assert_eq!(limits.bounds(lat, ts), want, "lat {lat} at {ts}");
    }
    // The same band and time again: replaced.
    limits.apply(change("north", (0.0, 90.0), (-1.0, 1.0), 3_000));
    assert_eq!(limits.bounds(10.0, 3_000), (-1.0, 1.0));
    assert!(limits.plausible(10.0, 3_000, 0.5) && !limits.plausible(10.0, 3_000, 1.0));
}

#[test]
fn a_change_reads_back_what_state_and_checkpoints_wrote() {
    let c = change("north", (0.0, 90.0), (-5.0, 10.0), 3_000);
    let bytes = bincode::serde::encode_to_vec(vec![c.clone()], bincode::config::standard()).unwrap();
    let (back, _): (Vec<LimitChange>, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(back, vec![c.clone()]);
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(LimitChange::parse(&json), Ok(c));
}
