//! Registry-aware serializer and deserializer of Confluent-framed Avro records.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apache_avro::Schema;

use crate::codec::{decode_resolved, AvroRecord};
use crate::error::{Error, Result};
use crate::registry::{subject_for_topic, SchemaStore};
use crate::transcode::Transcoder;
use crate::wire::{encode_framed, parse_frame};

/// Frames records of `T` with the id of `T`'s schema, registered once at construction.
pub struct Serializer<T> {
    schema_id: u32,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for Serializer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serializer").field("schema_id", &self.schema_id).finish()
    }
}

impl<T> Clone for Serializer<T> {
    fn clone(&self) -> Self {
        Self { schema_id: self.schema_id, _record: PhantomData }
    }
}

impl<T: AvroRecord> Serializer<T> {
    /// Registers `T::schema()` under `subject` (the store caches it) and keeps the id.
    pub fn register(store: &dyn SchemaStore, subject: &str) -> Result<Self> {
        let schema_id = store.register(subject, T::schema())?;
        Ok(Self::with_schema_id(schema_id))
    }

    /// Registers under `<topic>-value`.
    pub fn for_topic(store: &dyn SchemaStore, topic: &str) -> Result<Self> {
        Self::register(store, &subject_for_topic(topic))
    }

    /// A serializer for an id obtained elsewhere; the caller vouches that it is the id of
    /// `T::schema()`.
    pub fn with_schema_id(schema_id: u32) -> Self {
        Self { schema_id, _record: PhantomData }
    }

    /// The registered id written into every frame.
    pub fn schema_id(&self) -> u32 {
        self.schema_id
    }

    /// Appends the framed record to `out`.
    #[inline]
    pub fn serialize(&self, record: &T, out: &mut Vec<u8>) {
        encode_framed(self.schema_id, record, out);
    }

    /// The framed record in a new vector.
    pub fn to_vec(&self, record: &T) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.serialize(record, &mut out);
        out
    }
}

/// How bytes of one writer schema id are decoded.
enum Plan {
    /// The writer schema is `T::schema()`: hand-written decoder.
    Fast,
    /// Another version of a flat record: rewritten into `T`'s layout, then fast path
    /// (index into `Deserializer::transcoders`).
    Transcode(usize),
    /// Anything else: apache-avro schema resolution into `T::schema()`.
    Resolve(Arc<Schema>),
    /// The store did not know the id at the instant; retried after [`NEGATIVE_TTL`].
    Unknown(Instant),
}

/// The plans worth a shortcut past the map.
#[derive(Debug, Clone, Copy)]
enum Hot {
    Fast,
    Transcode(usize),
}

/// How long an unknown schema id is remembered before the store is asked again, so a
/// stream of garbage does not turn into a stream of registry requests.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);

/// Decodes Confluent-framed records into `T`: parses the frame, looks the writer schema
/// up by id (once per id) and decodes with the fast path when the writer schema equals
/// `T::schema()` (Parsing Canonical Form), else through schema resolution: a compiled
/// rewrite into `T`'s layout for other versions of a flat record (see
/// `transcode.rs`), apache-avro's resolution for the rest.
///
/// One per task: the cache is a plain map behind `&mut self`, no lock per record.
pub struct Deserializer<T> {
    store: Arc<dyn SchemaStore>,
    plans: HashMap<u32, Plan>,
    transcoders: Vec<Transcoder>,
    /// The plan of the last id seen, when it is a fast one: skips the map.
    last: Option<(u32, Hot)>,
    scratch: Vec<u8>,
    _record: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Deserializer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deserializer").field("known_ids", &self.plans.len()).finish_non_exhaustive()
    }
}

impl<T: AvroRecord> Deserializer<T> {
    /// A deserializer resolving writer schemas through `store`.
    pub fn new(store: Arc<dyn SchemaStore>) -> Self {
        Self {
            store,
            plans: HashMap::new(),
            transcoders: Vec::new(),
            last: None,
            scratch: Vec::new(),
            _record: PhantomData,
        }
    }

    /// Decodes one framed message.
    ///
    /// Bad data ([`Error::is_bad_data`]): [`Error::TruncatedHeader`], [`Error::BadMagic`],
    /// [`Error::UnknownSchemaId`], [`Error::Decode`], [`Error::Resolution`]. Anything
    /// else comes from the registry ([`Error::is_retryable`]).
    #[inline]
    pub fn deserialize(&mut self, bytes: &[u8]) -> Result<T> {
        let frame = parse_frame(bytes)?;
        match self.last {
            Some((id, Hot::Fast)) if id == frame.schema_id => T::from_slice(frame.payload),
            Some((id, Hot::Transcode(i))) if id == frame.schema_id => self.transcode(i, frame.payload),
            _ => self.deserialize_slow(frame.schema_id, frame.payload),
        }
    }

