//! Async I/O (Flink's `AsyncDataStream`): `stream.async_map(f, options)` calls an external
//! system for each element without waiting for one answer before sending the next request.
//!
//! **In:** elements, and an [`AsyncFunction`] returning a future per element. **Out:** one
//! result per element, in input order ([`AsyncOptions::ordered`], the default) or as the
//! answers come (between two watermarks). At most `capacity` requests are in flight per
//! subtask (then the task waits: backpressure); each gets `timeout` per attempt and
//! `retries` more attempts after a failure or a timeout (backoff doubling from
//! `retry_backoff`), then the job fails naming the element — or, with
//! `stream.async_try_map(f, options)`, the element comes out as an [`AsyncFailure`] in its
//! place (`Err`), for a side output or a dead-letter sink.
//!
//! Exactly once: the elements in flight at a barrier (asked, not yet emitted) are the
//! operator's snapshot; a restore asks for them again, spread over the new subtasks so
//! each is asked once whatever the parallelism. A watermark passes the operator only after
//! every element before it has been emitted.

use super::stream::DataStream;
use crate::operator::{Operator, OperatorContext};
use crate::types::{Batch, CheckpointId, Data, Record, Timestamp};
use crate::{Error, Result};
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The future of one request.
pub type AsyncResult<O> = Pin<Box<dyn Future<Output = Result<O>> + Send>>;

/// A request per element (Flink's `AsyncFunction`); any `Fn(&I) -> AsyncResult<O>` is one.
///
/// ```
/// use caudal::async_io::{AsyncOptions, AsyncResult};
/// use caudal::{testing::CollectSink, StreamEnv};
/// let env = StreamEnv::new();
/// let (sink, out) = CollectSink::new();
/// env.from_iter("ids", 1..=3u64)
///     .async_map(|id: &u64| -> AsyncResult<String> {
///         let id = *id;
///         Box::pin(async move { Ok(format!("user-{id}")) }) // a database or HTTP call here
///     }, AsyncOptions::default())
///     .sink("out", move |_| Ok(sink.clone()));
/// env.execute("lookup").unwrap();
/// assert_eq!(*out.lock(), vec!["user-1", "user-2", "user-3"]);
/// ```
pub trait AsyncFunction<I, O>: Send + Sync + 'static {
    /// Starts the request for `input`.
    fn call(&self, input: &I) -> AsyncResult<O>;
}

impl<I, O, F: Fn(&I) -> AsyncResult<O> + Send + Sync + 'static> AsyncFunction<I, O> for F {
    fn call(&self, input: &I) -> AsyncResult<O> {
        self(input)
    }
}

/// An element whose request failed every attempt ([`DataStream::async_try_map`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AsyncFailure<T> {
    /// The element.
    pub element: T,
    /// The last attempt's error (or timeout).
    pub error: String,
    /// Attempts made.
    pub attempts: u32,
}

/// Makes the output of an element out of attempts (`async_try_map`).
type Exhausted<I, O> = Arc<dyn Fn(I, String, u32) -> O + Send + Sync>;

/// `f`, its answers wrapped in `Ok` (`async_try_map`).
struct Succeeded<F>(F);

impl<I: Send + 'static, O: Send + 'static, F: AsyncFunction<I, O>>
    AsyncFunction<I, std::result::Result<O, AsyncFailure<I>>> for Succeeded<F>
{
    fn call(&self, input: &I) -> AsyncResult<std::result::Result<O, AsyncFailure<I>>> {
        let future = self.0.call(input);
        Box::pin(async move { future.await.map(Ok) })
    }
}

/// How `async_map` sends its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncOptions {
    /// Requests in flight per subtask, at most.
    pub capacity: usize,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Results in input order (`true`) or as they come, between watermarks.
    pub ordered: bool,
    /// Attempts after the first, on an error or a timeout.
    pub retries: u32,
    /// Wait before the first retry; doubles for each next one.
    pub retry_backoff: Duration,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        AsyncOptions {
            capacity: 100,
            timeout: Duration::from_secs(10),
            ordered: true,
            retries: 3,
            retry_backoff: Duration::from_millis(100),
        }
    }
}

/// The runtime every async operator of the process sends its requests on.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("caudal-async-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::Internal(format!("starting the async I/O runtime: {e}")))
}

impl<T: Data> DataStream<T> {
    /// Map every element through an asynchronous request (see [`crate::async_io`]).
    pub fn async_map<O: Data, F: AsyncFunction<T, O>>(self, f: F, options: AsyncOptions) -> DataStream<O> {
        if options.capacity == 0 {
            self.graph.borrow_mut().error("async_map: capacity must be at least 1".into());
        }
        let f = Arc::new(f);
        self.transform("async-map", move |_| AsyncMapOperator::new(f.clone(), options.clone(), None))
    }

