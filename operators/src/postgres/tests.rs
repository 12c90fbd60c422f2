//! The PostgreSQL sink against the real database (`CAUDAL_POSTGRES_URL`): epochs visible
//! on completion, restore commits what the checkpoint recorded and rolls back what is
//! newer, a lost epoch fails loudly, a fresh start clears earlier runs, a restart in the
//! same process clears the failed run, permanent failures (unknown role, wrong password,
//! missing permission) name the sink and the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{PostgresSink, PostgresSinkConfig};
use crate::test_stack::{context, run_in_process, service, unique};
use caudal::{CheckpointId, Record, Sink};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Reading {
    sensor_id: u64,
    ts: i64,
    temp_c: f64,
}

fn reading(sensor_id: u64, ts: i64, temp_c: f64) -> Record<Reading> {
    Record::new(ts, Reading { sensor_id, ts, temp_c })
}

/// A schema of its own for each test, and a client to look at it.
struct Db {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    url: String,
    schema: String,
}

impl Db {
    fn open(what: &str) -> Option<Db> {
        let url = service("CAUDAL_POSTGRES_URL")?;
        let rt = super::client::runtime().unwrap();
        let (client, conn) = rt.block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls)).unwrap();
        rt.spawn(async move {
            let _ = conn.await;
        });
        Some(Db { rt, client, url, schema: unique(what) })
    }

    fn config(&self) -> PostgresSinkConfig {
        let mut c = PostgresSinkConfig::new(&self.url, "readings", &["sensor_id", "ts"]);
        c.schema = self.schema.clone();
        c.batch_rows = 3;
        c
    }

    /// A sink; the run it belongs to is the context's `attempt`.
    fn sink(&self) -> PostgresSink<Reading> {
        self.config().build::<Reading>().unwrap()
    }

    fn rows(&self) -> Vec<(i64, i64, f64)> {
        let sql = format!("SELECT sensor_id, ts, temp_c FROM \"{}\".readings ORDER BY 1, 2", self.schema);
        match self.rt.block_on(self.client.query(&sql, &[])) {
            Ok(rows) => rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect(),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Vec::new(),
            Err(e) => panic!("{e}"),
        }
    }

    fn prepared(&self) -> Vec<String> {
        let rows = self
            .rt
            .block_on(self.client.query(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE $1",
                &[&format!("%{}%", self.job())],
            ))
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// The job name: unique per test, so prepared transactions of concurrent tests differ.
    fn job(&self) -> String {
        self.schema.clone()
    }

    fn execute(&self, sql: &str) {
        self.rt.block_on(self.client.batch_execute(sql)).unwrap();
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        for gid in self.prepared() {
            let _ = self.rt.block_on(self.client.batch_execute(&format!("ROLLBACK PREPARED '{gid}'")));
        }
        let _ = self.rt.block_on(
            self.client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema)),
        );
    }
}

#[test]
fn an_epoch_becomes_visible_when_its_checkpoint_completes_and_upserts_replace() {
    let Some(db) = Db::open("pg_visible") else { return };
    let mut ctx = context(&db.job(), 0, None);
    ctx.attempt = "a1".into();
    let mut sink = db.sink();
    sink.on_start(&mut ctx).unwrap();
    sink.write_batch((0..5).map(|i| reading(1, i, i as f64)).collect(), &mut ctx).unwrap();
    sink.write_batch(vec![reading(2, 0, 20.0)], &mut ctx).unwrap();
    assert_eq!(db.rows(), vec![], "nothing is visible before the checkpoint");
    sink.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    assert_eq!(db.rows(), vec![], "prepared is not committed");
    assert_eq!(db.prepared().len(), 1);
    sink.on_checkpoint_complete(CheckpointId(1), &mut ctx).unwrap();
    assert_eq!(db.rows().len(), 6);
    assert!(db.prepared().is_empty());
    // The next epoch updates a row and adds one; a key twice in one batch keeps the last.
    sink.write_batch(vec![reading(2, 0, 21.0), reading(2, 0, 22.0), reading(3, 9, 30.0)], &mut ctx).unwrap();
    sink.pre_commit(CheckpointId(2), &mut ctx).unwrap();
    sink.on_checkpoint_complete(CheckpointId(2), &mut ctx).unwrap();
    let rows = db.rows();
    assert_eq!(rows.len(), 7);
    assert!(rows.contains(&(2, 0, 22.0)) && rows.contains(&(3, 9, 30.0)));
    let epochs: i64 = db
        .rt
        .block_on(
            db.client.query_one(&format!("SELECT count(*) FROM \"{}\".caudal_sink_epochs", db.schema), &[]),
        )
        .unwrap()
        .get(0);
    assert_eq!(epochs, 2, "one bookkeeping row per committed epoch");
}

