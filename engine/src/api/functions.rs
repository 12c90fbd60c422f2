//! The closure operators the engine wraps: map, filter, flat_map, and the union pass-through.

use crate::operator::{Operator, OperatorContext};
use crate::types::{Batch, Data, Record};
use crate::Result;
use std::marker::PhantomData;
use std::sync::Arc;

/// Hands a whole batch on: moves it (no copy) when `out` is empty, appends otherwise.
#[inline]
fn forward<T>(mut batch: Batch<T>, out: &mut Batch<T>) {
    if out.is_empty() {
        *out = batch;
    } else {
        out.append(&mut batch);
    }
}

/// `map`: one output per input, timestamp kept.
pub(crate) struct MapOp<T, U, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _t: PhantomData<fn(T) -> U>,
}

impl<T: Data, U: Data, F: Fn(T) -> U + Send + Sync + 'static> Operator for MapOp<T, U, F> {
    type In = T;
    type Out = U;

    #[inline]
    fn process_batch(
        &mut self,
        batch: Batch<T>,
        out: &mut Batch<U>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        let f = &*self.f;
        out.extend(batch.into_iter().map(|r| Record { ts: r.ts, value: f(r.value) }));
        Ok(())
    }
}

/// `filter`: keeps the records the predicate accepts.
pub(crate) struct FilterOp<T, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<T: Data, F: Fn(&T) -> bool + Send + Sync + 'static> Operator for FilterOp<T, F> {
    type In = T;
    type Out = T;

    #[inline]
    fn process_batch(
        &mut self,
        mut batch: Batch<T>,
        out: &mut Batch<T>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        let f = &*self.f;
        batch.retain(|r| f(&r.value));
        forward(batch, out);
        Ok(())
    }
}

/// `flat_map`: zero or more outputs per input, each with the input's timestamp.
pub(crate) struct FlatMapOp<T, U, I, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _t: PhantomData<fn(T) -> (U, I)>,
}

impl<T, U, I, F> Operator for FlatMapOp<T, U, I, F>
where
    T: Data,
    U: Data,
    I: IntoIterator<Item = U> + 'static,
    F: Fn(T) -> I + Send + Sync + 'static,
{
    type In = T;
    type Out = U;

    fn process_batch(
        &mut self,
        batch: Batch<T>,
        out: &mut Batch<U>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        let f = &*self.f;
        for r in batch {
            let ts = r.ts;
            out.extend(f(r.value).into_iter().map(|value| Record { ts, value }));
        }
        Ok(())
    }
}

/// Union: forwards every input unchanged.
pub(crate) struct PassThrough<T>(pub(crate) PhantomData<fn(T)>);

impl<T: Data> Operator for PassThrough<T> {
    type In = T;
    type Out = T;

    fn process_batch(
        &mut self,
        batch: Batch<T>,
        out: &mut Batch<T>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        forward(batch, out);
        Ok(())
    }
}

/// `assign_timestamps`: sets each record's event time from its value.
pub(crate) struct TimestampOp<T, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<T: Data, F: Fn(&T) -> crate::types::Timestamp + Send + Sync + 'static> Operator for TimestampOp<T, F> {
    type In = T;
    type Out = T;

    fn process_batch(
        &mut self,
        mut batch: Batch<T>,
        out: &mut Batch<T>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        let f = &*self.f;
        for r in &mut batch {
            r.ts = f(&r.value);
        }
        forward(batch, out);
        Ok(())
    }
}
