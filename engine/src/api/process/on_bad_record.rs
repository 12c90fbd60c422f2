//! What a process function's bad records do, chosen per operator: fail the job (the
//! default of every operator), skip them, or send them to a side output — Kafka Streams'
//! processing exception handler (KIP-1033, with KIP-1034's dead-letter queue) and Kafka
//! Connect's `errors.tolerance`.
//!
//! A bad record is an element for which the function returns [`Error::BadRecord`]: a
//! replay would fail the same way. Other errors (state, I/O, a system outside) keep their
//! class and fail or restart the task as always. A side output is an ordinary stream: into
//! an exactly-once sink its records are written once, in the same checkpoint epochs as the
//! main output.

use super::context::{Context, KeyedContext, Output};
use super::function::{KeyedProcessFunction, ProcessFunction};
use super::side_output::OutputTag;
use crate::types::{Data, Timestamp};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// An element a process function refused as bad, as [`OnBadRecord::SideOutput`] emits it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "I: Serialize", deserialize = "I: serde::de::DeserializeOwned"))]
pub struct FailedElement<I> {
    /// The element, as the function received it.
    pub element: I,
    /// The operator whose function refused it (as given to [`on_bad_record`]).
    pub operator: String,
    /// Why.
    pub error: String,
}

/// What to do with an element for which the function returns [`Error::BadRecord`]. What the
/// function emitted or changed in state before it returned the error stays.
pub enum OnBadRecord<I: 'static> {
    /// Fail the job at once with the error (not restarted: a replay would fail the same way).
    Fail,
    /// Drop the element, log it (the first ten, then at every power of two, with the count
    /// so far) and go on.
    Skip,
    /// Send it as a [`FailedElement`] to the side output `tag` and go on.
    SideOutput(&'static OutputTag<FailedElement<I>>),
}

impl<I> Clone for OnBadRecord<I> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<I> Copy for OnBadRecord<I> {}

impl<I> std::fmt::Debug for OnBadRecord<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnBadRecord::Fail => f.write_str("Fail"),
            OnBadRecord::Skip => f.write_str("Skip"),
            OnBadRecord::SideOutput(tag) => write!(f, "SideOutput({})", tag.id()),
        }
    }
}

/// `f`, with its bad records handled by `policy`; `operator` names it in logs and in failed
/// elements. A [`ProcessFunction`] or a [`KeyedProcessFunction`] as `f` is.
///
/// ```
/// use caudal::process::{on_bad_record, Context, FailedElement, OnBadRecord, Output, OutputTag, ProcessFunction};
/// use caudal::{Error, Result};
///
/// #[derive(Clone)]
/// struct Parse;
/// impl ProcessFunction<String, i64> for Parse {
///     fn process_element(&mut self, s: String, _: &mut Context<'_>, out: &mut Output<'_, i64>) -> Result<()> {
///         out.collect(s.parse().map_err(|e| Error::BadRecord(format!("`{s}`: {e}")))?);
///         Ok(())
///     }
/// }
/// static UNPARSED: OutputTag<FailedElement<String>> = OutputTag::new("unparsed");
/// let parse = on_bad_record(Parse, "parse", OnBadRecord::SideOutput(&UNPARSED));
/// # let _ = parse;
/// ```
pub fn on_bad_record<F, I>(f: F, operator: &str, policy: OnBadRecord<I>) -> Tolerant<F, I> {
    Tolerant { f, policy, operator: operator.to_owned(), bad: 0 }
}

/// A function with a policy for its bad records (see [`on_bad_record`]).
pub struct Tolerant<F, I: 'static> {
    f: F,
    policy: OnBadRecord<I>,
    operator: String,
    /// Bad records this subtask met.
    bad: u64,
}

impl<F: Clone, I> Clone for Tolerant<F, I> {
    fn clone(&self) -> Self {
        Tolerant { f: self.f.clone(), policy: self.policy, operator: self.operator.clone(), bad: self.bad }
    }
}

impl<F, I: Data> Tolerant<F, I> {
    /// A copy of `element` when the policy needs it after the function consumed it.
    fn keep(&self, element: &I) -> Option<I> {
        matches!(self.policy, OnBadRecord::SideOutput(_)).then(|| element.clone())
    }

    /// Applies the policy to the function's `result` for an element (`kept`, if needed).
    fn handle(
        &mut self,
        result: Result<()>,
        kept: Option<I>,
        side: impl FnOnce(&'static OutputTag<FailedElement<I>>, FailedElement<I>) -> Result<()>,
    ) -> Result<()> {
        let error = match result {
            Err(Error::BadRecord(error)) => error,
            other => return other,
        };
        self.bad += 1;
        match (self.policy, kept) {
            (OnBadRecord::Fail, _) => Err(Error::BadRecord(error)),
            (OnBadRecord::SideOutput(tag), Some(element)) => {
                side(tag, FailedElement { element, operator: self.operator.clone(), error })
            }
            (OnBadRecord::Skip, _) | (OnBadRecord::SideOutput(_), None) => {
                if self.bad <= 10 || self.bad.is_power_of_two() {
                    tracing::warn!(
                        "caudal: `{}`: bad record skipped ({} so far): {error}",
                        self.operator,
                        self.bad
                    );
                }
                Ok(())
            }
        }
    }
}

impl<F: ProcessFunction<I, O>, I: Data, O> ProcessFunction<I, O> for Tolerant<F, I> {
    fn process_element(&mut self, value: I, ctx: &mut Context<'_>, out: &mut Output<'_, O>) -> Result<()> {
        let kept = self.keep(&value);
        let result = self.f.process_element(value, ctx, out);
        self.handle(result, kept, |tag, failed| ctx.output(tag, failed))
    }
}

impl<F: KeyedProcessFunction<K, I, O>, K, I: Data, O> KeyedProcessFunction<K, I, O> for Tolerant<F, I> {
    fn process_element(
        &mut self,
        value: I,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        let kept = self.keep(&value);
        let result = self.f.process_element(value, ctx, out);
        self.handle(result, kept, |tag, failed| ctx.output(tag, failed))
    }

    fn on_timer(
        &mut self,
        timestamp: Timestamp,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        self.f.on_timer(timestamp, ctx, out)
    }
}
