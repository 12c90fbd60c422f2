package dev.caudal.bench.flink;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.data.TimestampData;
import org.apache.flink.table.runtime.typeutils.InternalTypeInfo;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.DistributionMode;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.SupportsNamespaces;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.flink.CatalogLoader;
import org.apache.iceberg.flink.FlinkSchemaUtil;
import org.apache.iceberg.flink.TableLoader;
import org.apache.iceberg.flink.sink.FlinkSink;
import org.apache.iceberg.flink.sink.IcebergSink;
import org.apache.iceberg.metrics.CommitReport;
import org.apache.iceberg.metrics.CounterResult;
import org.apache.iceberg.metrics.MetricsReport;
import org.apache.iceberg.metrics.MetricsReporter;
import org.apache.iceberg.types.Types;

/**
 * Generated readings → °C → anomaly filter → Flink's Iceberg sink, in a local MiniCluster (this
 * JVM): the pipeline of Caudal's {@code serve_sinks --mode iceberg}. The table is made fresh per
 * run in Iceberg's JDBC catalog (PostgreSQL) with Caudal's schema for ProcessedReading,
 * partitioned by day(ts), Parquet with Snappy and 128 MiB target files as Caudal writes, in a
 * local warehouse (HadoopFileIO); dropped at the end.
 *
 * <p>Prints rows/s (wall clock around execute(), MiniCluster start and stop included, and over
 * Flink's net job runtime), CPU-seconds and peak RSS (/proc, as Caudal's runners read them), and
 * from Iceberg's commit reports (a MetricsReporter on the catalog): snapshots, data files, files
 * per minute, average file size and the commit's time per snapshot (SnapshotProducer.commit:
 * manifests, manifest list, metadata file, the catalog's compare-and-swap).
 *
 * <pre>
 * java -cp 'flink-iceberg-bench-1.jar:libs/*' dev.caudal.bench.flink.IcebergBench \
 *     --jdbc-url jdbc:postgresql://127.0.0.1:15432/caudal --jdbc-user caudal \
 *     --records 30000000 --parallelism 1 --checkpoint-interval 1 [--sensors 10000]
 *     [--sink iceberg|flink] [--warmup-records N] [--warehouse DIR] [--catalog NAME]
 * </pre>
 */
public final class IcebergBench {
    private IcebergBench() {}

    /** Iceberg's commit reports of this JVM (the committer runs here: a local MiniCluster). */
    public static final class CommitTimes implements MetricsReporter {
        static final List<CommitReport> REPORTS = new ArrayList<>();

        public CommitTimes() {}

        @Override
        public void report(MetricsReport report) {
            if (report instanceof CommitReport c) {
                synchronized (REPORTS) {
                    REPORTS.add(c);
                }
            }
        }
    }

    /** The table schema Caudal's sink derives from schemas/avro/processed_reading.avsc. */
    static final Schema SCHEMA = new Schema(
            Types.NestedField.required(1, "sensor_id", Types.LongType.get()),
            Types.NestedField.required(2, "ts", Types.TimestampType.withZone()),
            Types.NestedField.required(3, "lat", Types.DoubleType.get()),
            Types.NestedField.required(4, "lon", Types.DoubleType.get()),
            Types.NestedField.required(5, "temp_c", Types.DoubleType.get()),
            Types.NestedField.required(6, "temp_f", Types.DoubleType.get()),
            Types.NestedField.required(7, "site", Types.StringType.get()),
            Types.NestedField.required(8, "name", Types.StringType.get()));

    /** site and name: empty, as Caudal writes them for readings not enriched. */
    private static final StringData EMPTY = StringData.fromString("");

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>(Map.of(
                "--records", "30000000", "--sensors", "10000", "--parallelism", "1",
                "--checkpoint-interval", "1", "--sink", "iceberg", "--warmup-records", "2000000",
                "--catalog", "flink_bench", "--jdbc-user", "caudal", "--jdbc-password", ""));
        boolean header = true;
        for (int i = 0; i < argv.length; i++) {
            if (argv[i].equals("--no-header")) {
                header = false;
            } else if (i + 1 < argv.length && argv[i].startsWith("--")) {
                a.put(argv[i], argv[++i]);
            } else {
                throw new IllegalArgumentException("unknown or incomplete flag " + argv[i]);
            }
        }
        if (!a.containsKey("--jdbc-url")) {
            throw new IllegalArgumentException("--jdbc-url jdbc:postgresql://HOST:PORT/DB is required");
        }
        String sink = a.get("--sink");
        if (!sink.equals("flink") && !sink.equals("iceberg")) {
            throw new IllegalArgumentException("--sink must be flink (FlinkSink) or iceberg (IcebergSink)");
        }
        long records = Long.parseLong(a.get("--records"));
        long sensors = Long.parseLong(a.get("--sensors"));
        int parallelism = Integer.parseInt(a.get("--parallelism"));
        double interval = Double.parseDouble(a.get("--checkpoint-interval"));
        long warmup = Long.parseLong(a.get("--warmup-records"));
        Path warehouse = a.containsKey("--warehouse") ? Path.of(a.get("--warehouse"))
                : Files.createTempDirectory("flink-iceberg-warehouse-");
        Files.createDirectories(warehouse);

