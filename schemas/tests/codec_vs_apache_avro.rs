//! The hand-written codecs against apache-avro, byte for byte, in both directions, and
//! arbitrary bytes against the decoders (an error or a value, never a panic).

#![allow(deprecated)] // `to_avro_datum` / `from_avro_datum`: the reference on purpose.
#![allow(clippy::unwrap_used)] // test helpers

use apache_avro::types::Value;
use apache_avro::{from_avro_datum, from_value, to_avro_datum};
use caudal_schemas::codec::{decode_resolved, encode_generic};
use caudal_schemas::{
    AlertKind, AvroRecord, DecodeError, Deserializer, EventType, InMemorySchemaStore, ProcessedReading,
    SchemaStore, SensorAlert, SensorReading, UserInteraction, UserInteractionCount, WindowStats,
};
use proptest::prelude::*;
use std::sync::Arc;

// --- apache-avro `Value`s built by hand, independent of serde ----------------------

fn record(fields: Vec<(&str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect())
}

fn sensor_value(r: &SensorReading) -> Value {
    record(vec![
        ("sensor_id", Value::Long(r.sensor_id)),
        ("ts", Value::TimestampMillis(r.ts)),
        ("lat", Value::Double(r.lat)),
        ("lon", Value::Double(r.lon)),
        ("temp_f", Value::Double(r.temp_f)),
    ])
}

fn processed_value(r: &ProcessedReading) -> Value {
    record(vec![
        ("sensor_id", Value::Long(r.sensor_id)),
        ("ts", Value::TimestampMillis(r.ts)),
        ("lat", Value::Double(r.lat)),
        ("lon", Value::Double(r.lon)),
        ("temp_c", Value::Double(r.temp_c)),
        ("temp_f", Value::Double(r.temp_f)),
        ("site", Value::String(r.site.clone())),
        ("name", Value::String(r.name.clone())),
    ])
}

fn window_value(r: &WindowStats) -> Value {
    record(vec![
        ("sensor_id", Value::Long(r.sensor_id)),
        ("window_start", Value::TimestampMillis(r.window_start)),
        ("window_end", Value::TimestampMillis(r.window_end)),
        ("count", Value::Long(r.count)),
        ("min_c", Value::Double(r.min_c)),
        ("max_c", Value::Double(r.max_c)),
        ("mean_c", Value::Double(r.mean_c)),
    ])
}

fn interaction_value(r: &UserInteraction) -> Value {
    let index = EventType::ALL.iter().position(|e| *e == r.event_type).unwrap();
    record(vec![
        ("user_id", Value::String(r.user_id.clone())),
        ("event_type", Value::Enum(index as u32, r.event_type.as_str().to_owned())),
        ("ts", Value::TimestampMillis(r.ts)),
        (
            "page_url",
            match &r.page_url {
                None => Value::Union(0, Box::new(Value::Null)),
                Some(u) => Value::Union(1, Box::new(Value::String(u.clone()))),
            },
        ),
    ])
}

// --- strategies --------------------------------------------------------------------

fn sensor() -> impl Strategy<Value = SensorReading> {
    (any::<i64>(), any::<i64>(), any::<f64>(), any::<f64>(), any::<f64>())
        .prop_map(|(sensor_id, ts, lat, lon, temp_f)| SensorReading { sensor_id, ts, lat, lon, temp_f })
}

fn processed() -> impl Strategy<Value = ProcessedReading> {
    (sensor(), any::<f64>(), ".{0,12}", ".{0,12}").prop_map(|(s, temp_c, site, name)| ProcessedReading {
        sensor_id: s.sensor_id,
        ts: s.ts,
        lat: s.lat,
        lon: s.lon,
        temp_c,
        temp_f: s.temp_f,
        site,
        name,
    })
}

fn window() -> impl Strategy<Value = WindowStats> {
    (any::<[i64; 4]>(), any::<f64>(), any::<f64>(), any::<f64>()).prop_map(
        |([sensor_id, window_start, window_end, count], min_c, max_c, mean_c)| WindowStats {
            sensor_id,
            window_start,
            window_end,
            count,
            min_c,
            max_c,
            mean_c,
        },
    )
}

fn interaction() -> impl Strategy<Value = UserInteraction> {
    (
        any::<String>(),
        prop::sample::select(EventType::ALL.to_vec()),
        any::<i64>(),
        proptest::option::of(any::<String>()),
    )
        .prop_map(|(user_id, event_type, ts, page_url)| UserInteraction {
            user_id,
            event_type,
            ts,
            page_url,
        })
}

// --- the checks --------------------------------------------------------------------

