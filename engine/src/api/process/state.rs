//! Typed keyed state of process functions: descriptors (a name, the value type, an optional
//! TTL) that a function keeps as fields, and the handles [`KeyedContext`] gives for the
//! current key.
//!
//! Every value is bincode-encoded in the subtask's keyed-state backend (RocksDB or heap),
//! under the current key's key group, so it is snapshotted at every barrier and
//! redistributed by key group when a job is rescaled. A state with a TTL stores its expiry
//! time in front of each value (each list element, each map entry): an expired value is
//! invisible at once and deleted later by [`TtlCleanup`].
//!
//! [`KeyedContext`]: super::KeyedContext

use super::codec;
use crate::types::Timestamp;
use crate::{Error, Result};
use caudal_checkpoints::backend::{decode_list, frame_list_element};
use caudal_checkpoints::keys::decode_key;
use caudal_checkpoints::{EntryHint, KeyedStateBackend, StateId, StateKey};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which clock a state's time-to-live runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlTime {
    /// A value written at event time `t` (the element's timestamp, or the firing timer's)
    /// expires once the watermark passes `t + ttl`.
    EventTime,
    /// A value written at wall-clock time `t` expires at `t + ttl`.
    ProcessingTime,
}

/// When a value's time-to-live starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlUpdate {
    /// When it is written (the default, as in Flink).
    OnCreateAndWrite,
    /// When it is written or read.
    OnReadAndWrite,
}

/// A state's time-to-live (Flink's `StateTtlConfig`).
///
/// ```
/// use caudal::process::{StateTtl, ValueStateDescriptor};
/// use std::time::Duration;
/// let seen: ValueStateDescriptor<u64> =
///     ValueStateDescriptor::new("seen").with_ttl(StateTtl::event_time(Duration::from_secs(3600)));
/// # let _ = seen;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTtl {
    /// How long a value lives.
    pub ttl: Duration,
    /// On which clock.
    pub time: TtlTime,
    /// When its life starts again.
    pub update: TtlUpdate,
}

impl StateTtl {
    /// Values live `ttl` of event time after they were written.
    pub fn event_time(ttl: Duration) -> Self {
        StateTtl { ttl, time: TtlTime::EventTime, update: TtlUpdate::OnCreateAndWrite }
    }

    /// Values live `ttl` of wall-clock time after they were written.
    pub fn processing_time(ttl: Duration) -> Self {
        StateTtl { ttl, time: TtlTime::ProcessingTime, update: TtlUpdate::OnCreateAndWrite }
    }

    /// Reading a value starts its life again too.
    pub fn update_on_read(mut self) -> Self {
        self.update = TtlUpdate::OnReadAndWrite;
        self
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

/// The clocks a handle judges expiry by: the time a write happens at and "now", per domain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clocks {
    /// Event time of the element (or timer) being processed.
    pub(crate) event_write: Timestamp,
    /// The current watermark.
    pub(crate) watermark: Timestamp,
    /// Wall-clock time, ms since the epoch.
    pub(crate) processing: Timestamp,
}

impl Clocks {
    fn expiry(&self, ttl: &StateTtl) -> i64 {
        match ttl.time {
            TtlTime::EventTime => self.event_write.saturating_add(ttl.ttl_ms()),
            TtlTime::ProcessingTime => self.processing.saturating_add(ttl.ttl_ms()),
        }
    }

    fn is_expired(&self, time: TtlTime, expiry: i64) -> bool {
        match time {
            TtlTime::EventTime => expiry <= self.watermark,
            TtlTime::ProcessingTime => expiry <= self.processing,
        }
    }
}

/// Reserved prefix of the engine's own state names (timers).
pub(crate) const RESERVED_PREFIX: char = '_';

static NEXT_SERIAL: AtomicU32 = AtomicU32::new(0);

/// What every descriptor holds.
#[derive(Debug, Clone)]
struct Descriptor {
    /// The state's id, or why its name is not valid (reported at first use).
    id: std::result::Result<StateId, String>,
    ttl: Option<StateTtl>,
    /// Tells descriptors apart cheaply (the TTL registry).
    serial: u32,
}

impl Descriptor {
    fn new(name: &str) -> Self {
        let id = if name.starts_with(RESERVED_PREFIX) {
            Err(format!("state name `{name}`: names starting with `_` are the engine's"))
        } else {
            StateId::new(name).map_err(|e| format!("state name `{name}`: {e}"))
        };
        Descriptor { id, ttl: None, serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed) }
    }

