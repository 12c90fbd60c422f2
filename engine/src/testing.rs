//! Helpers for tests and examples: a sink that collects into shared memory.

use crate::operator::{OperatorContext, Sink};
use crate::types::{Batch, Data};
use crate::Result;
use parking_lot::Mutex;
use std::sync::Arc;

/// Collects every value it receives (from all subtasks) into a shared vector.
#[derive(Debug)]
pub struct CollectSink<T> {
    out: Arc<Mutex<Vec<T>>>,
}

impl<T> Clone for CollectSink<T> {
    fn clone(&self) -> Self {
        CollectSink { out: self.out.clone() }
    }
}

impl<T: Data> CollectSink<T> {
    /// A sink and the vector it fills.
    pub fn new() -> (Self, Arc<Mutex<Vec<T>>>) {
        let out = Arc::new(Mutex::new(Vec::new()));
        (CollectSink { out: out.clone() }, out)
    }
}

impl<T: Data> Sink for CollectSink<T> {
    type In = T;

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        self.out.lock().extend(batch.into_iter().map(|r| r.value));
        Ok(())
    }
}