    /// The writer schema id of the last message decoded on the fast path as is (its
    /// writer schema is `T::schema()`).
    pub fn last_fast_id(&self) -> Option<u32> {
        match self.last {
            Some((id, Hot::Fast)) => Some(id),
            _ => None,
        }
    }

    #[inline]
    fn transcode(&mut self, index: usize, payload: &[u8]) -> Result<T> {
        let Some(transcoder) = self.transcoders.get_mut(index) else {
            return Err(Error::Resolution { writer_id: None, reason: "no transcoder".to_owned() });
        };
        transcoder.decode(payload, &mut self.scratch)
    }

    fn deserialize_slow(&mut self, id: u32, payload: &[u8]) -> Result<T> {
        let stale = match self.plans.get(&id) {
            None => true,
            Some(Plan::Unknown(at)) => at.elapsed() >= NEGATIVE_TTL,
            Some(_) => false,
        };
        if stale {
            let plan = match self.store.schema_by_id(id) {
                Ok(writer) if *writer == *T::schema() => Plan::Fast,
                Ok(writer) => match Transcoder::compile(&writer, T::schema()) {
                    Some(transcoder) => {
                        self.transcoders.push(transcoder);
                        Plan::Transcode(self.transcoders.len() - 1)
                    }
                    None => Plan::Resolve(writer),
                },
                Err(Error::UnknownSchemaId { .. }) => Plan::Unknown(Instant::now()),
                Err(e) => return Err(e),
            };
            self.plans.insert(id, plan);
        }
        match self.plans.get(&id) {
            Some(Plan::Fast) => {
                self.last = Some((id, Hot::Fast));
                T::from_slice(payload)
            }
            Some(Plan::Transcode(i)) => {
                let i = *i;
                self.last = Some((id, Hot::Transcode(i)));
                self.transcode(i, payload)
            }
            Some(Plan::Resolve(writer)) => {
                decode_resolved(writer, Some(T::schema()), payload).map_err(|e| match e {
                    Error::Resolution { reason, .. } => Error::Resolution { writer_id: Some(id), reason },
                    other => other,
                })
            }
            Some(Plan::Unknown(_)) | None => Err(Error::UnknownSchemaId { id }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{EventType, SensorReading, UserInteraction};
    use crate::registry::InMemorySchemaStore;

    fn reading() -> SensorReading {
        SensorReading { sensor_id: 3, ts: 1_700_000_000_123, lat: -33.9, lon: 151.2, temp_f: 68.5 }
    }

    #[test]
    fn round_trip_through_the_store_uses_the_fast_path() {
        let store = Arc::new(InMemorySchemaStore::new());
        let ser = Serializer::<SensorReading>::for_topic(store.as_ref(), "earth-temp").unwrap();
        assert_eq!(store.versions("earth-temp-value"), vec![ser.schema_id()]);
        let msg = ser.to_vec(&reading());
        let mut de = Deserializer::<SensorReading>::new(store);
        assert_eq!(de.deserialize(&msg).unwrap(), reading());
        assert_eq!(de.last_fast_id(), Some(ser.schema_id()));
        assert_eq!(de.deserialize(&msg).unwrap(), reading());
    }

    #[test]
    fn serdes_and_client_move_between_threads() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Deserializer<SensorReading>>();
        send_sync::<Serializer<SensorReading>>();
        send_sync::<crate::RegistryClient>();
        send_sync::<InMemorySchemaStore>();
    }

    #[test]
    fn bad_input_is_classified() {
        let store = Arc::new(InMemorySchemaStore::new());
        let ser = Serializer::<SensorReading>::register(store.as_ref(), "s").unwrap();
        let mut de = Deserializer::<SensorReading>::new(store);
        let msg = ser.to_vec(&reading());

        let err = de.deserialize(&[1, 0, 0, 0, 1, 0]).unwrap_err();
        assert!(matches!(err, Error::BadMagic { found: 1 }), "{err}");
        let err = de.deserialize(&[0, 0]).unwrap_err();
        assert!(matches!(err, Error::TruncatedHeader { len: 2 }), "{err}");
        let err = de.deserialize(&[0, 0, 0, 0, 99, 0]).unwrap_err();
        assert!(matches!(err, Error::UnknownSchemaId { id: 99 }), "{err}");
        let err = de.deserialize(&msg[..msg.len() - 1]).unwrap_err();
        assert!(matches!(err, Error::Decode(_)), "{err}");
        let mut long = msg.clone();
        long.push(0);
        let err = de.deserialize(&long).unwrap_err();
        assert!(err.to_string().contains("1 trailing bytes"), "{err}");
        assert!(err.is_bad_data());
        assert!(!err.is_retryable());
        // Still fine afterwards.
        assert_eq!(de.deserialize(&msg).unwrap(), reading());
    }

    #[test]
    fn writer_with_an_extra_defaulted_field_is_resolved() {
        // A newer producer added `unit` (with a default); this job still reads the old
        // reader schema and must drop the field.
        let writer = Schema::parse_str(
            r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
                {"name":"sensor_id","type":"long"},
                {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"lat","type":"double"},{"name":"lon","type":"double"},
                {"name":"temp_f","type":"double"},
                {"name":"unit","type":"string","default":"F"}]}"#,
        )
        .unwrap();
        let store = Arc::new(InMemorySchemaStore::new());
        store.insert(7, writer.clone()).unwrap();
        let r = reading();
        #[derive(serde::Serialize)]
        struct SensorReadingV2 {
            sensor_id: i64,
            ts: i64,
            lat: f64,
            lon: f64,
            temp_f: f64,
            unit: String,
        }
        let payload = crate::codec::encode_generic(
            &writer,
            &SensorReadingV2 {
                sensor_id: r.sensor_id,
                ts: r.ts,
                lat: r.lat,
                lon: r.lon,
                temp_f: r.temp_f,
                unit: "C".into(),
            },
        )
        .unwrap();
        let mut msg = Vec::new();
        crate::wire::write_header(&mut msg, 7);
        msg.extend_from_slice(&payload);

        let mut de = Deserializer::<SensorReading>::new(store);
        assert_eq!(de.deserialize(&msg).unwrap(), r);
        assert_eq!(de.last_fast_id(), None, "different writer: slow path");
        // The fast path would have seen trailing bytes.
        assert!(SensorReading::from_slice(&payload).is_err());
    }

