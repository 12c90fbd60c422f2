//! The broker's `transaction.max.timeout.ms`, checked when an exactly-once sink starts.
//!
//! A broker refuses a producer whose `transaction.timeout.ms` exceeds its
//! `transaction.max.timeout.ms`, but only at `init_transactions`, on the sink's first record.
//! So the sink asks the brokers for their setting (`DescribeConfigs` on each broker
//! resource) before it processes anything, and fails at once with an error that names both
//! settings and their values. When the brokers cannot be asked (e.g. the principal may not
//! describe broker configs) the sink goes on with a warning, and the refusal at
//! `init_transactions` (see [`super::transactions`]) remains the check.

use super::config::KafkaSinkConfig;
use caudal::{Error, Result};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use std::time::Duration;

/// The broker setting that bounds every producer's `transaction.timeout.ms`.
pub(crate) const BROKER_MAX_TIMEOUT: &str = "transaction.max.timeout.ms";

/// How long the startup check may wait for the brokers.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Fails when the sink's `transaction.timeout.ms` exceeds the smallest
/// `transaction.max.timeout.ms` among the brokers (any of them may coordinate the sink's
/// transactions). Warns and succeeds when the brokers' settings cannot be read.
pub(crate) fn check_broker_max_timeout(config: &KafkaSinkConfig) -> Result<()> {
    let maximum = match smallest_broker_maximum(config) {
        Ok(Some(max)) => max,
        Ok(None) => return Ok(()),
        Err(why) => {
            tracing::warn!(
                "caudal: kafka sink into `{}`: could not read the brokers' {BROKER_MAX_TIMEOUT} \
                 ({why}); a too long transaction.timeout.ms will only be refused at the first transaction",
                config.topic
            );
            return Ok(());
        }
    };
    let (broker, max_ms) = maximum;
    let timeout_ms = config.transaction_timeout.as_millis();
    if timeout_ms > u128::from(max_ms) {
        return Err(Error::Config {
            setting: "transaction.timeout.ms".into(),
            message: format!(
                "the Kafka sink into `{}` has transaction.timeout.ms = {timeout_ms} ms, above the \
                 {BROKER_MAX_TIMEOUT} = {max_ms} ms of broker {broker} (checked at start, before any \
                 record): lower the sink's transaction timeout or raise {BROKER_MAX_TIMEOUT} on the brokers",
                config.topic
            ),
        });
    }
    Ok(())
}

/// `(broker id, transaction.max.timeout.ms)` of the broker with the smallest maximum;
/// `None` when no broker reports the setting.
fn smallest_broker_maximum(config: &KafkaSinkConfig) -> std::result::Result<Option<(i32, u64)>, String> {
    let admin: AdminClient<DefaultClientContext> =
        crate::kafka::connection_config(&config.brokers, &config.properties)
            .create()
            .map_err(|e| format!("admin client: {e}"))?;
    let metadata =
        admin.inner().fetch_metadata(None, CHECK_TIMEOUT).map_err(|e| format!("cluster metadata: {e}"))?;
    let brokers: Vec<i32> = metadata.brokers().iter().map(|b| b.id()).collect();
    let resources: Vec<ResourceSpecifier<'_>> =
        brokers.iter().map(|id| ResourceSpecifier::Broker(*id)).collect();
    let options = AdminOptions::new().request_timeout(Some(CHECK_TIMEOUT));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let described = runtime
        .block_on(async {
            tokio::time::timeout(CHECK_TIMEOUT * 2, admin.describe_configs(&resources, &options)).await
        })
        .map_err(|_| "no answer in time".to_string())?
        .map_err(|e| format!("DescribeConfigs: {e}"))?;
    let mut smallest: Option<(i32, u64)> = None;
    for (id, result) in brokers.iter().zip(described) {
        let resource = result.map_err(|e| format!("DescribeConfigs of broker {id}: {e:?}"))?;
        let Some(value) = resource.get(BROKER_MAX_TIMEOUT).and_then(|e| e.value.as_deref()) else {
            continue;
        };
        let ms: u64 =
            value.parse().map_err(|_| format!("broker {id} reports {BROKER_MAX_TIMEOUT} = `{value}`"))?;
        if smallest.is_none_or(|(_, s)| ms < s) {
            smallest = Some((*id, ms));
        }
    }
    Ok(smallest)
}
