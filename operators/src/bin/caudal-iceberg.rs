//! `caudal-iceberg` (also reached as `caudal iceberg …`): the Iceberg tables Caudal writes.
//!
//! ```text
//! caudal iceberg snapshots NAMESPACE.TABLE --catalog postgres://…|http(s)://… [--catalog-name NAME]
//! ```
//!
//! `snapshots` lists the table's snapshots, oldest first: id, parent, commit time, the
//! Caudal job, sink, run and checkpoint id of each (the summary the committer writes), and
//! the records and files it added. The catalog is the SQL catalog (`postgres://…`, the
//! catalog `NAME` in it, default `caudal`) or a REST catalog (`http://…`, `https://…`). S3
//! settings for an S3 warehouse come from the `CAUDAL__S3__*` variables, as for jobs. Exit
//! status 0: done; 1: the catalog or the table failed; 2: bad usage.

use caudal_operators::archive::partition::civil_from_days;
use caudal_operators::iceberg::{open_catalog, summary};
use iceberg::{Catalog, NamespaceIdent, TableIdent};
use std::process::ExitCode;

const USAGE: &str =
    "usage: caudal iceberg snapshots NAMESPACE.TABLE --catalog postgres://…|http(s)://… [--catalog-name NAME]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut table, mut catalog, mut name) = (None, None, "caudal".to_string());
    let mut it = args.iter();
    let command = it.next().cloned();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--catalog" => catalog = it.next().cloned(),
            "--catalog-name" => name = it.next().cloned().unwrap_or_default(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            t if table.is_none() && !t.starts_with('-') => table = Some(t.to_string()),
            other => {
                eprintln!("caudal iceberg: unexpected argument `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some("snapshots"), Some(table), Some(catalog)) = (command.as_deref(), table, catalog) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match snapshots(&table, &catalog, &name) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("caudal iceberg: {e}");
            ExitCode::from(1)
        }
    }
}

fn snapshots(table: &str, url: &str, name: &str) -> Result<String, String> {
    let parts: Vec<&str> = table.split('.').collect();
    let Some((table_name, namespace)) = parts.split_last().filter(|(_, ns)| !ns.is_empty()) else {
        return Err(format!("`{table}` is not NAMESPACE.TABLE"));
    };
    let namespace = NamespaceIdent::from_strs(namespace.iter()).map_err(|e| e.to_string())?;
    let ident = TableIdent::new(namespace, table_name.to_string());
    let s3 =
        caudal::JobConfig::default().with_env_overrides().map_err(|e| e.to_string())?.checkpoints.storage.s3;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let catalog =
            open_catalog(url, name, "", &s3, &Default::default()).await.map_err(|e| format!("{e:#}"))?;
        let table = catalog.load_table(&ident).await.map_err(|e| format!("{e:#}"))?;
        let mut snapshots: Vec<_> = table.metadata().snapshots().collect();
        snapshots.sort_by_key(|s| s.sequence_number());
        let mut out = format!(
            "{:<20} {:<20} {:<24} {:>10}  {:<12} {:<20} {:>10} {:>6}  RUN\n",
            "SNAPSHOT", "PARENT", "COMMITTED (UTC)", "CHECKPOINT", "JOB", "SINK", "RECORDS", "FILES"
        );
        for s in snapshots {
            let p = &s.summary().additional_properties;
            let get = |k: &str| p.get(k).cloned().unwrap_or_else(|| "-".into());
            let at = utc(s.timestamp_ms());
            out += &format!(
                "{:<20} {:<20} {:<24} {:>10}  {:<12} {:<20} {:>10} {:>6}  {}\n",
                s.snapshot_id(),
                s.parent_snapshot_id().map_or("-".into(), |p| p.to_string()),
                at,
                get(summary::CHECKPOINT),
                get(summary::JOB),
                get(summary::SINK),
                get("added-records"),
                get("added-data-files"),
                get(summary::RUN),
            );
        }
        Ok(out)
    })
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of epoch milliseconds.
fn utc(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let (h, mi, sec, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{sec:02}.{milli:03}Z")
}
