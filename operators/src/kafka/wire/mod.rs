//! Caudal's own Kafka client, for what librdkafka cannot do (the transaction coordinator
//! client): one blocking connection per conversation, over TCP or TLS, authenticated as
//! librdkafka would be from the same `security.protocol`, `sasl.*` and `ssl.*` properties.

mod connection;
mod scram;
mod security;

pub(crate) use connection::{Connection, WireError};
pub use security::KafkaSecurity;
