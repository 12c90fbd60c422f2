//! [`RedisSink`]: pipelined, forward-only hash writes.
//!
//! Per batch the sink keeps the newest record of each key, then sends one pipeline of
//! `EVALSHA` calls of [`FORWARD_ONLY_HSET`], each for up to [`KEYS_PER_CALL`] keys (one
//! script call per key costs Redis more than the writes). A failed pipeline is sent again after a
//! reconnect (with backoff; the task blocks meanwhile, so the job backpressures); the
//! writes are idempotent, so a repeat is harmless. Nothing waits for checkpoints: values
//! are visible as soon as the batch is written.

use super::config::RedisSinkConfig;
use crate::retry::Failure;
use caudal::{Batch, CheckpointId, Data, OperatorContext, Result, Sink};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// For each hash `KEYS[k]`, `ARGV` holds its event time, its number of fields `m` and `m`
/// field/value pairs, one hash after the other. A hash is written only when it holds no
/// `ts` or an older one. Returns how many hashes were written.
pub const FORWARD_ONLY_HSET: &str = r#"
local i = 1
local written = 0
for k = 1, #KEYS do
  local ts = ARGV[i]
  local m = tonumber(ARGV[i + 1])
  local current = redis.call('HGET', KEYS[k], 'ts')
  if not current or tonumber(current) < tonumber(ts) then
    redis.call('HSET', KEYS[k], 'ts', ts, unpack(ARGV, i + 2, i + 1 + 2 * m))
    written = written + 1
  end
  i = i + 2 + 2 * m
end
return written
"#;

/// Keys per script call: bounds how long one call keeps Redis busy (about a millisecond).
pub const KEYS_PER_CALL: usize = 256;

/// Field/value pairs of a hash.
pub type HashFields = Vec<(&'static str, String)>;

/// A record kept as the latest value of its key.
pub trait RedisHash {
    /// The key (the hash is `<key_prefix><key>`).
    fn key(&self) -> String;
    /// Event time, ms: the hash keeps the record with the largest.
    fn event_time(&self) -> i64;
    /// The fields to store besides `ts`.
    fn fields(&self, out: &mut HashFields);
}

/// Writes the latest record of each key to Redis.
pub struct RedisSink<T> {
    config: RedisSinkConfig,
    client: ::redis::Client,
    conn: Option<::redis::Connection>,
    script: ::redis::Script,
    what: String,
    fields: HashFields,
    retries: Arc<AtomicU64>,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for RedisSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisSink({}*)", self.config.key_prefix)
    }
}

/// Transient: Redis is unreachable, loading, busy, or forgot the script (restarted).
/// Permanent: authentication, permissions, wrong types, anything else.
fn classify(what: &str, e: &::redis::RedisError) -> Failure {
    // redis wraps the I/O error in an Arc that hides it from the source chain: rustls's own
    // words are the fallback.
    let text = e.to_string();
    let refused = crate::tls::refusal_in(e).or_else(|| {
        (text.contains("invalid peer certificate") || text.contains("received fatal alert"))
            .then(|| text.clone())
    });
    if let Some(refusal) = refused {
        return Failure::Permanent(format!(
            "{what}: {refusal}: the server's TLS certificate is not trusted or ours was refused; \
             check the rediss:// host name and tls_ca"
        ));
    }
    let message = format!("{what}: {e}");
    let code = e.code().unwrap_or("");
    if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(code, "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "NOSCRIPT" | "CLUSTERDOWN")
    {
        Failure::Transient(message)
    } else {
        Failure::Permanent(message)
    }
}

impl<T> RedisSink<T> {
    pub(crate) fn new(config: RedisSinkConfig, client: ::redis::Client) -> Self {
        RedisSink {
            what: format!("Redis sink ({}*)", config.key_prefix),
            config,
            client,
            conn: None,
            script: ::redis::Script::new(FORWARD_ONLY_HSET),
            fields: Vec::new(),
            retries: Arc::new(AtomicU64::new(0)),
            _t: PhantomData,
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.config.timeout_secs)
    }

    /// The connection, opened (and the script loaded) if needed.
    fn connection(&mut self) -> Result<&mut ::redis::Connection, Failure> {
        if self.conn.is_none() {
            let timeout = self.timeout();
            let mut conn =
                self.client.get_connection_with_timeout(timeout).map_err(|e| classify("connecting", &e))?;
            conn.set_read_timeout(Some(timeout)).map_err(|e| classify("connecting", &e))?;
            conn.set_write_timeout(Some(timeout)).map_err(|e| classify("connecting", &e))?;
            ::redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(FORWARD_ONLY_HSET)
                .query::<String>(&mut conn)
                .map_err(|e| classify("loading the forward-only script", &e))?;
            self.conn = Some(conn);
        }
        self.conn.as_mut().ok_or_else(|| Failure::Transient("not connected".into()))
    }

    fn send(&mut self, pipe: &::redis::Pipeline) -> Result<(), Failure> {
        let conn = self.connection()?;
        match pipe.query::<()>(conn) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.conn = None;
                Err(classify("writing", &e))
            }
        }
    }
}

