//! The README's process-function example: keyed state, event-time timers and a side
//! output. Run it with `cargo run --release -p caudal-jobs --example readings_per_minute`.

use caudal::process::{KeyedContext, KeyedProcessFunction, MapStateDescriptor, Output, OutputTag};
use caudal::{Result, StreamEnv, Timestamp, WatermarkStrategy};
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::sinks::StdoutSink;
use std::time::Duration;

/// Impossible readings go here, besides being counted.
static FAULTY: OutputTag<SensorReading> = OutputTag::new("faulty");

const MINUTE: i64 = 60_000;

/// Counts each sensor's readings per minute of event time, by hand: a count per minute in
/// keyed state, and a timer at the end of each minute that emits and forgets it.
#[derive(Clone)]
struct PerMinute {
    counts: MapStateDescriptor<Timestamp, u64>,
}

impl KeyedProcessFunction<i64, SensorReading, String> for PerMinute {
    fn process_element(
        &mut self,
        r: SensorReading,
        ctx: &mut KeyedContext<'_, i64>,
        _out: &mut Output<'_, String>,
    ) -> Result<()> {
        if r.temp_f < -200.0 || r.temp_f > 200.0 {
            ctx.output(&FAULTY, r.clone())?;
        }
        let minute = r.ts - r.ts.rem_euclid(MINUTE);
        let mut counts = ctx.map(&self.counts);
        let n = counts.get(&minute)?.unwrap_or(0);
        counts.insert(&minute, &(n + 1))?;
        // One timer per key and time: registering it again changes nothing.
        ctx.register_event_time_timer(minute + MINUTE - 1)
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Output<'_, String>,
    ) -> Result<()> {
        let minute = ts + 1 - MINUTE;
        let sensor = *ctx.key();
        let n = ctx.map(&self.counts).take(&minute)?.unwrap_or(0);
        out.collect(format!("sensor {sensor:>2}, minute {minute}: {n} readings"));
        Ok(())
    }
}

fn main() -> Result<()> {
    let env = StreamEnv::new();
    // 20 sensors, one reading per second of event time each, 4,000 readings in all.
    let sensors =
        GeneratorConfig { sensors: 20, rate: 0.0, records: Some(4_000), ..Default::default() }.build()?;
    let watermarks =
        WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1), |r: &SensorReading| r.ts);

    let counts = env
        .source("sensors", sensors, watermarks)
        .key_by(|r: &SensorReading| r.sensor_id)
        .process(PerMinute { counts: MapStateDescriptor::new("counts") })
        .name("per-minute")
        .uid("per-minute");
    counts.side_output(&FAULTY).map(|r| format!("{r:?}")).sink("faulty", |_| Ok(StdoutSink::new("faulty")));
    counts.sink("print", |_| Ok(StdoutSink::new("count")));

    env.execute("readings-per-minute")?;
    Ok(())
}