/// Fast encode == apache-avro encode (both its `Value` and its serde path); apache-avro
/// decodes the fast bytes to the record; the fast path decodes apache-avro's bytes to the
/// record. Equality of records is checked through their encoding, which compares
/// doubles bit for bit (NaN included).
fn check_both_directions<T: AvroRecord + std::fmt::Debug>(rec: &T, value: Value) {
    let schema = T::schema();
    let fast = rec.to_vec();

    let reference = to_avro_datum(schema, value).unwrap();
    assert_eq!(fast, reference, "fast encode differs from to_avro_datum");
    let via_serde = encode_generic(schema, rec).unwrap();
    assert_eq!(fast, via_serde, "fast encode differs from apache-avro's serde path");

    // apache-avro reads what the fast path wrote.
    let decoded = from_avro_datum(schema, &mut fast.as_slice(), None).unwrap();
    let back: T = from_value(&decoded).unwrap();
    assert_eq!(back.to_vec(), fast, "from_avro_datum of fast bytes: {back:?}");
    let back: T = decode_resolved(schema, None, &fast).unwrap();
    assert_eq!(back.to_vec(), fast);

    // The fast path reads what apache-avro wrote.
    let back = T::from_slice(&reference).unwrap();
    assert_eq!(back.to_vec(), reference, "fast decode of apache bytes: {back:?}");
}

fn count_value(r: &UserInteractionCount) -> Value {
    let index = EventType::ALL.iter().position(|e| *e == r.event_type).unwrap();
    record(vec![
        ("user_id", Value::String(r.user_id.clone())),
        ("event_type", Value::Enum(index as u32, r.event_type.as_str().to_owned())),
        ("window_start", Value::TimestampMillis(r.window_start)),
        ("window_end", Value::TimestampMillis(r.window_end)),
        ("count", Value::Long(r.count)),
    ])
}

fn alert_value(r: &SensorAlert) -> Value {
    let index = AlertKind::ALL.iter().position(|k| *k == r.kind).unwrap();
    record(vec![
        ("sensor_id", Value::Long(r.sensor_id)),
        ("kind", Value::Enum(index as u32, r.kind.as_str().to_owned())),
        ("ts", Value::TimestampMillis(r.ts)),
        ("last_seen", Value::TimestampMillis(r.last_seen)),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sensor_alert_matches_apache_avro(
        sensor_id in any::<i64>(), kind in 0usize..2, ts in any::<i64>(), last_seen in any::<i64>(),
    ) {
        let r = SensorAlert { sensor_id, kind: AlertKind::ALL[kind], ts, last_seen };
        check_both_directions(&r, alert_value(&r));
        prop_assert_eq!(SensorAlert::from_slice(&r.to_vec()).unwrap(), r);
    }

    #[test]
    fn user_interaction_count_matches_apache_avro(
        user_id in ".{0,8}", event in 0usize..3, window_start in any::<i64>(), window_end in any::<i64>(),
        count in any::<i64>(),
    ) {
        let r = UserInteractionCount { user_id, event_type: EventType::ALL[event], window_start, window_end, count };
        check_both_directions(&r, count_value(&r));
        prop_assert_eq!(UserInteractionCount::from_slice(&r.to_vec()).unwrap(), r);
    }

    #[test]
    fn sensor_reading_matches_apache_avro(r in sensor()) {
        check_both_directions(&r, sensor_value(&r));
    }

    #[test]
    fn processed_reading_matches_apache_avro(r in processed()) {
        check_both_directions(&r, processed_value(&r));
    }

    #[test]
    fn window_stats_matches_apache_avro(r in window()) {
        check_both_directions(&r, window_value(&r));
    }

    #[test]
    fn user_interaction_matches_apache_avro(r in interaction()) {
        check_both_directions(&r, interaction_value(&r));
        // No floats: plain equality too.
        prop_assert_eq!(UserInteraction::from_slice(&r.to_vec()).unwrap(), r);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        let _ = SensorReading::from_slice(&bytes);
        let _ = ProcessedReading::from_slice(&bytes);
        let _ = WindowStats::from_slice(&bytes);
        let _ = UserInteraction::from_slice(&bytes);
        let mut buf = bytes.as_slice();
        let _ = UserInteraction::decode(&mut buf);
    }

    #[test]
    fn fast_decode_agrees_with_apache_avro_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..64)
    ) {
        agree_on_prefix::<SensorReading>(&bytes)?;
        agree_on_prefix::<UserInteraction>(&bytes)?;
        agree_on_prefix::<WindowStats>(&bytes)?;
    }

    #[test]
    fn truncated_records_are_errors(r in interaction(), cut in any::<prop::sample::Index>()) {
        let bytes = r.to_vec();
        let cut = cut.index(bytes.len());
        let err = UserInteraction::from_slice(&bytes[..cut]).unwrap_err();
        prop_assert!(err.is_bad_data(), "{}", err);
    }

    #[test]
    fn arbitrary_frames_never_panic(
        id in 0u32..4,
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let store = Arc::new(InMemorySchemaStore::new());
        store.register("a-value", SensorReading::schema()).unwrap();
        store.register("b-value", UserInteraction::schema()).unwrap();
        let mut frame = vec![0];
        frame.extend_from_slice(&id.to_be_bytes());
        frame.extend_from_slice(&bytes);
        // id 1: fast path; id 2: resolution of another record (fails); others unknown.
        let mut de = Deserializer::<SensorReading>::new(store);
        if let Err(e) = de.deserialize(&frame) {
            prop_assert!(e.is_bad_data(), "{}", e);
        }
        if let Err(e) = de.deserialize(&bytes) {
            prop_assert!(e.is_bad_data(), "{}", e);
        }
    }
}