/// A record type that gained a field (schema evolution): the sink adds the column to the
/// table it finds; the rows written before have none (NULL).
#[test]
fn a_field_added_to_the_record_type_becomes_a_column_of_the_existing_table() {
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sited {
        sensor_id: u64,
        ts: i64,
        temp_c: f64,
        site: String,
    }
    let Some(db) = Db::open("pg_evolve") else { return };
    let mut ctx = context(&db.job(), 0, None);
    let mut old = db.sink();
    old.on_start(&mut ctx).unwrap();
    old.write_batch(vec![reading(1, 0, 10.0)], &mut ctx).unwrap();
    old.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    old.on_checkpoint_complete(CheckpointId(1), &mut ctx).unwrap();
    drop(old);
    let mut new = db.config().build::<Sited>().unwrap();
    new.on_start(&mut ctx).unwrap();
    new.write_batch(
        vec![Record::new(5, Sited { sensor_id: 2, ts: 5, temp_c: 20.0, site: "roof".into() })],
        &mut ctx,
    )
    .unwrap();
    new.pre_commit(CheckpointId(2), &mut ctx).unwrap();
    new.on_checkpoint_complete(CheckpointId(2), &mut ctx).unwrap();
    let sql = format!("SELECT sensor_id, site FROM \"{}\".readings ORDER BY 1", db.schema);
    let rows: Vec<(i64, Option<String>)> =
        db.rt.block_on(db.client.query(&sql, &[])).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, vec![(1, None), (2, Some("roof".to_string()))]);
}

#[test]
fn restore_commits_the_recorded_epoch_and_rolls_back_newer_ones() {
    let Some(db) = Db::open("pg_restore") else { return };
    // Run a1: subtask 0's epoch 1 prepared and recorded in checkpoint 1; subtask 1's epoch 2
    // prepared in a checkpoint that never completed; then the process dies.
    let mut ctx = context(&db.job(), 0, None);
    ctx.attempt = "a1".into();
    let mut a = db.sink();
    a.on_start(&mut ctx).unwrap();
    a.write_batch(vec![reading(1, 1, 1.0), reading(1, 2, 2.0)], &mut ctx).unwrap();
    let chk1 = a.pre_commit(CheckpointId(1), &mut ctx).unwrap().unwrap();
    let mut ctx1 = context(&db.job(), 1, None);
    ctx1.attempt = "a1".into();
    let mut other = db.sink();
    other.on_start(&mut ctx1).unwrap();
    let other_chk1 = other.pre_commit(CheckpointId(1), &mut ctx1).unwrap().unwrap();
    other.write_batch(vec![reading(1, 3, 3.0)], &mut ctx1).unwrap();
    other.pre_commit(CheckpointId(2), &mut ctx1).unwrap();
    a.write_batch(vec![reading(1, 4, 4.0)], &mut ctx).unwrap(); // open, never prepared
    drop((a, other));
    assert_eq!(db.prepared().len(), 2);
    let chk1 = vec![chk1, other_chk1];
    // Run b1 restores checkpoint 1: epoch 1 committed, epoch 2 rolled back.
    let mut ctx = context(&db.job(), 0, Some(1));
    ctx.attempt = "b1".into();
    let mut b = db.sink();
    b.restore(chk1.clone(), &mut ctx).unwrap();
    b.on_start(&mut ctx).unwrap();
    assert_eq!(db.rows(), vec![(1, 1, 1.0), (1, 2, 2.0)]);
    assert!(db.prepared().is_empty(), "newer epochs rolled back: {:?}", db.prepared());
    // Restoring the same checkpoint again (a crash during the restore) changes nothing.
    ctx.attempt = "c1".into();
    let mut c = db.sink();
    c.restore(chk1, &mut ctx).unwrap();
    assert_eq!(db.rows(), vec![(1, 1, 1.0), (1, 2, 2.0)]);
}