    #[inline]
    fn id(&self) -> Result<&StateId> {
        self.id.as_ref().map_err(|e| Error::Graph(e.clone()))
    }
}

macro_rules! descriptor_common {
    () => {
        /// Give the state a time-to-live.
        pub fn with_ttl(mut self, ttl: StateTtl) -> Self {
            self.d.ttl = Some(ttl);
            self
        }

        /// The state's name.
        pub fn name(&self) -> &str {
            self.d.id.as_ref().map(|id| id.name()).unwrap_or("<invalid>")
        }

        /// The state's time-to-live, if any.
        pub fn ttl(&self) -> Option<StateTtl> {
            self.d.ttl
        }
    };
}

/// One value per key.
#[derive(Debug)]
pub struct ValueStateDescriptor<V> {
    d: Descriptor,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for ValueStateDescriptor<V> {
    fn clone(&self) -> Self {
        ValueStateDescriptor { d: self.d.clone(), _v: PhantomData }
    }
}

impl<V: Serialize + DeserializeOwned> ValueStateDescriptor<V> {
    /// A value state named `name` (1-255 bytes, unique in the function, not starting with `_`).
    pub fn new(name: &str) -> Self {
        ValueStateDescriptor { d: Descriptor::new(name), _v: PhantomData }
    }
    descriptor_common!();
}

/// A list per key; `add` appends without reading.
#[derive(Debug)]
pub struct ListStateDescriptor<V> {
    d: Descriptor,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for ListStateDescriptor<V> {
    fn clone(&self) -> Self {
        ListStateDescriptor { d: self.d.clone(), _v: PhantomData }
    }
}

impl<V: Serialize + DeserializeOwned> ListStateDescriptor<V> {
    /// A list state named `name`.
    pub fn new(name: &str) -> Self {
        ListStateDescriptor { d: Descriptor::new(name), _v: PhantomData }
    }
    descriptor_common!();
}

/// A map per key; every entry is its own backend entry.
#[derive(Debug)]
pub struct MapStateDescriptor<UK, V> {
    d: Descriptor,
    _v: PhantomData<fn() -> (UK, V)>,
}

impl<UK, V> Clone for MapStateDescriptor<UK, V> {
    fn clone(&self) -> Self {
        MapStateDescriptor { d: self.d.clone(), _v: PhantomData }
    }
}

impl<UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> MapStateDescriptor<UK, V> {
    /// A map state named `name`.
    pub fn new(name: &str) -> Self {
        MapStateDescriptor { d: Descriptor::new(name), _v: PhantomData }
    }
    descriptor_common!();
}

type ReduceFn<V> = Arc<dyn Fn(&V, &V) -> V + Send + Sync>;

/// One value per key that every `add` folds into with a reduce function.
#[derive(Clone)]
pub struct ReducingStateDescriptor<V> {
    d: Descriptor,
    reduce: ReduceFn<V>,
}

impl<V> std::fmt::Debug for ReducingStateDescriptor<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReducingStateDescriptor").field("d", &self.d).finish()
    }
}

impl<V: Serialize + DeserializeOwned> ReducingStateDescriptor<V> {
    /// A reducing state named `name`: `add(v)` stores `reduce(&current, &v)`.
    pub fn new(name: &str, reduce: impl Fn(&V, &V) -> V + Send + Sync + 'static) -> Self {
        ReducingStateDescriptor { d: Descriptor::new(name), reduce: Arc::new(reduce) }
    }
    descriptor_common!();
}

type AddFn<I, A> = Arc<dyn Fn(&mut A, &I) + Send + Sync>;

/// An accumulator per key (starting at `ACC::default()`) that every `add` of an input updates.
#[derive(Clone)]
pub struct AggregatingStateDescriptor<I, ACC> {
    d: Descriptor,
    add: AddFn<I, ACC>,
}

impl<I, ACC> std::fmt::Debug for AggregatingStateDescriptor<I, ACC> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregatingStateDescriptor").field("d", &self.d).finish()
    }
}

impl<I, ACC: Serialize + DeserializeOwned + Default> AggregatingStateDescriptor<I, ACC> {
    /// An aggregating state named `name`: `add(input)` runs `add(&mut acc, &input)`.
    pub fn new(name: &str, add: impl Fn(&mut ACC, &I) + Send + Sync + 'static) -> Self {
        AggregatingStateDescriptor { d: Descriptor::new(name), add: Arc::new(add) }
    }
    descriptor_common!();
}

