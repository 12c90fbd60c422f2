//! Write your own job: the hottest reading per sensor every 10 seconds of event time.
//!
//! ```text
//! cargo run --release -p caudal-jobs --example hottest_sensor
//! ```

use caudal::{JobConfig, StreamEnv, WatermarkStrategy};
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::sinks::StdoutSink;
use caudal_operators::window::{KeyedWindowExt, WindowAssigner};
use std::time::Duration;

fn main() -> caudal::Result<()> {
    let env = StreamEnv::with_config(JobConfig { parallelism: 2, ..JobConfig::default() });

    // 20 simulated sensors, unthrottled, 2,000 readings in all.
    let sensors =
        GeneratorConfig { sensors: 20, rate: 0.0, records: Some(2_000), ..Default::default() }.build()?;
    // Event time from the reading; watermarks trail the newest reading by 1 s.
    let watermarks =
        WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1), |r: &SensorReading| r.ts);

    env.source("sensors", sensors, watermarks)
        .map(|r| (r.sensor_id, (r.temp_f - 32.0) * 5.0 / 9.0))
        .name("to-celsius")
        .filter(|(_, c)| *c > -50.0 && *c < 60.0)
        .name("plausible")
        .key_by(|(sensor, _)| *sensor)
        .window(WindowAssigner::tumbling(Duration::from_secs(10)))
        .reduce(|a, b| if a.1 >= b.1 { *a } else { *b })
        .map(|w| {
            format!("sensor {:>2} [{}, {}) hottest {:.1} °C", w.key, w.window.start, w.window.end, w.value.1)
        })
        .sink("print", |_| Ok(StdoutSink::new("hottest")));

    let result = env.execute("hottest-sensor")?;
    eprintln!("done in {:.2}s", result.elapsed.as_secs_f64());
    Ok(())
}
