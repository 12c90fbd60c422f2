//! The RocksDB backend: one database per operator subtask, its state in a column
//! family named after the operator, keys laid out by [`crate::keys`].
//!
//! Tuned for streaming: the write-ahead log is off (the checkpoint is the
//! durability), block cache and memtables are bounded by [`RocksDbConfig`], two
//! background jobs, LZ4. Snapshots are incremental: SST files are immutable, so an SST
//! already uploaded by the last completed checkpoint is referenced, not uploaded again.
//!
//! Local layout under the backend's directory:
//! `db/` (the live database), `snapshots/chk-<n>/` (hard-linked RocksDB checkpoints
//! waiting for upload), `restore/` (scratch space while restoring).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompressionType, FlushOptions,
    MergeOperands, Options, ReadOptions, WriteBatch, WriteOptions, DB,
};
use serde::{Deserialize, Serialize};

use super::{
    check_key_group, fetch_verified, frame_list_element, sha256_hex, BatchOp, EntryPage, EntrySink,
    KeyGroupStats, KeyedStateBackend, RawEntry, RocksDbStateHandle, SnapshotResult, StateHandle,
    StateSnapshot, StateWriteBatch, StoredFile, UploadStats,
};
use crate::ids::{CheckpointId, OperatorId};
use crate::keygroup::KeyGroupRange;
use crate::keys::{key_group_lower_bound, key_group_upper_bound, prefix_successor, StateKey};
use crate::store::{CheckpointStore, StateLocation};
use crate::{Error, Result};

/// RocksDB settings of a state backend. Defaults suit a small machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RocksDbConfig {
    /// Block cache size in MiB (per backend instance).
    pub block_cache_mb: u64,
    /// Size of one memtable in MiB; a full memtable is flushed to an SST file.
    pub write_buffer_mb: u64,
    /// Memtables kept in memory at most (one active, the others flushing).
    pub max_write_buffer_number: u32,
    /// Background flush and compaction threads; keep low so that compaction cannot
    /// starve the processing threads.
    pub max_background_jobs: u32,
    /// Target size of an SST file in MiB.
    pub target_file_size_mb: u64,
    /// Bloom filter bits per key (0 disables the filter).
    pub bloom_bits_per_key: u32,
    /// Compress SST blocks with LZ4.
    pub lz4: bool,
}

impl Default for RocksDbConfig {
    fn default() -> Self {
        RocksDbConfig {
            block_cache_mb: 64,
            write_buffer_mb: 32,
            max_write_buffer_number: 2,
            max_background_jobs: 2,
            target_file_size_mb: 32,
            bloom_bits_per_key: 10,
            lz4: true,
        }
    }
}

