//! Schema evolution: records written with other versions of a schema (fields reordered,
//! extra fields of every flat type, `int` where the reader has `long`, optional fields
//! left out) decode through the `Deserializer` exactly as apache-avro's own schema
//! resolution decodes them.

#![allow(deprecated)] // `to_avro_datum`: the reference on purpose.
#![allow(clippy::unwrap_used)] // test helpers

use std::sync::Arc;

use apache_avro::types::Value;
use apache_avro::{to_avro_datum, Schema};
use caudal_schemas::codec::decode_resolved;
use caudal_schemas::wire::write_header;
use caudal_schemas::{
    AvroRecord, Deserializer, EventType, InMemorySchemaStore, SensorReading, UserInteraction,
};
use proptest::prelude::*;
use serde_json::json;

/// A writer field: its JSON definition and the value written.
type Field = (serde_json::Value, Value);

#[derive(Debug, Clone)]
struct Extras {
    pick: [bool; 10],
    b: bool,
    i: i32,
    f: f32,
    s: String,
    bytes: Vec<u8>,
    e: u32,
    opt: Option<String>,
    fixed: [u8; 3],
    num: (u8, i64, f64),
}

fn extras() -> impl Strategy<Value = Extras> {
    (
        any::<[bool; 10]>(),
        any::<bool>(),
        any::<i32>(),
        any::<f32>(),
        ".{0,8}",
        proptest::collection::vec(any::<u8>(), 0..8),
        0u32..2,
        proptest::option::of(".{0,8}"),
        any::<[u8; 3]>(),
        (0u8..3, any::<i64>(), any::<f64>()),
    )
        .prop_map(|(pick, b, i, f, s, bytes, e, opt, fixed, num)| Extras {
            pick,
            b,
            i,
            f,
            s,
            bytes,
            e,
            opt,
            fixed,
            num,
        })
}

fn extra_fields(x: &Extras) -> Vec<Field> {
    let all: Vec<Field> = vec![
        (json!({"name": "x_null", "type": "null"}), Value::Null),
        (json!({"name": "x_bool", "type": "boolean"}), Value::Boolean(x.b)),
        (json!({"name": "x_int", "type": "int"}), Value::Int(x.i)),
        (json!({"name": "x_float", "type": "float"}), Value::Float(x.f)),
        (json!({"name": "x_string", "type": "string", "default": ""}), Value::String(x.s.clone())),
        (json!({"name": "x_bytes", "type": "bytes"}), Value::Bytes(x.bytes.clone())),
        (
            json!({"name": "x_enum", "type": {"type": "enum", "name": "Unit", "symbols": ["F", "C"]}}),
            Value::Enum(x.e, ["F", "C"][x.e as usize].to_owned()),
        ),
        (
            json!({"name": "x_opt", "type": ["null", "string"], "default": null}),
            match &x.opt {
                None => Value::Union(0, Box::new(Value::Null)),
                Some(s) => Value::Union(1, Box::new(Value::String(s.clone()))),
            },
        ),
        (
            json!({"name": "x_fixed", "type": {"type": "fixed", "name": "F3", "size": 3}}),
            Value::Fixed(3, x.fixed.to_vec()),
        ),
        (
            json!({"name": "x_num", "type": ["null", "long", "double"]}),
            match x.num.0 {
                0 => Value::Union(0, Box::new(Value::Null)),
                1 => Value::Union(1, Box::new(Value::Long(x.num.1))),
                _ => Value::Union(2, Box::new(Value::Double(x.num.2))),
            },
        ),
    ];
    all.into_iter().zip(x.pick).filter(|(_, keep)| *keep).map(|(f, _)| f).collect()
}

/// Builds the writer schema and datum from fields in an order given by `keys`.
fn writer(name: &str, mut fields: Vec<Field>, keys: &[u16]) -> (Schema, Vec<u8>) {
    // No keys: the given order (reader fields first, extras appended).
    let mut order: Vec<usize> = (0..fields.len()).collect();
    if !keys.is_empty() {
        order.sort_by_key(|i| keys.get(*i).copied().unwrap_or(0));
    }
    let mut slots: Vec<Option<Field>> = fields.drain(..).map(Some).collect();
    let ordered: Vec<Field> = order.iter().map(|i| slots[*i].take().unwrap()).collect();
    let defs: Vec<serde_json::Value> = ordered.iter().map(|(d, _)| d.clone()).collect();
    let schema = Schema::parse_str(
        &json!({"type": "record", "name": name, "namespace": "io.caudal", "fields": defs}).to_string(),
    )
    .unwrap();
    let value = Value::Record(
        ordered.into_iter().map(|(d, v)| (d["name"].as_str().unwrap().to_owned(), v)).collect(),
    );
    let bytes = to_avro_datum(&schema, value).unwrap();
    (schema, bytes)
}

