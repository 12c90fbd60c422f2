//! The records of Caudal's jobs, their checked-in schemas and their fast codecs.
//!
//! Each struct mirrors one `schemas/avro/*.avsc` file field for field, in order;
//! `timestamp-millis` fields are `i64` milliseconds since the Unix epoch.

use std::fmt;
use std::sync::OnceLock;

use apache_avro::Schema;
use serde::{Deserialize, Serialize};

use crate::codec::{
    get_double, get_index, get_long, get_string, parse_embedded, put_double, put_long, put_string, AvroRecord,
};
use crate::error::Result;

/// `schemas/avro/sensor_reading.avsc`.
pub const SENSOR_READING_AVSC: &str = include_str!("../avro/sensor_reading.avsc");
/// `schemas/avro/processed_reading.avsc`.
pub const PROCESSED_READING_AVSC: &str = include_str!("../avro/processed_reading.avsc");
/// `schemas/avro/window_stats.avsc`.
pub const WINDOW_STATS_AVSC: &str = include_str!("../avro/window_stats.avsc");
/// `schemas/avro/user_interaction.avsc`.
pub const USER_INTERACTION_AVSC: &str = include_str!("../avro/user_interaction.avsc");
/// `schemas/avro/user_interaction_count.avsc`.
pub const USER_INTERACTION_COUNT_AVSC: &str = include_str!("../avro/user_interaction_count.avsc");
/// `schemas/avro/sensor_alert.avsc`.
pub const SENSOR_ALERT_AVSC: &str = include_str!("../avro/sensor_alert.avsc");

/// A raw reading in °F (`io.caudal.SensorReading`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensorReading {
    /// Sensor identifier; the Kafka record key.
    pub sensor_id: i64,
    /// Event time, ms since the Unix epoch.
    pub ts: i64,
    /// Latitude in degrees.
    pub lat: f64,
    /// Longitude in degrees.
    pub lon: f64,
    /// Temperature in °F.
    pub temp_f: f64,
}

impl AvroRecord for SensorReading {
    fn schema_json() -> &'static str {
        SENSOR_READING_AVSC
    }

    fn schema() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| parse_embedded(SENSOR_READING_AVSC))
    }

    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(44);
        put_long(out, self.sensor_id);
        put_long(out, self.ts);
        put_double(out, self.lat);
        put_double(out, self.lon);
        put_double(out, self.temp_f);
    }

    #[inline]
    fn decode(buf: &mut &[u8]) -> Result<Self> {
        Ok(Self {
            sensor_id: get_long(buf)?,
            ts: get_long(buf)?,
            lat: get_double(buf)?,
            lon: get_double(buf)?,
            temp_f: get_double(buf)?,
        })
    }
}

/// A reading converted to °C (`io.caudal.ProcessedReading`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessedReading {
    /// Sensor identifier; the Kafka record key.
    pub sensor_id: i64,
    /// Event time, ms since the Unix epoch.
    pub ts: i64,
    /// Latitude in degrees.
    pub lat: f64,
    /// Longitude in degrees.
    pub lon: f64,
    /// Temperature in °C.
    pub temp_c: f64,
    /// Temperature in °F, as read.
    pub temp_f: f64,
    /// The sensor's site, from its metadata (`--sensor-metadata`); empty when the job does
    /// not enrich, or the sensor is not in the table. (Empty, not null: the serving sinks'
    /// columns are `NOT NULL`, derived from the fields.)
    #[serde(default)]
    pub site: String,
    /// The sensor's name, from its metadata; empty as `site`.
    #[serde(default)]
    pub name: String,
}

impl AvroRecord for ProcessedReading {
    fn schema_json() -> &'static str {
        PROCESSED_READING_AVSC
    }

    fn schema() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| parse_embedded(PROCESSED_READING_AVSC))
    }

    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(52);
        put_long(out, self.sensor_id);
        put_long(out, self.ts);
        put_double(out, self.lat);
        put_double(out, self.lon);
        put_double(out, self.temp_c);
        put_double(out, self.temp_f);
        put_string(out, &self.site);
        put_string(out, &self.name);
    }

    #[inline]
    fn decode(buf: &mut &[u8]) -> Result<Self> {
        Ok(Self {
            sensor_id: get_long(buf)?,
            ts: get_long(buf)?,
            lat: get_double(buf)?,
            lon: get_double(buf)?,
            temp_c: get_double(buf)?,
            temp_f: get_double(buf)?,
            site: get_string(buf)?,
            name: get_string(buf)?,
        })
    }
}

/// Per-sensor statistics over `[window_start, window_end)` (`io.caudal.WindowStats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    /// Sensor identifier; the Kafka record key.
    pub sensor_id: i64,
    /// Window start, inclusive, ms since the Unix epoch.
    pub window_start: i64,
    /// Window end, exclusive, ms since the Unix epoch.
    pub window_end: i64,
    /// Number of readings in the window.
    pub count: i64,
    /// Minimum temperature in °C.
    pub min_c: f64,
    /// Maximum temperature in °C.
    pub max_c: f64,
    /// Mean temperature in °C.
    pub mean_c: f64,
}

impl AvroRecord for WindowStats {
    fn schema_json() -> &'static str {
        WINDOW_STATS_AVSC
    }

    fn schema() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| parse_embedded(WINDOW_STATS_AVSC))
    }

    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(64);
        put_long(out, self.sensor_id);
        put_long(out, self.window_start);
        put_long(out, self.window_end);
        put_long(out, self.count);
        put_double(out, self.min_c);
        put_double(out, self.max_c);
        put_double(out, self.mean_c);
    }

    #[inline]
    fn decode(buf: &mut &[u8]) -> Result<Self> {
        Ok(Self {
            sensor_id: get_long(buf)?,
            window_start: get_long(buf)?,
            window_end: get_long(buf)?,
            count: get_long(buf)?,
            min_c: get_double(buf)?,
            max_c: get_double(buf)?,
            mean_c: get_double(buf)?,
        })
    }
}