/// How a TTL state's values are laid out, for the cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One value per entry (value, reducing, aggregating, each map entry).
    Single,
    /// A list of framed elements per entry.
    List,
}

/// Shows a stored value as JSON (the state browser).
type ToJson = fn(&[u8], bool, Layout) -> Option<serde_json::Value>;

/// One state a subtask has used.
#[derive(Debug)]
struct Known {
    serial: u32,
    id: StateId,
    name: String,
    /// Handles made since the last [`StateRegistry::announced`].
    uses: u32,
    ttl: Option<StateTtl>,
    layout: Layout,
    to_json: ToJson,
}

/// The states a subtask has used (noted at first use): the TTL cleanup reads their entries,
/// the state browser shows their values.
#[derive(Debug, Default)]
pub(crate) struct StateRegistry {
    states: Vec<Known>,
    with_ttl: usize,
}

/// A stored value as JSON: `{"value", "expires_at"}` with a TTL, the value itself without;
/// a list as an array of those.
fn value_to_json<V: Serialize + DeserializeOwned>(
    bytes: &[u8],
    ttl: bool,
    layout: Layout,
) -> Option<serde_json::Value> {
    let one = |b: &[u8]| -> Option<serde_json::Value> {
        if ttl {
            let (expiry, v): (i64, V) = codec::decode(b).ok()?;
            Some(serde_json::json!({ "value": serde_json::to_value(v).ok()?, "expires_at": expiry }))
        } else {
            serde_json::to_value(codec::decode::<V>(b).ok()?).ok()
        }
    };
    match layout {
        Layout::Single => one(bytes),
        Layout::List => {
            decode_list(bytes).ok()?.into_iter().map(one).collect::<Option<Vec<_>>>().map(Into::into)
        }
    }
}

impl StateRegistry {
    #[inline]
    fn note<V: Serialize + DeserializeOwned>(&mut self, d: &Descriptor, layout: Layout) {
        if let Some(known) = self.states.iter_mut().find(|s| s.serial == d.serial) {
            known.uses = known.uses.saturating_add(1);
            return;
        }
        self.note_new::<V>(d, layout);
    }

    #[inline(never)]
    fn note_new<V: Serialize + DeserializeOwned>(&mut self, d: &Descriptor, layout: Layout) {
        let Ok(id) = &d.id else { return };
        self.with_ttl += usize::from(d.ttl.is_some());
        self.states.push(Known {
            serial: d.serial,
            id: id.clone(),
            name: id.name().to_string(),
            uses: 1,
            ttl: d.ttl,
            layout,
            to_json: value_to_json::<V>,
        });
    }

    fn find_ttl(&self, name: &str) -> Option<(TtlTime, Layout)> {
        self.states.iter().find(|s| s.name == name).and_then(|s| Some((s.ttl?.time, s.layout)))
    }

    /// The states to announce the lookups of for each element of the next batch
    /// ([`KeyedStateBackend::prefetch`]): those used at least once per two of the `elements`
    /// handled since the last call. Their counts start again.
    pub(crate) fn announced(&mut self, elements: usize, out: &mut Vec<StateId>) {
        out.clear();
        for s in &mut self.states {
            if elements > 0 && 2 * s.uses as usize >= elements {
                out.push(s.id.clone());
            }
            s.uses = 0;
        }
    }

    /// Whether any state used so far has a TTL.
    pub(crate) fn has_ttl(&self) -> bool {
        self.with_ttl > 0
    }

    /// The state browser: a stored value of state `name` as JSON, when the state was used.
    pub(crate) fn to_json(&self, name: &str, value: &[u8]) -> Option<serde_json::Value> {
        let s = self.states.iter().find(|s| s.name == name)?;
        let shown = (s.to_json)(value, s.ttl.is_some(), s.layout)?;
        Some(match s.ttl {
            Some(ttl) => serde_json::json!({
                "ttl_ms": ttl.ttl.as_millis() as u64,
                "ttl_time": match ttl.time { TtlTime::EventTime => "event", TtlTime::ProcessingTime => "processing" },
                "entries": shown,
            }),
            None => shown,
        })
    }
}

fn codec_error(state: &StateId, e: impl std::fmt::Display) -> Error {
    Error::CorruptState(format!("state `{}`: {e}", state.name()))
}

