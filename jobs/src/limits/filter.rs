//! The anomaly filter with dynamic limits: a keyed broadcast process function.

use super::{LimitChange, Limits};
use caudal::process::{
    BroadcastContext, BroadcastStateDescriptor, KeyedBroadcastProcessFunction, KeyedContext,
    MapStateDescriptor, Output,
};
use caudal::{Result, Timestamp};
use caudal_schemas::ProcessedReading;

/// Keeps the readings within the limits in force at their event time (see the module doc).
/// Apply it to readings keyed by sensor id, connected to the broadcast changes.
#[derive(Debug, Clone)]
pub struct LimitsFilter {
    /// Per band, its changes oldest first (the same on every subtask).
    bands: BroadcastStateDescriptor<String, Vec<LimitChange>>,
    /// Per sensor, its readings not yet judged, by event time (a timer at each time).
    waiting: MapStateDescriptor<Timestamp, Vec<ProcessedReading>>,
    /// This subtask's copy of the broadcast state, read on first use after a change (or a
    /// restore).
    cached: Option<Limits>,
}

impl Default for LimitsFilter {
    fn default() -> Self {
        LimitsFilter {
            bands: BroadcastStateDescriptor::new("limit-bands"),
            waiting: MapStateDescriptor::new("waiting"),
            cached: None,
        }
    }
}

impl LimitsFilter {
    fn limits(&mut self, ctx: &mut KeyedContext<'_, i64>) -> Result<&Limits> {
        if self.cached.is_none() {
            let bands = ctx.broadcast_state(&self.bands)?.entries()?;
            self.cached = Some(Limits::from_bands(bands));
        }
        Ok(self.cached.get_or_insert_with(Limits::default))
    }
}

impl KeyedBroadcastProcessFunction<i64, ProcessedReading, LimitChange, ProcessedReading> for LimitsFilter {
    fn process_element(
        &mut self,
        reading: ProcessedReading,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Output<'_, ProcessedReading>,
    ) -> Result<()> {
        let ts = reading.ts;
        if ts <= ctx.current_watermark() {
            // Behind the watermark already: every change up to its time is here.
            if self.limits(ctx)?.plausible(reading.lat, ts, reading.temp_c) {
                out.collect(reading);
            }
            return Ok(());
        }
        let mut map = ctx.map(&self.waiting);
        let mut at = map.get(&ts)?.unwrap_or_default();
        at.push(reading);
        map.insert(&ts, &at)?;
        ctx.register_event_time_timer(ts)
    }

    fn process_broadcast_element(
        &mut self,
        change: LimitChange,
        ctx: &mut BroadcastContext<'_>,
        _out: &mut Output<'_, ProcessedReading>,
    ) -> Result<()> {
        let mut state = ctx.state(&self.bands);
        let mut limits = Limits::from_bands(state.get(&change.band)?.map(|l| (change.band.clone(), l)));
        let band = change.band.clone();
        let list = limits.apply(change).clone();
        state.put(&band, &list)?;
        self.cached = None;
        Ok(())
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Output<'_, ProcessedReading>,
    ) -> Result<()> {
        let Some(due) = ctx.map(&self.waiting).take(&ts)? else { return Ok(()) };
        let limits = self.limits(ctx)?;
        for reading in due {
            if limits.plausible(reading.lat, ts, reading.temp_c) {
                out.collect_at(reading.ts, reading);
            }
        }
        Ok(())
    }
}
