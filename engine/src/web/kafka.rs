//! `GET /api/v1/jobs/{name}/kafka`: consumer lag per Kafka source partition, now and over
//! the sampled history, and broker health (leader, replicas, in-sync replicas) of every
//! partition the job's Kafka sources read and sinks write, and what the sinks' producers see
//! of each broker (request latency, errors, retries, timeouts, lost connections).
//!
//! Built from the gauges Kafka sources and sinks publish (named by [`kafka_gauges`]); an
//! operator with none of them is not a Kafka connector and is left out. Negative gauge values
//! mean "not known yet" and are answered as `null`.

use super::registry::{JobEntry, SAMPLE_INTERVAL};
use crate::job::JobStatus;
use crate::metrics::{kafka_client_settings, kafka_gauges, kafka_producer_gauges};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// `GET /api/v1/jobs/{name}/kafka`
#[derive(Debug, Serialize)]
pub(crate) struct KafkaView {
    pub(crate) job: String,
    pub(crate) status: JobStatus,
    pub(crate) now_ms: i64,
    pub(crate) sample_interval_ms: u64,
    /// When each point of every `lag_history` was sampled, oldest first.
    pub(crate) history_at_ms: Vec<i64>,
    pub(crate) sources: Vec<KafkaSourceLag>,
    /// Partitions (of all sources and sinks) whose in-sync replicas are fewer than their
    /// replicas.
    pub(crate) under_replicated_partitions: usize,
    /// Broker health per Kafka source and sink topic.
    pub(crate) health: Vec<TopicHealth>,
    /// Per Kafka sink and broker, what its producers see (librdkafka's statistics).
    pub(crate) producers: Vec<ProducerBroker>,
    /// The effective settings of every Kafka source's consumer and sink's producers.
    pub(crate) clients: Vec<ClientSettings>,
}

/// The effective client settings of one Kafka source or sink operator: what Caudal and the
/// user set (secrets masked) and librdkafka's defaults of the settings that decide
/// throughput and durability.
#[derive(Debug, Serialize)]
pub(crate) struct ClientSettings {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    /// `consumer` or `producer`.
    pub(crate) client: String,
    pub(crate) settings: BTreeMap<String, String>,
}

fn clients_of(snapshot: &[crate::metrics::OperatorSnapshot]) -> Vec<ClientSettings> {
    let mut out = Vec::new();
    for op in snapshot {
        let mut by_client: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
        for (name, value) in &op.info {
            if let Some((client, property)) = kafka_client_settings::parse(name) {
                by_client.entry(client).or_default().insert(property.to_string(), value.clone());
            }
        }
        for (client, settings) in by_client {
            out.push(ClientSettings {
                operator_id: op.id,
                operator: op.name.clone(),
                client: client.to_string(),
                settings,
            });
        }
    }
    out
}

/// One broker as the producers of one sink operator see it: latencies are the largest over
/// its subtasks (of their last one-second window), counts their sums since the job started.
#[derive(Debug, Serialize)]
pub(crate) struct ProducerBroker {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    pub(crate) broker: i32,
    /// Produce request round-trip time, ms (`null`: no request in the last window).
    pub(crate) rtt_p50_ms: Option<f64>,
    pub(crate) rtt_p99_ms: Option<f64>,
    pub(crate) requests: i64,
    pub(crate) errors: i64,
    pub(crate) retries: i64,
    pub(crate) timeouts: i64,
    pub(crate) disconnects: i64,
}