/// What a user did (`io.caudal.EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventType {
    /// `CLICK`
    #[serde(rename = "CLICK")]
    Click,
    /// `VIEW`
    #[serde(rename = "VIEW")]
    View,
    /// `PURCHASE`
    #[serde(rename = "PURCHASE")]
    Purchase,
}

impl EventType {
    /// All symbols in schema order (the Avro enum index is the position).
    pub const ALL: [EventType; 3] = [EventType::Click, EventType::View, EventType::Purchase];

    /// The Avro symbol.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Click => "CLICK",
            EventType::View => "VIEW",
            EventType::Purchase => "PURCHASE",
        }
    }

    fn index(self) -> i64 {
        match self {
            EventType::Click => 0,
            EventType::View => 1,
            EventType::Purchase => 2,
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One user interaction on the web site (`io.caudal.UserInteraction`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInteraction {
    /// User identifier; the Kafka record key.
    pub user_id: String,
    /// What the user did.
    pub event_type: EventType,
    /// Event time, ms since the Unix epoch.
    pub ts: i64,
    /// The page, when known (`["null", "string"]`, default null).
    pub page_url: Option<String>,
}

impl AvroRecord for UserInteraction {
    fn schema_json() -> &'static str {
        USER_INTERACTION_AVSC
    }

    fn schema() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| parse_embedded(USER_INTERACTION_AVSC))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_string(out, &self.user_id);
        put_long(out, self.event_type.index());
        put_long(out, self.ts);
        match &self.page_url {
            None => put_long(out, 0),
            Some(url) => {
                put_long(out, 1);
                put_string(out, url);
            }
        }
    }

    fn decode(buf: &mut &[u8]) -> Result<Self> {
        let user_id = get_string(buf)?;
        let event_type = EventType::ALL[get_index(buf, EventType::ALL.len(), "enum")?];
        let ts = get_long(buf)?;
        let page_url = match get_index(buf, 2, "union")? {
            0 => None,
            _ => Some(get_string(buf)?),
        };
        Ok(Self { user_id, event_type, ts, page_url })
    }
}

/// Interactions of one user and kind in a window (`io.caudal.UserInteractionCount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInteractionCount {
    /// User identifier; the Kafka record key.
    pub user_id: String,
    /// What the user did.
    pub event_type: EventType,
    /// Window start, inclusive, ms since the Unix epoch.
    pub window_start: i64,
    /// Window end, exclusive, ms since the Unix epoch.
    pub window_end: i64,
    /// Interactions in the window.
    pub count: i64,
}

impl AvroRecord for UserInteractionCount {
    fn schema_json() -> &'static str {
        USER_INTERACTION_COUNT_AVSC
    }

    fn schema() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| parse_embedded(USER_INTERACTION_COUNT_AVSC))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_string(out, &self.user_id);
        put_long(out, self.event_type.index());
        put_long(out, self.window_start);
        put_long(out, self.window_end);
        put_long(out, self.count);
    }

    fn decode(buf: &mut &[u8]) -> Result<Self> {
        Ok(Self {
            user_id: get_string(buf)?,
            event_type: EventType::ALL[get_index(buf, EventType::ALL.len(), "enum")?],
            window_start: get_long(buf)?,
            window_end: get_long(buf)?,
            count: get_long(buf)?,
        })
    }
}

/// What a [`SensorAlert`] says (`io.caudal.AlertKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AlertKind {
    /// `SILENT`: no reading for the configured silence.
    #[serde(rename = "SILENT")]
    Silent,
    /// `RECOVERED`: the first reading after a silence.
    #[serde(rename = "RECOVERED")]
    Recovered,
}

impl AlertKind {
    /// All symbols in schema order (the Avro enum index is the position).
    pub const ALL: [AlertKind; 2] = [AlertKind::Silent, AlertKind::Recovered];

    /// The Avro symbol.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Silent => "SILENT",
            AlertKind::Recovered => "RECOVERED",
        }
    }

    fn index(self) -> i64 {
        match self {
            AlertKind::Silent => 0,
            AlertKind::Recovered => 1,
        }
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sensor went silent or recovered (`io.caudal.SensorAlert`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SensorAlert {
    /// Sensor identifier; the Kafka record key.
    pub sensor_id: i64,
    /// Silent or recovered.
    pub kind: AlertKind,
    /// Event time of the alert, ms since the Unix epoch.
    pub ts: i64,
    /// Event time of the last reading before the silence.
    pub last_seen: i64,
}

impl AvroRecord for SensorAlert {
    fn schema_json() -> &'static str {
        SENSOR_ALERT_AVSC
    }

    fn schema() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| parse_embedded(SENSOR_ALERT_AVSC))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_long(out, self.sensor_id);
        put_long(out, self.kind.index());
        put_long(out, self.ts);
        put_long(out, self.last_seen);
    }

    fn decode(buf: &mut &[u8]) -> Result<Self> {
        Ok(Self {
            sensor_id: get_long(buf)?,
            kind: AlertKind::ALL[get_index(buf, AlertKind::ALL.len(), "enum")?],
            ts: get_long(buf)?,
            last_seen: get_long(buf)?,
        })
    }
}
