//! [`IcebergWriter`]: the parallel half of the Iceberg sink — records in, Parquet data files
//! out, closed at each barrier and handed to the committer before the barrier passes.
//!
//! Records are buffered as Arrow rows, split by partition (the table's spec, Iceberg's own
//! transforms) and written through a fan-out of rolling Parquet writers into the table's
//! `data/` directory, named `caudal.<job>.<sink>.<attempt>.<subtask>.<epoch>-<k>.parquet`.
//! At barrier `n` ([`Operator::prepare_snapshot_pre_barrier`]) the open files are closed and
//! their [`DataFiles`] go downstream, ahead of the barrier: the committer records them in
//! checkpoint `n`. A file not handed over when the process dies belongs to no checkpoint:
//! the committer deletes it on restore (its name carries a dead attempt).

use super::config::IcebergConfig;
use super::schema::{BatchEncoder, RecordLayout};
use super::table::TableClient;
use crate::sinks::shared_dir::SharedDir;
use caudal::types::MAX_WATERMARK;
use caudal::{Batch, CheckpointId, Data, Error, Operator, OperatorContext, Record, Result};
use caudal_schemas::AvroRecord;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFileFormat, PartitionSpecRef, SchemaRef};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::unpartitioned_writer::UnpartitionedWriter;
use iceberg::writer::partitioning::PartitioningWriter;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;

/// Rows buffered before they are split by partition and written.
const ROWS_PER_BATCH: usize = 8192;

/// The data files one writer subtask closed at a barrier, for the committer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataFiles {
    /// The checkpoint whose barrier closed them (`u64::MAX`: the end of an input without
    /// checkpoints).
    pub checkpoint: u64,
    /// The writer subtask.
    pub subtask: u32,
    /// The partition spec and schema they were written with.
    pub spec_id: i32,
    pub schema_id: i32,
    /// Each file as Iceberg's JSON form of a manifest's data file.
    pub files: Vec<String>,
    /// Rows in them.
    pub rows: u64,
    /// Bytes in them.
    #[serde(default)]
    pub bytes: u64,
}

/// How long a writer waits at start for the other writers' markers in a local warehouse.
const SHARED_WAREHOUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

type Builder =
    DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

/// The open files of one epoch.
enum Open {
    Partitioned(Box<FanoutWriter<Builder>>),
    Unpartitioned(Box<UnpartitionedWriter<Builder>>),
}

/// The table as the writer writes it.
struct Target {
    schema: SchemaRef,
    spec: PartitionSpecRef,
    splitter: RecordBatchPartitionSplitter,
    encoder: BatchEncoder,
    locations: DefaultLocationGenerator,
}

/// Writes records of type `R` as Parquet data files of an Iceberg table.
pub struct IcebergWriter<R> {
    config: IcebergConfig,
    /// The sink's name: part of every file name, so the committer knows its files.
    sink: String,
    client: Option<TableClient>,
    target: Option<Target>,
    open: Option<Open>,
    rows: u64,
    epoch: u64,
    prefix: String,
    checkpointing: bool,
    what: String,
    _r: PhantomData<fn(R)>,
}

impl<R> std::fmt::Debug for IcebergWriter<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IcebergWriter({})", self.config.table)
    }
}

/// `s` safe in a file name and free of the `.` that separates the name's parts.
pub(crate) fn name_part(s: &str) -> String {
    caudal::uid_safe(s).replace('.', "_")
}

/// The file-name prefix of every data file of `sink` in `job`.
pub(crate) fn file_prefix(job: &str, sink: &str) -> String {
    format!("caudal.{}.{}.", name_part(job), name_part(sink))
}

impl<R: AvroRecord> IcebergWriter<R> {
    pub(crate) fn new(config: IcebergConfig, sink: String) -> Self {
        IcebergWriter {
            what: format!("iceberg writer ({})", config.table),
            config,
            sink,
            client: None,
            target: None,
            open: None,
            rows: 0,
            epoch: 0,
            prefix: String::new(),
            checkpointing: false,
            _r: PhantomData,
        }
    }

    fn target(&mut self) -> Result<&mut Target> {
        self.target.as_mut().ok_or_else(|| Error::Internal(format!("{}: not started", self.what)))
    }

    fn new_open(&mut self) -> Result<Open> {
        let file_io = self
            .client
            .as_ref()
            .map(|c| c.file_io().clone())
            .ok_or_else(|| Error::Internal(format!("{}: not started", self.what)))?;
        let names = DefaultFileNameGenerator::new(
            format!("{}{}", self.prefix, self.epoch),
            None,
            DataFileFormat::Parquet,
        );
        let target_bytes = self.config.target_file_bytes;
        let t = self.target()?;
        let parquet = ParquetWriterBuilder::new(
            WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build(),
            t.schema.clone(),
        );
        let rolling =
            RollingFileWriterBuilder::new(parquet, target_bytes, file_io, t.locations.clone(), names);
        let builder = DataFileWriterBuilder::new(rolling);
        Ok(if t.spec.is_unpartitioned() {
            Open::Unpartitioned(Box::new(UnpartitionedWriter::new(builder)))
        } else {
            Open::Partitioned(Box::new(FanoutWriter::new(builder)))
        })
    }