fn producers_of(snapshot: &[crate::metrics::OperatorSnapshot]) -> Vec<ProducerBroker> {
    let g = kafka_producer_gauges::ALL;
    let mut out = Vec::new();
    for op in snapshot {
        let mut brokers: BTreeMap<i32, [i64; 7]> = BTreeMap::new();
        for s in &op.subtasks {
            let mut subtask: BTreeMap<i32, [i64; 7]> = BTreeMap::new();
            for (name, value) in &s.gauges {
                let Some((broker, what)) = kafka_producer_gauges::parse(name) else { continue };
                let Some(i) = g.iter().position(|w| *w == what) else { continue };
                subtask.entry(broker).or_insert(kafka_producer_gauges::NONE)[i] = *value;
            }
            for (broker, v) in subtask {
                kafka_producer_gauges::merge(
                    brokers.entry(broker).or_insert(kafka_producer_gauges::NONE),
                    &v,
                );
            }
        }
        let ms = |us: i64| (us >= 0).then(|| us as f64 / 1000.0);
        out.extend(brokers.into_iter().map(|(broker, t)| ProducerBroker {
            operator_id: op.id,
            operator: op.name.clone(),
            broker,
            rtt_p50_ms: ms(t[0]),
            rtt_p99_ms: ms(t[1]),
            requests: t[2],
            errors: t[3],
            retries: t[4],
            timeouts: t[5],
            disconnects: t[6],
        }));
    }
    out
}

/// The partitions of one topic as one source or sink operator sees them.
#[derive(Debug, Serialize)]
pub(crate) struct TopicHealth {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    /// `source` or `sink`.
    pub(crate) kind: &'static str,
    pub(crate) topic: String,
    pub(crate) under_replicated: usize,
    pub(crate) partitions: Vec<PartitionHealth>,
}

/// One partition's replication, from the cluster metadata.
#[derive(Debug, Serialize)]
pub(crate) struct PartitionHealth {
    pub(crate) partition: i32,
    /// The leader's broker id (`null`: no leader, or not known yet).
    pub(crate) leader: Option<i64>,
    pub(crate) replicas: Option<i64>,
    pub(crate) in_sync_replicas: Option<i64>,
    /// `in_sync_replicas < replicas` (`null` while not known).
    pub(crate) under_replicated: Option<bool>,
    /// How often the in-sync replicas shrank / expanded since the job started (between two
    /// metadata answers; `null` before the first).
    pub(crate) isr_shrinks: Option<i64>,
    pub(crate) isr_expands: Option<i64>,
}

/// One Kafka source operator.
#[derive(Debug, Serialize)]
pub(crate) struct KafkaSourceLag {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    pub(crate) parallelism: usize,
    /// The sum of the partitions' known lags (`null` while none is known).
    pub(crate) lag: Option<i64>,
    pub(crate) partitions: Vec<PartitionLag>,
}

/// One partition of a source.
#[derive(Debug, Serialize)]
pub(crate) struct PartitionLag {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) end_offset: Option<i64>,
    pub(crate) checkpointed_offset: Option<i64>,
    pub(crate) lag: Option<i64>,
    /// The partition's watermark in the source, ms since the epoch (`null` before a record).
    pub(crate) watermark: Option<i64>,
    /// Replicas and in-sync replicas (see `health`).
    pub(crate) replicas: Option<i64>,
    pub(crate) in_sync_replicas: Option<i64>,
    /// The lag at each of `history_at_ms` (`null` where it was not known).
    pub(crate) lag_history: Vec<Option<i64>>,
    /// The lag in event time: now minus the partition's watermark, ms (`null` before its
    /// first record).
    pub(crate) behind_ms: Option<i64>,
    /// How long until the lag is gone at the rate checkpoints covered this partition over the
    /// last [`CATCH_UP_WINDOW`], ms (0: no lag; `null`: unknown, or no progress in it).
    pub(crate) catch_up_ms: Option<i64>,
}

/// The window over which a partition's consumption rate is measured for `catch_up_ms`.
pub(crate) const CATCH_UP_WINDOW: Duration = Duration::from_secs(30);

