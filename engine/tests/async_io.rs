//! Async I/O in running jobs: order, capacity, timeouts and retries, failure naming the
//! element; and the elements in flight at a barrier, snapshotted and asked again after a
//! restore at another parallelism, each exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caudal::async_io::{AsyncFailure, AsyncOptions, AsyncResult};
use caudal::testing::CollectSink;
use caudal::{JobConfig, StreamEnv};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn config(parallelism: u32) -> JobConfig {
    JobConfig { parallelism, batch_size: 32, ..JobConfig::default() }
}

/// A lookup that answers `v * 10` after 0..7 ms (by the value), counting requests in flight.
fn slow_lookup(
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
) -> impl Fn(&u64) -> AsyncResult<u64> + Send + Sync {
    move |v: &u64| -> AsyncResult<u64> {
        let (v, in_flight, most) = (*v, in_flight.clone(), most.clone());
        Box::pin(async move {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(v * 7919 % 8)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(v * 10)
        })
    }
}

#[test]
fn ordered_results_keep_the_input_order_and_requests_stay_within_the_capacity() {
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let env = StreamEnv::with_config(config(1));
    let (sink, out) = CollectSink::new();
    let options = AsyncOptions { capacity: 16, ..AsyncOptions::default() };
    env.from_iter("ids", 0..2_000u64)
        .async_map(slow_lookup(in_flight, most.clone()), options)
        .sink("out", move |_| Ok(sink.clone()));
    env.execute("ordered").unwrap();
    assert_eq!(*out.lock(), (0..2_000u64).map(|v| v * 10).collect::<Vec<_>>());
    let most = most.load(Ordering::SeqCst);
    assert!((2..=16).contains(&most), "{most} requests were in flight at once (capacity 16)");
}

#[test]
fn unordered_results_are_every_answer_once() {
    let env = StreamEnv::with_config(config(2));
    let (sink, out) = CollectSink::new();
    let options = AsyncOptions { ordered: false, capacity: 50, ..AsyncOptions::default() };
    let lookup = slow_lookup(Arc::default(), Arc::default());
    env.from_iter("ids", 0..2_000u64)
        .rebalance()
        .async_map(lookup, options)
        .sink("out", move |_| Ok(sink.clone()));
    env.execute("unordered").unwrap();
    let mut got = out.lock().clone();
    got.sort();
    assert_eq!(got, (0..2_000u64).map(|v| v * 10).collect::<Vec<_>>());
}

#[test]
fn failed_and_timed_out_requests_are_retried_and_then_fail_the_job_naming_the_element() {
    // Every third value fails twice, then answers: retried, nothing lost.
    let attempts: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let flaky = {
        let attempts = attempts.clone();
        move |v: &u64| -> AsyncResult<u64> {
            let v = *v;
            let n = {
                let mut a = attempts.lock().unwrap();
                let n = a.entry(v).or_insert(0);
                *n += 1;
                *n
            };
            Box::pin(async move {
                if v.is_multiple_of(3) && n <= 2 {
                    if v.is_multiple_of(2) {
                        tokio::time::sleep(Duration::from_secs(5)).await; // times out
                    }
                    return Err(caudal::Error::Operator("the lookup service is busy".into()));
                }
                Ok(v + 1)
            })
        }
    };
    let options = AsyncOptions {
        timeout: Duration::from_millis(50),
        retry_backoff: Duration::from_millis(5),
        ..AsyncOptions::default()
    };
    let env = StreamEnv::with_config(config(1));
    let (sink, out) = CollectSink::new();
    env.from_iter("ids", 0..60u64).async_map(flaky, options.clone()).sink("out", move |_| Ok(sink.clone()));
    env.execute("flaky").unwrap();
    assert_eq!(*out.lock(), (0..60u64).map(|v| v + 1).collect::<Vec<_>>());
    assert_eq!(attempts.lock().unwrap()[&3], 3, "two failures, then the answer");

    // A request that never answers: 1 + 3 attempts, then the job fails naming it.
    let never = |v: &u64| -> AsyncResult<u64> {
        let v = *v;
        Box::pin(async move {
            if v == 7 {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok(v)
        })
    };
    let env = StreamEnv::with_config(config(1));
    env.from_iter("ids", 0..20u64).async_map(never, options).sink("out", |_| Ok(CollectSink::new().0));
    let err = env.execute("never").unwrap_err().to_string();
    assert!(
        err.contains("async_map: the request for 7 failed 4 times") && err.contains("timed out"),
        "{err}"
    );
}

/// `async_try_map`: an element out of attempts comes out as `Err(AsyncFailure)` in its place
/// (in order, with its last error and attempts), the others as `Ok`, and the job finishes.
#[test]
fn with_async_try_map_an_element_out_of_attempts_comes_out_as_its_failure() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let f = move |v: &u64| -> AsyncResult<u64> {
        let v = *v;
        counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match v {
                3 => Err(caudal::Error::Operator("3 is refused".into())),
                7 => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(v)
                }
                _ => Ok(v * 10),
            }
        })
    };
    let env = StreamEnv::with_config(config(1));
    let (sink, out) = CollectSink::new();
    let options = AsyncOptions {
        retries: 2,
        retry_backoff: Duration::from_millis(1),
        timeout: Duration::from_millis(50),
        ..AsyncOptions::default()
    };
    env.from_iter("ids", 1..=8u64).async_try_map(f, options).sink("out", move |_| Ok(sink.clone()));
    env.execute("try-lookup").unwrap();
    let got = out.lock().clone();
    let failure = |element: u64, error: &str| AsyncFailure { element, error: error.into(), attempts: 3 };
    let want: Vec<Result<u64, AsyncFailure<u64>>> = vec![
        Ok(10),
        Ok(20),
        Err(failure(3, "3 is refused")),
        Ok(40),
        Ok(50),
        Ok(60),
        Err(failure(7, "timed out after 50ms")),
        Ok(80),
    ];
    assert_eq!(got, want);
    assert_eq!(calls.load(Ordering::SeqCst), 6 + 3 + 3, "the two failing elements three times each");
}

#[test]
fn a_capacity_of_zero_is_refused_when_the_job_is_built() {
    let env = StreamEnv::new();
    let lookup = slow_lookup(Arc::default(), Arc::default());
    env.from_iter("ids", 0..3u64)
        .async_map(lookup, AsyncOptions { capacity: 0, ..AsyncOptions::default() })
        .sink("out", |_| Ok(CollectSink::new().0));
    let err = env.execute("zero").unwrap_err().to_string();
    assert!(err.contains("capacity must be at least 1"), "{err}");
}