impl RocksDbConfig {
    /// Checks the values; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.block_cache_mb == 0 {
            return Err(Error::config("rocksdb.block_cache_mb", "must be at least 1"));
        }
        if self.write_buffer_mb == 0 {
            return Err(Error::config("rocksdb.write_buffer_mb", "must be at least 1"));
        }
        if self.max_write_buffer_number < 2 {
            return Err(Error::config("rocksdb.max_write_buffer_number", "must be at least 2"));
        }
        if !(1..=64).contains(&self.max_background_jobs) {
            return Err(Error::config("rocksdb.max_background_jobs", "must be 1-64"));
        }
        if self.target_file_size_mb == 0 {
            return Err(Error::config("rocksdb.target_file_size_mb", "must be at least 1"));
        }
        Ok(())
    }

    fn db_options(&self) -> Options {
        let mut o = Options::default();
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        o.set_max_background_jobs(self.max_background_jobs as i32);
        o.set_max_open_files(512);
        // Write compaction and flush output to disk as it goes (1 MB at a time) rather than
        // in one burst at the end of a file: a large compaction's final sync otherwise holds
        // the disk while the barrier's memtable flush waits behind it.
        o.set_bytes_per_sync(1 << 20);
        // Compaction threads (the low-priority pool) yield CPU and disk to the task threads
        // and to flushes (the high-priority pool, which a barrier waits for).
        if let Ok(mut env) = rocksdb::Env::new() {
            env.lower_thread_pool_cpu_priority();
            env.lower_thread_pool_io_priority();
            o.set_env(&env);
        }
        o
    }

    fn cf_options(&self, cache: &Cache) -> Options {
        let mut o = Options::default();
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(cache);
        table.set_block_size(16 * 1024);
        // A hash index in each data block: a point lookup finds its key without the binary
        // search over the block's restart points.
        table.set_data_block_index_type(rocksdb::DataBlockIndexType::BinaryAndHash);
        table.set_data_block_hash_ratio(0.75);
        // Index and filter blocks count against the cache (memory stays bounded), partitioned
        // into 4 KB pieces: a whole-file filter block larger than a cache shard (64 MB / 64
        // shards) would never stay cached and be read again, and checksummed, on every
        // lookup of a key the window cache does not hold (~7x slower with 1 M keys). The
        // top-level index and filter partitions stay pinned.
        table.set_cache_index_and_filter_blocks(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        if self.bloom_bits_per_key > 0 {
            table.set_bloom_filter(f64::from(self.bloom_bits_per_key), false);
        }
        o.set_block_based_table_factory(&table);
        // A bloom filter over the memtable's whole keys: a lookup of a key the memtable does
        // not hold skips the skip list (a cache miss per level; with 1 M keys it was a
        // quarter of the CPU time).
        o.set_memtable_whole_key_filtering(true);
        o.set_memtable_prefix_bloom_ratio(0.1);
        o.set_write_buffer_size((self.write_buffer_mb as usize) << 20);
        o.set_max_write_buffer_number(self.max_write_buffer_number as i32);
        o.set_target_file_size_base(self.target_file_size_mb << 20);
        o.set_level_compaction_dynamic_level_bytes(true);
        o.set_compression_type(if self.lz4 { DBCompressionType::Lz4 } else { DBCompressionType::None });
        o.set_merge_operator_associative("caudal-list-append", concat_merge);
        o
    }
}

/// List append: values are concatenations of length-prefixed frames.
fn concat_merge(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut out = existing.map(<[u8]>::to_vec).unwrap_or_default();
    for op in operands.iter() {
        out.extend_from_slice(op);
    }
    Some(out)
}

/// Files of this backend known to be in storage: sst name → stored file.
#[derive(Debug, Default)]
struct SharedRegistry {
    /// The SSTs referenced by the last completed checkpoint: safe to reference again.
    confirmed: HashMap<String, StoredFile>,
    /// The checkpoint `confirmed` belongs to (`None` when it is empty or of unknown origin).
    confirmed_at: Option<CheckpointId>,
    /// The SSTs of uploaded snapshots waiting for their checkpoint to complete.
    pending: BTreeMap<CheckpointId, HashMap<String, StoredFile>>,
}

impl SharedRegistry {
    /// Checkpoint `id` completed: its files become the ones to reuse.
    fn complete(&mut self, id: CheckpointId) {
        if let Some(files) = self.pending.remove(&id) {
            self.confirmed = files;
            self.confirmed_at = Some(id);
        }
        self.pending.retain(|p, _| *p > id);
    }

    /// The files a snapshot whose barrier names `latest_completed` may reuse: those of that
    /// checkpoint, which retention keeps while the snapshot is in flight. A barrier is
    /// news of a completion when its notification has not arrived yet; files of any other
    /// checkpoint may be gone, so then nothing is reused.
    fn reusable(&mut self, latest_completed: Option<CheckpointId>) -> HashMap<String, StoredFile> {
        if let Some(latest) = latest_completed {
            self.complete(latest);
            if self.confirmed_at != Some(latest) {
                self.confirmed.clear();
                self.confirmed_at = None;
            }
        }
        self.confirmed.clone()
    }
}

/// Keyed state in a local RocksDB.
pub struct RocksDbStateBackend {
    db: DB,
    cf_name: String,
    dir: PathBuf,
    range: KeyGroupRange,
    instance: String,
    write_opts: WriteOptions,
    registry: Arc<Mutex<SharedRegistry>>,
}

