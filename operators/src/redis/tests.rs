//! The Redis sink against the real server (`CAUDAL_REDIS_URL`): forward-only in event
//! time, newest of a batch wins, a forgotten script is reloaded, a wrong password or a
//! user without permission for the sink's commands (NOPERM) fails at once naming the sink.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{HashFields, RedisHash, RedisSink, RedisSinkConfig};
use crate::test_stack::{context, service, unique};
use caudal::{Record, Sink};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Reading {
    sensor_id: u64,
    ts: i64,
    temp_c: f64,
}

impl RedisHash for Reading {
    fn key(&self) -> String {
        self.sensor_id.to_string()
    }
    fn event_time(&self) -> i64 {
        self.ts
    }
    fn fields(&self, out: &mut HashFields) {
        out.push(("celsius", self.temp_c.to_string()));
    }
}

fn reading(sensor_id: u64, ts: i64, temp_c: f64) -> Record<Reading> {
    Record::new(ts, Reading { sensor_id, ts, temp_c })
}

/// The Redis tests of this module one at a time: the script cache is the server's, and a
/// test that flushes it must not see another test load the script again in between.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Setup {
    url: String,
    prefix: String,
    conn: ::redis::Connection,
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn setup(what: &str) -> Option<Setup> {
    let url = service("CAUDAL_REDIS_URL")?;
    let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let conn = ::redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    Some(Setup { url, prefix: format!("{}:sensor:", unique(what)), conn, _serial: serial })
}

impl Setup {
    fn sink(&self) -> RedisSink<Reading> {
        let mut c = RedisSinkConfig::new(&self.url);
        c.key_prefix = self.prefix.clone();
        let mut sink = c.build::<Reading>().unwrap();
        sink.on_start(&mut context("redis-test", 0, None)).unwrap();
        sink
    }

    fn hash(&mut self, id: u64) -> HashMap<String, String> {
        ::redis::cmd("HGETALL").arg(format!("{}{id}", self.prefix)).query(&mut self.conn).unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let keys: Vec<String> =
            ::redis::cmd("KEYS").arg(format!("{}*", self.prefix)).query(&mut self.conn).unwrap_or_default();
        for k in keys {
            let _: Result<(), _> = ::redis::cmd("DEL").arg(k).query(&mut self.conn);
        }
    }
}

#[test]
fn a_hash_only_moves_forward_in_event_time() {
    let Some(mut s) = setup("redis_forward") else { return };
    let mut sink = s.sink();
    let mut ctx = context("redis-test", 0, None);
    sink.write_batch(vec![reading(1, 5_000, 20.0), reading(2, 1_000, 10.0)], &mut ctx).unwrap();
    sink.write_batch(vec![reading(1, 3_000, 99.0)], &mut ctx).unwrap(); // a replay of older data
    let h = s.hash(1);
    assert_eq!((h["ts"].as_str(), h["celsius"].as_str()), ("5000", "20"));
    sink.write_batch(vec![reading(1, 7_000, 21.5)], &mut ctx).unwrap();
    let h = s.hash(1);
    assert_eq!((h["ts"].as_str(), h["celsius"].as_str()), ("7000", "21.5"));
    assert_eq!(s.hash(2)["ts"], "1000");
}

#[test]
fn the_newest_record_of_a_batch_wins_whatever_its_position() {
    let Some(mut s) = setup("redis_batch") else { return };
    let mut sink = s.sink();
    let mut ctx = context("redis-test", 0, None);
    sink.write_batch(vec![reading(1, 9, 9.0), reading(1, 4, 4.0), reading(1, 7, 7.0)], &mut ctx).unwrap();
    assert_eq!(s.hash(1)["celsius"], "9");
}

