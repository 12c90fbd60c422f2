//! Prepared transactions of the PostgreSQL sink: their ids, the `caudal_sink_epochs`
//! bookkeeping table and the SQL that prepares, commits, rolls back and looks them up.
//!
//! A sink subtask writes the rows of checkpoint epoch `n` in one transaction named
//! `<job>-<operator>-<target>-<subtask>-<n>-<attempt>` (`target` a hash of database,
//! schema and table; `attempt` this run of the job, [`caudal::OperatorContext::attempt`]:
//! shared by all subtasks of the run in every process, new for every run, even one in the
//! same process). The same transaction inserts the id into
//! `caudal_sink_epochs`, so once it commits the database itself says so: on restore a
//! recorded id that is neither prepared nor in the table was lost, and the sink fails
//! loudly instead of silently missing an epoch.
//!
//! Fencing: a run that starts or restores claims the sink in `caudal_sink_fences` and ends
//! the sessions of earlier runs (their `application_name` names the sink and the run), so
//! an earlier run that still lives — frozen, cut off, not yet told — holds no row locks the
//! new one waits for, and its open transaction is gone. Before every `PREPARE` and on every
//! new connection a run reads the claim in the transaction: a run that is no longer the
//! claimant rolls back and stops. What it prepared before the claim, the new run's restore
//! rolls back (another run's) or commits (its checkpoint's).

use super::config::quote;
use serde::{Deserialize, Serialize};

/// The bookkeeping table (in the sink's schema).
pub const EPOCHS_TABLE: &str = "caudal_sink_epochs";

/// The fencing table (in the sink's schema): per sink, the run that writes it now.
pub const FENCES_TABLE: &str = "caudal_sink_fences";

/// A prepared epoch waiting for its checkpoint to complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PreparedEpoch {
    /// The checkpoint whose barrier closed the epoch.
    pub checkpoint: u64,
    /// The prepared transaction's id.
    pub gid: String,
}

/// An epoch that could not be prepared at its barrier because an earlier one was still
/// prepared and not committed (its checkpoint failed, or its completion had not arrived):
/// its rows would have waited for that transaction's row locks on the thread that commits
/// it. Its records go into the checkpoint instead, and are written and committed (with
/// `gid` recorded in `caudal_sink_epochs`, so a restore writes them once) when a checkpoint
/// covering it completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeldEpoch {
    /// The checkpoint whose barrier closed the epoch.
    pub checkpoint: u64,
    /// The id its rows are recorded under once committed.
    pub gid: String,
    /// The epoch's records, bincode-encoded (`Vec<T>`).
    pub records: Vec<u8>,
}

/// What a sink subtask puts in a checkpoint: its prepared epochs and its held ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SinkState {
    pub prepared: Vec<PreparedEpoch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldEpoch>,
}

impl SinkState {
    /// A snapshot as stored: this form, or the list of prepared epochs that releases before
    /// held epochs stored.
    pub(crate) fn decode(blob: &[u8]) -> Result<SinkState, serde_json::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            State(SinkState),
            Prepared(Vec<PreparedEpoch>),
        }
        Ok(match serde_json::from_slice(blob)? {
            Stored::State(s) => s,
            Stored::Prepared(prepared) => SinkState { prepared, held: Vec::new() },
        })
    }
}

/// Names of one sink subtask's transactions.
#[derive(Debug, Clone)]
pub(crate) struct EpochIds {
    /// Every transaction of this sink (all subtasks, all attempts) starts with this.
    pub prefix: String,
    /// `<job>/<operator> → schema.table`, stored with each epoch.
    pub sink: String,
    pub subtask: u32,
    /// This run of the job ([`caudal::OperatorContext::attempt`]).
    pub attempt: String,
    /// The sink's target, hashed: its sessions' `application_name` starts with it.
    target_hash: u32,
}

fn clean(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' })
        .take(max)
        .collect()
}

/// FNV-1a, folded to 32 bits: a short stable hash of the target.
fn short_hash(s: &str) -> u32 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    (h ^ (h >> 32)) as u32
}

impl EpochIds {
    pub(crate) fn new(
        job: &str,
        operator: &str,
        database: &str,
        schema: &str,
        table: &str,
        subtask: u32,
        attempt: &str,
    ) -> Self {
        let target = format!("{database}/{schema}.{table}");
        let target_hash = short_hash(&format!("{job}/{operator}/{target}"));
        EpochIds {
            prefix: format!("{}-{}-{target_hash:08x}-", clean(job, 60), clean(operator, 60)),
            sink: format!("{job}/{operator} -> {schema}.{table}"),
            subtask,
            attempt: attempt.to_string(),
            target_hash,
        }
    }

    /// The `application_name` of this run's sessions (within PostgreSQL's 63 bytes): how a
    /// later run finds the sessions of earlier ones.
    pub(crate) fn application_name(&self) -> String {
        format!("{}{}", self.sessions_prefix(), clean(&self.attempt, 40))
    }

    /// What the `application_name` of every run's sessions of this sink starts with.
    pub(crate) fn sessions_prefix(&self) -> String {
        format!("caudal {:08x} ", self.target_hash)
    }

