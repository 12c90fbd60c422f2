//! The process-function traits a job implements.

use super::context::{Context, KeyedContext, Output};
use crate::types::Timestamp;
use crate::Result;

/// A function over a keyed stream with state, timers and side outputs (Flink's
/// `KeyedProcessFunction`), applied with `KeyedStream::process`.
///
/// Each subtask gets its own clone. Everything the function must remember across elements
/// belongs in keyed state (`ctx.value(&DESCRIPTOR)`, …): fields are not checkpointed.
pub trait KeyedProcessFunction<K, I, O>: Clone + Send + 'static {
    /// Handles one element; `ctx` is scoped to its key.
    fn process_element(
        &mut self,
        value: I,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()>;

    /// A timer of the key in `ctx` fired at `timestamp` (`ctx.time_domain()` says which kind).
    /// At the end of a bounded input the watermark jumps to `MAX_WATERMARK`, so every
    /// event-time timer fires: `ctx.current_watermark() == MAX_WATERMARK` tells those apart.
    fn on_timer(
        &mut self,
        _timestamp: Timestamp,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Output<'_, O>,
    ) -> Result<()> {
        Ok(())
    }
}

/// A function over a stream with side outputs (Flink's `ProcessFunction`), applied with
/// `DataStream::process`. Without a key it has neither keyed state nor timers.
pub trait ProcessFunction<I, O>: Clone + Send + 'static {
    /// Handles one element.
    fn process_element(&mut self, value: I, ctx: &mut Context<'_>, out: &mut Output<'_, O>) -> Result<()>;
}
