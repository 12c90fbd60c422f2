//! Enrichment (public API only): each reading's sensor looked up in a PostgreSQL table of
//! sensor metadata through async I/O, its site and name put on the reading.
//!
//! **In:** readings. **Out:** the same readings, in the same order, with `site` and `name`
//! from `SELECT site, name FROM <table> WHERE sensor_id = $1` (empty when the sensor is not
//! in the table). Requests run concurrently (at most `capacity` per subtask); answers are
//! cached per sensor (`cache_entries`); a request that fails or times out is retried, and
//! after the retries the job fails naming the reading — or, with
//! [`LookupFailures::SideOutput`], the reading goes to the [`LOOKUP_FAILURES`] side output
//! with the error instead of on. The readings in flight at a checkpoint are part of it and
//! asked again after a restore: none is lost or doubled.

use crate::temperature::names;
use caudal::async_io::{AsyncFailure, AsyncOptions};
use caudal::process::{Context, Output, OutputTag, ProcessFunction};
use caudal::{DataStream, Error};
use caudal_operators::postgres::PostgresLookup;
use caudal_schemas::ProcessedReading;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where sensor metadata comes from, and how it is asked (`--sensor-metadata*`).
#[derive(Debug, Clone, PartialEq)]
pub struct SensorMetadata {
    /// `postgres://user[:password]@host:port/db`.
    pub url: String,
    /// The table (or view) with `sensor_id BIGINT`, `site TEXT`, `name TEXT`; may be
    /// schema-qualified (`ops.sensors`).
    pub table: String,
    /// How long one lookup may take.
    pub timeout: Duration,
    /// Lookups after the first, on an error or a timeout.
    pub retries: u32,
    /// Lookups in flight per subtask, at most.
    pub capacity: usize,
    /// Sensors whose answer is kept (0: ask every time).
    pub cache_entries: usize,
    /// What a reading whose lookups all failed does.
    pub failures: LookupFailures,
    /// With [`LookupFailures::SideOutput`] and the Kafka sink: the topic of the failures.
    pub failures_topic: Option<String>,
}

/// What a reading whose lookups all failed does (`--on-lookup-failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LookupFailures {
    /// The job fails naming the reading (restart it when the database is back).
    #[default]
    FailTheJob,
    /// The reading goes to [`LOOKUP_FAILURES`] with the error; the job goes on.
    SideOutput,
}

/// A reading whose lookups all failed ([`LookupFailures::SideOutput`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LookupFailure {
    /// The reading, not enriched.
    pub reading: ProcessedReading,
    /// The last attempt's error.
    pub error: String,
    /// Attempts made.
    pub attempts: u32,
}

/// The side output of the readings whose lookups all failed.
pub const LOOKUP_FAILURES: OutputTag<LookupFailure> = OutputTag::new("lookup-failures");

/// A lookup's answer.
type Answer = (ProcessedReading, Option<(String, String)>);

/// Puts an answer on its reading; a failure goes to [`LOOKUP_FAILURES`].
#[derive(Debug, Clone, Copy, Default)]
struct WithMetadata;

impl ProcessFunction<Result<Answer, AsyncFailure<ProcessedReading>>, ProcessedReading> for WithMetadata {
    fn process_element(
        &mut self,
        answer: Result<Answer, AsyncFailure<ProcessedReading>>,
        ctx: &mut Context<'_>,
        out: &mut Output<'_, ProcessedReading>,
    ) -> caudal::Result<()> {
        match answer {
            Ok(answer) => out.collect(with_metadata(answer)),
            Err(f) => ctx.output(
                &LOOKUP_FAILURES,
                LookupFailure { reading: f.element, error: f.error, attempts: f.attempts },
            )?,
        }
        Ok(())
    }
}

fn with_metadata((mut reading, found): Answer) -> ProcessedReading {
    if let Some((site, name)) = found {
        reading.site = site;
        reading.name = name;
    }
    reading
}

impl SensorMetadata {
    /// The defaults for `url`: table `sensors`, 2 s per lookup, 3 retries, 100 in flight,
    /// 100,000 cached sensors.
    pub fn new(url: impl Into<String>) -> Self {
        SensorMetadata {
            url: url.into(),
            table: "sensors".into(),
            timeout: Duration::from_secs(2),
            retries: 3,
            capacity: 100,
            cache_entries: 100_000,
            failures: LookupFailures::FailTheJob,
            failures_topic: None,
        }
    }

    /// The table name, checked: letters, digits, `_` and one `.` between schema and table.
    fn checked_table(&self) -> caudal::Result<String> {
        let parts: Vec<&str> = self.table.split('.').collect();
        let ok = parts.len() <= 2
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if !ok {
            return Err(Error::config(
                "--sensor-metadata-table",
                format!(
                    "`{}` is not a table name (letters, digits and _, optionally schema.table)",
                    self.table
                ),
            ));
        }
        Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
    }
}

/// `readings` with their sensors' site and name, and (with
/// [`LookupFailures::SideOutput`]) the readings whose lookups all failed.
pub fn enrich(
    readings: DataStream<ProcessedReading>,
    metadata: &SensorMetadata,
) -> caudal::Result<(DataStream<ProcessedReading>, Option<DataStream<LookupFailure>>)> {
    let sql = format!("SELECT site, name FROM {} WHERE sensor_id = $1", metadata.checked_table()?);
    let lookup = PostgresLookup::new(
        &metadata.url,
        &sql,
        |r: &ProcessedReading| r.sensor_id,
        |row| {
            let text = |i: usize| {
                row.try_get::<_, Option<String>>(i).map(Option::unwrap_or_default).map_err(|e| {
                    Error::config("--sensor-metadata-table", format!("site and name must be text: {e}"))
                })
            };
            Ok((text(0)?, text(1)?))
        },
    )
    .cache_entries(metadata.cache_entries);
    let options = AsyncOptions {
        capacity: metadata.capacity.max(1),
        timeout: metadata.timeout,
        ordered: true,
        retries: metadata.retries,
        retry_backoff: Duration::from_millis(100),
    };
    Ok(match metadata.failures {
        LookupFailures::FailTheJob => {
            let answers = readings.async_map(lookup, options).name(names::METADATA).uid(names::METADATA);
            (answers.map(with_metadata).name(names::WITH_METADATA).uid(names::WITH_METADATA), None)
        }
        LookupFailures::SideOutput => {
            let answers = readings.async_try_map(lookup, options).name(names::METADATA).uid(names::METADATA);
            let enriched = answers.process(WithMetadata).name(names::WITH_METADATA).uid(names::WITH_METADATA);
            let failures = enriched.side_output(&LOOKUP_FAILURES);
            (enriched, Some(failures))
        }
    })
}