/// How long `lag` records take at the rate `checkpointed` advanced over the samples
/// `(at_ms, checkpointed offset)`, oldest first, up to `now_ms`.
fn catch_up_ms(lag: Option<i64>, now: Option<i64>, samples: &[(i64, i64)], now_ms: i64) -> Option<i64> {
    let (lag, now) = (lag?, now?);
    if lag == 0 {
        return Some(0);
    }
    let (then_ms, then) = *samples.first()?;
    let (advanced, secs) = (now - then, (now_ms - then_ms) as f64 / 1000.0);
    (advanced > 0 && secs > 0.0).then(|| (lag as f64 / (advanced as f64 / secs) * 1000.0) as i64)
}

fn known(v: Option<i64>) -> Option<i64> {
    v.filter(|v| *v >= 0)
}

impl KafkaView {
    /// The lag of every Kafka source of `job`, with the last `history` of samples.
    pub(crate) fn of(job: &JobEntry, now: i64, history: Duration) -> Self {
        let snapshot = job.view.metrics.snapshot();
        // Per source operator: its partitions, from the current gauges.
        let sources: Vec<(&crate::metrics::OperatorSnapshot, Vec<(String, i32)>)> = snapshot
            .iter()
            .filter_map(|op| {
                let mut parts: Vec<(String, i32)> = op
                    .gauges
                    .keys()
                    .filter_map(|name| kafka_gauges::parse(name))
                    .filter(|(_, _, what)| *what == kafka_gauges::LAG)
                    .map(|(topic, p, _)| (topic.to_string(), p))
                    .collect();
                parts.sort();
                (!parts.is_empty()).then_some((op, parts))
            })
            .collect();
        let (history_at_ms, histories) = job.with_history(|h| {
            let samples: Vec<_> = h.since(history).collect();
            let at: Vec<i64> = samples.iter().map(|s| s.at_ms).collect();
            let mut lags: BTreeMap<(u32, String, i32), Vec<Option<i64>>> = BTreeMap::new();
            let mut covered: BTreeMap<(u32, String, i32), Vec<(i64, i64)>> = BTreeMap::new();
            let since = now - CATCH_UP_WINDOW.as_millis() as i64;
            for (op, parts) in &sources {
                for (topic, p) in parts {
                    let name = kafka_gauges::name(topic, *p, kafka_gauges::LAG);
                    let series = samples.iter().map(|s| known(s.gauge(op.id, &name))).collect();
                    lags.insert((op.id, topic.clone(), *p), series);
                    let name = kafka_gauges::name(topic, *p, kafka_gauges::CHECKPOINTED_OFFSET);
                    let points = samples
                        .iter()
                        .filter(|s| s.at_ms >= since)
                        .filter_map(|s| known(s.gauge(op.id, &name)).map(|o| (s.at_ms, o)))
                        .collect();
                    covered.insert((op.id, topic.clone(), *p), points);
                }
            }
            (at, (lags, covered))
        });
        let (mut histories, mut covered) = histories;
        let sources = sources
            .into_iter()
            .map(|(op, parts)| {
                let gauge = |topic: &str, p: i32, what: &str| {
                    known(op.gauges.get(&kafka_gauges::name(topic, p, what)).copied())
                };
                let partitions: Vec<PartitionLag> = parts
                    .into_iter()
                    .map(|(topic, p)| {
                        let samples = covered.remove(&(op.id, topic.clone(), p)).unwrap_or_default();
                        (topic, p, samples)
                    })
                    .map(|(topic, p, samples)| PartitionLag {
                        behind_ms: gauge(&topic, p, kafka_gauges::WATERMARK).map(|w| (now - w).max(0)),
                        catch_up_ms: catch_up_ms(
                            gauge(&topic, p, kafka_gauges::LAG),
                            gauge(&topic, p, kafka_gauges::CHECKPOINTED_OFFSET),
                            &samples,
                            now,
                        ),
                        end_offset: gauge(&topic, p, kafka_gauges::END_OFFSET),
                        checkpointed_offset: gauge(&topic, p, kafka_gauges::CHECKPOINTED_OFFSET),
                        lag: gauge(&topic, p, kafka_gauges::LAG),
                        watermark: gauge(&topic, p, kafka_gauges::WATERMARK),
                        replicas: gauge(&topic, p, kafka_gauges::REPLICAS),
                        in_sync_replicas: gauge(&topic, p, kafka_gauges::IN_SYNC_REPLICAS),
                        lag_history: histories.remove(&(op.id, topic.clone(), p)).unwrap_or_default(),
                        topic,
                        partition: p,
                    })
                    .collect();
                let lags: Vec<i64> = partitions.iter().filter_map(|p| p.lag).collect();
                KafkaSourceLag {
                    operator_id: op.id,
                    operator: op.name.clone(),
                    parallelism: op.subtasks.len(),
                    lag: (!lags.is_empty()).then(|| lags.iter().sum()),
                    partitions,
                }
            })
            .collect();
        let health = health_of(&snapshot);
        KafkaView {
            producers: producers_of(&snapshot),
            clients: clients_of(&snapshot),
            under_replicated_partitions: health.iter().map(|h| h.under_replicated).sum(),
            health,
            job: job.view.name.clone(),
            status: job.view.status(),
            now_ms: now,
            sample_interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
            history_at_ms,
            sources,
        }
    }
}

