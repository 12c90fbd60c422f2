//! Process functions: the DataStream API's general-purpose operator (Flink's
//! `KeyedProcessFunction` and `ProcessFunction`).
//!
//! **In:** a keyed stream and a [`KeyedProcessFunction`] (or a stream and a
//! [`ProcessFunction`]). **Out:** the function's main output as a `DataStream`, and each
//! side output it emits with `ctx.output(&TAG, v)` as `stream.side_output(&TAG)`.
//!
//! A keyed function reads and writes typed state of the current key through descriptors
//! ([`ValueStateDescriptor`], [`ListStateDescriptor`], [`MapStateDescriptor`],
//! [`ReducingStateDescriptor`], [`AggregatingStateDescriptor`], each with an optional
//! [`StateTtl`]) and registers event-time and processing-time timers; state and timers live
//! in the subtask's keyed-state backend, so both are checkpointed per key group, survive
//! restores and follow their keys when the job is rescaled.
//!
//! ```
//! use caudal::process::{KeyedContext, KeyedProcessFunction, Output, ValueStateDescriptor};
//! use caudal::{testing::CollectSink, Result, StreamEnv};
//!
//! /// Emits each key's running count.
//! #[derive(Clone)]
//! struct Count { seen: ValueStateDescriptor<u64> }
//!
//! impl KeyedProcessFunction<String, String, (String, u64)> for Count {
//!     fn process_element(&mut self, word: String, ctx: &mut KeyedContext<'_, String>,
//!                        out: &mut Output<'_, (String, u64)>) -> Result<()> {
//!         let mut seen = ctx.value(&self.seen);
//!         let n = seen.get()?.unwrap_or(0) + 1;
//!         seen.set(&n)?;
//!         out.collect((word, n));
//!         Ok(())
//!     }
//! }
//!
//! let env = StreamEnv::new();
//! let (sink, out) = CollectSink::new();
//! let words = ["a", "b", "a"].map(String::from);
//! env.from_iter("words", words)
//!     .key_by(|w: &String| w.clone())
//!     .process(Count { seen: ValueStateDescriptor::new("seen") })
//!     .sink("out", move |_| Ok(sink.clone()));
//! env.execute("count").unwrap();
//! let mut counts = out.lock().clone();
//! counts.sort();
//! assert_eq!(counts, vec![("a".into(), 1), ("a".into(), 2), ("b".into(), 1)]);
//! ```

mod broadcast;
mod codec;
mod connect;
mod context;
mod function;
mod interval_join;
mod keyed_core;
mod on_bad_record;
mod operator;
mod side_output;
mod state;
#[cfg(test)]
mod tests;
mod timers;

pub use broadcast::{
    BroadcastConnectedStreams, BroadcastContext, BroadcastMapMut, BroadcastStateDescriptor, BroadcastStream,
    BroadcastView, KeyedBroadcastProcessFunction,
};
pub use connect::{
    CoProcessFunction, ConnectedStreams, KeyedCoProcessFunction, KeyedConnectedStreams, TwoInputs,
};
pub use context::{Context, KeyedContext, Output};
pub use function::{KeyedProcessFunction, ProcessFunction};
pub use interval_join::{IntervalJoin, IntervalJoinBetween};
pub use on_bad_record::{on_bad_record, FailedElement, OnBadRecord, Tolerant};
pub use side_output::{OutputTag, Tagged};
pub use state::{
    AggregatingHandle, AggregatingStateDescriptor, ListHandle, ListStateDescriptor, MapHandle,
    MapStateDescriptor, ReducingHandle, ReducingStateDescriptor, StateTtl, TtlTime, TtlUpdate, ValueHandle,
    ValueStateDescriptor,
};
pub use timers::TimeDomain;

use super::stream::{DataStream, KeyedStream};
use crate::types::{Data, Key};
use operator::{KeyedProcessOperator, ProcessOperator};
use side_output::{MainOutput, SideOutput, SideRecords};
use std::marker::PhantomData;

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Apply a keyed process function: per element and per timer of its key, with keyed
    /// state, timers and side outputs. Set a `.uid(..)`: its state is found by it.
    pub fn process<O: Data, F: KeyedProcessFunction<K, T, O>>(self, f: F) -> DataStream<O> {
        let key = self.key_fn();
        let tagged =
            self.transform("process", move |_| Ok(KeyedProcessOperator::new(f.clone(), key.clone())));
        main_of(tagged)
    }
}

impl<T: Data> DataStream<T> {
    /// Apply a process function: per element, with side outputs.
    pub fn process<O: Data, F: ProcessFunction<T, O>>(self, f: F) -> DataStream<O> {
        let tagged = self.transform("process", move |_| {
            Ok(ProcessOperator { f: f.clone(), side: SideRecords::default(), _t: PhantomData })
        });
        main_of(tagged)
    }

    /// The side output `tag` of the process function whose main output this stream is.
    /// On any other stream the job fails to build, saying so.
    pub fn side_output<S: Data>(&self, tag: &OutputTag<S>) -> DataStream<S> {
        let Some(tagged) = self.tagged_source() else {
            self.graph.borrow_mut().error(format!(
                "side_output(`{}`) on a stream that is not the output of a process function",
                tag.id()
            ));
            return DataStream::new(self.graph.clone(), self.node);
        };
        let (hash, id) = (tag.hash(), tag.id());
        let tagged_node = tagged.node;
        let side: DataStream<S> = tagged.transform(&format!("side-output-{id}"), move |_| {
            Ok(SideOutput::<T, S> { hash, id, _t: PhantomData })
        });
        self.graph.borrow_mut().follow(tagged_node, side.node, &format!(".side-{id}"));
        side
    }
}

/// The main output of a process operator whose records are `Tagged<O>`: a chained step
/// that keeps them, which takes the operator's name and parallelism and hands `.name`,
/// `.uid` and `.parallelism` on to it.
pub(crate) fn main_of<O: Data>(tagged: DataStream<Tagged<O>>) -> DataStream<O> {
    let main: DataStream<O> = tagged.clone().transform("process.main", |_| Ok(MainOutput::<O>(PhantomData)));
    tagged.graph.borrow_mut().follow(tagged.node, main.node, ".main");
    main.owned_by(tagged.node)
}