#[test]
fn a_recorded_epoch_that_was_rolled_back_fails_the_restore_loudly() {
    let Some(db) = Db::open("pg_lost") else { return };
    let mut ctx = context(&db.job(), 0, None);
    ctx.attempt = "a1".into();
    let mut a = db.sink();
    a.on_start(&mut ctx).unwrap();
    a.write_batch(vec![reading(1, 1, 1.0)], &mut ctx).unwrap();
    let chk1 = a.pre_commit(CheckpointId(1), &mut ctx).unwrap().unwrap();
    drop(a);
    for gid in db.prepared() {
        db.execute(&format!("ROLLBACK PREPARED '{gid}'"));
    }
    let mut ctx = context(&db.job(), 0, Some(1));
    ctx.attempt = "b1".into();
    let e = db.sink().restore(vec![chk1], &mut ctx).unwrap_err().to_string();
    assert!(e.contains("PostgreSQL sink") && e.contains("lost"), "{e}");
}

#[test]
fn a_fresh_start_rolls_back_what_earlier_runs_prepared() {
    let Some(db) = Db::open("pg_fresh") else { return };
    let mut ctx = context(&db.job(), 0, None);
    ctx.attempt = "a1".into();
    let mut a = db.sink();
    a.on_start(&mut ctx).unwrap();
    a.write_batch(vec![reading(1, 1, 1.0)], &mut ctx).unwrap();
    a.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    drop(a);
    assert_eq!(db.prepared().len(), 1);
    ctx.attempt = "b1".into();
    let mut b = db.sink();
    b.on_start(&mut ctx).unwrap();
    assert!(db.prepared().is_empty());
    // b1 writes the same key: it is not blocked by a1's lock.
    b.write_batch(vec![reading(1, 1, 5.0)], &mut ctx).unwrap();
    b.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    b.on_checkpoint_complete(CheckpointId(1), &mut ctx).unwrap();
    assert_eq!(db.rows(), vec![(1, 1, 5.0)]);
}

#[test]
fn a_restart_in_the_same_process_rolls_back_what_the_failed_run_prepared() {
    let Some(db) = Db::open("pg_rerun") else { return };
    let checkpoints = tempfile::tempdir().unwrap();
    let items: Vec<Reading> =
        (0..30).map(|i| Reading { sensor_id: i % 3, ts: i as i64, temp_c: i as f64 }).collect();
    let mut config = db.config();
    // A lingering transaction's row locks would block the replayed upserts: fail fast.
    config.timeout_secs = 2;
    config.retry.give_up_after_secs = 4;
    let make = move || config.build::<Reading>();
    let failed = run_in_process(&db.job(), items.clone(), checkpoints.path(), Some(2), make.clone());
    let e = failed.expect_err("the first run fails").to_string();
    assert!(e.contains("injected failure"), "{e}");
    assert_eq!(db.prepared().len(), 1, "the failed run left checkpoint 2's epoch prepared");
    // The restart runs in the same process, as a job restarted by its own code would.
    run_in_process(&db.job(), items.clone(), checkpoints.path(), None, make).unwrap();
    let expected: Vec<(i64, i64, f64)> = items.iter().map(|r| (r.sensor_id as i64, r.ts, r.temp_c)).collect();
    let mut rows = db.rows();
    rows.sort_by_key(|r| (r.1, r.0));
    assert_eq!(rows, expected, "the output of a clean run");
    assert!(db.prepared().is_empty(), "nothing left prepared: {:?}", db.prepared());
}

#[test]
fn without_checkpoints_rows_are_committed_as_they_are_sent() {
    let Some(db) = Db::open("pg_auto") else { return };
    let mut ctx = context(&db.job(), 0, None);
    ctx.checkpointing = false;
    ctx.attempt = "a1".into();
    let mut s = db.sink();
    s.on_start(&mut ctx).unwrap();
    s.write_batch((0..4).map(|i| reading(1, i, 0.0)).collect(), &mut ctx).unwrap(); // > batch_rows: sent
    assert_eq!(db.rows().len(), 4);
    s.write_batch(vec![reading(2, 0, 0.0)], &mut ctx).unwrap();
    s.on_close(&mut ctx).unwrap();
    assert_eq!(db.rows().len(), 5);
}

