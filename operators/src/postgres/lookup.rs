//! A PostgreSQL lookup for `async_map`: enrich each element with a row found by its key,
//! through a bounded cache.
//!
//! **In:** elements and their `BIGINT` key. **Out:** `(element, Some(value))` when the query
//! (one parameter, `$1`, the key) returns a row, `(element, None)` when it returns none.
//! Answers, found or not, are cached per key (at most `cache_entries`, the oldest evicted
//! first), so a hot key costs one query; a failed query is not cached (`async_map` retries
//! it). One connection per operator in a process, opened at the first request and shared by
//! its subtasks there (queries are pipelined), as is the cache.

use caudal::async_io::{AsyncFunction, AsyncResult};
use caudal::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;
use tokio_postgres::{Client, Row};

type Map<V> = Arc<dyn Fn(&Row) -> Result<V> + Send + Sync>;
type KeyOf<I> = Arc<dyn Fn(&I) -> i64 + Send + Sync>;

/// The answers of recent keys, oldest evicted first.
struct Cache<V> {
    entries: HashMap<i64, Option<V>>,
    order: VecDeque<i64>,
    capacity: usize,
}

impl<V: Clone> Cache<V> {
    fn get(&self, key: i64) -> Option<Option<V>> {
        self.entries.get(&key).cloned()
    }

    fn put(&mut self, key: i64, value: Option<V>) {
        if self.capacity == 0 {
            return;
        }
        if self.entries.insert(key, value).is_none() {
            self.order.push_back(key);
        }
        while self.entries.len() > self.capacity {
            let Some(oldest) = self.order.pop_front() else { break };
            self.entries.remove(&oldest);
        }
    }
}

/// Looks each element's key up with one query (see the module doc).
pub struct PostgresLookup<I, V> {
    url: String,
    sql: String,
    key: KeyOf<I>,
    map: Map<V>,
    client: Arc<OnceCell<Client>>,
    cache: Arc<Mutex<Cache<V>>>,
    queries: Arc<AtomicU64>,
}

impl<I, V> std::fmt::Debug for PostgresLookup<I, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresLookup({:?})", self.sql)
    }
}

impl<I, V> Clone for PostgresLookup<I, V> {
    /// Another subtask's lookup: the same query and cache size, its own connection and cache.
    fn clone(&self) -> Self {
        let capacity = self.cache.lock().map(|c| c.capacity).unwrap_or(0);
        PostgresLookup {
            url: self.url.clone(),
            sql: self.sql.clone(),
            key: self.key.clone(),
            map: self.map.clone(),
            client: Arc::new(OnceCell::new()),
            cache: Arc::new(Mutex::new(Cache { entries: HashMap::new(), order: VecDeque::new(), capacity })),
            queries: self.queries.clone(),
        }
    }
}

impl<I, V: Clone + Send + 'static> PostgresLookup<I, V> {
    /// `sql` with one parameter `$1` (the key, `BIGINT`), e.g. `SELECT site, name FROM sensors
    /// WHERE sensor_id = $1`; `map` turns its first row into the value.
    pub fn new(
        url: &str,
        sql: &str,
        key: impl Fn(&I) -> i64 + Send + Sync + 'static,
        map: impl Fn(&Row) -> Result<V> + Send + Sync + 'static,
    ) -> Self {
        PostgresLookup {
            url: url.to_string(),
            sql: sql.to_string(),
            key: Arc::new(key),
            map: Arc::new(map),
            client: Arc::new(OnceCell::new()),
            cache: Arc::new(Mutex::new(Cache {
                entries: HashMap::new(),
                order: VecDeque::new(),
                capacity: 10_000,
            })),
            queries: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Keep at most `entries` answers (0: no cache).
    pub fn cache_entries(self, entries: usize) -> Self {
        if let Ok(mut c) = self.cache.lock() {
            c.capacity = entries;
        }
        self
    }

    /// Queries sent so far, by every clone (tests, metrics).
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

fn lookup_error(what: &str, e: tokio_postgres::Error) -> Error {
    if let Some(refusal) = super::tls::tls_refusal(&e) {
        return Error::external_refused("postgresql", format!("PostgreSQL lookup: {what}: {refusal}"));
    }
    Error::external("postgresql", format!("PostgreSQL lookup: {what}: {}", super::client::describe(&e)))
}

impl<I: Clone + Send + Sync + 'static, V: Clone + Send + Sync + 'static> AsyncFunction<I, (I, Option<V>)>
    for PostgresLookup<I, V>
{
    fn call(&self, input: &I) -> AsyncResult<(I, Option<V>)> {
        let key = (self.key)(input);
        let input = input.clone();
        if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(key)) {
            return Box::pin(async move { Ok((input, hit)) });
        }
        let (url, sql, map) = (self.url.clone(), self.sql.clone(), self.map.clone());
        let (client, cache, queries) = (self.client.clone(), self.cache.clone(), self.queries.clone());
        Box::pin(async move {
            let client = client
                .get_or_try_init(|| async {
                    let (config, tls) = super::tls::parse(&url).map_err(|e| {
                        Error::config("postgres lookup url", format!("{}: {e}", super::config::redact(&url)))
                    })?;
                    let (client, conn) =
                        config.connect(tls).await.map_err(|e| lookup_error("connecting", e))?;
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::warn!("PostgreSQL lookup connection: {e}");
                        }
                    });
                    Ok::<Client, Error>(client)
                })
                .await?;
            queries.fetch_add(1, Ordering::Relaxed);
            let rows = client.query(sql.as_str(), &[&key]).await.map_err(|e| lookup_error(&sql, e))?;
            let value = rows.first().map(|r| map(r)).transpose()?;
            if let Ok(mut c) = cache.lock() {
                c.put(key, value.clone());
            }
            Ok((input, value))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_the_newest_keys_up_to_its_size() {
        let mut c: Cache<u8> = Cache { entries: HashMap::new(), order: VecDeque::new(), capacity: 2 };
        c.put(1, Some(10));
        c.put(2, None);
        c.put(1, Some(11)); // an update keeps its place
        c.put(3, Some(30));
        assert_eq!((c.get(1), c.get(2), c.get(3)), (None, Some(None), Some(Some(30))));
    }
}