impl<T: Data + RedisHash> Sink for RedisSink<T> {
    type In = T;

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.what =
            format!("Redis sink `{}`[{}] ({}*)", ctx.operator_name, ctx.subtask, self.config.key_prefix);
        let what = format!("{}: connecting", self.what);
        let policy = self.config.retry.clone();
        self.retries = ctx.metrics.counter(caudal::metrics::names::SINK_RETRIES);
        let retries = self.retries.clone();
        policy.run_counted("redis", &what, &retries, |_| self.connection().map(|_| ()))
    }

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        // The newest record of each key in this batch (the last one on a tie).
        let mut newest: HashMap<String, usize> = HashMap::new();
        for (i, r) in batch.iter().enumerate() {
            let t = r.value.event_time();
            newest
                .entry(r.value.key())
                .and_modify(|j| {
                    if batch[*j].value.event_time() <= t {
                        *j = i;
                    }
                })
                .or_insert(i);
        }
        if newest.is_empty() {
            return Ok(());
        }
        let mut pipe = ::redis::pipe();
        let sha = self.script.get_hash().to_string();
        let entries: Vec<(&String, &usize)> = newest.iter().collect();
        for chunk in entries.chunks(KEYS_PER_CALL) {
            let mut keys = Vec::with_capacity(chunk.len());
            let mut args: Vec<String> = Vec::with_capacity(chunk.len() * 12);
            for (key, i) in chunk {
                let value = &batch[**i].value;
                self.fields.clear();
                value.fields(&mut self.fields);
                keys.push(format!("{}{key}", self.config.key_prefix));
                args.push(value.event_time().to_string());
                args.push(self.fields.len().to_string());
                for (f, v) in self.fields.drain(..) {
                    args.push(f.to_string());
                    args.push(v);
                }
            }
            pipe.cmd("EVALSHA").arg(&sha).arg(keys.len()).arg(&keys).arg(&args).ignore();
        }
        let what = format!("{}: writing {} keys", self.what, newest.len());
        let policy = self.config.retry.clone();
        let retries = self.retries.clone();
        policy.run_counted("redis", &what, &retries, |_| self.send(&pipe))
    }

    fn pre_commit(
        &mut self,
        _checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        // Every batch is written before the next one is taken: nothing to flush or commit.
        Ok(None)
    }
}

/// The latest reading of each sensor: `sensor:{id}` → celsius, fahrenheit, lat, lon, ts.
impl RedisHash for caudal_schemas::ProcessedReading {
    fn key(&self) -> String {
        self.sensor_id.to_string()
    }

    fn event_time(&self) -> i64 {
        self.ts
    }

    fn fields(&self, out: &mut HashFields) {
        out.push(("celsius", self.temp_c.to_string()));
        out.push(("fahrenheit", self.temp_f.to_string()));
        out.push(("lat", self.lat.to_string()));
        out.push(("lon", self.lon.to_string()));
    }
}