fn encode<T: Serialize + ?Sized>(state: &StateId, v: &T) -> Result<Vec<u8>> {
    codec::encode_to_vec(v).map_err(|e| codec_error(state, e))
}

/// [`encode`] into `out` (cleared first), whose allocation is reused.
fn encode_into<T: Serialize + ?Sized>(state: &StateId, v: &T, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    codec::append_encoded(v, out).map_err(|e| codec_error(state, e))
}

fn decode<T: DeserializeOwned>(state: &StateId, bytes: &[u8]) -> Result<T> {
    codec::decode(bytes)
        .map_err(|e| codec_error(state, format!("{e} (stored by another version of the job?)")))
}

/// The expiry time in front of a TTL value.
fn expiry_of(bytes: &[u8]) -> Option<i64> {
    codec::decode::<i64>(bytes).ok()
}

/// A stored value, `None` when it expired by `clocks`.
fn unwrap_value<V: DeserializeOwned>(
    clocks: &Clocks,
    d: &Descriptor,
    id: &StateId,
    bytes: &[u8],
) -> Result<Option<V>> {
    match &d.ttl {
        Some(ttl) => {
            let (expiry, v): (i64, V) = decode(id, bytes)?;
            Ok((!clocks.is_expired(ttl.time, expiry)).then_some(v))
        }
        None => decode(id, bytes).map(Some),
    }
}

/// The current key's view of the backend, shared by every handle.
pub(crate) struct Scope<'c> {
    pub(crate) backend: &'c mut dyn KeyedStateBackend,
    pub(crate) key_group: u16,
    pub(crate) key: &'c [u8],
    pub(crate) clocks: &'c Clocks,
    /// Where the backend found the value read last (a read-modify-write's write goes there).
    pub(crate) hint: Option<EntryHint>,
    pub(crate) registry: &'c mut StateRegistry,
    /// Where single values are read into and encoded (no allocation per record).
    pub(crate) buffer: &'c mut Vec<u8>,
}

impl<'c> Scope<'c> {
    /// The current key's entry of state `id` (borrows neither the scope nor the backend).
    fn state_key<'k>(&self, id: &'k StateId) -> StateKey<'k>
    where
        'c: 'k,
    {
        StateKey::new(self.key_group, id, self.key)
    }

    /// A value as stored: with its expiry in front when the state has a TTL.
    fn wrap<V: Serialize>(&self, d: &Descriptor, id: &StateId, v: &V) -> Result<Vec<u8>> {
        match &d.ttl {
            Some(ttl) => encode(id, &(self.clocks.expiry(ttl), v)),
            None => encode(id, v),
        }
    }

    /// A stored value, `None` when it expired.
    fn unwrap<V: DeserializeOwned>(&self, d: &Descriptor, id: &StateId, bytes: &[u8]) -> Result<Option<V>> {
        unwrap_value(self.clocks, d, id, bytes)
    }

    /// [`Self::wrap`] into the scope's buffer.
    fn wrap_into_buffer<V: Serialize>(&mut self, d: &Descriptor, id: &StateId, v: &V) -> Result<()> {
        match &d.ttl {
            Some(ttl) => encode_into(id, &(self.clocks.expiry(ttl), v), self.buffer),
            None => encode_into(id, v, self.buffer),
        }
    }

    fn refreshes_on_read(d: &Descriptor) -> bool {
        d.ttl.is_some_and(|t| t.update == TtlUpdate::OnReadAndWrite)
    }

    /// The value, decoded where the backend keeps it (or from the buffer it was read into);
    /// where it was found is kept for a write that follows.
    fn get_single<V: Serialize + DeserializeOwned>(&mut self, d: &Descriptor) -> Result<Option<V>> {
        let id = d.id()?;
        let sk = self.state_key(id);
        let Some(bytes) = self.backend.read_hinted(&sk, self.buffer, &mut self.hint)? else {
            return Ok(None);
        };
        let v: Option<V> = unwrap_value(self.clocks, d, id, bytes)?;
        if let (Some(v), true) = (&v, Self::refreshes_on_read(d)) {
            self.put_single(d, v)?;
        }
        Ok(v)
    }

    #[inline(always)]
    fn put_single<V: Serialize>(&mut self, d: &Descriptor, v: &V) -> Result<()> {
        let id = d.id()?;
        self.wrap_into_buffer(d, id, v)?;
        Ok(self.backend.put_hinted(&self.state_key(id), self.buffer.as_slice(), self.hint.as_ref())?)
    }

    fn clear_single(&mut self, d: &Descriptor) -> Result<()> {
        let id = d.id()?;
        Ok(self.backend.delete(&self.state_key(id))?)
    }
}