    /// The transaction of `checkpoint`'s epoch in this run.
    pub(crate) fn gid(&self, checkpoint: u64) -> String {
        format!("{}{}-{}-{}", self.prefix, self.subtask, checkpoint, self.attempt)
    }

    /// True for the transactions of this run (of any subtask: in a cluster the others may
    /// run in other processes and have prepared already; never those of an earlier run,
    /// even one in the same process, which must be rolled back).
    pub(crate) fn is_this_attempt(&self, gid: &str) -> bool {
        gid.ends_with(&format!("-{}", self.attempt))
    }
}

/// The SQL of the bookkeeping, for the sink's schema.
#[derive(Debug, Clone)]
pub(crate) struct EpochSql {
    /// `"schema"."caudal_sink_epochs"`.
    pub qualified: String,
    pub create: String,
    pub record: String,
    pub committed: String,
    pub prepared: &'static str,
    /// `"schema"."caudal_sink_fences"`: per sink, the run that writes it now.
    pub fences: String,
    pub create_fences: String,
    /// (sink, attempt): this run writes the sink from now on.
    pub claim: String,
    /// (sink) → the run that writes it.
    pub fence_of: String,
    /// (sessions prefix, own application name): ends the sessions of earlier runs.
    pub terminate: &'static str,
}

impl EpochSql {
    pub(crate) fn new(schema: &str) -> Self {
        let t = format!("{}.{}", quote(schema), quote(EPOCHS_TABLE));
        let f = format!("{}.{}", quote(schema), quote(FENCES_TABLE));
        EpochSql {
            fences: f.clone(),
            create_fences: format!(
                "CREATE TABLE IF NOT EXISTS {f} (sink TEXT PRIMARY KEY, attempt TEXT NOT NULL, \
                 claimed_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ),
            claim: format!(
                "INSERT INTO {f} (sink, attempt) VALUES ($1, $2) \
                 ON CONFLICT (sink) DO UPDATE SET attempt = EXCLUDED.attempt, claimed_at = now()"
            ),
            fence_of: format!("SELECT attempt FROM {f} WHERE sink = $1"),
            terminate: "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND starts_with(application_name, $1) \
                 AND application_name <> $2",
            qualified: t.clone(),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (gid TEXT PRIMARY KEY, sink TEXT NOT NULL, \
                 subtask INTEGER NOT NULL, checkpoint BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ),
            record: format!("INSERT INTO {t} (gid, sink, subtask, checkpoint) VALUES ($1, $2, $3, $4)"),
            committed: format!("SELECT 1 FROM {t} WHERE gid = $1"),
            prepared: "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)",
        }
    }
}

/// `PREPARE TRANSACTION '<gid>'` (ids hold only `[A-Za-z0-9_.-]`).
pub(crate) fn prepare(gid: &str) -> String {
    format!("PREPARE TRANSACTION '{}'", gid.replace('\'', "''"))
}

/// `COMMIT PREPARED '<gid>'`.
pub(crate) fn commit(gid: &str) -> String {
    format!("COMMIT PREPARED '{}'", gid.replace('\'', "''"))
}

/// `ROLLBACK PREPARED '<gid>'`.
pub(crate) fn rollback(gid: &str) -> String {
    format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_of_an_earlier_release_reads_as_prepared_epochs() {
        let old = br#"[{"checkpoint":3,"gid":"j-o-1-0-3-a"}]"#;
        let state = SinkState::decode(old).unwrap();
        assert_eq!(state.prepared, vec![PreparedEpoch { checkpoint: 3, gid: "j-o-1-0-3-a".into() }]);
        assert!(state.held.is_empty());
        let now = SinkState {
            prepared: state.prepared.clone(),
            held: vec![HeldEpoch { checkpoint: 4, gid: "g".into(), records: vec![1, 2] }],
        };
        assert_eq!(SinkState::decode(&serde_json::to_vec(&now).unwrap()).unwrap(), now);
        assert!(SinkState::decode(b"{\"x\":1}").is_err());
    }

    #[test]
    fn ids_share_the_sink_prefix_and_fit_postgres() {
        let a = EpochIds::new("temperature", "readings-sink", "caudal", "public", "readings", 0, "a1");
        let b = EpochIds::new("temperature", "readings-sink", "caudal", "public", "readings", 3, "a1");
        let other = EpochIds::new("temperature", "readings-sink", "caudal", "test_1", "readings", 0, "a1");
        assert_eq!(a.prefix, b.prefix);
        assert_ne!(a.prefix, other.prefix);
        let gid = b.gid(17);
        assert!(gid.starts_with(&a.prefix) && gid.contains("-3-17-"), "{gid}");
        assert!(b.is_this_attempt(&gid) && a.is_this_attempt(&gid));
        let next_run = EpochIds::new("temperature", "readings-sink", "caudal", "public", "readings", 3, "a2");
        assert!(!next_run.is_this_attempt(&gid));
        let long = EpochIds::new(&"j".repeat(300), &"o o".repeat(100), "d", "s", "t", 9, "18c9a2b3c4d5e6f7");
        assert!(long.gid(u64::MAX).len() < 200);
        assert!(long.gid(1).chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)));
    }
}
