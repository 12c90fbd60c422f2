//! Caudal schemas: Avro `.avsc` files, codecs, the Confluent wire format and a
//! schema-registry client.
//!
//! In: Avro bytes from Kafka. Out: typed records (and back).