    #[test]
    fn reader_with_a_new_defaulted_field_fills_the_default() {
        // The reader moved ahead: `UserInteraction` gained `session` with a default and
        // reads bytes of the old writer schema.
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct UserInteractionV2 {
            user_id: String,
            event_type: EventType,
            ts: i64,
            page_url: Option<String>,
            session: i64,
        }
        let reader = Schema::parse_str(
            r#"{"type":"record","name":"UserInteraction","namespace":"io.caudal","fields":[
                {"name":"user_id","type":"string"},
                {"name":"event_type","type":{"type":"enum","name":"EventType",
                    "symbols":["CLICK","VIEW","PURCHASE"]}},
                {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"page_url","type":["null","string"],"default":null},
                {"name":"session","type":"long","default":-1}]}"#,
        )
        .unwrap();
        crate::compat::check_backward(&reader, UserInteraction::schema()).unwrap();
        let old = UserInteraction {
            user_id: "u1".into(),
            event_type: EventType::Purchase,
            ts: 5,
            page_url: Some("/cart".into()),
        };
        let v2: UserInteractionV2 =
            decode_resolved(UserInteraction::schema(), Some(&reader), &old.to_vec()).unwrap();
        assert_eq!(
            v2,
            UserInteractionV2 {
                user_id: "u1".into(),
                event_type: EventType::Purchase,
                ts: 5,
                page_url: Some("/cart".into()),
                session: -1,
            }
        );
    }

    #[test]
    fn unresolvable_writer_is_a_resolution_error_with_the_id() {
        let writer = Schema::parse_str(
            r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
                {"name":"sensor_id","type":"string"}]}"#,
        )
        .unwrap();
        let store = Arc::new(InMemorySchemaStore::new());
        store.insert(5, writer).unwrap();
        let mut de = Deserializer::<SensorReading>::new(store);
        let err = de.deserialize(&[0, 0, 0, 0, 5, 2, b'x']).unwrap_err();
        assert!(matches!(err, Error::Resolution { writer_id: Some(5), .. }), "{err}");
        assert!(err.is_bad_data());
    }
}