#[test]
fn a_forgotten_script_is_loaded_again_and_counted_as_a_retry() {
    let Some(mut s) = setup("redis_noscript") else { return };
    let mut ctx = context("redis-test", 0, None);
    let mut c = RedisSinkConfig::new(&s.url);
    c.key_prefix = s.prefix.clone();
    let mut sink = c.build::<Reading>().unwrap();
    sink.on_start(&mut ctx).unwrap();
    // A restarted Redis has no scripts; SCRIPT FLUSH does the same to this server.
    let () = ::redis::cmd("SCRIPT").arg("FLUSH").query(&mut s.conn).unwrap();
    sink.write_batch(vec![reading(3, 1, 1.0)], &mut ctx).unwrap();
    assert_eq!(s.hash(3)["ts"], "1");
    let retries = ctx.metrics.counter(caudal::metrics::names::SINK_RETRIES);
    assert!(retries.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[test]
fn a_wrong_password_fails_at_once_naming_the_sink() {
    let Some(s) = setup("redis_auth") else { return };
    let url = s.url.replacen("redis://", "redis://nobody:wrong@", 1);
    let mut sink = RedisSinkConfig::new(url).build::<Reading>().unwrap();
    let e = sink.on_start(&mut context("redis-test", 0, None)).unwrap_err().to_string();
    assert!(e.contains("Redis sink") && e.to_lowercase().contains("pass"), "{e}");
}

#[test]
fn a_user_without_permission_for_the_sinks_commands_fails_at_once_naming_the_sink_and_noperm() {
    let Some(mut s) = setup("redis_noperm") else { return };
    // An ACL user that may log in (and, the second time, load the script) but not run the
    // sink's other commands.
    let user = unique("noperm");
    let mut acl = |rules: &[&str]| {
        let () =
            ::redis::cmd("ACL").arg("SETUSER").arg(&user).arg("reset").arg(rules).query(&mut s.conn).unwrap();
    };
    acl(&["on", ">secret", "~*", "+@connection"]);
    let url = s.url.replacen("redis://", &format!("redis://{user}:secret@"), 1);
    let mut c = RedisSinkConfig::new(&url);
    c.key_prefix = s.prefix.clone();
    let mut ctx = context("redis-test", 0, None);
    let started = std::time::Instant::now();
    let on_start = c.build::<Reading>().unwrap().on_start(&mut ctx).map_err(|e| e.to_string());
    acl(&["on", ">secret", "~*", "+@connection", "+script|load"]);
    let mut sink = c.build::<Reading>().unwrap();
    let write = sink.on_start(&mut ctx).and_then(|()| sink.write_batch(vec![reading(1, 1, 1.0)], &mut ctx));
    let () = ::redis::cmd("ACL").arg("DELUSER").arg(&user).query(&mut s.conn).unwrap();
    for (what, result) in [("connecting", on_start), ("writing", write.map_err(|e| e.to_string()))] {
        let e = result.expect_err(what);
        assert!(
            e.contains("Redis sink `sink`[0]") && e.contains(what) && e.to_uppercase().contains("NOPERM"),
            "{e}"
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "not retried as if transient");
    assert!(s.hash(1).is_empty(), "nothing written");
}

#[test]
fn a_batch_of_many_keys_is_written_in_several_script_calls() {
    let Some(mut s) = setup("redis_many") else { return };
    let mut sink = s.sink();
    let mut ctx = context("redis-test", 0, None);
    let n = super::KEYS_PER_CALL as u64 * 2 + 7;
    sink.write_batch((0..n).map(|id| reading(id, 10, id as f64)).collect(), &mut ctx).unwrap();
    // Half of them move forward, half are replays of older readings.
    sink.write_batch(
        (0..n).map(|id| reading(id, if id % 2 == 0 { 11 } else { 9 }, -1.0)).collect(),
        &mut ctx,
    )
    .unwrap();
    for id in [0, 1, n / 2, n - 1] {
        let h = s.hash(id);
        let want = if id % 2 == 0 { ("11", "-1".to_string()) } else { ("10", id.to_string()) };
        assert_eq!((h["ts"].as_str(), h["celsius"].clone()), want, "sensor {id}");
    }
}