/// The current key's value of a [`ValueStateDescriptor`].
pub struct ValueHandle<'c, V> {
    pub(crate) scope: Scope<'c>,
    pub(crate) desc: &'c ValueStateDescriptor<V>,
}

impl<V: Serialize + DeserializeOwned> ValueHandle<'_, V> {
    pub(crate) fn new<'c>(scope: Scope<'c>, desc: &'c ValueStateDescriptor<V>) -> ValueHandle<'c, V> {
        scope.registry.note::<V>(&desc.d, Layout::Single);
        ValueHandle { scope, desc }
    }

    /// The value, `None` when unset or expired.
    pub fn get(&mut self) -> Result<Option<V>> {
        self.scope.get_single(&self.desc.d)
    }

    /// Sets the value.
    pub fn set(&mut self, value: &V) -> Result<()> {
        self.scope.put_single(&self.desc.d, value)
    }

    /// Removes the value.
    pub fn clear(&mut self) -> Result<()> {
        self.scope.clear_single(&self.desc.d)
    }
}

/// The current key's value of a [`ReducingStateDescriptor`].
pub struct ReducingHandle<'c, V> {
    scope: Scope<'c>,
    desc: &'c ReducingStateDescriptor<V>,
}

impl<V: Serialize + DeserializeOwned> ReducingHandle<'_, V> {
    pub(crate) fn new<'c>(scope: Scope<'c>, desc: &'c ReducingStateDescriptor<V>) -> ReducingHandle<'c, V> {
        scope.registry.note::<V>(&desc.d, Layout::Single);
        ReducingHandle { scope, desc }
    }

    /// The reduced value, `None` when nothing was added (or it expired).
    pub fn get(&mut self) -> Result<Option<V>> {
        self.scope.get_single(&self.desc.d)
    }

    /// Folds `value` in; returns the new reduced value.
    pub fn add(&mut self, value: V) -> Result<V> {
        let next = match self.scope.get_single::<V>(&self.desc.d)? {
            Some(current) => (self.desc.reduce)(&current, &value),
            None => value,
        };
        self.scope.put_single(&self.desc.d, &next)?;
        Ok(next)
    }

    /// Removes the value.
    pub fn clear(&mut self) -> Result<()> {
        self.scope.clear_single(&self.desc.d)
    }
}

/// The current key's accumulator of an [`AggregatingStateDescriptor`].
pub struct AggregatingHandle<'c, I, ACC> {
    scope: Scope<'c>,
    desc: &'c AggregatingStateDescriptor<I, ACC>,
}

impl<I, ACC: Serialize + DeserializeOwned + Default> AggregatingHandle<'_, I, ACC> {
    pub(crate) fn new<'c>(
        scope: Scope<'c>,
        desc: &'c AggregatingStateDescriptor<I, ACC>,
    ) -> AggregatingHandle<'c, I, ACC> {
        scope.registry.note::<ACC>(&desc.d, Layout::Single);
        AggregatingHandle { scope, desc }
    }

    /// The accumulator, `None` when nothing was added (or it expired).
    pub fn get(&mut self) -> Result<Option<ACC>> {
        self.scope.get_single(&self.desc.d)
    }

    /// Adds one input; returns the new accumulator.
    pub fn add(&mut self, input: &I) -> Result<ACC> {
        let mut acc = self.scope.get_single::<ACC>(&self.desc.d)?.unwrap_or_default();
        (self.desc.add)(&mut acc, input);
        self.scope.put_single(&self.desc.d, &acc)?;
        Ok(acc)
    }

    /// Removes the accumulator.
    pub fn clear(&mut self) -> Result<()> {
        self.scope.clear_single(&self.desc.d)
    }
}

/// The current key's list of a [`ListStateDescriptor`].
pub struct ListHandle<'c, V> {
    scope: Scope<'c>,
    desc: &'c ListStateDescriptor<V>,
}