    /// [`async_map`](DataStream::async_map), but an element whose request failed every
    /// attempt comes out as `Err(AsyncFailure)` in its place instead of failing the job.
    pub fn async_try_map<O: Data, F: AsyncFunction<T, O>>(
        self,
        f: F,
        options: AsyncOptions,
    ) -> DataStream<std::result::Result<O, AsyncFailure<T>>> {
        if options.capacity == 0 {
            self.graph.borrow_mut().error("async_try_map: capacity must be at least 1".into());
        }
        let f = Arc::new(Succeeded(f));
        let exhausted: Exhausted<T, std::result::Result<O, AsyncFailure<T>>> =
            Arc::new(|element, error, attempts| Err(AsyncFailure { element, error, attempts }));
        self.transform("async-map", move |_| {
            AsyncMapOperator::new(f.clone(), options.clone(), Some(exhausted.clone()))
        })
    }
}

/// What a request came back with: (sequence number, attempt, outcome).
type Answer<O> = (u64, u32, std::result::Result<O, String>);

struct InFlight<I, O> {
    record: Record<I>,
    attempt: u32,
    result: Option<O>,
}

/// Runs `async_map` on one subtask.
pub(crate) struct AsyncMapOperator<I, O, F> {
    f: Arc<F>,
    options: AsyncOptions,
    in_flight: BTreeMap<u64, InFlight<I, O>>,
    next: u64,
    answers: (Sender<Answer<O>>, Receiver<Answer<O>>),
    /// `async_try_map`: what an element out of attempts becomes (`None`: the job fails).
    exhausted: Option<Exhausted<I, O>>,
}

impl<I: Data, O: Data, F: AsyncFunction<I, O>> AsyncMapOperator<I, O, F> {
    pub(crate) fn new(f: Arc<F>, options: AsyncOptions, exhausted: Option<Exhausted<I, O>>) -> Result<Self> {
        runtime()?;
        Ok(AsyncMapOperator {
            f,
            options,
            in_flight: BTreeMap::new(),
            next: 0,
            answers: crossbeam_channel::unbounded(),
            exhausted,
        })
    }