    /// Writes the buffered rows into the open files.
    fn write_buffered(&mut self) -> Result<()> {
        if self.target.as_ref().is_none_or(|t| t.encoder.rows() == 0) {
            return Ok(());
        }
        if self.open.is_none() {
            self.open = Some(self.new_open()?);
        }
        let what = self.what.clone();
        let t = self.target.as_mut().ok_or_else(|| Error::Internal(format!("{what}: not started")))?;
        let batch = t.encoder.finish().map_err(|e| Error::BadRecord(format!("{what}: {e}")))?;
        let client = self.client.as_ref().ok_or_else(|| Error::Internal(format!("{what}: not started")))?;
        let open = self.open.as_mut().ok_or_else(|| Error::Internal(format!("{what}: no open files")))?;
        let failed = |e: iceberg::Error| {
            Error::external("object storage", format!("{what}: writing data files: {e:#}"))
        };
        match open {
            Open::Partitioned(w) => {
                for (key, part) in
                    t.splitter.split(&batch).map_err(|e| Error::BadRecord(format!("{what}: {e:#}")))?
                {
                    client.block(w.write(key, part)).map_err(failed)?;
                }
            }
            Open::Unpartitioned(w) => client.block(w.write(batch)).map_err(failed)?,
        }
        Ok(())
    }

    /// Closes the open files: what the epoch wrote, for the committer.
    fn close_epoch(&mut self, checkpoint: u64, subtask: u32) -> Result<Option<DataFiles>> {
        self.write_buffered()?;
        let Some(open) = self.open.take() else { return Ok(None) };
        self.epoch += 1;
        let what = self.what.clone();
        let client = self.client.as_ref().ok_or_else(|| Error::Internal(format!("{what}: not started")))?;
        let files = match open {
            Open::Partitioned(w) => client.block(w.close()),
            Open::Unpartitioned(w) => client.block(w.close()),
        }
        .map_err(|e| Error::external("object storage", format!("{what}: closing data files: {e:#}")))?;
        let t = self.target()?;
        let partition_type =
            t.spec.partition_type(&t.schema).map_err(|e| Error::Internal(format!("{e:#}")))?;
        let mut json = Vec::with_capacity(files.len());
        let bytes = files.iter().map(|f| f.file_size_in_bytes()).sum();
        for f in files {
            json.push(
                iceberg::spec::serialize_data_file_to_json(
                    f,
                    &partition_type,
                    iceberg::spec::FormatVersion::V2,
                )
                .map_err(|e| Error::Internal(format!("{what}: encoding a data file: {e:#}")))?,
            );
        }
        let (spec_id, schema_id) = (t.spec.spec_id(), t.schema.schema_id());
        let rows = std::mem::take(&mut self.rows);
        Ok(Some(DataFiles { checkpoint, subtask, spec_id, schema_id, files: json, rows, bytes }))
    }
}

impl<R: AvroRecord + Data> Operator for IcebergWriter<R> {
    type In = R;
    type Out = DataFiles;

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.what =
            format!("iceberg writer `{}`[{}] ({})", ctx.operator_name, ctx.subtask, self.config.table);
        self.checkpointing = ctx.checkpointing;
        self.prefix =
            format!("{}{}.{}.", file_prefix(&ctx.job_name, &self.sink), name_part(&ctx.attempt), ctx.subtask);
        // A local warehouse must be one directory for every host of a cluster: each writer
        // reads the table's metadata that the first one wrote, the committer lists their files.
        if let Some(dir) = self.config.warehouse_uri()?.strip_prefix("file://") {
            let dir = std::path::Path::new(dir);
            let markers = dir.join(".caudal-subtasks").join(format!(
                "{}.{}",
                name_part(&ctx.job_name),
                name_part(&self.sink)
            ));
            SharedDir::announce_in(dir, &markers, ctx)?
                .wait_for_all("iceberg.warehouse", SHARED_WAREHOUSE_WAIT)?;
        }
        let layout = RecordLayout::of::<R>().map_err(|e| Error::config("iceberg record type", e))?;
        let retries = ctx.metrics.counter(caudal::metrics::names::SINK_RETRIES);
        let mut client = TableClient::new(&self.config, self.what.clone(), retries)?;
        let table = client.ensure(&layout)?;
        let metadata = table.metadata();
        let schema = metadata.current_schema().clone();
        let spec = metadata.default_partition_spec().clone();
        let encoder =
            BatchEncoder::new(layout, &schema).map_err(|e| Error::config("iceberg record type", e))?;
        let splitter =
            RecordBatchPartitionSplitter::try_new_with_computed_values(schema.clone(), spec.clone())
                .map_err(|e| Error::config("iceberg partitioning", format!("{e:#}")))?;
        let locations =
            DefaultLocationGenerator::new(metadata).map_err(|e| Error::Internal(format!("{e:#}")))?;
        self.target = Some(Target { schema, spec, splitter, encoder, locations });
        self.client = Some(client);
        Ok(())
    }

    fn process_batch(
        &mut self,
        batch: Batch<R>,
        _out: &mut Batch<DataFiles>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        let what = self.what.clone();
        for r in &batch {
            let t = self.target()?;
            t.encoder.push(&r.value).map_err(|e| Error::BadRecord(format!("{what}: {e}")))?;
            let full = t.encoder.rows() >= ROWS_PER_BATCH;
            self.rows += 1;
            if full {
                self.write_buffered()?;
            }
        }
        Ok(())
    }

    fn prepare_snapshot_pre_barrier(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Batch<DataFiles>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if let Some(files) = self.close_epoch(checkpoint.0, ctx.subtask)? {
            out.push(Record::new(ctx.watermark, files));
        }
        Ok(())
    }

    fn on_close(&mut self, out: &mut Batch<DataFiles>, ctx: &mut OperatorContext) -> Result<()> {
        let end_of_input = ctx.watermark == MAX_WATERMARK;
        if self.checkpointing && !end_of_input {
            // Stopped or cancelled: the open files hold what a restore writes again.
            self.open = None;
            return Ok(());
        }
        if let Some(files) = self.close_epoch(u64::MAX, ctx.subtask)? {
            out.push(Record::new(ctx.watermark, files));
        }
        Ok(())
    }
}