/// Broker health of every operator that publishes replica gauges, per topic.
fn health_of(snapshot: &[crate::metrics::OperatorSnapshot]) -> Vec<TopicHealth> {
    let mut out = Vec::new();
    for op in snapshot {
        let mut topics: BTreeMap<&str, BTreeMap<i32, BTreeMap<&str, i64>>> = BTreeMap::new();
        for (name, value) in &op.gauges {
            if let Some((topic, p, what)) = kafka_gauges::parse(name) {
                if [
                    kafka_gauges::LEADER,
                    kafka_gauges::REPLICAS,
                    kafka_gauges::IN_SYNC_REPLICAS,
                    kafka_gauges::ISR_SHRINKS,
                    kafka_gauges::ISR_EXPANDS,
                ]
                .contains(&what)
                {
                    topics.entry(topic).or_default().entry(p).or_default().insert(what, *value);
                }
            }
        }
        for (topic, parts) in topics {
            let partitions: Vec<PartitionHealth> = parts
                .into_iter()
                .map(|(partition, g)| {
                    let get = |what: &str| known(g.get(what).copied());
                    let (replicas, in_sync) =
                        (get(kafka_gauges::REPLICAS), get(kafka_gauges::IN_SYNC_REPLICAS));
                    PartitionHealth {
                        partition,
                        leader: get(kafka_gauges::LEADER),
                        replicas,
                        in_sync_replicas: in_sync,
                        under_replicated: replicas.zip(in_sync).map(|(r, i)| i < r),
                        isr_shrinks: get(kafka_gauges::ISR_SHRINKS),
                        isr_expands: get(kafka_gauges::ISR_EXPANDS),
                    }
                })
                .collect();
            out.push(TopicHealth {
                operator_id: op.id,
                operator: op.name.clone(),
                kind: op.kind,
                topic: topic.to_string(),
                under_replicated: partitions.iter().filter(|p| p.under_replicated == Some(true)).count(),
                partitions,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catch_up_time_is_the_lag_at_the_rate_checkpoints_advanced() {
        // 1,000 records covered in 10 s: 100/s; a lag of 500 takes 5 s.
        assert_eq!(catch_up_ms(Some(500), Some(2_000), &[(0, 1_000)], 10_000), Some(5_000));
        assert_eq!(catch_up_ms(Some(0), Some(2_000), &[], 10_000), Some(0));
        assert_eq!(catch_up_ms(Some(500), Some(1_000), &[(0, 1_000)], 10_000), None, "no progress");
        assert_eq!(catch_up_ms(None, Some(1_000), &[(0, 0)], 10_000), None, "lag unknown");
    }
}
