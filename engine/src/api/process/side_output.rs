//! Side outputs: streams of another type a process function emits besides its main output.
//!
//! A process operator's records are [`Tagged`]: its main output, or a side record carrying
//! its tag's hash and its bincode encoding. The stream the API returns is a chained step
//! after the operator that keeps the main records; each `side_output(&TAG)` adds another
//! that keeps (and decodes) the records of that tag.

use super::codec;
use crate::operator::{Operator, OperatorContext};
use crate::types::{Batch, Data, Record, Timestamp};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;

/// The name and type of a side output (Flink's `OutputTag`).
///
/// ```
/// use caudal::process::OutputTag;
/// static LATE: OutputTag<String> = OutputTag::new("late-readings");
/// assert_eq!(LATE.id(), "late-readings");
/// ```
pub struct OutputTag<T> {
    id: &'static str,
    hash: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for OutputTag<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OutputTag({:?})", self.id)
    }
}

impl<T> OutputTag<T> {
    /// A tag named `id` (unique among the side outputs of one function).
    pub const fn new(id: &'static str) -> Self {
        OutputTag { id, hash: fnv1a(id.as_bytes()), _t: PhantomData }
    }

    /// The tag's name.
    pub fn id(&self) -> &'static str {
        self.id
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }
}

/// FNV-1a, 64 bits: a stable hash computable at compile time.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// A process operator's output record: main, or a side output's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Tagged<O> {
    /// The main output.
    Main(O),
    /// A side output: the tag's hash and the bincode-encoded value.
    Side(u64, Vec<u8>),
}

/// Side records emitted while one element or timer was handled.
#[derive(Debug, Default)]
pub(crate) struct SideRecords(Vec<Record<(u64, Vec<u8>)>>);

impl SideRecords {
    pub(crate) fn push<S: Serialize>(&mut self, tag: &OutputTag<S>, ts: Timestamp, value: &S) -> Result<()> {
        let bytes = codec::encode_to_vec(value)
            .map_err(|e| Error::Internal(format!("side output `{}`: {e}", tag.id())))?;
        self.0.push(Record::new(ts, (tag.hash(), bytes)));
        Ok(())
    }

    /// Moves the side records into the operator's output. Called after every element,
    /// which mostly emits none: the empty case is one length check, not a call (an empty
    /// `extend` was 3 % of the count pipeline's keyed thread).
    #[inline]
    pub(crate) fn drain_into<O>(&mut self, out: &mut Batch<Tagged<O>>) {
        if !self.0.is_empty() {
            self.move_into(out);
        }
    }

    #[inline(never)]
    fn move_into<O>(&mut self, out: &mut Batch<Tagged<O>>) {
        out.extend(self.0.drain(..).map(|r| Record::new(r.ts, Tagged::Side(r.value.0, r.value.1))));
    }
}

/// Keeps the main records.
pub(crate) struct MainOutput<O>(pub(crate) PhantomData<fn(O)>);

impl<O: Data> Operator for MainOutput<O> {
    type In = Tagged<O>;
    type Out = O;

    fn process_batch(
        &mut self,
        batch: Batch<Tagged<O>>,
        out: &mut Batch<O>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        out.extend(batch.into_iter().filter_map(|r| match r.value {
            Tagged::Main(v) => Some(Record::new(r.ts, v)),
            Tagged::Side(..) => None,
        }));
        Ok(())
    }
}

/// Keeps (and decodes) the records of one side output.
pub(crate) struct SideOutput<O, S> {
    pub(crate) hash: u64,
    pub(crate) id: &'static str,
    pub(crate) _t: PhantomData<fn(O) -> S>,
}

impl<O: Data, S: Data> Operator for SideOutput<O, S> {
    type In = Tagged<O>;
    type Out = S;

    fn process_batch(
        &mut self,
        batch: Batch<Tagged<O>>,
        out: &mut Batch<S>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        for r in batch {
            if let Tagged::Side(hash, bytes) = r.value {
                if hash == self.hash {
                    let value = codec::decode(&bytes)
                        .map_err(|e| Error::CorruptState(format!("side output `{}`: {e}", self.id)))?;
                    out.push(Record::new(r.ts, value));
                }
            }
        }
        Ok(())
    }
}