#[test]
fn an_unknown_role_fails_at_once_naming_the_sink_and_the_cause() {
    let Some(db) = Db::open("pg_auth") else { return };
    let mut config = db.config();
    let mut pg: tokio_postgres::Config = db.url.parse().unwrap();
    pg.user("no_such_role_caudal");
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    config.url = format!(
        "postgres://no_such_role_caudal@{host}:{}/{}",
        pg.get_ports().first().copied().unwrap_or(5432),
        pg.get_dbname().unwrap()
    );
    let mut sink = config.build::<Reading>().unwrap();
    let mut ctx = context(&db.job(), 0, None);
    let e = sink.on_start(&mut ctx).unwrap_err().to_string();
    assert!(e.contains("PostgreSQL sink") && e.contains("no_such_role_caudal"), "{e}");
}

/// The role scripts/services.sh creates with a password (scram-sha-256 over TCP, while
/// every other role is trusted).
const PASSWORD_ROLE: &str = "caudal_pw";

#[test]
fn a_wrong_password_fails_at_once_naming_the_sink_and_the_cause() {
    let Some(db) = Db::open("pg_password") else { return };
    let exists = db
        .rt
        .block_on(db.client.query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&PASSWORD_ROLE]))
        .unwrap();
    assert!(
        exists.is_some(),
        "no role {PASSWORD_ROLE}: run scripts/services.sh start postgres (it creates it)"
    );
    let pg: tokio_postgres::Config = db.url.parse().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    let url = |password: &str| {
        format!(
            "postgres://{PASSWORD_ROLE}:{password}@{host}:{}/{}",
            pg.get_ports()[0],
            pg.get_dbname().unwrap()
        )
    };
    // The right password gets in (the role may not create the schema: that fails later).
    let mut config = db.config();
    config.url = url(PASSWORD_ROLE);
    let e = config.build::<Reading>().unwrap().on_start(&mut context(&db.job(), 0, None)).err();
    let e = e.map(|e| e.to_string()).unwrap_or_default();
    assert!(!e.contains("password authentication failed"), "{e}");
    config.url = url("wrong");
    let started = std::time::Instant::now();
    let e = config.build::<Reading>().unwrap().on_start(&mut context(&db.job(), 0, None)).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("PostgreSQL sink `sink`[0]") && e.contains("password authentication failed"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "not retried as if transient");
}

#[test]
fn a_record_that_does_not_fit_the_key_is_a_configuration_error() {
    let Some(db) = Db::open("pg_key") else { return };
    let mut config = db.config();
    config.key = vec!["nope".into()];
    let mut sink = config.build::<Reading>().unwrap();
    let mut ctx = context(&db.job(), 0, None);
    sink.on_start(&mut ctx).unwrap();
    let e = sink.write_batch(vec![reading(1, 1, 1.0)], &mut ctx).unwrap_err().to_string();
    assert!(e.contains("postgres.key") && e.contains("nope"), "{e}");
}