impl std::fmt::Debug for RocksDbStateBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbStateBackend")
            .field("dir", &self.dir)
            .field("column_family", &self.cf_name)
            .field("range", &self.range)
            .field("instance", &self.instance)
            .finish()
    }
}

fn open_db(path: &Path, config: &RocksDbConfig, cf_name: &str) -> Result<DB> {
    let cache = Cache::new_lru_cache((config.block_cache_mb as usize) << 20);
    let cfs = vec![
        ColumnFamilyDescriptor::new("default", config.cf_options(&cache)),
        ColumnFamilyDescriptor::new(cf_name, config.cf_options(&cache)),
    ];
    DB::open_cf_descriptors(&config.db_options(), path, cfs)
        .map_err(Error::rocks(format!("opening `{}`", path.display())))
}

fn no_wal() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.disable_wal(true);
    w
}

/// Empties the backend's own sub-directories of `dir` (never anything else in it).
fn reset_working_dir(dir: &Path) -> Result<()> {
    for sub in ["db", "snapshots", "restore"] {
        let p = dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(Error::io("removing", &p))?;
        }
    }
    std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))
}

fn recreate_dir(path: &Path) -> Result<()> {
    if path.exists() {
        std::fs::remove_dir_all(path).map_err(Error::io("removing", path))?;
    }
    std::fs::create_dir_all(path).map_err(Error::io("creating", path))
}

impl RocksDbStateBackend {
    /// A new, empty backend in `dir` for the state of `operator` over `range`. The
    /// backend owns `dir/db`, `dir/snapshots` and `dir/restore`: leftovers there from an
    /// earlier run are removed.
    pub fn open(
        dir: &Path,
        operator: &OperatorId,
        range: KeyGroupRange,
        config: &RocksDbConfig,
    ) -> Result<Self> {
        config.validate()?;
        reset_working_dir(dir)?;
        Self::open_existing(dir, operator, range, config)
    }

    fn open_existing(
        dir: &Path,
        operator: &OperatorId,
        range: KeyGroupRange,
        config: &RocksDbConfig,
    ) -> Result<Self> {
        let db = open_db(&dir.join("db"), config, operator.as_str())?;
        Ok(RocksDbStateBackend {
            db,
            cf_name: operator.as_str().to_string(),
            dir: dir.to_path_buf(),
            range,
            instance: uuid::Uuid::new_v4().simple().to_string(),
            write_opts: no_wal(),
            registry: Arc::default(),
        })
    }

