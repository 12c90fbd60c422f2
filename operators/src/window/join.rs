//! Window joins (Flink's `DataStream.join(..).where(..).equalTo(..).window(..).apply(..)`):
//! pairs of two streams' elements with equal keys in the same window.
//!
//! Both streams become one keyed stream of `TwoInputs` that a window operator collects; when
//! a window fires, every pair of its first-side and second-side elements is joined. The
//! window state is the window operator's (checkpointed, rescaled by key group); late
//! elements are counted as the window operator counts them.

use super::{KeyedWindowExt, TimeWindow, WindowAssigner};
use caudal::process::TwoInputs;
use caudal::{Data, DataStream, Key};
use std::sync::Arc;

/// Adds `.join(other)` to streams.
pub trait WindowJoinExt<A> {
    /// Join with `other` by key and window: `.where_(..).equal_to(..).window(..).apply(..)`.
    fn join<B: Data>(self, other: DataStream<B>) -> JoinedStreams<A, B>;
}

impl<A: Data> WindowJoinExt<A> for DataStream<A> {
    fn join<B: Data>(self, other: DataStream<B>) -> JoinedStreams<A, B> {
        JoinedStreams { first: self, second: other }
    }
}

/// Two streams to join.
pub struct JoinedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
}

impl<A, B> std::fmt::Debug for JoinedStreams<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinedStreams({:?}, {:?})", self.first, self.second)
    }
}

type KeyOf<T, K> = Arc<dyn Fn(&T) -> K + Send + Sync>;

impl<A: Data, B: Data> JoinedStreams<A, B> {
    /// The key of the first stream's elements.
    pub fn where_<K: Key>(self, key: impl Fn(&A) -> K + Send + Sync + 'static) -> JoinWhere<A, B, K> {
        JoinWhere { streams: self, first_key: Arc::new(key) }
    }
}

/// A join with the first stream's key.
pub struct JoinWhere<A, B, K> {
    streams: JoinedStreams<A, B>,
    first_key: KeyOf<A, K>,
}

impl<A, B, K> std::fmt::Debug for JoinWhere<A, B, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinWhere({:?})", self.streams)
    }
}

impl<A: Data, B: Data, K: Key> JoinWhere<A, B, K> {
    /// The key of the second stream's elements (pairs have equal keys).
    pub fn equal_to(self, key: impl Fn(&B) -> K + Send + Sync + 'static) -> JoinOn<A, B, K> {
        JoinOn { streams: self.streams, first_key: self.first_key, second_key: Arc::new(key) }
    }
}

/// A join with both keys.
pub struct JoinOn<A, B, K> {
    streams: JoinedStreams<A, B>,
    first_key: KeyOf<A, K>,
    second_key: KeyOf<B, K>,
}

impl<A, B, K> std::fmt::Debug for JoinOn<A, B, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinOn({:?})", self.streams)
    }
}

impl<A: Data, B: Data, K: Key> JoinOn<A, B, K> {
    /// Pairs meet in windows of `assigner` (tumbling, sliding or session).
    pub fn window(self, assigner: WindowAssigner) -> JoinWindowed<A, B, K> {
        JoinWindowed { on: self, assigner, name: "window-join".into(), uid: None }
    }
}

/// A join with its windows; finish with `apply`.
pub struct JoinWindowed<A, B, K> {
    on: JoinOn<A, B, K>,
    assigner: WindowAssigner,
    name: String,
    uid: Option<String>,
}

impl<A, B, K> std::fmt::Debug for JoinWindowed<A, B, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinWindowed({:?}, {:?})", self.on, self.assigner)
    }
}

impl<A: Data, B: Data, K: Key> JoinWindowed<A, B, K> {
    /// Name the join's window operator.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// The uid of the join's window operator (its state: the windows' elements).
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }

    /// Emit `f(a, b)` for every pair of a window, when it fires.
    pub fn apply<O: Data>(self, f: impl Fn(&A, &B) -> O + Send + Sync + 'static) -> DataStream<O> {
        let JoinOn { streams, first_key, second_key } = self.on;
        let first = streams.first.map(TwoInputs::<A, B>::First).name("join.first");
        let second = streams.second.map(TwoInputs::<A, B>::Second).name("join.second");
        let key = move |e: &TwoInputs<A, B>| match e {
            TwoInputs::First(a) => first_key(a),
            TwoInputs::Second(b) => second_key(b),
        };
        let mut windowed = first.union(vec![second]).key_by(key).window(self.assigner).name(&self.name);
        if let Some(uid) = &self.uid {
            windowed = windowed.uid(uid);
        }
        windowed.process(
            move |_key: &K, _window: TimeWindow, elements: &[TwoInputs<A, B>], out: &mut Vec<O>| {
                let seconds: Vec<&B> = elements
                    .iter()
                    .filter_map(|e| match e {
                        TwoInputs::Second(b) => Some(b),
                        TwoInputs::First(_) => None,
                    })
                    .collect();
                for e in elements {
                    if let TwoInputs::First(a) = e {
                        out.extend(seconds.iter().map(|b| f(a, b)));
                    }
                }
            },
        )
    }
}