/// Decodes a record from the front of `bytes` both ways. Whatever the fast path accepts,
/// apache-avro accepts with the same value and length; whatever apache-avro accepts, the
/// fast path accepts too, except varints whose 10th byte overflows 64 bits (apache-avro
/// drops the high bits, the fast path refuses them).
fn agree_on_prefix<T: AvroRecord>(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut fast_rest = bytes;
    let fast = T::decode(&mut fast_rest);
    let mut apache_rest = bytes;
    let apache = from_avro_datum(T::schema(), &mut apache_rest, None);
    match (fast, apache) {
        (Ok(fast), Ok(value)) => {
            let reference: T = from_value(&value).unwrap();
            prop_assert_eq!(fast.to_vec(), reference.to_vec());
            prop_assert_eq!(fast_rest.len(), apache_rest.len());
        }
        (Ok(_), Err(e)) => prop_assert!(false, "fast path accepted what apache-avro refused: {e}"),
        (Err(e), Ok(_)) => prop_assert!(
            matches!(e, caudal_schemas::Error::Decode(DecodeError::VarintOverflow)),
            "apache-avro accepted what the fast path refused: {e}"
        ),
        (Err(_), Err(_)) => {}
    }
    Ok(())
}

#[test]
fn every_checked_in_schema_parses_and_names_its_record() {
    for (schema, name) in [
        (SensorReading::schema(), "io.caudal.SensorReading"),
        (ProcessedReading::schema(), "io.caudal.ProcessedReading"),
        (WindowStats::schema(), "io.caudal.WindowStats"),
        (UserInteraction::schema(), "io.caudal.UserInteraction"),
    ] {
        let canonical = schema.canonical_form();
        assert!(canonical.contains(&format!("\"name\":\"{name}\"")), "{canonical}");
    }
    // The optional page URL defaults to null.
    let json: serde_json::Value = serde_json::from_str(UserInteraction::schema_json()).unwrap();
    assert_eq!(json["fields"][3]["default"], serde_json::Value::Null);
    assert_eq!(json["fields"][3]["type"], serde_json::json!(["null", "string"]));
}

#[test]
fn small_sensor_reading_is_compact() {
    let r = SensorReading { sensor_id: 1, ts: 1_700_000_000_000, lat: 0.0, lon: 0.0, temp_f: 0.0 };
    // 1 + 6 (varint of 1.7e12 zig-zagged) + 3 * 8.
    assert_eq!(r.to_vec().len(), 31);
}

/// `ProcessedReading` gained `site` and `name` (with defaults): BACKWARD compatible, and
/// bytes written with the schema before them read with empty ones.
#[test]
fn processed_readings_written_before_site_and_name_read_with_them_empty() {
    let old = caudal_schemas::codec::parse_schema(
        r#"{"type":"record","name":"ProcessedReading","namespace":"io.caudal","fields":[
            {"name":"sensor_id","type":"long"},
            {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"lat","type":"double"},{"name":"lon","type":"double"},
            {"name":"temp_c","type":"double"},{"name":"temp_f","type":"double"}]}"#,
    )
    .unwrap();
    caudal_schemas::compat::check_backward(ProcessedReading::schema(), &old).unwrap();
    let written = to_avro_datum(
        &old,
        record(vec![
            ("sensor_id", Value::Long(7)),
            ("ts", Value::TimestampMillis(1_000)),
            ("lat", Value::Double(1.0)),
            ("lon", Value::Double(2.0)),
            ("temp_c", Value::Double(20.0)),
            ("temp_f", Value::Double(68.0)),
        ]),
    )
    .unwrap();
    let read: ProcessedReading = decode_resolved(&old, Some(ProcessedReading::schema()), &written).unwrap();
    assert_eq!((read.sensor_id, read.site.as_str(), read.name.as_str()), (7, "", ""));
}