    /// A backend in `dir` for `operator` over `range`, holding the entries of `range`
    /// from `handles` (usually [`super::handles_for_range`] of the old subtasks).
    ///
    /// One RocksDB handle covering `range` is downloaded and opened as is (keys outside
    /// `range` are range-deleted) and its SST files are reused by the next checkpoint;
    /// otherwise (rescale merge, heap handles) each handle is read and the keys of
    /// `range` are copied, one contiguous scan per handle, into a fresh database.
    pub fn restore(
        dir: &Path,
        operator: &OperatorId,
        range: KeyGroupRange,
        config: &RocksDbConfig,
        handles: &[StateHandle],
        store: &dyn CheckpointStore,
    ) -> Result<Self> {
        config.validate()?;
        let relevant: Vec<&StateHandle> =
            handles.iter().filter(|h| h.key_groups().intersects(&range)).collect();
        if let [StateHandle::RocksDb(h)] = relevant.as_slice() {
            let covers = h.key_groups.start <= range.start && range.end <= h.key_groups.end;
            if covers && h.column_family == operator.as_str() {
                return Self::restore_direct(dir, operator, range, config, h, store);
            }
        }
        let mut backend = Self::open(dir, operator, range, config)?;
        let scratch = dir.join("restore");
        for handle in relevant {
            let wanted = handle.key_groups().intersect(&range);
            let mut batch = StateWriteBatch::new();
            let mut sink = |k: &[u8], v: &[u8]| -> Result<()> {
                batch.bytes += k.len() + v.len();
                batch.ops.push(BatchOp::Put(k.to_vec(), v.to_vec()));
                if batch.bytes >= 4 << 20 {
                    backend.write_batch(std::mem::take(&mut batch))?;
                }
                Ok(())
            };
            match handle {
                StateHandle::Heap(h) => super::heap::for_each_heap_entry(store, h, wanted, &mut sink)?,
                StateHandle::RocksDb(h) => {
                    recreate_dir(&scratch)?;
                    for_each_rocksdb_entry(store, h, wanted, &scratch, &mut sink)?;
                }
            }
            backend.write_batch(batch)?;
        }
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch).map_err(Error::io("removing", &scratch))?;
        }
        Ok(backend)
    }

    fn restore_direct(
        dir: &Path,
        operator: &OperatorId,
        range: KeyGroupRange,
        config: &RocksDbConfig,
        handle: &RocksDbStateHandle,
        store: &dyn CheckpointStore,
    ) -> Result<Self> {
        reset_working_dir(dir)?;
        download_handle(store, handle, &dir.join("db"))?;
        let backend = Self::open_existing(dir, operator, range, config)?;
        let cf = backend.cf()?;
        if range.start > 0 {
            backend
                .db
                .delete_range_cf_opt(
                    cf,
                    &[0u8, 0][..],
                    &key_group_lower_bound(range.start)[..],
                    &backend.write_opts,
                )
                .map_err(Error::rocks("deleting key groups below the range"))?;
        }
        if handle.key_groups.end > range.end {
            backend
                .db
                .delete_range_cf_opt(
                    cf,
                    &key_group_lower_bound(range.end)[..],
                    &[0xff; 3][..],
                    &backend.write_opts,
                )
                .map_err(Error::rocks("deleting key groups above the range"))?;
        }
        {
            let mut reg = backend.registry.lock();
            reg.confirmed = handle.shared.iter().map(|f| (f.local_name.clone(), f.clone())).collect();
            reg.confirmed_at = Some(handle.checkpoint_id);
        }
        Ok(backend)
    }

    /// Blocks until pending flushes and compactions are done (benchmarks, tests).
    pub fn wait_for_background_work(&self) -> Result<()> {
        let mut opts = rocksdb::WaitForCompactOptions::default();
        opts.set_flush(true);
        self.db.wait_for_compact(&opts).map_err(Error::rocks("waiting for compactions"))
    }

    /// The id of this instance, part of the names of the SST files it uploads.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The backend's working directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of SST files and their bytes in the live database.
    pub fn sst_stats(&self) -> Result<(usize, u64)> {
        let files = self.db.live_files().map_err(Error::rocks("listing live files"))?;
        Ok((files.len(), files.iter().map(|f| f.size as u64).sum()))
    }

    fn cf(&self) -> Result<&ColumnFamily> {
        self.db
            .cf_handle(&self.cf_name)
            .ok_or_else(|| Error::Restore { reason: format!("column family `{}` missing", self.cf_name) })
    }

    fn scan(
        &self,
        lower: &[u8],
        upper: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<usize> {
        let cf = self.cf()?;
        scan_cf(&self.db, cf, lower, upper, limit, f)
    }
}

