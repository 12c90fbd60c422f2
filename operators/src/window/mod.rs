//! Keyed event-time windows: tumbling, sliding and session, with allowed lateness and a
//! side output for late records.
//!
//! ```
//! use caudal::{StreamEnv, WatermarkStrategy, testing::CollectSink};
//! use caudal_operators::window::{KeyedWindowExt, WindowAssigner};
//! use std::time::Duration;
//!
//! let env = StreamEnv::new();
//! let (sink, out) = CollectSink::new();
//! // (timestamp ms, sensor, °C)
//! let readings = vec![(1_000_i64, 1_u64, 20.0_f64), (2_000, 1, 22.0), (61_000, 1, 30.0)];
//! env.from_iter("readings", readings)
//!     .assign_timestamps(|r| r.0)
//!     .key_by(|r| r.1)
//!     .window(WindowAssigner::tumbling(Duration::from_secs(60)))
//!     .reduce(|a, b| if a.2 >= b.2 { *a } else { *b })
//!     .sink("max", move |_| Ok(sink.clone()));
//! env.execute("max-per-minute").unwrap();
//! let maxima: Vec<f64> = out.lock().iter().map(|w| w.value.2).collect();
//! assert_eq!(maxima, vec![22.0, 30.0]);
//! ```

mod assigner;
mod function;
mod join;
mod operator;

pub use assigner::{window_start, TimeWindow, WindowAssigner};
pub use function::{
    AggregateEmitter, AggregateFunction, ProcessEmitter, ReduceEmitter, WindowEmitter, WindowResult,
};
pub use join::{JoinOn, JoinWhere, JoinWindowed, JoinedStreams, WindowJoinExt};
pub use operator::{WindowOperator, WindowOutput};

use caudal::{Data, DataStream, Key, KeyedStream};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// Adds `.window(...)` to keyed streams.
pub trait KeyedWindowExt<K, T> {
    /// Group the keyed stream into windows.
    fn window(self, assigner: WindowAssigner) -> WindowedStream<K, T>;
}

impl<K: Key, T: Data> KeyedWindowExt<K, T> for KeyedStream<K, T> {
    fn window(self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream { keyed: self, assigner, lateness: 0, name: None, uid: None }
    }
}

/// A keyed stream grouped into windows; finish with `aggregate`, `reduce` or `process`.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    assigner: WindowAssigner,
    lateness: i64,
    name: Option<String>,
    uid: Option<String>,
}

impl<K, T> std::fmt::Debug for WindowedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WindowedStream({:?})", self.assigner)
    }
}

impl<K: Key, T: Data> WindowedStream<K, T> {
    /// Keep windows for `lateness` after they fire; late records within it update the result.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.lateness = i64::try_from(lateness.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// Name the window operator.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Set the window operator's uid: the id of its state (the open windows) in
    /// checkpoints (see `DataStream::uid`). The stateless step after it that splits results
    /// from late records gets `<uid>.results` (and `<uid>.late`).
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }

    fn build<E: WindowEmitter<K, T>>(
        self,
        emitter: E,
        side: bool,
    ) -> (DataStream<WindowOutput<E::Out, T>>, Option<String>) {
        let emitter = Arc::new(emitter);
        let (assigner, lateness) = (self.assigner, self.lateness);
        let name = self.name.unwrap_or_else(|| "window".to_string());
        let key = self.keyed.key_fn();
        let stream = self.keyed.transform(&name, move |_ctx| {
            Ok(WindowOperator::new(key.clone(), assigner, lateness, emitter.clone(), side))
        });
        match &self.uid {
            Some(uid) => (stream.uid(uid), self.uid),
            None => (stream, None),
        }
    }

    /// Aggregate each window incrementally; emits one [`WindowResult`] per key and window.
    pub fn aggregate<A: AggregateFunction<T>>(self, agg: A) -> DataStream<WindowResult<K, A::Out>> {
        only_results(self.build(AggregateEmitter(agg), false))
    }

    /// Like [`aggregate`](Self::aggregate), with late records on a second stream.
    #[allow(clippy::type_complexity)]
    pub fn aggregate_with_late<A: AggregateFunction<T>>(
        self,
        agg: A,
    ) -> (DataStream<WindowResult<K, A::Out>>, DataStream<T>) {
        split(self.build(AggregateEmitter(agg), true))
    }

    /// Reduce each window's records pairwise.
    pub fn reduce<F: Fn(&T, &T) -> T + Send + Sync + 'static>(self, f: F) -> DataStream<WindowResult<K, T>> {
        only_results(self.build(ReduceEmitter { f: Arc::new(f), _t: PhantomData }, false))
    }

    /// Call `f` with all records of a window when it fires.
    pub fn process<O, F>(self, f: F) -> DataStream<O>
    where
        O: Data,
        F: Fn(&K, TimeWindow, &[T], &mut Vec<O>) + Send + Sync + 'static,
    {
        only_results(self.build(ProcessEmitter { f: Arc::new(f), _t: PhantomData }, false))
    }
}

type Built<R, T> = (DataStream<WindowOutput<R, T>>, Option<String>);

fn only_results<R: Data, T: Data>((s, uid): Built<R, T>) -> DataStream<R> {
    let results = s
        .flat_map(|o| match o {
            WindowOutput::Result(r) => Some(r),
            WindowOutput::Late(_) => None,
        })
        .name("window-results");
    match uid {
        Some(uid) => results.uid(&format!("{uid}.results")),
        None => results,
    }
}

fn split<R: Data, T: Data>((s, uid): Built<R, T>) -> (DataStream<R>, DataStream<T>) {
    let late = s
        .clone()
        .flat_map(|o| match o {
            WindowOutput::Late(t) => Some(t),
            WindowOutput::Result(_) => None,
        })
        .name("late-records");
    let late = match &uid {
        Some(uid) => late.uid(&format!("{uid}.late")),
        None => late,
    };
    (only_results((s, uid)), late)
}

#[cfg(test)]
mod tests;