impl<V: Serialize + DeserializeOwned> ListHandle<'_, V> {
    pub(crate) fn new<'c>(scope: Scope<'c>, desc: &'c ListStateDescriptor<V>) -> ListHandle<'c, V> {
        scope.registry.note::<V>(&desc.d, Layout::List);
        ListHandle { scope, desc }
    }

    /// Appends one element (without reading the list).
    pub fn add(&mut self, value: &V) -> Result<()> {
        let id = self.desc.d.id()?;
        let element = self.scope.wrap(&self.desc.d, id, value)?;
        Ok(self.scope.backend.append(&self.scope.state_key(id), &element)?)
    }

    /// The elements in the order they were added (expired ones left out).
    pub fn get(&mut self) -> Result<Vec<V>> {
        let id = self.desc.d.id()?;
        let Some(raw) = self.scope.backend.get(&self.scope.state_key(id))? else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for element in decode_list(&raw)? {
            if let Some(v) = self.scope.unwrap(&self.desc.d, id, element)? {
                out.push(v);
            }
        }
        if Scope::refreshes_on_read(&self.desc.d) {
            self.update(&out)?;
        }
        Ok(out)
    }

    /// Replaces the list (an empty one removes it).
    pub fn update(&mut self, values: &[V]) -> Result<()> {
        let id = self.desc.d.id()?;
        if values.is_empty() {
            return Ok(self.scope.backend.delete(&self.scope.state_key(id))?);
        }
        let mut raw = Vec::new();
        for v in values {
            raw.extend_from_slice(&frame_list_element(&self.scope.wrap(&self.desc.d, id, v)?));
        }
        Ok(self.scope.backend.put(&self.scope.state_key(id), &raw)?)
    }

    /// Removes the list.
    pub fn clear(&mut self) -> Result<()> {
        let id = self.desc.d.id()?;
        Ok(self.scope.backend.delete(&self.scope.state_key(id))?)
    }
}

/// The current key's map of a [`MapStateDescriptor`].
pub struct MapHandle<'c, UK, V> {
    scope: Scope<'c>,
    desc: &'c MapStateDescriptor<UK, V>,
}

impl<UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> MapHandle<'_, UK, V> {
    pub(crate) fn new<'c>(scope: Scope<'c>, desc: &'c MapStateDescriptor<UK, V>) -> MapHandle<'c, UK, V> {
        scope.registry.note::<V>(&desc.d, Layout::Single);
        MapHandle { scope, desc }
    }

    /// Calls `f` with the backend and the key of `map_key`'s entry.
    fn at_entry<R>(
        &mut self,
        map_key: &UK,
        f: impl FnOnce(&mut dyn KeyedStateBackend, &StateKey<'_>) -> Result<R>,
    ) -> Result<R> {
        let id = self.desc.d.id()?;
        let mk = encode(id, map_key)?;
        let mut sk = self.scope.state_key(id);
        sk.map_key = &mk;
        f(&mut *self.scope.backend, &sk)
    }

    /// The value of `map_key`, `None` when absent or expired.
    pub fn get(&mut self, map_key: &UK) -> Result<Option<V>> {
        let id = self.desc.d.id()?;
        let Some(bytes) = self.at_entry(map_key, |backend, sk| Ok(backend.get(sk)?))? else {
            return Ok(None);
        };
        let v: Option<V> = self.scope.unwrap(&self.desc.d, id, &bytes)?;
        if let (Some(v), true) = (&v, Scope::refreshes_on_read(&self.desc.d)) {
            self.insert(map_key, v)?;
        }
        Ok(v)
    }

    /// Whether `map_key` has a (live) value.
    pub fn contains(&mut self, map_key: &UK) -> Result<bool> {
        Ok(self.get(map_key)?.is_some())
    }

    /// Sets `map_key` to `value`.
    pub fn insert(&mut self, map_key: &UK, value: &V) -> Result<()> {
        let id = self.desc.d.id()?;
        let bytes = self.scope.wrap(&self.desc.d, id, value)?;
        self.at_entry(map_key, |backend, sk| Ok(backend.put(sk, &bytes)?))
    }

    /// Removes `map_key`.
    pub fn remove(&mut self, map_key: &UK) -> Result<()> {
        self.at_entry(map_key, |backend, sk| Ok(backend.delete(sk)?))
    }

    /// Removes `map_key` and returns its value (`None` when absent or expired): the key is
    /// encoded once, and a TTL refreshed on read is not refreshed for an entry going away.
    pub fn take(&mut self, map_key: &UK) -> Result<Option<V>> {
        let taken = self.at_entry(map_key, |backend, sk| {
            let bytes = backend.get(sk)?;
            if bytes.is_some() {
                backend.delete(sk)?;
            }
            Ok(bytes)
        })?;
        let Some(bytes) = taken else { return Ok(None) };
        self.scope.unwrap(&self.desc.d, self.desc.d.id()?, &bytes)
    }

    /// Every live entry, in the order of the encoded map keys.
    pub fn entries(&mut self) -> Result<Vec<(UK, V)>> {
        let id = self.desc.d.id()?;
        let raw = self.scope.backend.scan_map(&self.scope.state_key(id))?;
        let mut out = Vec::with_capacity(raw.len());
        for e in raw {
            let d = decode_key(&e.key)
                .ok_or_else(|| codec_error(id, "a stored key does not follow the key layout"))?;
            if let Some(v) = self.scope.unwrap(&self.desc.d, id, &e.value)? {
                out.push((decode(id, d.map_key)?, v));
            }
        }
        Ok(out)
    }

    /// Whether the map has no live entry.
    pub fn is_empty(&mut self) -> Result<bool> {
        Ok(self.entries()?.is_empty())
    }

    /// Removes every entry.
    pub fn clear(&mut self) -> Result<()> {
        let id = self.desc.d.id()?;
        Ok(self.scope.backend.delete_map(&self.scope.state_key(id))?)
    }
}