fn scan_cf(
    db: &DB,
    cf: &ColumnFamily,
    lower: &[u8],
    upper: Option<&[u8]>,
    limit: usize,
    f: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<usize> {
    let mut ro = ReadOptions::default();
    if let Some(u) = upper {
        ro.set_iterate_upper_bound(u.to_vec());
    }
    ro.fill_cache(false);
    let mut it = db.raw_iterator_cf_opt(cf, ro);
    it.seek(lower);
    let mut n = 0;
    while n < limit && it.valid() {
        if let (Some(k), Some(v)) = (it.key(), it.value()) {
            f(k, v);
            n += 1;
        }
        it.next();
    }
    it.status().map_err(Error::rocks("scanning"))?;
    Ok(n)
}

/// Files fetched at once by a restore: storage latency (S3) and checksums overlap.
const DOWNLOAD_THREADS: usize = 4;

/// Downloads the files of a handle into `db_dir` (verifying size and checksum), a few at a
/// time.
fn download_handle(store: &dyn CheckpointStore, handle: &RocksDbStateHandle, db_dir: &Path) -> Result<()> {
    recreate_dir(db_dir)?;
    let files: Vec<&StoredFile> = handle.shared.iter().chain(&handle.private).collect();
    if let Some(file) = files.iter().find(|f| f.local_name.contains('/') || f.local_name.starts_with('.')) {
        return Err(Error::CorruptFile {
            checkpoint: handle.checkpoint_id.label(),
            file: file.object.clone(),
            reason: format!("invalid local name `{}`", file.local_name),
        });
    }
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (next, failed) = (AtomicUsize::new(0), AtomicBool::new(false));
    let fetch = || -> Result<()> {
        while let Some(file) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            let written = fetch_verified(store, file, handle.checkpoint_id).and_then(|data| {
                let local = db_dir.join(&file.local_name);
                std::fs::write(&local, &data).map_err(Error::io("writing", &local))
            });
            if written.is_err() {
                failed.store(true, Ordering::Relaxed);
                return written;
            }
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..DOWNLOAD_THREADS.min(files.len())).map(|_| s.spawn(fetch)).collect();
        // Every worker is joined; the first error (files in order of failure) is returned.
        let mut result = Ok(());
        for w in workers {
            let outcome = w
                .join()
                .unwrap_or_else(|_| Err(Error::Restore { reason: "a download thread panicked".to_string() }));
            if result.is_ok() {
                result = outcome;
            }
        }
        result
    })
}

/// Calls `f` for every entry of `wanted` key groups in a RocksDB snapshot, downloaded
/// into `scratch` and opened read-only.
pub(crate) fn for_each_rocksdb_entry(
    store: &dyn CheckpointStore,
    handle: &RocksDbStateHandle,
    wanted: KeyGroupRange,
    scratch: &Path,
    f: EntrySink<'_>,
) -> Result<()> {
    let db_dir = scratch.join(format!("{}-{}", handle.instance, handle.checkpoint_id));
    download_handle(store, handle, &db_dir)?;
    let config = RocksDbConfig::default();
    let cache = Cache::new_lru_cache(8 << 20);
    let cfs = vec![
        ColumnFamilyDescriptor::new("default", config.cf_options(&cache)),
        ColumnFamilyDescriptor::new(&handle.column_family, config.cf_options(&cache)),
    ];
    let db = DB::open_cf_descriptors_read_only(&config.db_options(), &db_dir, cfs, false).map_err(|e| {
        Error::CorruptFile {
            checkpoint: handle.checkpoint_id.label(),
            file: handle.private.first().map(|f| f.object.clone()).unwrap_or_default(),
            reason: format!("RocksDB cannot open the snapshot: {e}"),
        }
    })?;
    let cf = db.cf_handle(&handle.column_family).ok_or_else(|| Error::Restore {
        reason: format!("column family `{}` missing in the snapshot", handle.column_family),
    })?;
    let lower = key_group_lower_bound(wanted.start);
    let upper = key_group_upper_bound(wanted.end.saturating_sub(1));
    let mut failed = None;
    scan_cf(&db, cf, &lower, upper.as_ref().map(|u| &u[..]), usize::MAX, &mut |k, v| {
        if failed.is_none() {
            if let Err(e) = f(k, v) {
                failed = Some(e);
            }
        }
    })
    .map_err(|e| Error::CorruptFile {
        checkpoint: handle.checkpoint_id.label(),
        file: db_dir.display().to_string(),
        reason: e.to_string(),
    })?;
    drop(db);
    std::fs::remove_dir_all(&db_dir).map_err(Error::io("removing", &db_dir))?;
    failed.map_or(Ok(()), Err)
}

impl KeyedStateBackend for RocksDbStateBackend {
    fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    fn get(&self, key: &StateKey<'_>) -> Result<Option<Vec<u8>>> {
        check_key_group(self.range, key.key_group)?;
        let k = key.encode()?;
        let v = self.db.get_pinned_cf(self.cf()?, &k).map_err(Error::rocks("get"))?;
        Ok(v.map(|s| s.to_vec()))
    }

    fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let k = key.encode()?;
        self.db.put_cf_opt(self.cf()?, &k, value, &self.write_opts).map_err(Error::rocks("put"))
    }

    fn delete(&mut self, key: &StateKey<'_>) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let k = key.encode()?;
        self.db.delete_cf_opt(self.cf()?, &k, &self.write_opts).map_err(Error::rocks("delete"))
    }

    fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let k = key.encode()?;
        self.db
            .merge_cf_opt(self.cf()?, &k, frame_list_element(element), &self.write_opts)
            .map_err(Error::rocks("merge"))
    }

    fn write_batch(&mut self, batch: StateWriteBatch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let cf = self.cf()?;
        let mut wb = WriteBatch::default();
        for op in &batch.ops {
            let (BatchOp::Put(k, _) | BatchOp::Delete(k) | BatchOp::Append(k, _)) = op;
            let kg = crate::keys::key_group_of_encoded(k).unwrap_or(u16::MAX);
            check_key_group(self.range, kg)?;
            match op {
                BatchOp::Put(k, v) => wb.put_cf(cf, k, v),
                BatchOp::Delete(k) => wb.delete_cf(cf, k),
                BatchOp::Append(k, framed) => wb.merge_cf(cf, k, framed),
            }
        }
        self.db.write_opt(wb, &self.write_opts).map_err(Error::rocks("write batch"))
    }

    fn scan_map(&self, key: &StateKey<'_>) -> Result<Vec<RawEntry>> {
        check_key_group(self.range, key.key_group)?;
        let mut prefix = Vec::new();
        key.encode_prefix_into(&mut prefix)?;
        let upper = prefix_successor(&prefix);
        let mut out = Vec::new();
        self.scan(&prefix, upper.as_deref(), usize::MAX, &mut |k, v| {
            out.push(RawEntry { key: k.to_vec(), value: v.to_vec() })
        })?;
        Ok(out)
    }

    fn delete_map(&mut self, key: &StateKey<'_>) -> Result<()> {
        let entries = self.scan_map(key)?;
        if entries.is_empty() {
            return Ok(());
        }
        let cf = self.cf()?;
        let mut wb = WriteBatch::default();
        for e in entries {
            wb.delete_cf(cf, e.key);
        }
        self.db.write_opt(wb, &self.write_opts).map_err(Error::rocks("delete map"))
    }

    fn list_entries(&self, key_group: u16, after: Option<&[u8]>, limit: usize) -> Result<EntryPage> {
        check_key_group(self.range, key_group)?;
        let lower = match after {
            // The smallest key greater than `after`.
            Some(a) => {
                let mut l = a.to_vec();
                l.push(0);
                l
            }
            None => key_group_lower_bound(key_group).to_vec(),
        };
        let upper = key_group_upper_bound(key_group);
        let mut entries = Vec::new();
        self.scan(&lower, upper.as_ref().map(|u| &u[..]), limit.saturating_add(1), &mut |k, v| {
            entries.push(RawEntry { key: k.to_vec(), value: v.to_vec() })
        })?;
        let next = if entries.len() > limit {
            entries.truncate(limit);
            entries.last().map(|e| e.key.clone())
        } else {
            None
        };
        Ok(EntryPage { entries, next })
    }

    fn key_group_stats(&self) -> Result<Vec<KeyGroupStats>> {
        let mut stats: Vec<KeyGroupStats> =
            self.range.iter().map(|kg| KeyGroupStats { key_group: kg, ..Default::default() }).collect();
        let lower = key_group_lower_bound(self.range.start);
        let upper = key_group_upper_bound(self.range.end.saturating_sub(1));
        let start = self.range.start;
        self.scan(&lower, upper.as_ref().map(|u| &u[..]), usize::MAX, &mut |k, v| {
            if let Some(kg) = crate::keys::key_group_of_encoded(k) {
                if let Some(s) = stats.get_mut(usize::from(kg.wrapping_sub(start))) {
                    s.entries += 1;
                    s.bytes += (k.len() + v.len()) as u64;
                }
            }
        })?;
        Ok(stats)
    }

    fn snapshot(&mut self, location: &StateLocation) -> Result<Box<dyn StateSnapshot>> {
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        self.db.flush_cf_opt(self.cf()?, &flush).map_err(Error::rocks("flushing before a checkpoint"))?;
        let snapshots = self.dir.join("snapshots");
        std::fs::create_dir_all(&snapshots).map_err(Error::io("creating", &snapshots))?;
        let local = snapshots.join(format!("chk-{}", location.checkpoint));
        if local.exists() {
            std::fs::remove_dir_all(&local).map_err(Error::io("removing", &local))?;
        }
        Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(&local))
            .map_err(Error::rocks(format!("creating checkpoint `{}`", local.display())))?;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&local).map_err(Error::io("listing", &local))? {
            let entry = entry.map_err(Error::io("listing", &local))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let size = entry.metadata().map_err(Error::io("reading", entry.path()))?.len();
            files.push((name, size));
        }
        files.sort();
        let confirmed = self.registry.lock().reusable(location.latest_completed);
        Ok(Box::new(RocksDbSnapshot {
            local: LocalSnapshotDir(local),
            files,
            confirmed,
            location: location.clone(),
            instance: self.instance.clone(),
            cf_name: self.cf_name.clone(),
            range: self.range,
            registry: self.registry.clone(),
        }))
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: CheckpointId) {
        self.registry.lock().complete(checkpoint);
    }

    fn upload_all_files_next(&mut self) {
        let mut reg = self.registry.lock();
        reg.confirmed.clear();
        reg.confirmed_at = None;
    }

    fn kind(&self) -> &'static str {
        "rocksdb"
    }
}

