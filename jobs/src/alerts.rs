//! Silent-sensor alerts: a keyed process function over the readings (public API only).
//!
//! A sensor with no reading for `silence` of event time raises one `SILENT` alert (at its
//! last reading + `silence`), and one `RECOVERED` at its first reading after that. Per
//! sensor it keeps the time of its latest reading and whether it is silent, and one
//! event-time timer at latest + `silence`. The end of a bounded input is not an outage: the
//! timers that the final watermark fires raise nothing.
//!
//! The result does not depend on how the watermark lags the readings: if a sensor's next
//! reading arrives before the watermark passed its timer, the gap is seen on the reading and
//! the same `SILENT` is raised there, before the `RECOVERED`.

use caudal::process::{KeyedContext, KeyedProcessFunction, Output, ValueStateDescriptor};
use caudal::types::MAX_WATERMARK;
use caudal::{Result, Timestamp};
use caudal_schemas::{AlertKind, ProcessedReading, SensorAlert};
use std::time::Duration;

/// The silent-sensor detector; apply it to readings keyed by sensor id.
#[derive(Debug, Clone)]
pub struct SilenceDetector {
    silence_ms: i64,
    last_seen: ValueStateDescriptor<Timestamp>,
    silent: ValueStateDescriptor<bool>,
}

impl SilenceDetector {
    /// Alerts after `silence` of event time without a reading.
    pub fn new(silence: Duration) -> Self {
        SilenceDetector {
            silence_ms: i64::try_from(silence.as_millis()).unwrap_or(i64::MAX).max(1),
            last_seen: ValueStateDescriptor::new("last-seen"),
            silent: ValueStateDescriptor::new("silent"),
        }
    }

    fn alert(sensor_id: i64, kind: AlertKind, ts: Timestamp, last_seen: Timestamp) -> SensorAlert {
        SensorAlert { sensor_id, kind, ts, last_seen }
    }
}

impl KeyedProcessFunction<i64, ProcessedReading, SensorAlert> for SilenceDetector {
    fn process_element(
        &mut self,
        reading: ProcessedReading,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Output<'_, SensorAlert>,
    ) -> Result<()> {
        let (sensor, ts) = (reading.sensor_id, reading.ts);
        if let Some(last) = ctx.value(&self.last_seen).get()? {
            if ts <= last {
                return Ok(()); // older than what the sensor already reported: no news
            }
            ctx.delete_event_time_timer(last + self.silence_ms)?;
            let mut silent = ctx.value(&self.silent).get()?.unwrap_or(false);
            if !silent && ts - last > self.silence_ms {
                let at = last + self.silence_ms;
                out.collect_at(at, Self::alert(sensor, AlertKind::Silent, at, last));
                silent = true;
            }
            if silent {
                out.collect(Self::alert(sensor, AlertKind::Recovered, ts, last));
                ctx.value(&self.silent).clear()?;
            }
        }
        ctx.value(&self.last_seen).set(&ts)?;
        ctx.register_event_time_timer(ts + self.silence_ms)
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Output<'_, SensorAlert>,
    ) -> Result<()> {
        if ctx.current_watermark() == MAX_WATERMARK {
            return Ok(()); // the input ended: not an outage
        }
        let last = ctx.value(&self.last_seen).get()?.unwrap_or(ts - self.silence_ms);
        ctx.value(&self.silent).set(&true)?;
        out.collect(Self::alert(*ctx.key(), AlertKind::Silent, ts, last));
        Ok(())
    }
}