    /// Sends attempt `attempt` of request `seq`, after the backoff when it is a retry.
    fn send(&self, seq: u64, attempt: u32, value: &I) -> Result<()> {
        let future = self.f.call(value);
        let (timeout, tx) = (self.options.timeout, self.answers.0.clone());
        let backoff =
            (attempt > 0).then(|| self.options.retry_backoff.saturating_mul(1 << (attempt - 1).min(16)));
        runtime()?.spawn(async move {
            if let Some(wait) = backoff {
                tokio::time::sleep(wait).await;
            }
            let outcome = match tokio::time::timeout(timeout, future).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("timed out after {timeout:?}")),
            };
            let _ = tx.send((seq, attempt, outcome)); // the operator may be gone
        });
        Ok(())
    }

    fn ask(&mut self, record: Record<I>) -> Result<()> {
        let seq = self.next;
        self.next += 1;
        self.send(seq, 0, &record.value)?;
        self.in_flight.insert(seq, InFlight { record, attempt: 0, result: None });
        Ok(())
    }

    /// Takes one answer in: a result, or a retry, or (out of attempts) the job's failure.
    fn answer(&mut self, (seq, attempt, outcome): Answer<O>) -> Result<()> {
        let Some(entry) = self.in_flight.get_mut(&seq) else { return Ok(()) };
        if entry.attempt != attempt {
            return Ok(()); // an answer to an attempt given up on
        }
        match outcome {
            Ok(v) => entry.result = Some(v),
            Err(e) if attempt < self.options.retries => {
                entry.attempt += 1;
                let value = entry.record.value.clone();
                self.send(seq, attempt + 1, &value)?;
                tracing::debug!("async_map: retrying element {seq} (attempt {}): {e}", attempt + 2);
            }
            Err(e) if self.exhausted.is_some() => {
                if let Some(make) = &self.exhausted {
                    entry.result = Some(make(entry.record.value.clone(), e, attempt + 1));
                }
            }
            Err(e) => {
                let element = format!("{:?}", entry.record.value);
                let element: String = element.chars().take(200).collect();
                return Err(Error::external(
                    "async I/O",
                    format!(
                        "async_map: the request for {element} failed {} times, the last: {e}",
                        attempt + 1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Emits what may go out: the completed head (ordered) or every completed request.
    fn emit(&mut self, out: &mut Batch<O>) {
        if self.options.ordered {
            while let Some(mut first) = self.in_flight.first_entry() {
                let Some(v) = first.get_mut().result.take() else { break };
                let ts = first.get().record.ts;
                first.remove();
                out.push(Record::new(ts, v));
            }
        } else {
            let done: Vec<u64> =
                self.in_flight.iter().filter(|(_, e)| e.result.is_some()).map(|(s, _)| *s).collect();
            for seq in done {
                if let Some(InFlight { record, result: Some(v), .. }) = self.in_flight.remove(&seq) {
                    out.push(Record::new(record.ts, v));
                }
            }
        }
    }

    /// Takes in the answers already there.
    fn poll(&mut self, out: &mut Batch<O>) -> Result<()> {
        while let Ok(a) = self.answers.1.try_recv() {
            self.answer(a)?;
        }
        self.emit(out);
        Ok(())
    }

    /// Waits for one answer (every request has its timeout, so one comes).
    fn wait_one(&mut self, out: &mut Batch<O>) -> Result<()> {
        let a =
            self.answers.1.recv().map_err(|_| Error::Operator("async_map: answers channel closed".into()))?;
        self.answer(a)?;
        self.poll(out)
    }

    /// Waits until nothing is in flight.
    fn drain(&mut self, out: &mut Batch<O>) -> Result<()> {
        self.poll(out)?;
        while !self.in_flight.is_empty() {
            self.wait_one(out)?;
        }
        Ok(())
    }
}

impl<I: Data, O: Data, F: AsyncFunction<I, O>> Operator for AsyncMapOperator<I, O, F> {
    type In = I;
    type Out = O;

    fn process_batch(
        &mut self,
        batch: Batch<I>,
        out: &mut Batch<O>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        for record in batch {
            while self.in_flight.len() >= self.options.capacity {
                self.wait_one(out)?;
            }
            self.ask(record)?;
        }
        self.poll(out)
    }

    /// Every element before the watermark goes out before it.
    fn on_watermark(
        &mut self,
        _watermark: Timestamp,
        out: &mut Batch<O>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        self.drain(out)
    }

    /// While requests are in flight, answers are taken in every few milliseconds.
    fn on_processing_time(
        &mut self,
        _now: Timestamp,
        out: &mut Batch<O>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        self.poll(out)
    }

    fn next_processing_time(&self) -> Option<Timestamp> {
        (!self.in_flight.is_empty()).then(|| crate::runtime::processing_clock::now_ms() + 5)
    }

    /// The elements asked and not emitted yet, in input order: asked again after a restore.
    fn snapshot(&mut self, _checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        let waiting: Vec<&Record<I>> = self.in_flight.values().map(|e| &e.record).collect();
        bincode::serde::encode_to_vec(&waiting, bincode::config::standard())
            .map(Some)
            .map_err(|e| Error::Internal(format!("async_map snapshot: {e}")))
    }

    /// Asks again for the elements in flight at the checkpoint: the old subtasks' lists are
    /// spread over the new subtasks (list `j` to subtask `j % parallelism`), each asked once.
    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        for (j, blob) in snapshots.iter().enumerate() {
            if j % ctx.parallelism.max(1) as usize != ctx.subtask as usize {
                continue;
            }
            let (waiting, _): (Vec<Record<I>>, usize) =
                bincode::serde::decode_from_slice(blob, bincode::config::standard()).map_err(|e| {
                    Error::CorruptState(format!("async_map: restoring the elements in flight: {e}"))
                })?;
            for record in waiting {
                self.ask(record)?;
            }
        }
        Ok(())
    }

    fn on_close(&mut self, out: &mut Batch<O>, _ctx: &mut OperatorContext) -> Result<()> {
        self.drain(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::OperatorHarness;

    fn slow(v: &u64) -> AsyncResult<u64> {
        let v = *v;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(v * 2)
        })
    }

    type Slow = fn(&u64) -> AsyncResult<u64>;

    fn harness() -> OperatorHarness<AsyncMapOperator<u64, u64, Slow>> {
        OperatorHarness::new(
            AsyncMapOperator::new(Arc::new(slow as Slow), AsyncOptions::default(), None).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn elements_in_flight_at_a_barrier_are_asked_again_once_each_after_a_restore_at_another_parallelism() {
        // Two subtasks of the old run, each with ten requests in flight at the barrier.
        let mut snapshots = Vec::new();
        for part in 0..2u64 {
            let mut h = harness();
            h.process((part * 10..part * 10 + 10).map(|v| Record::new(v as i64, v)).collect()).unwrap();
            let s = h.snapshot(1).unwrap();
            assert!(h.take().is_empty(), "nothing answered yet");
            let waiting: Vec<Record<u64>> = bincode::serde::decode_from_slice(
                s.operator_state.as_ref().unwrap(),
                bincode::config::standard(),
            )
            .unwrap()
            .0;
            assert_eq!(waiting.len(), 10, "the ten requests in flight are the snapshot");
            snapshots.push(s);
        }
        // Restored at parallelism 3: every element asked again by exactly one subtask.
        let mut got = Vec::new();
        for subtask in 0..3 {
            let mut h = harness();
            h.restore_as(snapshots.clone(), subtask, 3).unwrap();
            h.close().unwrap();
            got.extend(h.take().into_iter().map(|r| (r.ts, r.value)));
        }
        got.sort();
        assert_eq!(got, (0..20u64).map(|v| (v as i64, v * 2)).collect::<Vec<_>>());
    }
}
