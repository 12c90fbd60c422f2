//! Counts records and drops them: the sink of benchmarks.

use caudal::{Batch, Data, OperatorContext, Result, Sink};
use std::marker::PhantomData;

/// Counts (in the sink's `records_in` metric) and discards.
pub struct DiscardSink<T>(PhantomData<fn(T)>);

impl<T> std::fmt::Debug for DiscardSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiscardSink")
    }
}

impl<T> Default for DiscardSink<T> {
    fn default() -> Self {
        DiscardSink(PhantomData)
    }
}

impl<T: Data> Sink for DiscardSink<T> {
    type In = T;

    #[inline]
    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        drop(batch);
        Ok(())
    }
}
