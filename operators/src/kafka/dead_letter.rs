//! Records a Kafka source could not decode, sent down the stream as dead letters and
//! written by a Kafka sink, in the same checkpoint epochs as the job's main output: with an
//! exactly-once sink each bad record lands in the dead-letter topic once, even across
//! crashes and restores (Kafka Streams' KIP-1034, with Flink's side outputs).
//!
//! Flow: `KafkaSource<Decoded<T>>` (its decoder wrapped by [`with_dead_letters`])
//! `─►` [`SplitDeadLetters`] `─► T` (main) and `─► DeadLetter` (side output
//! [`DEAD_LETTERS`]) `─► KafkaSink` with [`DeadLetterSerializer`]: key and value bytes as
//! they were read, and headers `caudal.source.topic`, `caudal.source.partition`,
//! `caudal.source.offset`, `caudal.operator` and `caudal.error`.

use super::source::{DecodeError, DecoderFactory, KafkaDecoder};
use super::KafkaSerializer;
use caudal::process::{Context, Output, OutputTag, ProcessFunction};
use caudal::{Data, DataStream, Result};
use rdkafka::message::{Header, OwnedHeaders};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A record that could not be decoded, with where it was read and why it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The topic it was read from.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// The operator that could not use it (the source's name).
    pub operator: String,
    /// Why.
    pub error: String,
    /// Its key, as read.
    pub key: Option<Vec<u8>>,
    /// Its value, as read.
    pub value: Vec<u8>,
}

/// What a dead-lettering Kafka source emits: a decoded record, or one that did not decode.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound(serialize = "T: Serialize", deserialize = "T: serde::de::DeserializeOwned"))]
pub enum Decoded<T> {
    /// A record of the stream.
    Record(T),
    /// A record that did not decode.
    DeadLetter(DeadLetter),
}

impl<T> Decoded<T> {
    /// The record, unless this is a dead letter (for [`caudal::WatermarkStrategy::lift`]).
    pub fn record(&self) -> Option<&T> {
        match self {
            Decoded::Record(t) => Some(t),
            Decoded::DeadLetter(_) => None,
        }
    }
}

/// The side output of [`SplitDeadLetters`].
pub static DEAD_LETTERS: OutputTag<DeadLetter> = OutputTag::new("dead-letters");

/// Decoders made by `factory`, whose bad records the source sends on as
/// [`Decoded::DeadLetter`] instead of only counting them.
pub fn with_dead_letters<T: 'static>(factory: DecoderFactory<T>) -> DecoderFactory<Decoded<T>> {
    Arc::new(move || Ok(Box::new(DeadLettering(factory()?)) as Box<dyn KafkaDecoder<Decoded<T>>>))
}

struct DeadLettering<T>(Box<dyn KafkaDecoder<T>>);

impl<T> KafkaDecoder<Decoded<T>> for DeadLettering<T> {
    fn decode(&mut self, key: Option<&[u8]>, value: &[u8]) -> std::result::Result<Decoded<T>, DecodeError> {
        self.0.decode(key, value).map(Decoded::Record)
    }

    fn dead_letter(&mut self, letter: DeadLetter) -> Option<Decoded<T>> {
        Some(Decoded::DeadLetter(letter))
    }
}

/// Splits a dead-lettering source's stream: records on, dead letters to [`DEAD_LETTERS`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SplitDeadLetters;

impl<T: Data> ProcessFunction<Decoded<T>, T> for SplitDeadLetters {
    fn process_element(
        &mut self,
        e: Decoded<T>,
        ctx: &mut Context<'_>,
        out: &mut Output<'_, T>,
    ) -> Result<()> {
        match e {
            Decoded::Record(t) => out.collect(t),
            Decoded::DeadLetter(letter) => ctx.output(&DEAD_LETTERS, letter)?,
        }
        Ok(())
    }
}

/// `stream`'s records, and its dead letters, split by an operator named and identified `name`.
pub fn split_dead_letters<T: Data>(
    stream: DataStream<Decoded<T>>,
    name: &str,
) -> (DataStream<T>, DataStream<DeadLetter>) {
    let records = stream.process(SplitDeadLetters).name(name).uid(name);
    let letters = records.side_output(&DEAD_LETTERS);
    (records, letters)
}

/// Writes a dead letter as it was read, with where it came from and why in its headers.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeadLetterSerializer;

impl KafkaSerializer<DeadLetter> for DeadLetterSerializer {
    fn serialize(&mut self, letter: &DeadLetter, key: &mut Vec<u8>, value: &mut Vec<u8>) -> Result<bool> {
        value.extend_from_slice(&letter.value);
        match &letter.key {
            Some(k) => {
                key.extend_from_slice(k);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn headers(&mut self, letter: &DeadLetter) -> Option<OwnedHeaders> {
        let (partition, offset) = (letter.partition.to_string(), letter.offset.to_string());
        fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a [u8]> {
            Header { key, value: Some(value.as_bytes()) }
        }
        Some(
            OwnedHeaders::new_with_capacity(5)
                .insert(header("caudal.source.topic", &letter.topic))
                .insert(header("caudal.source.partition", &partition))
                .insert(header("caudal.source.offset", &offset))
                .insert(header("caudal.operator", &letter.operator))
                .insert(header("caudal.error", &letter.error)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;

    #[test]
    fn a_dead_letter_is_written_as_read_with_its_origin_in_headers() {
        let letter = DeadLetter {
            topic: "in".into(),
            partition: 3,
            offset: 41,
            operator: "kafka-source".into(),
            error: "not Avro".into(),
            key: Some(b"k".to_vec()),
            value: vec![0, 1, 2],
        };
        let (mut key, mut value) = (Vec::new(), Vec::new());
        assert!(DeadLetterSerializer.serialize(&letter, &mut key, &mut value).unwrap());
        assert_eq!((key.as_slice(), value.as_slice()), (&b"k"[..], &[0u8, 1, 2][..]));
        let headers = DeadLetterSerializer.headers(&letter).unwrap();
        let got: Vec<(String, String)> = headers
            .iter()
            .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap()).into_owned()))
            .collect();
        let want = [
            ("caudal.source.topic", "in"),
            ("caudal.source.partition", "3"),
            ("caudal.source.offset", "41"),
            ("caudal.operator", "kafka-source"),
            ("caudal.error", "not Avro"),
        ];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
        let keyless = DeadLetter { key: None, ..letter };
        assert!(!DeadLetterSerializer.serialize(&keyless, &mut Vec::new(), &mut Vec::new()).unwrap());
    }
}