/// Deletes expired values of TTL states a little at a time (Flink's incremental cleanup):
/// at every barrier and every second of processing time, the next `budget` entries of the
/// subtask's key groups are read, and those of TTL states that expired are deleted (list
/// elements that expired are dropped from their list).
#[derive(Debug, Default)]
pub(crate) struct TtlCleanup {
    /// Where the next round starts: a key group and the last key read in it.
    cursor: Option<(u16, Option<Vec<u8>>)>,
    /// Values deleted so far (tests).
    pub(crate) removed: u64,
}

impl TtlCleanup {
    /// Reads up to `budget` entries from the cursor on, deleting what expired by `clocks`.
    pub(crate) fn run(
        &mut self,
        backend: &mut dyn KeyedStateBackend,
        registry: &StateRegistry,
        clocks: Clocks,
        budget: usize,
    ) -> Result<()> {
        if !registry.has_ttl() {
            return Ok(());
        }
        let range = backend.key_groups();
        let (mut kg, mut after) = self.cursor.take().unwrap_or((range.start, None));
        if !(range.start..range.end).contains(&kg) {
            (kg, after) = (range.start, None);
        }
        let mut read = 0;
        while read < budget {
            let page = backend.list_entries(kg, after.as_deref(), budget - read)?;
            read += page.entries.len().max(1);
            for e in &page.entries {
                let Some(d) = decode_key(&e.key) else { continue };
                let Some((time, layout)) = registry.find_ttl(d.state) else { continue };
                self.removed += clean_entry(backend, &e.key, &e.value, time, layout, clocks)?;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => {
                    kg = if kg + 1 >= range.end { range.start } else { kg + 1 };
                    after = None;
                }
            }
        }
        self.cursor = Some((kg, after));
        Ok(())
    }
}

/// Deletes what expired of one stored entry; returns how many values went.
fn clean_entry(
    backend: &mut dyn KeyedStateBackend,
    key: &[u8],
    value: &[u8],
    time: TtlTime,
    layout: Layout,
    clocks: Clocks,
) -> Result<u64> {
    let expired = |bytes: &[u8]| expiry_of(bytes).is_some_and(|e| clocks.is_expired(time, e));
    let Some(d) = decode_key(key) else { return Ok(0) };
    let id = StateId::new(d.state)?;
    let mut sk = StateKey::new(d.key_group, &id, d.key);
    sk.namespace = d.namespace;
    sk.map_key = d.map_key;
    match layout {
        Layout::Single if expired(value) => Ok(backend.delete(&sk).map(|_| 1)?),
        Layout::Single => Ok(0),
        Layout::List => {
            let elements = decode_list(value)?;
            let live: Vec<&[u8]> = elements.iter().copied().filter(|e| !expired(e)).collect();
            let gone = (elements.len() - live.len()) as u64;
            if gone == 0 {
                Ok(0)
            } else if live.is_empty() {
                Ok(backend.delete(&sk).map(|_| gone)?)
            } else {
                let raw: Vec<u8> = live.iter().flat_map(|e| frame_list_element(e)).collect();
                Ok(backend.put(&sk, &raw).map(|_| gone)?)
            }
        }
    }
}