#[test]
fn a_missing_permission_fails_at_once_naming_the_cause() {
    let Some(db) = Db::open("pg_perm") else { return };
    // A role that may log in but not create anything in the sink's schema.
    let role = format!("{}_ro", db.schema);
    db.execute(&format!("CREATE SCHEMA \"{}\"; CREATE ROLE \"{role}\" LOGIN", db.schema));
    let mut config = db.config();
    let pg: tokio_postgres::Config = db.url.parse().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    config.url = format!("postgres://{role}@{host}:{}/{}", pg.get_ports()[0], pg.get_dbname().unwrap());
    let mut sink = config.build::<Reading>().unwrap();
    let mut ctx = context(&db.job(), 0, None);
    let started = std::time::Instant::now();
    let e = sink.on_start(&mut ctx).unwrap_err().to_string();
    db.execute(&format!("DROP ROLE IF EXISTS \"{role}\""));
    assert!(e.contains("PostgreSQL sink") && e.contains("permission denied") && e.contains("42501"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "not retried as if transient");
}

#[test]
fn a_role_that_may_only_write_the_existing_tables_is_enough() {
    let Some(db) = Db::open("pg_writer") else { return };
    let mut ctx = context(&db.job(), 0, None);
    ctx.attempt = "a1".into();
    let mut owner = db.sink();
    owner.on_start(&mut ctx).unwrap();
    owner.write_batch(vec![reading(1, 1, 1.0)], &mut ctx).unwrap();
    owner.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    owner.on_checkpoint_complete(CheckpointId(1), &mut ctx).unwrap();
    let role = format!("{}_w", db.schema);
    db.execute(&format!(
        "CREATE ROLE \"{role}\" LOGIN; GRANT USAGE ON SCHEMA \"{s}\" TO \"{role}\"; \
         GRANT SELECT, INSERT, UPDATE ON \"{s}\".readings, \"{s}\".caudal_sink_epochs, \"{s}\".caudal_sink_fences \
         TO \"{role}\"",
        s = db.schema
    ));
    let pg: tokio_postgres::Config = db.url.parse().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    let mut config = db.config();
    config.url = format!("postgres://{role}@{host}:{}/{}", pg.get_ports()[0], pg.get_dbname().unwrap());
    let mut writer = config.build::<Reading>().unwrap();
    ctx.attempt = "b1".into();
    let result = (|| {
        writer.on_start(&mut ctx)?;
        writer.write_batch(vec![reading(1, 1, 2.0), reading(1, 2, 3.0)], &mut ctx)?;
        writer.pre_commit(CheckpointId(2), &mut ctx)?;
        writer.on_checkpoint_complete(CheckpointId(2), &mut ctx)
    })();
    drop(writer);
    db.execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""));
    result.unwrap();
    assert_eq!(db.rows(), vec![(1, 1, 2.0), (1, 2, 3.0)]);
}

/// `async_map` with the lookup: every reading enriched from the table (or `None` for a
/// sensor without a row), one query per sensor with the cache.
#[test]
fn the_lookup_enriches_every_element_through_async_io_with_one_query_per_key() {
    use super::PostgresLookup;
    use caudal::async_io::AsyncOptions;
    let Some(db) = Db::open("lookup") else { return };
    let s = &db.schema;
    db.rt
        .block_on(db.client.batch_execute(&format!(
            "CREATE SCHEMA \"{s}\"; CREATE TABLE \"{s}\".sensors (sensor_id BIGINT PRIMARY KEY, site TEXT NOT NULL); \
             INSERT INTO \"{s}\".sensors SELECT i, 'site-' || i FROM generate_series(0, 39) i;"
        )))
        .unwrap();
    let lookup = PostgresLookup::new(
        &db.url,
        &format!("SELECT site FROM \"{s}\".sensors WHERE sensor_id = $1"),
        |r: &Reading| r.sensor_id as i64,
        |row: &tokio_postgres::Row| Ok(row.get::<_, String>(0)),
    );
    let counter = lookup.clone();
    let env = caudal::StreamEnv::with_config(caudal::JobConfig { parallelism: 2, ..Default::default() });
    let (sink, out) = caudal::testing::CollectSink::new();
    let readings: Vec<Reading> =
        (0..2_000).map(|i| Reading { sensor_id: i % 50, ts: i as i64, temp_c: 1.0 }).collect();
    env.from_iter("readings", readings.clone())
        .rebalance()
        .async_map(lookup, AsyncOptions { capacity: 20, ..AsyncOptions::default() })
        .sink("out", move |_| Ok(sink.clone()));
    env.execute("lookup").unwrap();
    let mut got: Vec<(u64, i64, Option<String>)> =
        out.lock().iter().map(|(r, site)| (r.sensor_id, r.ts, site.clone())).collect();
    got.sort();
    let mut want: Vec<(u64, i64, Option<String>)> = readings
        .iter()
        .map(|r| (r.sensor_id, r.ts, (r.sensor_id < 40).then(|| format!("site-{}", r.sensor_id))))
        .collect();
    want.sort();
    assert_eq!(got, want);
    // A key is queried again only while its first answer is still on its way.
    let queries = counter.queries();
    assert!((50..=50 + 2 * 20).contains(&queries), "{queries} queries for 50 keys");
    db.rt.block_on(db.client.batch_execute(&format!("DROP SCHEMA \"{s}\" CASCADE"))).unwrap();
}