/// Removes the local checkpoint directory when the snapshot is done or dropped.
struct LocalSnapshotDir(PathBuf);

impl Drop for LocalSnapshotDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct RocksDbSnapshot {
    local: LocalSnapshotDir,
    files: Vec<(String, u64)>,
    confirmed: HashMap<String, StoredFile>,
    location: StateLocation,
    instance: String,
    cf_name: String,
    range: KeyGroupRange,
    registry: Arc<Mutex<SharedRegistry>>,
}

impl StateSnapshot for RocksDbSnapshot {
    fn upload(self: Box<Self>, store: &dyn CheckpointStore) -> Result<SnapshotResult> {
        let mut stats = UploadStats::default();
        let mut shared = Vec::new();
        let mut private = Vec::new();
        let mut to_upload: Vec<(String, PathBuf)> = Vec::new();
        for (name, size) in &self.files {
            let is_sst = name.ends_with(".sst");
            if is_sst {
                if let Some(f) = self.confirmed.get(name).filter(|f| f.size == *size) {
                    stats.reused_files += 1;
                    stats.reused_bytes += f.size;
                    shared.push(f.clone());
                    continue;
                }
            }
            let path = self.local.0.join(name);
            let data = std::fs::read(&path).map_err(Error::io("reading", &path))?;
            let object = if is_sst {
                self.location.paths.shared_file(&self.instance, self.location.checkpoint, name)
            } else {
                self.location.private_file(name)
            };
            let file = StoredFile {
                local_name: name.clone(),
                object: object.clone(),
                size: data.len() as u64,
                sha256: sha256_hex(&data),
            };
            stats.uploaded_files += 1;
            stats.uploaded_bytes += file.size;
            to_upload.push((object, path));
            if is_sst {
                shared.push(file);
            } else {
                private.push(file);
            }
        }
        let refs: Vec<(String, &Path)> = to_upload.iter().map(|(o, p)| (o.clone(), p.as_path())).collect();
        store.put_files(&refs)?;
        self.registry.lock().pending.insert(
            self.location.checkpoint,
            shared.iter().map(|f| (f.local_name.clone(), f.clone())).collect(),
        );
        Ok(SnapshotResult {
            handle: StateHandle::RocksDb(RocksDbStateHandle {
                checkpoint_id: self.location.checkpoint,
                key_groups: self.range,
                instance: self.instance.clone(),
                column_family: self.cf_name.clone(),
                shared,
                private,
            }),
            stats,
        })
    }
}
