//! What a window computes: incremental aggregates, reductions, or a function over all its records.

use super::assigner::TimeWindow;
use caudal::Data;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::Arc;

/// An incremental aggregate (Flink's `AggregateFunction`): one accumulator per key and window.
pub trait AggregateFunction<T>: Send + Sync + 'static {
    /// The accumulator.
    type Acc: Data;
    /// The result.
    type Out: Data;
    /// A fresh accumulator.
    fn create(&self) -> Self::Acc;
    /// Add one value.
    fn add(&self, acc: &mut Self::Acc, value: &T);
    /// Merge `other` into `acc` (session windows).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    /// The result of an accumulator.
    fn result(&self, acc: &Self::Acc) -> Self::Out;
}

/// A window result: the key, the window and the value computed for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowResult<K, V> {
    /// The key.
    pub key: K,
    /// The window.
    pub window: TimeWindow,
    /// The aggregate.
    pub value: V,
}

/// Turns accumulators into output records when a window fires (internal).
pub trait WindowEmitter<K, T>: Send + Sync + 'static {
    /// Accumulator.
    type Acc: Data;
    /// Output element.
    type Out: Data;
    /// A fresh accumulator.
    fn create(&self) -> Self::Acc;
    /// Add one value.
    fn add(&self, acc: &mut Self::Acc, value: &T);
    /// Merge accumulators.
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    /// Emit the outputs of a firing window.
    fn emit(&self, key: &K, window: TimeWindow, acc: &Self::Acc, out: &mut Vec<Self::Out>);
}

/// An aggregate emitting [`WindowResult`]s.
pub struct AggregateEmitter<A>(pub A);

impl<K: caudal::Key, T, A: AggregateFunction<T>> WindowEmitter<K, T> for AggregateEmitter<A> {
    type Acc = A::Acc;
    type Out = WindowResult<K, A::Out>;
    fn create(&self) -> A::Acc {
        self.0.create()
    }
    fn add(&self, acc: &mut A::Acc, value: &T) {
        self.0.add(acc, value)
    }
    fn merge(&self, acc: &mut A::Acc, other: A::Acc) {
        self.0.merge(acc, other)
    }
    fn emit(&self, key: &K, window: TimeWindow, acc: &A::Acc, out: &mut Vec<Self::Out>) {
        out.push(WindowResult { key: key.clone(), window, value: self.0.result(acc) });
    }
}

/// `reduce`: the accumulator is the running value; emits a [`WindowResult`] of it.
pub struct ReduceEmitter<T, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<K, T, F> WindowEmitter<K, T> for ReduceEmitter<T, F>
where
    K: caudal::Key,
    T: Data,
    F: Fn(&T, &T) -> T + Send + Sync + 'static,
{
    type Acc = Option<T>;
    type Out = WindowResult<K, T>;
    fn create(&self) -> Option<T> {
        None
    }
    fn add(&self, acc: &mut Option<T>, value: &T) {
        *acc = Some(match acc.take() {
            Some(a) => (self.f)(&a, value),
            None => value.clone(),
        });
    }
    fn merge(&self, acc: &mut Option<T>, other: Option<T>) {
        if let Some(o) = other {
            WindowEmitter::<K, T>::add(self, acc, &o);
        }
    }
    fn emit(&self, key: &K, window: TimeWindow, acc: &Option<T>, out: &mut Vec<Self::Out>) {
        if let Some(v) = acc {
            out.push(WindowResult { key: key.clone(), window, value: v.clone() });
        }
    }
}

/// `process`: keeps every record of the window and calls a function when it fires.
pub struct ProcessEmitter<T, O, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _t: PhantomData<fn(T) -> O>,
}

impl<K, T, O, F> WindowEmitter<K, T> for ProcessEmitter<T, O, F>
where
    K: caudal::Key,
    T: Data,
    O: Data,
    F: Fn(&K, TimeWindow, &[T], &mut Vec<O>) + Send + Sync + 'static,
{
    type Acc = Vec<T>;
    type Out = O;
    fn create(&self) -> Vec<T> {
        Vec::new()
    }
    fn add(&self, acc: &mut Vec<T>, value: &T) {
        acc.push(value.clone());
    }
    fn merge(&self, acc: &mut Vec<T>, mut other: Vec<T>) {
        acc.append(&mut other);
    }
    fn emit(&self, key: &K, window: TimeWindow, acc: &Vec<T>, out: &mut Vec<O>) {
        (self.f)(key, window, acc, out)
    }
}