/// Runs `f` on a thread of its own and fails the test if it takes over `limit` (a lock wait
/// would otherwise hang the test for the sink's retries).
fn within<R: Send + 'static>(
    limit: std::time::Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("{what} did not return within {limit:?}"))
}

/// Checkpoint 1 fails (its epoch stays prepared, holding its keys' row locks) and the next
/// epoch upserts the same keys (a "latest per sensor" table does every epoch): barrier 2
/// holds the epoch in the checkpoint instead of waiting for locks that only the commit on
/// this same thread would release (#43: a lock wait, minutes of retries, a failed job).
/// Checkpoint 2's completion commits epoch 1, then writes epoch 2 over it, in order.
#[test]
fn after_a_failed_checkpoint_the_next_epoch_of_the_same_keys_waits_in_the_checkpoint() {
    let Some(db) = Db::open("pg_held") else { return };
    let job = db.job();
    let mut sink = db.sink();
    let (sink, _) = within(std::time::Duration::from_secs(60), "barrier 2", move || {
        let mut ctx = context(&job, 0, None);
        ctx.attempt = "a1".into();
        sink.on_start(&mut ctx).unwrap();
        sink.write_batch(vec![reading(1, 1, 1.0), reading(2, 1, 1.0)], &mut ctx).unwrap();
        sink.pre_commit(CheckpointId(1), &mut ctx).unwrap(); // checkpoint 1 never completes
        sink.write_batch(vec![reading(1, 1, 2.0), reading(3, 1, 3.0)], &mut ctx).unwrap();
        let chk2 = sink.pre_commit(CheckpointId(2), &mut ctx).unwrap().unwrap();
        (sink, chk2)
    });
    assert_eq!(db.prepared().len(), 1, "epoch 2 is held, not prepared");
    assert_eq!(db.rows(), vec![]);
    let job = db.job();
    let mut sink = sink;
    within(std::time::Duration::from_secs(60), "completing checkpoint 2", move || {
        let mut ctx = context(&job, 0, None);
        ctx.attempt = "a1".into();
        sink.on_checkpoint_complete(CheckpointId(2), &mut ctx).unwrap();
        // The epoch after it goes the usual way again.
        sink.write_batch(vec![reading(3, 1, 4.0)], &mut ctx).unwrap();
        sink.pre_commit(CheckpointId(3), &mut ctx).unwrap();
        sink.on_checkpoint_complete(CheckpointId(3), &mut ctx).unwrap();
    });
    assert_eq!(db.rows(), vec![(1, 1, 2.0), (2, 1, 1.0), (3, 1, 4.0)]);
    assert!(db.prepared().is_empty());

    // A crash right after barrier 2 instead: the restore of checkpoint 2 commits epoch 1 and
    // writes epoch 2, once however often it runs.
    let Some(db) = Db::open("pg_held_restore") else { return };
    let mut ctx = context(&db.job(), 0, None);
    ctx.attempt = "a1".into();
    let mut a = db.sink();
    a.on_start(&mut ctx).unwrap();
    a.write_batch(vec![reading(1, 1, 1.0), reading(2, 1, 1.0)], &mut ctx).unwrap();
    a.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    a.write_batch(vec![reading(1, 1, 2.0), reading(3, 1, 3.0)], &mut ctx).unwrap();
    let chk2 = a.pre_commit(CheckpointId(2), &mut ctx).unwrap().unwrap();
    drop(a);
    for attempt in ["b1", "c1"] {
        let mut ctx = context(&db.job(), 0, Some(2));
        ctx.attempt = attempt.into();
        let mut b = db.sink();
        b.restore(vec![chk2.clone()], &mut ctx).unwrap();
        b.on_start(&mut ctx).unwrap();
        assert_eq!(db.rows(), vec![(1, 1, 2.0), (2, 1, 1.0), (3, 1, 3.0)], "after restore {attempt}");
        assert!(db.prepared().is_empty());
    }
}