        Map<String, String> props = new HashMap<>();
        props.put(CatalogProperties.URI, a.get("--jdbc-url"));
        props.put("jdbc.user", a.get("--jdbc-user"));
        props.put("jdbc.password", a.get("--jdbc-password"));
        props.put("jdbc.schema-version", "V1");
        props.put(CatalogProperties.WAREHOUSE_LOCATION, warehouse.toUri().toString());
        props.put(CatalogProperties.METRICS_REPORTER_IMPL, CommitTimes.class.getName());
        CatalogLoader catalogLoader = CatalogLoader.custom(a.get("--catalog"), props,
                new org.apache.hadoop.conf.Configuration(), "org.apache.iceberg.jdbc.JdbcCatalog");

        try {
            if (warmup > 0) {
                // A first job in the same JVM, so the measured one runs JIT-compiled code.
                runOnce(catalogLoader, "warmup", warmup, sensors, parallelism, interval, sink);
            }
            synchronized (CommitTimes.REPORTS) {
                CommitTimes.REPORTS.clear();
            }
            double cpu0 = ProcFs.cpuSeconds();
            long t0 = System.nanoTime();
            Run run = runOnce(catalogLoader, "readings", records, sensors, parallelism, interval, sink);
            double secs = (System.nanoTime() - t0) / 1e9;
            double cpu = ProcFs.cpuSeconds() - cpu0;
            report(header, run, sink, parallelism, interval, secs, cpu);
        } finally {
            if (!a.containsKey("--warehouse")) {
                deleteTree(warehouse);
            }
        }
    }

    /** What one job wrote, from the commit reports and the table. */
    record Run(JobExecutionResult result, List<CommitReport> commits, long tableRows, long generated, int snapshots) {}

    private static Run runOnce(CatalogLoader catalogLoader, String table, long records, long sensors,
            int parallelism, double interval, String sink) throws Exception {
        Catalog catalog = catalogLoader.loadCatalog();
        Namespace ns = Namespace.of("bench_flink_" + System.nanoTime() % 1_000_000_000_000L);
        ((SupportsNamespaces) catalog).createNamespace(ns);
        TableIdentifier ident = TableIdentifier.of(ns, table);
        catalog.createTable(ident, SCHEMA, PartitionSpec.builderFor(SCHEMA).day("ts").build(), Map.of(
                "write.format.default", "parquet",
                "write.parquet.compression-codec", "snappy",
                "write.target-file-size-bytes", Long.toString(128L << 20),
                "write.distribution-mode", "none"));
        Path checkpoints = Files.createTempDirectory("flink-iceberg-ckpt-");
        try {
            Configuration conf = new Configuration();
            conf.set(PipelineOptions.OBJECT_REUSE, true);
            // A failure ends the run (with checkpoints Flink would otherwise restart the job forever).
            conf.set(RestartStrategyOptions.RESTART_STRATEGY, "none");
            conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, checkpoints.toUri().toString());
            StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(parallelism, conf);
            env.enableCheckpointing((long) (interval * 1000), CheckpointingMode.EXACTLY_ONCE);
            build(env, catalogLoader, ident, new SensorModel(1, sensors, records, 0.0, 8), sink, parallelism);
            JobExecutionResult result = env.execute("flink-iceberg-" + table);
            List<CommitReport> commits = new ArrayList<>();
            synchronized (CommitTimes.REPORTS) {
                String name = catalog.name() + "." + ident;
                CommitTimes.REPORTS.stream().filter(r -> r.tableName().equals(name)).forEach(commits::add);
            }
            Table t = catalog.loadTable(ident);
            Snapshot current = t.currentSnapshot();
            long rows = current == null ? 0 : Long.parseLong(current.summary().getOrDefault("total-records", "0"));
            int snapshots = 0;
            for (Snapshot s : t.snapshots()) {
                snapshots++;
            }
            catalog.dropTable(ident, false);
            ((SupportsNamespaces) catalog).dropNamespace(ns);
            return new Run(result, commits, rows, records, snapshots);
        } finally {
            deleteTree(checkpoints);
        }
    }

    /** generator → °C → filter → RowData → the Iceberg sink (writers at p, one committer). */
    private static void build(StreamExecutionEnvironment env, CatalogLoader catalogLoader, TableIdentifier ident,
            SensorModel model, String sink, int parallelism) {
        long sensors = model.sensors;
        // Reading i is sensor i % sensors of round i / sensors: the first N readings in
        // round-major order, as Caudal's bounded generator emits them (each subtask a range).
        DataGeneratorSource<SensorReading> source = new DataGeneratorSource<>(
                i -> model.reading(i % sensors, i / sensors, SensorModel.START_MS + i / sensors * SensorModel.INTERVAL_MS),
                model.records, TypeInformation.of(SensorReading.class));
        WatermarkStrategy<SensorReading> wm = WatermarkStrategy
                .<SensorReading>forBoundedOutOfOrderness(Duration.ofSeconds(1))
                .withTimestampAssigner((r, ts) -> r.ts);
        DataStream<RowData> rows = env.fromSource(source, wm, "generator")
                .map(ProcessedReading::of)
                .filter(ProcessedReading::isPlausible)
                .map(p -> (RowData) GenericRowData.of(p.sensorId, TimestampData.fromEpochMillis(p.ts), p.lat, p.lon,
                        p.tempC, p.tempF, EMPTY, EMPTY))
                .returns(InternalTypeInfo.of(FlinkSchemaUtil.convert(SCHEMA)));
        TableLoader loader = TableLoader.fromCatalog(catalogLoader, ident);
        if (sink.equals("flink")) {
            FlinkSink.forRowData(rows).tableLoader(loader).distributionMode(DistributionMode.NONE)
                    .writeParallelism(parallelism).uidPrefix("lake").append();
        } else {
            IcebergSink.forRowData(rows).tableLoader(loader).distributionMode(DistributionMode.NONE)
                    .writeParallelism(parallelism).uidSuffix("lake").append();
        }
    }

    private static long value(CounterResult c) {
        return c == null ? 0 : c.value();
    }

    private static void report(boolean header, Run run, String sink, int p, double interval, double secs,
            double cpu) {
        long files = 0;
        long bytes = 0;
        long rows = 0;
        long commitMs = 0;
        long maxMs = 0;
        for (CommitReport c : run.commits) {
            files += value(c.commitMetrics().addedDataFiles());
            bytes += value(c.commitMetrics().addedFilesSizeInBytes());
            rows += value(c.commitMetrics().addedRecords());
            long ms = c.commitMetrics().totalDuration() == null ? 0
                    : c.commitMetrics().totalDuration().totalDuration().toMillis();
            commitMs += ms;
            maxMs = Math.max(maxMs, ms);
        }
        int commits = Math.max(run.commits.size(), 1);
        if (header) {
            System.out.printf("%-10s %3s %6s %12s %8s %12s %9s %7s %9s %9s %9s %8s %9s%n", "sink", "p", "ckpt",
                    "rows", "secs", "rows/s", "snapshots", "files", "files/min", "MB/file", "commit ms", "CPU-s",
                    "peak RSS");
        }
        System.out.printf("%-10s %3d %5.0fs %12d %8.2f %12.0f %9d %7d %9.0f %9.1f %9.1f %8.1f %6d MB%n",
                sink.equals("flink") ? "FlinkSink" : "IcebergSink", p, interval, rows, secs, rows / secs,
                run.commits.size(), files, files / secs * 60.0, bytes / (double) Math.max(files, 1) / 1e6,
                commitMs / (double) commits, cpu, ProcFs.statusKb("VmHWM:") / 1024);
        double net = run.result.getNetRuntime() / 1000.0;
        System.out.printf("#   flink job net runtime %.2f s (%.0f rows/s); commit max %d ms; table: %d rows%s, %d snapshots%n",
                net, rows / net, maxMs, run.tableRows,
                run.tableRows == run.generated ? "" : " — ROWS MISSING: " + (run.generated - run.tableRows) + " of " + run.generated,
                run.snapshots);
    }

    private static void deleteTree(Path dir) throws IOException {
        if (!Files.exists(dir)) {
            return;
        }
        try (Stream<Path> paths = Files.walk(dir)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