/// Decodes through the deserializer (writer registered under id 9) and through
/// apache-avro's resolution; both must give `expected`.
fn check<T: AvroRecord + PartialEq + std::fmt::Debug>(writer: &Schema, payload: &[u8], expected: &T) {
    let store = Arc::new(InMemorySchemaStore::new());
    store.insert(9, writer.clone()).unwrap();
    let mut message = Vec::new();
    write_header(&mut message, 9);
    message.extend_from_slice(payload);
    let mut de = Deserializer::<T>::new(store);
    let ours = de.deserialize(&message).unwrap();
    let reference: T = decode_resolved(writer, Some(T::schema()), payload).unwrap();
    assert_eq!(ours.to_vec(), reference.to_vec(), "deserializer vs apache-avro resolution");
    assert_eq!(ours.to_vec(), expected.to_vec());
    // Every strict prefix is an error, not a panic.
    for cut in 0..payload.len() {
        let err = de.deserialize(&message[..5 + cut]).unwrap_err();
        assert!(err.is_bad_data(), "{err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sensor_reading_from_other_versions(
        sensor_id in any::<i32>(),
        wide_id in any::<bool>(),
        plain_ts in any::<bool>(),
        ts in any::<i64>(),
        doubles in any::<[f64; 3]>(),
        x in extras(),
        keys in proptest::collection::vec(any::<u16>(), 15),
        appended in any::<bool>(),
    ) {
        let keys = if appended { Vec::new() } else { keys };
        let expected = SensorReading {
            sensor_id: i64::from(sensor_id),
            ts,
            lat: doubles[0],
            lon: doubles[1],
            temp_f: doubles[2],
        };
        let mut fields: Vec<Field> = vec![
            if wide_id {
                (json!({"name": "sensor_id", "type": "long"}), Value::Long(expected.sensor_id))
            } else {
                (json!({"name": "sensor_id", "type": "int"}), Value::Int(sensor_id))
            },
            if plain_ts {
                (json!({"name": "ts", "type": "long"}), Value::Long(ts))
            } else {
                (
                    json!({"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}),
                    Value::TimestampMillis(ts),
                )
            },
            (json!({"name": "lat", "type": "double"}), Value::Double(expected.lat)),
            (json!({"name": "lon", "type": "double"}), Value::Double(expected.lon)),
            (json!({"name": "temp_f", "type": "double"}), Value::Double(expected.temp_f)),
        ];
        fields.extend(extra_fields(&x));
        let (schema, payload) = writer("SensorReading", fields, &keys);
        check(&schema, &payload, &expected);
    }

    #[test]
    fn user_interaction_from_other_versions(
        user_id in ".{0,8}",
        event in 0usize..3,
        ts in any::<i64>(),
        page_url in proptest::option::of(".{0,12}"),
        write_page_url in any::<bool>(),
        x in extras(),
        keys in proptest::collection::vec(any::<u16>(), 15),
        appended in any::<bool>(),
    ) {
        let keys = if appended { Vec::new() } else { keys };
        let event_type = EventType::ALL[event];
        let expected = UserInteraction {
            user_id: user_id.clone(),
            event_type,
            ts,
            page_url: if write_page_url { page_url.clone() } else { None },
        };
        let mut fields: Vec<Field> = vec![
            (json!({"name": "user_id", "type": "string"}), Value::String(user_id)),
            (
                json!({"name": "event_type", "type": {"type": "enum", "name": "EventType",
                    "symbols": ["CLICK", "VIEW", "PURCHASE"]}}),
                Value::Enum(event as u32, event_type.as_str().to_owned()),
            ),
            (
                json!({"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}),
                Value::TimestampMillis(ts),
            ),
        ];
        if write_page_url {
            fields.push((
                json!({"name": "page_url", "type": ["null", "string"], "default": null}),
                match page_url {
                    None => Value::Union(0, Box::new(Value::Null)),
                    Some(u) => Value::Union(1, Box::new(Value::String(u))),
                },
            ));
        }
        fields.extend(extra_fields(&x));
        let (schema, payload) = writer("UserInteraction", fields, &keys);
        check(&schema, &payload, &expected);
    }
}
